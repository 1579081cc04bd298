"""Does the llama.cpp engine decode the policy torch decodes? Measured on the machine at hand, kept per machine class.

    python benchmarks/engine_agreement.py --adapter runs/agreement-sft/adapter           # 200 greedy lookup episodes
    python benchmarks/engine_agreement.py --adapter ... --precision fp32 --n 50           # another precision
    python benchmarks/engine_agreement.py --table                                          # docs/performance.md's table

Same weights, other arithmetic (llama.cpp multiplies in its own order and keeps an f16 KV cache), so greedy texts can
part at a near-tie; the question is whether they *only* part there. For ``--n`` greedy test episodes decoded by
both engines on the same tasks this records:

- ``identical``: episodes whose every generated token agrees;
- for each episode that differs, at the first token that differs (the text before it is shared, tool results
  included): torch's ``margin`` (its best logit minus its logit for llama.cpp's pick: 0 for a tie) and the largest
  ``gap`` between the two engines' logits there. A wrong engine parts with large margins and large gaps; near-ties
  part with margins within the gap;
- along sampled paths (T = the GRPO default, first turns, llama.cpp sampling), the per-token gap between the
  log-probability the sampler drew each token with and the one the trained model computes (what GRPO's importance
  ratio sees; ``rollout_throughput.logprob_gap``).

Results go to ``benchmarks/results/engine_agreement.json`` under this machine's class (``agentlab.machine.cpu_class``),
beside the entries other machine classes wrote. Run nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def first_divergence(torch_ep, llama_ep) -> int | None:
    """Index in the completion of the first token the two episodes disagree on (``None``: identical)."""
    a, b = torch_ep.tokens["completion_ids"], llama_ep.tokens["completion_ids"]
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return k if k is not None or len(a) == len(b) else min(len(a), len(b))


def first_logits(engine, seq: list[int], eos: int):
    """llama.cpp's next-token logits after ``seq``."""
    seen = []
    engine.generate([seq], 1, eos, lambda z: (seen.append(z), z.argmax(1))[1])
    return seen[0][0]


def divergence_margins(model, tok, config, pairs) -> list[dict]:
    """Torch's margin and the engines' logit gap at each differing episode's first differing token."""
    import numpy as np
    import torch

    from agentlab.engines import llamacpp
    from agentlab.engines.weights import for_generation

    fast = for_generation(model, config.precision)
    engine = llamacpp.engine_for(model, config)
    out = []
    for task_id, t_ep, l_ep in pairs:
        k = first_divergence(t_ep, l_ep)
        if k is None:
            continue
        shared = t_ep.tokens["prompt_ids"] + t_ep.tokens["completion_ids"][:k]
        with torch.no_grad():
            ref = fast(input_ids=torch.tensor([shared])).logits[0, -1].float().numpy()
        ours = first_logits(engine, shared, tok.eos_token_id)
        pick = int(l_ep.tokens["completion_ids"][k]) if k < len(l_ep.tokens["completion_ids"]) else int(ours.argmax())
        out.append({"task": task_id, "position": k, "margin": float(ref.max() - ref[pick]),
                    "gap": float(np.abs(ours - ref).max()), "torch_pick": tok.decode([int(ref.argmax())]),
                    "llama_cpp_pick": tok.decode([pick])})
    return out


def quantiles(values: list[float]) -> dict:
    import numpy as np

    if not values:
        return {"n": 0}
    v = np.array(values)
    return {"n": len(v), "p50": float(np.median(v)), "p90": float(np.quantile(v, 0.9)), "max": float(v.max())}


