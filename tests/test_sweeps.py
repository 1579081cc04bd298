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


def test_sweep_runs_land_in_run_folders_and_are_read_back(tiny, tmp_path, monkeypatch, capsys):
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
    said = capsys.readouterr().out  # what is left is said up front, and after each run how long the rest will take
    assert "[sw] 2 of 2 runs to train" in said and "1 to go, about" in said
    runs = load_sweep(tmp_path / "sw")
    assert set(runs) == {"lr=0.0001", "base"} and all(r["finished"] for r in runs.values())
    assert all([m["step"] for m in r["metrics"]] == [1] and [e["step"] for e in r["evals"]] == [0, 1]
               for r in runs.values())
    assert list(select(runs, "lr", base)) == ["0.0001", "0.0002"]
    mtimes = {p: p.stat().st_mtime for p in (tmp_path / "sw").glob("*/metrics.jsonl")}
    run_sweep(sweep, train, val)  # finished runs are skipped, not redone
    assert {p: p.stat().st_mtime for p in mtimes} == mtimes
    assert "[sw] 0 of 2 runs to train, 2 finished (read back)" in capsys.readouterr().out


def test_a_config_field_added_later_at_its_default_keeps_old_runs_resumable(tmp_path):
    from agentlab.runs import RunDir, RunExistsError

    run = RunDir(tmp_path / "r")
    run.prepare({"lr": 1.0})
    run.prepare({"lr": 1.0, "hint_p": 0.0}, defaults={"hint_p": 0.0})
    other = RunDir(tmp_path / "r2")
    other.prepare({"lr": 1.0})
    with pytest.raises(RunExistsError, match="hint_p"):  # a non-default value is a real change
        other.prepare({"lr": 1.0, "hint_p": 0.5}, defaults={"hint_p": 0.0})


def test_seeds_repeat_every_setting_and_are_read_back_together(tmp_path):
    """``seeds``: each setting once per seed; ``select_seeds`` groups an axis's runs over seeds, ``final_success``
    and ``plot_seeds`` summarise them (synthetic run dicts: no model)."""
    from agentlab.plots import plot_seeds
    from agentlab.sweeps import final_success, plan, select_seeds, settings
    from agentlab.train import Experiment

    base = Experiment(lr=2e-4, groups_per_step=2, seed=0)
    sweep = plan("s", base, {"lr": [1e-4, 2e-4]}, seeds=(0, 1, 2))
    assert list(sweep.runs) == ["lr=0.0001", "lr=0.0001,seed=1", "lr=0.0001,seed=2", "base", "seed=1", "seed=2"]
    assert sweep.runs["seed=2"].seed == 2 and sweep.runs["lr=0.0001,seed=1"].lr == 1e-4
    with pytest.raises(ValueError, match="not both"):
        settings(base, {"seed": [0, 1]}, seeds=(0, 1))

    def run(lr, seed, success):
        ev = [{"step": s, "success": {"mean": v, "ci_low": v, "ci_high": v, "n": 8}} for s, v in zip((0, 4), success)]
        return {"config": {**base.to_config(), "lr": lr, "seed": seed}, "evals": ev,
                "metrics": [{"step": s, "reward_mean": v} for s, v in zip((1, 2), success)]}

    runs = {"a": run(1e-4, 0, (0.2, 0.4)), "b": run(1e-4, 1, (0.2, 0.6)), "c": run(2e-4, 0, (0.2, 0.8)),
            "d": run(2e-4, 2, (0.2, 0.5)), "other": {**run(2e-4, 0, (0, 0)), "config": {
                **base.to_config(), "groups_per_step": 4}}}
    groups = select_seeds(runs, "lr", base)
    assert list(groups) == ["0.0001", "0.0002"] and [r["config"]["seed"] for r in groups["0.0002"]] == [0, 2]
    f = final_success(groups["0.0002"])
    assert f["per_seed"] == [0.8, 0.5] and f["low"] == 0.5 and f["high"] == 0.8 and abs(f["mean"] - 0.65) < 1e-9
    from matplotlib.collections import PolyCollection
    from matplotlib.container import ErrorbarContainer

    ax = plot_seeds(groups, "success")  # two evaluations a run: dots and the seeds' range as bars, no painted band
    assert ax.get_legend_handles_labels()[1][0] == "0.0001 (mean of 2 seeds), bar: seeds' range"
    assert sum(isinstance(c, ErrorbarContainer) for c in ax.containers) == 2
    assert not any(isinstance(c, PolyCollection) for c in ax.collections)
    ax.figure.savefig(tmp_path / "seeds.png")
    for r in runs.values():  # six evaluations a run: curves, the range shaded between them
        r["evals"] = [{"step": s, "success": {"mean": 0.1 * s, "ci_low": 0, "ci_high": 1, "n": 8}} for s in range(6)]
    ax = plot_seeds(select_seeds(runs, "lr", base), "success")
    assert sum(isinstance(c, PolyCollection) for c in ax.collections) == 2 and not ax.containers
    assert ax.get_legend_handles_labels()[1][0] == "0.0001 (mean of 2 seeds)"
    plot_seeds(groups, "reward_mean")


