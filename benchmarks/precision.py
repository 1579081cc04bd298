"""What bf16 decoding changes on the real model: log-prob drift, greedy agreement, held-out success and speed.

    python benchmarks/precision.py --adapter runs/quickstart/sft/adapter --n 48

On a CPU with bf16 hardware, ``precision="auto"`` decodes with a bf16 copy of the policy (``agentlab.precision``).
This runs the same greedy held-out episodes with ``precision="fp32"`` and ``"bf16"`` (same model + adapter, same
tasks, same budgets) and reports success with 95% CIs, the paired difference, wall time, and — on the fp32 run's
own tokens — the bf16 copy's per-token log-prob deviation and how often its greedy choice is the fp32 one.
Writes ``benchmarks/results/precision.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def main() -> None:
    from common import add_greedy_eval_args, greedy_eval_setup, timed_greedy, write_result

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_greedy_eval_args(p, n=48, max_new_tokens=64)
    a = p.parse_args()

    import torch

    from agentlab.evals import paired_bootstrap_ci, summarize
    from agentlab.precision import cpu_has_fast_bf16, for_generation

    spec, tasks, model, tok = greedy_eval_setup(a, "validation")
    runs, episodes = {}, {}
    for precision in ("fp32", "bf16"):
        eps, seconds = timed_greedy(model, tok, spec, tasks, a, 48, precision)
        runs[precision] = {"seconds": seconds, "success": summarize(eps)["success"]}
        episodes[precision] = eps
        s = runs[precision]["success"]
        print(f"{precision}: success {s['mean']:.2f} [{s['ci_low']:.2f}, {s['ci_high']:.2f}] "
              f"in {runs[precision]['seconds']:.0f} s")
    # log-prob drift on the fp32 run's own sequences (generated tokens only)
    fast = for_generation(model, "bf16")
    drift, agree, total = [], 0, 0
    with torch.no_grad():
        for ep in episodes["fp32"][:16]:
            ids = torch.tensor([ep.tokens["prompt_ids"] + ep.tokens["completion_ids"]])
            mask = torch.tensor([0] * len(ep.tokens["prompt_ids"]) + ep.tokens["mask"])[1:].bool()
            ref = model(input_ids=ids).logits[0, :-1].float().log_softmax(-1)
            got = fast(input_ids=ids).logits[0, :-1].float().log_softmax(-1)
            target = ids[0, 1:]
            diff = (got.gather(-1, target[:, None]) - ref.gather(-1, target[:, None]))[:, 0][mask].abs()
            drift += diff.tolist()
            agree += int((got.argmax(-1) == ref.argmax(-1))[mask].sum())
            total += int(mask.sum())
    drift.sort()
    lo, hi = paired_bootstrap_ci(episodes["fp32"], episodes["bf16"])
    paired = {"mean": runs["bf16"]["success"]["mean"] - runs["fp32"]["success"]["mean"], "ci_low": lo, "ci_high": hi}
    from agentlab.machine import describe

    out = {"machine": describe(), "env": a.env, "adapter": a.adapter, "n": a.n, "cpu_has_fast_bf16": cpu_has_fast_bf16(), "runs": runs,
           "paired_bf16_minus_fp32": paired, "speedup": runs["fp32"]["seconds"] / runs["bf16"]["seconds"],
           "logprob_abs_diff": {"median": drift[len(drift) // 2], "p99": drift[int(0.99 * (len(drift) - 1))],
                                "max": drift[-1], "tokens": len(drift)},
           "greedy_agreement": agree / max(total, 1)}
    write_result("precision.json", out)
    print(f"paired bf16 - fp32: {paired['mean']:+.2f} [{paired['ci_low']:+.2f}, {paired['ci_high']:+.2f}]; "
          f"speed-up {out['speedup']:.2f}x; |dlogp| median {out['logprob_abs_diff']['median']:.4f} "
          f"p99 {out['logprob_abs_diff']['p99']:.3f}; greedy agreement {out['greedy_agreement']:.3f}")


if __name__ == "__main__":
    main()
