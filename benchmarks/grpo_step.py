"""GRPO step time and memory: stock TRL GRPOTrainer (environment_factory, the plain way a user configures it)
versus agentlab's training path (our loop as rollout_func, prefix-cached generation from a bf16 copy where the CPU
has bf16 hardware, shared-prefix forward with the remainder's layers checkpointed; TRL's own gradient checkpointing
off — stock TRL has it on; stock runs TRL's default ``bf16=True`` autocast, agentlab does where its ``precision``
resolves to bf16),
on the same model, LoRA, environment, prompts per step, group size, turn and token limits.

    python benchmarks/grpo_step.py                 # 2 rounds x (stock, agentlab), 3 steps each (1 warm-up)
    python benchmarks/grpo_step.py --rounds 1 --steps 2
    python benchmarks/grpo_step.py --kinds agentlab,agentlab:precision=fp32   # ablations of our own path

Without ``--adapter`` both start from the quickstart's SFT adapter when it exists (so episodes call tools).

Each configuration runs in its own subprocess (so peak RSS is its own), alternating stock / agentlab / stock /
agentlab in one run, because these machines are noisy. Writes ``benchmarks/results/grpo_step.json``.
Run nothing else meanwhile: a second heavy process on 2 cores makes every number meaningless.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
sys.path.insert(0, str(Path(__file__).parent))


def make_trainer(kind: str, steps: int, adapter: str | None, tmp: Path, callbacks=(), **overrides):
    """The two trainers compared: ``stock`` (TRL's GRPOTrainer with environment_factory, as TRL's docs configure
    it) or ``agentlab`` (our rollout_func path). Returns ``(trainer, spec, tasks, exp)``; also used by
    ``rollout_throughput.py``."""
    import torch
    from datasets import Dataset
    from peft import PeftModel
    from trl import GRPOConfig, GRPOTrainer

    from agentlab.envs import load
    from agentlab.models import load_policy
    from agentlab.rollout import Renderer
    from agentlab.runs import RunDir
    from agentlab.train import Experiment, build_trainer, lora_config

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    spec = load("lookup")
    tasks = spec.make_tasks("train", 64, seed=0)
    exp = Experiment(**{"name": "bench", "steps": steps, "groups_per_step": 2, "group_size": 4, "max_turns": 2,
                        "max_new_tokens": 48, "max_context": 1024, "eval_every": 10_000, **overrides})
    model, tok = load_policy("smollm2-135m")
    if adapter:
        model = PeftModel.from_pretrained(model, adapter, is_trainable=True)
    renderer = Renderer(tok, spec.env_class)
    rows = [{"prompt": renderer.messages(t), "task": t.to_json()} for t in tasks]
    peft = None if adapter else lora_config(exp.lora_r)
    if kind == "stock":
        # What a user writes from TRL's docs: environment_factory, defaults for everything we do not set.
        args = GRPOConfig(output_dir=str(tmp), max_steps=steps, per_device_train_batch_size=8, num_generations=4,
                          learning_rate=exp.lr, temperature=exp.temperature, max_completion_length=exp.max_context,
                          max_tool_calling_iterations=exp.max_turns - 1, use_cpu=not torch.cuda.is_available(),
                          report_to=[], save_strategy="no", logging_steps=1, seed=0)
        trainer = GRPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok,
                              environment_factory=spec.env_class, peft_config=peft, callbacks=list(callbacks))
    else:  # the trainer users train with (recorder, non-finite guard), without checkpoints
        run = RunDir(tmp)
        run.prepare(exp, overwrite=True)
        trainer, _, _ = build_trainer(exp, spec, model, tok, tasks, [], run, peft_config=peft,
                                      trainer_overrides={"save_strategy": "no"},
                                      callbacks=callbacks)
    return trainer, spec, tasks, exp


def parse_kind(kind: str) -> tuple[str, dict]:
    """``"agentlab:precision=fp32;micro_batch=4"`` -> ``("agentlab", {"precision": "fp32", "micro_batch": 4})``."""
    name, _, rest = kind.partition(":")
    if name not in ("stock", "agentlab") or (rest and name == "stock"):
        raise SystemExit(f"bad kind {kind!r}: expected stock, agentlab or agentlab:field=value;field=value")
    overrides = {}
    for item in filter(None, rest.split(";")):
        key, _, value = item.partition("=")
        overrides[key] = int(value) if value.isdigit() else value
    return name, overrides


def worker(kind: str, steps: int, adapter: str | None, out: str) -> None:
    import torch
    from transformers import TrainerCallback

    from agentlab.trl_compat import trainer_metrics

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t0)

    name, overrides = parse_kind(kind)
    tmp = Path(tempfile.mkdtemp(prefix=f"grpo_step_{name}_"))
    trainer, _, _, _ = make_trainer(name, steps, adapter, tmp, [Clock()], **overrides)
    args = trainer.args
    trainer.train()
    split = {k: v for k, v in trainer_metrics(trainer).items() if k.startswith("profiling")}
    if name == "agentlab":
        split = {"timing_last_step": dict(trainer.timing)}
    Path(out).write_text(json.dumps({
        "kind": kind, "step_s": times, "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2,
        "peak_cuda_gb": torch.cuda.max_memory_allocated() / 1024**3 if torch.cuda.is_available() else None,
        "gradient_checkpointing": bool(args.gradient_checkpointing), "beta": args.beta, "bf16": bool(args.bf16),
        "micro_batch": args.per_device_train_batch_size,
        "profiling": {k: (statistics.fmean(v) if isinstance(v, list) else v) for k, v in split.items() if v},
        "reward": trainer_metrics(trainer).get("reward", [])}))
    shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    from common import adapter_or_quickstart, write_result

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=3, help="steps per configuration per round; the first is warm-up")
    p.add_argument("--adapter", default=None, help="start from this SFT adapter (default: the quickstart's)")
    p.add_argument("--kinds", default="stock,agentlab",
                   help="configurations, alternated in each round: stock, agentlab, agentlab:field=value;...")
    p.add_argument("--out-name", default=None, help="result file name (default grpo_step.json, or "
                   "grpo_step_ablation.json when --kinds is not the default)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a.worker, a.steps, a.adapter, a.out)
    kinds = a.kinds.split(",")
    for kind in kinds:
        parse_kind(kind)  # refuse a bad kind before any run starts
    a.adapter = adapter_or_quickstart(a.adapter)
    RESULTS.mkdir(exist_ok=True)
    runs = []
    for r in range(a.rounds):
        for i, kind in enumerate(kinds):
            out = RESULTS / f".grpo_step_{i}_{r}.json"
            cmd = [sys.executable, __file__, "--worker", kind, "--steps", str(a.steps), "--out", str(out)]
            if a.adapter:
                cmd += ["--adapter", a.adapter]
            print(f"round {r + 1}/{a.rounds}: {kind} ...", flush=True)
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            runs.append(json.loads(out.read_text()))
            out.unlink()
    summary = {}
    for kind in kinds:
        mine = [x for x in runs if x["kind"] == kind]
        steps = [s for x in mine for s in x["step_s"][1:]]  # drop each round's warm-up step
        summary[kind] = {"median_step_s": statistics.median(steps), "steps_measured": len(steps),
                         "peak_rss_gb": max(x["peak_rss_gb"] for x in mine),
                         "gradient_checkpointing": mine[0]["gradient_checkpointing"], "beta": mine[0]["beta"],
                         "bf16": mine[0].get("bf16"), "micro_batch": mine[0].get("micro_batch"),
                         "profiling_s": mine[-1]["profiling"]}
    first = kinds[0]
    for kind in kinds[1:]:
        summary[f"ratio_step_time_{kind}_over_{first}"] = summary[kind]["median_step_s"] / summary[first]["median_step_s"]
        summary[f"ratio_peak_rss_{kind}_over_{first}"] = summary[kind]["peak_rss_gb"] / summary[first]["peak_rss_gb"]
    from agentlab.machine import describe

    summary["machine"] = describe()  # which CPU class and precision made these seconds
    summary["config"] = vars(a) | {"prompts_per_step": 2, "group_size": 4, "max_turns": 2, "max_new_tokens": 48}
    default = a.kinds == p.get_default("kinds")
    name = a.out_name or ("grpo_step.json" if default else "grpo_step_ablation.json")
    path = write_result(name, summary)
    width = max(map(len, kinds)) + 2
    print(f"{'':{width}s} {'median s/step':>14s} {'peak RSS GB':>12s}  (ratios to {first})")
    for kind in kinds:
        ratio = "" if kind == first else (f"  time {summary[f'ratio_step_time_{kind}_over_{first}']:.2f}, "
                                          f"RSS {summary[f'ratio_peak_rss_{kind}_over_{first}']:.2f}")
        print(f"{kind:{width}s} {summary[kind]['median_step_s']:14.1f} {summary[kind]['peak_rss_gb']:12.2f}{ratio}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
