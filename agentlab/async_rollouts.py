"""Asynchronous GRPO on a CPU: a generation worker samples the next steps' groups while the trainer updates on the
last ones, each group at most ``Experiment.max_staleness`` policy versions old.

Why by hand: TRL's own asynchronous trainer (``AsyncGRPOConfig`` with a vLLM server; ``agentlab.gpu_async``
maps ``max_staleness`` onto it on GPUs) needs vLLM, and vLLM needs a GPU. On a CPU this small worker is the same
idea with our agent loop: one process generates, the other trains, and weights flow back after every update.

The protocol is files in ``<run>/async/``, each written under a temporary name and renamed, so that a reader never
sees half of one and either process can be killed at any moment:

- ``weights/v<k>/``: the LoRA adapter after ``k`` updates, published by the trainer (``k`` = the step it resumed
  from, at the start; then after every optimiser step);
- ``batch-<n>.jsonl``: training step ``n``'s episodes, a header line ``{"step", "policy_version", ...}`` first. The
  worker writes step ``n`` once version ``n - 1 - K`` exists, with the newest version it finds; staleness is
  ``(n - 1) - policy_version``, between 0 and K. Each episode carries the log-probability every completion token
  was drawn with (the behaviour policy's): the trainer's update takes its clipped importance ratio against them.

Tasks: the worker decides which tasks each step trains on (a seeded order over the training tasks, reshuffled each
pass), as every asynchronous trainer's generator does; TRL's sampled prompts are not used. Resume: records reach
``rollouts.jsonl`` when the trainer consumes a batch, so ``run_grpo``'s truncation after the last checkpoint keeps
each exactly once; batches and weights newer than that checkpoint are dropped; a worker that died is restarted and
starts at the first step without a batch.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path

POLL_S = 0.05


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)


def worker_threads() -> int:
    """The worker's share of this machine's cores (``AGENTLAB_WORKER_THREADS``, default half); the trainer keeps
    the rest, so that the two processes overlap instead of fighting over the same cores."""
    return max(1, int(os.environ.get("AGENTLAB_WORKER_THREADS", _cores() // 2)))


def trainer_threads() -> int:
    return max(1, _cores() - worker_threads())


def step_tasks(tasks: list, groups_per_step: int, seed: int, step: int) -> list:
    """The tasks of training step ``step`` (1-based): consecutive slices of a seeded order, reshuffled each pass.

    >>> step_tasks(list(range(5)), 2, 0, 1) != step_tasks(list(range(5)), 2, 0, 2)
    True
    """
    out, per_pass = [], len(tasks)
    start = (step - 1) * groups_per_step
    for i in range(start, start + groups_per_step):
        order = random.Random(seed * 7_919 + i // per_pass).sample(range(per_pass), per_pass)
        out.append(tasks[order[i % per_pass]])
    return out


def _atomic_dir(src_writer, target: Path) -> None:
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    src_writer(tmp)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)


def versions(folder: Path) -> list[int]:
    """Published weight versions, oldest first."""
    return sorted(int(p.name[1:]) for p in (folder / "weights").glob("v*") if p.name[1:].isdigit())


def batch_file(folder: Path, step: int) -> Path:
    return folder / f"batch-{step:05d}.jsonl"


def read_batch(path: Path) -> tuple[dict, list]:
    from agentlab.types import Episode

    header, *lines = path.read_text().splitlines()
    return json.loads(header), [Episode.from_json(line) for line in lines]


class Publisher:
    """The trainer's side: publishes weights, reads batches, keeps one worker alive."""

    def __init__(self, exp, folder: Path, tasks: list, start_step: int):
        self.exp, self.folder, self.tasks = exp, Path(folder), tasks
        self.proc = None
        self.restarts = 0
        (self.folder / "weights").mkdir(parents=True, exist_ok=True)
        for v in versions(self.folder):  # a resumed run: what the killed trainer published after its checkpoint
            if v > start_step:
                shutil.rmtree(self.folder / "weights" / f"v{v}")
        for p in self.folder.glob("batch-*.jsonl"):
            step = int(p.stem.split("-")[1])
            if step <= start_step or json.loads(p.open().readline())["policy_version"] > start_step:
                p.unlink()

    def publish(self, model, version: int) -> None:
        """The weights after ``version`` updates, for the worker; versions it can no longer use are removed."""
        _atomic_dir(lambda tmp: model.save_pretrained(tmp), self.folder / "weights" / f"v{version}")
        for v in versions(self.folder):
            if v < version - self.exp.max_staleness - 1:
                shutil.rmtree(self.folder / "weights" / f"v{v}", ignore_errors=True)

    def start(self, after: int) -> None:
        """Start the worker at the first step after ``after`` that has no batch."""
        import multiprocessing as mp

        ctx = mp.get_context("spawn")  # a fresh interpreter: no torch threads or locks copied from the trainer
        self.proc = ctx.Process(target=worker_main, args=(self.exp, str(self.folder), self.tasks, os.getpid(), after),
                                daemon=True, name="agentlab-rollout-worker")
        self.proc.start()

    def take(self, step: int, timeout_s: float = 3600.0) -> tuple[dict, list]:
        """Step ``step``'s batch, waiting for the worker (restarted if it died, up to 3 times)."""
        path, t0 = batch_file(self.folder, step), time.time()
        while not path.exists():
            if self.proc is None or not self.proc.is_alive():
                if self.proc is not None and self.restarts >= 3:
                    raise RuntimeError(f"the rollout worker died {self.restarts + 1} times (exit code "
                                       f"{self.proc.exitcode}); see its error above")
                self.restarts += self.proc is not None
                self.start(after=step - 1)
            if time.time() - t0 > timeout_s:
                raise TimeoutError(f"no batch for step {step} after {timeout_s:.0f} s")
            time.sleep(POLL_S)
        header, episodes = read_batch(path)
        path.unlink()  # consumed: its episodes go to the run's records now (a resume regenerates what it loses)
        if header.get("trainer") != os.getpid():  # a killed trainer's worker, still finishing: drawn for that run
            return self.take(step, timeout_s - (time.time() - t0))
        header["waited_s"] = round(time.time() - t0, 3)
        return header, episodes

    def close(self) -> None:
        (self.folder / "STOP").touch()
        if self.proc is not None:
            self.proc.join(timeout=30)
            if self.proc.is_alive():
                self.proc.terminate()
        (self.folder / "STOP").unlink(missing_ok=True)


