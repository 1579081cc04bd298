"""Rewards: small weighted terms, their composition, GRPO group advantages, and reward-hacking probes.

A reward is a plain function ``reward_fn(ep) -> (total, terms)`` built from terms you can read and edit in a
notebook cell. Rewards are pure functions of a saved :class:`~agentlab.types.Episode`, so a changed reward is
tried on old rollouts without re-running anything::

    from agentlab.rewards import compose, probe_report, rescore
    reward_fn = compose(success=1.0, format=0.1)              # what lookup trains on
    episodes, advantages = rescore(old_episodes, reward_fn)    # new rewards + GRPO advantages
    probe_report(reward_fn, "lookup")["flagged"]               # [] unless a degenerate trajectory pays

Weights are what one unit of a term adds to the total, so penalties carry negative weights (``empty=-0.2`` adds
−0.2 to an episode that submitted nothing). The doc_search reward follows the Harness-1 write-up: F-beta with
β = 4 (recall matters 16× more than precision) and −0.2 for curating nothing, because an empty set and a wrong
set both score F4 = 0 and GRPO needs them told apart.
"""

from __future__ import annotations

import functools
import json
import os
import re
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from agentlab.types import Episode, InfraError, Outcome, Task, ToolCall, Turn, call_tool, run_policy

RewardFn = Callable[[Episode], tuple[float, dict[str, float]]]
_EX = Task(id="ex", env="lookup", question="Where does Ada Vell live?", answer={"value": "Oslo"})  # doctests


# -- terms --------------------------------------------------------------------------------------------------------


def success(ep: Episode) -> float:
    """The environment's own pass/fail check (ASR-style), as ``evaluate`` stored it in ``ep.metrics``.

    >>> success(Episode(task=_EX, metrics={"success": 1.0}))
    1.0
    """
    return float(ep.metrics.get("success", 0.0))


def fbeta(precision: float, recall: float, beta: float = 1.0) -> float:
    """F-beta: recall counts β² times as much as precision (β = 1 is F1).

    >>> round(fbeta(0.25, 1.0, beta=4), 2), round(fbeta(0.25, 1.0, beta=1), 2)
    (0.85, 0.4)
    """
    if precision <= 0 or recall <= 0:
        return 0.0
    b2 = beta * beta
    return (1 + b2) * precision * recall / (b2 * precision + recall)


def precision_recall(curated: list[str], facts: list[list[str]]) -> tuple[float, float]:
    """Fact-based retrieval scores. Recall: the share of facts with at least one supporting chunk curated.
    Precision: the share of (distinct) curated chunks that support some fact. Nothing curated, or no facts,
    scores 0.

    >>> precision_recall(["c1", "c9"], [["c1", "c2"], ["c3"]])
    (0.5, 0.5)
    """
    chosen = set(curated)
    if not chosen or not facts:
        return 0.0, 0.0
    supporting = {cid for fact in facts for cid in fact}
    recall = sum(1 for fact in facts if chosen & set(fact)) / len(facts)
    return len(chosen & supporting) / len(chosen), recall


def _precision_recall(ep: Episode) -> tuple[float, float]:
    # The environment's own numbers win when it reported them; otherwise recompute from the facts.
    if "precision" in ep.metrics and "recall" in ep.metrics:
        return float(ep.metrics["precision"]), float(ep.metrics["recall"])
    return precision_recall(ep.outcome.final, ep.task.answer.get("facts", []))


def fbeta_score(ep: Episode, beta: float = 4.0) -> float:
    """F-beta of the curated set against the task's facts (``metrics`` precision/recall when present).

    >>> ep = Episode(task=_EX, metrics={"precision": 0.25, "recall": 1.0})
    >>> round(fbeta_score(ep, beta=4), 2)
    0.85
    """
    return fbeta(*_precision_recall(ep), beta=beta)


def _answered(outcome: Outcome) -> bool:
    return any(str(x).strip() for x in outcome.final)


def empty_penalty(ep: Episode, value: float = -0.2) -> float:
    """``value`` when the episode submitted / curated nothing (blank answers count as nothing), else 0.

    >>> empty_penalty(Episode(task=_EX, outcome=Outcome(final=[])))
    -0.2
    >>> empty_penalty(Episode(task=_EX, outcome=Outcome(final=["Oslo"])))
    0.0
    """
    return 0.0 if _answered(ep.outcome) else value


