"""Plots a person would rather look at than read: success with 95% CIs, training curves, checkpoint evals.

Every function takes plain dicts/lists read from run folders and writes (or returns) a matplotlib figure, so a
notebook can re-plot any run without retraining.
"""

from __future__ import annotations

from pathlib import Path


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _ci_bar(ax, labels: list[str], stats: list[dict], title: str, colors=None) -> None:
    means = [s["mean"] for s in stats]
    lows = [s["mean"] - s["ci_low"] for s in stats]
    highs = [s["ci_high"] - s["mean"] for s in stats]
    bars = ax.bar(labels, means, yerr=[lows, highs], capsize=6, color=colors or "#4C72B0", alpha=0.85)
    for bar, s in zip(bars, stats, strict=True):
        ax.annotate(f"{s['mean']:.2f}\n[{s['ci_low']:.2f}, {s['ci_high']:.2f}]\nn={s['n']}",
                    (bar.get_x() + bar.get_width() / 2, s["ci_high"]), ha="center", va="bottom", fontsize=8,
                    xytext=(0, 3), textcoords="offset points")
    ax.set_ylim(0, 1.15)
    ax.set_ylabel("held-out success (95% bootstrap CI)")
    ax.set_title(title)


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
    ax.set_ylim(-0.05, 1.15)
    ax.set_title("training")
    ax.legend(fontsize=8, loc="lower right")
    ax = axes[1]
    if evals:
        es = [e["step"] for e in evals]
        mean = [e["success"]["mean"] for e in evals]
        ax.fill_between(es, [e["success"]["ci_low"] for e in evals], [e["success"]["ci_high"] for e in evals],
                        alpha=0.25, label="95% CI")
        ax.plot(es, mean, "o-", label=f"checkpoint eval (n={evals[0]['success']['n']})")
    for i, (name, value) in enumerate((refs or {}).items()):
        ax.axhline(value, ls="--", color=f"C{i + 2}", label=name)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("held-out success")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("held-out success per checkpoint")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_report(report: dict, metrics: list[dict], evals: list[dict], path: str | Path):
    """The quickstart's one-page figure: base → SFT → GRPO with CIs, and the GRPO curves."""
    plt = _plt()
    fig = plt.figure(figsize=(15, 4.2))
    grid = fig.add_gridspec(1, 3)
    ax0 = fig.add_subplot(grid[0, 0])
    stages = [k for k in ("base", "sft", "grpo") if k in report]
    _ci_bar(ax0, stages, [{"mean": report[k]["success"], **report[k]} for k in stages],
            f"{report.get('env', '')}: held-out success", colors=["#8C8C8C", "#4C72B0", "#55A868"][: len(stages)])
    refs = {f"{k} (final eval)": report[k]["success"] for k in ("base", "sft") if k in report}
    plot_training(metrics, evals, axes=[fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[0, 2])], refs=refs)
    fig.suptitle(report.get("title", ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
