"""Does RL beat SFT on *your* task? GRPO against the strongest cheap alternatives, at equal compute.

    agentlab compare --env product_finder --regime cheap:64 --seed 0 --name rl-vs-sft/seed-0
    from agentlab.compare import CompareConfig, run_compare
    result = run_compare(CompareConfig(env="product_finder", regime="cheap:64", seed=0))

A *regime* states the data a practitioner really has for SFT (``agentlab.synth.regime_demos``); GRPO gets the
training tasks and the verifier only. Validation and test tasks always come from the full task distribution.
Every arm is evaluated greedily on the same test tasks, once, after its checkpoint was chosen on validation:

===============  ===================================================================================================
``sft_best``     SFT on the regime's demonstrations; learning rate and steps chosen on validation (a grid search)
``grpo``         GRPO from ``sft_best``; the checkpoint that counts is the best one on validation (step 0 excluded)
``sft_matched``  ``sft_best``'s SFT continued on the same demonstrations for GRPO's training wall-clock
``rft``          rejection-sampling fine-tuning from ``sft_best`` for GRPO's wall-clock: sample G rollouts per task,
                 keep the verified successes, SFT on them with the demonstrations (uses the verifier, like GRPO)
``expert_iteration``  rounds of (sample, keep every distinct verified success, SFT on them) from ``sft_best`` for
                 GRPO's wall-clock, no demonstrations (``agentlab.verified``)
               (both save as many checkpoints as GRPO is evaluated at, and keep the best on validation, as GRPO does)
``sft_all``      a reference, not a baseline: SFT on plentiful expert demonstrations (what the regime withholds),
                 searched as ``sft_best`` is: every rate, step counts of ``sft_all_epochs`` epochs of them
===============  ===================================================================================================

The run folder (``runs/<name>/``) holds each arm's adapters and evaluations, ``result.json`` (test success with
95% CIs, GRPO minus each baseline paired over tasks, every setting tried with its validation figure, seconds per
arm) and ``result.png``. A killed comparison resumes where it stopped: every stage is skipped when its output exists.
"""

from __future__ import annotations

import json
from pathlib import Path

from agentlab.compare_config import ARMS, CompareConfig
from agentlab.evals import success_entry
from agentlab.runs import RunDir, StageClock, write_jsonl
from agentlab.synth import regime_demos
from agentlab.types import Task

__all__ = ["ARMS", "CompareConfig", "Comparison", "run_compare", "search_validation"]


def epoch_steps(demos: int, batch: int, epochs: tuple[float, ...]) -> tuple[int, ...]:
    """SFT step counts that make ``epochs`` passes over ``demos`` demonstrations at ``batch`` a step.

    >>> epoch_steps(256, 2, (0.5, 1, 2, 4))
    (64, 128, 256, 512)
    """
    return tuple(sorted({max(1, round(e * demos / batch)) for e in epochs}))


def search_validation(adapter: Path, steps: int) -> Path:
    """Where an SFT search scored the adapter it saved at ``steps``: ``validation-step-<steps>`` beside it (the
    evaluation GRPO's step 0 reads back, ``train.reuse_start_eval``)."""
    return Path(adapter).parent / f"validation-step-{steps}"


