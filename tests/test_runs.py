"""Run folders: one JSONL rule, config refusal, atomic JSON, checkpoints in order, stage seconds over resumes."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentlab.runs import RunDir, RunExistsError, StageClock, read_jsonl


def test_one_jsonl_rule_torn_last_line_dropped_bad_middle_line_raises(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"st')
    with pytest.warns(UserWarning, match="m.jsonl:3: dropped a torn last line"):
        assert read_jsonl(path) == ([{"step": 1}, {"step": 2}], 1)
    path.write_text('{"step": 1}\n{"st\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"m.jsonl:2: not a JSON record"):
        read_jsonl(path)
    path.write_text('{"step": 1}\n[1, 2]\n{"step": 3}\n')  # valid JSON, not a record
    with pytest.raises(ValueError, match=r"m.jsonl:2"):
        read_jsonl(path)
    assert read_jsonl(tmp_path / "missing.jsonl") == ([], 0)


def test_truncate_after_keeps_a_resumed_run_exact(tmp_path):
    run = RunDir(tmp_path / "r")
    run.path.mkdir()
    for step in (1, 2, 3):
        run.append(run.metrics_file, {"step": step})
    with open(run.metrics_file, "a") as fh:
        fh.write('{"step": 4, "lo')  # killed mid-write
    with pytest.warns(UserWarning):
        run.truncate_after(2)
    assert read_jsonl(run.metrics_file) == ([{"step": 1}, {"step": 2}], 0)


def test_finished_and_changed_runs_are_refused_and_json_is_whole(tmp_path):
    run = RunDir(tmp_path / "r")
    run.prepare({"lr": 1.0})
    with pytest.raises(RunExistsError, match=r"different config \(lr\)"):
        run.prepare({"lr": 2.0})
    run.write_json("evals/step-0001.json", {"step": 1})
    assert run.read_json("evals/step-0001.json") == {"step": 1}
    assert not list((run.path / "evals").glob(".*"))  # no temp file left behind
    run.mark_finished({"steps": 1})
    with pytest.raises(RunExistsError, match="is finished"):
        run.prepare({"lr": 1.0})
    assert json.loads(run.done_file.read_text()) == {"steps": 1}


def test_recorded_paths_are_relative_to_the_run_and_resolve_after_a_move(tmp_path):
    run = RunDir(tmp_path / "a" / "run")
    assert run.rel(run.path / "sft" / "adapter") == "sft/adapter"
    assert run.rel(tmp_path / "a" / "other" / "adapter") == "../other/adapter"
    assert run.resolve("sft/adapter") == run.path / "sft" / "adapter"
    assert run.resolve("/elsewhere/adapter") == Path("/elsewhere/adapter")  # a record from before: as it is
    moved = RunDir(tmp_path / "b" / "run")
    assert moved.resolve(run.rel(run.path / "x")) == moved.path / "x"
    # a config that recorded an absolute path still resumes under the same path given relative
    run.prepare({"init_adapter": str(tmp_path / "a" / "other" / "adapter"), "lr": 1})
    run.prepare({"init_adapter": "../other/adapter", "lr": 1})
    with pytest.raises(RunExistsError, match="init_adapter"):
        run.prepare({"init_adapter": "../third/adapter", "lr": 1})


def test_a_stage_killed_and_resumed_records_the_seconds_of_both_tries(tmp_path):
    """A study stage cut by the session's end and finished by the next took both sessions' time; the record used to
    hold the last one's only (seed 0's GRPO test evaluation: 3,434 s for its last 147 of 200 episodes)."""
    child = (f"import time; from agentlab.runs import RunDir, StageClock; "
             f"StageClock(RunDir({str(tmp_path)!r}), tick_s=0.05).timed('test_grpo', time.sleep, 60)")
    proc = subprocess.Popen([sys.executable, "-c", child])
    deadline = time.time() + 30
    while time.time() < deadline and not (tmp_path / "seconds-open.json").exists():
        time.sleep(0.05)
    time.sleep(0.5)
    proc.kill()  # SIGKILL: no handler runs, only what the ticker saved survives
    proc.wait()
    spent = RunDir(tmp_path).read_json("seconds-open.json")["test_grpo"]
    assert spent >= 0.4
    assert RunDir(tmp_path).read_json("seconds.json") is None  # not done: no entry a reader could take for the whole

    clock = StageClock(RunDir(tmp_path), tick_s=0.05)
    assert clock.timed("test_grpo", lambda: time.sleep(0.2) or "out") == "out"
    assert spent + 0.2 <= clock.seconds["test_grpo"] < spent + 5
    assert RunDir(tmp_path).read_json("seconds.json") == clock.seconds
    assert "test_grpo" not in RunDir(tmp_path).read_json("seconds-open.json")
    # a recorded stage reads its output back untimed: its record stays
    assert clock.timed("test_grpo", lambda: "read back") == "read back"
    assert RunDir(tmp_path).read_json("seconds.json")["test_grpo"] == clock.seconds["test_grpo"]


def test_a_stage_that_raises_keeps_its_seconds_for_the_try_that_finishes(tmp_path):
    clock = StageClock(RunDir(tmp_path), tick_s=60)

    def fails():
        time.sleep(0.3)
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError):
        clock.timed("grpo", fails)
    assert clock.open["grpo"] >= 0.3 and "grpo" not in clock.seconds
    again = StageClock(RunDir(tmp_path))
    again.timed("grpo", lambda: None)
    assert again.seconds["grpo"] >= 0.3


def test_a_stage_timed_inside_another_counts_once_in_the_total(tmp_path):
    """An arm's checkpoint validations and sampling budget run inside the arm's own stage: the total takes the arm's
    seconds and not theirs again, whatever the inner stages are called, and a resumed run still knows the nesting."""
    clock = StageClock(RunDir(tmp_path), tick_s=60)

    def arm():
        clock.record("arm_sampling", 0.2)  # a budget spent piece by piece, inside the arm
        clock.timed("arm_steps=2_validation", time.sleep, 0.2)
        time.sleep(0.1)

    clock.timed("tasks", time.sleep, 0.1)
    clock.timed("arm", arm)
    assert clock.within == {"arm_sampling": "arm", "arm_steps=2_validation": "arm"}
    assert clock.total() == round(clock.seconds["tasks"] + clock.seconds["arm"], 1)
    assert clock.total() < sum(clock.seconds.values()) - 0.3
    again = StageClock(RunDir(tmp_path))
    assert again.within == clock.within and again.total() == clock.total()
