"""Sharpening a skill or finding a new one? pass@k of a comparison's ``sft_best`` and GRPO on its validation tasks.

    python benchmarks/pass_at_k.py --run rl-vs-sft/product_finder/cheap-64/seed-0          # k = 1..16, T = 1.0
    python benchmarks/pass_at_k.py --run seed-systems/doc_search/easy-64/seed-0 --k 8 --n 32

Each arm's chosen adapter (its ``choice.json`` in the comparison's folder under ``runs/``) samples ``k`` episodes per
validation task at GRPO's temperature; pass@j for j = 1..k is the unbiased estimator (``evals.pass_at_k``) averaged
over tasks, with a 95% bootstrap CI over tasks. Where GRPO lifts pass@1 but not pass@16, it made likelier what
``sft_best`` could already sample (sharpening); where it lifts pass@16 too, it reaches tasks the start could not.
Samples are written under ``<run>/pass_at_k/<arm>/`` and read back (resumable). Writes
``benchmarks/results/pass_at_k.json`` (one entry per run).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import RESULTS, write_result


def main(argv=None) -> int:
    from agentlab.evals import pass_at_k_curve, per_task, read_rollouts
    from agentlab.paths import runs_dir
    from agentlab.pipeline import evaluate
    from agentlab.rollout import EVAL_BATCH, LoopConfig
    from agentlab.runs import RunDir
    from agentlab.synth import load_tasks

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True, help="a comparison's folder under runs/ (agentlab compare, a study seed)")
    p.add_argument("--arms", default="sft_best,grpo")
    p.add_argument("--k", type=int, default=16)
    p.add_argument("--n", type=int, default=64, help="validation tasks (the first n of the comparison's)")
    a = p.parse_args(argv)
    run = RunDir(runs_dir() / a.run)
    if not (run.path / "config.json").exists():
        raise SystemExit(f"{run.path} holds no comparison (no config.json): run it first")
    cfg = json.loads((run.path / "config.json").read_text())
    tasks = load_tasks(run.path / "tasks" / "validation.jsonl")[: a.n]
    loop = LoopConfig(**{k: cfg.get(k) for k in ("max_turns", "max_new_tokens", "max_context")},
                      temperature=cfg.get("temperature", 1.0), batch_size=EVAL_BATCH,
                      engine=cfg.get("rollout_backend", "torch"))
    entry = {"env": cfg["env"], "regime": cfg.get("regime"), "k": a.k, "n": len(tasks),
             "temperature": loop.temperature, "arms": {}}
    for arm in a.arms.split(","):
        choice_file = run.path / arm / "choice.json"
        if not choice_file.exists():
            print(f"[pass@k] {arm}: no {choice_file.relative_to(runs_dir())}, skipped", flush=True)
            continue
        adapter = run.resolve(json.loads(choice_file.read_text())["adapter"])
        out = run.path / "pass_at_k" / arm
        print(f"[pass@k] {arm}: {a.k} samples on each of {len(tasks)} validation tasks at T={loop.temperature}",
              flush=True)
        evaluate(cfg["model"], cfg["env"], tasks, out, adapter=str(adapter), samples=a.k, greedy=False, loop=loop,
                 label=f"{arm} pass@k", seed=cfg.get("seed", 0), reuse=True)
        entry["arms"][arm] = pass_at_k_curve(per_task(read_rollouts(out / "rollouts.jsonl")[0]), a.k)
        first, last = entry["arms"][arm][0], entry["arms"][arm][-1]
        print(f"[pass@k] {arm}: pass@1 {first['mean']:.3f}, pass@{a.k} {last['mean']:.3f}", flush=True)
    if {"sft_best", "grpo"} <= set(entry["arms"]):
        entry["grpo_minus_sft_best"] = paired_pass(run.path / "pass_at_k", a.k)
    path = RESULTS / "pass_at_k.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    results[a.run] = entry
    print(f"-> {write_result('pass_at_k.json', results)}")
    print(f"-> {plot(results, RESULTS / 'pass_at_k.png')}")
    return 0


def paired_pass(folder: Path, k: int) -> dict:
    """GRPO − ``sft_best`` in pass@1 and pass@k, paired by task: the unbiased estimator per task on the tasks both
    sampled ``k`` times, the mean difference with a 95% paired bootstrap CI."""
    from agentlab.evals import paired_bootstrap_ci, per_task, read_rollouts, task_pass_at_k

    samples = {arm: per_task(read_rollouts(folder / arm / "rollouts.jsonl")[0]) for arm in ("sft_best", "grpo")}
    common = sorted(t for t in samples["sft_best"]
                    if t in samples["grpo"] and min(len(samples["sft_best"][t]), len(samples["grpo"][t])) >= k)
    out = {}
    for j in (1, k):
        est = {arm: [task_pass_at_k(samples[arm][t], j) for t in common] for arm in samples}
        low, high = paired_bootstrap_ci(est["sft_best"], est["grpo"])
        diff = sum(est["grpo"]) / len(common) - sum(est["sft_best"]) / len(common)
        out[f"pass@{j}"] = {"mean": diff, "ci_low": low, "ci_high": high, "n": len(common)}
    return out


def markdown_table(results: dict) -> str:
    """docs' table: per run, each arm's pass@1 and pass@k on its validation tasks (95% bootstrap CI over tasks)."""
    from tables import _ci, _diff

    rows = [("| run | tasks × samples (T) | `sft_best` pass@1 | GRPO pass@1 | `sft_best` pass@k | GRPO pass@k "
            "| GRPO − `sft_best`, paired: pass@1 | pass@k |"), "|---|---|---|---|---|---|---|---|"]
    for name, e in results.items():
        cells = [_ci(e["arms"][arm][i], "mean") if arm in e["arms"] else "—"
                 for i in (0, -1) for arm in ("sft_best", "grpo")]
        paired = e.get("grpo_minus_sft_best", {})
        cells += [_diff(paired[f"pass@{j}"]) if f"pass@{j}" in paired else "—" for j in (1, e["k"])]
        rows.append(f"| `{name}` | {e['n']} × {e['k']} (T = {e['temperature']:g}) | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def plot(results: dict, out: Path) -> Path:
    """One panel per run: pass@j against j for each arm, with its 95% CI band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 3.4), sharey=True, squeeze=False)
    for ax, (name, e) in zip(axes[0], results.items()):
        for arm, curve in e["arms"].items():
            ks = [c["k"] for c in curve]
            ax.plot(ks, [c["mean"] for c in curve], marker="o", ms=3, label=arm)
            ax.fill_between(ks, [c["ci_low"] for c in curve], [c["ci_high"] for c in curve], alpha=0.2)
        ax.set_title(name.removeprefix("seed-systems/"), fontsize=9)
        ax.set_xlabel(f"k (samples per task, T = {e['temperature']:g})")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("pass@k on validation (95% CI over tasks)")
    axes[0][0].legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


if __name__ == "__main__":
    sys.exit(main())
