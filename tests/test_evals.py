"""Evaluation statistics against independent references (scipy's bootstrap, math.comb, brute-force enumeration,
simulation), plus behaviour, failure breakdowns, infra re-scoring and rollouts.jsonl I/O on lookup episodes."""

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats

from agentlab import evals
from agentlab.envs import load
from agentlab.evals import (
    best_of_n,
    bootstrap_ci,
    expected_best_of,
    failure_breakdown,
    failure_category,
    paired_bootstrap_ci,
    pass_at_k,
    predicted_zero_variance,
    read_rollouts,
    rescore_infra,
    summarize,
    write_episode,
    zero_variance_share,
)
from agentlab.reward_design import scripted_episode
from agentlab.types import Turn


@pytest.fixture(scope="module")
def lookup():
    return load("lookup")


@pytest.fixture(scope="module")
def episodes(lookup):
    """40 tasks × 4 samples: the expert on even samples, the random policy on odd ones; a few made infra."""
    out = []
    for g, task in enumerate(lookup.make_tasks("train", 40, seed=1)):
        for s in range(4):
            policy = lookup.expert if s % 2 == 0 else lookup.random_policy
            out.append(scripted_episode(lookup, task, policy, group=g, sample=s, step=0))
    for i in (1, 6, 13):  # dropped sandbox connections: must never count against the model
        out[i] = replace(out[i], failure="infra", exit_reason="error")
    return out




@pytest.mark.parametrize("kind", ["normal", "binary", "skewed"])
def test_bootstrap_ci_agrees_with_scipy_percentile(kind):
    rng = np.random.default_rng(3)
    values = {"normal": rng.normal(0.4, 1.0, 60), "binary": (rng.random(80) < 0.3).astype(float),
              "skewed": rng.exponential(1.0, 40)}[kind]
    ours = bootstrap_ci(values, confidence=0.9, n_resamples=20_000, seed=1)
    ref = stats.bootstrap((values,), np.mean, confidence_level=0.9, n_resamples=20_000, method="percentile",
                          random_state=np.random.default_rng(2)).confidence_interval
    # Two independent Monte-Carlo estimates of the same quantiles: agree to a small fraction of the SE.
    se = values.std(ddof=1) / math.sqrt(values.size)
    assert abs(ours[0] - ref.low) < 0.1 * se and abs(ours[1] - ref.high) < 0.1 * se


def test_bootstrap_ci_edge_cases():
    assert bootstrap_ci([0.7]) == (0.7, 0.7)
    assert bootstrap_ci([1.0] * 50) == (1.0, 1.0)
    assert bootstrap_ci([0, 1, 1, 0, 1], seed=5) == bootstrap_ci([0, 1, 1, 0, 1], seed=5)
    low, high = bootstrap_ci(np.arange(10.0))
    assert low < 4.5 < high
    with pytest.raises(ValueError, match="empty"):
        bootstrap_ci([])
    with pytest.raises(ValueError, match="NaN"):
        bootstrap_ci([1.0, float("nan")])


def test_paired_bootstrap_pairs_episodes_by_task(episodes):
    expert = [ep for ep in episodes if ep.sample % 2 == 0]
    rand = [ep for ep in episodes if ep.sample % 2 == 1]
    low, high = paired_bootstrap_ci(list(reversed(rand)), expert)  # order must not matter
    per_task_gain = [np.mean([e.success for e in expert if e.task.id == t and e.failure != "infra"])
                     - np.mean([e.success for e in rand if e.task.id == t and e.failure != "infra"])
                     for t in sorted({e.task.id for e in episodes})]
    assert (low, high) == bootstrap_ci(per_task_gain)
    assert 0.5 < low <= high <= 1.0
    with pytest.raises(ValueError, match="equal lengths"):
        paired_bootstrap_ci([1, 2], [1, 2, 3])


def _pass_at_k_brute(n, c, k):
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_closed_form_and_enumeration():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                closed = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(closed, abs=1e-12)
                assert pass_at_k(n, c, k) == pytest.approx(_pass_at_k_brute(n, c, k), abs=1e-12)
    assert pass_at_k(200, 3, 50) == pytest.approx(1 - math.comb(197, 50) / math.comb(200, 50))
    with pytest.raises(ValueError):
        pass_at_k(5, 6, 1)