def trajectory_recall(ep: Episode) -> float:
    """Share of the task's facts with a supporting chunk *anywhere* in the trajectory (seen or curated).

    It rewards finding evidence rather than searching a lot: extra searches earn nothing unless they surface
    something relevant. ``metrics["trajectory_recall"]`` wins when the environment reports it.

    >>> ep = Episode(task=replace(_EX, answer={"facts": [["c1"], ["c2"]]}), outcome=Outcome(seen=["c2", "c7"]))
    >>> trajectory_recall(ep)
    0.5
    """
    for key in ("trajectory_recall", "traj_recall"):
        if key in ep.metrics:
            return float(ep.metrics[key])
    facts = ep.task.answer.get("facts", [])
    return precision_recall(list(ep.outcome.seen) + list(ep.outcome.final), facts)[1]


def trajectory_recall_bonus(ep: Episode, weight: float = 0.2) -> float:
    """``weight × trajectory_recall(ep)``: separates rollouts that all curate nothing useful (F4 = 0).

    >>> ep = Episode(task=replace(_EX, answer={"facts": [["c1"], ["c2"]]}), outcome=Outcome(seen=["c1", "c2"]))
    >>> trajectory_recall_bonus(ep, 0.2)
    0.2
    """
    return weight * trajectory_recall(ep)


def off_form_calls(ep: Episode) -> int:
    """Number of off-form tool calls: turns the rollout loop marked ``off_form`` (the text tried to call a tool
    in a format the template does not define — whether or not a lenient parser recovered it).

    Tool calls that parsed but got an ``"Error: …"`` answer (``error == "policy"``) are *not* off-form: the
    tool's error string already tells the model what was wrong.
    """
    return sum(1 for turn in ep.turns if turn.off_form)


def lenient_calls(ep: Episode) -> int:
    """Turns whose calls a lenient parser recovered from text that breaks the declared format.

    >>> lenient_calls(Episode(task=_EX, turns=[Turn("Sure! <tool_call>…", lenient=True), Turn("x")]))
    1
    """
    return sum(1 for turn in ep.turns if turn.lenient)


def off_form_penalty(ep: Episode, per_call: float = -0.1, max_calls: int | None = None) -> float:
    """``per_call`` for each off-form call, counting at most ``max_calls`` of them.

    ``max_calls=1`` is the Harness-1 variant (−0.1 once if any call was off-form): without a penalty a lenient
    parser lets a malformed habit ride along with good episodes until nearly every episode has one.

    >>> ep = Episode(task=_EX, turns=[Turn("<tool_call>oops", off_form=True), Turn("x"), Turn("y", off_form=True)])
    >>> off_form_penalty(ep, -0.1), off_form_penalty(ep, -0.1, max_calls=1)
    (-0.2, -0.1)
    """
    n = off_form_calls(ep)
    return per_call * (n if max_calls is None else min(n, max_calls))


def format_bonus(ep: Episode, value: float = 0.1) -> float:
    """``value`` when every turn was well-formed and the episode ended with the final-answer tool.

    >>> ep = Episode(task=_EX, turns=[Turn("")], outcome=Outcome(final=["Oslo"], finished=True))
    >>> format_bonus(ep, 0.1)
    0.1
    """
    return value if ep.outcome.finished and off_form_calls(ep) == 0 else 0.0


# -- optional LLM judge (off by default) -----------------------------------------------------------------------

JUDGE_PROMPT = (
    "You grade an assistant's final answer against a reference.\n"
    "Question: {question}\nReference answer: {reference}\nSubmitted answer: {answer}\n"
    "Reply with one number between 0 (wrong) and 1 (fully correct), and nothing else."
)


