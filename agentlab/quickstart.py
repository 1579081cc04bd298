"""The CPU quickstart: the RL-vs-SFT study in miniature, on ``lookup``, in one command.

    agentlab quickstart            # (make quickstart) the real run, shipped SmolLM2-135M, on 2 CPU cores
    agentlab quickstart --smoke    # tiny random model and sizes: the pipeline end to end in about a minute

It is ``agentlab compare`` (``agentlab.compare``) with small budgets and the base model added:

1. synthesise train / validation / test tasks and the regime's demonstrations: the successful traces of
   ``lookup``'s cheap strategy (search the last name alone, answer from the first record), the logs one has
   before anyone scripts an expert; GRPO gets the training tasks and the verifier only;
2. evaluate the base model on the test tasks (zero-shot it never calls a tool);
3. ``sft``: SFT on those traces, learning rate and steps chosen on validation (a real search, not a run stopped
   early to leave GRPO headroom);
4. ``grpo``: GRPO from that SFT adapter, the checkpoint chosen on validation;
5. ``sft_matched``: the same SFT continued on the same traces for GRPO's training seconds, its checkpoint chosen
   on validation the same way: the baseline that keeps GRPO honest;
6. every reported policy evaluated once, greedily, on the same test tasks; ``report.json`` and ``report.png``.

``report.json`` holds ``base``, ``sft``, ``grpo`` and ``sft_matched`` (``success``, ``ci_low``, ``ci_high``, ``n``),
the paired differences GRPO − SFT and GRPO − ``sft_matched`` with their CIs, what was chosen on validation and
every setting tried, stage wall times and peak memory. Every stage is skipped when its output exists, so an
interrupted quickstart picks up where it stopped (GRPO resumes from its last checkpoint). The chosen SFT adapter
is also copied to ``runs/quickstart/sft/adapter``, where the later notebooks start from.
"""

from __future__ import annotations

import json
import resource
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from agentlab.compare_config import CompareConfig, SFTSearch
from agentlab.experiment import Experiment
from agentlab.machine import describe
from agentlab.paths import QUICKSTART_RUN, shown
from agentlab.runs import RunDir

ARMS = ("sft_best", "grpo", "sft_matched")
# The quickstart's GRPO stage is one seed; the spread a reader needs beside it was measured twice over seeds 0, 1, 2
# (lookup, 12 steps x 2 prompts x 4 rollouts at T = 1.0): benchmarks/zero_signal.py from named SFT starts on an AVX2
# machine (its `step` mode is the quickstart's GRPO as it runs), and benchmarks/async_grpo.py's synchronous (K = 0)
# rows from the AVX-512 quickstart's own start. A run is shown the spread from its own start where one was measured.
# (A verifier-using arm, rft or expert_iteration, would not fit the quickstart: both are given GRPO's training
# seconds, ~6 min here, plus a test evaluation.)
SEED_SPREAD = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "async_grpo.json"
STARTS_SPREAD = SEED_SPREAD.parent / "zero_signal.json"


def _grpo_default() -> Experiment:
    return Experiment(env="lookup", groups_per_step=2, group_size=4, steps=12, eval_every=6,
                      temperature=1.0)  # GRPO's sampling temperature, as in the study (benchmarks/rl_vs_sft.py)


@dataclass(frozen=True)
class QuickstartConfig(CompareConfig):
    """The quickstart is a comparison (:class:`~agentlab.compare_config.CompareConfig`) with lookup's small
    budgets: the defaults below are all that differs."""

    name: str = QUICKSTART_RUN
    regime: str = "cheap:48"            # 48 successful traces of lookup's cheap strategy (EnvSpec.cheap_policy)
    train: int = 480                    # the cheap strategy succeeds on ~17% of training tasks: 48 traces need ~300
    validation: int = 48                # every choice (SFT lr and steps, GRPO checkpoint) is made on these
    grpo: Experiment = field(default_factory=_grpo_default)  # lookup's own budget: 3 turns, 48 tokens a turn
    sft: SFTSearch = field(default_factory=lambda: SFTSearch(steps=(4, 8, 16), extend=1))
    sft_all_demos: int = 8              # the arm is not run here; its demonstrations stay few

    @classmethod
    def smoke(cls, **overrides) -> QuickstartConfig:
        return cls.of(**{"name": "quickstart-smoke", "model": "tiny-random", "regime": "cheap:4", "train": 64,
                         "validation": 4, "test": 6, "sft_lrs": (1e-3,), "sft_steps": (1, 2), "grpo_steps": 2,
                         "groups_per_step": 1, "group_size": 2, "eval_every": 1, "max_new_tokens": 8, **overrides})


