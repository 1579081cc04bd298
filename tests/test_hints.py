"""Training-time hints (notebook 09): per-group schedule, seen by the policy, never scored."""

import pytest

from agentlab.envs import load
from agentlab.rollout import Renderer, run_episodes, scripted_generate_fn

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
