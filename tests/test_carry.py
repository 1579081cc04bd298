"""agentlab.carry: what a packed run folder keeps, the round trip, and a comparison resuming from a pack."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentlab.carry import carried, pack, unpack

ADAPTER = ("adapter_config.json", "adapter_model.safetensors")
TRAINER = ("optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json")


def _files(root: Path, folder: str, names) -> None:
    for name in names:
        (root / folder / name).parent.mkdir(parents=True, exist_ok=True)
        (root / folder / name).write_text("{}" if name.endswith(".json") else "x" * 64)


def _comparison(root: Path) -> Path:
    """A comparison's folder mid-GRPO: SFT search done (32 steps chosen), GRPO at checkpoint 8 with a torn 12,
    a finished tuning run, and sft_all's search still running."""
    _files(root, ".", ("config.json", "tried.json", "seconds.json", "tasks/train.jsonl"))
    for s in (16, 32, 64):
        _files(root, f"sft_best/lr=0.001/adapter-step-{s}", ADAPTER)
        _files(root, f"sft_best/lr=0.001/validation-step-{s}", ("summary.json", "rollouts.jsonl"))
    (root / "sft_best/choice.json").write_text(json.dumps({"adapter": "sft_best/lr=0.001/adapter-step-32"}))
    for step in (4, 8):
        _files(root, f"grpo/checkpoints/checkpoint-{step}", ADAPTER + TRAINER)
    _files(root, "grpo/checkpoints/checkpoint-12", ("optimizer.pt",))  # killed while saving
    _files(root, "grpo", ("config.json", "metrics.jsonl", "rollouts.jsonl", "evals/step-4.json"))
    _files(root, "tune/lr-1e-4/checkpoints/checkpoint-4", ADAPTER + TRAINER)
    _files(root, "tune/lr-1e-4", ("metrics.jsonl", "DONE"))
    _files(root, "sft_all/lr=0.001/adapter-step-64", ADAPTER)
    return root


def test_a_pack_keeps_the_records_the_chosen_adapters_and_the_last_checkpoint_whole(tmp_path):
    run = _comparison(tmp_path / "seed-0")
    kept = {p.as_posix() for p in carried(run)}
    ckpt = "grpo/checkpoints/checkpoint-"
    assert {f"{ckpt}8/{n}" for n in ADAPTER + TRAINER} <= kept  # the resume point, optimiser state and all
    assert {f"{ckpt}4/{n}" for n in ADAPTER + ("trainer_state.json",)} <= kept  # may still be chosen
    assert not {f"{ckpt}4/{n}" for n in ("optimizer.pt", "scheduler.pt", "rng_state.pth")} & kept
    assert f"{ckpt}12/optimizer.pt" not in kept  # torn: a resume skips it too
    assert {f"sft_best/lr=0.001/adapter-step-32/{n}" for n in ADAPTER} <= kept  # the choice
    assert not any(p.startswith(("sft_best/lr=0.001/adapter-step-16/adapter", "sft_best/lr=0.001/adapter-step-64/adapter"))
                   for p in kept)  # the search is done: its other adapters are not needed again
    assert "sft_best/lr=0.001/validation-step-16/summary.json" in kept  # records always travel
    assert not any(p.startswith("tune/lr-1e-4/checkpoints") for p in kept) and "tune/lr-1e-4/metrics.jsonl" in kept
    assert {f"sft_all/lr=0.001/adapter-step-64/{n}" for n in ADAPTER} <= kept  # a search still running keeps all
    assert {"config.json", "tried.json", "grpo/metrics.jsonl", "grpo/evals/step-4.json"} <= kept

    (run / "grpo/DONE").write_text("{}")  # GRPO finished and chose checkpoint 4: the others go
    (run / "grpo/choice.json").write_text(json.dumps({"adapter": f"{ckpt}4"}))
    kept = {p.as_posix() for p in carried(run)}
    assert {f"{ckpt}4/{n}" for n in ADAPTER} <= kept and f"{ckpt}4/optimizer.pt" not in kept
    assert not any(p.startswith(f"{ckpt}8") for p in kept)
    with pytest.raises(FileNotFoundError, match="no run folder"):
        carried(tmp_path / "missing")


def test_pack_and_unpack_round_trip_and_never_overwrite_a_run_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTLAB_RUNS", str(tmp_path / "runs"))
    run = _comparison(tmp_path / "runs" / "study" / "seed-0")
    dest = pack("study/seed-0", tmp_path / "carry")
    assert dest == tmp_path / "carry" / "study" / "seed-0"
    assert sorted(p.relative_to(dest) for p in dest.rglob("*") if p.is_file() and p.name != "CARRIED") == carried(run)
    pack("study/seed-0", tmp_path / "carry")  # again: replaced whole, no staging folder left
    assert [p.name for p in (tmp_path / "carry" / "study").iterdir()] == ["seed-0"]

    elsewhere = tmp_path / "other-machine"
    assert unpack(tmp_path / "carry", elsewhere) == {"study/seed-0": "unpacked"}
    copy = elsewhere / "study" / "seed-0"
    assert (copy / "grpo/checkpoints/checkpoint-8/optimizer.pt").read_text() == "x" * 64
    assert not (copy / "CARRIED").exists()
    (copy / "tried.json").write_text('{"further": true}')  # the copy moved on: a second unpack leaves it
    assert unpack(tmp_path / "carry", elsewhere) == {"study/seed-0": "kept"}
    assert json.loads((copy / "tried.json").read_text()) == {"further": True}