@dataclass(frozen=True)
class Judge:
    """Any OpenAI-compatible chat endpoint (vLLM, llama.cpp server, a hosted API) that grades an answer 0..1.

    The API key is read, at call time, from the environment variable *named* by ``api_key_env`` — the key itself
    is never an attribute, so it cannot reach a config, a log or a run folder. ``api_key_env=""`` sends no key
    (local servers). An unreachable judge raises :class:`InfraError`: its outage is not the policy's fault.
    """

    base_url: str = "http://localhost:8000/v1"
    model: str = "judge"
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 30.0
    prompt: str = JUDGE_PROMPT

    def score(self, question: str, reference: str, answer: str) -> float:
        headers = {"Content-Type": "application/json"}
        if self.api_key_env:
            key = os.environ.get(self.api_key_env)
            if not key:
                raise ValueError(f"the judge's API key variable {self.api_key_env!r} is not set (or set "
                                 "api_key_env='' for a server that needs none)")
            headers["Authorization"] = f"Bearer {key}"
        body = {"model": self.model, "temperature": 0.0, "max_tokens": 8, "messages": [
            {"role": "user", "content": self.prompt.format(question=question, reference=reference, answer=answer)}]}
        request = urllib.request.Request(self.base_url.rstrip("/") + "/chat/completions",
                                         data=json.dumps(body).encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                text = json.load(response)["choices"][0]["message"]["content"] or ""
        except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:  # URLError/HTTPError are OSErrors
            status = f" {exc.code}" if isinstance(exc, urllib.error.HTTPError) else ""
            raise InfraError(f"judge at {self.base_url} failed: {type(exc).__name__}{status}") from None
        number = re.search(r"\d+(?:\.\d+)?", text)
        return min(1.0, max(0.0, float(number.group()))) if number else 0.0


def llm_judge(ep: Episode, weight: float = 1.0, judge: Judge | None = None) -> float:
    """``weight ×`` the judge's 0..1 grade of the submitted answer. Use it through ``compose``::

        compose(success=1.0, judge=functools.partial(llm_judge, weight=0.5, judge=Judge(model="qwen")))
    """
    judge = judge or Judge()
    reference = json.dumps(ep.task.answer, sort_keys=True)[:2000]
    return weight * judge.score(ep.task.question, reference, "; ".join(map(str, ep.outcome.final))[:2000])


# -- composition ---------------------------------------------------------------------------------------------------

# name -> term(ep, weight). "f<beta>" (f1, f2, f4, f0.5 …) is resolved by pattern below.
TERMS: dict[str, Callable[[Episode, float], float]] = {
    "success": lambda ep, w: w * success(ep),
    "empty": empty_penalty,
    "trajectory_recall": trajectory_recall_bonus,
    "off_form": off_form_penalty,
    "off_form_any": functools.partial(off_form_penalty, max_calls=1),
    "format": format_bonus,
    "lenient": lambda ep, w: w * lenient_calls(ep),
    "lenient_any": lambda ep, w: w * min(1, lenient_calls(ep)),
    "score": lambda ep, w: w * (ep.outcome.score or 0.0),  # the environment's own score (TRL-style classes)
    "precision": lambda ep, w: w * _precision_recall(ep)[0],
    "recall": lambda ep, w: w * _precision_recall(ep)[1],
}
_FBETA = re.compile(r"f(\d+(?:\.\d+)?)")


def _term(name: str) -> Callable[[Episode, float], float]:
    if name in TERMS:
        return TERMS[name]
    if m := _FBETA.fullmatch(name):
        beta = float(m.group(1))
        return lambda ep, w: w * fbeta_score(ep, beta)
    raise ValueError(f"unknown reward term {name!r}; expected one of {sorted(TERMS)}, 'f<beta>' such as 'f4', "
                     "or a callable term(ep) -> float")


@dataclass(frozen=True)
class Reward:
    """A weighted sum of named terms; calling it gives ``(total, {term: contribution})``.

    Each value is a weight for a named term in :data:`TERMS` (or ``f<beta>``), or a callable ``term(ep) ->
    float`` that is already weighted (an edited term from a notebook, a ``functools.partial`` of ``llm_judge``).

    >>> reward_fn = Reward({"success": 1.0, "format": 0.1})
    >>> ep = Episode(task=_EX, outcome=Outcome(final=["Oslo"], finished=True), metrics={"success": 1.0})
    >>> reward_fn(ep)
    (1.1, {'success': 1.0, 'format': 0.1})
    """

    terms: dict[str, float | Callable[[Episode], float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, weight in self.terms.items():
            if not callable(weight):
                _term(name)  # fail at construction, not in the middle of a run

    def __call__(self, ep: Episode) -> tuple[float, dict[str, float]]:
        # "+ 0.0" turns the -0.0 of a zero-count penalty into 0.0 in logs.
        parts = {name: float(w(ep) if callable(w) else _term(name)(ep, float(w))) + 0.0
                 for name, w in self.terms.items()}
        return sum(parts.values()), parts

    def config(self) -> dict:
        """JSON-safe description for ``config.json`` (callables by repr; a Judge holds only its key's *name*)."""
        return {name: (w if not callable(w) else repr(w)) for name, w in self.terms.items()}


def compose(**weighted_terms: float | Callable[[Episode], float]) -> Reward:
    """``compose(f4=1.0, empty=-0.2)`` is ``Reward({"f4": 1.0, "empty": -0.2})``."""
    return Reward(dict(weighted_terms))


def default_reward(env_name: str) -> Reward:
    """The reward an environment trains on unless a config says otherwise (``EnvSpec.default_reward``, kept in
    the environment's own file)."""
    from agentlab.envs import load

    return load(env_name).default_reward


def parse_reward(spec: str) -> Reward | Callable[[Episode], tuple[float, dict[str, float]]]:
    """A reward from a readable spec (the CLI's ``--reward``).

    ``"success"`` or ``"f4=1,empty=-0.2,trajectory_recall=0.1"``: terms of :data:`TERMS` (or ``f<beta>``), each
    with an optional weight (default 1); ``"fbeta:beta=4"`` is spelled-out ``f4``. ``"module:attr"`` or
    ``"path/to/file.py:attr"``: a :class:`Reward`, or any callable of the finished episode, imported from there.
    ``"path/to/reward.json"``: a reward saved with :func:`save_reward` (notebook 05 hands its design on this way).

    >>> parse_reward("fbeta:beta=4,empty=-0.2,trajectory_recall=0.1").terms
    {'f4': 1.0, 'empty': -0.2, 'trajectory_recall': 0.1}
    """
    spec = spec.strip()
    if spec.endswith(".json"):
        return load_reward(spec)
    head, sep, _ = spec.partition(":")
    if sep and head != "fbeta":
        from agentlab.refs import import_object

        return import_object(spec)
    terms: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        if item.startswith("fbeta:"):
            beta = re.fullmatch(r"fbeta:beta=(\d+(?:\.\d+)?)(?:=(.+))?", item)
            if not beta:
                raise ValueError(f"reward spec {spec!r}: expected 'fbeta:beta=<number>', got {item!r}")
            name, weight = f"f{float(beta.group(1)):g}", beta.group(2) or "1"
        else:
            name, _, weight = item.partition("=")
            weight = weight or "1"
        try:
            terms[name.strip()] = float(weight)
        except ValueError:
            raise ValueError(f"reward spec {spec!r}: weight {weight!r} of {name!r} is not a number") from None
    if not terms:
        raise ValueError(f"reward spec {spec!r} names no term; e.g. 'success' or 'f4=1,empty=-0.2'")
    return Reward(terms)  # unknown term names fail here, with the list of known ones


def as_reward_fn(reward) -> RewardFn:
    """Any reward (a :class:`Reward`, or a callable returning a number or a ``(total, terms)`` pair) as the loop's
    ``reward_fn(ep) -> (total, terms)``."""
    if isinstance(reward, Reward):
        return reward

    def reward_fn(ep: Episode) -> tuple[float, dict[str, float]]:
        scored = reward(ep)
        terms = dict(scored[1]) if isinstance(scored, tuple) else {"reward": _total(scored)}
        return _total(scored), terms

    return reward_fn


def save_reward(reward: Reward, path) -> None:
    """Write a reward of named terms as JSON, for ``parse_reward(path)`` / ``agentlab train --reward path``."""
    from pathlib import Path

    if not isinstance(reward, Reward) or any(callable(w) for w in reward.terms.values()):
        raise ValueError("only a Reward of named terms can be saved as JSON; put a custom term in a module and "
                         "pass --reward module:attr instead")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(reward_config(reward), indent=2) + "\n")


def load_reward(path) -> Reward:
    """The reward :func:`save_reward` wrote; a clear error for a missing or foreign file."""
    from pathlib import Path

    if not Path(path).exists():
        raise ValueError(f"reward file {path} does not exist")
    try:
        terms = json.loads(Path(path).read_text())["terms"]
        return Reward({str(k): float(v) for k, v in terms.items()})
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"reward file {path} is not a saved reward ({type(exc).__name__}: {exc})") from None


def reward_config(reward) -> dict | None:
    """How a run's ``config.json`` records its reward, so a changed reward can be told from the same one.

    A :class:`Reward` of named terms is plain configuration; any callable (or a callable term) is recorded by
    ``module:qualname`` and the sha256 of its source, with the source itself when it was defined in
    ``__main__`` or a notebook cell (it cannot be imported back). ``None``: the environment's default.
    """
    import hashlib
    import inspect

    if reward is None:
        return None

    def described(fn) -> dict:
        target = getattr(fn, "func", fn)  # functools.partial: describe the function and its arguments
        try:
            source = inspect.getsource(target)
        except (OSError, TypeError):
            source = repr(target)
        out = {"callable": f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', repr(target))}",
               "sha256": hashlib.sha256(source.encode()).hexdigest()}
        if target is not fn:
            out["partial"] = repr(fn)
        if out["callable"].startswith("__main__:") or "<" in out["callable"]:
            out["source"] = source
        return out

    if isinstance(reward, Reward):
        return {"terms": {name: (float(w) if not callable(w) else described(w)) for name, w in reward.terms.items()}}
    if callable(reward):
        return described(reward)
    raise ValueError(f"reward must be a Reward, a callable of the episode or a spec string; got {type(reward).__name__}")


def check_reward(reward_fn, spec, n: int = 2) -> None:
    """Score scripted expert and random episodes before any training: a reward that raises, or returns NaN or a
    non-number, fails here with one clear error instead of in the middle of a run."""
    import math

    for task in spec.make_tasks("validation", n, seed=0):
        for policy in (p for p in (spec.expert, spec.random_policy) if p is not None):
            ep = scripted_episode(spec, task, policy)
            try:
                total = _total(reward_fn(ep))
            except InfraError:
                continue  # a service being down is not a bad reward (the fault path handles it during training)
            except Exception as exc:  # noqa: BLE001 — any failure of the user's reward: one clear line
                raise ValueError(f"the reward failed on a scripted {spec.name} episode: {type(exc).__name__}: {exc}"
                                 ) from None
            if not math.isfinite(total):
                raise ValueError(f"the reward returned {total} on a scripted {spec.name} episode; it must be finite")


def _total(scored: tuple[float, dict] | float) -> float:
    value = scored[0] if isinstance(scored, tuple) else scored
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating | np.integer):
        raise TypeError(f"a reward must be a number (or a (total, terms) pair), got {type(value).__name__}")
    return float(value)


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


