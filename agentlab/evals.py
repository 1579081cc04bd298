"""Evaluation from saved rollouts: rates with bootstrap CIs, pass@k and best-of-n, behaviour, failure breakdowns,
infra re-scoring, and crash-safe ``rollouts.jsonl`` I/O. Runs write files; this module only reads them::

    from agentlab.evals import read_rollouts, summarize
    episodes, skipped = read_rollouts("runs/lookup-grpo/rollouts.jsonl")
    report = summarize(episodes)          # {"success": {"mean", "ci_low", "ci_high", "n"}, …, "breakdown": {…}}

Infra-failed episodes (``failure == "infra"``: the sandbox dropped, not the policy) never count against the
model: ``success`` excludes them from its denominator, ``success_provisional`` shows what counting them as
failures would have said, and ``rescore_infra`` re-runs them to get the corrected number.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import IO

import numpy as np

from agentlab.rewards import off_form_calls, precision_recall, trajectory_recall
from agentlab.types import Episode, Task

_CHUNK = 2_000_000  # resampled indices held in memory at once (16 MB of int64)


# -- confidence intervals ------------------------------------------------------------------------------------------


def _resampled_means(values_NK: np.ndarray, n_resamples: int, seed: int) -> np.ndarray:
    """Means of ``n_resamples`` bootstrap resamples of the rows of ``values_NK``: shape (R, K)."""
    n = values_NK.shape[0]
    rng = np.random.default_rng(seed)
    out_RK = np.empty((n_resamples, values_NK.shape[1]))
    step = max(1, _CHUNK // n)
    for start in range(0, n_resamples, step):
        stop = min(start + step, n_resamples)
        idx = rng.integers(0, n, size=(stop - start, n))
        out_RK[start:stop] = values_NK[idx].mean(axis=1)
    return out_RK


def _check(values, name: str = "values") -> np.ndarray:
    v = np.asarray(values, dtype=float).ravel()
    if v.size == 0:
        raise ValueError(f"{name} is empty; a confidence interval needs at least one value")
    if np.isnan(v).any():
        raise ValueError(f"{name} holds {int(np.isnan(v).sum())} NaN(s); drop or fill them first")
    return v


def _interval(stat_R: np.ndarray, confidence: float) -> tuple[float, float]:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    alpha = (1 - confidence) / 2
    low, high = np.quantile(stat_R, [alpha, 1 - alpha])
    return float(low), float(high)


def bootstrap_ci(values, confidence: float = 0.95, n_resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap CI of the mean (what ``scipy.stats.bootstrap(method="percentile")`` computes).

    >>> bootstrap_ci([1.0, 1.0, 1.0])
    (1.0, 1.0)
    >>> low, high = bootstrap_ci([0, 1] * 50); round(low, 2), round(high, 2)
    (0.4, 0.6)
    """
    v = _check(values)
    if v.size == 1 or np.all(v == v[0]):  # no spread to resample; also avoids float noise in the quantiles
        return float(v[0]), float(v[0])
    return _interval(_resampled_means(v[:, None], n_resamples, seed)[:, 0], confidence)


def mean_ci(values, confidence: float = 0.95, n_resamples: int = 10_000, seed: int = 0) -> dict:
    """``{"mean", "ci_low", "ci_high", "n"}`` — the shape every rate in a report has (NaNs when empty)."""
    v = np.asarray(values, dtype=float).ravel()
    if v.size == 0:
        return {"mean": math.nan, "ci_low": math.nan, "ci_high": math.nan, "n": 0}
    low, high = bootstrap_ci(v, confidence, n_resamples, seed)
    return {"mean": float(v.mean()), "ci_low": low, "ci_high": high, "n": int(v.size)}