def test_best_of_n_matches_enumeration(episodes):
    rng = np.random.default_rng(0)
    for m, n in [(4, 2), (5, 3), (6, 1), (6, 6)]:
        values = rng.random(m).round(2)
        brute = np.mean([max(s) for s in itertools.combinations(values, n)])
        assert expected_best_of(values, n) == pytest.approx(brute)
    report = best_of_n(episodes, 2)
    per_task = evals.per_task(episodes)
    ref = np.mean([pass_at_k(len(v), int(sum(v)), 2) for v in per_task.values() if len(v) >= 2])
    assert report["best_of_n"]["mean"] == pytest.approx(ref)
    assert report["best_of_n"]["mean"] >= report["best_of_1"]["mean"] and report["gap"]["ci_low"] > 0
    assert report["skipped_tasks"] == 0 and report["tasks"] == 40
    assert best_of_n(episodes, 4)["skipped_tasks"] == 3  # three tasks lost a sample to infra


def test_predicted_zero_variance_matches_simulation():
    rng = np.random.default_rng(7)
    p_T = rng.beta(0.5, 0.5, size=400)  # per-task success probabilities, many near 0 or 1
    G = 8
    successes_TRG = rng.random((400, 50, G)) < p_T[:, None, None]
    simulated = np.mean(successes_TRG.all(axis=2) | (~successes_TRG).all(axis=2))
    assert predicted_zero_variance(p_T, G) == pytest.approx(simulated, abs=0.01)
    assert predicted_zero_variance(0.5, 2) == 0.5


def test_zero_variance_share_counts_flat_groups(episodes):
    share = zero_variance_share(episodes)
    flat = [replace(ep, reward=1.0) for ep in episodes]
    assert zero_variance_share(flat) == 1.0
    by_group = {}
    for ep in episodes:
        if ep.failure != "infra":
            by_group.setdefault(ep.group, []).append(ep.reward)
    assert share == pytest.approx(np.mean([max(v) == min(v) for v in by_group.values()]))


def test_summarize_excludes_infra_and_reports_cis(episodes):
    report = summarize(episodes)
    assert report["n_episodes"] == 160 and report["n_infra"] == 3
    valid = [ep for ep in episodes if ep.failure != "infra"]
    assert report["success"]["n"] == 157
    assert report["success"]["mean"] == pytest.approx(np.mean([ep.success for ep in valid]))
    assert report["success_provisional"]["mean"] < report["success"]["mean"]
    for key in ("success", "reward", "no_answer", "turns", "tokens", "off_form_calls", "tool_errors", "exact"):
        stat = report[key]
        assert set(stat) == {"mean", "ci_low", "ci_high", "n"}
        assert stat["ci_low"] <= stat["mean"] <= stat["ci_high"]
    assert report["turns"]["mean"] == 2.0 and report["no_answer"]["mean"] == 0.0
    breakdown = report["breakdown"]
    assert breakdown["infra"] == 3 and breakdown["success"] + breakdown["model_total"] + 3 == 160
    assert set(breakdown["model"]) <= {"wrong_answer"}


def test_failure_categories_and_behaviour(lookup, episodes):
    task = episodes[0].task
    off = scripted_episode(lookup, task, lookup.expert, max_calls=1)
    off = replace(off, turns=off.turns + [Turn("<tool_call>{bad", off_form=True)], exit_reason="no_tool_call")
    unfinished = replace(scripted_episode(lookup, task, lookup.expert, max_calls=1), exit_reason="context")
    cats = [failure_category(ep) for ep in (off, unfinished, episodes[0], episodes[1])]
    assert cats == ["off_form", "context", "success", "infra"]
    breakdown = failure_breakdown([off, unfinished])
    assert breakdown["model"] == {"off_form": 1, "context": 1} and breakdown["model_with_off_form"] == 1
    b = evals.behaviour([off, unfinished])
    assert b["off_form_calls"]["mean"] == pytest.approx(1 / 3)  # one off-form of three attempted calls
    assert b["off_form_episodes"]["mean"] == 0.5 and b["no_answer"]["mean"] == 1.0


