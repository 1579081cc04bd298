"""Reward terms, composition, advantages, the TRL adapter, the LLM judge's key hygiene, and reward-hacking probes.

Episodes come from the ``lookup`` fixture played by scripted policies (no model)."""

import functools
import io
import json
import statistics
import urllib.error
import urllib.request

import numpy as np
import pytest

from agentlab import reward_design, rewards
from agentlab.envs import default_reward, load
from agentlab.judge import Judge, llm_judge
from agentlab.reward_design import (
    episode_advantages,
    group_advantages,
    probe_report,
    rescore,
    scripted_episode,
)
from agentlab.rewards import compose, fbeta, format_bonus, off_form_penalty, precision_recall
from agentlab.trl_compat import trl_reward_func, turns_from_messages
from agentlab.types import Episode, InfraError, Outcome, Task, ToolCall, Turn, call_tool, run_policy


@pytest.fixture(scope="module")
def lookup():
    return load("lookup")


@pytest.fixture(scope="module")
def tasks(lookup):
    return lookup.make_tasks("train", 12, seed=0)




def test_fbeta_matches_the_closed_form_and_edge_cases():
    for p, r, beta in [(0.25, 1.0, 4), (0.5, 0.5, 1), (0.1, 0.9, 2), (1.0, 0.2, 0.5)]:
        expected = (1 + beta**2) * p * r / (beta**2 * p + r)
        assert fbeta(p, r, beta) == pytest.approx(expected)
    assert fbeta(0.3, 0.6, 1) == pytest.approx(statistics.harmonic_mean([0.3, 0.6]))
    assert fbeta(0.0, 1.0, 4) == 0.0 and fbeta(0.0, 0.0) == 0.0


def test_precision_recall_is_fact_based():
    facts = [["a", "b"], ["c"], ["d", "e"]]
    assert precision_recall(["a", "b"], facts) == (1.0, pytest.approx(1 / 3))  # two chunks, one fact
    assert precision_recall(["a", "c", "e", "x"], facts) == (0.75, 1.0)
    assert precision_recall(["a", "a"], facts) == (1.0, pytest.approx(1 / 3))  # duplicates count once
    assert precision_recall([], facts) == (0.0, 0.0)


def _doc_episode(final, seen=(), metrics=None):
    task = Task(id="d1", env="doc_search", question="q", answer={"facts": [["c1", "c2"], ["c3"], ["c4"]]})
    return Episode(task=task, outcome=Outcome(final=list(final), seen=list(seen), finished=True),
                   metrics=metrics or {})


def test_doc_search_default_reward_is_f4_with_empty_penalty():
    reward_fn = default_reward("doc_search")
    assert reward_fn(_doc_episode([]))[0] == pytest.approx(-0.2)
    total, terms = reward_fn(_doc_episode(["c1", "c3", "c4", "x1"]))  # P = 0.75, R = 1
    assert total == pytest.approx(fbeta(0.75, 1.0, 4)) and terms["empty"] == 0.0
    # The environment's own precision/recall win over recomputation.
    assert reward_fn(_doc_episode(["c1"], metrics={"precision": 0.25, "recall": 1.0}))[0] == pytest.approx(0.85)
    # Trajectory recall separates two rollouts that both curate nothing useful.
    shaped = compose(f4=1.0, empty=-0.2, trajectory_recall=0.2)
    a, b = shaped(_doc_episode(["x"], seen=["c1", "c3"])), shaped(_doc_episode(["x"], seen=["x"]))
    assert a[0] == pytest.approx(0.2 * 2 / 3) and b[0] == 0.0