def seed_spread(cfg: CompareConfig, start: dict | None = None, path: Path = SEED_SPREAD,
                starts: Path = STARTS_SPREAD) -> dict | None:
    """Validation success of this GRPO stage at its start and last checkpoint over three training seeds, where that
    setting was measured (else ``None``): ``{"seeds": {seed: last}, "start", "steps", "machine", "commit", "source",
    "same_start"}``. ``start`` (``{"lr", "steps", "precision", "validation": {"success", "n"}}``: the SFT choice
    GRPO began from, the arithmetic that trained it and its validation figure) picks runs from exactly that start
    (``same_start``): the same setting in the same precision, scoring the same on validation. The machine class is
    not part of it: in fp32 an AVX-512 Xeon's quickstart reproduced an AVX2 EPYC's, every validation point of the
    SFT grid and of GRPO and every test figure (``quickstart_avx512.json``, ``quickstart_avx2.json``); in bf16 the
    classes' kernels differ. Without a start measured, the runs from the AVX-512 quickstart's start
    (``benchmarks/async_grpo.py``)."""
    g = cfg.grpo
    if start and starts.exists():
        s = json.loads(starts.read_text())["starts"].get(f"sft-lr={start['lr']:g}-steps={start['steps']}")
        stage = (g.env, g.lr, g.groups_per_step, g.group_size, g.steps, g.temperature)
        same = s and s["machine"].get("precision") == start.get("precision") and (
            round(s["start_validation"]["mean"], 4), s["start_validation"]["n"]) == (
            round(start["validation"]["success"], 4), start["validation"]["n"])
        if same and stage == tuple(
                s["grpo"][k] for k in ("env", "lr", "groups_per_step", "group_size", "steps", "temperature")):
            return {"seeds": {seed: round(r["validation"][-1]["mean"], 4) for seed, r in sorted(s["runs"]["step"].items())},
                    "start": round(s["start_validation"]["mean"], 4), "steps": g.steps,
                    "machine": s["machine"]["cpu_class"], "commit": s["machine"].get("commit"),
                    "source": "benchmarks/results/zero_signal.json", "same_start": True}
    if not path.exists():
        return None
    r = json.loads(path.read_text())
    c = r["config"]
    if (c["env"], c["steps"], c["groups_per_step"], c["group_size"]) != (g.env, g.steps, g.groups_per_step,
                                                                        g.group_size) or "0" not in r["per_k"]:
        return None
    per_seed = r["per_k"]["0"]["per_seed"]
    curves = {seed: run["validation"] for seed, run in sorted(per_seed.items())}
    return {"seeds": {seed: round(v[-1]["success"], 4) for seed, v in curves.items()},
            "start": round(next(iter(curves.values()))[0]["success"], 4), "steps": c["steps"],
            "machine": r["machine"].get("cpu_class"), "commit": r["machine"].get("commit"),
            "source": "benchmarks/results/async_grpo.json", "same_start": False}


def report_spread(report: dict) -> dict | None:
    """:func:`seed_spread` for a finished quickstart's ``report.json``: its setting, its SFT choice, its machine."""
    cfg = QuickstartConfig.of(**{k: v for k, v in report["config"].items() if k != "name"})
    return seed_spread(cfg, _start(report["choices"]["sft_best"], report["machine"]))


def _start(sft: dict, machine: dict) -> dict:
    """What :func:`seed_spread` matches a start by: the SFT choice's setting, precision and validation figure."""
    return {"lr": sft["lr"], "steps": sft["steps"], "precision": machine.get("precision"),
            "validation": {k: sft["validation"][k] for k in ("success", "n")}}


def spread_text(spread: dict) -> str:
    """One clause for a reader: ``"the same GRPO stage from the same SFT start ended at validation 0.00 / 0.75 /
    0.71 on seeds 0, 1, 2 (from 0.23; `benchmarks/results/zero_signal.json`, avx2)"``."""
    whence = "the same SFT start" if spread["same_start"] else f"the quickstart's SFT start on {spread['machine']}"
    return (f"the same GRPO stage from {whence} ended at validation "
            f"{' / '.join(f'{v:.2f}' for v in spread['seeds'].values())} on seeds {', '.join(spread['seeds'])} "
            f"(from {spread['start']:.2f}; `{spread['source']}`, {spread['machine']})")


def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # KiB on Linux


