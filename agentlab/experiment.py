"""What a GRPO run is: :class:`Experiment` (saved as the run's ``config.json``) and its mapping onto TRL's
``GRPOConfig``, plus the LoRA, device and thread settings SFT and GRPO share.

    >>> Experiment(env="lookup", steps=4).loop().batch_size
    8
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from agentlab.rollout import BACKENDS, LoopConfig
from agentlab.trl_compat import ROW_SEPARABLE_LOSSES
from agentlab.types import BUDGET_FIELDS, Budget


def with_budget(config, spec) -> None:
    """Fill a frozen config's ``None`` budget fields (those of ``types.BUDGET_FIELDS`` it has) from ``spec.budget``."""
    for name in BUDGET_FIELDS:
        if getattr(config, name, 0) is None:
            object.__setattr__(config, name, getattr(spec.budget, name))


_NO_ENV = SimpleNamespace(budget=Budget())  # an unknown env is reported as such; its budget fields still get values
# TRL 1.16's GRPOConfig.loss_type and scale_rewards values (TRL implements every variant; we pass the name through).
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")
SCALE_REWARDS = ("group", "batch", "none")
# What a loss type needs besides its name (TRL's own rule, stated in GRPOConfig's docs): luspo is defined on
# sequence-level importance ratios. Set here so that `--loss-type luspo` trains as the method is defined.
LOSS_RULES = {"luspo": {"importance_sampling_level": "sequence"}}
ASYNC_DELTA = 4.0  # the importance-ratio cap of an asynchronous run (grpo_kwargs)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class Experiment:
    """One GRPO experiment; CPU defaults. Saved as ``config.json`` in the run folder."""

    name: str = "grpo"
    model: str = "smollm2-135m"
    env: str = "lookup"
    lr: float = 2e-4
    groups_per_step: int = 2      # prompts per optimiser step
    group_size: int = 4           # rollouts per prompt (GRPO's G)
    max_turns: int | None = None  # None: the environment's budget (EnvSpec.budget), resolved at construction
    max_new_tokens: int | None = None  # per turn
    max_context: int | None = None
    beta: float = 0.0             # KL to the reference; 0 skips the reference forward entirely
    temperature: float = 0.7
    steps: int = 10
    eval_every: int = 5           # held-out eval (of a checkpoint kept) every K steps, and at the last
    eval_tasks: int = 48
    lora_r: int = 16
    seed: int = 0
    report_to: tuple[str, ...] = ()
    hint_p: float = 0.0           # share of groups trained with enriched feedback (agentlab.hints); 0: none
    hint_switch: float = 0.5      # fraction of training with procedural guidance before enriched observations
    precision: str = "auto"       # "auto": bf16 on GPUs and CPUs with bf16 hardware, else fp32 (agentlab.precision)
    micro_batch: int = 0          # rollouts per forward/backward pass (gradients accumulate over a step); 0: all
    reward: object = None         # None: the environment's default; a Reward, a callable of the episode, or a spec
    loss_type: str = "dapo"       # TRL's GRPO loss variants (LOSS_TYPES); "dapo" is TRL's default
    scale_rewards: str = "group"  # divide advantages by the group's std ("group"), the batch's, or not ("none")
    max_nonfinite: int = 3        # updates with non-finite gradients are skipped; this many in a row stop the run
    skip_zero_signal: bool = False  # a step whose gradient is exactly 0 (every group zero-variance) leaves AdamW alone
                                  # instead of moving the adapter on momentum (agentlab.update_guard); off: TRL's way
    drop_flat_rows: bool = False  # rollouts whose advantage is exactly 0 skip the forward and backward: the same
                                  # gradient, a shorter step (dapo/cispo/vespo, beta 0: trl_compat.rows_separable);
                                  # entropy and clip metrics then cover the trained rollouts only
    rollout_backend: str = "torch"  # CPU decoding of rollouts and checkpoint evals: "torch", "llama_cpp", "auto"
    max_staleness: int = 0        # 0: generate, then train (synchronous); K: a worker generates ahead, groups at
                                  # most K policy versions old (agentlab.async_rollouts); GPUs: TRL's async trainer

    def __post_init__(self):
        from agentlab.envs import load
        errors = []
        try:
            with_budget(self, load(self.env))
        except ValueError as exc:
            errors.append(f"env={self.env!r}: {exc}")
            with_budget(self, _NO_ENV)
        if not self.lr > 0:
            errors.append(f"lr={self.lr} must be > 0")
        if self.group_size < 2:
            errors.append(f"group_size={self.group_size} must be >= 2 (GRPO compares rollouts within a group)")
        for name in ("groups_per_step", "max_turns", "max_new_tokens", "max_context", "steps", "eval_every", "lora_r", "max_nonfinite"):
            if getattr(self, name) < 1:
                errors.append(f"{name}={getattr(self, name)} must be >= 1")
        if self.max_staleness < 0:
            errors.append(f"max_staleness={self.max_staleness} must be >= 0 (0: synchronous)")
        elif self.max_staleness and self.hint_p:
            errors.append(f"max_staleness={self.max_staleness} with hint_p={self.hint_p}: the generation worker does "
                          f"not apply training-time hints; use one or the other")
        if self.micro_batch < 0:
            errors.append(f"micro_batch={self.micro_batch} must be >= 0 (0: the whole step in one pass)")
        if not (0 <= self.hint_p <= 1 and 0 <= self.hint_switch <= 1):
            errors.append(f"hint_p={self.hint_p} and hint_switch={self.hint_switch} must lie in [0, 1]")
        from agentlab.precision import PRECISIONS

        if self.precision not in PRECISIONS:
            errors.append(f"precision={self.precision!r} unknown; expected one of {PRECISIONS}")
        if self.rollout_backend not in BACKENDS:
            errors.append(f"rollout_backend={self.rollout_backend!r} unknown; expected one of {BACKENDS}")
        if self.beta < 0 or self.temperature <= 0:
            errors.append(f"beta={self.beta} must be >= 0 and temperature={self.temperature} > 0")
        bad = set(self.report_to) - {"wandb", "trackio"}
        if bad:
            errors.append(f"report_to={sorted(bad)} unknown; expected wandb and/or trackio")
        if self.loss_type not in LOSS_TYPES:
            errors.append(f"loss_type={self.loss_type!r} unknown; expected one of {LOSS_TYPES}")
        if self.drop_flat_rows and (self.loss_type not in ROW_SEPARABLE_LOSSES or self.beta):
            errors.append(f"drop_flat_rows with loss_type={self.loss_type!r}, beta={self.beta}: a rollout without "
                          f"advantage adds nothing to the loss only for {ROW_SEPARABLE_LOSSES} with beta 0")
        if self.scale_rewards not in SCALE_REWARDS:
            errors.append(f"scale_rewards={self.scale_rewards!r} unknown; expected one of {SCALE_REWARDS}")
        try:
            self.reward_object()
        except ValueError as exc:
            errors.append(str(exc))
        if errors:
            raise ValueError("bad experiment config: " + "; ".join(errors))

    def evaluates_at(self, step: int) -> bool:
        """Whether GRPO's checkpoint at ``step`` is evaluated on held-out tasks (and kept): every ``eval_every``
        steps, and the last."""
        return step % self.eval_every == 0 or step >= self.steps

    def reward_object(self):
        """The configured reward (a spec string parsed), or None for the environment's default."""
        from agentlab.rewards import parse_reward

        return parse_reward(self.reward) if isinstance(self.reward, str) else self.reward

    def reward_fn(self):
        """``reward_fn(ep) -> (total, terms)`` that training and checkpoint evals score with."""
        from agentlab.envs import load
        from agentlab.rewards import as_reward_fn

        reward = self.reward_object()
        return as_reward_fn(reward) if reward is not None else load(self.env).default_reward

    def to_config(self) -> dict:
        """JSON-safe ``config.json`` content; the reward as ``agentlab.rewards.reward_config`` records it."""
        from dataclasses import fields

        from agentlab.rewards import reward_config

        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["report_to"] = list(self.report_to)
        out["reward"] = reward_config(self.reward_object())
        if isinstance(self.reward, str):
            out["reward"] = {"spec": self.reward, **out["reward"]}
        return out

    def loop(self) -> LoopConfig:
        return LoopConfig(max_turns=self.max_turns, max_new_tokens=self.max_new_tokens,
                          max_context=self.max_context, temperature=self.temperature,
                          batch_size=self.groups_per_step * self.group_size, precision=self.precision,
                          engine=self.rollout_backend)


