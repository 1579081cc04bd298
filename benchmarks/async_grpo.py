"""Synchronous vs asynchronous GRPO on this CPU: seconds per step, validation success per checkpoint, staleness and
the behaviour-vs-trained log-prob gap, per ``max_staleness`` K, from the same SFT start and the same steps.

    python benchmarks/async_grpo.py                        # K = 0, 1, 2 x seeds 0, 1, 2 (resumable run folders)
    python benchmarks/async_grpo.py --ks 0,1 --seeds 0     # a first look
    python benchmarks/async_grpo.py --gather-only          # rebuild the JSON from finished runs

Writes ``benchmarks/results/async_grpo.json``: ``seeds``, per K the median seconds per step (the trainer's whole
step: generation, or the wait for the worker's batch, plus forward, backward and optimiser), per-phase medians,
validation curves per seed, the staleness histogram and the mean log-prob gap; ``seconds_per_step_ratio_k1_over_sync``;
and, from the synchronous run's measured phases, what a machine with cores (or a GPU) for each process would give.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import adapter_or_quickstart, write_result


def run_name(k: int, seed: int) -> str:
    return f"async-grpo/k{k}/seed-{seed}"


def experiment(args, k: int, seed: int):
    from agentlab.experiment import Experiment

    return Experiment(name=run_name(k, seed), env=args.env, steps=args.steps, eval_every=args.eval_every,
                      eval_tasks=args.eval_tasks, groups_per_step=args.groups_per_step, group_size=args.group_size,
                      temperature=1.0, max_staleness=k, seed=seed)


def summarise(run) -> dict:
    """One finished run: its steps' seconds and phases, staleness, gap, and validation curve."""
    metrics, evals = run.metrics(), run.evals()
    per_step = [m["time_step_s"] for m in metrics if m.get("time_step_s")]
    return {
        "seconds_per_step": statistics.median(per_step) if per_step else None,
        "steps": len(metrics),
        "generate_s": statistics.median(m["time_generate_s"] for m in metrics),  # async: the wait for the worker
        "worker_generate_s": (statistics.median(m["time_worker_generate_s"] for m in metrics)
                              if metrics and "time_worker_generate_s" in metrics[0] else None),
        "train_s": statistics.median(m["time_step_s"] - m["time_generate_s"] for m in metrics if m.get("time_step_s")),
        "staleness": dict(Counter(str(m["staleness"]) for m in metrics if "staleness" in m)),
        "behaviour_logprob_gap": (statistics.fmean(m["behaviour_logprob_gap"] for m in metrics
                                                   if m.get("behaviour_logprob_gap") is not None)
                                  if any(m.get("behaviour_logprob_gap") is not None for m in metrics) else None),
        "validation": [{"step": e["step"], "success": e["success"]["mean"], "ci_low": e["success"]["ci_low"],
                        "ci_high": e["success"]["ci_high"]} for e in evals],
    }


def gather(args) -> dict:
    from agentlab.machine import describe
    from agentlab.paths import runs_dir
    from agentlab.runs import RunDir

    per_k: dict = {}
    for k in args.ks:
        runs = {seed: RunDir(runs_dir() / run_name(k, seed)) for seed in args.seeds}
        done = {seed: summarise(run) for seed, run in runs.items() if run.finished}
        if not done:
            continue
        per_k[str(k)] = {"seeds": sorted(done), "per_seed": {str(s): v for s, v in done.items()},
                         "seconds_per_step": statistics.median(v["seconds_per_step"] for v in done.values())}
    out = {"env": args.env, "seeds": args.seeds, "config": {k: v for k, v in vars(args).items() if k != "gather_only"},
           "machine": describe(), "per_k": per_k}
    if "0" in per_k and "1" in per_k:
        out["seconds_per_step_ratio_k1_over_sync"] = per_k["1"]["seconds_per_step"] / per_k["0"]["seconds_per_step"]
    if "0" in per_k:  # on paper: generation and training each on its own cores, the step is the longer of the two
        sync = list(per_k["0"]["per_seed"].values())
        gen, train = (statistics.median(v[key] for v in sync) for key in ("generate_s", "train_s"))
        out["on_paper"] = {"sync_generate_s": gen, "sync_train_s": train, "async_step_s": max(gen, train),
                           "ratio_async_over_sync": max(gen, train) / (gen + train),
                           "assumes": "each process keeps the cores the synchronous run gave both phases"}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="lookup")
    p.add_argument("--adapter", default=None, help="SFT start (default: the quickstart's)")
    p.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--eval-every", type=int, default=4)
    p.add_argument("--eval-tasks", type=int, default=48)
    p.add_argument("--groups-per-step", type=int, default=2)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--gather-only", action="store_true")
    args = p.parse_args(argv)
    if not args.gather_only:
        from agentlab.envs import load
        from agentlab.paths import runs_dir
        from agentlab.runs import RunDir
        from agentlab.train import run_grpo

        adapter = adapter_or_quickstart(args.adapter)
        spec = load(args.env)
        train, val = spec.make_tasks("train", 400, seed=0), spec.make_tasks("validation", args.eval_tasks, seed=0)
        for seed in args.seeds:
            for k in args.ks:
                run = RunDir(runs_dir() / run_name(k, seed))
                if not run.finished:
                    print(f"[async-grpo] K={k} seed {seed}", flush=True)
                    run_grpo(experiment(args, k, seed), train, val, init_adapter=adapter, run=run)
    out = gather(args)
    print(json.dumps({k: v["seconds_per_step"] for k, v in out["per_k"].items()}))
    print(f"-> {write_result('async_grpo.json', out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
