"""Plots a person would rather look at than read: success with 95% CIs, training curves, checkpoint evals.

Every function takes plain dicts/lists read from run folders and writes (or returns) a matplotlib figure, so a
notebook can re-plot any run without retraining.
"""

from __future__ import annotations

import math
from pathlib import Path

from agentlab.runs import HELD_OUT, held_out


def _plt():
    # No matplotlib.use(...): in a notebook the inline backend must stay (figures show up); headless scripts get
    # Agg from matplotlib's own fallback.
    import matplotlib.pyplot as plt

    return plt


def _ci_bar(ax, labels: list[str], stats: list[dict], title: str, colors=None,
            ylabel: str = "held-out success (95% bootstrap CI)") -> None:
    import textwrap

    means = [s["mean"] for s in stats]
    lows = [s["mean"] - s["ci_low"] for s in stats]
    highs = [s["ci_high"] - s["mean"] for s in stats]
    labels = [textwrap.fill(label, 12) for label in labels]  # long arm names side by side would overlap
    bars = ax.bar(labels, means, yerr=[lows, highs], capsize=6, color=colors or "#4C72B0", alpha=0.85)
    for bar, s in zip(bars, stats, strict=True):
        ax.annotate(f"{s['mean']:.2f}\n[{s['ci_low']:.2f}, {s['ci_high']:.2f}]\nn={s['n']}",
                    (bar.get_x() + bar.get_width() / 2, s["ci_high"]), ha="center", va="bottom", fontsize=8,
                    xytext=(0, 3), textcoords="offset points")
    top = max(s["ci_high"] for s in stats)
    ax.set_ylim(0, 1.2 if top <= 1 else 1.25 * top)  # a rate's axis ends at 1; a count's above its highest CI
    ax.set_ylabel(ylabel)
    ax.set_title(title)


def success_bars(ax, stats: dict[str, dict], title: str = "", colors=None,
                 ylabel: str = "held-out success (95% bootstrap CI)") -> None:
    """Bars of means with their 95% CIs: ``{label: {"mean", "ci_low", "ci_high", "n"}}`` — success rates by
    default; another quantity (guesses per game) with its own ``ylabel``."""
    _ci_bar(ax, list(stats), list(stats.values()), title, colors, ylabel)


def plot_eval_summary(summary: dict, path: str | Path | None = None):
    """One evaluation: success with CI, and why episodes failed."""
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.6))
    _ci_bar(a, [summary.get("label") or summary.get("env", "eval")], [summary["success"]], "success")
    breakdown = summary.get("breakdown", {})
    cats = {"success": breakdown.get("success", 0), **breakdown.get("model", {}), "infra": breakdown.get("infra", 0)}
    b.barh(list(cats), list(cats.values()), color=["#55A868"] + ["#C44E52"] * (len(cats) - 2) + ["#8172B2"])
    b.set_xlabel("episodes")
    b.set_title("outcome of each episode")
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return fig


def plot_training(metrics: list[dict], evals: list[dict], axes=None, refs: dict | None = None):
    """Train reward / valid rollouts / zero-variance groups per step, and checkpoint evals with CI bands.

    ``refs``: horizontal reference lines on the eval panel, e.g. ``{"base": 0.0, "SFT": 0.41}``.
    """
    plt = _plt()
    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    else:
        fig = axes[0].figure
    steps = [m["step"] for m in metrics]
    ax = axes[0]
    ax.plot(steps, [m["reward_mean"] for m in metrics], "o-", label="train reward (mean)")
    ax.plot(steps, [m["valid_rollouts"] for m in metrics], "s--", label="valid rollouts (final answer given)")
    ax.plot(steps, [m["zero_variance_groups"] for m in metrics], "^:", label="zero-variance groups")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("mean reward; share of the step's rollouts / groups")
    ax.set_ylim(-0.05, 1.15)
    ax.set_title("training")
    ax.legend(fontsize=8, loc="lower right")
    checkpoint_curve(axes[1], evals, refs, ylabel="validation success", title="validation success per checkpoint")
    fig.tight_layout()
    return fig


