"""Asynchronous GRPO on a CPU (agentlab.async_rollouts): a worker generates ahead, within max_staleness versions."""

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest

from agentlab.async_rollouts import Publisher, batch_file, step_tasks, versions
from agentlab.experiment import ASYNC_DELTA, Experiment, grpo_kwargs
from agentlab.runs import RunDir, read_jsonl

ASYNC = dict(model="tiny-random", env="lookup", steps=4, eval_every=2, eval_tasks=2, groups_per_step=1, group_size=2,
             max_new_tokens=8, max_staleness=1, precision="fp32")


def test_the_setting_is_checked_and_reaches_trls_two_sided_clip(tmp_path):
    with pytest.raises(ValueError, match="max_staleness=-1"):
        Experiment(max_staleness=-1)
    with pytest.raises(ValueError, match="hints"):
        Experiment(max_staleness=1, hint_p=0.5)
    assert grpo_kwargs(Experiment(max_staleness=1), tmp_path)["delta"] == ASYNC_DELTA
    assert "delta" not in grpo_kwargs(Experiment(), tmp_path)  # synchronous: TRL's defaults, as before


def test_on_gpus_the_setting_goes_to_trls_async_trainer_not_our_worker(tmp_path):
    from agentlab.train import run_grpo

    # TRL's async trainer (agentlab.gpu_async) generates on a vLLM server: colocated vLLM is refused before any work
    with pytest.raises(ValueError, match="needs a vLLM server"):
        run_grpo(Experiment(model="tiny-random", max_staleness=1), [], [], run=RunDir(tmp_path / "r"),
                 trainer_overrides={"use_vllm": True, "vllm_mode": "colocate"})
    assert not (tmp_path / "r").exists()
    with pytest.raises(ValueError, match="no injected engine"):  # the worker cannot take a callable
        run_grpo(Experiment(model="tiny-random", max_staleness=1), [], [], run=RunDir(tmp_path / "r"),
                 engine=lambda *a: None)


def test_step_tasks_cover_every_task_once_a_pass_in_a_seeded_order():
    tasks = list(range(6))
    one_pass = [t for s in (1, 2, 3) for t in step_tasks(tasks, 2, 0, s)]
    assert sorted(one_pass) == tasks and one_pass != tasks  # every task once, shuffled
    assert step_tasks(tasks, 2, 0, 4) == step_tasks(tasks, 2, 0, 4) != step_tasks(tasks, 2, 1, 4)


def test_a_resumed_run_drops_the_batches_and_weights_its_dead_trainer_left_ahead(tmp_path):
    folder = tmp_path / "async"
    for v in (1, 2, 3):
        (folder / "weights" / f"v{v}").mkdir(parents=True)
    for step, version in ((2, 1), (3, 2), (4, 3)):  # step 2: consumed before the checkpoint; 4: drawn by v3, lost
        batch_file(folder, step).write_text(json.dumps({"step": step, "policy_version": version}) + "\n")
    Publisher(Experiment(max_staleness=1), folder, [], start_step=2)
    assert versions(folder) == [1, 2]
    assert sorted(p.name for p in folder.glob("batch-*")) == ["batch-00003.jsonl"]  # drawn by v2: still valid


def test_the_torch_engine_reports_the_log_prob_each_token_was_drawn_with():
    import torch

    from agentlab.engines.torch import hf_generate_fn
    from agentlab.envs import load
    from agentlab.models import load_policy
    from agentlab.rollout import LoopConfig

    model, tok = load_policy("tiny-random")
    config = LoopConfig.of(load("lookup"), max_new_tokens=6, temperature=0.7, precision="fp32")
    seqs = [[1, 2, 3, 4], [1, 2, 5]]
    rows = hf_generate_fn(model, tok, config, greedy=False, seed=0, logprobs=True, prefix_cache=False)(seqs)
    for seq, row in zip(seqs, rows, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([seq + list(row)])).logits[0, len(seq) - 1:-1].float() / 0.7
        want = torch.log_softmax(logits, -1).gather(1, torch.tensor(list(row))[:, None]).squeeze(1)
        assert len(row.logprobs) == len(row) and torch.allclose(torch.tensor(row.logprobs), want, atol=1e-4)


