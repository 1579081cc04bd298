"""Training path: config validation, SFT rows, TRL configuration, kill -9 resume, and a quickstart smoke run."""

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from agentlab.engines.scripted import scripted_generate_fn
from agentlab.envs import load
from agentlab.rollout import Renderer, run_episodes
from agentlab.runs import RunDir, RunExistsError, read_jsonl
from agentlab.synth import expert_demos, tokenize_demos
from agentlab.train import Experiment, grpo_config, run_grpo

SPEC = load("lookup")


@pytest.mark.parametrize("kwargs, message", [
    ({"env": "nope"}, "env='nope': unknown environment 'nope'"),
    ({"lr": -1.0}, "lr=-1.0 must be > 0"),
    ({"group_size": 1}, "group_size=1 must be >= 2"),
    ({"max_turns": 0}, "max_turns=0 must be >= 1"),
    ({"report_to": ("tensorboard",)}, "report_to"),
])
def test_bad_experiment_is_refused_before_any_work(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Experiment(**kwargs)


def test_missing_adapter_is_refused_before_any_work(tmp_path):
    run = RunDir(tmp_path / "r")
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        run_grpo(Experiment(model="tiny-random"), [], [], init_adapter=tmp_path / "nothing", run=run)
    assert not run.path.exists()  # nothing written


def test_cli_reports_bad_config_in_one_line(tmp_path):
    env = {**os.environ, "AGENTLAB_RUNS": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "agentlab.cli", "train", "--lr", "-1", "--group-size", "1"],
                         capture_output=True, text=True, env=env, check=False)
    assert out.returncode == 2
    assert "lr=-1.0 must be > 0" in out.stderr and "group_size=1" in out.stderr and "Traceback" not in out.stderr


def test_sft_rows_are_the_rollout_tokens(tiny):
    """SFT trains on exactly the tokens the agent loop produces (demos rendered with the trainer's tool order),
    and only on the assistant's turns. The training template also trains the newline after each assistant
    header and after the final end-of-turn, tokens the policy never has to generate; we allow only those."""
    _, tok = tiny
    tasks = SPEC.make_tasks("train", 4, seed=2)
    rows = tokenize_demos(expert_demos(SPEC, tasks), tok)
    renderer = Renderer(tok, SPEC.env_class)
    eps = run_episodes(None, tok, SPEC, tasks, generate_fn=scripted_generate_fn(renderer, tasks, SPEC.expert),
                       progress=False)
    newline = tok.encode("\n")
    for row, ep in zip(rows, eps, strict=True):
        seq = ep.tokens["prompt_ids"] + ep.tokens["completion_ids"]
        assert row["input_ids"][: len(seq)] == seq and row["input_ids"][len(seq):] == newline
        mask = [0] * len(ep.tokens["prompt_ids"]) + ep.tokens["mask"]
        diff = [i for i, (a, b) in enumerate(zip(mask, row["assistant_masks"])) if a != b]
        assert all(seq[i] == newline[0] and row["assistant_masks"][i] == 1 for i in diff)
        assert len(diff) <= len(ep.turns) + 1


def test_grpo_config_maps_the_experiment(tmp_path):
    exp = Experiment(groups_per_step=3, group_size=4, beta=0.0, temperature=0.7, lr=1e-4, steps=7, eval_every=2)
    cfg = grpo_config(exp, tmp_path)
    assert cfg.per_device_train_batch_size == 12 and cfg.num_generations == 4
    assert cfg.beta == 0.0 and cfg.temperature == 0.7 and cfg.learning_rate == 1e-4 and cfg.max_steps == 7
    assert cfg.lr_scheduler_type == "constant" and not cfg.gradient_checkpointing
    # on a CPU a checkpoint every step (minutes a step: a stop loses one at most); a GPU keeps the eval cadence
    assert cfg.save_steps == 1 and grpo_config(exp, tmp_path, use_cpu=False, bf16=False).save_steps == 2