def test_format_and_off_form_terms(lookup, tasks):
    honest = scripted_episode(lookup, tasks[0], lookup.expert)
    assert format_bonus(honest, 0.1) == 0.1 and off_form_penalty(honest, -0.1) == 0.0
    sloppy = Episode(task=honest.task, outcome=honest.outcome, metrics=honest.metrics,
                     turns=[Turn("<tool_call>{oops", off_form=True)] + honest.turns)
    assert format_bonus(sloppy, 0.1) == 0.0 and off_form_penalty(sloppy, -0.1) == -0.1
    # A policy error (bad arguments) is not off-form: the call parsed.
    bad_args = Episode(task=honest.task, outcome=honest.outcome, turns=[Turn("", tool_calls=[
        {"name": "answer", "arguments": {}, "result": "Error: x", "error": "policy"}])])
    assert off_form_penalty(bad_args, -0.1) == 0.0
    unfinished = scripted_episode(lookup, tasks[0], lookup.expert, max_calls=1)
    assert format_bonus(unfinished, 0.1) == 0.0


def test_compose_totals_terms_and_errors(lookup, tasks):
    ep = scripted_episode(lookup, tasks[0], lookup.expert)
    total, terms = compose(success=1.0, format=0.1, off_form_any=-0.1)(ep)
    assert terms == {"success": 1.0, "format": 0.1, "off_form_any": 0.0} and total == pytest.approx(1.1)
    assert str(terms["off_form_any"]) == "0.0"
    custom = compose(success=1.0, brevity=lambda e: -0.01 * len(e.turns))
    assert custom(ep)[0] == pytest.approx(1.0 - 0.02)
    with pytest.raises(ValueError, match="unknown reward term 'sucess'"):
        compose(sucess=1.0)
    with pytest.raises(ValueError, match="unknown environment .chess."):
        default_reward("chess")
    for name in ("lookup", "product_finder"):
        assert default_reward(name).terms == {"success": 1.0}
    assert default_reward("code_search").terms == {"success": 1.0, "precision": 0.5}
    assert json.loads(json.dumps(default_reward("doc_search").config())) == {"f4": 1.0, "empty": -0.2}


def test_group_advantages_match_trl_formula():
    r = [1.0, 0.0, 0.5, 0.0]
    mean, std = statistics.mean(r), statistics.stdev(r)  # TRL: Bessel-corrected std, eps 1e-4
    assert group_advantages(r) == pytest.approx([(x - mean) / (std + 1e-4) for x in r])
    assert group_advantages(r, scale=False) == pytest.approx([x - mean for x in r])
    assert group_advantages([0.7] * 4).tolist() == [0.0] * 4
    assert group_advantages([0.3]).tolist() == [0.0]


def test_rescore_recomputes_without_mutating(lookup, tasks):
    episodes = []
    for g, task in enumerate(tasks[:3]):
        for s, policy in enumerate([lookup.expert, lookup.random_policy, lookup.expert, lookup.random_policy]):
            episodes.append(scripted_episode(lookup, task, policy, group=g, sample=s, step=0))
    episodes[1] = Episode(**{**episodes[1].__dict__, "failure": "infra"})
    snapshot = [ep.to_json() for ep in episodes]
    bad_reward = compose(success=-1.0)  # any reward will do; it must be applied to every episode
    new, adv = rescore(episodes, bad_reward)
    assert [ep.to_json() for ep in episodes] == snapshot
    assert [ep.reward for ep in new] == [-ep.success for ep in episodes]
    assert all(ep.reward_terms == {"success": -ep.success} for ep in new)
    assert adv[1] == 0.0  # infra episode: no advantage, and kept out of its group's statistics
    group0 = [new[i].reward for i in (0, 2, 3)]
    assert [adv[i] for i in (0, 2, 3)] == pytest.approx(group_advantages(group0).tolist())
    assert episode_advantages(new) == adv
    same, _ = rescore(episodes, default_reward("lookup"), reevaluate=True)
    assert [e.reward for e in same] == [e.reward for e in episodes]


def _completion(history, prefix_text=None):
    messages = [{"role": "assistant", "content": prefix_text}] if prefix_text else []
    for call, result in history:
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": call.name, "arguments": call.arguments}}]})
        messages.append({"role": "tool", "name": call.name, "content": result})
    return messages