def lora_config(r: int):
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, target_modules=LORA_TARGETS, task_type="CAUSAL_LM")


def _threads() -> None:
    """All of this machine's cores, shared among the processes training on it. In a plain process an
    ``OMP_NUM_THREADS`` set by the user (or a test runner) wins; under torchrun it is not read, because torchrun sets
    it to 1 itself whenever it starts several processes."""
    import os

    import torch

    if "LOCAL_WORLD_SIZE" not in os.environ and os.environ.get("OMP_NUM_THREADS"):
        return
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // local))


def tracking_env(report_to: tuple[str, ...]) -> None:
    """Local files are always written; W&B and Trackio are opt-in. Without a W&B key, W&B runs offline (its
    files land in ./wandb and can be synced later), so an opt-in never needs the network."""
    import os

    if "wandb" in report_to and not os.environ.get("WANDB_API_KEY"):
        os.environ.setdefault("WANDB_MODE", "offline")


def world_size() -> int:
    """Processes training together (``torchrun`` and ``accelerate launch`` set ``WORLD_SIZE``); 1 when run plainly.
    Read from the environment so that nothing initialises accelerate's process state before TRL does."""
    import os

    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    """The one process that writes the run folder (config, rollouts, metrics, evals, the final adapter)."""
    import os

    return int(os.environ.get("RANK", "0")) == 0