def run_quickstart(cfg: QuickstartConfig = QuickstartConfig(), overwrite: bool = False) -> dict:
    from agentlab.compare import Comparison, run_compare
    from agentlab.evals import success_entry
    from agentlab.pipeline import print_summary
    from agentlab.plots import plot_report

    cmp = Comparison(cfg, overwrite=overwrite)
    print(f"\n=== {cfg.model} on {cfg.env}: the base model, then {', '.join(ARMS)} ===", flush=True)
    test = cmp._timed("tasks", cmp.tasks)["test"]
    print(f"[{cfg.name}] base model ({cfg.model}) on {len(test)} test tasks (greedy, once)", flush=True)
    base = cmp._timed("test_base", cmp.evaluate, cmp.run.path / "test" / "base", None, test, "base")
    print_summary(base)
    result = run_compare(cfg, arms=ARMS)
    run = cmp.run
    sft_copy = run.path / "sft" / "adapter"
    if not (sft_copy / "adapter_config.json").exists():
        shutil.copytree(run.resolve(result["choices"]["sft_best"]["adapter"]), sft_copy, dirs_exist_ok=True)
    report = _report(cfg, success_entry(base), result, run)
    earlier = run.read_json("report.json") or {}  # a resumed run: the process that did the work peaked higher
    report["peak_rss_gb"] = max(report["peak_rss_gb"], earlier.get("peak_rss_gb", 0.0))
    run.write_json("report.json", report)
    grpo_run = RunDir(run.path / "grpo")
    plot_report(report, grpo_run.metrics(), grpo_run.evals(), run.path / "report.png")
    _print_report(report, run)
    return report


def _report(cfg: QuickstartConfig, base: dict, result: dict, run: RunDir) -> dict:
    choices, seconds = result["choices"], result["seconds"]
    sft, grpo, matched = choices["sft_best"], choices["grpo"], choices["sft_matched"]

    def total(prefix: str) -> float:
        return round(sum(v for k, v in seconds.items() if k.startswith(prefix)), 1)

    timings = {"synthesise": seconds.get("tasks", 0.0), "eval_base": seconds.get("test_base", 0.0),
               "sft_search": total("sft_best_"), "grpo": seconds.get("grpo", 0.0),
               "sft_matched": seconds.get("sft_matched", 0.0),
               "test_evals": round(total("test_") - seconds.get("test_base", 0.0), 1)}
    machine = describe()
    return {
        "title": f"{cfg.model} on {cfg.env}, regime {cfg.regime}: base → SFT (lr {sft['lr']:g}, {sft['steps']} "
                 f"steps, chosen on validation) → GRPO (checkpoint {grpo['step']} of {cfg.grpo.steps}); SFT "
                 f"continued for GRPO's {grpo['train_seconds']:.0f} s: +{matched['steps_run']} steps, checkpoint "
                 f"+{matched['extra_steps']} chosen",
        "env": cfg.env, "model": cfg.model, "regime": cfg.regime, "n": result["n"],
        "base": base, "sft": {**result["sft_best"], "lr": sft["lr"], "steps": sft["steps"]},
        "grpo": {**result["grpo"], "step": grpo["step"]},
        "sft_matched": {**result["sft_matched"], "extra_steps": matched["extra_steps"]},
        "grpo_minus_sft": result["grpo_minus_sft_best"], "grpo_minus_sft_matched": result["grpo_minus_sft_matched"],
        "non_overlapping_cis": result["grpo"]["ci_low"] > result["sft_best"]["ci_high"],
        "rollouts": {stage: run.rel(run.path / "test" / arm / "rollouts.jsonl") for stage, arm in
                     (("base", "base"), ("sft", "sft_best"), ("grpo", "grpo"), ("sft_matched", "sft_matched"))},
        "choices": choices, "tried": result["tried"],
        "one_seed": {"seed": cfg.seed, "grpo_spread": seed_spread(cfg, _start(sft, machine))},  # one draw: its spread
        # Each stage's seconds are recorded once, when it ran: their sum is the run's time even when resumed.
        "timings_s": timings, "total_s": round(sum(timings.values()), 1),
        "seconds": seconds, "peak_rss_gb": round(_peak_rss_gb(), 2),
        "machine": machine,
        "config": cfg.to_config(),
    }


def _print_report(report: dict, run: RunDir) -> None:
    print("\n=== quickstart report ===")
    for k in ("base", "sft", "grpo", "sft_matched"):
        e = report[k]
        print(f"{k:11s} success {e['success']:.3f}  [95% CI {e['ci_low']:.3f}, {e['ci_high']:.3f}]  n={e['n']}")
    for k in ("sft", "sft_matched"):
        d = report[f"grpo_minus_{k}"]
        print(f"GRPO - {k} (paired over the same tasks): {d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]")
    spread = report["one_seed"]["grpo_spread"]
    print(f"one seed ({report['one_seed']['seed']}): GRPO's row is one draw", end="")
    print(f"; {spread_text(spread)}" if spread else "")
    print("stage times: " + ", ".join(f"{k} {v:.0f}s" for k, v in report["timings_s"].items()))
    print(f"peak RSS {report['peak_rss_gb']:.1f} GB, total {report['total_s']:.0f} s, "
          f"precision {report['machine'].get('precision', 'fp32')}")
    print(f"-> {shown(run.path / 'report.json')} and {shown(run.path / 'report.png')}")