def _train(tmp_path, **overrides):
    from agentlab.envs import load
    from agentlab.train import run_grpo

    spec = load("lookup")
    train, val = spec.make_tasks("train", 8, seed=0), spec.make_tasks("validation", 2, seed=0)
    run = RunDir(tmp_path / "async-run")
    run_grpo(Experiment(name="async-run", **{**ASYNC, **overrides}), train, val, run=run)
    return run


def _assert_each_step_once_within_staleness(run: RunDir, steps: int = 4, k: int = 1) -> list[dict]:
    metrics, torn = read_jsonl(run.metrics_file)
    assert torn == 0 and [m["step"] for m in metrics] == list(range(1, steps + 1))
    for m in metrics:
        assert 0 <= m["staleness"] == m["step"] - 1 - m["policy_version"] <= k
        assert m["behaviour_logprob_gap"] is not None and m["behaviour_logprob_gap"] < 1.0
    rollouts, torn = read_jsonl(run.rollouts_file)
    assert torn == 0 and sorted((r["step"], r["sample"]) for r in rollouts) == [
        (s, i) for s in range(1, steps + 1) for i in (0, 1)]
    for r in rollouts:  # the behaviour log-prob of every completion token travels with the episode
        assert len(r["tokens"]["logprobs"]) == len(r["tokens"]["completion_ids"])
    assert run.finished and not list((run.path / "async").glob("batch-*"))
    return metrics


def test_an_async_run_trains_each_step_once_even_when_its_worker_is_killed_minus_9(tmp_path, monkeypatch):
    """K = 1: every step's groups drawn by a policy at most one update old, each recorded once with its version and
    behaviour log-probs; the worker, killed after the first update, is restarted; none is left running at the end."""
    started, publish, start = [], Publisher.publish, Publisher.start

    def start_and_note(self, after):
        start(self, after)
        started.append(self.proc.pid)

    def publish_then_kill(self, model, version):  # the worker dies right after the first update reaches it
        publish(self, model, version)
        if version == 1 and len(started) == 1:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.join()

    monkeypatch.setattr(Publisher, "start", start_and_note)
    monkeypatch.setattr(Publisher, "publish", publish_then_kill)
    run = _train(tmp_path)
    assert len(started) == 2  # one restart: step 4 needs version 2, which no batch drawn before the kill can have
    metrics = _assert_each_step_once_within_staleness(run)
    assert metrics[0]["policy_version"] == 0  # step 1 can only be drawn by the start
    assert not [p for p in multiprocessing.active_children() if p.name == "agentlab-rollout-worker"]


@pytest.mark.slow
def test_the_trainer_killed_minus_9_resumes_with_every_record_once(tmp_path):
    env = {**os.environ, "AGENTLAB_RUNS": str(tmp_path / "runs"), "AGENTLAB_DATA": str(tmp_path / "data")}
    cli = [sys.executable, "-m", "agentlab.cli"]
    synth = subprocess.run([*cli, "synth", "--train", "8", "--validation", "2", "--test", "4", "--demos", "2"],
                           env=env, capture_output=True, text=True, timeout=300, check=False)
    assert synth.returncode == 0, synth.stdout + synth.stderr
    train = [*cli, "train", "--name", "async", "--model", "tiny-random", "--steps", "4", "--eval-every", "2",
             "--eval-tasks", "2", "--groups-per-step", "1", "--group-size", "2", "--max-new-tokens", "8",
             "--max-staleness", "1", "--precision", "fp32"]
    run = RunDir(tmp_path / "runs" / "async")
    proc = subprocess.Popen(train, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while not run.checkpoints() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert run.checkpoints(), "no checkpoint in time"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not run.finished
    again = subprocess.run(train, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    _assert_each_step_once_within_staleness(run)