def ratio_ci(numerators, denominators, confidence: float = 0.95, n_resamples: int = 10_000, seed: int = 0) -> dict:
    """Pooled rate ``Σ num / Σ den`` (e.g. off-form calls per call) with a CI from resampling *episodes*, so
    calls from one episode stay together. ``n`` is the number of episodes."""
    num, den = np.asarray(numerators, dtype=float), np.asarray(denominators, dtype=float)
    if num.size == 0 or den.sum() == 0:
        return {"mean": math.nan, "ci_low": math.nan, "ci_high": math.nan, "n": int(num.size)}
    means_R2 = _resampled_means(np.stack([num, den], axis=1), n_resamples, seed)
    ratios_R = np.divide(means_R2[:, 0], means_R2[:, 1], out=np.zeros(n_resamples), where=means_R2[:, 1] > 0)
    low, high = _interval(ratios_R, confidence)
    return {"mean": float(num.sum() / den.sum()), "ci_low": low, "ci_high": high, "n": int(num.size)}


def per_task(episodes: Iterable[Episode], metric: str = "success") -> dict[str, list[float]]:
    """``{task_id: [value per sample]}`` over non-infra episodes; ``metric`` is ``"reward"`` or a metrics key."""
    out: dict[str, list[float]] = defaultdict(list)
    for ep in episodes:
        if ep.failure != "infra":
            out[ep.task.id].append(float(ep.reward if metric == "reward" else ep.metrics.get(metric, 0.0)))
    return dict(out)


def paired_bootstrap_ci(a, b, confidence: float = 0.95, n_resamples: int = 10_000, seed: int = 0,
                        metric: str = "success") -> tuple[float, float]:
    """CI of the mean of ``b − a`` on the same instances (checkpoint b versus checkpoint a).

    Lists of numbers are paired by position; lists of Episodes are paired by task id (the per-task mean over
    samples, infra failures dropped), using the tasks both sides have. Pairing removes the between-task
    variance that makes two unpaired CIs overlap even when one checkpoint is better on nearly every task.

    >>> paired_bootstrap_ci([0, 0, 1, 1], [1, 1, 1, 1])
    (0.0, 1.0)
    """
    if a and isinstance(next(iter(a)), Episode):
        ta, tb = per_task(a, metric), per_task(b, metric)
        common = sorted(set(ta) & set(tb))
        if not common:
            raise ValueError("the two episode lists share no task id; nothing to pair")
        a = [float(np.mean(ta[t])) for t in common]
        b = [float(np.mean(tb[t])) for t in common]
    va, vb = _check(a, "a"), _check(b, "b")
    if va.shape != vb.shape:
        raise ValueError(f"paired values need equal lengths, got {va.size} and {vb.size}")
    return bootstrap_ci(vb - va, confidence, n_resamples, seed)


# -- pass@k, best-of-n, zero-variance groups -----------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples with ``c`` correct: ``1 − C(n−c, k) / C(n, k)``, as a stable product.

    >>> round(pass_at_k(10, 3, 1), 6), pass_at_k(10, 8, 5)
    (0.3, 1.0)
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def task_pass_at_k(values: list[float], k: int) -> float:
    """pass@k of one task from its samples' values (a value >= 1 is a solve).

    >>> task_pass_at_k([1, 0, 0, 0], 2)
    0.5
    """
    return pass_at_k(len(values), int(sum(x >= 1.0 for x in values)), k)


def pass_at_k_curve(samples: dict[str, list[float]], k: int) -> list[dict]:
    """pass@j for j = 1..k from ``{task: [0/1 per sample]}`` (tasks with fewer than ``k`` samples are left out),
    each the unbiased estimator averaged over tasks with a 95% bootstrap CI over tasks:
    ``[{"k", "mean", "ci_low", "ci_high", "n"}]``.

    >>> [round(p["mean"], 3) for p in pass_at_k_curve({"a": [1, 0, 0, 0], "b": [0, 0, 0, 0]}, 4)]
    [0.125, 0.25, 0.375, 0.5]
    """
    usable = {t: v for t, v in samples.items() if len(v) >= k}
    return [{"k": j, **mean_ci([task_pass_at_k(v, j) for v in usable.values()])} for j in range(1, k + 1)]