def test_behaviour_reports_trajectory_vs_curated_recall(lookup, episodes):
    task = replace(episodes[0].task, env="doc_search", answer={"facts": [["P1"], ["P2"]]})
    ep = replace(episodes[0], task=task, metrics={"success": 0.0, "recall": 0.5, "trajectory_recall": 1.0})
    b = evals.behaviour([ep, ep])
    assert b["curated_recall"]["mean"] == 0.5 and b["trajectory_recall"]["mean"] == 1.0


def test_rescore_infra_reruns_only_infra_instances(lookup, episodes):
    calls = []

    def rerun(tasks):
        calls.append([t.id for t in tasks])
        return [scripted_episode(lookup, t, lookup.expert) for t in tasks]

    corrected, report = rescore_infra(episodes, rerun)
    assert calls == [[episodes[i].task.id for i in (1, 6, 13)]]
    assert [ep.failure for ep in episodes if ep.failure == "infra"] == ["infra"] * 3  # inputs untouched
    assert report["n_infra"] == 3 and report["still_infra"] == 0 and report["rounds"] == 1
    assert corrected[6].group == episodes[6].group and corrected[6].sample == episodes[6].sample
    assert report["provisional"]["n"] == 160 and report["infra_excluded"]["n"] == 157
    assert report["corrected"]["n"] == 160
    assert report["provisional"]["mean"] < report["corrected"]["mean"]
    assert corrected[0] is episodes[0]

    def flaky(tasks):
        return [replace(scripted_episode(lookup, t, lookup.expert), failure="infra") for t in tasks]

    _, report = rescore_infra(episodes, flaky, max_rounds=2)
    assert report["still_infra"] == 3 and report["rounds"] == 2


def test_rollouts_round_trip_and_survive_a_truncated_last_line(tmp_path, episodes):
    path = tmp_path / "rollouts.jsonl"
    with path.open("w") as fh:
        for ep in episodes[:5]:
            write_episode(fh, ep)
    back, skipped = read_rollouts(path)
    assert skipped == 0 and [e.to_json() for e in back] == [e.to_json() for e in episodes[:5]]
    with path.open("a") as fh:
        fh.write(episodes[5].to_json()[:57])  # the crash hit mid-line
    back, skipped = read_rollouts(path)
    assert len(back) == 5 and skipped == 1
    removed = evals.repair_rollouts(path)  # resume after the crash: drop the partial line, then append
    assert removed == 57 and read_rollouts(path) == (back, 0) and evals.repair_rollouts(path) == 0
    with path.open("a") as fh:
        write_episode(fh, episodes[5])
    assert len(read_rollouts(path)[0]) == 6
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:2] + ["{oops"] + lines[2:5]) + "\n")
    with pytest.raises(ValueError, match=":3:"):
        read_rollouts(path)


def test_an_evaluation_split_over_processes_writes_what_one_process_writes(tmp_path):
    """Two worker processes, each with its share of the tasks: the same episodes, in task order, group indices
    as one run numbers them, one rollouts file (the shards removed), the worker count in the summary."""
    from agentlab.evals import read_rollouts
    from agentlab.pipeline import evaluate
    from agentlab.rollout import LoopConfig

    spec = load("lookup")
    tasks = spec.make_tasks("test", 5, seed=3)
    loop = LoopConfig(max_turns=2, max_new_tokens=8, temperature=0.0, precision="fp32")
    one = evaluate("tiny-random", "lookup", tasks, tmp_path / "one", loop=loop, workers=1)
    two = evaluate("tiny-random", "lookup", tasks, tmp_path / "two", loop=loop, workers=2)
    a, b = (read_rollouts(tmp_path / d / "rollouts.jsonl")[0] for d in ("one", "two"))
    expected = [(t.id, g) for g, t in enumerate(tasks)]
    assert [(e.task.id, e.group) for e in b] == expected == [(e.task.id, e.group) for e in a]
    assert [e.tokens["completion_ids"] for e in b] == [e.tokens["completion_ids"] for e in a]
    assert (one["workers"], two["workers"], two["success"]["n"]) == (1, 2, 5)
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["rollouts.jsonl", "summary.json", "summary.png"]


