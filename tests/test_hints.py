"""Training-time hints (notebook 09): per-group schedule, seen by the policy, never scored."""

import pytest

from agentlab.engines.scripted import scripted_generate_fn
from agentlab.envs import load
from agentlab.rollout import Renderer, run_episodes

SPEC = load("lookup")


def test_hint_schedule_is_per_group_and_switches_from_guidance_to_state():
    from agentlab.hints import HintSchedule

    s = HintSchedule(p=0.5, switch=0.5, guidance_turns=1, seed=0)
    share = sum(s.enriched(step, g) for step in range(100) for g in range(4)) / 400
    assert 0.4 < share < 0.6
    step, group = next((st, g) for st in range(1, 5) for g in range(4) if s.enriched(st, g))
    assert s.kind(step, 10, group, 1) == "guidance" and s.kind(step, 10, group, 2) == "state"
    assert s.kind(9, 10, group, 1) in ("state", None)
    assert HintSchedule(p=0.0).kind(1, 10, 0, 1) is None
    with pytest.raises(ValueError):
        HintSchedule(p=1.5)


def test_hints_reach_the_tokens_but_not_the_score_and_are_consistent_within_a_group(tiny):
    """The model sees the hinted result (in the masked tool tokens); the episode records the raw result and the
    hint separately; every sample of a group gets the same treatment."""
    from agentlab.hints import HintSchedule, observer

    _, tok = tiny
    tasks = SPEC.make_tasks("train", 6, seed=0)
    schedule = HintSchedule(p=0.5, seed=0)
    renderer = Renderer(tok, SPEC.env_class)
    eps = run_episodes(None, tok, SPEC, tasks, samples=2, generate_fn=scripted_generate_fn(renderer, tasks, SPEC.expert),
                       observe=observer("lookup", "answer", schedule, 1, 10), progress=False, step=1)
    hinted = {ep.group: bool(ep.turns[0].tool_calls[0].get("hint")) for ep in eps}
    assert set(hinted.values()) == {True, False}
    for ep in eps:
        call = ep.turns[0].tool_calls[0]
        assert bool(call.get("hint")) == hinted[ep.group] == schedule.enriched(1, ep.group)
        assert "Hint:" not in call["result"] and ep.success == 1.0
        masked = tok.decode([t for t, m in zip(ep.tokens["completion_ids"], ep.tokens["mask"], strict=True) if not m])
        assert ("Hint: use only the record" in masked) == hinted[ep.group]


def test_experiment_rejects_bad_hint_settings():
    from agentlab.train import Experiment

    with pytest.raises(ValueError, match="hint_p"):
        Experiment(hint_p=2.0)


def test_a_second_process_hints_its_groups_by_their_run_wide_numbers(tiny, tmp_path):
    """With several processes, process r numbers its groups from r x (its groups a step): the hint schedule must
    read those run-wide numbers, or every process hints the same local groups and the recorded (step, group) pairs
    no longer match the schedule."""
    from types import SimpleNamespace

    from agentlab.hints import HintSchedule
    from agentlab.runs import RunDir
    from agentlab.train import Experiment, _StepStats, make_rollout_func

    model, tok = tiny
    tasks = SPEC.make_tasks("train", 2, seed=0)
    exp = Experiment(env="lookup", model="tiny-random", hint_p=0.5, groups_per_step=2, group_size=2, steps=10)
    schedule = HintSchedule(p=exp.hint_p, switch=exp.hint_switch, seed=exp.seed)
    step = next(st for st in range(1, 100)  # a step where process 1's groups (2, 3) are hinted unlike groups 0, 1
                if [schedule.enriched(st, g) for g in (0, 1)] != [schedule.enriched(st, g) for g in (2, 3)])
    renderer = Renderer(tok, SPEC.env_class)
    stats = _StepStats()
    rollout = make_rollout_func(SPEC, tok, tasks, exp, RunDir(tmp_path), stats,
                                engine=lambda *_: scripted_generate_fn(renderer, tasks, SPEC.expert))
    second = SimpleNamespace(process_index=1, is_main_process=True, unwrap_model=lambda m: m)
    rollout([renderer.grpo_row(t)["prompt"] for t in tasks for _ in range(2)],
            SimpleNamespace(state=SimpleNamespace(global_step=step - 1), accelerator=second, model=model))
    assert sorted({ep.group for ep in stats.episodes}) == [2, 3]
    for ep in stats.episodes:
        assert bool(ep.turns[0].tool_calls[0].get("hint")) == schedule.enriched(step, ep.group), ep.group


@pytest.mark.parametrize("env", ["lookup", "product_finder", "code_search", "doc_search"])
def test_state_hints_say_what_the_task_needs_on_every_shipped_environment(env):
    """An enriched state observation says what the plain result does not: the same result gets another hint under
    another task (the old generic one, "[state: last tool X; N characters returned]", was the same for every task
    and taught nothing)."""
    from agentlab.types import run_policy

    spec = load(env)
    task, other = spec.make_tasks("train", 2, seed=0)
    _, history = run_policy(spec, task, spec.expert)
    states = [(spec.hint("state", task, c, r), spec.hint("state", other, c, r)) for c, r in history]
    assert spec.hint("guidance", task, *history[0]) and any(mine for mine, _ in states)
    assert any(mine != theirs for mine, theirs in states if mine), states


def test_an_environment_without_its_own_hint_gets_guidance_but_no_empty_state():
    from agentlab.hints import _generic
    from agentlab.types import ToolCall

    task = SPEC.make_tasks("train", 1, seed=0)[0]
    assert "answer" in _generic("guidance", task, ToolCall("search", {}), "result", "answer")
    assert _generic("state", task, ToolCall("search", {}), "result", "answer") == ""