def expected_best_of(values, n: int) -> float:
    """Expected max of ``n`` draws without replacement from ``values`` (pass@n when values are 0/1).

    >>> round(expected_best_of([0.0, 0.5, 1.0], 2), 4)  # subsets {0,.5}, {0,1}, {.5,1} → (0.5 + 1 + 1) / 3
    0.8333
    """
    v = np.sort(np.asarray(values, dtype=float))
    m = v.size
    if not 1 <= n <= m:
        raise ValueError(f"need 1 <= n <= {m} samples, got n={n}")
    # The i-th smallest (1-based) is the max of a random n-subset with probability C(i−1, n−1) / C(m, n).
    weights = np.array([math.comb(i - 1, n - 1) / math.comb(m, n) for i in range(1, m + 1)])
    return float(weights @ v)


def best_of_n(episodes: list[Episode], n: int, metric: str = "success", **ci) -> dict:
    """Best-of-n versus best-of-1 over saved rollouts grouped by task: the headroom GRPO can close by sharpening
    what the policy already does. Tasks with fewer than ``n`` samples are skipped (and counted)."""
    groups = per_task(episodes, metric)
    usable = {t: v for t, v in groups.items() if len(v) >= n}
    bo1 = [float(np.mean(v)) for v in usable.values()]
    bon = [expected_best_of(v, n) for v in usable.values()]
    return {"n": n, "metric": metric, "best_of_1": mean_ci(bo1, **ci), "best_of_n": mean_ci(bon, **ci),
            "gap": mean_ci(np.subtract(bon, bo1), **ci), "tasks": len(usable),
            "skipped_tasks": len(groups) - len(usable)}


def zero_variance_share(episodes: list[Episode], metric: str = "reward") -> float:
    """Share of GRPO groups (keyed by ``(step, group)``, ≥ 2 non-infra samples) whose rewards are all equal:
    those groups have zero advantage everywhere and contribute no gradient."""
    groups: dict[tuple, list[float]] = defaultdict(list)
    for ep in episodes:
        if ep.failure != "infra":
            groups[(ep.step, ep.group)].append(ep.reward if metric == "reward" else ep.metrics.get(metric, 0.0))
    sizes = [v for v in groups.values() if len(v) >= 2]
    if not sizes:
        return math.nan
    return float(np.mean([np.ptp(v) <= 1e-12 for v in sizes]))


def predicted_zero_variance(p, G: int) -> float:
    """Expected share of zero-variance groups of size ``G`` for a binary reward with success probability ``p``
    (a number, or per-task probabilities to average over): ``p**G + (1 − p)**G``.

    >>> predicted_zero_variance(0.5, 4), predicted_zero_variance([0.0, 1.0], 8)
    (0.125, 1.0)
    """
    p = np.asarray(p, dtype=float)
    return float(np.mean(p**G + (1 - p) ** G))


# -- behaviour and failures ----------------------------------------------------------------------------------------


def _calls(ep: Episode) -> list[dict]:
    return [c for turn in ep.turns for c in turn.tool_calls]


