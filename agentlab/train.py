"""SFT warm start and LoRA GRPO on TRL, with our agent loop as GRPOTrainer's rollout.

    from agentlab.train import Experiment, run_sft, run_grpo
    exp = Experiment(name="demo", env="lookup", steps=10)
    adapter = run_sft(exp, demos)            # TRL SFTTrainer, LoRA, assistant-only loss
    run_grpo(exp, train_tasks, eval_tasks, init_adapter=adapter)

Why a ``rollout_func`` instead of TRL's ``environment_factory``: TRL's tool loop keeps generating after the
final-answer tool and knows nothing of turn budgets, infra retries or our episode records; plugging
``agentlab.rollout.run_episodes`` in as the rollout makes training and evaluation run the *same* loop (the
tokens are identical to TRL's own loop: ``tests/test_rollout.py``). TRL still does everything else: the GRPO
loss, advantages, optimiser, checkpoints, resume, logging.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from agentlab.rollout import LoopConfig, Renderer, cache_of, run_episodes
from agentlab.runs import RunDir
from agentlab.types import Episode, Task

# TRL 1.16's GRPOConfig.loss_type and scale_rewards values (TRL implements every variant; we pass the name through).
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")
SCALE_REWARDS = ("group", "batch", "none")
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
    max_turns: int = 3
    max_new_tokens: int = 64      # per turn
    max_context: int = 1024
    beta: float = 0.0             # KL to the reference; 0 skips the reference forward entirely
    temperature: float = 0.7
    steps: int = 10
    eval_every: int = 5           # checkpoint + held-out eval every K steps
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

    def __post_init__(self):
        from agentlab.envs import load

        errors = []
        try:
            load(self.env)
        except ValueError as exc:
            errors.append(f"env={self.env!r}: {exc}")
        if not self.lr > 0:
            errors.append(f"lr={self.lr} must be > 0")
        if self.group_size < 2:
            errors.append(f"group_size={self.group_size} must be >= 2 (GRPO compares rollouts within a group)")
        for name in ("groups_per_step", "max_turns", "max_new_tokens", "steps", "eval_every", "lora_r", "max_nonfinite"):
            if getattr(self, name) < 1:
                errors.append(f"{name}={getattr(self, name)} must be >= 1")
        if self.micro_batch < 0:
            errors.append(f"micro_batch={self.micro_batch} must be >= 0 (0: the whole step in one pass)")
        if not (0 <= self.hint_p <= 1 and 0 <= self.hint_switch <= 1):
            errors.append(f"hint_p={self.hint_p} and hint_switch={self.hint_switch} must lie in [0, 1]")
        from agentlab.precision import PRECISIONS

        if self.precision not in PRECISIONS:
            errors.append(f"precision={self.precision!r} unknown; expected one of {PRECISIONS}")
        if self.beta < 0 or self.temperature <= 0:
            errors.append(f"beta={self.beta} must be >= 0 and temperature={self.temperature} > 0")
        bad = set(self.report_to) - {"wandb", "trackio"}
        if bad:
            errors.append(f"report_to={sorted(bad)} unknown; expected wandb and/or trackio")
        if self.loss_type not in LOSS_TYPES:
            errors.append(f"loss_type={self.loss_type!r} unknown; expected one of {LOSS_TYPES}")
        if self.scale_rewards not in SCALE_REWARDS:
            errors.append(f"scale_rewards={self.scale_rewards!r} unknown; expected one of {SCALE_REWARDS}")
        try:
            self.reward_object()
        except ValueError as exc:
            errors.append(str(exc))
        if errors:
            raise ValueError("bad experiment config: " + "; ".join(errors))

    def reward_object(self):
        """The configured reward (a spec string parsed), or None for the environment's default."""
        from agentlab.rewards import parse_reward

        return parse_reward(self.reward) if isinstance(self.reward, str) else self.reward

    def reward_fn(self):
        """``reward_fn(ep) -> (total, terms)`` that training and checkpoint evals score with."""
        from agentlab.rewards import as_reward_fn, default_reward

        reward = self.reward_object()
        return as_reward_fn(reward) if reward is not None else default_reward(self.env)

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
                          batch_size=self.groups_per_step * self.group_size, precision=self.precision)


