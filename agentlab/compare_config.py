"""What one comparison of ``agentlab compare`` runs: :class:`CompareConfig`, saved as the run's ``config.json``.

    >>> CompareConfig.smoke().eval_loop().temperature
    0.0
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agentlab.rollout import EVAL_BATCH, LoopConfig
from agentlab.synth import parse_regime

ARMS = ("sft_best", "grpo", "sft_matched", "rft", "expert_iteration", "sft_all")
SELECT = ("success", "reward")  # summaries of agentlab.evals.summarize hold both, each as {"mean", "ci_low", ...}


@dataclass(frozen=True)
class CompareConfig:
    """One comparison: environment, data regime, seed, and the budgets of every arm. Saved as ``config.json``."""

    name: str = "compare"
    env: str = "product_finder"
    regime: str = "cheap:64"            # "<kind>:<n demonstrations>", kind in agentlab.synth.REGIMES
    demos: str = ""                     # your own demonstrations (JSONL, agentlab.demos) instead of the regime's
    seed: int = 0                       # task synthesis, SFT data order, GRPO and RFT sampling
    model: str = "smollm2-135m"
    train: int = 1000                   # GRPO's and RFT's tasks; the regime's demonstrations come from them too
    validation: int = 64                # every choice (SFT lr/steps, GRPO checkpoint) is made on these
    test: int = 200                     # touched once per reported arm
    sft_lrs: tuple[float, ...] = (3e-4, 1e-3, 3e-3)
    sft_steps: tuple[int, ...] = (4, 8, 16, 32)
    sft_batch: int = 2
    sft_extend: int = 2                 # times the best SFT run is continued (steps doubled) while it still improves
    grpo_steps: int = 24
    grpo_lr: float = 2e-4
    groups_per_step: int = 4
    group_size: int = 4                 # GRPO's G, and RFT's samples per task
    temperature: float = 0.7
    eval_every: int = 6
    max_turns: int | None = None        # None: the environment's budget (EnvSpec.budget)
    max_new_tokens: int | None = None   # per turn; product_finder's search call with every filter is ~60 tokens
    max_context: int | None = None
    sft_all_demos: int = 256
    ei_rounds: int = 3                  # expert_iteration's rounds within GRPO's seconds
    rollout_backend: str = "torch"      # CPU decoding of GRPO's rollouts and every evaluation: "torch" or "llama_cpp"
    select: str = "success"             # the validation figure every choice maximises: "success" or "reward" (the
                                        # environment's reward, e.g. doc_search's F4, which GRPO also maximises)

    def __post_init__(self):
        from agentlab.envs import load
        from agentlab.experiment import with_budget

        parse_regime(self.regime)
        with_budget(self, load(self.env))
        errors = []
        if not self.sft_lrs or any(lr <= 0 for lr in self.sft_lrs):
            errors.append(f"sft_lrs={self.sft_lrs} must be positive learning rates")
        if not self.sft_steps or any(s < 1 for s in self.sft_steps):
            errors.append(f"sft_steps={self.sft_steps} must be positive step counts")
        for name in ("train", "validation", "test", "grpo_steps", "eval_every", "sft_all_demos", "sft_batch",
                     "ei_rounds"):
            if getattr(self, name) < 1:
                errors.append(f"{name}={getattr(self, name)} must be >= 1")
        if self.demos and not Path(self.demos).is_file():
            errors.append(f"demos={self.demos}: no such file")
        if self.select not in SELECT:
            errors.append(f"select={self.select!r}: expected one of {', '.join(SELECT)}")
        if self.eval_every > self.grpo_steps:
            errors.append(f"eval_every={self.eval_every} exceeds grpo_steps={self.grpo_steps}: no GRPO checkpoint "
                          f"would be evaluated")
        if errors:
            raise ValueError("bad comparison config: " + "; ".join(errors))

    @classmethod
    def smoke(cls, **overrides) -> CompareConfig:
        """Tiny model and sizes: every arm end to end in about a minute (tests, CI)."""
        return cls(**{"name": "compare-smoke", "env": "lookup", "regime": "expert:8", "model": "tiny-random",
                      "train": 24, "validation": 4, "test": 6, "sft_lrs": (1e-3, 3e-3), "sft_steps": (1, 2),
                      "grpo_steps": 2, "groups_per_step": 1, "group_size": 2, "eval_every": 1,
                      "max_turns": 2, "max_new_tokens": 8, "sft_all_demos": 8, "ei_rounds": 2, **overrides})

    @classmethod
    def from_text(cls, given: dict[str, str | None], smoke: bool = False) -> CompareConfig:
        """A config from command-line text (``None``: the default); tuple fields are comma-separated values.

        >>> CompareConfig.from_text({"sft_lrs": "1e-3,2e-3", "seed": "1", "env": None}).sft_lrs
        (0.001, 0.002)
        """
        from agentlab.fields import typed_fields

        values = typed_fields(cls, given)
        return cls.smoke(**values) if smoke else cls(**values)

    def data(self) -> str:
        """What SFT learns from, as reports name it: the regime, or ``own:<file name>``.

        >>> import pathlib, tempfile; mine = pathlib.Path(tempfile.mkdtemp()) / "mine.jsonl"; _ = mine.write_text("")
        >>> CompareConfig(demos=str(mine)).data(), CompareConfig().data()
        ('own:mine.jsonl', 'cheap:64')
        """
        return f"own:{Path(self.demos).name}" if self.demos else self.regime

    def experiment(self):
        from agentlab.train import Experiment

        return Experiment(name=f"{self.name}/grpo", model=self.model, env=self.env, lr=self.grpo_lr,
                          groups_per_step=self.groups_per_step, group_size=self.group_size,
                          max_turns=self.max_turns, max_new_tokens=self.max_new_tokens, max_context=self.max_context,
                          temperature=self.temperature,
                          steps=self.grpo_steps, eval_every=self.eval_every, eval_tasks=self.validation,
                          seed=self.seed, rollout_backend=self.rollout_backend)

    def eval_loop(self) -> LoopConfig:
        return LoopConfig(max_turns=self.max_turns, max_new_tokens=self.max_new_tokens,
                          max_context=self.max_context, temperature=0.0, batch_size=EVAL_BATCH,  # budgets resolved above
                          engine=self.rollout_backend)
