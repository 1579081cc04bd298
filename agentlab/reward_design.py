"""Trying a reward before training on it (notebook 05): GRPO advantages, rescoring saved rollouts, scripted episodes
and reward-hacking probes.

    from agentlab.reward_design import probe_report, rescore
    episodes, advantages = rescore(old_episodes, reward_fn)    # new rewards + GRPO advantages, nothing re-run
    probe_report(reward_fn, "lookup")["flagged"]               # [] unless a degenerate trajectory pays
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from agentlab.retries import INFRA_ERRORS
from agentlab.rewards import RewardFn, _total
from agentlab.types import Episode, Outcome, Task, ToolCall, Turn, call_tool, run_policy


def check_reward(reward_fn, spec, n: int = 2) -> None:
    """Score scripted expert and random episodes before any training: a reward that raises, or returns NaN or a
    non-number, fails here with one clear error instead of in the middle of a run."""
    import math

    for task in spec.make_tasks("validation", n, seed=0):
        for policy in (p for p in (spec.expert, spec.random_policy) if p is not None):
            try:
                ep = scripted_episode(spec, task, policy)
            except INFRA_ERRORS:
                continue  # the environment failed while playing the episode: nothing to learn about the reward
            try:
                total = _total(reward_fn(ep))
            except INFRA_ERRORS:
                continue  # a service being down is not a bad reward (the fault path handles it during training)
            except Exception as exc:  # noqa: BLE001 — any failure of the user's reward: one clear line
                raise ValueError(f"the reward failed on a scripted {spec.name} episode: {type(exc).__name__}: {exc}"
                                 ) from None
            if not math.isfinite(total):
                raise ValueError(f"the reward returned {total} on a scripted {spec.name} episode; it must be finite")


# -- advantages and rescoring --------------------------------------------------------------------------------------


def group_advantages(rewards_G, scale: bool = True, eps: float = 1e-4) -> np.ndarray:
    """GRPO advantages of one group: ``(r − mean) / (std + eps)`` with Bessel's std, exactly as TRL's
    ``scale_rewards="group"`` (``scale=False`` is ``"none"``). A one-sample group has no baseline: zeros.

    >>> group_advantages([1.0, 0.0, 0.0, 1.0]).round(3).tolist()
    [0.866, -0.866, -0.866, 0.866]
    """
    r = np.asarray(rewards_G, dtype=float)
    if r.size < 2:
        return np.zeros_like(r)
    centred = r - r.mean()
    return centred / (r.std(ddof=1) + eps) if scale else centred


def episode_advantages(episodes: list[Episode], scale: bool = True) -> list[float]:
    """Advantages aligned with ``episodes``, groups keyed by ``(step, group)``. Infra-failed episodes get 0 and
    stay out of their group's mean and std (the environment failed, not the policy)."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, ep in enumerate(episodes):
        if ep.failure != "infra":
            groups[(ep.step, ep.group)].append(i)
    advantages = [0.0] * len(episodes)
    for idx in groups.values():
        for i, a in zip(idx, group_advantages([episodes[i].reward for i in idx], scale=scale), strict=True):
            advantages[i] = float(a)
    return advantages


def rescore(episodes: list[Episode], reward_fn: RewardFn, scale: bool = True,
            reevaluate: bool = False) -> tuple[list[Episode], list[float]]:
    """New rewards and advantages for saved rollouts; the inputs are not modified.

    ``reevaluate=True`` also recomputes ``metrics`` with the environment's current ``evaluate`` (after a
    verifier fix). ``reward_fn`` may return ``(total, terms)`` or a bare number.
    """
    from agentlab.envs import load

    out = []
    for ep in episodes:
        metrics = load(ep.task.env).evaluate(ep.task, ep.outcome) if reevaluate else ep.metrics
        ep = replace(ep, metrics=metrics)
        scored = reward_fn(ep)
        terms = dict(scored[1]) if isinstance(scored, tuple) else {}
        out.append(replace(ep, reward=_total(scored), reward_terms=terms))
    return out, episode_advantages(out, scale=scale)


# -- scripted episodes and reward-hacking probes -----------------------------------------------------------------


def episode_from_calls(spec, task: Task, outcome: Outcome, history: list[tuple[ToolCall, str]],
                       reward_fn: RewardFn | None = None, **fields) -> Episode:
    """An Episode from a scripted run (``run_policy``'s outcome and history): one turn per call, evaluated and
    scored (with ``spec.default_reward`` unless ``reward_fn`` is given)."""
    turns = [Turn(text="", tool_calls=[{"name": c.name, "arguments": c.arguments, "result": r,
                                        "error": "policy" if r.startswith("Error:") else None}]) for c, r in history]
    metrics = spec.evaluate(task, outcome)
    fields.setdefault("exit_reason", "final_answer" if outcome.finished else "max_turns")
    fields.setdefault("failure", None if metrics.get("success", 0.0) >= 1.0 else "model")
    ep = Episode(task=task, turns=turns, outcome=outcome, metrics=metrics, **fields)
    scored = (reward_fn or spec.default_reward)(ep)
    return replace(ep, reward=_total(scored), reward_terms=dict(scored[1]) if isinstance(scored, tuple) else {})


def scripted_episode(spec, task: Task, policy, max_calls: int = 30, **fields) -> Episode:
    """Play a scripted policy (``spec.expert``, ``spec.random_policy`` …) and return the Episode."""
    outcome, history = run_policy(spec, task, policy, max_calls=max_calls)
    return episode_from_calls(spec, task, outcome, history, **fields)