# -- TRL adapter -----------------------------------------------------------------------------------------------

# Text that shows an attempted tool call; in an assistant message with no parsed tool_calls it marks off-form.
TOOL_CALL_MARKERS = ("<tool_call>", "<function=", "<|tool_call", '"arguments":')


def turns_from_messages(completion: list[dict] | str) -> list[Turn]:
    """Turns from a TRL completion (assistant and tool messages, or plain text). TRL turns any tool exception
    into an ``{'error': …}`` result, so errors here are all marked ``"policy"``."""
    if isinstance(completion, str):
        return [Turn(text=completion, off_form=any(m in completion for m in TOOL_CALL_MARKERS))]
    turns: list[Turn] = []
    for message in completion:
        content = message.get("content") or ""
        content = content if isinstance(content, str) else json.dumps(content)
        if message.get("role") == "assistant":
            calls = [{"name": c.get("function", {}).get("name", ""), "arguments": c.get("function", {}).get(
                "arguments", {}), "result": None, "error": None} for c in message.get("tool_calls") or []]
            off_form = not calls and any(m in content for m in TOOL_CALL_MARKERS)
            turns.append(Turn(text=content, tool_calls=calls, off_form=off_form))
        elif message.get("role") == "tool" and turns:
            pending = next((c for c in turns[-1].tool_calls if c["result"] is None), None)
            if pending is not None:
                pending["result"] = content
                pending["error"] = "policy" if content.startswith(("Error:", "{'error'")) else None
    return turns