def checkpoint_curve(ax, evals: list[dict], refs: dict | None = None, ylabel: str = "validation success",
                     title: str = "", chosen: int | None = None, color=None) -> None:
    """Checkpoint evaluations (``evals/step-N.json``) against the GRPO step, with their 95% CI band; ``refs`` as
    dashed horizontal lines, ``chosen`` as a dotted vertical one."""
    if evals:
        es = [e["step"] for e in evals]
        ax.fill_between(es, [e["success"]["ci_low"] for e in evals], [e["success"]["ci_high"] for e in evals],
                        alpha=0.25, label="95% CI", color=color)
        ax.plot(es, [e["success"]["mean"] for e in evals], "o-", color=color,
                label=f"checkpoint eval (n={evals[0]['success']['n']})")
    if chosen is not None:
        ax.axvline(chosen, ls=":", color=color, label=f"chosen: step {chosen}")
    for i, (name, value) in enumerate((refs or {}).items()):
        ax.axhline(value, ls="--", color=f"C{i + 2}", label=name)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel(ylabel)
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(title)
    ax.legend(fontsize=8)


def plot_report(report: dict, metrics: list[dict], evals: list[dict], path: str | Path):
    """The quickstart's one-page figure: base → SFT → GRPO with CIs, and the GRPO curves."""
    plt = _plt()
    fig = plt.figure(figsize=(15, 4.2))
    grid = fig.add_gridspec(1, 3)
    ax0 = fig.add_subplot(grid[0, 0])
    palette = {"base": "#8C8C8C", "sft": "#4C72B0", "grpo": "#55A868", "sft_matched": "#64B5CD"}
    stages = [k for k in palette if k in report]
    _ci_bar(ax0, stages, [{"mean": report[k]["success"], **report[k]} for k in stages],
            f"{report.get('env', '')}: test success", colors=[palette[k] for k in stages])
    # Reference lines from the split the checkpoint curve is on (validation): the SFT start's own figure there.
    start = report.get("choices", {}).get("sft_best", {}).get("validation")
    refs = {"SFT start (validation)": start["success"]} if start else \
        {f"{k} (final eval)": report[k]["success"] for k in ("base", "sft") if k in report}
    plot_training(metrics, evals, axes=[fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[0, 2])], refs=refs)
    fig.suptitle(report.get("title", ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_rewards(episodes: list, advantages: list[float], groups: int = 8, title: str = "", fig=None):
    """Rescored rollouts: reward distribution (successes vs failures) and each group's GRPO advantages.

    Used by notebook 05's sliders: pass the output of ``agentlab.reward_design.rescore``. Bars are the advantages of the
    first ``groups`` groups, one bar per rollout, green when the rollout succeeded; a group with no bars above
    the axis taught nothing.
    """
    plt = _plt()
    import numpy as np

    if fig is None:
        fig = plt.figure(figsize=(12, 3.6))
    fig.clear()
    a, b = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 2]})
    rewards = np.array([ep.reward for ep in episodes])
    ok = np.array([ep.success >= 1.0 for ep in episodes])
    bins = np.linspace(min(rewards.min(), -0.3), max(rewards.max(), 1.0) + 1e-6, 24)
    a.hist([rewards[ok], rewards[~ok]], bins=bins, stacked=True, color=["#55A868", "#C44E52"],
           label=[f"success ({ok.sum()})", f"failure ({(~ok).sum()})"])
    a.set_xlabel("reward")
    a.set_ylabel("rollouts")
    a.set_title("reward distribution")
    a.legend(fontsize=8)
    keys = list(dict.fromkeys((ep.step, ep.group) for ep in episodes))[:groups]
    x = 0
    for i, key in enumerate(keys):
        members = [(ep, adv) for ep, adv in zip(episodes, advantages, strict=True) if (ep.step, ep.group) == key]
        for ep, adv in members:
            b.bar(x, adv, color="#55A868" if ep.success >= 1.0 else "#C44E52", width=0.8)
            b.annotate(f"{ep.reward:.2f}", (x, adv), ha="center", va="bottom" if adv >= 0 else "top", fontsize=6)
            x += 1
        x += 1
        if i < len(keys) - 1:
            b.axvline(x - 1, color="#DDDDDD", lw=0.8)
    b.axhline(0, color="black", lw=0.8)
    b.set_xticks([])
    b.set_xlabel(f"rollouts of the first {len(keys)} groups (label: reward; green: success)")
    b.set_ylabel("GRPO advantage")
    b.set_ylim(-2.2, 2.2)
    b.set_title("group advantages (what the gradient sees)")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