def _expert_calls(spec, task: Task) -> tuple[list[ToolCall], list[str]]:
    """The expert's look-around calls on ``task`` (those that neither change the submitted answer nor end the
    episode) and its final answer."""
    env = spec.make_env()
    env.reset(task=task.to_json())
    gen, looks, result = spec.expert(task), [], None
    try:
        for i in range(30):
            call = next(gen) if i == 0 else gen.send(result)
            before = list(env.outcome.final)
            result = call_tool(env, call)
            if call.name != spec.env_class.final_tool and env.outcome.final == before:
                looks.append(call)
            if env.done:
                break
    except StopIteration:
        pass
    return looks, list(env.outcome.final)


def _probe_episode(spec, task: Task, name: str, calls: list[ToolCall], final: list[str] | None) -> Episode:
    """Replay ``calls`` on a fresh environment, then (unless ``final`` is None) submit ``final`` directly —
    probes need no knowledge of each environment's commit tools, only of its Outcome."""
    env = spec.make_env()
    env.reset(task=task.to_json())
    history = [(call, call_tool(env, call)) for call in calls]
    if final is not None:
        env.outcome.final, env.outcome.finished = list(final), True
        env.outcome.tool_calls += 1
        history.append((ToolCall(spec.env_class.final_tool, {"probe": final}), "(probe: answer set directly)"))
    return episode_from_calls(spec, task, env.outcome, history, model_id=f"probe:{name}")


# How many items each environment's final answer may hold (its tools refuse more), so a probe never submits an
# answer the real tools would reject. 1 = a single-valued answer, where "curate everything" does not apply.
def probes(env_name: str, donors: list[Task] | None = None, spam_calls: int = 25) -> dict[str, Callable]:
    """Canned degenerate trajectories for ``env_name``: ``{name: build(task) -> Episode}``.

    * ``no_answer`` — looks around, never submits; ``empty_answer`` — submits nothing;
    * ``tool_spam`` — repeats one search ``spam_calls`` times, never submits;
    * ``format_only`` — well-formed calls, but submits another task's (expert) answer;
    * ``copy_question`` — submits the question text;
    * ``curate_everything_seen`` — submits every id it saw, up to ``EnvSpec.answer_cap`` (set-valued answers only).
    """
    from agentlab.envs import load

    spec = load(env_name)
    cap = spec.answer_cap
    donor_answers: dict[str, list[str]] = {}

    def wrong_answer(task: Task) -> list[str]:
        for donor in donors or spec.make_tasks("train", 8, seed=97):
            if donor.id == task.id:
                continue
            if donor.id not in donor_answers:
                donor_answers[donor.id] = _expert_calls(spec, donor)[1]
            answer = donor_answers[donor.id]
            if spec.evaluate(task, Outcome(final=answer, finished=True)).get("success", 0.0) < 1.0:
                return answer
        raise ValueError(f"no donor task gives a wrong answer for {task.id}; pass more donors")

    def build(name: str, task: Task) -> Episode:
        looks, _ = _expert_calls(spec, task)
        if name == "no_answer":
            return _probe_episode(spec, task, name, looks, None)
        if name == "empty_answer":
            return _probe_episode(spec, task, name, looks, [])
        if name == "tool_spam":
            return _probe_episode(spec, task, name, looks[:1] * spam_calls, None)
        if name == "format_only":
            return _probe_episode(spec, task, name, looks, wrong_answer(task))
        if name == "copy_question":
            return _probe_episode(spec, task, name, looks, [task.question])
        seen = _probe_episode(spec, task, name, looks, None).outcome.seen
        return _probe_episode(spec, task, name, looks, list(seen)[:cap])

    names = ["no_answer", "empty_answer", "tool_spam", "format_only", "copy_question"]
    names += ["curate_everything_seen"] if cap != 1 else []
    return {name: functools.partial(build, name) for name in names}


def probe_report(reward_fn: RewardFn | Callable[[Episode], float], env_name: str,
                 honest_episodes: list[Episode] | None = None, n_tasks: int = 8) -> dict:
    """Score every probe on the tasks of the honest successes and flag any probe that earns at least as much as
    the honest success on the same task. Without ``honest_episodes`` the expert plays ``n_tasks`` train tasks.

    Returns ``{"honest_mean", "probes": {name: {"mean", "max", "share_ge_honest", "flagged"}}, "flagged": […]}``.
    """
    from agentlab.envs import load

    spec = load(env_name)
    if honest_episodes is None:
        honest_episodes = [scripted_episode(spec, t, spec.expert) for t in spec.make_tasks("train", n_tasks, seed=0)]
    honest = [ep for ep in honest_episodes if ep.success >= 1.0 and ep.failure != "infra"]
    if not honest:
        raise ValueError("probe_report needs at least one honest successful episode (metrics['success'] == 1)")
    honest_rewards = [_total(reward_fn(ep)) for ep in honest]
    rows = {}
    for name, build in probes(env_name).items():
        rewards = [_total(reward_fn(build(ep.task))) for ep in honest]
        ge = [r >= h - 1e-9 for r, h in zip(rewards, honest_rewards, strict=True)]
        rows[name] = {"mean": float(np.mean(rewards)), "max": float(np.max(rewards)),
                      "share_ge_honest": float(np.mean(ge)), "flagged": any(ge)}
    return {"honest_mean": float(np.mean(honest_rewards)), "probes": rows,
            "flagged": [name for name, row in rows.items() if row["flagged"]]}
