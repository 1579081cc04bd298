"""Bad input, end to end: one clear line naming the culprit, a non-zero exit, nothing already written lost."""

import json
import os
import subprocess
import sys

import pytest

from agentlab.models import ModelLoadError


def _cli(*args, tmp_path):
    env = {**os.environ, "AGENTLAB_RUNS": str(tmp_path / "runs"), "AGENTLAB_DATA": str(tmp_path / "data")}
    return subprocess.run([sys.executable, "-m", "agentlab.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300, check=False)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-input")
    out = _cli("synth", "--env", "lookup", "--train", "8", "--validation", "4", "--test", "6", "--demos", "4",
               tmp_path=root)
    assert out.returncode == 0, out.stderr
    return root


def _one_clear_line(out, *needles):
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "Traceback" not in out.stderr and all(n in out.stderr for n in needles), out.stderr
    assert len([line for line in out.stderr.splitlines() if "error:" in line]) == 1


def test_unknown_environment_is_named_as_such(data):
    _one_clear_line(_cli("eval", "--env", "nope", tmp_path=data), "unknown environment 'nope'")


def test_non_positive_counts_are_refused(data):
    _one_clear_line(_cli("eval", "--env", "lookup", "--n", "-5", "--model", "tiny-random", tmp_path=data),
                    "--n -5")


def test_a_model_folder_without_a_model_is_named(data, tmp_path):
    (tmp_path / "empty").mkdir()
    _one_clear_line(_cli("eval", "--env", "lookup", "--model", str(tmp_path / "empty"), "--n", "1", tmp_path=data),
                    "has no config.json")


def test_a_broken_task_line_names_the_file_and_its_line(data):
    path = data / "data" / "tasks" / "lookup" / "test.jsonl"
    original = path.read_text()
    lines = original.splitlines()
    lines[2] = lines[2][:20]  # a line cut mid-write
    path.write_text("\n".join(lines) + "\n")
    try:
        _one_clear_line(_cli("eval", "--env", "lookup", "--model", "tiny-random", tmp_path=data), "test.jsonl:3:")
    finally:
        path.write_text(original)


def test_demonstrations_of_another_environment_are_refused(data):
    folder = data / "data" / "tasks" / "lookup"
    theirs = json.loads((folder / "demos.jsonl").read_text().splitlines()[0])
    other = data / "data" / "tasks" / "product_finder"
    other.mkdir(parents=True, exist_ok=True)
    (other / "demos.jsonl").write_text(json.dumps(theirs) + "\n")
    _one_clear_line(_cli("sft", "--env", "product_finder", "--model", "tiny-random", tmp_path=data),
                    "were not written for 'product_finder'")


def test_an_adapter_for_another_base_model_is_named(tmp_path):
    from peft import get_peft_model

    from agentlab.models import _apply_adapter, tiny_random
    from agentlab.train import lora_config

    get_peft_model(tiny_random()[0], lora_config(4)).save_pretrained(tmp_path / "adapter")
    with pytest.raises(ModelLoadError, match="does not fit this model.*another shape"):
        _apply_adapter(tiny_random(hidden=32)[0], tmp_path / "adapter")


def test_after_the_quickstart_the_next_eval_finds_its_tasks(tmp_path, monkeypatch, capsys):
    """`agentlab eval --env lookup` right after `make quickstart` (no `agentlab synth`): the quickstart's split is
    used and said so; with no quickstart either, the error names the command to run."""
    from agentlab.pipeline import load_split
    from agentlab.synth import build_splits, save_splits

    monkeypatch.setenv("AGENTLAB_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("AGENTLAB_RUNS", str(tmp_path / "runs"))
    with pytest.raises(FileNotFoundError, match="run `agentlab synth --env lookup` first"):
        load_split("lookup", "test")
    from agentlab.envs import load

    run = tmp_path / "runs" / "quickstart"
    save_splits(build_splits(load("lookup"), {"train": 4, "validation": 2, "test": 3}), run / "tasks")
    (run / "config.json").write_text(json.dumps({"env": "lookup"}))
    assert len(load_split("lookup", "test")) == 3
    assert "using the quickstart's test split" in capsys.readouterr().out
    (run / "config.json").write_text(json.dumps({"env": "product_finder"}))  # another environment's tasks: never
    with pytest.raises(FileNotFoundError):
        load_split("lookup", "test")