def test_a_held_out_metric_other_than_success_is_read_from_each_evaluation(tmp_path):
    """``held_out:<name>``: an evaluation's own figure (reward) or its environment's metric (doc_search's curated-set
    size), plotted per run with its CI and per setting over seeds; an evaluation lacking it is skipped, an unknown
    metric name refused."""
    from agentlab.plots import plot_runs, plot_seeds
    from agentlab.runs import held_out
    from agentlab.sweeps import final_success

    def ev(step, reward, curated):
        return {"step": step, "success": {"mean": 0.5, "ci_low": 0.4, "ci_high": 0.6},
                "reward": {"mean": reward, "ci_low": reward - 0.1, "ci_high": reward + 0.1},
                "env_metrics": {"curated": {"mean": curated, "ci_low": curated - 1, "ci_high": curated + 1}}}

    runs = [{"config": {"seed": s}, "metrics": [], "evals": [ev(0, 0.5, 1.0), ev(6, 0.6 + 0.1 * s, 2.0 + s)]}
            for s in range(3)]
    assert held_out(runs[0]["evals"][1], "held_out:curated")["mean"] == 2.0
    assert held_out(runs[0]["evals"][1], "held_out:reward")["mean"] == 0.6
    assert held_out(runs[0]["evals"][1], "success")["mean"] == 0.5 and held_out({}, "held_out:f4") is None
    f = final_success(runs, "held_out:curated")
    assert f["per_seed"] == [2.0, 3.0, 4.0] and f["step"] == 6 and final_success(runs)["mean"] == 0.5
    ax = plot_seeds({"base": runs}, "held_out:curated")
    line = ax.containers[0].lines[0]  # the mean over seeds at each evaluation
    assert list(line.get_ydata()) == [1.0, 3.0] and ax.get_ylabel().startswith("held-out curated")
    runs[2]["evals"][1]["env_metrics"] = {}  # lacks the metric: only its step-0 point is drawn
    ax = plot_runs({str(i): r for i, r in enumerate(runs)}, "held_out:curated")
    assert [len(line.get_xdata()) for line in ax.lines] == [2, 2, 1]
    with pytest.raises(ValueError, match="held_out:"):
        plot_runs({"a": runs[0]}, "f4")
    ax.figure.savefig(tmp_path / "held_out.png")


def test_lesson_runs_laid_out_by_setting_and_seed_are_read_back_together(tmp_path):
    """``load_seeded``: ``<setting>/seed-<k>/`` run folders grouped by setting, seeds in numeric order (seed-10
    after seed-2); a folder without a config (not started) is not a run."""
    from agentlab.runs import RunDir
    from agentlab.sweeps import load_seeded

    for setting, seed in (("base", 10), ("base", 2), ("lr_x10", 0)):
        RunDir(tmp_path / setting / f"seed-{seed}").prepare({"lr": 1.0, "seed": seed})
    (tmp_path / "few_groups" / "seed-0").mkdir(parents=True)
    runs = load_seeded(tmp_path)
    assert list(runs) == ["base", "lr_x10"]
    assert [r["config"]["seed"] for r in runs["base"]] == [2, 10] and runs["lr_x10"][0]["evals"] == []


def test_seeds_that_agree_draw_a_bar_of_zero_not_an_error(tmp_path):
    """Three seeds at 0.1: their mean rounds to 0.10000000000000002, past every seed; the seeds' range bar must be
    zero, not a negative length matplotlib refuses (notebook 06 stopped on the doc_search batch lesson's validation
    precision at step 0, the seeds' shared SFT start)."""
    from agentlab.plots import plot_seeds

    def run(seed):
        return {"config": {"seed": seed}, "metrics": [],
                "evals": [{"step": s, "success": {"mean": 0.1, "ci_low": 0.0, "ci_high": 0.2, "n": 8}}
                          for s in (0, 4)]}

    ax = plot_seeds({"agree": [run(s) for s in range(3)]}, "success")
    bars = ax.containers[0].lines[2][0].get_segments()  # one vertical segment an evaluation: [(x, low), (x, high)]
    assert [round(seg[1][1] - seg[0][1], 12) for seg in bars] == [0.0, 0.0]
    ax.figure.savefig(tmp_path / "agree.png")


def test_the_training_reward_band_stays_within_the_rewards_the_rollouts_got(tmp_path):
    """7 successes in 8 rollouts: mean 0.875, ±1.96·SE reaches 1.10, past every reward a rollout can get (notebook
    09's step 7 drew it so). The band is kept within the step's recorded reward range; a run that recorded no
    range (made before ``reward_min``/``reward_max``) keeps the unclipped band."""
    from agentlab.plots import plot_runs

    rewards = [1.0] * 7 + [0.0]
    mean, std = sum(rewards) / 8, (sum((r - 0.875) ** 2 for r in rewards) / 8) ** 0.5
    step = {"step": 1, "reward_mean": mean, "reward_std": std}
    ranged = {**step, "reward_min": 0.0, "reward_max": 1.0}
    config = {"groups_per_step": 2, "group_size": 4}
    runs = {"recorded": {"config": config, "metrics": [ranged, {**ranged, "step": 2}], "evals": []},
            "older": {"config": config, "metrics": [step, {**step, "step": 2}], "evals": []}}
    ax = plot_runs(runs, "reward_mean")
    top = [max(path.vertices[:, 1]) for band in ax.collections for path in band.get_paths()]
    assert top[0] == 1.0 and top[1] > 1.1
    ax.figure.savefig(tmp_path / "band.png")