def worker_main(exp, folder: str, tasks: list, parent: int, after: int) -> None:
    """The generation worker: for each step after ``after`` without a batch, wait for a version recent enough, load the newest one,
    sample the step's groups with the behaviour log-probs, write the batch. Exits at the last step, on ``STOP``, or
    when the trainer that started it is gone."""
    import torch
    from peft import PeftModel, set_peft_model_state_dict
    from safetensors.torch import load_file

    from agentlab.engines import make
    from agentlab.envs import load
    from agentlab.models import load_policy
    from agentlab.rollout import run_episodes

    folder = Path(folder)
    torch.set_num_threads(worker_threads())
    spec, config, reward_fn = load(exp.env), exp.loop(), exp.reward_fn()
    model, tok, loaded = None, None, None
    step = after + 1
    while step <= exp.steps:
        while _ours(batch_file(folder, step), parent):
            step += 1
        if step > exp.steps:
            break
        need = step - 1 - exp.max_staleness
        while True:
            if (folder / "STOP").exists() or not _alive(parent):
                return
            have = versions(folder)
            if have and have[-1] >= need:
                break
            time.sleep(POLL_S)
        version = have[-1]
        path = folder / "weights" / f"v{version}"
        if model is None:
            base, tok = load_policy(exp.model)
            model = PeftModel.from_pretrained(base, str(path))
        elif version != loaded:
            set_peft_model_state_dict(model, load_file(str(path / "adapter_model.safetensors")))
        loaded = version
        model.eval()
        seed = exp.seed * 100_003 + step
        t0 = time.time()
        with torch.no_grad():
            episodes = run_episodes(model, tok, spec, step_tasks(tasks, exp.groups_per_step, exp.seed, step),
                                    samples=exp.group_size, config=config, seed=seed, progress=False, step=step,
                                    model_id=exp.model, config_id=exp.name, reward_fn=reward_fn,
                                    generate_fn=make(config.engine, model, tok, config, False, seed, logprobs=True))
        header = {"step": step, "policy_version": version, "staleness": step - 1 - version,
                  "generate_s": round(time.time() - t0, 3), "trainer": parent}
        if not _alive(parent):  # the trainer was killed meanwhile: this batch belongs to no run
            return
        target = batch_file(folder, step)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text("\n".join([json.dumps(header), *(ep.to_json() for ep in episodes)]) + "\n")
        tmp.rename(target)
        step += 1


def _ours(path: Path, trainer: int) -> bool:
    """A batch exists at ``path``, drawn for ``trainer`` (not left by a killed one)."""
    try:
        return json.loads(path.open().readline()).get("trainer") == trainer
    except (FileNotFoundError, json.JSONDecodeError):
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def trainer_side(exp, run, tasks: list):
    """``(callback, take)`` for ``build_trainer``: the callback publishes the weights at the start (or the resumed
    step) and after every update and stops the worker at the end; ``take(step)`` is step ``step``'s batch."""
    from transformers import TrainerCallback

    holder: dict = {}

    class AsyncWeights(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kw):
            import torch

            torch.set_num_threads(trainer_threads())
            holder["publisher"] = Publisher(exp, run.path / "async", tasks, state.global_step)
            holder["publisher"].publish(model, state.global_step)
            holder["publisher"].start(after=state.global_step)

        def on_step_end(self, args, state, control, model=None, **kw):
            holder["publisher"].publish(model, state.global_step)

        def on_train_end(self, args, state, control, **kw):
            holder["publisher"].close()

    return AsyncWeights(), lambda step: holder["publisher"].take(step)
