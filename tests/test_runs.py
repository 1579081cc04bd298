"""Run folders: one JSONL rule, config refusal, atomic JSON, checkpoints in order."""

import json
from pathlib import Path

import pytest

from agentlab.runs import RunDir, RunExistsError, read_jsonl


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
