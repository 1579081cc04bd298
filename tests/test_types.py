"""The shared types: the @tool guard, call_tool's attribution of bad arguments vs tool bugs, Episode records."""

import pytest

from agentlab.envs import load
from agentlab.types import Episode, Task, ToolCall, ToolEnv, call_tool, tool, tool_names


class Calc(ToolEnv):
    name = "calc"
    final_tool = "done"

    @tool
    def add(self, a: int, b: int) -> str:
        """Add two numbers.

        Args:
            a: First.
            b: Second.
        """
        return str(a + b)

    @tool
    def buggy(self, text: str) -> str:
        """A tool with a bug in its body.

        Args:
            text: Anything.
        """
        return len(text) + "x"  # TypeError inside the body: the tool's fault

    @tool
    def done(self) -> str:
        """Finish."""
        self._outcome.finished = True
        return "ok"


def _env():
    env = Calc()
    env.reset(task=Task(id="t", env="calc", question="q", answer={}).to_json())
    return env


def test_tool_guard_counts_and_refuses_outside_an_episode():
    assert Calc().add(a=1, b=2).startswith("Error: the environment was not reset")
    env = _env()
    assert env.add(a=1, b=2) == "3" and env.outcome.tool_calls == 1
    env.done()
    assert env.add(a=1, b=2).startswith("Error: the episode is over") and env.outcome.tool_calls == 3
    assert tool_names(Calc) == ["add", "buggy", "done"]  # the decorator keeps the tools visible to TRL


def test_bad_arguments_are_the_policys_counted_once_and_a_body_bug_is_the_environments():
    env = _env()
    reply = call_tool(env, ToolCall("add", {"a": 1, "c": 2}))
    assert reply.startswith("Error: bad arguments for add") and env.outcome.tool_calls == 1
    assert env.outcome.tool_errors == 1
    with pytest.raises(TypeError):  # not "bad arguments": the rollout loop retries it, then records infra
        call_tool(env, ToolCall("buggy", {"text": "hi"}))
    assert env.outcome.tool_calls == 2 and env.outcome.tool_errors == 1


def test_outcome_is_read_only_and_episodes_round_trip():
    env = _env()
    with pytest.raises(AttributeError):
        env.outcome = None
    spec = load("lookup")
    from agentlab.reward_design import scripted_episode

    ep = scripted_episode(spec, spec.make_tasks("test", 1, seed=0)[0], spec.expert)
    import json

    assert Episode.from_json(ep.to_json()) == ep == Episode.from_dict(json.loads(ep.to_json()))