def test_an_interrupted_greedy_evaluation_resumes_with_the_episodes_it_wrote(tmp_path, capsys):
    """A kill mid-evaluation (here: the file cut after three episodes, the fourth torn, no summary) costs only the
    episodes not yet written: they are read back, the rest decoded, and the file ends as an uninterrupted run's
    (every task once, in task order, groups numbered alike)."""
    from agentlab.evals import read_rollouts
    from agentlab.pipeline import evaluate
    from agentlab.rollout import LoopConfig

    spec = load("lookup")
    tasks = spec.make_tasks("test", 6, seed=3)
    loop = LoopConfig(max_turns=2, max_new_tokens=8, temperature=0.0, precision="fp32")
    whole = evaluate("tiny-random", "lookup", tasks, tmp_path / "whole", loop=loop, workers=1)
    cut = tmp_path / "cut"
    cut.mkdir()
    lines = (tmp_path / "whole" / "rollouts.jsonl").read_text().splitlines()
    (cut / "rollouts.jsonl").write_text("\n".join(lines[:3]) + "\n" + lines[3][:40])
    capsys.readouterr()
    resumed = evaluate("tiny-random", "lookup", tasks, cut, loop=loop, workers=1)
    assert "3 of 6 episodes read back" in capsys.readouterr().out
    a, b = (read_rollouts(d / "rollouts.jsonl")[0] for d in (tmp_path / "whole", cut))
    assert [(e.task.id, e.group) for e in b] == [(t.id, g) for g, t in enumerate(tasks)] == [(e.task.id, e.group)
                                                                                               for e in a]
    assert resumed["success"]["n"] == whole["success"]["n"] == 6
    assert [e.tokens["completion_ids"] for e in b[:3]] == [e.tokens["completion_ids"] for e in a[:3]]
    evaluate("tiny-random", "lookup", tasks[:2], cut, loop=loop, workers=1)  # a finished folder: evaluated anew
    assert "read back" not in capsys.readouterr().out and len(read_rollouts(cut / "rollouts.jsonl")[0]) == 2


def test_a_finished_evaluation_file_is_in_task_order_and_re_reading_it_gives_the_summary_s_intervals(tmp_path, tiny):
    """Episodes are written as they end, so short ones come first; a finished file is rewritten in task order, so a
    reader that re-reads it computes the same seeded bootstrap intervals as the summary (notebook 08 printed one
    success rate with two intervals: one from the summary, one from the file read back in finishing order). An
    evaluation whose episodes were all written but whose summary was not (a kill between the two) ends alike."""
    import random

    from agentlab.engines.scripted import scripted_generate_fn
    from agentlab.pipeline import evaluate
    from agentlab.rollout import LoopConfig, Renderer

    spec = load("lookup")
    tasks = spec.make_tasks("test", 12, seed=3)
    quick = {t.id for t in tasks[::2]}  # these stop at once (no call: a failure); the others search, then answer

    def policy(task):
        if task.id not in quick:
            yield from spec.expert(task)

    loop = LoopConfig(max_turns=3, max_new_tokens=64, temperature=0.0, precision="fp32", batch_size=12)
    engine = lambda *_: scripted_generate_fn(Renderer(tiny[1], spec.env_class), tasks, policy)
    summary = evaluate("tiny-random", "lookup", tasks, tmp_path, loop=loop, workers=1, engine=engine)
    episodes = read_rollouts(tmp_path / "rollouts.jsonl")[0]
    assert [e.task.id for e in episodes] == [t.id for t in tasks]
    assert [e.success for e in episodes] == [t.id not in quick for t in tasks]
    again = summarize(episodes)
    assert again["success"] == summary["success"] and again["env_metrics"] == summary["env_metrics"]

    lines = (tmp_path / "rollouts.jsonl").read_text().splitlines()
    random.Random(0).shuffle(lines)
    (tmp_path / "rollouts.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "summary.json").unlink()
    resumed = evaluate("tiny-random", "lookup", tasks, tmp_path, loop=loop, workers=1, engine=engine)
    assert [e.task.id for e in read_rollouts(tmp_path / "rollouts.jsonl")[0]] == [t.id for t in tasks]
    assert resumed["success"] == summary["success"]
