"""Sweeps (notebook 06): one field varied at a time, run folders read back, old runs resumable."""

import pytest

from agentlab.envs import load

SPEC = load("lookup")


def test_sweep_settings_vary_one_field_at_a_time_and_share_the_base():
    from agentlab.sweeps import plan, run_key, settings
    from agentlab.train import Experiment

    base = Experiment(lr=2e-4, groups_per_step=2)
    axes = {"lr": [5e-5, 2e-4, 1e-3], "groups_per_step": [1, 2, 4]}
    got = settings(base, axes)
    assert got == [{"lr": 5e-5}, {}, {"lr": 1e-3}, {"groups_per_step": 1}, {"groups_per_step": 4}]
    assert len(settings(base, axes, mode="grid")) == 9
    sweep = plan("s", base, axes)
    assert list(sweep.runs) == ["lr=5e-05", "base", "lr=0.001", "groups_per_step=1", "groups_per_step=4"]
    assert sweep.runs["lr=0.001"].name == "s/lr=0.001" and sweep.runs["lr=0.001"].groups_per_step == 2
    assert run_key({"lr": 1e-3, "groups_per_step": 4}) == "groups_per_step=4,lr=0.001"
    with pytest.raises(ValueError, match="cannot sweep"):
        settings(base, {"env": ["lookup"]})
    with pytest.raises(ValueError, match="lr=-1"):  # every run validated before any starts
        plan("s", base, {"lr": [1e-4, -1.0]})


def test_sweep_runs_land_in_run_folders_and_are_read_back(tiny, tmp_path, monkeypatch):
    """A two-run sweep with the tiny model: each setting is a finished run folder under runs/<sweep>/, the second
    call skips them, and ``select`` picks one axis back out."""
    from agentlab.sweeps import load_sweep, plan, run_sweep, select
    from agentlab.train import Experiment

    monkeypatch.setenv("AGENTLAB_RUNS", str(tmp_path))
    base = Experiment(model="tiny-random", steps=1, eval_every=1, eval_tasks=1, groups_per_step=1, group_size=2,
                      max_new_tokens=4)
    sweep = plan("sw", base, {"lr": [1e-4, 2e-4]})
    train, val = SPEC.make_tasks("train", 4, seed=0), SPEC.make_tasks("validation", 1, seed=0)
    run_sweep(sweep, train, val)
    runs = load_sweep(tmp_path / "sw")
    assert set(runs) == {"lr=0.0001", "base"} and all(r["finished"] for r in runs.values())
    assert all([m["step"] for m in r["metrics"]] == [1] and [e["step"] for e in r["evals"]] == [0, 1]
               for r in runs.values())
    assert list(select(runs, "lr", base)) == ["0.0001", "0.0002"]
    mtimes = {p: p.stat().st_mtime for p in (tmp_path / "sw").glob("*/metrics.jsonl")}
    run_sweep(sweep, train, val)  # finished runs are skipped, not redone
    assert {p: p.stat().st_mtime for p in mtimes} == mtimes


def test_a_config_field_added_later_at_its_default_keeps_old_runs_resumable(tmp_path):
    from agentlab.runs import RunDir, RunExistsError

    run = RunDir(tmp_path / "r")
    run.prepare({"lr": 1.0})
    run.prepare({"lr": 1.0, "hint_p": 0.0}, defaults={"hint_p": 0.0})
    other = RunDir(tmp_path / "r2")
    other.prepare({"lr": 1.0})
    with pytest.raises(RunExistsError, match="hint_p"):  # a non-default value is a real change
        other.prepare({"lr": 1.0, "hint_p": 0.5}, defaults={"hint_p": 0.0})
