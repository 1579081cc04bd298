"""LoRA GRPO on TRL, with our agent loop as GRPOTrainer's rollout; the package's training facade.

    from agentlab.train import Experiment, SFTSettings, run_sft, run_grpo
    adapter = run_sft("smollm2-135m", demos, Path("runs/demo-sft"))        # agentlab.sft
    run_grpo(Experiment(name="demo", env="lookup", steps=10), train_tasks, eval_tasks, init_adapter=adapter)

Why a ``rollout_func`` instead of TRL's ``environment_factory``: TRL's tool loop keeps generating after the
final-answer tool and knows nothing of turn budgets, infra retries or our episode records; plugging
``agentlab.rollout.run_episodes`` in as the rollout makes training and evaluation run the *same* loop (the
tokens are identical to TRL's own loop: ``tests/test_rollout.py``). TRL still does everything else: the GRPO
loss, advantages, optimiser, checkpoints, resume, logging. Where we reach into TRL's internals, the code lives in
``agentlab.trl_compat``; the run's configuration in ``agentlab.experiment``; SFT in ``agentlab.sft``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from agentlab.experiment import (
    LOSS_TYPES,
    SCALE_REWARDS,
    Experiment,
    _threads,
    groups_per_process,
    grpo_config,
    grpo_kwargs,
    is_main_process,
    lora_config,
    micro_batch_size,
    tracking_env,
    world_size,
)
from agentlab.rollout import EVAL_BATCH, TASK_KEY, Renderer, run_episodes
from agentlab.runs import RunDir, checkpoint_step
from agentlab.sft import SFTSettings, run_sft
from agentlab.trl_compat import agent_trainer_class, resume_training
from agentlab.types import Episode, Task

__all__ = ["LOSS_TYPES", "SCALE_REWARDS", "Experiment", "SFTSettings", "TrainingDiverged", "grpo_config",
           "grpo_kwargs", "micro_batch_size", "run_grpo", "run_sft", "step_metrics", "trainer_rewards"]

# -- GRPO -----------------------------------------------------------------------------------------------------------


@dataclass
class _StepStats:
    """What the rollout of the current step saw, merged into that step's metrics line."""

    episodes: list[Episode] = field(default_factory=list)
    generate_s: float = 0.0       # the rollout's seconds (an asynchronous run: the wait for the worker's batch)
    batch: dict = field(default_factory=dict)  # an asynchronous run's batch header: policy version, staleness
    skipped: bool = False         # this step's update was skipped: a non-finite gradient
    skipped_in_row: int = 0


class TrainingDiverged(RuntimeError):
    """Too many updates in a row had non-finite gradients; the run stops (its last checkpoint stays usable)."""


