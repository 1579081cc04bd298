"""``max_staleness`` on GPUs: TRL's asynchronous GRPO trainer drives our environments (no second implementation).

    CUDA_VISIBLE_DEVICES=0 trl vllm-serve --model Qwen/Qwen3-4B-Instruct-2507 --enable-lora &
    CUDA_VISIBLE_DEVICES=1 agentlab train --env product_finder --recipe qwen3-4b-instruct-2507 \\
        --vllm-mode server --max-staleness 2

On a CPU, agentlab's own small worker overlaps generation and training (:mod:`agentlab.async_rollouts`): TRL's
``AsyncGRPOTrainer`` (``trl.experimental.async_grpo``, TRL 1.16) generates on a vLLM server, so it needs a GPU.
There, ``train.run_grpo`` hands an experiment with ``max_staleness`` > 0 to :func:`run_async_grpo`: TRL's spawned
rollout process runs its own multi-turn tool loop over our environment class (``environment_factory``: each
rollout resets an instance with a dataset row, calls its public methods as tools, and is scored by its
``get_reward``), drops samples more than ``max_staleness`` policy versions old, and the trainer corrects each token
by the log-prob vLLM sampled it with (TRL's clipped ratio).

What maps (:func:`async_kwargs`): learning rate, G, steps, temperature, turns and tokens a turn, staleness, the
batch (rollouts a step, in ``micro_batch``-row passes), seed, bf16, the checkpoint cadence. Refused before any
work (:func:`refusals`), each with its reason: ``beta`` > 0 (TRL's async trainer keeps no reference model); a
``loss_type`` other than ``dapo`` or ``scale_rewards`` other than ``group`` (its loss is token-level and its
advantages group-normalised, not configurable); a callable reward (the rollout process scores from environment
state, so only a :class:`~agentlab.rewards.Reward` of named terms travels, pickled with the environment factory);
terms that read the turns' text (TRL's loop hands the environment only parsed calls, so the off-form and lenient
counts would silently be 0).

An SFT start (``init_adapter``): the trainer loads a model *path* and adds a fresh LoRA itself, and refuses a
``PeftModel``; as its own error message advises, the start is merged into the base weights once
(``<run>/base``) and GRPO's adapter trains on that model (``agentlab eval --model <run>/base --adapter …``).

Tested on a CPU for construction only (a stand-in rollout worker and weight transfer, the CUDA peak-FLOPs query
stubbed: ``tests/test_gpu_async.py``); it has not run against a vLLM server here.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

from agentlab.experiment import Experiment, _bf16, groups_per_process, lora_config, micro_batch_size
from agentlab.rewards import Reward
from agentlab.runs import RunDir
from agentlab.types import Task

TURN_TERMS = ("off_form", "off_form_any", "lenient", "lenient_any", "format")  # read the turns, not the state


@dataclass(frozen=True)
class ScoredEnv:
    """TRL's ``environment_factory``: a fresh ``env_class`` instance scored by ``reward`` (``None``: the spec's
    default). A class with a field, not a closure, because TRL pickles the factory into its spawned rollout
    process; ``env_class`` travels by reference and its module, imported there, builds its ``EnvSpec``."""

    env_class: type
    reward: Reward | None = None

    def __call__(self):
        env = self.env_class()
        env._reward = self.reward  # ToolEnv.get_reward scores with it
        return env


def refusals(exp: Experiment) -> list[str]:
    """Why ``exp`` cannot train on TRL's async trainer (empty: it can)."""
    out = []
    if exp.beta:
        out.append(f"beta={exp.beta}: TRL's async trainer keeps no reference model (use beta=0)")
    if exp.loss_type != "dapo" or exp.scale_rewards != "group":
        out.append(f"loss_type={exp.loss_type!r}, scale_rewards={exp.scale_rewards!r}: TRL's async trainer has one "
                   f"loss (token-level, advantages normalised per group): use 'dapo' and 'group'")
    reward = exp.reward_object()
    terms = reward.terms if isinstance(reward, Reward) else {}
    if reward is not None and (not isinstance(reward, Reward) or any(callable(w) for w in terms.values())):
        out.append("a callable reward: TRL's rollout process scores each rollout from its environment's state, so "
                   "only a Reward of named terms travels (e.g. --reward f4=1,empty=-0.2)")
    elif turn_terms := sorted(set(terms) & set(TURN_TERMS)):
        out.append(f"reward terms {turn_terms} read the turns' text, which TRL's loop does not hand the environment "
                   f"(they would score 0)")
    return out


def check(exp: Experiment) -> None:
    """Raise ``ValueError`` with every :func:`refusals` reason, if any."""
    if why := refusals(exp):
        raise ValueError("max_staleness on GPUs (TRL's AsyncGRPOTrainer) cannot run this experiment: " + "; ".join(why))