def behaviour(episodes: list[Episode], **ci) -> dict:
    """What the policy does, each as ``{"mean", "ci_low", "ci_high", "n"}`` over non-infra episodes.

    Retrieval tasks (``task.answer["facts"]``) add ``curated_recall`` and ``trajectory_recall``: a gap between
    them says the policy sees the evidence but does not keep it.
    """
    eps = [ep for ep in episodes if ep.failure != "infra"]
    calls = [_calls(ep) for ep in eps]
    out = {
        "no_answer": mean_ci([not any(str(x).strip() for x in ep.outcome.final) for ep in eps], **ci),
        "exact": mean_ci([ep.metrics.get("exact", 0.0) for ep in eps], **ci),
        "turns": mean_ci([len(ep.turns) for ep in eps], **ci),
        "tokens": mean_ci([sum(t.n_generated for t in ep.turns) for ep in eps], **ci),
        "off_form_episodes": mean_ci([off_form_calls(ep) > 0 for ep in eps], **ci),
        # An off-form turn is one attempted call that never became a parsed call, hence the sum in the denominator.
        "off_form_calls": ratio_ci([off_form_calls(ep) for ep in eps],
                                   [len(c) + off_form_calls(ep) for c, ep in zip(calls, eps, strict=True)], **ci),
        "tool_errors": ratio_ci([sum(x.get("error") == "policy" for x in c) for c in calls],
                                [len(c) for c in calls], **ci),
        "lenient_turns": ratio_ci([sum(t.lenient for t in ep.turns) for ep in eps], [len(ep.turns) for ep in eps],
                                  **ci),
    }
    # every number the environment's evaluate() reports (doc_search: precision, recall, f1, f4, curated-set size)
    keys = sorted({k for ep in eps for k, v in ep.metrics.items() if isinstance(v, int | float)} - {"success"})
    out["env_metrics"] = {k: mean_ci([float(ep.metrics.get(k, 0.0)) for ep in eps], **ci) for k in keys}
    facts_eps = [ep for ep in eps if ep.task.answer.get("facts") or "recall" in ep.metrics]
    if facts_eps:
        out["curated_recall"] = mean_ci([ep.metrics["recall"] if "recall" in ep.metrics else precision_recall(
            ep.outcome.final, ep.task.answer["facts"])[1] for ep in facts_eps], **ci)
        out["trajectory_recall"] = mean_ci([trajectory_recall(ep) for ep in facts_eps], **ci)
    return out


def failure_category(ep: Episode) -> str:
    """``success`` | ``infra`` | why the model failed: the loop's exit (``max_turns``, ``context``,
    ``no_tool_call``, ``error``), ``off_form`` (it ended on a call that could not be parsed), ``empty_answer``,
    ``wrong_answer`` or ``partial`` (0 < success < 1)."""
    if ep.failure == "infra":
        return "infra"
    if ep.failure is None:
        return "success"
    if not ep.outcome.finished:
        if ep.turns and ep.turns[-1].off_form:
            return "off_form"
        return ep.exit_reason if ep.exit_reason in ("max_turns", "context", "no_tool_call", "error") else "no_answer"
    if not any(str(x).strip() for x in ep.outcome.final):
        return "empty_answer"
    return "partial" if ep.success > 0 else "wrong_answer"


def failure_breakdown(episodes: list[Episode]) -> dict:
    """Model failures by category next to infra failures (which are re-run, never charged to the model)."""
    counts = Counter(failure_category(ep) for ep in episodes)
    model = {k: v for k, v in counts.most_common() if k not in ("success", "infra")}
    return {"n": len(episodes), "success": counts["success"], "infra": counts["infra"], "model": model,
            "model_total": sum(model.values()),
            "model_with_off_form": sum(1 for ep in episodes if ep.failure == "model" and off_form_calls(ep))}


def success_entry(summary: dict) -> dict:
    """A summary's headline as reports tabulate it: ``{"success", "ci_low", "ci_high", "n"}``.

    >>> success_entry({"success": {"mean": 0.5, "ci_low": 0.25, "ci_high": 0.75, "n": 8}})
    {'success': 0.5, 'ci_low': 0.25, 'ci_high': 0.75, 'n': 8}
    """
    s = summary["success"]
    return {"success": s["mean"], "ci_low": s["ci_low"], "ci_high": s["ci_high"], "n": s["n"]}


def summarize(episodes: list[Episode], **ci) -> dict:
    """Headline numbers, each with a bootstrap CI, plus behaviour and the failure breakdown.

    ``success`` excludes infra failures from its denominator; ``success_provisional`` counts them as failures
    (what a harness that cannot tell them apart would report). ``ci`` passes ``confidence``, ``n_resamples``,
    ``seed`` to the bootstrap.
    """
    valid = [ep for ep in episodes if ep.failure != "infra"]
    return {
        "n_episodes": len(episodes),
        "n_infra": len(episodes) - len(valid),
        "success": mean_ci([ep.success for ep in valid], **ci),
        "success_provisional": mean_ci([0.0 if ep.failure == "infra" else ep.success for ep in episodes], **ci),
        "reward": mean_ci([ep.reward for ep in valid], **ci),
        **behaviour(valid, **ci),
        "breakdown": failure_breakdown(episodes),
    }


