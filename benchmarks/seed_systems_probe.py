"""Is a seed environment within reach of SFT on this machine, and what does an episode cost? A feasibility probe.

    python benchmarks/seed_systems_probe.py --env doc_search --regime easy:64     # ~20 min on 2 cores
    python benchmarks/seed_systems_probe.py --env code_search --regime expert:64

One SFT run on the regime's demonstrations (lr ``--lr``, adapters saved at ``--steps``), each adapter evaluated
greedily on ``--n`` validation tasks at the environment's budget: success and the environment's own metrics with
95% CIs, how episodes ended (final answer, out of turns, out of context, no tool call), and seconds per episode.
Not a study (one seed, one learning rate, validation only): it says whether the study of the seed-systems work is
worth its hours here, and what its evaluations will cost. Resumes: finished adapters and evaluations are read back.
Writes ``benchmarks/results/seed_systems_probe.json`` (one entry per env and regime).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def main(argv: list[str] | None = None) -> dict:
    from common import RESULTS, write_result

    from agentlab.envs import load
    from agentlab.evals import mean_ci
    from agentlab.machine import describe
    from agentlab.paths import runs_dir
    from agentlab.pipeline import evaluate
    from agentlab.rollout import EVAL_BATCH, LoopConfig
    from agentlab.runs import read_jsonl, write_jsonl
    from agentlab.synth import build_splits, regime_demos
    from agentlab.train import SFTSettings, run_sft

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="doc_search")
    p.add_argument("--regime", default="easy:64")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--steps", default="8,16,32", help="adapters saved after these SFT steps")
    p.add_argument("--n", type=int, default=32, help="validation tasks per adapter")
    p.add_argument("--model", default="smollm2-135m")
    a = p.parse_args(argv)
    steps = tuple(sorted(int(s) for s in a.steps.split(",")))
    spec = load(a.env)
    root = runs_dir() / "seed-systems-probe" / f"{a.env}-{a.regime.replace(':', '-')}"
    demos_file = root / "demos.jsonl"
    splits = build_splits(spec, {"train": 1000, "validation": a.n}, seed=0)
    if not demos_file.exists():
        root.mkdir(parents=True, exist_ok=True)
        write_jsonl(demos_file, regime_demos(spec, a.regime, splits["train"]))
    demos = read_jsonl(demos_file)[0]
    sft_dir = root / f"lr={a.lr:g}"
    t0 = time.time()
    if not all((sft_dir / f"adapter-step-{s}" / "adapter_config.json").exists() for s in steps):
        run_sft(a.model, demos, sft_dir, SFTSettings(steps=max(steps), lr=a.lr), save_at=steps)
    summary_file = sft_dir / "sft_summary.json"  # absent when a longer run was stopped after saving these steps
    sft_s = json.loads(summary_file.read_text())["seconds"] if summary_file.exists() else None
    loop = LoopConfig.of(spec, temperature=0.0, batch_size=EVAL_BATCH)
    points = []
    for s in steps:
        summary = evaluate(a.model, a.env, splits["validation"], sft_dir / f"validation-step-{s}",
                           adapter=str(sft_dir / f"adapter-step-{s}"), loop=loop, label=f"steps={s}", reuse=True)
        episodes = read_jsonl(sft_dir / f"validation-step-{s}" / "rollouts.jsonl")[0]
        metrics = {k: mean_ci([e["metrics"].get(k, 0.0) for e in episodes])
                   for k in episodes[0]["metrics"] if isinstance(episodes[0]["metrics"][k], (int, float))}
        points.append({"steps": s, "success": summary["success"], "metrics": metrics,
                       "exits": dict(Counter(e["exit_reason"] for e in episodes)),
                       "seconds_per_episode": summary["seconds"] / len(episodes)})
        print(f"{a.env} {a.regime} steps {s}: success {summary['success']['mean']:.3f} "
              f"[{summary['success']['ci_low']:.3f}, {summary['success']['ci_high']:.3f}], exits {points[-1]['exits']}, "
              f"{points[-1]['seconds_per_episode']:.1f} s an episode", flush=True)
    path = RESULTS / "seed_systems_probe.json"
    out = json.loads(path.read_text()) if path.exists() else {}
    out[f"{a.env}/{a.regime}"] = {"env": a.env, "regime": a.regime, "demos": len(demos), "lr": a.lr,
                                  "budget": vars(spec.budget), "n_validation": a.n, "sft_seconds": sft_s,
                                  "points": points, "wall_s": round(time.time() - t0, 1), "machine": describe()}
    write_result("seed_systems_probe.json", out)
    return out


if __name__ == "__main__":
    main()
