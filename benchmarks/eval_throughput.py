"""Held-out evaluation speed: episodes/min of the shared loop (greedy, batched), as ``agentlab eval`` runs it.

    python benchmarks/eval_throughput.py --adapter runs/quickstart/sft/adapter --n 200

Target: 200 greedy multi-turn episodes of the default environment in <= 3 min. Use an SFT adapter so
episodes are real multi-turn tool use (the base model never calls a tool and ends after one turn).
Writes ``benchmarks/results/eval_throughput.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def main() -> None:
    from common import add_greedy_eval_args, greedy_eval_setup, timed_greedy, write_result

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_greedy_eval_args(p, n=200, max_new_tokens=48)
    p.add_argument("--batch-sizes", default="16,32")
    a = p.parse_args()

    from agentlab.evals import summarize

    spec, tasks, model, tok = greedy_eval_setup(a, "test")
    rows = []
    for batch in [int(b) for b in a.batch_sizes.split(",")]:
        eps, dt = timed_greedy(model, tok, spec, tasks, a, batch)
        s = summarize(eps)
        rows.append({"batch_size": batch, "episodes": len(eps), "seconds": dt, "episodes_per_min": 60 * len(eps) / dt,
                     "mean_turns": s["turns"]["mean"], "success": s["success"]["mean"],
                     "generated_tokens": sum(t.n_generated for e in eps for t in e.turns)})
        print(f"batch {batch:3d}: {len(eps)} episodes in {dt:6.1f} s = {rows[-1]['episodes_per_min']:6.1f} "
              f"episodes/min (mean turns {rows[-1]['mean_turns']:.2f}, success {rows[-1]['success']:.2f})")
    best = min(rows, key=lambda r: r["seconds"])
    out = {"env": a.env, "adapter": a.adapter, "n": a.n, "runs": rows,
           "target_seconds_for_200": 180, "best_seconds_per_200": best["seconds"] * 200 / a.n}
    write_result("eval_throughput.json", out)
    print(f"best: {out['best_seconds_per_200']:.0f} s per 200 episodes (target <= 180 s)")


if __name__ == "__main__":
    main()