RUN_METRICS = {
    "success": "held-out success (checkpoint evals, 95% CI)",
    "reward_mean": "train reward (mean of the step's rollouts)",
    "valid_rollouts": "valid-rollout share (final answer given)",
    "entropy": "policy entropy (nats / token)",
    "zero_variance_groups": "zero-variance groups",
    "time_step_s": "seconds per step",
    "grad_norm": "gradient norm (before clipping)",
    "kl": "KL to the reference policy (β > 0 only)",
    "clip_ratio": "share of tokens clipped (PPO ratio outside 1 ± ε)",
    "completion_length": "completion tokens per rollout (all turns)",
}


def _axis(metric: str) -> tuple[str, bool]:
    """A run metric's axis label (``RUN_METRICS``' entry, or a held-out metric's: ``held_out:<name>``) and whether
    checkpoint evaluations hold it (else the per-step training metrics do)."""
    if metric in RUN_METRICS:
        return RUN_METRICS[metric], metric == "success"
    if metric.startswith(HELD_OUT) and metric != HELD_OUT:
        return f"held-out {metric.removeprefix(HELD_OUT)} (checkpoint evals, 95% CI)", True
    raise ValueError(f"metric {metric!r} unknown; expected one of {list(RUN_METRICS)} or '{HELD_OUT}<name>' (an "
                     "evaluation's figure, e.g. held_out:reward, or an environment metric, e.g. held_out:f4)")


def _rolling(values: list[float], window: int) -> list[float]:
    out = []
    for i in range(len(values)):
        chunk = [v for v in values[max(0, i - window + 1): i + 1] if v is not None]
        out.append(sum(chunk) / len(chunk) if chunk else float("nan"))
    return out


def plot_runs(runs: dict[str, dict], metric: str = "success", x: str = "step", ax=None, smooth: int = 1,
              title: str = ""):
    """Overlay one metric of several runs (``agentlab.sweeps.load_run`` dicts) against ``step`` or
    ``prompts_seen``. A held-out metric (success, ``held_out:<name>``) is drawn with its bootstrap CI band;
    ``reward_mean`` with a ±1.96·SE band of the step's rollouts, kept within the rewards they got where the run
    recorded them (7 successes of 8 would otherwise band up to 1.10); other metrics as lines, optionally smoothed
    over ``smooth`` steps."""
    plt = _plt()
    label_y, from_evals = _axis(metric)
    if x not in ("step", "prompts_seen"):
        raise ValueError(f"x={x!r}; expected 'step' or 'prompts_seen'")
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.8))
    for i, (label, run) in enumerate(runs.items()):
        per_step = run["config"].get("groups_per_step", 1) if x == "prompts_seen" else 1
        color = f"C{i % 10}"
        if from_evals:
            ev = [(e["step"] * per_step, v) for e in run["evals"] if (v := held_out(e, metric))]
            xs = [k for k, _ in ev]
            ax.plot(xs, [v["mean"] for _, v in ev], "o-", color=color, label=label)
            ax.fill_between(xs, [v["ci_low"] for _, v in ev], [v["ci_high"] for _, v in ev], color=color, alpha=0.12)
            continue
        ms = [m for m in run["metrics"] if m.get(metric) is not None]
        xs = [m["step"] * per_step for m in ms]
        ys = _rolling([m[metric] for m in ms], smooth)
        ax.plot(xs, ys, "-", color=color, label=label, marker="." if len(xs) < 30 else None)
        if metric == "reward_mean":
            n = run["config"].get("groups_per_step", 1) * run["config"].get("group_size", 1)
            se = _rolling([1.96 * m["reward_std"] / n ** 0.5 for m in ms], smooth)
            lo = _rolling([m.get("reward_min", -math.inf) for m in ms], smooth)
            hi = _rolling([m.get("reward_max", math.inf) for m in ms], smooth)
            ax.fill_between(xs, [max(y - s, b) for y, s, b in zip(ys, se, lo, strict=True)],
                            [min(y + s, b) for y, s, b in zip(ys, se, hi, strict=True)], color=color, alpha=0.1)
    ax.set_xlabel("prompts seen" if x == "prompts_seen" else "GRPO step")
    ax.set_ylabel(label_y)
    if metric in ("success", "valid_rollouts", "zero_variance_groups"):
        ax.set_ylim(-0.05, 1.05)
    ax.set_title(title or label_y.split(" (")[0])
    ax.legend(fontsize=7)
    return ax