@dataclass(frozen=True)
class SFTSettings:
    """SFT warm start on scripted demonstrations (defaults finish in a few minutes on 2 cores)."""

    steps: int = 8
    batch_size: int = 2
    lr: float = 1e-3
    lora_r: int = 16
    seed: int = 0
    precision: str = "auto"       # bf16 mixed precision where the hardware has it (agentlab.precision)


def lora_config(r: int):
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, target_modules=LORA_TARGETS, task_type="CAUSAL_LM")


def _threads() -> None:
    import os

    import torch

    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))


# -- SFT ------------------------------------------------------------------------------------------------------------


def run_sft(model_name: str, demos: list[dict], out_dir: Path, settings: SFTSettings = SFTSettings(),
            report_to: tuple[str, ...] = (), save_at: tuple[int, ...] = (), init_adapter: str | Path | None = None,
            max_seconds: float | None = None) -> Path:
    """LoRA SFT with TRL's SFTTrainer, loss on assistant tokens only (prompts and tool results masked).

    ``demos``: conversations (``expert_demos`` rows) or pre-tokenized rows (``input_ids`` + ``assistant_masks``,
    e.g. verified rollouts for rejection-sampling fine-tuning). ``save_at``: also save the adapter after these
    steps, as ``adapter-step-N`` (one run gives every point of a steps search). ``init_adapter``: continue
    training that LoRA instead of a fresh one. ``max_seconds``: stop after the first step that ends past this
    wall-clock budget (compute-matched baselines); ``settings.steps`` stays the upper bound.
    """
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from agentlab.models import load_policy

    if not demos:
        raise ValueError("no demonstrations to train on")
    _threads()
    from agentlab.synth import tokenize_demos

    model, tok = load_policy(model_name)
    if init_adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(init_adapter), is_trainable=True)
    rows = [d for d in demos if "input_ids" in d] + tokenize_demos([d for d in demos if "input_ids" not in d], tok)
    args = SFTConfig(
        output_dir=str(out_dir / "trainer"), max_steps=settings.steps, per_device_train_batch_size=settings.batch_size,
        learning_rate=settings.lr, lr_scheduler_type="constant", warmup_steps=0, logging_steps=1,
        # Our pre-tokenized rows carry ``assistant_masks``, which SFTTrainer always applies: assistant-only loss.
        assistant_only_loss=False, save_strategy="no", report_to=list(report_to), seed=settings.seed,
        use_cpu=not _cuda(), gradient_checkpointing=False, max_length=2048, dataloader_num_workers=0,
        disable_tqdm=False, bf16=_bf16(settings.precision))

    class Checkpoints(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kw):
            if state.global_step in save_at:
                model.save_pretrained(out_dir / f"adapter-step-{state.global_step}")
            if max_seconds is not None and time.time() - t0 >= max_seconds:
                control.should_training_stop = True

    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok,
                         peft_config=None if init_adapter is not None else lora_config(settings.lora_r),
                         callbacks=[Checkpoints()])
    if max_seconds is not None:
        # transformers 5.24's notebook progress bar divides by None when training stops before max_steps; the
        # text bar handles an early stop (seen running notebook 00's quickstart smoke in Jupyter).
        from transformers.trainer_callback import ProgressCallback
        from transformers.utils.notebook import NotebookProgressCallback

        if trainer.pop_callback(NotebookProgressCallback) is not None:
            trainer.add_callback(ProgressCallback)
    t0 = time.time()
    trainer.train()
    adapter = out_dir / "adapter"
    trainer.model.save_pretrained(adapter)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    (out_dir / "sft_summary.json").write_text(json.dumps(
        {"steps": trainer.state.global_step, "demos": len(demos), "seconds": time.time() - t0,
         "loss_first": losses[0], "loss_last": losses[-1], "losses": losses, "settings": asdict(settings),
         "init_adapter": str(init_adapter) if init_adapter else None}, indent=2))
    return adapter


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _bf16(precision: str) -> bool:
    """bf16 mixed precision (autocast, fp32 master weights) for the Trainer: GPUs, and CPUs with bf16 hardware."""
    from agentlab.precision import resolve

    return resolve(precision) == "bf16"