def rescore_infra(episodes: list[Episode], rerun: Callable[[list[Task]], list[Episode]],
                  max_rounds: int = 3, **ci) -> tuple[list[Episode], dict]:
    """Re-run only the infra-failed instances (up to ``max_rounds`` times) and report before/after.

    ``rerun(tasks) -> episodes`` is provided by the rollout loop and must return one episode per task, in order;
    the replacements keep the originals' ``group``, ``sample`` and ``step``. Inputs are not modified.
    Report: ``provisional`` (infra counted as failures), ``infra_excluded`` (infra dropped), ``corrected``
    (after re-running) success with CIs, counts, and the failure breakdown before and after.
    """
    current = list(episodes)
    rounds = 0
    for rounds in range(1, max_rounds + 1):
        todo = [i for i, ep in enumerate(current) if ep.failure == "infra"]
        if not todo:
            rounds -= 1
            break
        fresh = rerun([current[i].task for i in todo])
        if len(fresh) != len(todo):
            raise ValueError(f"rerun returned {len(fresh)} episodes for {len(todo)} tasks")
        for i, new in zip(todo, fresh, strict=True):
            old = current[i]
            if new.task.id != old.task.id:
                raise ValueError(f"rerun returned task {new.task.id!r} where {old.task.id!r} was expected")
            current[i] = replace(new, group=old.group, sample=old.sample, step=old.step)
    before, after = summarize(episodes, **ci), summarize(current, **ci)
    report = {
        "provisional": before["success_provisional"],
        "infra_excluded": before["success"],
        "corrected": after["success"],
        "n_infra": before["n_infra"],
        "still_infra": after["n_infra"],
        "rounds": rounds,
        "breakdown_before": before["breakdown"],
        "breakdown_after": after["breakdown"],
    }
    return current, report


# -- rollouts.jsonl ------------------------------------------------------------------------------------------------


def write_episode(fh: IO[str], ep: Episode) -> None:
    """Append one episode as one JSON line and flush, so a crash loses at most the line being written."""
    fh.write(ep.to_json() + "\n")
    fh.flush()


def write_rollouts(path: str | Path, episodes: list[Episode]) -> None:
    """``episodes`` as a whole ``rollouts.jsonl``, in their order, written whole or not at all (a kill leaves the old
    file or the new one: ``agentlab.runs.write_jsonl``'s rule, without parsing each episode's JSON back)."""
    from agentlab.runs import _atomic_write

    _atomic_write(Path(path), "".join(ep.to_json() + "\n" for ep in episodes))


def repair_rollouts(path: str | Path) -> int:
    """Cut a crash-truncated last line off ``path`` before appending to it again (the next write would otherwise
    glue onto it and corrupt a line in the middle). Returns the number of bytes removed."""
    path = Path(path)
    data = path.read_bytes() if path.exists() else b""
    keep = data.rfind(b"\n") + 1  # 0 when no complete line exists
    if keep < len(data):
        with path.open("r+b") as fh:
            fh.truncate(keep)
    return len(data) - keep


def read_rollouts(path: str | Path) -> tuple[list[Episode], int]:
    """Episodes from a ``rollouts.jsonl``, and how many lines were skipped (``agentlab.runs.read_jsonl``'s rule:
    a torn last line is dropped, a bad line elsewhere raises, naming the line)."""
    from agentlab.runs import read_jsonl

    records, skipped = read_jsonl(path)
    episodes = []
    for number, record in enumerate(records, start=1):
        try:
            episodes.append(Episode.from_dict(record))
        except (TypeError, KeyError) as exc:
            raise ValueError(f"{path}: record {number} is not an episode ({type(exc).__name__}: {exc})") from None
    return episodes, skipped