def groups_per_process(exp: Experiment) -> int:
    """``groups_per_step`` counts the groups of one optimiser step over all processes; each process generates
    whole groups of them (a group split over processes would be scored in two halves by our loop)."""
    processes = world_size()
    if exp.groups_per_step % processes:
        raise ValueError(f"groups_per_step={exp.groups_per_step} does not split over {processes} processes: each "
                         f"process generates whole groups; use a multiple of {processes}")
    return exp.groups_per_step // processes


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _bf16(precision: str) -> bool:
    """bf16 mixed precision (autocast, fp32 master weights) for the Trainer: GPUs, and CPUs with bf16 hardware."""
    from agentlab.precision import resolve

    return resolve(precision) == "bf16"


def grpo_config(exp: Experiment, output_dir: Path, **overrides):
    """The GRPOConfig our experiment maps to (also used by the GPU recipe with vLLM/bf16 overrides)."""
    from trl import GRPOConfig

    return GRPOConfig(**grpo_kwargs(exp, output_dir, **overrides))


def grpo_kwargs(exp: Experiment, output_dir: Path, **overrides) -> dict:
    """GRPOConfig keyword arguments (a dict, so CPU tests can check the GPU values without CUDA)."""
    batch = groups_per_process(exp) * exp.group_size  # this process's rollouts of a step
    micro = micro_batch_size(batch, exp.micro_batch)
    kwargs = dict(
        output_dir=str(output_dir), max_steps=exp.steps, learning_rate=exp.lr, lr_scheduler_type="constant",
        # One generation of the whole step's rollouts (each process its share of the groups), then forward/backward
        # in `micro`-row passes whose gradients accumulate into one optimiser step (TRL splits the generation batch;
        # the loss is normalised over it, across processes).
        warmup_steps=0, per_device_train_batch_size=micro, gradient_accumulation_steps=batch // micro,
        steps_per_generation=batch // micro,
        num_generations=exp.group_size, beta=exp.beta, temperature=exp.temperature, loss_type=exp.loss_type,
        scale_rewards=exp.scale_rewards,
        max_completion_length=exp.max_context, logging_steps=1, save_strategy="steps", save_steps=exp.eval_every,
        report_to=list(exp.report_to), seed=exp.seed, use_cpu=not _cuda(), bf16=_bf16(exp.precision),
        # Transformers' checkpointing would drop the shared prefix's cache; shared_prefix_logps checkpoints the
        # remainder's layers itself (over a read-only cache). The GPU recipe turns this on; that path is handled.
        gradient_checkpointing=False, dataloader_num_workers=0, shuffle_dataset=True, disable_tqdm=False,
        log_completions=False, save_only_model=False,
    )
    kwargs.update(LOSS_RULES.get(exp.loss_type, {}))
    if exp.max_staleness:
        # Off-policy groups (agentlab.async_rollouts): TRL's clipped ratio is taken against the behaviour policy's
        # log-probs (trl_compat's off_policy coupling), and TRL's two-sided clip caps it for negative advantages too
        # (delta, from INTELLECT-2's asynchronous RL, which used 4): a stale token's weight stays bounded.
        kwargs["delta"] = ASYNC_DELTA
    kwargs.update(overrides)
    if kwargs["use_cpu"] and "save_steps" not in overrides:
        # A checkpoint every step (a LoRA adapter and its optimiser state: a few MB, against minutes a step on a CPU),
        # so a study stopped at a session's end loses one step at most, not up to eval_every of them; evaluations
        # keep their cadence and the checkpoints between them are pruned (train.Recorder, RunDir.prune_checkpoints).
        kwargs["save_steps"] = 1
    return kwargs


def micro_batch_size(batch: int, limit: int) -> int:
    """Rows per forward/backward pass: the largest divisor of ``batch`` that is at most ``limit`` (0: ``batch``).

    >>> micro_batch_size(8, 4), micro_batch_size(12, 8), micro_batch_size(8, 0)
    (4, 6, 8)
    """
    if limit <= 0 or limit >= batch:
        return batch
    return max(d for d in range(1, limit + 1) if batch % d == 0)