# -- GRPO -----------------------------------------------------------------------------------------------------------


@dataclass
class _StepStats:
    """What the rollout of the current step saw, merged into that step's metrics line."""

    episodes: list[Episode] = field(default_factory=list)
    generate_s: float = 0.0
    skipped: bool = False         # this step's update was skipped: a non-finite gradient
    skipped_in_row: int = 0


class TrainingDiverged(RuntimeError):
    """Too many updates in a row had non-finite gradients; the run stops (its last checkpoint stays usable)."""


def nonfinite_guard(stats: _StepStats, limit: int):
    """A callback that skips an update whose gradients are not all finite (a NaN or inf loss, an overflow) and
    stops training after ``limit`` such updates in a row.

    Why by hand: transformers' Trainer steps the optimiser whatever the gradients hold, and one NaN step ruins
    the weights (the seeds' reference run stopped on a NaN gradient). Setting every gradient to ``None`` makes
    the optimiser's step a true no-op: AdamW skips parameters without a gradient, moments included.
    """
    import torch
    from transformers import TrainerCallback

    class NonFiniteGuard(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            params = [p for p in model.parameters() if p.grad is not None]
            finite = all(bool(torch.isfinite(p.grad).all()) for p in params)
            stats.skipped = not finite
            stats.skipped_in_row = 0 if finite else stats.skipped_in_row + 1
            if not finite:
                for p in params:
                    p.grad = None
                if stats.skipped_in_row >= limit:
                    control.should_training_stop = True

    return NonFiniteGuard()


def shared_prefix_logps(model, input_ids, attention_mask, logits_to_keep: int, compute_entropy: bool = False,
                        min_prefix: int = 16, checkpoint: bool = True):
    """Per-token log-probs of the last ``logits_to_keep`` tokens, encoding the batch's shared prefix once.

    Why: every rollout of a step starts with the same system prompt and tool schemas (~370 of ~550 tokens on
    ``lookup``), and TRL's forward encodes it once per row, forward and backward. Here the prefix is encoded
    once with gradients, its KV cache repeated across the batch (gradients sum back through the repeat), and
    each row's remainder laid out as ``pads | rest`` with explicit position ids — the same attention each row
    had alone. ``tests/test_train.py`` checks log-probs and gradients against TRL's own computation.
    Returns ``(logps_BT, entropy_BT | None)`` or ``None`` when the shared prefix is too short to bother.

    ``checkpoint``: activation checkpointing of the remainder's decoder layers (each layer keeps only its input
    and is replayed in backward). Transformers' own gradient checkpointing drops the cache, so the prefix could
    not be shared under it; here the cache is made read-only for the remainder (``_read_only``), which makes a
    replay see exactly the states of the first pass. Measured on the GRPO step benchmark's step (8 rollouts, ~200
    tokens each after the prefix, bf16): peak RSS 5.9 GB without, 4.3 GB with; 3.3 GB with ``LM_HEAD_CHUNK`` too.
    """
    import torch
    from transformers.modeling_layers import GradientCheckpointingLayer

    if not any(isinstance(m, GradientCheckpointingLayer) for m in model.modules()) and getattr(
            model, "is_activation_checkpointing", False):
        return None  # checkpointing we cannot steer would drop the prefix cache: TRL's own forward is the safe one
    rows = [ids[m.bool()] for ids, m in zip(input_ids, attention_mask, strict=True)]
    first_real = (attention_mask.cumsum(1) == 0).sum(1)  # left pads per row
    shortest = min(len(r) for r in rows)
    # keep at least logits_to_keep + 1 tokens per row outside the prefix (the tokens scored and their context)
    limit = min(shortest, int((input_ids.size(1) - first_real).min()) - logits_to_keep - 1)
    prefix_len = 0
    while prefix_len < limit and all(int(r[prefix_len]) == int(rows[0][prefix_len]) for r in rows):
        prefix_len += 1
    if prefix_len < min_prefix:
        return None
    batch, width = input_ids.size(0), input_ids.size(1)
    prefix = rows[0][:prefix_len].unsqueeze(0)
    # The prefix must fill the cache: transformers' gradient checkpointing (on in the GPU recipe) would drop it and
    # silently score every remainder without its prefix. One row: its activations are cheap to keep.
    with _checkpointed_layers(model, False):
        out = model(input_ids=prefix, use_cache=True, logits_to_keep=1)  # only the cache, not prefix logits
    cache = cache_of(out)
    cache.batch_repeat_interleave(batch)
    _read_only(cache)
    # remainder of each row: everything after (left pads + prefix), right-aligned so the scored tail lines up
    rest_width = width - int(first_real.min()) - prefix_len
    rest_ids = torch.full((batch, rest_width), 0, dtype=input_ids.dtype)
    rest_mask = torch.zeros((batch, rest_width), dtype=attention_mask.dtype)
    for b in range(batch):
        start = int(first_real[b]) + prefix_len
        n = width - start
        rest_ids[b, rest_width - n:] = input_ids[b, start:]
        rest_mask[b, rest_width - n:] = attention_mask[b, start:]
    positions = (prefix_len + rest_mask.cumsum(1) - 1).clamp(min=0)
    labels = rest_ids.masked_fill(rest_mask == 0, -100)
    labels[:, :-logits_to_keep] = -100
    full_mask = torch.cat([torch.ones((batch, prefix_len), dtype=rest_mask.dtype), rest_mask], dim=1)
    with _checkpointed_layers(model, checkpoint), _lm_head_chunk(LM_HEAD_CHUNK):
        outputs = model(input_ids=rest_ids, attention_mask=full_mask, position_ids=positions, cache=cache,
                        labels=labels, fused_lm_head=True, use_cache=False)
    logps = outputs.log_probs[:, -logits_to_keep:]
    entropy = outputs.entropy[:, -logits_to_keep:] if compute_entropy else None
    return logps, entropy


# Vocabulary columns per tile of TRL's fused LM head. TRL's 32768 makes each CPU tile (positions x 32768, fp32)
# ~200 MB for an 8-rollout step, and its CPU fallback makes several temporaries of that size; 8192 cut the peak of a
# forward+backward from 3.6 to 2.4 GB at the same speed (measured on the GRPO step benchmark's batch).
LM_HEAD_CHUNK = 8192


@contextmanager
def _lm_head_chunk(size: int):
    """Set TRL's fused-LM-head tile width within the block (read when the forward runs; backward reuses it)."""
    import trl.trainer.utils as trl_utils

    saved, trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE = trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE, size
    try:
        yield
    finally:
        trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE = saved


def _read_only(cache) -> None:
    """Make ``cache`` return (cached + new) keys and values without storing the new ones, so a decoder layer can
    run twice (activation checkpointing replays it in backward) and read the same states both times."""
    import torch

    def update(key_states, value_states, layer_idx, *args, **kwargs):
        layer = cache.layers[layer_idx]
        return torch.cat([layer.keys, key_states], dim=-2), torch.cat([layer.values, value_states], dim=-2)

    cache.update = update


@contextmanager
def _checkpointed_layers(model, enabled: bool = True):
    """Within the block, decoder layers (transformers' ``GradientCheckpointingLayer``) run under non-reentrant
    activation checkpointing even with a (read-only) cache if ``enabled``, and without checkpointing otherwise,
    whatever the model's own setting; their own settings come back afterwards. Checkpointing only acts with
    gradients in train mode (the layer checks both)."""
    from functools import partial

    from torch.utils.checkpoint import checkpoint
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    # the backbone's own flag only turns use_cache off (and with it the prefix cache): off inside the block
    backbones = [m for m in model.modules() if isinstance(m.__dict__.get("gradient_checkpointing"), bool)
                 and not isinstance(m, GradientCheckpointingLayer)]
    keys = ("gradient_checkpointing", "_can_checkpoint_with_cache", "_gradient_checkpointing_func")
    saved = [(m, {k: m.__dict__[k] for k in keys if k in m.__dict__}) for m in layers + backbones]
    for layer in layers:
        layer.gradient_checkpointing = enabled
        layer._can_checkpoint_with_cache = True  # our cache is read-only: the replay reads the same states
        layer._gradient_checkpointing_func = partial(checkpoint, use_reentrant=False)
    for backbone in backbones:
        backbone.gradient_checkpointing = False
    try:
        yield
    finally:
        for module, state in saved:
            for key in keys:
                module.__dict__.pop(key, None)
            module.__dict__.update(state)


def make_rollout_func(spec, tokenizer, tasks: list[Task], exp: Experiment, run: RunDir, stats: _StepStats,
                      reward_fn=None):
    """A TRL ``rollout_func`` that runs our agent loop for the batch's prompts (G consecutive copies each), scoring
    each episode with ``reward_fn`` (default: the experiment's reward)."""
    reward_fn = reward_fn or exp.reward_fn()
    by_question = {t.question: t for t in tasks}
    config = exp.loop()

    def rollout(prompts: list, trainer) -> dict:
        import torch

        questions = [p[-1]["content"] for p in prompts]
        unique = list(dict.fromkeys(questions))
        samples = len(questions) // len(unique)
        if [q for q in unique for _ in range(samples)] != questions:
            raise RuntimeError("expected each prompt repeated group_size times in a row (TRL's RepeatSampler)")
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        step = trainer.state.global_step + 1
        t0 = time.perf_counter()
        generate_fn = None
        if getattr(trainer, "use_vllm", False):  # GPU: TRL's vLLM engine, weights synced by TRL before this call
            from agentlab.gpu import vllm_generate_fn

            generate_fn = vllm_generate_fn(trainer, exp.max_new_tokens)
        observe = None
        if exp.hint_p > 0:
            from agentlab.hints import HintSchedule, observer

            observe = observer(spec.name, spec.env_class.final_tool,
                               HintSchedule(p=exp.hint_p, switch=exp.hint_switch, seed=exp.seed), step, exp.steps)
        with torch.no_grad():
            episodes = run_episodes(model, tokenizer, spec, [by_question[q] for q in unique], samples=samples,
                                    config=config, seed=exp.seed * 100_003 + step, progress=False, step=step,
                                    model_id=exp.model, config_id=exp.name, generate_fn=generate_fn,
                                    observe=observe, reward_fn=reward_fn)
        stats.generate_s = time.perf_counter() - t0
        if was_training:
            model.train()
        for ep in episodes:  # group index unique per step: (step, group)
            run.append(run.rollouts_file, ep.to_json())
        stats.episodes = episodes
        return {
            "prompt_ids": [ep.tokens["prompt_ids"] for ep in episodes],
            "completion_ids": [ep.tokens["completion_ids"] for ep in episodes],
            "logprobs": None,
            "env_mask": [ep.tokens["mask"] for ep in episodes],
            "agentlab_reward": trainer_rewards(episodes),
        }

    return rollout


def trainer_rewards(episodes: list[Episode]) -> list[float | None]:
    """What GRPO is told each episode earned. ``None`` for an infra episode: TRL 1.16 then leaves it out of its
    group's baseline and gives it no advantage, so an environment's (or a judge's) failure moves the policy in no
    direction — a 0 would push its group's other rollouts up and teach the policy to avoid what broke."""
    return [None if ep.failure == "infra" else ep.reward for ep in episodes]


def agentlab_reward(prompts, completions, agentlab_reward, **kwargs) -> list[float | None]:
    """The episode reward computed inside our loop (TRL reward-function signature); None for infra episodes."""
    return list(agentlab_reward)


def step_metrics(episodes: list[Episode], group_size: int, spec=None) -> dict:
    """Our per-step metrics from the step's episodes (TRL adds loss, entropy, KL, grad norm)."""
    import statistics

    rewards = [ep.reward for ep in episodes if ep.failure != "infra"] or [0.0]
    scored = trainer_rewards(episodes)
    groups = [[r for r in scored[i:i + group_size] if r is not None] or [0.0]
              for i in range(0, len(scored), group_size)]
    turns = [len(ep.turns) for ep in episodes]
    calls = sum(len(t.tool_calls) for ep in episodes for t in ep.turns)
    return {
        "reward_mean": statistics.fmean(rewards), "reward_std": statistics.pstdev(rewards),
        "success_mean": statistics.fmean(ep.success for ep in episodes),
        "zero_variance_groups": sum(max(g) == min(g) for g in groups) / len(groups),
        "valid_rollouts": sum(spec.is_valid(ep.outcome) if spec else ep.exit_reason == "final_answer"
                              for ep in episodes) / len(episodes),
        "turns_mean": statistics.fmean(turns),
        "generated_tokens_mean": statistics.fmean(sum(t.n_generated for t in ep.turns) for ep in episodes),
        "off_form_calls": sum(t.off_form for ep in episodes for t in ep.turns),
        "lenient_calls": sum(t.lenient for ep in episodes for t in ep.turns),
        "tool_calls": calls,
        "tool_failures": sum(c["error"] is not None for ep in episodes for t in ep.turns for c in t.tool_calls),
        "infra_failures": sum(ep.failure == "infra" for ep in episodes),
    }


def grpo_config(exp: Experiment, output_dir: Path, **overrides):
    """The GRPOConfig our experiment maps to (also used by the GPU recipe with vLLM/bf16 overrides)."""
    from trl import GRPOConfig

    return GRPOConfig(**grpo_kwargs(exp, output_dir, **overrides))


def grpo_kwargs(exp: Experiment, output_dir: Path, **overrides) -> dict:
    """GRPOConfig keyword arguments (a dict, so CPU tests can check the GPU values without CUDA)."""
    batch = exp.groups_per_step * exp.group_size
    micro = micro_batch_size(batch, exp.micro_batch)
    kwargs = dict(
        output_dir=str(output_dir), max_steps=exp.steps, learning_rate=exp.lr, lr_scheduler_type="constant",
        # One generation of the whole step's rollouts, then forward/backward in `micro`-row passes whose gradients
        # accumulate into one optimiser step (TRL splits the generation batch; the loss is normalised over it).
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
    kwargs.update(overrides)
    return kwargs


def micro_batch_size(batch: int, limit: int) -> int:
    """Rows per forward/backward pass: the largest divisor of ``batch`` that is at most ``limit`` (0: ``batch``).

    >>> micro_batch_size(8, 4), micro_batch_size(12, 8), micro_batch_size(8, 0)
    (4, 6, 8)
    """
    if limit <= 0 or limit >= batch:
        return batch
    return max(d for d in range(1, limit + 1) if batch % d == 0)


_TRAINER_CLASS = None


def agent_trainer_class():
    """TRL's GRPOTrainer plus two things it lacks: a step-time split (generation / forward / backward) and the
    shared-prefix forward (``shared_prefix_logps``). Built on first use so importing agentlab stays light."""
    global _TRAINER_CLASS
    if _TRAINER_CLASS is not None:
        return _TRAINER_CLASS
    from trl import GRPOTrainer

    class AgentGRPOTrainer(GRPOTrainer):
        # Thin timing hooks: generation happens inside _prepare_inputs, the policy forward in compute_loss,
        # the rest of training_step is backward + optimiser.
        shared_prefix = True  # set False to get TRL's own forward (benchmarks, tests)

        def __init__(self, *a, **k):
            self.timing: dict[str, float] = {}
            self._timed_step = -1
            super().__init__(*a, **k)

        def training_step(self, *a, **k):
            # called once per micro-batch: the step's timings add up over its micro-batches
            if self._timed_step != self.state.global_step:
                self.timing.clear()
                self._timed_step = self.state.global_step
            t0 = time.perf_counter()
            out = super().training_step(*a, **k)
            self.timing["step_s"] = self.timing.get("step_s", 0) + time.perf_counter() - t0
            return out

        def _prepare_inputs(self, *a, **k):
            t0 = time.perf_counter()
            out = super()._prepare_inputs(*a, **k)
            self.timing["prepare_s"] = self.timing.get("prepare_s", 0) + time.perf_counter() - t0
            return out

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                               batch_size=None, compute_entropy=False, compute_aux_loss=False,
                                               **multimodal):
            if self.shared_prefix and not compute_aux_loss and not any(v is not None for v in multimodal.values()):
                with self.accelerator.autocast():
                    shared = shared_prefix_logps(model, input_ids, attention_mask, logits_to_keep, compute_entropy)
                if shared is not None:
                    return shared[0], shared[1], None
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss,
                **multimodal)

        def compute_loss(self, *a, **k):
            t0 = time.perf_counter()
            out = super().compute_loss(*a, **k)
            self.timing["forward_s"] = self.timing.get("forward_s", 0) + time.perf_counter() - t0
            return out

    _TRAINER_CLASS = AgentGRPOTrainer
    return AgentGRPOTrainer


