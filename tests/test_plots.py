"""Figures whose content teaches something: GRPO's objective (notebook 07)."""

from dataclasses import replace

import pytest

from agentlab.envs import load

SPEC = load("lookup")


def test_the_objective_figure_shows_that_group_scaling_enlarges_a_small_bonus():
    """A group whose rewards differ by a 0.1 bonus gets advantages as large as a 0-or-1 group once divided by
    the group's std (scale_rewards="group"), and ten times smaller without the division."""
    import matplotlib

    matplotlib.use("Agg")
    from agentlab.plots_grpo import plot_objective
    from agentlab.reward_design import scripted_episode

    tasks = SPEC.make_tasks("train", 2, seed=0)
    episodes = [replace(scripted_episode(SPEC, tasks[g], SPEC.expert), step=1, group=g, sample=s, reward=r)
                for g, rewards in enumerate([[0.0, 0.1], [0.0, 1.0]]) for s, r in enumerate(rewards)]
    run = {"config": {"scale_rewards": "group"}, "metrics": [
        {"step": 1, "grad_norm": 0.5, "entropy": 0.9, "clip_ratio": 0.0, "completion_length": 60.0}]}
    fig = plot_objective(run, episodes)
    scaling = fig.axes[7]
    by_std, plain = (c.get_offsets().data.ravel().tolist() for c in scaling.collections)
    assert by_std == pytest.approx([0.1, 0.7071, 1.0, 0.7071], abs=1e-3)  # (spread, mean |advantage|) per group
    assert plain == pytest.approx([0.1, 0.05, 1.0, 0.5])
    assert fig.axes[1].texts[0].get_text().startswith("β = 0: no reference model")  # a blank panel says why
    assert "ratio is 1" in fig.axes[2].texts[0].get_text()  # and a flat one: one update per generation, no clipping
    assert not fig.axes[0].texts  # a panel with something to show carries no note
    run["metrics"][0]["clip_ratio"] = 0.02
    assert not plot_objective(run, episodes).axes[2].texts
    assert fig.axes[6].patches  # tool calls per episode drawn


def test_the_async_figure_shows_each_k_its_step_time_split_staleness_and_validation():
    from agentlab.plots_grpo import plot_async

    def seed(step_s, wait, staleness):
        return {"seconds_per_step": step_s, "generate_s": wait, "train_s": step_s - wait, "staleness": staleness,
                "validation": [{"step": 0, "success": 0.2}, {"step": 4, "success": 0.4}]}

    results = {"per_k": {"0": {"per_seed": {"0": seed(10.0, 6.0, {})}},
                         "1": {"per_seed": {"0": seed(8.0, 1.0, {"0": 1, "1": 3})}}}}
    fig = plot_async(results)
    times, stale, val = fig.axes
    assert [round(b.get_height(), 1) for b in times.patches] == [6.0, 4.0, 1.0, 7.0]  # wait, then training, per K
    assert sorted(b.get_height() for b in stale.patches) == [1, 3]  # only K = 1 has stale steps
    assert [list(line.get_ydata()) for line in val.lines] == [[0.2, 0.4], [0.2, 0.4]]


def test_pass_at_k_is_drawn_with_its_interval_and_failures_as_stacked_bars():
    from agentlab.evals import pass_at_k_curve
    from agentlab.plots import plot_failures, plot_pass_at_k

    curves = {"sft": pass_at_k_curve({"a": [1, 0, 0, 0], "b": [0, 0, 0, 0], "c": [0, 1, 0, 0]}, 4),
              "grpo": pass_at_k_curve({"a": [1, 1, 1, 0], "b": [0, 0, 0, 0], "c": [1, 1, 0, 1]}, 4)}
    ax = plot_pass_at_k(curves)
    assert [line.get_label() for line in ax.get_lines()] == ["sft (3 tasks)", "grpo (3 tasks)"]
    assert len(ax.collections) == 2  # each curve's CI band
    assert list(ax.get_lines()[1].get_ydata()) == [p["mean"] for p in curves["grpo"]]
    ax = plot_failures({"sft": {"wrong_answer": 5, "off_form": 2}, "grpo": {"wrong_answer": 3}})
    heights = {(bar.get_x(), round(bar.get_height())) for bar in ax.patches}
    assert sorted(h for _, h in heights) == [0, 2, 3, 5]  # grpo's off-form bar is there, empty
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["off form", "wrong answer"]


def test_ci_bars_of_a_count_fit_their_axis_and_long_labels_wrap():
    """Guesses per game on the success-rate axis (0 to 1.2) drew every bar off the top (notebook 10)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agentlab.plots import success_bars

    fig, (a, b) = plt.subplots(1, 2)
    success_bars(a, {"cheap (hop from 25)": {"mean": 0.55, "ci_low": 0.45, "ci_high": 0.65, "n": 96}})
    success_bars(b, {"SFT": {"mean": 9.0, "ci_low": 8.6, "ci_high": 9.4, "n": 96}}, ylabel="guesses per game")
    assert a.get_ylim() == (0, 1.2) and "\n" in a.get_xticklabels()[0].get_text()
    assert b.get_ylim()[1] > 9.4 and b.get_ylabel() == "guesses per game"
    plt.close(fig)