FEW_POINTS = 4  # a seed curve with this many points or fewer is drawn as points with range bars


def plot_seeds(groups: dict[str, list[dict]], metric: str = "success", x: str = "step", ax=None, smooth: int = 1,
               title: str = ""):
    """Several seeds per setting (``agentlab.sweeps.select_seeds``): each seed's run thin, the mean over seeds
    thick, the range between the lowest and highest seed shaded. With three seeds the range is what to read: a
    difference between settings is worth believing when their ranges do not overlap. With a handful of points
    (``FEW_POINTS``: a short run evaluated twice) each seed is a dot and the range a bar at each point."""
    plt = _plt()
    import numpy as np

    label_y, from_evals = _axis(metric)
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.8))
    for i, (label, runs) in enumerate(groups.items()):
        color, curves = f"C{i % 10}", []
        for run in runs:
            per_step = run["config"].get("groups_per_step", 1) if x == "prompts_seen" else 1
            if from_evals:
                pts = {e["step"] * per_step: v["mean"] for e in run["evals"] if (v := held_out(e, metric))}
            else:
                ms = [m for m in run["metrics"] if m.get(metric) is not None]
                pts = dict(zip([m["step"] * per_step for m in ms], _rolling([m[metric] for m in ms], smooth),
                               strict=True))
            curves.append(pts)
        common = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
        few = len(common) <= FEW_POINTS  # a handful of evaluations: points, not curves
        # settings side by side at each point, so their bars do not hide each other
        shift = (i - (len(groups) - 1) / 2) * 0.02 * (max(common) - min(common) or 1) if few and common else 0
        for pts in curves:
            ax.plot([k + shift for k in pts], list(pts.values()), "." if few else "-", color=color,
                    alpha=0.45 if few else 0.3, lw=0.8, ms=5)
        if common:
            ys = np.array([[c[k] for k in common] for c in curves])
            mean, label = ys.mean(0), f"{label} (mean of {len(curves)} seeds)"
            if few:  # the seeds' range as a bar at each evaluation: no band painted between two points
                # clipped at 0: where the seeds agree, the mean of equal floats can round a hair past them
                yerr = np.clip([mean - ys.min(0), ys.max(0) - mean], 0, None)
                ax.errorbar([k + shift for k in common], mean, yerr=yerr, fmt="o--",
                            color=color, lw=1, capsize=4, ms=6, label=label + ", bar: seeds' range")
            else:
                ax.plot(common, mean, "o-" if from_evals else "-", color=color, lw=2, label=label)
                ax.fill_between(common, ys.min(0), ys.max(0), color=color, alpha=0.12)
    ax.set_xlabel("prompts seen" if x == "prompts_seen" else "GRPO step")
    ax.set_ylabel(label_y.replace("95% CI", "seeds' range"))
    if metric in ("success", "valid_rollouts", "zero_variance_groups"):
        ax.set_ylim(-0.05, 1.05)
    ax.set_title(title or label_y.split(" (")[0])
    ax.legend(fontsize=7)
    return ax


