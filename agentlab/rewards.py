"""Rewards: small weighted terms and their composition into a reward that training can record and reproduce.

A reward is a plain function ``reward_fn(ep) -> (total, terms)`` built from terms you can read and edit in a
notebook cell. Rewards are pure functions of a saved :class:`~agentlab.types.Episode`, so a changed reward is
tried on old rollouts without re-running anything::

    from agentlab.rewards import compose
    reward_fn = compose(success=1.0, format=0.1)              # what lookup trains on

Trying a reward on saved rollouts (GRPO advantages, rescoring) and against degenerate trajectories (reward-hacking
probes) lives in :mod:`agentlab.reward_design`; an LLM judge as a term in :mod:`agentlab.judge`.

Weights are what one unit of a term adds to the total, so penalties carry negative weights (``empty=-0.2`` adds
−0.2 to an episode that submitted nothing). The doc_search reward follows a published GRPO document-curation
agent's: F-beta with β = 4 (recall matters 16× more than precision) and −0.2 for curating nothing, because an
empty set and a wrong set both score F4 = 0 and GRPO needs them told apart.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from dataclasses import (
    dataclass,
    field,
    replace,  # noqa: F401  (the doctests use it)
)

import numpy as np

from agentlab.types import (
    Episode,
    Outcome,
    Task,
    Turn,  # noqa: F401  (the doctests build turns)
)

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

    ``max_calls=1`` is a published search agent's variant (−0.1 once if any call was off-form): without a penalty a
    lenient parser lets a malformed habit ride along with good episodes until nearly every episode has one.

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


def _total(scored: tuple[float, dict] | float) -> float:
    value = scored[0] if isinstance(scored, tuple) else scored
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating | np.integer):
        raise TypeError(f"a reward must be a number (or a (total, terms) pair), got {type(value).__name__}")
    return float(value)