def markdown_table(results: dict) -> str:
    """docs/performance.md's table: one row per machine class and precision, every figure read from the results file."""
    rows = [("| machine class / precision | identical greedy episodes | of those that part, at a near-tie (torch's "
            "margin ≤ the engines' logit gap there) | sampled log-prob gap p50 / p99 | seconds, torch / llama.cpp |"),
            "|---|---|---|---|---|"]
    for key, e in sorted(results["machines"].items()):
        parted, gap = e["first_divergence"]["episodes"], e["sampled_logprob_gap"]
        ties = (f"{sum(x['margin'] <= x['gap'] for x in parted)} of {len(parted)} (margin ≤ "
                f"{max(x['margin'] for x in parted):.2f}, gap ≤ {max(x['gap'] for x in parted):.2f})" if parted else "-")
        rows.append(f"| {key} | {e['identical_episodes']} of {e['n']} | {ties} | {gap['abs_gap_median']:.1e} / "
                    f"{gap['abs_gap_p99']:.3f} | {e['seconds']['torch']:.0f} / {e['seconds']['llama_cpp']:.0f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> dict:
    from common import RESULTS, adapter_or_quickstart, write_result

    from agentlab.engines import llamacpp
    from agentlab.envs import load
    from agentlab.experiment import Experiment
    from agentlab.machine import cpu_class, describe
    from agentlab.models import load_policy
    from agentlab.precision import resolve
    from agentlab.rollout import EVAL_BATCH, LoopConfig, run_episodes
    from agentlab.train import _threads

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="lookup")
    p.add_argument("--adapter", default=None, help="SFT adapter (default: the quickstart's)")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"))
    p.add_argument("--sampled-tasks", type=int, default=8, help="tasks whose first turns are sampled for the gap")
    p.add_argument("--table", action="store_true", help="print docs/performance.md's markdown table from the results file")
    a = p.parse_args(argv)
    if a.table:
        print(markdown_table(json.loads((RESULTS / "engine_agreement.json").read_text())))
        return {}
    if not llamacpp.available():
        raise SystemExit("llama-cpp-python is not installed: run `make setup-llamacpp`")
    _threads()
    adapter = adapter_or_quickstart(a.adapter)
    spec = load(a.env)
    model, tok = load_policy("smollm2-135m", adapter=adapter)
    model.eval()
    tasks = spec.make_tasks("test", a.n, seed=0)
    precision = resolve(a.precision)
    episodes, seconds = {}, {}
    for engine in ("torch", "llama_cpp"):
        config = LoopConfig.of(spec, temperature=0, batch_size=EVAL_BATCH, precision=precision, engine=engine)
        t0 = time.perf_counter()
        episodes[engine] = run_episodes(model, tok, spec, tasks, config=config, greedy=True, progress=True)
        seconds[engine] = round(time.perf_counter() - t0, 1)
        print(f"{engine:9s} {len(tasks)} greedy episodes in {seconds[engine]:.1f} s, success "
              f"{sum(ep.success for ep in episodes[engine]) / len(tasks):.3f}", flush=True)
    pairs = [(t.id, x, y) for t, x, y in zip(tasks, episodes["torch"], episodes["llama_cpp"], strict=True)]
    identical = sum(first_divergence(x, y) is None for _, x, y in pairs)
    config = LoopConfig.of(spec, temperature=0, batch_size=EVAL_BATCH, precision=precision, engine="llama_cpp")
    margins = divergence_margins(model, tok, config, pairs)
    from rollout_throughput import logprob_gap

    exp = Experiment(env=a.env, precision=precision, rollout_backend="llama_cpp")
    gap = logprob_gap(model, tok, spec, tasks[: a.sampled_tasks], exp)
    machine = describe()
    entry = {
        "machine": {**machine, "cpu_class": cpu_class(), "llama_cpp_build": llamacpp.system_info()},
        "env": a.env, "adapter": adapter and Path(adapter).name, "n": len(tasks), "precision": precision,
        "seconds": seconds,
        "success": {k: sum(ep.success for ep in v) / len(tasks) for k, v in episodes.items()},
        "identical_episodes": identical,
        "first_divergence": {"margin": quantiles([m["margin"] for m in margins]),
                             "gap": quantiles([m["gap"] for m in margins]), "episodes": margins},
        "sampled_logprob_gap": gap,
    }
    path = RESULTS / "engine_agreement.json"
    out = json.loads(path.read_text()) if path.exists() else {"machines": {}}
    out["machines"][f"{cpu_class()}/{precision}"] = entry
    write_result("engine_agreement.json", out)
    print(f"identical greedy episodes: {identical} of {len(tasks)}; first-divergence margin "
          f"{entry['first_divergence']['margin']}, logit gap {entry['first_divergence']['gap']}; sampled log-prob gap "
          f"p50 {gap['abs_gap_median']:.2g} p99 {gap['abs_gap_p99']:.2g}", flush=True)
    return entry


if __name__ == "__main__":
    main()