def plot_comparison(result: dict, grpo_evals: list[dict], path: str | Path | None = None):
    """``agentlab compare``'s figure: each arm's test success, GRPO minus each baseline (paired), and GRPO's
    validation curve against the chosen SFT start."""
    plt = _plt()
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4.2), gridspec_kw={"width_ratios": [1.3, 1, 1]})
    arms = [k for k in ("sft_best", "sft_matched", "rft", "expert_iteration", "grpo", "sft_all") if k in result]
    palette = {"sft_best": "#4C72B0", "sft_matched": "#64B5CD", "rft": "#CCB974", "expert_iteration": "#8172B2",
               "grpo": "#55A868", "sft_all": "#8C8C8C"}
    _ci_bar(a, arms, [{"mean": result[k]["success"], **result[k]} for k in arms],
            f"{result['env']}, regime {result['regime']}, seed {result['seed']}: test success",
            colors=[palette[k] for k in arms])
    diffs = [k for k in result if k.startswith("grpo_minus_")]
    if diffs:
        ys = range(len(diffs))
        means = [result[k]["mean"] for k in diffs]
        b.errorbar(means, ys, xerr=[[m - result[k]["ci_low"] for m, k in zip(means, diffs, strict=True)],
                                    [result[k]["ci_high"] - m for m, k in zip(means, diffs, strict=True)]],
                   fmt="o", capsize=5, color="#55A868")
        b.axvline(0, color="k", lw=0.8)
        b.set_yticks(list(ys), [k.replace("grpo_minus_", "GRPO − ") for k in diffs])
        b.set_xlabel("paired difference in test success (95% CI)")
        b.set_title("does GRPO beat each baseline?")
    if grpo_evals:
        choices = result.get("choices", {})
        sft = choices.get("sft_best", {}).get("validation")
        checkpoint_curve(c, grpo_evals, {"sft_best": sft["success"]} if sft else None,
                         title="GRPO on validation (chooses the checkpoint)", chosen=choices.get("grpo", {}).get("step"),
                         color="#55A868")
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return fig


def metric_groups(ax, policies: dict[str, dict], metrics: tuple[str, ...], title: str = "") -> None:
    """Grouped bars: one group per metric, one bar per policy, each with its 95% CI whisker.

    ``policies``: ``{policy: {metric: {"mean", "ci_low", "ci_high"}}}`` (a seed of ``seed_systems.json``)."""
    import numpy as np

    names = list(policies)
    width = 0.8 / max(1, len(names))
    xs = np.arange(len(metrics))
    for i, name in enumerate(names):
        stats = [policies[name][m] for m in metrics]
        means = [s["mean"] for s in stats]
        ax.bar(xs + (i - (len(names) - 1) / 2) * width, means, width, label=name, alpha=0.85,
               yerr=[[m - s["ci_low"] for m, s in zip(means, stats, strict=True)],
                     [s["ci_high"] - m for m, s in zip(means, stats, strict=True)]], capsize=3)
    ax.set_xticks(xs, metrics)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("held-out mean (95% bootstrap CI)")
    ax.legend(fontsize=8)
    ax.set_title(title)


def plot_pass_at_k(curves: dict[str, list[dict]], ax=None, title: str = ""):
    """pass@k per policy (``evals.pass_at_k_curve``'s points), each with its 95% CI over tasks shaded: where two
    policies' curves meet at large k, the better pass@1 is sharpening what both could sample."""
    plt = _plt()
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.6))
    for i, (label, points) in enumerate(curves.items()):
        ks = [p["k"] for p in points]
        ax.plot(ks, [p["mean"] for p in points], "o-", color=f"C{i % 10}", label=f"{label} ({points[0]['n']} tasks)")
        ax.fill_between(ks, [p["ci_low"] for p in points], [p["ci_high"] for p in points], color=f"C{i % 10}",
                        alpha=0.15)
    ax.set(xlabel="k (samples per task)", ylabel="pass@k (unbiased), 95% CI", ylim=(-0.02, 1.02),
           title=title or "pass@k")
    ax.legend(fontsize=8)
    return ax


def plot_failures(breakdowns: dict[str, dict[str, int]], ax=None, title: str = ""):
    """How each policy's episodes failed (``evals.failure_breakdown(...)["model"]``), one stacked bar per
    policy: the kinds of failure a reader compares, where a printed dict hides them."""
    plt = _plt()
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.4))
    kinds = sorted({k for b in breakdowns.values() for k in b})
    bottom = [0] * len(breakdowns)
    for i, kind in enumerate(kinds):
        counts = [b.get(kind, 0) for b in breakdowns.values()]
        ax.bar(list(breakdowns), counts, bottom=bottom, color=f"C{i % 10}", label=kind.replace("_", " "))
        bottom = [x + c for x, c in zip(bottom, counts, strict=True)]
    ax.set(ylabel="failed episodes", title=title or "how episodes failed")
    ax.legend(fontsize=8)
    return ax
