"""The CPU quickstart: synthesise → evaluate base → SFT → evaluate → GRPO → evaluate → report.

    agentlab quickstart            # (make quickstart) the real run, shipped SmolLM2-135M, 10-20 min on 2 cores
    agentlab quickstart --smoke    # tiny random model and sizes: the pipeline end to end in about a minute

Every stage writes into ``runs/<name>/`` and is skipped when its output already exists, so an interrupted
quickstart picks up where it stopped (the GRPO stage resumes from its last checkpoint).
``report.json`` holds ``base``, ``sft``, ``grpo`` and ``sft_matched`` — each ``success``, ``ci_low``, ``ci_high``,
``n`` on the same test tasks — plus the paired differences GRPO − SFT and GRPO − ``sft_matched`` with their CIs,
stage wall times and peak memory. ``sft_matched`` is the baseline that keeps GRPO honest: the same SFT continued
on the same demonstrations for as many seconds as GRPO trained. GRPO's checkpoint evaluations use the validation
split; the test split is evaluated once per reported policy.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import shutil
import time
from dataclasses import asdict, dataclass

from agentlab.precision import resolve
from agentlab.rollout import LoopConfig
from agentlab.runs import RunDir
from agentlab.train import Experiment, SFTSettings


@dataclass(frozen=True)
class QuickstartConfig:
    name: str = "quickstart"
    env: str = "lookup"
    model: str = "smollm2-135m"
    train: int = 240
    validation: int = 48
    test: int = 100               # held-out tasks every stage is evaluated on (greedy)
    demos: int = 48
    # Chosen on the validation split (never the test split): 4 SFT steps gave 0.31 greedy success (0.16 sampled
    # at T=0.7), leaving GRPO headroom; 8 steps gave 0.77 and little left to learn. 12 GRPO steps at lr 2e-4
    # took validation success 0.31 -> 0.52 by step 6; lr 1e-3 collapsed to 0 after one step.
    sft_steps: int = 4
    sft_lr: float = 1e-3
    grpo_steps: int = 12
    grpo_lr: float = 2e-4
    groups_per_step: int = 2
    group_size: int = 4
    temperature: float = 0.7
    eval_every: int = 6
    checkpoint_eval_tasks: int = 32  # in-run checkpoint evals use a subset of the validation tasks (CPU time)
    max_turns: int | None = None        # None: the environment's budget (lookup: 3 turns, 48 tokens a turn)
    max_new_tokens: int | None = None
    seed: int = 0

    @classmethod
    def smoke(cls) -> QuickstartConfig:
        return cls(name="quickstart-smoke", model="tiny-random", train=16, validation=4, test=6, demos=8,
                   sft_steps=2, grpo_steps=2, groups_per_step=1, group_size=2, eval_every=1,
                   checkpoint_eval_tasks=2, max_new_tokens=8)

    def experiment(self) -> Experiment:
        return Experiment(name=f"{self.name}/grpo", model=self.model, env=self.env, lr=self.grpo_lr,
                          groups_per_step=self.groups_per_step, group_size=self.group_size,
                          max_turns=self.max_turns, max_new_tokens=self.max_new_tokens,
                          temperature=self.temperature, steps=self.grpo_steps, eval_every=self.eval_every,
                          eval_tasks=self.checkpoint_eval_tasks, seed=self.seed)

    def eval_loop(self) -> LoopConfig:
        from agentlab.envs import load

        return LoopConfig.of(load(self.env), max_turns=self.max_turns, max_new_tokens=self.max_new_tokens,
                             temperature=0.0)


def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # KiB on Linux


def _stage(title: str, i: int, n: int = 8) -> None:
    print(f"\n=== [{i}/{n}] {title} ===", flush=True)


def run_quickstart(cfg: QuickstartConfig = QuickstartConfig(), overwrite: bool = False) -> dict:
    from agentlab.evals import paired_bootstrap_ci
    from agentlab.pipeline import evaluate, load_split, print_summary, synth
    from agentlab.plots import plot_report
    from agentlab.train import run_grpo, run_sft

    run = RunDir(cfg.name)
    if overwrite and run.path.exists():
        shutil.rmtree(run.path)
    run.prepare(cfg)
    t_start = time.time()
    timings: dict[str, float] = json.loads((run.path / "timings.json").read_text()) \
        if (run.path / "timings.json").exists() else {}

    def timed(key, fn):
        if key in timings:
            return fn()  # output exists: fn returns it without redoing the work
        t0 = time.time()
        out = fn()
        timings[key] = round(time.time() - t0, 1)
        (run.path / "timings.json").write_text(json.dumps(timings, indent=2))
        return out

    _stage(f"synthesise {cfg.env} tasks and expert demonstrations", 1)
    folder = run.path / "tasks"
    timed("synth_s", lambda: folder if (folder / "demos.jsonl").exists() else synth(
        cfg.env, {"train": cfg.train, "validation": cfg.validation, "test": cfg.test}, seed=cfg.seed,
        demos=cfg.demos, folder=folder))
    test = load_split(cfg.env, "test", folder)
    train = load_split(cfg.env, "train", folder)
    validation = load_split(cfg.env, "validation", folder)

    def eval_stage(label, adapter=None):
        summary = evaluate(cfg.model, cfg.env, test, run.path / label / "eval", adapter=adapter,
                           loop=cfg.eval_loop(), label=label, reuse=True)
        print_summary(summary)
        return summary

    _stage(f"evaluate the base model ({cfg.model}) on {len(test)} held-out tasks", 2)
    base = timed("eval_base_s", lambda: eval_stage("base"))

    _stage(f"SFT warm start: {cfg.sft_steps} LoRA steps on scripted demonstrations", 3)
    sft_dir = run.path / "sft"
    demos = [json.loads(line) for line in (folder / "demos.jsonl").read_text().splitlines()]
    adapter = timed("sft_s", lambda: sft_dir / "adapter" if (sft_dir / "adapter").exists() else run_sft(
        cfg.model, demos, sft_dir, SFTSettings(steps=cfg.sft_steps, lr=cfg.sft_lr, seed=cfg.seed)))
    _stage("evaluate the SFT policy", 4)
    sft = timed("eval_sft_s", lambda: eval_stage("sft", str(adapter)))

    _stage(f"GRPO: {cfg.grpo_steps} steps x {cfg.groups_per_step} prompts x {cfg.group_size} rollouts", 5)
    grpo_run = RunDir(run.path / "grpo")
    timed("grpo_s", lambda: grpo_run if grpo_run.finished else run_grpo(
        cfg.experiment(), train, validation[: cfg.checkpoint_eval_tasks], init_adapter=adapter, run=grpo_run))
    _stage("evaluate the GRPO policy", 6)
    grpo = timed("eval_grpo_s", lambda: eval_stage("grpo", str(grpo_run.path / "adapter")))

    # The baseline GRPO must beat: the same SFT, on the same demonstrations, continued for GRPO's training time.
    grpo_train_s = sum(m.get("time_step_s") or 0.0 for m in grpo_run.metrics())
    _stage(f"compute-matched SFT: the SFT continued for GRPO's {grpo_train_s:.0f} s of training", 7)
    matched_dir = run.path / "sft_matched"
    matched = timed("sft_matched_s", lambda: matched_dir / "adapter" if (matched_dir / "adapter").exists() else run_sft(
        cfg.model, demos, matched_dir, SFTSettings(steps=100_000, lr=cfg.sft_lr, seed=cfg.seed),
        init_adapter=adapter, max_seconds=grpo_train_s))
    _stage("evaluate the compute-matched SFT policy", 8)
    sft_matched = timed("eval_sft_matched_s", lambda: eval_stage("sft_matched", str(matched)))

    report = _report(cfg, base, sft, grpo, sft_matched, run, timings, paired_bootstrap_ci)
    report["total_s"] = round(time.time() - t_start, 1)
    run.write_json("report.json", report)
    metrics = grpo_run.metrics()
    evals = grpo_run.evals()
    plot_report(report, metrics, evals, run.path / "report.png")
    _print_report(report, run)
    return report


def _report(cfg, base, sft, grpo, sft_matched, run, timings, paired_bootstrap_ci) -> dict:
    from agentlab.evals import read_rollouts
    from agentlab.evals import success_entry as entry

    def episodes(label):
        return read_rollouts(run.path / label / "eval" / "rollouts.jsonl")[0]

    def paired(label, summary):  # CI of (GRPO − label) per task
        low, high = paired_bootstrap_ci(episodes(label), episodes("grpo"))
        return {"mean": entry(grpo)["success"] - entry(summary)["success"], "ci_low": low, "ci_high": high}

    matched_steps = json.loads((run.path / "sft_matched" / "sft_summary.json").read_text())["steps"]
    return {
        "title": f"{cfg.model} on {cfg.env}: base → SFT ({cfg.sft_steps} steps) → GRPO ({cfg.grpo_steps} steps); "
                 f"SFT continued for GRPO's time: +{matched_steps} steps",
        "env": cfg.env, "model": cfg.model, "base": entry(base), "sft": entry(sft), "grpo": entry(grpo),
        "sft_matched": {**entry(sft_matched), "extra_steps": matched_steps},
        "grpo_minus_sft": paired("sft", sft), "grpo_minus_sft_matched": paired("sft_matched", sft_matched),
        "non_overlapping_cis": entry(grpo)["ci_low"] > entry(sft)["ci_high"],
        "timings_s": timings, "peak_rss_gb": round(_peak_rss_gb(), 2),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpus": len(os.sched_getaffinity(0)), "precision": resolve("auto")},
        "config": asdict(cfg),
    }


def _print_report(report: dict, run: RunDir) -> None:
    print("\n=== quickstart report ===")
    for k in ("base", "sft", "grpo", "sft_matched"):
        e = report[k]
        print(f"{k:11s} success {e['success']:.3f}  [95% CI {e['ci_low']:.3f}, {e['ci_high']:.3f}]  n={e['n']}")
    for k in ("sft", "sft_matched"):
        d = report[f"grpo_minus_{k}"]
        print(f"GRPO - {k} (paired over the same tasks): {d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]")
    print("stage times: " + ", ".join(f"{k} {v:.0f}s" for k, v in report["timings_s"].items()))
    print(f"peak RSS {report['peak_rss_gb']:.1f} GB, total {report['total_s']:.0f} s, "
          f"precision {report['machine'].get('precision', 'fp32')}")
    print(f"-> {run.path / 'report.json'} and {run.path / 'report.png'}")
