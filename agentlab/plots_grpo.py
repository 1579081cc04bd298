"""Figures of what happens inside GRPO training: its objective on one run (TRL's diagnostics, the advantages the
rollouts received) and an asynchronous run's staleness, step time and validation per ``max_staleness``.

Plain dicts in, a matplotlib figure out, as in :mod:`agentlab.plots`.
"""

from __future__ import annotations

from agentlab.plots import RUN_METRICS, _plt


def _empty_panel(metric: str, points: list, config: dict) -> str:
    """Why a diagnostic has nothing to show, or "" when it has."""
    if metric == "kl" and not config.get("beta"):
        return "β = 0: no reference model,\nso no KL to log"
    if not points:
        return "not logged"
    if metric == "clip_ratio" and not any(v for _, v in points):
        return "0 at every step: one update per\ngeneration, so the ratio is 1\n(nothing to clip)"
    return ""


def plot_objective(run: dict, episodes: list, fig=None):
    """What GRPO's objective did in one run (``agentlab.sweeps.load_run``), on TRL's own diagnostics and the
    run's training rollouts: gradient norm, KL, clipped-token share, entropy and completion length per step; the
    advantages the rollouts received (as the run's ``scale_rewards`` made them), tool calls per episode, and
    what dividing by the group's std does to groups whose rewards differ by little or by much."""
    from agentlab.reward_design import episode_advantages

    plt = _plt()
    fig = fig or plt.figure(figsize=(13, 6.2))
    axes = fig.subplots(2, 4).ravel()
    for ax, metric in zip(axes, ("grad_norm", "kl", "clip_ratio", "entropy", "completion_length"), strict=False):
        points = [(m["step"], m[metric]) for m in run["metrics"] if m.get(metric) is not None]
        if points:
            ax.plot(*zip(*points, strict=True), ".-")
        why = _empty_panel(metric, points, run["config"])
        if why:  # a blank or flat panel says why, instead of leaving the reader to guess
            ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, color="grey", fontsize=8,
                    wrap=True)
        ax.set(xlabel="GRPO step", title=RUN_METRICS[metric].split(" (")[0], ylabel=RUN_METRICS[metric])
        ax.yaxis.label.set_size(7)
    scaling = run["config"].get("scale_rewards", "group")
    scaled = episode_advantages(episodes, scale=True)
    centred = episode_advantages(episodes, scale=False)
    trained = scaled if scaling == "group" else centred  # ("batch" divides every group by one std: same shape)
    kept = [i for i, e in enumerate(episodes) if e.failure != "infra"]
    axes[5].hist([trained[i] for i in kept], bins=25, color="C2")
    axes[5].set(xlabel="advantage", ylabel="rollouts", title=f"advantages (scale_rewards={scaling!r})")
    calls = [sum(len(t.tool_calls) for t in e.turns) for e in episodes]
    axes[6].hist(calls, bins=range(max(calls, default=0) + 2), color="C4", align="left")
    axes[6].set(xlabel="tool calls in the episode", ylabel="rollouts", title="tool calls per episode")
    # Per group with any spread: its mean |advantage| with and without the division by the group's std.
    groups: dict = {}
    for i in kept:
        groups.setdefault((episodes[i].step, episodes[i].group), []).append(i)
    rows = [(max(episodes[i].reward for i in g) - min(episodes[i].reward for i in g),
             sum(abs(scaled[i]) for i in g) / len(g), sum(abs(centred[i]) for i in g) / len(g))
            for g in groups.values() if len({episodes[i].reward for i in g}) > 1]
    spread, by_std, plain = zip(*rows, strict=True) if rows else ((), (), ())
    axes[7].scatter(spread, by_std, s=14, color="C3", label="÷ group std")
    axes[7].scatter(spread, plain, s=14, marker="x", color="C7", label="not divided")
    axes[7].set(xlabel="reward spread (max − min)", ylabel="mean |advantage|", title="group scaling")
    axes[7].legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_async(results: dict, fig=None):
    """``benchmarks/results/async_grpo.json`` as three panels: seconds per step per K (each seed a dot, the bar
    split into the trainer's wait for its rollouts and its training), the staleness of the groups trained on, and
    validation success per checkpoint (mean over seeds)."""
    plt = _plt()
    fig = fig or plt.figure(figsize=(13, 3.6))
    ax = fig.subplots(1, 3)
    ks = sorted(results["per_k"], key=int)
    for i, k in enumerate(ks):
        seeds = list(results["per_k"][k]["per_seed"].values())
        wait = sorted(v["generate_s"] for v in seeds)[len(seeds) // 2]
        train = sorted(v["train_s"] for v in seeds)[len(seeds) // 2]
        ax[0].bar(i, wait, color="C0", label="rollouts (sync) / wait for the worker" if i == 0 else None)
        ax[0].bar(i, train, bottom=wait, color="C1", label="forward, backward, optimiser" if i == 0 else None)
        ax[0].scatter([i] * len(seeds), [v["seconds_per_step"] for v in seeds], color="k", s=12, zorder=3,
                      label="a seed's median step" if i == 0 else None)
        counts: dict = {}
        for v in seeds:
            for s, n in v["staleness"].items():
                counts[int(s)] = counts.get(int(s), 0) + n
        if counts:
            ax[1].bar([s + (i - 1) * 0.25 for s in sorted(counts)], [counts[s] for s in sorted(counts)], 0.25,
                      label=f"K = {k}", color=f"C{i + 2}")
        steps = sorted({e["step"] for v in seeds for e in v["validation"]})
        means = [sum(e["success"] for v in seeds for e in v["validation"] if e["step"] == s)
                 / sum(1 for v in seeds for e in v["validation"] if e["step"] == s) for s in steps]
        ax[2].plot(steps, means, ".-", color=f"C{i + 2}", label=f"K = {k}" + (" (synchronous)" if k == "0" else ""))
    ax[0].set_xticks(range(len(ks)), [f"K = {k}" for k in ks])
    ax[0].set(ylabel="seconds per GRPO step (median)", title="where a step's time goes")
    ax[0].legend(fontsize=7)
    ax[1].set_xticks(range(max(map(int, ks)) + 1))
    ax[1].set(xlabel="staleness (updates between the sampling policy and the update)", ylabel="steps",
              title="staleness of the groups trained on")
    ax[1].legend(fontsize=7)
    seeds = sorted({s for e in results["per_k"].values() for s in e["per_seed"]})
    ax[2].set(xlabel="GRPO step", ylabel="validation success (greedy)", ylim=(0, 1),
              title=f"validation per checkpoint, mean of seed{'s' if len(seeds) > 1 else ''} {', '.join(seeds)}")
    ax[2].legend(fontsize=7)
    fig.tight_layout()
    return fig