class Comparison:
    """The stages of one comparison over one run folder; each stage returns its output if it exists."""

    def __init__(self, cfg: CompareConfig, overwrite: bool = False, engine=None):
        from agentlab.envs import load

        self.cfg, self.spec, self.engine = cfg, load(cfg.env), engine  # engine: a GenerateFn factory, or None
        self.run = RunDir(cfg.name)
        older = {"rollout_backend": "torch", "select": "success", "demos": "", "ei_rounds": 3}  # fields added later
        self.run.prepare(cfg, overwrite=overwrite, defaults=older)  # at these values, an older run still resumes
        self.tried: list[dict] = (self.run.read_json("tried.json") or {}).get("tried", [])  # a resume adds to them
        self.clock = StageClock(self.run)
        self.seconds = self.clock.seconds  # one dict: the arms that spend a budget (agentlab.verified) add to it

    def _timed(self, key: str, fn, *args, **kwargs):
        """``fn(*args, **kwargs)``, its seconds recorded under ``key`` in ``seconds.json`` the first time it returns,
        summed over the sessions a resumed stage took (:class:`~agentlab.runs.StageClock`)."""
        return self.clock.timed(key, fn, *args, **kwargs)

    def log_session(self) -> None:
        """One line in ``sessions.jsonl`` per start of the comparison (:func:`agentlab.machine.session_line`), with
        the timed stages done before it."""
        from agentlab.machine import session_line

        self.run.append(self.run.path / "sessions.jsonl", session_line(done_before=sorted(self.seconds)))

    def _tried(self, point: dict) -> None:
        """Record a setting and its validation figure (``tried.json``, rewritten as the comparison goes); a point
        already recorded (a resumed stage scoring it again) is not recorded twice."""
        if point in self.tried:
            return
        self.tried.append(point)
        self.run.write_json("tried.json", {"env": self.cfg.env, "seed": self.cfg.seed, "tried": self.tried})

    def evaluate(self, folder: Path, adapter: Path | str | None, tasks: list[Task], label: str) -> dict:
        """Greedy eval of ``adapter`` (``None``: the base model) on ``tasks`` into ``folder`` (skipped when its
        summary exists)."""
        from agentlab.pipeline import evaluate

        return evaluate(self.cfg.model, self.cfg.env, tasks, folder, adapter=str(adapter) if adapter else None,
                        loop=self.cfg.eval_loop(), label=label, reuse=True, engine=self.engine)

    def figure(self, summary: dict) -> dict:
        """A summary's validation figure as ``tried.json`` records it: success with its CI, and the selected
        figure's mean when the comparison selects on another (``CompareConfig.select``)."""
        point = success_entry(summary)
        if self.cfg.select != "success":
            point[self.cfg.select] = summary[self.cfg.select]["mean"]
        return point

    def done(self, arm: str) -> dict | None:
        """``arm``'s choice when its stage finished before (``<arm>/choice.json``, the adapter it names still there):
        the stage reads it back instead of running again, so a folder carried without the stage's other adapters
        (``agentlab.carry``) resumes."""
        choice = self.run.read_json(f"{arm}/choice.json")
        return choice if choice and (self.adapter(choice) / "adapter_config.json").exists() else None

    def adapter(self, choice: dict) -> Path:
        """The adapter a choice names (stored relative to the comparison's folder, ``RunDir.rel``)."""
        return self.run.resolve(choice["adapter"])

    def sft_settings(self, lr: float, steps: int, schedule: str = "constant"):
        from agentlab.train import SFTSettings

        return SFTSettings(steps=steps, batch_size=self.cfg.sft.batch, lr=lr, seed=self.cfg.seed, schedule=schedule)

    def tasks(self) -> dict[str, list[Task]]:
        from agentlab.synth import build_splits, expert_demos, load_tasks, save_splits

        folder = self.run.path / "tasks"
        if not (folder / "demos.jsonl").exists():
            c = self.cfg
            splits = build_splits(self.spec, {"train": c.train, "validation": c.validation, "test": c.test},
                                  seed=c.seed)
            save_splits(splits, folder)
            if self.spec.expert is not None:  # sft_all's demonstrations; an environment without an expert has none
                write_jsonl(folder / "demos_all.jsonl", expert_demos(self.spec, splits["train"][: c.sft_all_demos]))
            if c.demos:  # the user's own, checked and rendered for this environment (agentlab.demos)
                from agentlab.demos import load_demos

                mine = load_demos(self.spec, c.demos)
            else:
                mine = regime_demos(self.spec, c.regime, splits["train"])
            write_jsonl(folder / "demos.jsonl", mine)  # written last: its presence says the stage is done
        return {s: load_tasks(folder / f"{s}.jsonl") for s in ("train", "validation", "test")}

    def demos(self, which: str = "demos") -> list[dict]:
        from agentlab.runs import read_jsonl

        return read_jsonl(self.run.path / "tasks" / f"{which}.jsonl")[0]

    def sft_search(self, arm: str, demos: list[dict], lrs: tuple[float, ...], val: list[Task],
                   steps: tuple[int, ...] | None = None) -> dict:
        """SFT at each learning rate and schedule (``cfg.sft.schedules``), saved at each step count (``steps``,
        default ``cfg.sft.steps``), every adapter scored on validation; the best one.

        When the best point sits at the grid's last step count, that run is continued (the step count doubled,
        up to ``sft_extend`` times) until validation stops improving — past ``sft_patience`` dips, continuing the
        dipped run — so the search reaches the validation peak. A
        decaying schedule cannot be continued (its rate reached 0), so its longer point is a fresh run of twice
        the steps. Ties go to the smaller step count, then the smaller learning rate, then the constant schedule
        (the cheaper choice).
        """
        from agentlab.train import run_sft

        if choice := self.done(arm):
            return choice
        steps = tuple(sorted(set(steps or self.cfg.sft.steps)))
        best = None

        def score(lr: float, schedule: str, s: int, adapter: Path) -> bool:
            nonlocal best
            name = f"lr={lr:g}" + (f"_{schedule}" if schedule != "constant" else "")
            summary = self._timed(f"{arm}_{name}_steps={s}_validation", self.evaluate,
                                  search_validation(adapter, s), adapter, val, f"{arm} {name} steps={s}")
            regime = self.cfg.data() if arm != "sft_all" else f"expert:{self.cfg.sft_all_demos}"
            point = {"arm": arm, "regime": regime, "lr": lr, "steps": s, "validation": self.figure(summary)}
            if schedule != "constant":  # (older folders' points have no schedule: constant)
                point["schedule"] = schedule
            self._tried(point)
            key = (point["validation"][self.cfg.select], -s, -lr, schedule == "constant")
            if best is None or key > best[0]:
                best = (key, point, adapter)
                return True
            return False

        def folder_of(lr: float, schedule: str) -> Path:
            return self.run.path / arm / (f"lr={lr:g}" + (f"-{schedule}" if schedule != "constant" else ""))

        for schedule in self.cfg.sft.schedules:
            for lr in lrs:
                folder = folder_of(lr, schedule)
                if not all((folder / f"adapter-step-{s}" / "adapter_config.json").exists() for s in steps):
                    self._timed(f"{arm}_{folder.name}_train", run_sft, self.cfg.model, demos, folder,
                                self.sft_settings(lr, max(steps), schedule), save_at=steps)
                for s in steps:
                    score(lr, schedule, s, folder / f"adapter-step-{s}")
        last, chain, misses = max(steps), None, 0  # chain: the run being continued (its rate, schedule, adapter)
        for _ in range(self.cfg.sft.extend):
            if chain is None:
                point = best[1]
                if point["steps"] != last:
                    break
                chain = (point["lr"], point.get("schedule", "constant"), best[2])
            lr, schedule, adapter = chain
            folder = folder_of(lr, schedule)
            target = folder / f"adapter-step-{2 * last}"
            if not (target / "adapter_config.json").exists():
                if schedule == "constant":  # continue the run (a fresh optimiser state)
                    self._timed(f"{arm}_lr={lr:g}_extend={2 * last}", run_sft, self.cfg.model, demos,
                                folder / f"extend-{2 * last}", self.sft_settings(lr, last), init_adapter=adapter)
                    (folder / f"extend-{2 * last}" / "adapter").rename(target)
                else:  # a decayed rate cannot be continued: twice the steps, from the start
                    self._timed(f"{arm}_{folder.name}_train={2 * last}", run_sft, self.cfg.model, demos,
                                folder / f"run-{2 * last}", self.sft_settings(lr, 2 * last, schedule),
                                save_at=(2 * last,))
                    (folder / f"run-{2 * last}" / f"adapter-step-{2 * last}").rename(target)
            misses = 0 if score(lr, schedule, 2 * last, target) else misses + 1
            last, chain = 2 * last, (lr, schedule, target)
            if misses > self.cfg.sft.patience:
                break
        _, point, adapter = best
        choice = {**point, "adapter": self.run.rel(adapter), "at_edge": point["steps"] == last}
        self.run.write_json(f"{arm}/choice.json", choice)
        return choice

    def grpo(self, start: dict, val: list[Task], train: list[Task]) -> dict:
        """GRPO from the chosen SFT adapter, validation evals every ``eval_every`` steps; the best checkpoint."""
        from agentlab.train import run_grpo

        if choice := self.done("grpo"):
            return choice
        grpo_run = RunDir(self.run.path / "grpo")
        if not grpo_run.finished:
            adapter = self.adapter(start)
            run_grpo(self.cfg.grpo, train, val, init_adapter=adapter, run=grpo_run, engine=self.engine,
                     start_eval=search_validation(adapter, start["steps"]))
        evals = [e for e in grpo_run.evals() if e["step"] > 0]
        for e in evals:
            self._tried({"arm": "grpo", "regime": self.cfg.data(), "lr": self.cfg.grpo.lr, "steps": e["step"],
                               "validation": self.figure(e)})
        best = max(evals, key=lambda e: (e[self.cfg.select]["mean"], -e["step"]))
        seconds = sum(m.get("time_step_s") or 0.0 for m in grpo_run.metrics())
        choice = {"step": best["step"], "validation": self.figure(best), "train_seconds": round(seconds, 1),
                  "adapter": self.run.rel(grpo_run.path / "checkpoints" / f"checkpoint-{best['step']}")}
        self.run.write_json("grpo/choice.json", choice)
        return choice

    def checkpoints(self) -> int:
        """How many checkpoints a time-matched arm saves and scores on validation: as many as GRPO's evaluations."""
        return max(1, self.cfg.grpo.steps // max(1, self.cfg.grpo.eval_every))

    def choose(self, arm: str, folder: Path, lr: float, val: list[Task]) -> dict:
        """Score each checkpoint a time-budgeted SFT run saved on validation; the best (ties: the earlier one).

        The same selection GRPO gets (its best validation checkpoint): a baseline that only kept its last
        adapter would be a weaker baseline, not a compute-matched one.
        """
        summary = json.loads((folder / "sft_summary.json").read_text())
        best = None
        for s in summary.get("saved_steps") or [summary["steps"]]:
            adapter = folder / f"adapter-step-{s}"
            if not (adapter / "adapter_config.json").exists():
                adapter = folder / "adapter"
            scored = self._timed(f"{arm}_steps={s}_validation", self.evaluate, folder / f"validation-step-{s}",
                                 adapter, val, f"{arm} steps={s}")
            point = {"arm": arm, "regime": self.cfg.data(), "lr": lr, "steps": s, "validation": self.figure(scored)}
            self._tried(point)
            if best is None or point["validation"][self.cfg.select] > best[0]["validation"][self.cfg.select]:
                best = (point, adapter)
        point, adapter = best
        return {"adapter": self.run.rel(adapter), "extra_steps": point["steps"], "validation": point["validation"],
                "steps_run": summary["steps"], "seconds": summary["seconds"]}

    def sft_matched(self, start: dict, budget_s: float, val: list[Task]) -> dict:
        """``sft_best``'s SFT continued on the same demonstrations for GRPO's training seconds, checkpoints chosen
        on validation."""
        from agentlab.train import run_sft

        if choice := self.done("sft_matched"):
            return choice
        folder = self.run.path / "sft_matched"
        if not (folder / "adapter" / "adapter_config.json").exists():
            run_sft(self.cfg.model, self.demos(), folder, self.sft_settings(start["lr"], 100_000),
                    init_adapter=self.adapter(start), max_seconds=budget_s, save_every_s=budget_s / self.checkpoints())
        choice = self.choose("sft_matched", folder, start["lr"], val)
        self.run.write_json("sft_matched/choice.json", choice)
        return choice

    def rft(self, start: dict, budget_s: float, train: list[Task], val: list[Task]) -> dict:
        from agentlab.verified import rft

        return self.done("rft") or rft(self, start, budget_s, train, val)

    def expert_iteration(self, start: dict, budget_s: float, train: list[Task], val: list[Task]) -> dict:
        from agentlab.verified import expert_iteration

        return self.done("expert_iteration") or expert_iteration(self, start, budget_s, train, val)


def run_compare(cfg: CompareConfig, arms: tuple[str, ...] | None = None, overwrite: bool = False,
                engine=None) -> dict:
    """Run (or resume) the arms of ``cfg``, evaluate each once on test, write ``result.json`` and ``result.png``.
    ``arms`` ``None``: every arm the environment can run (``sft_all`` needs a scripted expert).
    ``engine(model, tok, config, greedy, seed) -> GenerateFn`` decodes every evaluation and GRPO's rollouts instead
    of ``cfg.grpo.rollout_backend`` (rft's sampling too)."""
    from agentlab.envs import load
    from agentlab.evals import paired_bootstrap_ci, read_rollouts

    if arms is None:
        arms = tuple(a for a in ARMS if a != "sft_all" or load(cfg.env).expert is not None)
        if len(arms) < len(ARMS):
            _say(f"{cfg.env} has no scripted expert: the sft_all reference is left out")
    bad = set(arms) - set(ARMS)
    if bad or "sft_best" not in arms:
        raise ValueError(f"arms {sorted(bad) or list(arms)}: expected a subset of {list(ARMS)} including 'sft_best'")
    if any(a in arms for a in ("sft_matched", "rft", "expert_iteration")) and "grpo" not in arms:
        raise ValueError("sft_matched, rft and expert_iteration are matched to GRPO's wall-clock: include 'grpo' in the arms")
    if "sft_all" in arms and load(cfg.env).expert is None:
        raise ValueError(f"arm sft_all needs a scripted expert, and {cfg.env!r} has none: leave it out "
                         f"(--arms {','.join(a for a in arms if a != 'sft_all')})")
    cmp = Comparison(cfg, overwrite=overwrite, engine=engine)
    cmp.log_session()
    splits = cmp._timed("tasks", cmp.tasks)
    val, test = splits["validation"], splits["test"]
    policies: dict[str, dict] = {}
    _say(f"[{cfg.name}] SFT search on {len(cmp.demos())} {cfg.data()} demonstrations: lr {cfg.sft.lrs} x steps "
         f"{cfg.sft.steps}, chosen on {len(val)} validation tasks")
    best = cmp.sft_search("sft_best", cmp.demos(), cfg.sft.lrs, val)
    policies["sft_best"] = best
    if "grpo" in arms:
        _say(f"[{cfg.name}] GRPO from sft_best (lr {best['lr']:g}, {best['steps']} steps): {cfg.grpo.steps} steps")
        policies["grpo"] = cmp._timed("grpo", cmp.grpo, best, val, splits["train"])
        budget = policies["grpo"]["train_seconds"]
        if "sft_matched" in arms:
            _say(f"[{cfg.name}] sft_matched: SFT continued for GRPO's {budget:.0f} s")
            policies["sft_matched"] = cmp._timed("sft_matched", cmp.sft_matched, best, budget, val)
        if "rft" in arms:
            _say(f"[{cfg.name}] rft: rejection sampling + SFT for GRPO's {budget:.0f} s")
            policies["rft"] = cmp._timed("rft", cmp.rft, best, budget, splits["train"], val)
        if "expert_iteration" in arms:
            _say(f"[{cfg.name}] expert_iteration: {cfg.ei_rounds} rounds of sampling + SFT on verified successes "
                 f"for GRPO's {budget:.0f} s")
            policies["expert_iteration"] = cmp._timed("expert_iteration", cmp.expert_iteration, best, budget,
                                                      splits["train"], val)
    if "sft_all" in arms:  # searched as sft_best is, over every rate, to several epochs of its demonstrations
        demos_all = cmp.demos("demos_all")
        steps = epoch_steps(len(demos_all), cfg.sft.batch, cfg.sft.all_epochs)
        _say(f"[{cfg.name}] sft_all (reference): {len(demos_all)} expert demonstrations, lr {cfg.sft.lrs} x steps "
             f"{steps} ({', '.join(f'{e:g}' for e in cfg.sft.all_epochs)} epochs)")
        policies["sft_all"] = cmp.sft_search("sft_all", demos_all, cfg.sft.lrs, val, steps=steps)
    results, episodes = {}, {}
    for arm, chosen in policies.items():
        _say(f"[{cfg.name}] test evaluation of {arm} on {len(test)} tasks (greedy, once)")
        folder = cmp.run.path / "test" / arm
        summary = cmp._timed(f"test_{arm}", cmp.evaluate, folder, cmp.adapter(chosen), test, arm)
        results[arm] = success_entry(summary)
        episodes[arm] = read_rollouts(folder / "rollouts.jsonl")[0]
    diffs = {}
    if "grpo" in results:
        for arm in ("sft_best", "sft_matched", "rft", "expert_iteration", "sft_all"):
            if arm in results:
                low, high = paired_bootstrap_ci(episodes[arm], episodes["grpo"])
                diffs[f"grpo_minus_{arm}"] = {"mean": results["grpo"]["success"] - results[arm]["success"],
                                              "ci_low": low, "ci_high": high}
    result = {"env": cfg.env, "regime": cfg.data(), "seed": cfg.seed, "n": len(test), **results, **diffs,
              "choices": policies, "tried": cmp.tried, "seconds": cmp.seconds,
              "seconds_total": cmp.clock.total(), "config": cfg.to_config()}
    cmp.run.write_json("result.json", result)
    from agentlab.plots import plot_comparison

    plot_comparison(result, RunDir(cmp.run.path / "grpo").evals() if "grpo" in arms else [],
                    cmp.run.path / "result.png")
    from agentlab.pipeline import print_comparison

    print_comparison(result)
    return result


def _say(text: str) -> None:
    print(text, flush=True)
