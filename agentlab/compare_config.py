"""What one comparison of ``agentlab compare`` runs: :class:`CompareConfig`, saved as the run's ``config.json``.

A comparison is composed, not copied: its GRPO arm is an :class:`~agentlab.experiment.Experiment` (``grpo``: the
environment, model, seed, budgets, engine and every GRPO setting) and its SFT arms share one :class:`SFTSearch`
(``sft``). On the command line and in ``config.json`` the comparison is flat, as it always was (``--grpo-lr``,
``--sft-steps``, ``--env``), so run folders written before keep resuming: :meth:`CompareConfig.of` reads the flat
names, :meth:`CompareConfig.to_config` writes them.

    >>> c = CompareConfig.smoke(grpo_lr=1e-4, sft_steps=(1, 2, 4))
    >>> c.grpo.lr, c.sft.steps, c.env, c.eval_loop().temperature
    (0.0001, (1, 2, 4), 'lookup', 0.0)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from agentlab.experiment import Experiment
from agentlab.rollout import EVAL_BATCH, LoopConfig
from agentlab.synth import parse_regime
from agentlab.types import BUDGET_FIELDS

ARMS = ("sft_best", "grpo", "sft_matched", "rft", "expert_iteration", "sft_all")
SELECT = ("success", "reward")  # summaries of agentlab.evals.summarize hold both, each as {"mean", "ci_low", ...}
# The Experiment fields a comparison's flat config names as they are; any other Experiment field ``f`` is
# ``grpo_f`` (``grpo_lr``, ``grpo_steps``, ``grpo_loss_type``). ``name`` and ``eval_tasks`` follow the comparison's.
SHARED = ("env", "model", "seed", "groups_per_step", "group_size", "temperature", "eval_every", *BUDGET_FIELDS,
          "rollout_backend")
ALWAYS = ("grpo_lr", "grpo_steps")  # written to config.json even at their defaults (older folders have them)


SCHEDULES = ("constant", "cosine", "linear")  # TRL / transformers lr_scheduler_type values an SFT run may take
SFT_ALWAYS = ("lrs", "steps", "batch", "extend")  # written to config.json always; later fields when not default


@dataclass(frozen=True)
class SFTSearch:
    """The SFT arms' search: every learning rate x step count scored on validation; the best run continued
    (steps doubled, up to ``extend`` times) while validation still improves — or, with ``patience`` p, until p + 1
    doublings in a row did not improve it (64 validation tasks are noisy: one dip can stop a search short of its
    peak)."""

    lrs: tuple[float, ...] = (3e-4, 1e-3, 3e-3)
    steps: tuple[int, ...] = (4, 8, 16, 32)
    batch: int = 2
    extend: int = 2
    schedules: tuple[str, ...] = ("constant",)   # also decaying ones ("cosine", "linear"): each its own runs
    all_epochs: tuple[float, ...] = (0.5, 1, 2, 4)  # sft_all's step counts, in epochs of its demonstrations
    patience: int = 0  # doublings tried past one that did not improve validation

    def __post_init__(self):
        errors = []
        if not self.schedules or set(self.schedules) - set(SCHEDULES):
            errors.append(f"sft_schedules={self.schedules}: expected some of {', '.join(SCHEDULES)}")
        if not self.all_epochs or any(e <= 0 for e in self.all_epochs):
            errors.append(f"sft_all_epochs={self.all_epochs} must be positive")
        if not self.lrs or any(lr <= 0 for lr in self.lrs):
            errors.append(f"sft_lrs={self.lrs} must be positive learning rates")
        if not self.steps or any(s < 1 for s in self.steps):
            errors.append(f"sft_steps={self.steps} must be positive step counts")
        if self.batch < 1 or self.extend < 0 or self.patience < 0:
            errors.append(f"sft_batch={self.batch} must be >= 1, sft_extend={self.extend} and "
                          f"sft_patience={self.patience} >= 0")
        if errors:
            raise ValueError("bad comparison config: " + "; ".join(errors))


def _grpo_default() -> Experiment:
    return Experiment(env="product_finder", groups_per_step=4, group_size=4, temperature=0.7, steps=24,
                      eval_every=6)


@dataclass(frozen=True)
class CompareConfig:
    """One comparison: data regime, splits, the GRPO arm's :class:`Experiment` and the SFT arms' search."""

    name: str = "compare"
    regime: str = "cheap:64"            # "<kind>:<n demonstrations>", kind in agentlab.synth.REGIMES
    demos: str = ""                     # your own demonstrations (JSONL, agentlab.demos) instead of the regime's
    train: int = 1000                   # GRPO's and RFT's tasks; the regime's demonstrations come from them too
    validation: int = 64                # every choice (SFT lr/steps, GRPO checkpoint) is made on these
    test: int = 200                     # touched once per reported arm
    grpo: Experiment = field(default_factory=_grpo_default)  # env, model and seed are the comparison's
    sft: SFTSearch = field(default_factory=SFTSearch)
    sft_all_demos: int = 256
    ei_rounds: int = 3                  # expert_iteration's rounds within GRPO's seconds
    select: str = "success"             # the validation figure every choice maximises: "success" or "reward" (the
                                        # environment's reward, e.g. doc_search's F4, which GRPO also maximises)

    env = property(lambda self: self.grpo.env)
    model = property(lambda self: self.grpo.model)
    seed = property(lambda self: self.grpo.seed)  # task synthesis, SFT data order, GRPO and RFT sampling

    def __post_init__(self):
        parse_regime(self.regime)
        own = {"name": f"{self.name}/grpo", "eval_tasks": self.validation}
        if any(getattr(self.grpo, k) != v for k, v in own.items()):
            object.__setattr__(self, "grpo", dataclasses.replace(self.grpo, **own))
        errors = []
        for name in ("train", "validation", "test", "sft_all_demos", "ei_rounds"):
            if getattr(self, name) < 1:
                errors.append(f"{name}={getattr(self, name)} must be >= 1")
        if self.demos and not Path(self.demos).is_file():
            errors.append(f"demos={self.demos}: no such file")
        if self.select not in SELECT:
            errors.append(f"select={self.select!r}: expected one of {', '.join(SELECT)}")
        if self.grpo.eval_every > self.grpo.steps:
            errors.append(f"eval_every={self.grpo.eval_every} exceeds grpo_steps={self.grpo.steps}: no GRPO "
                          f"checkpoint would be evaluated")
        if errors:
            raise ValueError("bad comparison config: " + "; ".join(errors))

    @classmethod
    def of(cls, **flat) -> CompareConfig:
        """A comparison from flat names (``config.json``'s and the command line's), over this class's defaults.

        >>> CompareConfig.of(env="lookup", grpo_steps=6, sft_lrs=(1e-3,)).grpo.steps
        6
        """
        return cls().replace(**flat)

    def replace(self, **flat) -> CompareConfig:
        """This comparison with some flat fields changed. A changed ``env`` takes its own budget unless one is
        given (the old environment's budget would be a silent carry-over)."""
        own = {f.name for f in dataclasses.fields(self)} - {"grpo", "sft"}
        grpo_names = {f.name for f in dataclasses.fields(Experiment)} - {"name", "eval_tasks"}
        grpo, sft, mine, unknown = {}, {}, {}, []
        for key, value in flat.items():
            if key in own:
                mine[key] = value
            elif key in SHARED or (key.startswith("grpo_") and key[5:] in grpo_names):
                grpo[key if key in SHARED else key[5:]] = value
            elif key.startswith("sft_") and key[4:] in SFTSearch.__dataclass_fields__:
                sft[key[4:]] = value
            else:
                unknown.append(key)
        if unknown:
            raise ValueError(f"bad comparison config: unknown field(s) {', '.join(sorted(unknown))}")
        if grpo.get("env", self.env) != self.env:
            grpo = {**{b: None for b in BUDGET_FIELDS}, **grpo}
        return dataclasses.replace(self, **mine, grpo=dataclasses.replace(self.grpo, **grpo) if grpo else self.grpo,
                                   sft=dataclasses.replace(self.sft, **sft) if sft else self.sft)

    def to_config(self) -> dict:
        """The flat ``config.json``: the comparison's own fields, ``SHARED``, ``grpo_<f>`` for the GRPO arm's
        other settings that differ from :class:`Experiment`'s defaults (and ``ALWAYS``), ``sft_<f>``."""
        grpo, default = self.grpo.to_config(), Experiment(env=self.env).to_config()
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("grpo", "sft")}
        out.update({k: grpo[k] for k in SHARED})
        out.update({f"grpo_{k}": v for k, v in grpo.items() if k not in (*SHARED, "name", "eval_tasks")
                    and (f"grpo_{k}" in ALWAYS or v != default[k])})
        out.update({f"sft_{f.name}": getattr(self.sft, f.name) for f in dataclasses.fields(self.sft)
                    if f.name in SFT_ALWAYS or getattr(self.sft, f.name) != f.default})
        return dict(sorted(out.items()))

    @classmethod
    def flat_defaults(cls) -> dict:
        """Every flat field a command line may set, with its default (budgets: ``None``, the environment's)."""
        grpo = {f"grpo_{f.name}": f.default for f in dataclasses.fields(Experiment)
                if f.name not in (*SHARED, "name", "eval_tasks", "report_to", "reward")}
        sft = {f"sft_{f.name}": f.default for f in dataclasses.fields(SFTSearch)}
        return {**grpo, **sft, **cls().to_config(), **{b: None for b in BUDGET_FIELDS}}

    @classmethod
    def smoke(cls, **overrides) -> CompareConfig:
        """Tiny model and sizes: every arm end to end in about a minute (tests, CI)."""
        return cls.of(**{"name": "compare-smoke", "env": "lookup", "regime": "expert:8", "model": "tiny-random",
                         "train": 24, "validation": 4, "test": 6, "sft_lrs": (1e-3, 3e-3), "sft_steps": (1, 2),
                         "grpo_steps": 2, "groups_per_step": 1, "group_size": 2, "eval_every": 1,
                         "max_turns": 2, "max_new_tokens": 8, "sft_all_demos": 8, "sft_all_epochs": (0.5, 1),
                         "ei_rounds": 2, **overrides})

    @classmethod
    def from_text(cls, given: dict[str, str | None], smoke: bool = False) -> CompareConfig:
        """A config from command-line text (``None``: the default); tuple fields are comma-separated values.

        >>> CompareConfig.from_text({"sft_lrs": "1e-3,2e-3", "seed": "1", "env": None}).sft.lrs
        (0.001, 0.002)
        """
        from agentlab.fields import typed_values

        values = typed_values(cls.flat_defaults(), given)
        return cls.smoke(**values) if smoke else cls.of(**values)

    def data(self) -> str:
        """What SFT learns from, as reports name it: the regime, or ``own:<file name>``.

        >>> import pathlib, tempfile; mine = pathlib.Path(tempfile.mkdtemp()) / "mine.jsonl"; _ = mine.write_text("")
        >>> CompareConfig(demos=str(mine)).data(), CompareConfig().data()
        ('own:mine.jsonl', 'cheap:64')
        """
        return f"own:{Path(self.demos).name}" if self.demos else self.regime

    def eval_loop(self) -> LoopConfig:
        """Greedy evaluation in the GRPO arm's budget and engine (every arm is scored with it)."""
        return dataclasses.replace(self.grpo.loop(), temperature=0.0, batch_size=EVAL_BATCH)