def _cli(args, env, **kw):
    return subprocess.Popen([sys.executable, "-m", "agentlab.cli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


TRAIN = ["train", "--name", "resume", "--model", "tiny-random", "--steps", "3", "--eval-every", "1",
         "--eval-tasks", "2", "--groups-per-step", "1", "--group-size", "2", "--max-new-tokens", "8"]


def _synthesised(tmp_path) -> dict:
    """Environment variables of a fresh data and runs folder under ``tmp_path``, with lookup tasks synthesised."""
    env = {**os.environ, "AGENTLAB_RUNS": str(tmp_path / "runs"), "AGENTLAB_DATA": str(tmp_path / "data")}
    synth = _cli(["synth", "--train", "8", "--validation", "2", "--test", "4", "--demos", "2"], env)
    assert synth.wait(timeout=300) == 0, synth.stdout.read()
    return env


def _resumes_exactly(run: RunDir, env: dict, trained_rollouts) -> None:
    """Start the same training again: it finishes, and the run holds each metric line and rollout exactly once."""
    again = _cli(TRAIN, env)
    log = again.communicate(timeout=600)[0]
    assert again.returncode == 0, log
    metrics, torn = read_jsonl(run.metrics_file)
    assert torn == 0 and [m["step"] for m in metrics] == [1, 2, 3]
    rollouts, torn = read_jsonl(run.rollouts_file)
    assert torn == 0 and sorted(trained_rollouts(r) for r in rollouts) == sorted(
        trained_rollouts({"step": s, "group": 0, "sample": k}) for s in (1, 2, 3) for k in (0, 1))


def test_resume_after_kill_minus_9(tmp_path):
    env = _synthesised(tmp_path)
    run = RunDir(tmp_path / "runs" / "resume")

    proc = _cli(TRAIN, env)
    deadline = time.time() + 300
    while not run.checkpoints() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert run.checkpoints(), proc.stdout.read() if proc.poll() is not None else "no checkpoint in time"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not run.finished
    # the kill may land between a checkpoint's save and its eval: make that case certain
    last = int(run.checkpoints()[-1].name.split("-")[1])
    (run.evals_dir / f"step-{last:04d}.json").unlink(missing_ok=True)

    _resumes_exactly(run, env, lambda r: r["step"])
    assert sorted(p.name for p in run.evals_dir.glob("step-*.json")) == [
        f"step-000{i}.json" for i in range(4)]
    assert run.finished and (run.path / "adapter" / "adapter_config.json").exists()

    refused = _cli(TRAIN, env)
    out = refused.communicate(timeout=120)[0]
    assert refused.returncode == 2 and "is finished; pass --overwrite" in out


# A run killed (SIGKILL, nothing flushed or cleaned up) at a chosen point of step 2: half a line written, then dead.
KILLER = """
import json, os, signal, sys
from agentlab import evals, runs
from transformers.trainer_callback import TrainerState

def die():
    os.kill(os.getpid(), signal.SIGKILL)

point = sys.argv[1]
if point == "rollout":  # while step 2's rollouts are being appended
    real_append = runs.RunDir.append
    def append(self, file, record):
        if file == self.rollouts_file and '"step": 2' in (record if isinstance(record, str) else json.dumps(record)):
            with open(file, "a") as fh:
                fh.write(str(record)[:40])
            die()
        real_append(self, file, record)
    runs.RunDir.append = append
elif point == "checkpoint":  # while checkpoint-2's trainer state is being written
    real_save = TrainerState.save_to_json
    def save_to_json(self, path):
        if self.global_step == 2:
            with open(path, "w") as fh:
                fh.write('{"global_step": 2, "log_hi')
            die()
        real_save(self, path)
    TrainerState.save_to_json = save_to_json
elif point == "disk":  # the disk fills up while checkpoint-2's trainer state is written
    import errno
    real_save = TrainerState.save_to_json
    def save_to_json(self, path):
        if self.global_step == 2:
            with open(path, "w") as fh:
                fh.write('{"global_step": 2, "log_hi')
            raise OSError(errno.ENOSPC, "No space left on device", path)
        real_save(self, path)
    TrainerState.save_to_json = save_to_json
elif point == "eval":  # during the checkpoint-2 evaluation
    real_write = evals.write_episode
    def write_episode(fh, ep):
        if "evals/step-0002" in getattr(fh, "name", ""):
            fh.write(ep.to_json()[:50])
            fh.flush()
            die()
        real_write(fh, ep)
    evals.write_episode = write_episode
from agentlab.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("point", [pytest.param("rollout", marks=pytest.mark.slow), "checkpoint",
                                   pytest.param("eval", marks=pytest.mark.slow)])
def test_kill_minus_9_mid_rollout_mid_checkpoint_mid_eval_resumes_exactly(point, tmp_path):
    """SIGKILL in the middle of a write (step 2's rollouts, checkpoint-2's trainer state, checkpoint-2's eval): the
    next start resumes from the last complete checkpoint and the finished run holds every record exactly once."""
    env = _synthesised(tmp_path)
    run = RunDir(tmp_path / "runs" / "resume")
    killed = subprocess.run([sys.executable, "-c", KILLER, point, *TRAIN], env=env, capture_output=True, text=True,
                            timeout=600, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-2000:]
    assert not run.finished
    _resumes_exactly(run, env, lambda r: (r["step"], r["group"], r["sample"]))
    for step in range(4):
        assert json.loads((run.evals_dir / f"step-000{step}.json").read_text())["step"] == step
        assert len(read_jsonl(run.evals_dir / f"step-000{step}.rollouts.jsonl")[0]) == 2
    assert run.finished and (run.path / "adapter" / "adapter_config.json").exists()


def test_a_killed_run_packed_and_unpacked_on_another_machine_resumes_exactly(tmp_path):
    """Killed while checkpoint-2 was written, packed (agentlab pack: the torn checkpoint left behind, checkpoint-1
    whole) and unpacked under another runs folder, the run resumes there and holds every record exactly once."""
    env = _synthesised(tmp_path)
    killed = subprocess.run([sys.executable, "-c", KILLER, "checkpoint", *TRAIN], env=env, capture_output=True,
                            text=True, timeout=600, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-2000:]
    packed = _cli(["pack", "resume", "--to", str(tmp_path / "carry")], env)
    assert packed.wait(timeout=120) == 0, packed.stdout.read()
    carried = tmp_path / "carry" / "resume" / "checkpoints"
    assert [p.name for p in carried.iterdir() if p.is_dir()] == ["checkpoint-1"] and (carried / "checkpoint-1/optimizer.pt").exists()
    elsewhere = {**env, "AGENTLAB_RUNS": str(tmp_path / "elsewhere")}
    unpacked = _cli(["unpack", str(tmp_path / "carry")], elsewhere)
    assert unpacked.wait(timeout=120) == 0, unpacked.stdout.read()
    run = RunDir(tmp_path / "elsewhere" / "resume")
    _resumes_exactly(run, elsewhere, lambda r: (r["step"], r["group"], r["sample"]))
    assert run.finished and not RunDir(tmp_path / "runs" / "resume").finished


def test_a_full_disk_on_checkpoint_is_one_line_and_the_run_resumes(tmp_path):
    env = _synthesised(tmp_path)
    full = subprocess.run([sys.executable, "-c", KILLER, "disk", *TRAIN], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert full.returncode == 2 and "Traceback" not in full.stderr, full.stderr[-2000:]
    errors = [x for x in full.stderr.splitlines() if "agentlab train: error:" in x]
    assert len(errors) == 1 and "the disk is full while writing" in errors[0] and "checkpoint-2" in errors[0]
    run = RunDir(tmp_path / "runs" / "resume")
    assert [p.name for p in run.checkpoints()] == ["checkpoint-1"]  # the torn one is not taken for complete
    _resumes_exactly(run, env, lambda r: (r["step"], r["group"], r["sample"]))
    assert run.finished


def test_a_run_folder_from_an_older_version_resumes_and_a_corrupt_one_is_named(tmp_path):
    run = RunDir(tmp_path / "r")
    run.prepare(Experiment(steps=3), defaults=Experiment().to_config())
    old = json.loads(run.config_file.read_text())
    for added_since in ("loss_type", "scale_rewards", "max_nonfinite"):  # fields newer than the folder, at defaults
        old.pop(added_since)
    run.config_file.write_text(json.dumps(old))
    run.prepare(Experiment(steps=3), defaults=Experiment().to_config())  # resumes
    with pytest.raises(RunExistsError, match="different config.*loss_type"):
        run.config_file.write_text(json.dumps(old))
        run.prepare(Experiment(steps=3, loss_type="grpo"), defaults=Experiment().to_config())
    run.config_file.write_text('{"steps": 3, "lr')
    with pytest.raises(RunExistsError, match="not valid JSON"):
        run.prepare(Experiment(steps=3))


def test_changed_config_is_not_silently_resumed(tmp_path):
    run = RunDir(tmp_path / "r")
    run.prepare(Experiment(steps=3))
    with pytest.raises(RunExistsError, match="different config.*steps"):
        run.prepare(Experiment(steps=4))


def test_quickstart_smoke_end_to_end(tmp_path):
    """The fast end-to-end run CI keeps: synth → base eval → SFT search → GRPO → matched SFT → test evals →
    report (tiny model)."""
    env = {**os.environ, "AGENTLAB_RUNS": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "agentlab.cli", "quickstart", "--smoke"], env=env,
                         capture_output=True, text=True, timeout=900, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads((tmp_path / "quickstart-smoke" / "report.json").read_text())
    for stage in ("base", "sft", "grpo", "sft_matched"):
        assert {"success", "ci_low", "ci_high", "n"} <= set(report[stage]) and report[stage]["n"] == 6
        assert report[stage]["ci_low"] <= report[stage]["success"] <= report[stage]["ci_high"]
    for key in ("grpo_minus_sft", "grpo_minus_sft_matched"):
        assert report[key]["ci_low"] <= report[key]["mean"] <= report[key]["ci_high"]
    # the compute-matched SFT really continued the SFT (at least one more step) for GRPO's training seconds
    root = tmp_path / "quickstart-smoke"
    matched = json.loads((root / "sft_matched" / "sft_summary.json").read_text())
    grpo_s = sum(m["time_step_s"] for m in RunDir(root / "grpo").metrics())
    assert matched["steps"] >= report["sft_matched"]["extra_steps"] >= 1 and matched["seconds"] >= grpo_s
    # ... from the SFT adapter chosen on validation, which the later notebooks find at sft/adapter
    sft_choice = report["choices"]["sft_best"]
    assert (root / "sft_matched" / matched["init_adapter"]).resolve() == (root / sft_choice["adapter"]).resolve() and (report["sft"]["lr"], report["sft"]["steps"]) == \
        (sft_choice["lr"], sft_choice["steps"]) and (root / "sft" / "adapter" / "adapter_config.json").exists()
    assert {(t["lr"], t["steps"]) for t in report["tried"] if t["arm"] == "sft_best"} == {(1e-3, 1), (1e-3, 2)}
    # SFT saw only the regime's demonstrations: the cheap strategy's successes, a one-word search each
    for line in (root / "tasks" / "demos.jsonl").read_text().splitlines():
        first_call = next(m for m in json.loads(line)["messages"] if m["role"] == "assistant")["tool_calls"][0]
        assert len(first_call["function"]["arguments"]["query"].split()) == 1
    test_ids = {json.loads(line)["id"] for line in (root / "tasks" / "test.jsonl").read_text().splitlines()}
    for stage, path in report["rollouts"].items():
        assert {json.loads(line)["task"]["id"] for line in (root / path).read_text().splitlines()} == test_ids, stage
    # checkpoint evals during training read validation tasks; the test split is only read by the final evals
    val_ids = {json.loads(line)["id"] for line in (root / "tasks" / "validation.jsonl").read_text().splitlines()}
    for path in (root / "grpo" / "evals").glob("*.rollouts.jsonl"):
        assert {json.loads(line)["task"]["id"] for line in path.read_text().splitlines()} <= val_ids
    assert (tmp_path / "quickstart-smoke" / "report.png").stat().st_size > 10_000
    # one seed, said so; no measured spread for the smoke's setting (the real one's: test_compare)
    assert report["one_seed"] == {"seed": 0, "grpo_spread": None} and "one seed (0)" in out.stdout
    metrics = RunDir(tmp_path / "quickstart-smoke" / "grpo").metrics()
    assert [m["step"] for m in metrics] == [1, 2]
    assert {"reward_mean", "zero_variance_groups", "valid_rollouts", "entropy", "time_generate_s",
            "time_forward_s", "time_backward_s", "tool_failures", "off_form_calls", "clip_ratio",
            "completion_length"} <= set(metrics[0])


def test_tracking_is_opt_in_and_wandb_defaults_to_offline(tmp_path, monkeypatch):
    from agentlab.experiment import tracking_env as _tracking_env
    from agentlab.train import grpo_kwargs

    assert grpo_kwargs(Experiment(), tmp_path)["report_to"] == []
    assert grpo_kwargs(Experiment(report_to=("wandb", "trackio")), tmp_path)["report_to"] == ["wandb", "trackio"]
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    _tracking_env(("wandb",))
    assert os.environ["WANDB_MODE"] == "offline"


@pytest.mark.parametrize("buckets", ["by_length", "one", "each_row"])
def test_shared_prefix_forward_matches_trl_logps_and_gradients(tiny, tmp_path, scripted_batch, monkeypatch, buckets):
    """The shared-prefix forward computes the same per-token log-probs and LoRA gradients as TRL's own, however the
    remainders are bucketed (by length, all in one, each row alone)."""
    import torch

    from agentlab import trl_compat

    if buckets != "by_length":
        monkeypatch.setattr(trl_compat, "_length_buckets", lambda lengths: [list(range(len(lengths)))]
                            if buckets == "one" else [[i] for i in range(len(lengths))])
    from datasets import Dataset
    from peft import get_peft_model

    from agentlab.models import load_policy
    from agentlab.train import agent_trainer_class, agentlab_reward, lora_config

    # a fresh tiny model: the session's one may carry an earlier trainer's patched forward (a closure that a deep
    # copy would keep pointing at the original), and wrapping it in LoRA here would change it for later tests
    base, tok = load_policy("tiny-random")
    model = get_peft_model(base, lora_config(4))
    with torch.no_grad():  # non-zero LoRA B so the adapter matters
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    tasks = SPEC.make_tasks("train", 3, seed=9)
    renderer = Renderer(tok, SPEC.env_class)
    ids, mask, C = scripted_batch(tok, tasks)
    rows = [{"prompt": renderer.messages(t), "task": t.to_json()} for t in tasks]
    trainer = agent_trainer_class()(model=model, reward_funcs=[agentlab_reward], train_dataset=Dataset.from_list(rows),
                                    args=grpo_config(Experiment(model="tiny-random", precision="fp32"), tmp_path), processing_class=tok)
    results = {}
    for shared in (False, True):
        trainer.shared_prefix = shared
        model.zero_grad()
        logps, entropy, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, C, compute_entropy=True)
        (logps * mask[:, -C:]).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        results[shared] = (logps.detach(), entropy.detach(), grads)
    from agentlab.trl_compat import shared_prefix_logps

    assert shared_prefix_logps(model, ids, mask, C) is not None  # the shared path really ran
    keep = mask[:, -C:].bool()
    assert torch.allclose(results[True][0][keep], results[False][0][keep], atol=1e-4)
    assert torch.allclose(results[True][1][keep], results[False][1][keep], atol=1e-4)
    for name, g in results[False][2].items():
        assert torch.allclose(results[True][2][name], g, atol=1e-5, rtol=1e-3), name


@pytest.mark.parametrize("micro_batch", [0, 2])
def test_dropping_flat_rows_leaves_the_gradient_as_it_was(tiny, tmp_path, scripted_batch, micro_batch):
    """Rollouts whose advantage is exactly 0 left out of the forward and backward (``drop_flat_rows``): the LoRA
    gradient of TRL's dapo loss is the one every row gives, whether the step runs in one pass or in micro-batches
    (``micro_batch``: some of them hold only flat rows); a step of only flat rows trains one row and gets a gradient
    of exactly zero."""
    import torch
    from datasets import Dataset
    from peft import get_peft_model

    from agentlab.models import load_policy
    from agentlab.train import agent_trainer_class, agentlab_reward, lora_config

    base, tok = load_policy("tiny-random")
    model = get_peft_model(base, lora_config(4))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    tasks = SPEC.make_tasks("train", 4, seed=9)
    ids, mask, C = scripted_batch(tok, tasks)  # 8 rows: 4 groups of 2
    rows = [{"prompt": Renderer(tok, SPEC.env_class).messages(t), "task": t.to_json()} for t in tasks]
    exp = Experiment(model="tiny-random", precision="fp32", groups_per_step=4, group_size=2, micro_batch=micro_batch)
    trainer = agent_trainer_class()(model=model, reward_funcs=[agentlab_reward], train_dataset=Dataset.from_list(rows),
                                    args=grpo_config(exp, tmp_path), processing_class=tok)
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    model.train()
    batch = {"prompt_ids": ids[:, :-C], "prompt_mask": mask[:, :-C], "completion_ids": ids[:, -C:],
             "completion_mask": mask[:, -C:], "num_items_in_batch": mask[:, -C:].sum()}
    micro = trainer.args.per_device_train_batch_size

    def gradient(advantages: list[float], drop: bool) -> tuple[dict, int]:
        trainer.drop_flat_rows, trainer.timing = drop, {}
        model.zero_grad()
        full = {**batch, "advantages": torch.tensor(advantages)}
        for start in range(0, len(advantages), micro):  # TRL's micro-batches, gradients accumulated
            part = {k: v[start:start + micro] if v.dim() else v for k, v in full.items()}
            trainer.compute_loss(model, part).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        return grads, trainer.timing["trained_rows"]

    # groups 0 and 2 flat; the others' advantages do not cancel (a group's two scripted rollouts can be the same)
    signal = [0.0, 0.0, 0.9, 0.3, 0.0, 0.0, -0.5, 0.2]
    every, trained_all = gradient(signal, drop=False)
    dropped, trained = gradient(signal, drop=True)
    # every row with a signal, and one row of each micro-batch that has none (micro_batch 2: the flat groups' passes)
    assert (trained_all, trained) == (8, 4 if micro == 8 else 6)
    scale = max(float(g.abs().max()) for g in every.values())
    assert scale > 0
    for name, g in every.items():
        assert torch.allclose(dropped[name], g, atol=1e-5 * scale, rtol=1e-4), name
    flat, trained = gradient([0.0] * 8, drop=True)
    assert trained == (1 if micro == 8 else 8 // micro)  # one row a micro-batch
    assert not any(bool(g.any()) for g in flat.values())


def test_dropping_flat_rows_is_refused_where_a_flat_row_adds_to_the_loss():
    with pytest.raises(ValueError, match="drop_flat_rows with loss_type='grpo'"):
        Experiment(drop_flat_rows=True, loss_type="grpo")
    with pytest.raises(ValueError, match="beta=0.1"):
        Experiment(drop_flat_rows=True, beta=0.1)


def test_nonfinite_gradients_skip_the_update_and_stop_the_run_after_k_in_a_row(tmp_path, monkeypatch):
    """A NaN in the training forward (an overflow, a bad reward path) must not reach the weights: the update is
    skipped (LoRA B stays exactly zero), logged, and K such updates in a row stop the run with a clear error."""
    import torch

    from agentlab import models
    from agentlab.models import tiny_random
    from agentlab.train import TrainingDiverged

    loaded = {}

    def poisoned(name, **kw):
        model, tok = tiny_random()

        def nan_when_training(module, inputs, output):  # generation runs without gradients and stays clean
            return output * float("nan") if torch.is_grad_enabled() else output

        model.model.norm.register_forward_hook(nan_when_training)
        loaded["model"] = model
        return model, models.prepare_tokenizer(tok)

    monkeypatch.setattr(models, "load_policy", poisoned)
    tasks = SPEC.make_tasks("train", 8, seed=0)
    exp = Experiment(name="nan", model="tiny-random", steps=4, eval_every=4, eval_tasks=2, groups_per_step=1,
                     group_size=2, max_new_tokens=4, max_turns=1, max_nonfinite=2, precision="fp32")
    run = RunDir(tmp_path / "nan")
    with pytest.raises(TrainingDiverged, match="2 updates in a row had non-finite gradients"):
        run_grpo(exp, tasks, SPEC.make_tasks("validation", 2, seed=0), run=run)
    metrics = run.metrics()
    assert [m["skipped_nonfinite_update"] for m in metrics] == [True, True] and not run.finished
    lora_b = [p for n, p in loaded["model"].named_parameters() if "lora_B" in n]
    assert lora_b and all(bool((p == 0).all()) for p in lora_b)  # no update reached the weights


def test_a_step_with_no_signal_moves_adamw_on_momentum_unless_the_guard_skips_it():
    """After one step with a gradient, AdamW keeps moving the weights on steps whose gradient is exactly zero (its
    momentum); with ``skip_zero_signal`` the guard hands it no gradient and the weights and AdamW's state stay put.
    A non-zero gradient always reaches the optimiser."""
    import torch
    from transformers import TrainerControl

    from agentlab.update_guard import UpdateState, update_guard

    def train(skip: bool, grads: list[float]) -> tuple[torch.Tensor, UpdateState, int]:
        torch.manual_seed(0)
        layer, state = torch.nn.Linear(3, 1), UpdateState()
        opt, guard = torch.optim.AdamW(layer.parameters(), lr=0.1, weight_decay=0.0), update_guard(state, 3, skip)
        for g in grads:
            for p in layer.parameters():
                p.grad = torch.full_like(p, g)
            guard.on_pre_optimizer_step(None, None, TrainerControl(), model=layer)
            opt.step()
        return layer.weight.detach().clone(), state, opt.state[layer.weight]["step"]

    after_one, _, _ = train(False, [1.0])
    drifted, state, steps = train(False, [1.0, 0.0, 0.0])
    assert state.zero_signal and not state.skipped_zero_signal and int(steps) == 3
    assert not torch.equal(drifted, after_one)  # momentum moved it twice more
    kept, state, steps = train(True, [1.0, 0.0, 0.0])
    assert state.zero_signal and state.skipped_zero_signal and int(steps) == 1
    assert torch.equal(kept, after_one)
    moved, state, _ = train(True, [1.0, 0.0, 0.5])
    assert not state.zero_signal and not torch.equal(moved, after_one)


def test_a_run_logs_its_zero_signal_steps_and_skips_them_when_asked(tmp_path):
    """Through TRL: a reward every rollout shares gives every group zero variance and, with ``skip_zero_signal``,
    advantages of exactly 0, a zero gradient and no optimiser step, logged per step. Without the option the
    gradient is zero only where TRL's float32 mean of eight rewards of 0.1 is exactly 0.1 (the summation order is the
    CPU's: on an AVX2 EPYC it is not, and the advantages are rounding-sized)."""
    import torch
    from trl.trainer.utils import nanstd

    spec = load("lookup")
    train, val = spec.make_tasks("train", 4, seed=0), spec.make_tasks("validation", 2, seed=0)
    base = Experiment(model="tiny-random", env="lookup", steps=1, eval_every=1, eval_tasks=1, groups_per_step=1,
                      group_size=8, max_new_tokens=4, max_turns=1, precision="fp32", lr=1e-2)

    def logged(name: str, reward, skip: bool = True, drop: bool = False) -> list[tuple]:
        exp = replace(base, name=name, reward=reward, skip_zero_signal=skip, drop_flat_rows=drop)
        run = run_grpo(exp, train, val, run=RunDir(tmp_path / name))
        return [(m["zero_signal"], m["skipped_zero_signal_update"]) + ((m["trained_rollouts"],) if drop else ())
                for m in run.metrics()]

    assert logged("flat", lambda ep: 0.1) == [(True, True)]
    assert logged("flat-drop", lambda ep: 0.1, drop=True) == [(True, True, 1)]  # one of eight rollouts trained
    rewards = torch.full((8,), 0.1)  # TRL's advantages for this group, on this CPU
    noise = (rewards - torch.nanmean(rewards.view(-1, 8), dim=1).repeat_interleave(8)) / (nanstd(rewards) + 1e-4)
    assert logged("flat-trl", lambda ep: 0.1, skip=False) == [(not noise.any(), False)]


# -- several processes: torchrun on CPU (gloo), as `accelerate launch` would start them on GPUs ---------------------

MULTI = ["train", "--name", "multi", "--model", "tiny-random", "--eval-every", "1", "--eval-tasks", "2",
         "--groups-per-step", "2", "--group-size", "2", "--max-new-tokens", "8"]


def _torchrun(args, env):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "agentlab.cli", *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _one_writer_records(run: RunDir, steps: int) -> None:
    """Every (step, group, sample) exactly once, groups numbered across processes, one task per group, one metric
    line per step with the global prompts_seen, one eval file per checkpoint with one line per eval task."""
    rollouts, torn = read_jsonl(run.rollouts_file)
    keys = [(r["step"], r["group"], r["sample"]) for r in rollouts]
    assert torn == 0 and sorted(keys) == [(s, g, k) for s in range(1, steps + 1) for g in (0, 1) for k in (0, 1)]
    for s in range(1, steps + 1):
        tasks = {g: {r["task"]["id"] for r in rollouts if (r["step"], r["group"]) == (s, g)} for g in (0, 1)}
        assert all(len(t) == 1 for t in tasks.values()) and tasks[0] != tasks[1]
    metrics, torn = read_jsonl(run.metrics_file)
    assert torn == 0 and [(m["step"], m["prompts_seen"]) for m in metrics] == [(s, 2 * s) for s in range(1, steps + 1)]
    for step in range(steps + 1):
        assert len(read_jsonl(run.evals_dir / f"step-{step:04d}.rollouts.jsonl")[0]) == 2
    assert run.finished and (run.path / "adapter" / "adapter_config.json").exists()


def test_two_processes_write_one_run_like_one_process(tmp_path):
    """GRPO on two CPU processes: each generates its own whole group, the main one writes the run folder, and
    the records have the shape and the count of a one-process run of the same step size."""
    env = _synthesised(tmp_path)
    two = _torchrun([*MULTI, "--steps", "2"], env)
    log = two.communicate(timeout=600)[0]
    assert two.returncode == 0, log[-3000:]
    _one_writer_records(RunDir(tmp_path / "runs" / "multi"), steps=2)
    one = _cli([*MULTI, "--steps", "2", "--name", "single"], env)
    log = one.communicate(timeout=600)[0]
    assert one.returncode == 0, log[-3000:]
    single, multi = RunDir(tmp_path / "runs" / "single"), RunDir(tmp_path / "runs" / "multi")
    assert [sorted(m) for m in single.metrics()] == [sorted(m) for m in multi.metrics()]
    assert len(single.metrics()) == 2 and len(read_jsonl(single.rollouts_file)[0]) == len(read_jsonl(multi.rollouts_file)[0])


def test_a_step_that_does_not_split_over_the_processes_is_refused(tmp_path, monkeypatch):
    from agentlab.experiment import grpo_kwargs

    monkeypatch.setenv("WORLD_SIZE", "2")
    kw = grpo_kwargs(Experiment(groups_per_step=4, group_size=4, micro_batch=4), tmp_path)
    # per process: 2 groups of 4 = 8 rollouts, generated once (steps_per_generation) and accumulated in 4-row passes
    assert (kw["per_device_train_batch_size"], kw["gradient_accumulation_steps"], kw["steps_per_generation"]) == (4, 2, 2)
    with pytest.raises(ValueError, match="groups_per_step=3 does not split over 2 processes"):
        run_grpo(Experiment(model="tiny-random", groups_per_step=3), [], [], run=RunDir(tmp_path / "r"))
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_two_processes_resume_exactly_after_kill_minus_9(tmp_path):
    env = _synthesised(tmp_path)
    run = RunDir(tmp_path / "runs" / "multi")
    proc = _torchrun([*MULTI, "--steps", "3"], env)
    deadline = time.time() + 300
    while not run.checkpoints() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert run.checkpoints(), proc.stdout.read() if proc.poll() is not None else "no checkpoint in time"
    import psutil

    for p in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]:
        p.kill()  # SIGKILL the launcher and both workers (killing the launcher's process group left them running)
    proc.wait()
    assert not run.finished
    again = _torchrun([*MULTI, "--steps", "3"], env)
    log = again.communicate(timeout=600)[0]
    assert again.returncode == 0, log[-3000:]
    _one_writer_records(run, steps=3)


def test_start_eval_is_read_back_only_when_it_is_step_zeros_own(tmp_path):
    """A comparison's SFT search already scored GRPO's start on the validation tasks: ``reuse_start_eval`` records
    that pass as step 0, in the tasks' order whatever order its episodes ended in, re-scored under a run's own
    reward, and refuses it for another loop or other tasks."""
    from dataclasses import asdict, replace

    from agentlab.evals import read_rollouts, summarize, write_episode
    from agentlab.reward_design import scripted_episode
    from agentlab.rollout import EVAL_BATCH
    from agentlab.train import reuse_start_eval

    spec = load("lookup")
    tasks = spec.make_tasks("validation", 4, seed=0)
    exp = Experiment(name="start-eval", env="lookup", eval_tasks=4)
    episodes = [scripted_episode(spec, t, spec.expert if i % 2 else spec.random_policy) for i, t in enumerate(tasks)]
    folder = tmp_path / "validation-step-8"
    folder.mkdir()
    with open(folder / "rollouts.jsonl", "w") as fh:
        for ep in reversed(episodes):  # a rollouts file lists episodes as they ended
            write_episode(fh, ep)
    loop = replace(exp.loop(), temperature=0, batch_size=EVAL_BATCH)
    (folder / "summary.json").write_text(json.dumps({"samples": 1, "loop": asdict(loop), **summarize(episodes)}))
    run = RunDir(tmp_path / "grpo")
    assert reuse_start_eval(folder, exp, tasks, run)
    step0 = json.loads((run.path / "evals" / "step-0000.json").read_text())
    assert step0["success"] == summarize(episodes)["success"] and 0 < step0["success"]["mean"] < 1
    assert step0["from"].endswith("validation-step-8") and "rescored" not in step0
    written = read_rollouts(run.path / "evals" / "step-0000.rollouts.jsonl")[0]
    assert [ep.task.id for ep in written] == [t.id for t in tasks]
    assert [ep.reward for ep in written] == [ep.reward for ep in episodes]
    # another reward: the same greedy episodes, each scored with the run's reward (here success alone)
    bonus = replace(exp, reward="success=2")
    assert {ep.reward for ep in episodes} != {2 * ep.success for ep in episodes}  # else the check below is idle
    rescored = RunDir(tmp_path / "grpo-rescored")
    assert reuse_start_eval(folder, bonus, tasks, rescored)
    written = read_rollouts(rescored.path / "evals" / "step-0000.rollouts.jsonl")[0]
    assert [ep.reward for ep in written] == [2 * ep.success for ep in episodes]
    assert [ep.to_json() for ep in written] != [ep.to_json() for ep in episodes]
    assert [(ep.task.id, ep.metrics, ep.exit_reason) for ep in written] == \
        [(ep.task.id, ep.metrics, ep.exit_reason) for ep in episodes]
    step0 = json.loads((rescored.path / "evals" / "step-0000.json").read_text())
    assert step0["rescored"] and step0["reward"]["mean"] == 2 * step0["success"]["mean"]
    for other_exp, other_tasks in [(replace(exp, max_turns=exp.max_turns + 1), tasks),
                                   (exp, tasks[:3] + spec.make_tasks("test", 1, seed=0))]:
        elsewhere = RunDir(tmp_path / f"other-{len(list(tmp_path.iterdir()))}")
        assert not reuse_start_eval(folder, other_exp, other_tasks, elsewhere)
        assert not (elsewhere.path / "evals").exists()
    older = {k if k != "engine" else "backend": v for k, v in asdict(loop).items()}  # a summary from before the rename
    (folder / "summary.json").write_text(json.dumps({"samples": 1, "loop": older, **summarize(episodes)}))
    assert reuse_start_eval(folder, exp, tasks, RunDir(tmp_path / "grpo-older"))


def test_a_run_stopped_in_its_last_evaluation_finishes_without_training_a_step_more(tmp_path):
    """Stopped after its last checkpoint was saved but before that step's evaluation ended, a run started again
    evaluates that checkpoint and finishes: no step past ``steps`` (transformers resumed at ``max_steps`` would train
    one more), and the finished adapter is the last checkpoint's."""
    import shutil

    from safetensors.torch import load_file

    spec = load("lookup")
    train, val = spec.make_tasks("train", 4, seed=0), spec.make_tasks("validation", 2, seed=0)
    exp = Experiment(name="last-eval", model="tiny-random", env="lookup", steps=2, eval_every=1, eval_tasks=2,
                     groups_per_step=1, group_size=2, max_new_tokens=8, precision="fp32", lr=1e-2,
                     reward=lambda ep: len(ep.turns[0].text) / 40)  # a reward the random model's samples vary on
    run = run_grpo(exp, train, val, run=RunDir(tmp_path / "last-eval"))
    for done in (run.done_file, run.evals_dir / "step-0002.json"):
        done.unlink()
    shutil.rmtree(run.path / "adapter")
    run_grpo(exp, train, val, run=run)
    assert [m["step"] for m in read_jsonl(run.metrics_file)[0]] == [1, 2] and run.finished
    assert sorted({r["step"] for r in read_jsonl(run.rollouts_file)[0]}) == [1, 2]
    assert [c.name for c in run.checkpoints()] == ["checkpoint-1", "checkpoint-2"]
    assert json.loads((run.evals_dir / "step-0002.json").read_text())["step"] == 2
    last, final = (load_file(d / "adapter_model.safetensors") for d in (run.checkpoints()[-1], run.path / "adapter"))
    first = load_file(run.checkpoints()[0] / "adapter_model.safetensors")
    assert last.keys() == final.keys() and all((last[k] == final[k]).all() for k in last)
    assert any((first[k] != last[k]).any() for k in last)  # (the two checkpoints differ: the check above can fail)


def test_a_run_stopped_between_evaluations_resumes_from_the_step_it_stopped_at(tmp_path, monkeypatch):
    """A CPU run saves every step and evaluates every ``eval_every``: stopped after step 1 (no evaluation there), it
    resumes at step 2, not from scratch; a checkpoint between evaluations goes once a newer one is saved. A run begun
    before checkpoints were saved every step (its trainer state says every ``eval_every``) saves every step too."""
    spec = load("lookup")
    train, val = spec.make_tasks("train", 4, seed=0), spec.make_tasks("validation", 2, seed=0)
    exp = Experiment(name="between", model="tiny-random", env="lookup", steps=4, eval_every=2, eval_tasks=2,
                     groups_per_step=1, group_size=2, max_new_tokens=8, precision="fp32")
    prune, kept = RunDir.prune_checkpoints, []

    class SessionEnds(Exception):
        pass

    def prune_and_stop_after_step_1(run, keep, under="checkpoints"):
        prune(run, keep, under)
        kept.append([int(c.name.split("-")[1]) for c in run.checkpoints(under)])
        if kept == [[1]]:
            raise SessionEnds

    monkeypatch.setattr(RunDir, "prune_checkpoints", prune_and_stop_after_step_1)
    run = RunDir(tmp_path / "between")
    with pytest.raises(SessionEnds):
        run_grpo(exp, train, val, run=run)
    assert sorted(p.name for p in run.evals_dir.glob("step-*.json")) == ["step-0000.json"]
    state = run.path / "checkpoints" / "checkpoint-1" / "trainer_state.json"
    state.write_text(json.dumps({**json.loads(state.read_text()), "save_steps": exp.eval_every}))  # an older run's
    run_grpo(exp, train, val, run=run)  # resumes from checkpoint-1: step 1 is not trained again
    assert [m["step"] for m in read_jsonl(run.metrics_file)[0]] == [1, 2, 3, 4] and run.finished
    assert sorted(p.name for p in run.evals_dir.glob("step-*.json")) == [f"step-000{i}.json" for i in (0, 2, 4)]
    # after each save (and at the resume's start): the newest checkpoint and the evaluated ones before it
    assert kept == [[1], [1], [2], [2, 3], [2, 4]]


def test_a_checkpoint_evaluation_cut_short_resumes_with_the_episodes_it_wrote(tmp_path, capsys):
    """A session ending mid-way through a checkpoint's evaluation (its rollouts written for 2 of 4 tasks, the third
    torn, no ``step-N.json``) keeps those episodes: the next start decodes only the rest, and the step's file ends
    as an uninterrupted evaluation's (every task once, in task order, the kept episodes unchanged)."""
    from agentlab.evals import read_rollouts
    from agentlab.models import load_policy
    from agentlab.train import evaluate_policy

    spec = load("lookup")
    tasks = spec.make_tasks("validation", 4, seed=1)
    exp = Experiment(name="cut-eval", model="tiny-random", env="lookup", eval_tasks=4, max_turns=2, max_new_tokens=8,
                     precision="fp32")
    model, tok = load_policy("tiny-random")
    whole, cut = RunDir(tmp_path / "whole"), RunDir(tmp_path / "cut")
    first = evaluate_policy(model, tok, spec, tasks, exp, whole, step=3)
    lines = (whole.evals_dir / "step-0003.rollouts.jsonl").read_text().splitlines()
    cut.evals_dir.mkdir(parents=True)
    (cut.evals_dir / "step-0003.rollouts.jsonl").write_text("\n".join(lines[:2]) + "\n" + lines[2][:50])
    capsys.readouterr()
    again = evaluate_policy(model, tok, spec, tasks, exp, cut, step=3)
    assert "2 of 4 episodes read back from an interrupted evaluation; 2 to go" in capsys.readouterr().out
    a, b = (read_rollouts(r.evals_dir / "step-0003.rollouts.jsonl")[0] for r in (whole, cut))
    assert [(e.task.id, e.group, e.step) for e in b] == [(e.task.id, e.group, e.step) for e in a]
    assert [e.task.id for e in b] == [t.id for t in tasks]
    assert [e.tokens["completion_ids"] for e in b[:2]] == [e.tokens["completion_ids"] for e in a[:2]]
    assert again["success"]["n"] == first["success"]["n"] == 4 and (cut.evals_dir / "step-0003.json").exists()


def test_an_sft_run_killed_midway_resumes_from_its_checkpoint_to_the_same_adapter(tmp_path, monkeypatch):
    """A long study's SFT run keeps resume points (the Trainer's own checkpoint: adapter, optimiser, data position,
    RNG); killed after step 2 of 4 and started again, it ends where an uninterrupted run ends, and leaves no
    resume point behind once whole."""
    import torch
    from safetensors.torch import load_file
    from trl import SFTTrainer

    from agentlab import sft
    from agentlab.train import SFTSettings, run_sft

    spec = load("lookup")
    demos = expert_demos(spec, spec.make_tasks("train", 8, seed=0))
    settings = SFTSettings(steps=4, batch_size=2, lr=1e-3, seed=0, precision="fp32")
    whole = run_sft("tiny-random", demos, tmp_path / "whole", settings)
    monkeypatch.setattr(sft, "CHECKPOINT_S", 0.0)  # a resume point after every step
    original, calls = SFTTrainer.training_step, [0]

    def killed_at_step_3(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("killed")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SFTTrainer, "training_step", killed_at_step_3)
    with pytest.raises(RuntimeError, match="killed"):
        run_sft("tiny-random", demos, tmp_path / "cut", settings)
    assert [p.name for p in RunDir(tmp_path / "cut").checkpoints("trainer")] == ["checkpoint-2"]
    after = [0]

    def counted(self, *args, **kwargs):
        after[0] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SFTTrainer, "training_step", counted)
    resumed = run_sft("tiny-random", demos, tmp_path / "cut", settings)
    assert after[0] == 2  # steps 3 and 4 only: it resumed, it did not start again
    assert json.loads((tmp_path / "cut" / "sft_summary.json").read_text())["steps"] == 4
    a, b = load_file(whole / "adapter_model.safetensors"), load_file(resumed / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert not list((tmp_path / "cut" / "trainer").glob("checkpoint-*"))


def test_in_a_notebook_an_sft_run_prints_one_line_not_a_bar(tmp_path, monkeypatch, capsys):
    from agentlab.train import SFTSettings, run_sft

    monkeypatch.setenv("AGENTLAB_NOTEBOOK", "1")  # what setup_notebook sets
    spec = load("lookup")
    run_sft("tiny-random", expert_demos(spec, spec.make_tasks("train", 4, seed=0)), tmp_path / "nb-sft",
            SFTSettings(steps=2, precision="fp32"))
    said = capsys.readouterr()
    assert "SFT nb-sft: 2 steps at lr 0.001, loss " in said.out and "it/s" not in said.err + said.out
    assert "'loss'" not in said.out + said.err  # not the Trainer's log dict of every step


def test_in_a_notebook_a_grpo_run_leaves_one_line_with_its_steps_and_rewards_not_the_trainers_log(
        tmp_path, monkeypatch, capsys):
    from agentlab.progress import steps_line

    monkeypatch.setenv("AGENTLAB_NOTEBOOK", "1")  # what setup_notebook sets
    spec = load("lookup")
    exp = Experiment(name="nb-grpo", model="tiny-random", env="lookup", steps=2, eval_every=2, eval_tasks=2,
                     groups_per_step=1, group_size=2, max_new_tokens=8, precision="fp32")
    run = run_grpo(exp, spec.make_tasks("train", 4, seed=0), spec.make_tasks("validation", 2, seed=0),
                   run=RunDir(tmp_path / "nb-grpo"))
    said = capsys.readouterr()
    rewards = [m["reward_mean"] for m in read_jsonl(run.metrics_file)[0]]
    line = next(line for line in said.out.splitlines() if line.startswith("GRPO nb-grpo: "))
    assert line.startswith("GRPO nb-grpo: steps 1–2 in ") and line.endswith(
        f"training reward {rewards[0]:.2f} → {rewards[-1]:.2f} (each step's rollouts' mean)")
    assert "'loss'" not in said.out + said.err  # not the Trainer's log dict of every step
    monkeypatch.setenv("AGENTLAB_RUNS", str(tmp_path.parent))  # a run under the runs folder: named by its path there
    assert RunDir(tmp_path / "nb-grpo").label == f"{tmp_path.name}/nb-grpo" and RunDir(tmp_path).label == tmp_path.name
    assert steps_line("r", [], 3.0) == "GRPO r: no step left to train"  # a run resumed at its last step
    assert steps_line("r", [{"step": 5, "reward_mean": 0.5}], 3.0) == "GRPO r: step 5 in 3 s, reward 0.50"