def trl_reward_func(reward_fn: RewardFn, env_name: str) -> Callable[..., list[float | None]]:
    """A reward function with TRL's custom signature, scoring each rollout from its environment instance.

    TRL (1.16, ``GRPOTrainer._calculate_rewards``) passes ``environments=`` — the instances the rollouts ran in —
    to every reward function when ``environment_factory`` is set; we read ``env._task`` and ``env.outcome``,
    evaluate, and apply ``reward_fn``. Rollouts of another environment get ``None`` (TRL ignores them as NaN).
    Each term's batch mean is logged as ``reward_terms/<name>`` through TRL's ``log_metric``.
    """
    from agentlab.envs import load

    spec = load(env_name)

    def reward_func(prompts, completions, environments=None, **kwargs) -> list[float | None]:
        if environments is None:
            raise ValueError(f"{env_name}_reward scores from environment state: pass "
                             "GRPOTrainer(environment_factory=...) so TRL hands it `environments`")
        totals: list[float | None] = []
        sums: dict[str, float] = defaultdict(float)
        for env, completion in zip(environments, completions, strict=True):
            if getattr(env, "name", None) != env_name or env._task is None:
                totals.append(None)
                continue
            outcome = env.outcome
            ep = Episode(task=env._task, turns=turns_from_messages(completion), outcome=outcome,
                         metrics=spec.evaluate(env._task, outcome),
                         exit_reason="final_answer" if outcome.finished else "no_tool_call")
            scored = reward_fn(ep)
            totals.append(_total(scored))
            for name, value in (scored[1] if isinstance(scored, tuple) else {}).items():
                sums[name] += value
        scored_n = sum(t is not None for t in totals)
        if (log_metric := kwargs.get("log_metric")) and scored_n:
            for name, value in sums.items():
                log_metric(f"reward_terms/{name}", value / scored_n)
        return totals

    reward_func.__name__ = reward_func.__qualname__ = f"{env_name}_reward"
    return reward_func


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

