"""Retrying what the environment and its services do, and telling infra failures from the policy's mistakes.

A tool call, an episode reset, a generation call and a reward that needs a service (an LLM judge) are each retried
with exponential backoff (``LoopConfig.retries``, ``backoff_s``); a failure that outlives its retries makes the
episode *infra*: the environment's or a service's fault, never charged to the policy (``agentlab.rollout``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from agentlab.types import Episode, InfraError, Task, ToolCall, ToolEnv, call_tool

INFRA_ERRORS = (InfraError, TimeoutError, ConnectionError)  # a service or the environment failed, not the policy


def call_with_retries(env: ToolEnv, call: ToolCall, config) -> tuple[str, str | None]:
    """Run a tool call; an exception is an environment fault, retried with backoff, then reported as infra."""
    counted = env.outcome.tool_calls
    for attempt in range(config.retries + 1):
        errors_before = env.outcome.tool_errors
        try:
            result = call_tool(env, call)
            return result, ("policy" if env.outcome.tool_errors > errors_before else None)
        except Exception as exc:  # noqa: BLE001 — InfraError, TimeoutError, a dropped connection or a tool bug
            env.outcome.tool_calls = counted  # a failed attempt is not a call the policy made
            if attempt == config.retries:
                return f"{type(exc).__name__}: {exc}", "infra"
            time.sleep(config.backoff_s * 2**attempt)
    raise AssertionError("unreachable")


def score_with_retries(reward_fn, ep: Episode, config) -> tuple[float, dict] | None:
    """The episode's reward; a reward that needs a service (an LLM judge) and finds it failing is retried with
    backoff, then reported as ``None``: the service's outage, never the policy's 0."""
    for attempt in range(config.retries + 1):
        try:
            return reward_fn(ep)
        except INFRA_ERRORS:
            if attempt == config.retries:
                return None
            time.sleep(config.backoff_s * 2**attempt)
    raise AssertionError("unreachable")


def generate_with_retries(generate: Callable, seqs: list[list[int]], config) -> list[list[int]] | str:
    """New tokens for ``seqs``; a generation backend that fails like a service (a vLLM server dropping the
    connection, a timeout) is retried with backoff, and its last error returned as text when it persists. Any other
    exception is a bug and propagates."""
    for attempt in range(config.retries + 1):
        try:
            return generate(seqs)
        except INFRA_ERRORS as exc:
            if attempt == config.retries:
                return f"{type(exc).__name__}: {exc}"
            time.sleep(config.backoff_s * 2**attempt)
    raise AssertionError("unreachable")


def reset_with_retries(make_env: Callable[[], ToolEnv], task: Task, config) -> ToolEnv | str:
    """A fresh environment reset to ``task``; a failing construction or reset (the sandbox, a corpus, a service)
    is retried with backoff like a tool call, and its last error returned as text when it persists."""
    for attempt in range(config.retries + 1):
        try:
            env = make_env()
            env.reset(task=task.to_json())
            return env
        except Exception as exc:  # noqa: BLE001 — any failure to start an episode is the environment's
            if attempt == config.retries:
                return f"{type(exc).__name__}: {exc}"
            time.sleep(config.backoff_s * 2**attempt)
    raise AssertionError("unreachable")
