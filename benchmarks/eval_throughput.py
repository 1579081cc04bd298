"""Held-out evaluation speed: episodes/min of the shared loop (greedy, batched), as ``agentlab eval`` runs it.

    python benchmarks/eval_throughput.py --adapter runs/quickstart/sft/adapter --n 200

Target (issue 6): 200 greedy multi-turn episodes of the default environment in <= 3 min. Use an SFT adapter so
episodes are real multi-turn tool use (the base model never calls a tool and ends after one turn).
Writes ``benchmarks/results/eval_throughput.json``.

``--resume-ab``: instead, alternate generation with and without resuming each episode's KV cache between turns
(``agentlab.episode_cache``; "off" keeps only the shared-prompt cache, the loop before it), ``--rounds`` times, at
the first batch size; records seconds, tokens encoded before decoding, and how many episodes came out token for
token identical (greedy, bf16: batch layout can move a near-tie). Writes ``eval_resume_<env>.json``.

    python benchmarks/eval_throughput.py --env product_finder --adapter ADAPTER --n 64 --max-turns 4 \
        --max-new-tokens 96 --batch-sizes 32 --resume-ab
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def main() -> None:
    from common import add_greedy_eval_args, greedy_eval_setup, timed_greedy, write_result

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_greedy_eval_args(p, n=200, max_new_tokens=48)
    p.add_argument("--batch-sizes", default="16,32")
    p.add_argument("--resume-ab", action="store_true", help="A/B: episode caches resumed between turns, or not")
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    if a.resume_ab:
        return resume_ab(a)

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


def resume_ab(a) -> None:
    from common import greedy_eval_setup, timed_greedy, write_result

    from agentlab import episode_cache, rollout
    from agentlab.evals import summarize

    spec, tasks, model, tok = greedy_eval_setup(a, "validation")
    batch = int(a.batch_sizes.split(",")[0])
    find = episode_cache.EpisodeCache.find
    encoded: list[int] = []
    make = rollout.hf_generate_fn

    def counting(*args, **kw):  # records the tokens each call encoded
        fn = make(*args, **kw)
        fn.encoded = encoded
        return fn

    rollout.hf_generate_fn = counting
    runs, completions = [], {}
    for _ in range(a.rounds):
        for mode in ("off", "on"):
            episode_cache.EpisodeCache.find = find if mode == "on" else (lambda self, seq: None)
            encoded.clear()
            eps, dt = timed_greedy(model, tok, spec, tasks, a, batch)
            completions[mode] = [e.tokens["completion_ids"] for e in eps]
            runs.append({"mode": mode, "seconds": round(dt, 1), "encoded_tokens": sum(encoded),
                         "success": summarize(eps)["success"]["mean"],
                         "generated_tokens": sum(t.n_generated for e in eps for t in e.turns)})
            print(runs[-1], flush=True)
    episode_cache.EpisodeCache.find = find
    same = sum(x == y for x, y in zip(completions["off"], completions["on"], strict=True))
    median = {m: statistics.median(r["seconds"] for r in runs if r["mode"] == m) for m in ("off", "on")}
    out = {"env": a.env, "adapter": a.adapter, "n": a.n, "batch_size": batch, "max_turns": a.max_turns,
           "max_new_tokens": a.max_new_tokens, "runs": runs, "seconds_on_over_off": round(median["on"] / median["off"], 3),
           "identical_episodes": same, "episodes": len(tasks)}
    write_result(f"eval_resume_{a.env}.json", out)
    print(f"resume on / off: {out['seconds_on_over_off']}x; identical episodes {same}/{len(tasks)}")


if __name__ == "__main__":
    main()