def test_a_comparison_resumes_from_a_pack_without_searching_again(tmp_path, monkeypatch):
    """The SFT search chose 2 steps; the pack drops the other adapters; the unpacked comparison reads the choice
    and its tried points back (training again would fail here) and records none twice. Fake training and scores:
    the resume is under test."""
    import agentlab.train
    from agentlab.compare import CompareConfig, Comparison

    monkeypatch.setenv("AGENTLAB_RUNS", str(tmp_path / "runs"))

    def fake_sft(model, demos, folder, settings, save_at=(), init_adapter=None, **_):
        for s in save_at or (settings.steps,):
            target = folder / f"adapter-step-{s}" if save_at else folder / "adapter"
            target.mkdir(parents=True)
            (target / "adapter_config.json").write_text("{}")

    def fake_eval(self, folder, adapter, tasks, label):
        mean = {1: 0.2, 2: 0.5, 4: 0.4}[int(str(folder).rsplit("-", 1)[1])]
        summary = {"success": {"mean": mean, "ci_low": 0.0, "ci_high": 1.0, "n": 4}}
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "summary.json").write_text(json.dumps(summary))
        return summary

    monkeypatch.setattr(agentlab.train, "run_sft", fake_sft)
    monkeypatch.setattr(Comparison, "evaluate", fake_eval)
    cfg = CompareConfig.smoke(name="carried", sft_lrs=(1e-3,), sft_extend=1)
    first = Comparison(cfg)
    choice = first.sft_search("sft_best", [], (1e-3,), [])
    assert choice["steps"] == 2 and len(first.tried) == 3
    pack("carried", tmp_path / "carry")

    monkeypatch.setenv("AGENTLAB_RUNS", str(tmp_path / "next-session"))
    unpack(tmp_path / "carry")
    monkeypatch.setattr(agentlab.train, "run_sft", lambda *a, **k: pytest.fail("the finished search trained again"))
    resumed = Comparison(cfg)
    assert not (resumed.run.path / "sft_best/lr=0.001/adapter-step-1").exists()
    assert resumed.sft_search("sft_best", [], (1e-3,), []) == choice
    resumed._tried(first.tried[0])
    assert resumed.tried == first.tried
    resumed.log_session()  # each start of a carried comparison says where it ran and what was done before it
    from agentlab.runs import read_jsonl

    sessions = read_jsonl(resumed.run.path / "sessions.jsonl")[0]
    assert len(sessions) == 1 and sessions[0]["cpu_class"] and sessions[0]["done_before"] == sorted(resumed.seconds)
    assert sessions[0]["done_before"]  # the search the earlier session timed


def test_the_pack_and_unpack_commands(tmp_path, monkeypatch, capsys):
    from agentlab.cli import main

    monkeypatch.setenv("AGENTLAB_RUNS", str(tmp_path / "runs"))
    _comparison(tmp_path / "runs" / "seed-0")
    assert main(["pack", "seed-0", "--to", str(tmp_path / "carry")]) == 0
    assert f"{len(carried(tmp_path / 'runs' / 'seed-0'))} files" in capsys.readouterr().out
    monkeypatch.setenv("AGENTLAB_RUNS", str(tmp_path / "elsewhere"))
    assert main(["unpack", str(tmp_path / "carry")]) == 0
    assert "seed-0: unpacked" in capsys.readouterr().out
    assert main(["unpack", str(tmp_path / "empty")]) == 2  # nothing packed there: one clear line, no traceback
    assert "no packed run under" in capsys.readouterr().err


def test_a_records_pack_of_a_finished_run_drops_every_adapter_and_checkpoint(tmp_path, monkeypatch, capsys):
    """``--records``: a finished GRPO run's configs, metrics, rollouts and evaluations, without its final adapter or
    checkpoints; an unfinished run is refused (without its checkpoint it could not resume), nothing written."""
    from agentlab.cli import main

    monkeypatch.setenv("AGENTLAB_RUNS", str(tmp_path / "runs"))
    run = tmp_path / "runs" / "lesson"
    _files(run, ".", ("config.json", "metrics.jsonl", "rollouts.jsonl", "evals/step-0006.json"))
    _files(run, "checkpoints/checkpoint-6", ADAPTER + TRAINER)
    _files(run, "adapter", ADAPTER)
    with pytest.raises(ValueError, match="has not finished"):
        pack("lesson", tmp_path / "carry", records_only=True)
    assert not (tmp_path / "carry").exists()
    (run / "DONE").write_text("")
    assert main(["pack", "lesson", "--to", str(tmp_path / "carry"), "--records"]) == 0
    assert "5 files" in capsys.readouterr().out
    dest = tmp_path / "carry" / "lesson"
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == [
        "CARRIED", "DONE", "config.json", "evals/step-0006.json", "metrics.jsonl", "rollouts.jsonl"]
    assert any("adapter" in p.as_posix() for p in carried(run))  # the default pack keeps the final adapter
