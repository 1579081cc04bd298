"""Training forward + backward on uneven agent episodes: TRL's own code paths against agentlab's, side by side.

Two measurements, each alternating its configurations in one process (these machines are noisy):

* **GRPO**: the policy forward + backward of one step's rollouts — TRL's ``_get_per_token_logps_and_entropies``
  (every row encoded whole, completions right-padded to the longest; TRL's default gradient checkpointing on)
  against ``shared_prefix_logps`` (the shared system prompt encoded once; each row's real tokens only, in buckets
  of similar length; labelled positions only through the LM head).
* **SFT**: ``run_sft`` steps with TRL's fused LM head over every position (its CPU behaviour) against labelled
  positions only (``trl_compat.scored_positions_only``).

The batch: ``--rollouts FILE`` (a run's ``rollouts.jsonl``; the first ``--rows`` episodes of ``--step``), or by
default scripted ``product_finder`` episodes — expert, cheap and random policies mixed, so lengths are uneven as
a policy's are. Writes ``benchmarks/results/train_forward.json``. Run nothing else meanwhile.

    python benchmarks/train_forward.py                       # 16 scripted rows, 2 rounds, SFT 4 steps
    python benchmarks/train_forward.py --rollouts runs/.../grpo/rollouts.jsonl --step 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def scripted_batch(rows: int, env: str = "product_finder") -> list[dict]:
    """``rows`` episodes' token layouts (``prompt_ids``, ``completion_ids``, ``mask``) from scripted policies."""
    from agentlab.engines.scripted import scripted_generate_fn
    from agentlab.envs import load
    from agentlab.models import DEFAULT_MODEL, load_policy
    from agentlab.rollout import Renderer, run_episodes

    spec = load(env)
    _, tok = load_policy(DEFAULT_MODEL)
    policies = [p for p in (spec.expert, spec.cheap_policy, spec.random_policy) if p is not None]
    tasks = spec.make_tasks("train", rows, seed=0)
    renderer = Renderer(tok, spec.env_class)
    out = []
    for i, task in enumerate(tasks):
        policy = policies[i % len(policies)]
        ep = run_episodes(None, tok, spec, [task], progress=False,
                          generate_fn=scripted_generate_fn(renderer, [task], policy))[0]
        out.append(ep.tokens)
    return out


def recorded_batch(path: Path, step: int, rows: int) -> list[dict]:
    episodes = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e["tokens"] for e in episodes if e.get("step") == step][:rows]


def trl_layout(batch: list[dict]):
    """Prompts left-padded, completions right-padded, as GRPOTrainer lays out a step."""
    import torch

    P = max(len(t["prompt_ids"]) for t in batch)
    K = max(len(t["completion_ids"]) for t in batch)
    ids = torch.zeros(len(batch), P + K, dtype=torch.long)
    att = torch.zeros_like(ids)
    mask = torch.zeros(len(batch), K)
    for i, t in enumerate(batch):
        p, c = t["prompt_ids"], t["completion_ids"]
        ids[i, P - len(p):P], att[i, P - len(p):P] = torch.tensor(p), 1
        ids[i, P:P + len(c)], att[i, P:P + len(c)] = torch.tensor(c), 1
        mask[i, :len(c)] = torch.tensor(t["mask"], dtype=torch.float)
    return ids, att, mask, K