def async_kwargs(exp: Experiment, output_dir: str | Path, server_url: str, **overrides) -> dict:
    """``AsyncGRPOConfig`` keyword arguments for ``exp`` (a dict, so CPU tests can check them without CUDA)."""
    batch = groups_per_process(exp) * exp.group_size
    micro = micro_batch_size(batch, exp.micro_batch)
    kwargs = dict(
        output_dir=str(output_dir), learning_rate=exp.lr, lr_scheduler_type="constant", max_steps=exp.steps,
        num_generations=exp.group_size, per_device_train_batch_size=micro, gradient_accumulation_steps=batch // micro,
        temperature=exp.temperature, max_completion_length=exp.max_new_tokens,  # a turn's tokens (vLLM's max_tokens)
        max_tool_calling_iterations=exp.max_turns, max_staleness=exp.max_staleness, seed=exp.seed,
        bf16=_bf16(exp.precision), save_strategy="steps", save_steps=exp.eval_every, logging_steps=1,
        report_to=list(exp.report_to), vllm_server_base_url=server_url,
    )
    kwargs.update(overrides)
    return kwargs


def server_url(trainer_overrides: dict) -> str:
    """The vLLM server's address from ``models.vllm_settings(recipe, "server")``'s host and port."""
    if trainer_overrides.get("vllm_mode") != "server":
        raise ValueError("max_staleness on GPUs needs a vLLM server (--vllm-mode server, `trl vllm-serve`): TRL's "
                         "async trainer generates on its own server, not colocated")
    return (trainer_overrides.get("vllm_server_base_url") or
            f"http://{trainer_overrides.get('vllm_server_host', '127.0.0.1')}:"
            f"{trainer_overrides.get('vllm_server_port', 8000)}")


def model_path(model: str, init_adapter: str | Path | None, out: Path, load_fn=None) -> str:
    """What the trainer loads ``model`` from: a hub id or folder as it is; else (a shipped model such as
    ``smollm2-135m``, or any model with an SFT start) the weights, with ``init_adapter`` merged in, saved once
    under ``out`` with their tokenizer."""
    if init_adapter is None and ("/" in model or Path(model).is_dir()):
        return model
    if (out / "config.json").exists():
        return str(out)
    from agentlab.models import load_policy

    base, tok = (load_fn or load_policy)(model)
    if init_adapter is not None:
        from peft import PeftModel

        base = PeftModel.from_pretrained(base, str(init_adapter)).merge_and_unload()
    tmp = out.with_name(out.name + ".tmp")
    base.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(out)  # a save cut short is redone, never half-read
    return str(out)


def build_async_trainer(exp: Experiment, train_tasks: list[Task], model_path: str | Path, tok, output_dir: Path,
                        url: str, config: dict | None = None, **injected):
    """TRL's ``AsyncGRPOTrainer`` for ``exp`` on our environment and tasks. ``config``: ``AsyncGRPOConfig``
    overrides (the recipe's bf16 and gradient checkpointing); ``injected``: ``rollout_worker`` /
    ``weight_transfer`` stand-ins (TRL's own injection points, for tests)."""
    from datasets import Dataset
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    from agentlab.envs import load
    from agentlab.rollout import Renderer

    check(exp)
    spec = load(exp.env)
    factory = ScoredEnv(spec.env_class, exp.reward_object())
    try:
        pickle.dumps(factory)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise ValueError(f"{spec.env_class.__name__} cannot be pickled into TRL's spawned rollout process ({exc}): "
                         f"define the class at module level in an importable module") from None
    renderer = Renderer(tok, spec.env_class)
    rows = [{"prompt": renderer.messages(t), "task": t.to_json()} for t in train_tasks]
    return AsyncGRPOTrainer(model=str(model_path), args=AsyncGRPOConfig(**async_kwargs(exp, output_dir, url,
                                                                                  **(config or {}))),
                            train_dataset=Dataset.from_list(rows), processing_class=tok, environment_factory=factory,
                            peft_config=lora_config(exp.lora_r), **injected)


def run_async_grpo(exp: Experiment, train_tasks: list[Task], run: RunDir, trainer_overrides: dict,
                   init_adapter: str | Path | None = None, overwrite: bool = False, load_fn=None) -> RunDir:
    """Train ``exp`` with TRL's async trainer into ``run`` (checkpoints, then ``adapter``); resumes from the last
    checkpoint. Checkpoints are evaluated afterwards (``agentlab eval --adapter``): the trainer's own loop has no
    hook for our greedy checkpoint evals."""
    from transformers import AutoTokenizer

    check(exp)  # before any folder or model
    url = server_url(trainer_overrides)
    run.prepare({**exp.to_config(), "init_adapter": run.rel(init_adapter) if init_adapter else None,
                 "trainer": "trl.experimental.async_grpo.AsyncGRPOTrainer", "vllm_server_base_url": url},
                overwrite=overwrite, defaults=Experiment().to_config())
    base = model_path(exp.model, init_adapter, run.path / "base", load_fn)  # the SFT start merged in, if any
    tok = AutoTokenizer.from_pretrained(base)
    recipe = {k: trainer_overrides[k] for k in ("bf16", "gradient_checkpointing") if k in trainer_overrides}
    trainer = build_async_trainer(exp, train_tasks, base, tok, run.path / "checkpoints", url, config=recipe)
    checkpoints = [] if overwrite else run.checkpoints()
    trainer.train(resume_from_checkpoint=str(checkpoints[-1]) if checkpoints else None)
    trainer.model.save_pretrained(run.path / "adapter")
    run.mark_finished({"steps": exp.steps, "adapter": run.rel(run.path / "adapter")})
    return run
