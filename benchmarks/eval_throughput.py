"""Held-out evaluation speed: episodes/min of the shared loop (greedy, batched), as ``agentlab eval`` runs it.

    python benchmarks/eval_throughput.py --adapter runs/quickstart/sft/adapter --n 200

Target (issue 6): 200 greedy multi-turn episodes of the default environment in <= 3 min. Use an SFT adapter so
episodes are real multi-turn tool use (the base model never calls a tool and ends after one turn).
Writes ``benchmarks/results/eval_throughput.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
sys.path.insert(0, str(Path(__file__).parent))


def main() -> None:
    from common import adapter_or_quickstart

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="lookup")
    p.add_argument("--adapter", default=None)
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--batch-sizes", default="16,32")
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=48)
    a = p.parse_args()
    a.adapter = adapter_or_quickstart(a.adapter)

    from agentlab.envs import load
    from agentlab.evals import summarize
    from agentlab.models import load_policy
    from agentlab.rollout import LoopConfig, run_episodes
    from agentlab.train import _threads

    _threads()
    spec = load(a.env)
    tasks = spec.make_tasks("test", a.n, seed=0)
    model, tok = load_policy("smollm2-135m", adapter=a.adapter)
    rows = []
    for batch in [int(b) for b in a.batch_sizes.split(",")]:
        cfg = LoopConfig(max_turns=a.max_turns, max_new_tokens=a.max_new_tokens, temperature=0, batch_size=batch)
        t0 = time.perf_counter()
        eps = run_episodes(model, tok, spec, tasks, config=cfg, greedy=True, progress=False)
        dt = time.perf_counter() - t0
        s = summarize(eps)
        rows.append({"batch_size": batch, "episodes": len(eps), "seconds": dt, "episodes_per_min": 60 * len(eps) / dt,
                     "mean_turns": s["turns"]["mean"], "success": s["success"]["mean"],
                     "generated_tokens": sum(t.n_generated for e in eps for t in e.turns)})
        print(f"batch {batch:3d}: {len(eps)} episodes in {dt:6.1f} s = {rows[-1]['episodes_per_min']:6.1f} "
              f"episodes/min (mean turns {rows[-1]['mean_turns']:.2f}, success {rows[-1]['success']:.2f})")
    RESULTS.mkdir(exist_ok=True)
    best = min(rows, key=lambda r: r["seconds"])
    out = {"env": a.env, "adapter": a.adapter, "n": a.n, "runs": rows,
           "target_seconds_for_200": 180, "best_seconds_per_200": best["seconds"] * 200 / a.n}
    (RESULTS / "eval_throughput.json").write_text(json.dumps(out, indent=2))
    print(f"best: {out['best_seconds_per_200']:.0f} s per 200 episodes (target <= 180 s)")


if __name__ == "__main__":
    main()