def grpo_rounds(batch: list[dict], rounds: int) -> dict:
    from datasets import Dataset

    from agentlab.experiment import Experiment, _threads, grpo_config, lora_config
    from agentlab.models import DEFAULT_MODEL, load_policy
    from agentlab.train import agent_trainer_class, agentlab_reward
    from agentlab.trl_compat import per_token_logps_and_entropies

    _threads()
    ids, att, mask, K = trl_layout(batch)
    model, tok = load_policy(DEFAULT_MODEL)
    tmp = Path(tempfile.mkdtemp(prefix="train_forward_"))
    exp = Experiment(name="bench", groups_per_step=len(batch) // 4, group_size=4)
    trainer = agent_trainer_class()(model=model, reward_funcs=[agentlab_reward], processing_class=tok,
                                    train_dataset=Dataset.from_list([{"prompt": [{"role": "user", "content": "x"}]}]),
                                    args=grpo_config(exp, tmp), peft_config=lora_config(exp.lora_r))
    model = trainer.model
    model.train()
    times: dict[str, list[dict]] = {"trl": [], "agentlab": []}
    logps = {}
    for _ in range(rounds):
        for kind, kept in times.items():
            trainer.shared_prefix = kind == "agentlab"
            # TRL's own forward gets TRL's default, activation checkpointing (without it 16 long rows exceed 24 GB)
            checkpointing = kind == "trl"
            if checkpointing:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_disable()
            model.zero_grad()
            t0 = time.perf_counter()
            with trainer.accelerator.autocast():  # both in the trainer's precision (bf16 where the CPU has it)
                out, _, _ = per_token_logps_and_entropies(trainer, model, ids, att, K, compute_entropy=True)
            t1 = time.perf_counter()
            ((out * mask).sum() / mask.sum()).backward()
            t2 = time.perf_counter()
            kept.append({"forward_s": round(t1 - t0, 2), "backward_s": round(t2 - t1, 2)})
            logps[kind] = out.detach()
            print(f"[grpo] {kind}: forward {t1 - t0:.1f} s, backward {t2 - t1:.1f} s", flush=True)
    gap = float(((logps["trl"] - logps["agentlab"]).abs() * mask).max())
    total = {k: statistics.median(r["forward_s"] + r["backward_s"] for r in v) for k, v in times.items()}
    return {"rounds": times, "median_total_s": total, "agentlab_over_trl": round(total["agentlab"] / total["trl"], 3),
            "max_abs_logp_gap_on_completion_tokens": gap,
            "rows": len(batch), "completion_lengths": sorted(len(t["completion_ids"]) for t in batch),
            "prompt_lengths": sorted(len(t["prompt_ids"]) for t in batch),
            "padded_positions_trl": int(ids.numel()), "real_positions": int(att.sum())}


def sft_rounds(batch: list[dict], rounds: int, steps: int) -> dict:
    from agentlab import sft
    from agentlab.models import DEFAULT_MODEL
    from agentlab.trl_compat import scored_positions_only

    rows = [{"input_ids": t["prompt_ids"] + t["completion_ids"],
             "assistant_masks": [0] * len(t["prompt_ids"]) + t["mask"]} for t in batch]
    times: dict[str, list[float]] = {"trl": [], "agentlab": []}
    losses = {}
    for _ in range(rounds):
        for kind, kept in times.items():
            sft.scored_positions_only = scored_positions_only if kind == "agentlab" else nullcontext
            out = Path(tempfile.mkdtemp(prefix=f"train_forward_sft_{kind}_"))
            sft.run_sft(DEFAULT_MODEL, rows, out, sft.SFTSettings(steps=steps, batch_size=2, lr=3e-4))
            summary = json.loads((out / "sft_summary.json").read_text())
            kept.append(round(summary["seconds"], 2))
            losses[kind] = summary["losses"]
            print(f"[sft] {kind}: {steps} steps in {summary['seconds']:.1f} s", flush=True)
    sft.scored_positions_only = scored_positions_only
    median = {k: statistics.median(v) for k, v in times.items()}
    return {"steps": steps, "batch_size": 2, "seconds": times, "median_s": median,
            "agentlab_over_trl": round(median["agentlab"] / median["trl"], 3), "losses": losses,
            "assistant_tokens": sum(sum(t["mask"]) for t in batch),
            "tokens": sum(len(t["prompt_ids"]) + len(t["completion_ids"]) for t in batch)}


def main() -> None:
    from common import write_result

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--rollouts", type=Path, default=None, help="a run's rollouts.jsonl (default: scripted episodes)")
    p.add_argument("--step", type=int, default=1, help="with --rollouts: the training step whose rollouts to use")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--sft-steps", type=int, default=4)
    p.add_argument("--out-name", default="train_forward.json")
    args = p.parse_args()
    batch = (recorded_batch(args.rollouts, args.step, args.rows) if args.rollouts
             else scripted_batch(args.rows))
    if not batch:
        raise SystemExit(f"no episodes of step {args.step} in {args.rollouts}")
    source = str(args.rollouts) + f" step {args.step}" if args.rollouts else "scripted product_finder episodes"
    result = {"batch": source, "grpo": grpo_rounds(batch, args.rounds),
              "sft": sft_rounds(batch, args.rounds, args.sft_steps)}
    import torch

    from agentlab.machine import describe

    result["machine"] = {**describe(), "threads": torch.get_num_threads()}
    print(json.dumps({k: result[k]["agentlab_over_trl"] for k in ("grpo", "sft")}))
    print("wrote", write_result(args.out_name, result))


if __name__ == "__main__":
    main()