def test_trl_reward_func_scores_from_environment_state(lookup, tasks):
    reward_fn = compose(success=1.0, format=0.1)
    func = trl_reward_func(reward_fn, load("lookup"))
    assert func.__name__ == "lookup_reward"
    envs, completions, expected = [], [], []
    for i, (task, policy) in enumerate([(tasks[0], lookup.expert), (tasks[1], lookup.random_policy),
                                        (tasks[2], lookup.expert)]):
        _, history = run_policy(lookup, task, policy)
        env = lookup.make_env()
        env.reset(task=task.to_json())  # TRL resets with the dataset row, then runs the parsed calls
        for call, _ in history:
            call_tool(env, call)
        envs.append(env)
        off_form = "<tool_call>{'name': search" if i == 2 else None
        completions.append(_completion(history, off_form))
        expected.append(reward_fn(scripted_episode(lookup, task, policy))[0] - (0.1 if i == 2 else 0.0))
    logged = {}
    got = func(prompts=[[]] * 3, completions=completions, environments=envs, completion_ids=[[]] * 3,
               trainer_state=None, log_metric=lambda name, value: logged.__setitem__(name, value))
    assert got == pytest.approx(expected)
    assert set(logged) == {"reward_terms/success", "reward_terms/format"}
    with pytest.raises(ValueError, match="environment_factory"):
        func(prompts=[[]], completions=[[]])
    other = type("OtherEnv", (), {"name": "doc_search", "_task": None})()
    assert func(prompts=[[]], completions=[[]], environments=[other]) == [None]


class _FakeResponse(io.BytesIO):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_llm_judge_sends_key_but_never_stores_it(lookup, tasks, monkeypatch):
    secret = "sk-test-0123456789abcdef"
    monkeypatch.setenv("AGENTLAB_JUDGE_KEY", secret)
    seen = {}

    def fake_urlopen(request, timeout):
        seen["auth"], seen["url"] = request.get_header("Authorization"), request.full_url
        seen["body"] = json.loads(request.data)
        return _FakeResponse(json.dumps({"choices": [{"message": {"content": "0.75"}}]}).encode())

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    judge = Judge(base_url="http://judge.local/v1/", model="m", api_key_env="AGENTLAB_JUDGE_KEY")
    reward_fn = compose(success=1.0, judge=functools.partial(llm_judge, weight=0.5, judge=judge))
    ep = scripted_episode(lookup, tasks[0], lookup.expert)
    total, terms = reward_fn(ep)
    assert terms["judge"] == pytest.approx(0.375) and total == pytest.approx(1.375)
    assert seen["auth"] == f"Bearer {secret}" and seen["url"] == "http://judge.local/v1/chat/completions"
    assert seen["body"]["model"] == "m"
    rescored, _ = rescore([ep], reward_fn)
    for text in (repr(reward_fn), json.dumps(reward_fn.config()), repr(judge), rescored[0].to_json(),
                 json.dumps(judge.__dict__)):
        assert secret not in text
    assert "AGENTLAB_JUDGE_KEY" in json.dumps(reward_fn.config())

    monkeypatch.delenv("AGENTLAB_JUDGE_KEY")
    with pytest.raises(ValueError, match="AGENTLAB_JUDGE_KEY"):
        reward_fn(ep)

    def down(request, timeout):
        raise urllib.error.URLError("connection refused")

    monkeypatch.setattr(urllib.request, "urlopen", down)
    with pytest.raises(InfraError, match="judge"):
        llm_judge(ep, 1.0, Judge(api_key_env=""))


def test_default_reward_ranks_every_probe_below_honest_success_on_lookup(lookup, tasks):
    honest = [scripted_episode(lookup, t, lookup.expert) for t in tasks[:6]]
    report = probe_report(default_reward("lookup"), "lookup", honest)
    assert report["flagged"] == [], report
    assert set(report["probes"]) >= {"no_answer", "empty_answer", "tool_spam", "format_only", "copy_question"}
    assert report["honest_mean"] == pytest.approx(1.0)


def test_a_bad_reward_gets_flagged(lookup, tasks):
    honest = [scripted_episode(lookup, t, lookup.expert) for t in tasks[:4]]
    report = probe_report(lambda ep: float(ep.outcome.tool_calls), "lookup", honest)
    assert "tool_spam" in report["flagged"]
    # Rewarding "answered something" pays copying the question as much as the truth.
    report = probe_report(compose(answered=lambda ep: float(bool(ep.outcome.final))), "lookup", honest)
    assert {"copy_question", "format_only"} <= set(report["flagged"])


