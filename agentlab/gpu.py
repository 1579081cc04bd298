"""The GPU path: the Qwen3-4B-Instruct-2507 recipe (a published product-finder run's), vLLM generation (colocate or server), Unsloth
LoRA, multi-GPU launch configs (accelerate / DeepSpeed); TRL's asynchronous GRPO is :mod:`agentlab.gpu_async`.

Single GPU, vLLM colocated with training::

    agentlab train --env product_finder --recipe qwen3-4b-instruct-2507 --vllm-mode colocate

Several GPUs (DeepSpeed ZeRO-2), vLLM served on its own GPU by TRL::

    CUDA_VISIBLE_DEVICES=0 trl vllm-serve --model Qwen/Qwen3-4B-Instruct-2507 &
    CUDA_VISIBLE_DEVICES=1,2,3 accelerate launch --num_processes 3 \\
        --config_file agentlab/configs/accelerate/zero2.yaml -m agentlab.cli train \\
        --env product_finder --recipe qwen3-4b-instruct-2507 --vllm-mode server

Everything here is configuration and is tested on CPU for its values; execution needs CUDA and the weights.
"""

from __future__ import annotations

from pathlib import Path

from agentlab.experiment import world_size
from agentlab.models import RECIPES_DIR, load_recipe, vllm_settings

ACCELERATE_CONFIGS = {p.stem: p for p in (RECIPES_DIR / "accelerate").glob("*.yaml")}


def recipe_experiment_fields(recipe: str) -> dict:
    """Experiment fields a recipe sets (model, LoRA rank, group size, lr, turns, temperature, KL, cadence).

    The recipe's batch arithmetic maps onto ours: one optimiser step sees ``per_device_train_batch_size ×
    gradient_accumulation_steps`` rollouts (32 = 4 groups of G = 8), generated once per step, and trained in
    ``per_device_train_batch_size``-row passes (``micro_batch``). ``grpo_kwargs`` derives TRL's
    ``gradient_accumulation_steps`` and ``steps_per_generation`` from that, so the two always agree — one rollout
    call per optimiser step, unique ``(step, group)`` keys, ``prompts_seen`` right. ``save_steps`` is the
    checkpoint (and checkpoint-eval) cadence, ``eval_every``. The recipe's batch is one device's: launched on
    several processes, a step has that many groups on each (``groups_per_step`` counts them over all processes).
    """
    r = load_recipe(recipe)
    g = r["grpo"]
    rollouts = g["per_device_train_batch_size"] * g["gradient_accumulation_steps"]
    if rollouts % g["num_generations"]:
        raise ValueError(f"recipe {recipe}: {rollouts} rollouts per step is not a whole number of groups of "
                         f"{g['num_generations']}")
    return {"model": r["model"], "lora_r": r["unsloth"]["lora"]["r"], "group_size": g["num_generations"],
            "groups_per_step": rollouts // g["num_generations"] * world_size(), "micro_batch": g["per_device_train_batch_size"],
            "lr": g["learning_rate"], "max_turns": g["max_tool_calling_iterations"], "beta": g["beta"],
            "temperature": g["temperature"], "max_context": g["max_completion_length"],
            "eval_every": g["save_steps"]}


def grpo_overrides(recipe: str, vllm_mode: str | None = "colocate") -> dict:
    """GRPOConfig keyword overrides for the GPU: bf16, gradient checkpointing, vLLM. (Accumulation is not
    overridden: it follows from the experiment's ``groups_per_step`` and ``micro_batch``.)"""
    g = load_recipe(recipe)["grpo"]
    out = {"bf16": g["bf16"], "gradient_checkpointing": g["gradient_checkpointing"], "use_cpu": False}
    if vllm_mode:
        out.update(vllm_settings(recipe, vllm_mode))
    return out


def accelerate_config(name: str = "zero2") -> Path:
    """Path of a launch config: ``multi_gpu`` (DDP), ``zero2`` or ``zero3`` (DeepSpeed)."""
    if name not in ACCELERATE_CONFIGS:
        raise ValueError(f"unknown accelerate config {name!r}; available: {sorted(ACCELERATE_CONFIGS)}")
    return ACCELERATE_CONFIGS[name]