def run_grpo(exp: Experiment, train_tasks: list[Task], eval_tasks: list[Task], init_adapter: str | Path | None = None,
             run: RunDir | None = None, overwrite: bool = False, backend: str = "hf", recipe: str | None = None,
             trainer_overrides: dict | None = None) -> RunDir:
    """Train with GRPO; resume from the last checkpoint when the run folder has one.

    GPU: ``backend="unsloth"`` loads through Unsloth (LoRA applied there); ``trainer_overrides`` takes
    ``agentlab.gpu.grpo_overrides(recipe, vllm_mode)`` (bf16, vLLM colocate/server).
    """
    from datasets import Dataset
    from transformers import TrainerCallback

    from agentlab.envs import load
    from agentlab.models import load_policy

    if init_adapter is not None and not (Path(init_adapter) / "adapter_config.json").exists():
        raise FileNotFoundError(f"init adapter {init_adapter} has no adapter_config.json")
    spec = load(exp.env)
    _tracking_env(exp.report_to)
    run = run or RunDir(exp.name)
    reward_fn = exp.reward_fn()
    from agentlab.rewards import check_reward

    check_reward(reward_fn, spec)  # a reward that raises or returns NaN fails here, before any folder or model
    run.prepare({**exp.to_config(), "init_adapter": str(init_adapter) if init_adapter else None},
                overwrite=overwrite, defaults=Experiment().to_config())
    _threads()
    checkpoints = run.checkpoints()
    resume = str(checkpoints[-1]) if checkpoints else None
    if resume:
        run.truncate_after(int(resume.rsplit("-", 1)[1]))

    model, tok = load_policy(exp.model, backend=backend, recipe=recipe)
    if init_adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(init_adapter), is_trainable=True)
    renderer = Renderer(tok, spec.env_class)
    rows = [{"prompt": renderer.messages(t), "task": t.to_json()} for t in train_tasks]
    stats = _StepStats()

    Trainer = agent_trainer_class()

    class Recorder(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if not logs or "loss" not in logs or not stats.episodes:
                return
            keep = ("loss", "entropy", "kl", "grad_norm", "learning_rate", "frac_reward_zero_std")
            record = {"step": state.global_step, **{k: logs[k] for k in keep if k in logs},
                      **step_metrics(stats.episodes, exp.group_size, spec),
                      "time_generate_s": stats.generate_s, "time_step_s": trainer.timing.get("step_s"),
                      "time_forward_s": trainer.timing.get("forward_s"),
                      "time_backward_s": (trainer.timing.get("step_s", 0) - trainer.timing.get("prepare_s", 0)
                                          - trainer.timing.get("forward_s", 0)),
                      "prompts_seen": state.global_step * exp.groups_per_step,
                      "skipped_nonfinite_update": stats.skipped}
            run.append(run.metrics_file, record)

        def on_train_begin(self, args, state, control, **kw):
            # A kill can land between a checkpoint's save and its eval: evaluate the resumed checkpoint if its eval
            # is missing (weights are loaded by now; evaluate_policy skips evals that exist).
            if state.global_step > 0:
                evaluate_policy(trainer.accelerator.unwrap_model(trainer.model), tok, spec, eval_tasks, exp, run,
                                state.global_step)

        def on_save(self, args, state, control, model=None, **kw):
            evaluate_policy(trainer.accelerator.unwrap_model(trainer.model), tok, spec, eval_tasks, exp, run,
                            state.global_step)

    trainer = Trainer(
        model=model, reward_funcs=[agentlab_reward],
        args=grpo_config(exp, run.path / "checkpoints", **(trainer_overrides or {})),
        train_dataset=Dataset.from_list(rows), processing_class=tok,
        peft_config=None if (init_adapter or backend == "unsloth") else lora_config(exp.lora_r),
        rollout_func=make_rollout_func(spec, tok, train_tasks, exp, run, stats, reward_fn), callbacks=[Recorder(), nonfinite_guard(stats, exp.max_nonfinite)])
    if not resume:
        evaluate_policy(trainer.model, tok, spec, eval_tasks, exp, run, 0)
    trainer.train(resume_from_checkpoint=resume)
    if stats.skipped_in_row >= exp.max_nonfinite:
        raise TrainingDiverged(
            f"GRPO stopped at step {trainer.state.global_step}: {stats.skipped_in_row} updates in a row had non-finite "
            f"gradients and were skipped (see skipped_nonfinite_update in {run.metrics_file}); lower the learning "
            f"rate or check the reward, then resume from the last checkpoint")
    trainer.model.save_pretrained(run.path / "adapter")
    run.mark_finished({"steps": exp.steps, "adapter": str(run.path / "adapter")})
    return run


def _tracking_env(report_to: tuple[str, ...]) -> None:
    """Local files are always written; W&B and Trackio are opt-in. Without a W&B key, W&B runs offline (its
    files land in ./wandb and can be synced later), so an opt-in never needs the network."""
    import os

    if "wandb" in report_to and not os.environ.get("WANDB_API_KEY"):
        os.environ.setdefault("WANDB_MODE", "offline")


def evaluate_policy(model, tok, spec, tasks: list[Task], exp: Experiment, run: RunDir, step: int) -> dict:
    """Greedy held-out eval with the shared loop; writes ``evals/step-N.json`` (+ rollouts). Skips if present."""
    import torch

    from agentlab.evals import summarize

    name = f"evals/step-{step:04d}.json"
    if (existing := run.read_json(name)) is not None:
        return existing
    was_training = model.training
    model.eval()
    path = run.path / f"evals/step-{step:04d}.rollouts.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(), open(path, "w") as fh:
        episodes = run_episodes(model, tok, spec, tasks[: exp.eval_tasks], config=replace(exp.loop(), temperature=0),
                                greedy=True, out=fh, progress=False, step=step, model_id=exp.model,
                                config_id=exp.name, reward_fn=exp.reward_fn())
    if was_training:
        model.train()
    summary = {"step": step, **summarize(episodes)}
    run.write_json(name, summary)
    return summary