def test_probes_are_degenerate_trajectories(lookup, tasks):
    built = {name: build(tasks[0]) for name, build in reward_design.probes("lookup").items()}
    assert all(ep.success == 0.0 and ep.failure == "model" for ep in built.values())
    assert not built["no_answer"].outcome.finished and built["empty_answer"].outcome.final == []
    assert built["tool_spam"].outcome.tool_calls >= 20
    assert built["copy_question"].outcome.final == [tasks[0].question]
    assert built["format_only"].outcome.final and built["format_only"].metrics["answered"] == 1.0


@pytest.mark.parametrize("env_name", ["code_search", "doc_search", "product_finder"])
def test_default_reward_resists_probes_on_other_envs(env_name):
    try:
        spec = load(env_name)
    except ImportError as exc:
        pytest.skip(f"{env_name} not available yet: {exc}")
    module = __import__(spec.env_class.__module__, fromlist=["_"])
    cap = getattr(module, "MAX_ANSWER_NAMES", getattr(module, "MAX_CURATED", 1))
    assert spec.answer_cap == cap  # probes must not submit more than the real tools accept
    honest = [scripted_episode(spec, t, spec.expert) for t in spec.make_tasks("train", 3, seed=0)]
    report = probe_report(default_reward(env_name), env_name, honest)
    assert report["flagged"] == [], report
    if env_name == "code_search":
        # Success is the exact set: even success alone does not pay for submitting every id seen.
        plain = probe_report(compose(success=1.0, format=0.1), env_name, honest)
        assert "curate_everything_seen" not in plain["flagged"], plain


def test_turns_from_messages_marks_off_form():
    turns = turns_from_messages([
        {"role": "assistant", "content": "<tool_call>{broken"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
            "name": "answer", "arguments": {"value": "Oslo"}}}]},
        {"role": "tool", "name": "answer", "content": "Error: value must be a string"},
    ])
    assert [t.off_form for t in turns] == [True, False]
    assert turns[1].tool_calls[0]["error"] == "policy"
    assert turns_from_messages("plain text answer")[0].off_form is False
    assert isinstance(ToolCall("a", {}).as_message(), dict)  # the shape _completion mimics
    assert np.isfinite(rewards.fbeta_score(_doc_episode(["c1"])))


def test_format_bonus_becomes_a_full_advantage_in_groups_without_success(lookup, tasks):
    """Why the defaults carry no format bonus: group normalisation turns 'answered (wrongly)' vs 'no answer'
    into advantages as large as a real success would get, so the policy learns to answer without searching."""
    answered_wrong = scripted_episode(lookup, tasks[0], lookup.random_policy)
    def search_only(task):
        yield ToolCall("search_people", {"query": "Ada"})

    no_answer = scripted_episode(lookup, tasks[0], search_only)
    group = [answered_wrong, answered_wrong, answered_wrong, no_answer]
    with_bonus = group_advantages([compose(success=1.0, format=0.1)(e)[0] for e in group])
    success_only = group_advantages([default_reward("lookup")(e)[0] for e in group])
    assert with_bonus[0] > 0.4 and with_bonus[3] < -1.0
    assert list(success_only) == [0.0, 0.0, 0.0, 0.0]


def test_the_local_policy_model_can_judge(lookup, tasks):
    """Seed 001's judge without a server: a local model grades the answer (tiny model here: any grade in 0..1)."""
    from agentlab.judge import LocalJudge

    judge = LocalJudge(model="tiny-random", max_new_tokens=4)
    ep = scripted_episode(lookup, tasks[0], lookup.expert)
    value = compose(judge=functools.partial(llm_judge, weight=1.0, judge=judge))(ep)[0]
    assert 0.0 <= value <= 1.0
    assert "tiny-random" in repr(judge) and value == llm_judge(ep, 1.0, judge)  # greedy: the same grade again