def nonfinite_guard(stats: _StepStats, limit: int):
    """A callback that skips an update whose gradients are not all finite (a NaN or inf loss, an overflow) and
    stops training after ``limit`` such updates in a row.

    Why by hand: transformers' Trainer steps the optimiser whatever the gradients hold, and one NaN step ruins the
    weights. Setting every gradient to ``None`` makes the step a true no-op (AdamW skips parameters without one).
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


def make_rollout_func(spec, tokenizer, tasks: list[Task], exp: Experiment, run: RunDir, stats: _StepStats,
                      reward_fn=None, engine=None, take=None):
    """A TRL ``rollout_func`` that runs our agent loop for the batch's prompts (G consecutive copies each), scoring
    each episode with ``reward_fn`` (default: the experiment's reward). ``engine(model, tok, config, greedy, seed)``
    makes the ``GenerateFn`` (default: the experiment's ``rollout_backend``; vLLM when TRL runs it).
    ``take(step) -> (header, episodes)``: an asynchronous run's batches (``agentlab.async_rollouts``), instead."""
    reward_fn = reward_fn or exp.reward_fn()
    by_id = {t.id: t for t in tasks}
    config = exp.loop()

    def rollout(prompts: list, trainer) -> dict:
        import torch

        ids = [p[-1][TASK_KEY] for p in prompts]
        unique = list(dict.fromkeys(ids))
        samples = len(ids) // len(unique)
        if samples != exp.group_size or [i for i in unique for _ in range(samples)] != ids:
            raise RuntimeError("expected each prompt repeated group_size times in a row (TRL's RepeatSampler)")
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        step = trainer.state.global_step + 1
        t0 = time.perf_counter()
        if take is not None:  # generated by the worker while the last update ran: the trainer only waits
            stats.batch, episodes = take(step)
        else:
            # Several processes (torchrun / accelerate launch): each runs its own whole groups, numbered across
            # processes, so that (step, group) names one group of the run in the records and the hint schedule.
            rank = trainer.accelerator.process_index
            seed = exp.seed * 100_003 + step + 1_000_003 * rank
            generate_fn = engine(model, tokenizer, config, False, seed) if engine else None
            if getattr(trainer, "use_vllm", False):  # GPU: TRL's vLLM engine, weights synced by TRL before this call
                from agentlab.engines.vllm import vllm_generate_fn

                generate_fn = vllm_generate_fn(trainer, exp.max_new_tokens)
            observe = None
            if exp.hint_p > 0:
                from agentlab.hints import HintSchedule, observer

                observe = observer(spec.name, spec.env_class.final_tool,
                                   HintSchedule(p=exp.hint_p, switch=exp.hint_switch, seed=exp.seed), step, exp.steps)
            with torch.no_grad():
                episodes = run_episodes(model, tokenizer, spec, [by_id[i] for i in unique], samples=samples,
                                        config=config, seed=seed, progress=False,
                                        step=step, model_id=exp.model, config_id=exp.name, generate_fn=generate_fn,
                                        observe=observe, reward_fn=reward_fn, group_offset=rank * len(unique))
        stats.generate_s = time.perf_counter() - t0
        if was_training:
            model.train()
        # The main process writes every process's episodes (one writer per run folder) and computes the step's
        # metrics over all of them (gather_object returns its input when there is one process).
        from accelerate.utils import gather_object

        stats.episodes = gather_object(episodes)
        if trainer.accelerator.is_main_process:
            for ep in stats.episodes:
                run.append(run.rollouts_file, ep.to_json())
        # An episode whose generation failed before its first token has no completion; TRL parses every
        # completion, so it gets one EOS, masked (never trained; its reward is None as an infra episode).
        completions = [(ep.tokens["completion_ids"], ep.tokens["mask"]) if ep.tokens["completion_ids"]
                       else ([tokenizer.eos_token_id], [0]) for ep in episodes]
        # The behaviour log-probs where the engine reported them (vLLM: TRL's importance-sampling correction, on by
        # default, subtracts them from the trainer's); an episode without a completion gets its EOS's 0.0, as masked.
        drawn = [ep.tokens.get("logprobs") if ep.tokens["completion_ids"] else [0.0] for ep in episodes]
        return {
            "prompt_ids": [ep.tokens["prompt_ids"] for ep in episodes],
            "completion_ids": [c for c, _ in completions],
            "logprobs": drawn if all(lp is not None for lp in drawn) else None,
            "env_mask": [m for _, m in completions],
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


def run_grpo(exp: Experiment, train_tasks: list[Task], eval_tasks: list[Task], init_adapter: str | Path | None = None,
             run: RunDir | None = None, overwrite: bool = False, loader: str = "hf", recipe: str | None = None,
             trainer_overrides: dict | None = None, engine=None, load_fn=None, start_eval: Path | None = None) -> RunDir:
    """Train with GRPO; resume from the last checkpoint when the run folder has one.

    ``start_eval``: a folder where :func:`agentlab.pipeline.evaluate` already scored ``init_adapter`` on
    ``eval_tasks`` (an SFT search's validation pass): step 0's evaluation is read from it instead of run again when
    its tasks, loop and reward are step 0's own (:func:`reuse_start_eval`), else it runs.

    ``engine(model, tok, config, greedy, seed) -> GenerateFn`` decodes the rollouts and checkpoint evals instead of
    the experiment's ``rollout_backend`` (a scripted policy in the reliability study, another engine).
    ``load_fn``: ``models.load_policy`` or a stand-in with its signature; with Unsloth it applies ``init_adapter`` as
    the one trainable LoRA itself (the recipe's fresh LoRA is not added on top).

    GPU: ``loader="unsloth"`` loads through Unsloth (LoRA applied there); ``trainer_overrides`` takes
    ``agentlab.gpu.grpo_overrides(recipe, vllm_mode)`` (bf16, vLLM colocate/server).
    """
    from agentlab.envs import load
    from agentlab.models import load_policy

    if init_adapter is not None and not (Path(init_adapter) / "adapter_config.json").exists():
        raise FileNotFoundError(f"init adapter {init_adapter} has no adapter_config.json")
    if exp.max_staleness and (trainer_overrides or {}).get("use_vllm"):  # GPUs: TRL's own async trainer
        from agentlab.gpu_async import run_async_grpo
        return run_async_grpo(exp, train_tasks, run or RunDir(exp.name), trainer_overrides, init_adapter, overwrite)
    if exp.max_staleness and (engine is not None or world_size() > 1):  # its worker decodes with rollout_backend
        raise ValueError("max_staleness: one process only, no injected engine (it would go unused by the worker)")
    spec = load(exp.env)
    groups_per_process(exp)  # a step that does not split over the processes is refused before any work
    tracking_env(exp.report_to)
    run = run or RunDir(exp.name)
    reward_fn = exp.reward_fn()
    from agentlab.reward_design import check_reward

    check_reward(reward_fn, spec)  # a reward that raises or returns NaN fails here, before any folder or model
    # Every process checks the folder (same verdict everywhere, so none is left waiting for one that failed);
    # only the main process writes to it, here and below.
    main = is_main_process()
    run.prepare({**exp.to_config(), "init_adapter": run.rel(init_adapter) if init_adapter else None},
                overwrite=overwrite, defaults=Experiment().to_config(), write=main)
    if main and exp.rollout_backend == "auto":  # which engine "auto" decodes with here, and why
        from agentlab.engines.choice import choose

        run.write_json("engine.json", choose(exp.precision))
    _threads()
    checkpoints = [] if overwrite else run.checkpoints()  # (the main process may not have emptied the folder yet)
    resume = str(checkpoints[-1]) if checkpoints else None
    if resume and main:
        run.truncate_after(checkpoint_step(resume))

    load_fn = load_fn or load_policy
    if loader == "unsloth":
        model, tok = load_fn(exp.model, loader=loader, recipe=recipe, adapter=init_adapter)
    else:
        model, tok = load_fn(exp.model, loader=loader, recipe=recipe)
        if init_adapter:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(init_adapter), is_trainable=True)
    trainer, stats, checkpoint_eval = build_trainer(
        exp, spec, model, tok, train_tasks, eval_tasks, run, reward_fn=reward_fn, engine=engine,
        peft_config=None if (init_adapter or loader == "unsloth") else lora_config(exp.lora_r),
        trainer_overrides=trainer_overrides)
    if not resume and not (main and start_eval and reuse_start_eval(Path(start_eval), exp, eval_tasks, run)):
        checkpoint_eval(0)
    resume_training(trainer, resume, exp.steps, checkpoint_eval)
    if stats.skipped_in_row >= exp.max_nonfinite:
        raise TrainingDiverged(
            f"GRPO stopped at step {trainer.state.global_step}: {stats.skipped_in_row} updates in a row had non-finite "
            f"gradients and were skipped (see skipped_nonfinite_update in {run.metrics_file}); lower the learning "
            f"rate or check the reward, then resume from the last checkpoint")
    if trainer.accelerator.is_main_process:
        trainer.accelerator.unwrap_model(trainer.model).save_pretrained(run.path / "adapter")
        run.mark_finished({"steps": exp.steps, "adapter": run.rel(run.path / "adapter")})
    trainer.accelerator.wait_for_everyone()
    return run


def build_trainer(exp: Experiment, spec, model, tok, train_tasks: list[Task], eval_tasks: list[Task], run: RunDir, *,
                  reward_fn=None, peft_config=None, trainer_overrides: dict | None = None, engine=None,
                  callbacks=()) -> tuple:
    """The trainer users train with, on a loaded model: TRL's GRPOTrainer (with our step timing) whose rollout is our
    agent loop, the metrics recorder, the non-finite-update guard and checkpoint evals on ``eval_tasks``.

    Returns ``(trainer, stats, checkpoint_eval)``: ``stats`` holds the current step's episodes and timing;
    ``checkpoint_eval(step)`` evaluates the weights as they are into ``run``. ``benchmarks/grpo_step.py`` times it.
    """
    from datasets import Dataset
    from transformers import TrainerCallback

    reward_fn = reward_fn or exp.reward_fn()
    renderer = Renderer(tok, spec.env_class)
    rows = [renderer.grpo_row(t) for t in train_tasks]
    stats = _StepStats()

    Trainer = agent_trainer_class()

    class Recorder(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if not logs or "loss" not in logs or not stats.episodes or not state.is_world_process_zero:
                return
            keep = ("loss", "entropy", "kl", "grad_norm", "learning_rate", "frac_reward_zero_std")
            renamed = {"clip_ratio/region_mean": "clip_ratio", "clip_ratio/low_mean": "clip_ratio_low",
                       "clip_ratio/high_mean": "clip_ratio_high", "completions/mean_length": "completion_length"}
            record = {"step": state.global_step, **{k: logs[k] for k in keep if k in logs},
                      **{ours: logs[trl] for trl, ours in renamed.items() if trl in logs},
                      **step_metrics(stats.episodes, exp.group_size, spec),
                      "time_generate_s": stats.generate_s, "time_step_s": trainer.timing.get("step_s"),
                      "time_forward_s": trainer.timing.get("forward_s"),
                      "time_backward_s": (trainer.timing.get("step_s", 0) - trainer.timing.get("prepare_s", 0)
                                          - trainer.timing.get("forward_s", 0)),
                      "prompts_seen": state.global_step * exp.groups_per_step,
                      "skipped_nonfinite_update": stats.skipped,
                      **({k: stats.batch[k] for k in ("policy_version", "staleness")} | {
                          "time_worker_generate_s": stats.batch["generate_s"],
                          "behaviour_logprob_gap": trainer.timing.get("behaviour_gap")} if stats.batch else {})}
            run.append(run.metrics_file, record)

        def on_train_begin(self, args, state, control, **kw):
            # A kill can land between a save and its eval: evaluate the resumed checkpoint if its eval is missing
            # (evaluate_policy skips those that exist). The cadence is ours, not the one the run began with.
            state.save_steps = args.save_steps
            if state.global_step > 0:
                self.on_save(args, state, control)

        def on_save(self, args, state, control, **kw):
            if exp.evaluates_at(state.global_step):  # a CPU run saves every step (experiment.grpo_kwargs)
                checkpoint_eval(state.global_step)
            if state.is_world_process_zero:  # the checkpoints between evaluations: only a resume needed them
                run.prune_checkpoints(keep=exp.evaluates_at)

    def checkpoint_eval(step: int) -> None:
        """The main process evaluates (one writer); the others wait for it before the next step."""
        if trainer.accelerator.is_main_process:
            evaluate_policy(trainer.accelerator.unwrap_model(trainer.model), tok, spec, eval_tasks, exp, run, step,
                            engine)
        trainer.accelerator.wait_for_everyone()

    take = None
    if exp.max_staleness:
        from agentlab.async_rollouts import trainer_side

        weights, take = trainer_side(exp, run, train_tasks)
        callbacks = (*callbacks, weights)
    trainer = Trainer(
        model=model, reward_funcs=[agentlab_reward],
        args=grpo_config(exp, run.path / "checkpoints", **(trainer_overrides or {})),
        train_dataset=Dataset.from_list(rows), processing_class=tok,
        peft_config=peft_config,
        rollout_func=make_rollout_func(spec, tok, train_tasks, exp, run, stats, reward_fn, engine, take),
        callbacks=[Recorder(), nonfinite_guard(stats, exp.max_nonfinite), *callbacks])
    trainer.off_policy = take is not None  # the update's ratio against the worker's behaviour log-probs
    return trainer, stats, checkpoint_eval


def reuse_start_eval(folder: Path, exp: Experiment, tasks: list[Task], run: RunDir) -> bool:
    """Record ``folder``'s evaluation (``summary.json`` + ``rollouts.jsonl``) as ``run``'s step 0 when it is the one
    :func:`evaluate_policy` would make: the same tasks, the same greedy loop, and the environment's default
    reward (the one it was scored with). Why: a comparison's GRPO starts from an adapter its SFT search has just
    scored on the same validation tasks; on doc_search that second, identical pass cost 7 minutes a seed."""
    import dataclasses
    import json
    import shutil

    from agentlab.evals import read_rollouts, summarize

    summary = json.loads((folder / "summary.json").read_text()) if (folder / "summary.json").exists() else None
    if summary is None or exp.reward_object() is not None or summary.get("samples") != 1:
        return False
    loop = replace(exp.loop(), temperature=0, batch_size=EVAL_BATCH)
    recorded = dict(summary.get("loop") or {})
    if "backend" in recorded:  # summaries written before LoopConfig.backend was named engine
        recorded["engine"] = recorded.pop("backend")
    if recorded != json.loads(json.dumps(dataclasses.asdict(loop))):
        return False
    episodes = read_rollouts(folder / "rollouts.jsonl")[0]
    if sorted(ep.task.id for ep in episodes) != sorted(t.id for t in tasks[: exp.eval_tasks]):
        return False  # (a rollouts file lists episodes in the order they ended, not the tasks')
    (run.path / "evals").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(folder / "rollouts.jsonl", run.path / "evals" / "step-0000.rollouts.jsonl")
    run.write_json("evals/step-0000.json", {"step": 0, **summarize(episodes), "from": run.rel(folder)})
    return True


def evaluate_policy(model, tok, spec, tasks: list[Task], exp: Experiment, run: RunDir, step: int,
                    engine=None) -> dict:
    """Greedy held-out eval with the shared loop; writes ``evals/step-N.json`` (+ rollouts). Skips if present, and
    an interrupted one resumes (:func:`agentlab.pipeline.evaluate_resumable`). ``engine``: as in :func:`run_grpo`."""
    from agentlab.evals import summarize
    from agentlab.pipeline import evaluate_resumable

    name = f"evals/step-{step:04d}.json"
    if (existing := run.read_json(name)) is not None:
        return existing
    loop = replace(exp.loop(), temperature=0, batch_size=EVAL_BATCH)
    episodes = evaluate_resumable(model, tok, spec, tasks[: exp.eval_tasks], run.path / f"{name[:-5]}.rollouts.jsonl",
                                  loop, who=f"{exp.name} step {step}", greedy=True, step=step, model_id=exp.model,
                                  config_id=exp.name, reward_fn=exp.reward_fn(),
                                  generate_fn=engine(model, tok, loop, True, 0) if engine else None)
    run.write_json(name, summary := {"step": step, **summarize(episodes)})
    return summary
