"""Fault injection: make tools, episode resets, generation and an LLM judge fail some of the time, the way a flaky
sandbox or service does.

Used by the tests and notebook 08 to show why infra failures must be retried and re-scored rather than charged
to the policy::

    from agentlab.faults import faulty_spec
    spec = faulty_spec(load("lookup"), rate=0.1, seed=0)      # same tools, 10% of calls raise InfraError
    GRPOTrainer(..., environment_factory=spec.env_class)      # still a valid TRL environment

A fault is decided by ``(seed, task id, attempt number)``, where every tool call — including a retry —
is a new attempt. So the same run always fails at the same places, and a retry after a transient fault can
succeed. Faults fire *before* the tool runs, so a failed call changes nothing in the episode except
``outcome.tool_calls``, which counts the attempt as a real fault would (the retrying caller un-counts it).

Beyond tool calls: ``inject_faults(..., sites=("tool", "reset"))`` also fails episode resets;
:func:`flaky_generate` wraps a generate function so that it drops its connection; :class:`FlakyTerm` is a reward
term (an LLM judge stand-in) that times out. Each fault is an :class:`~agentlab.types.InfraError` (also a
``TimeoutError`` or ``ConnectionError`` where it mimics one): the loop retries it and, when it persists, records the
episode as infra, never as the policy's failure (``benchmarks/reliability.py`` measures that).

    >>> from agentlab.envs.lookup import LookupEnv
    >>> from agentlab.types import tool_names
    >>> tool_names(inject_faults(LookupEnv, rate=0.1)) == tool_names(LookupEnv)
    True
"""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import ClassVar

from agentlab.types import EnvSpec, InfraError, Task, ToolEnv, seeded_rng, tool_names


class ToolCrash(InfraError):
    """The tool's backend raised (a simulated exception)."""


class ToolTimeout(InfraError, TimeoutError):
    """The tool did not answer in time (simulated: raised at once, no waiting)."""


class DroppedConnection(InfraError, ConnectionError):
    """The connection to the sandbox dropped mid-call (simulated)."""


INJECTED: Counter = Counter()  # faults fired so far in this process, by site ("tool", "reset", "generate", "judge")
FAULTS: dict[str, type[InfraError]] = {"exception": ToolCrash, "timeout": ToolTimeout, "dropped": DroppedConnection}


def fault_for(seed: int, task_id: str, attempt: int, rate: float, kinds: tuple[str, ...]) -> str | None:
    """The fault kind injected on ``attempt`` (0-based, per episode) of ``task_id``, or None.

    >>> fault_for(0, "t", 0, rate=0.0, kinds=("timeout",)) is None, fault_for(0, "t", 0, 1.0, ("timeout",))
    (True, 'timeout')
    """
    rng = seeded_rng("fault", seed, task_id, attempt)
    if rng.random() >= rate:
        return None
    return kinds[rng.randrange(len(kinds))]


class FaultyEnv(ToolEnv):
    """Mixin placed before the real environment class by :func:`inject_faults` (only underscored helpers, so
    TRL sees exactly the wrapped class's tools).

    Per instance: ``_faults`` lists this episode's injected faults (``{"task", "attempt", "tool", "kind"}``),
    ``_fault_total`` counts all faults since construction (TRL reuses instances across episodes).
    """

    _fault_rate: float = 0.0
    _fault_kinds: tuple[str, ...] = tuple(FAULTS)
    _fault_seed: int = 0
    _fault_sites: tuple[str, ...] = ("tool",)
    _resets: ClassVar[dict[str, int]] = {}  # resets per task (per faulty class): each reset, a retried one too, is an attempt

    def __init__(self) -> None:
        super().__init__()
        self._fault_attempt = 0
        self._faults: list[dict] = []
        self._fault_total = 0

    def reset(self, **row):
        self._fault_attempt = 0
        self._faults = []
        if "reset" in self._fault_sites and row.get("task") is not None:
            task = row["task"]
            task_id = task.id if isinstance(task, Task) else Task.from_json(task).id
            attempt = self._resets.get(task_id, 0)
            self._resets[task_id] = attempt + 1
            kind = fault_for(self._fault_seed, task_id + "/reset", attempt, self._fault_rate, self._fault_kinds)
            if kind is not None:
                INJECTED["reset"] += 1
                raise FAULTS[kind](f"reset: injected {kind} fault (task {task_id}, attempt {attempt})")
        return super().reset(**row)

    def _maybe_fail(self, tool: str) -> None:
        if self._task is None or "tool" not in self._fault_sites:  # not reset: the tool's own guard answers
            return
        attempt = self._fault_attempt
        self._fault_attempt += 1
        kind = fault_for(self._fault_seed, self._task.id, attempt, self._fault_rate, self._fault_kinds)
        if kind is None:
            return
        self._faults.append({"task": self._task.id, "attempt": attempt, "tool": tool, "kind": kind})
        self._fault_total += 1
        INJECTED["tool"] += 1
        # Real environment faults happen after the tool's guard counted the call, and the rollout loop un-counts
        # a failed attempt; count it here too so both kinds of fault leave ``tool_calls`` the same.
        self._outcome.tool_calls += 1
        raise FAULTS[kind](f"{tool}: injected {kind} fault (task {self._task.id}, attempt {attempt})")


def _faulty(name: str, method):
    # functools.wraps keeps __name__, __doc__ and __wrapped__, so inspect.signature and TRL's schema builder
    # (transformers.get_json_schema) see the original tool exactly.
    @functools.wraps(method)
    def tool(self, *args, **kwargs):
        self._maybe_fail(name)
        return method(self, *args, **kwargs)

    return tool


SITES = ("tool", "reset")


def inject_faults(env_class: type[ToolEnv], rate: float, kinds: tuple[str, ...] = tuple(FAULTS),
                  seed: int = 0, sites: tuple[str, ...] = ("tool",)) -> type[ToolEnv]:
    """A subclass of ``env_class`` whose tool calls (and/or resets: ``sites``) raise an :class:`InfraError` subclass
    a ``rate`` fraction of the time (``kinds`` from ``"exception"``, ``"timeout"``, ``"dropped"``)."""
    if not set(sites) <= set(SITES) or not sites:
        raise ValueError(f"sites must be a non-empty subset of {SITES}, got {sites}")
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"rate must be within [0, 1], got {rate}")
    kinds = tuple(kinds)
    if not kinds or set(kinds) - set(FAULTS):
        raise ValueError(f"kinds must be a non-empty subset of {sorted(FAULTS)}, got {kinds}")
    if not (isinstance(env_class, type) and issubclass(env_class, ToolEnv)):
        raise TypeError(f"env_class must be a ToolEnv subclass, got {env_class!r}")
    namespace = {name: _faulty(name, getattr(env_class, name)) for name in tool_names(env_class)}
    namespace.update(_fault_rate=float(rate), _fault_kinds=kinds, _fault_seed=seed, _fault_sites=tuple(sites),
                     _resets={}, __module__=__name__,
                     __doc__=f"{env_class.__name__} with {rate:.0%} injected infra faults ({', '.join(kinds)}).")
    return type(f"Faulty{env_class.__name__}", (FaultyEnv, env_class), namespace)


def faulty_spec(spec: EnvSpec, rate: float, kinds: tuple[str, ...] = tuple(FAULTS), seed: int = 0,
                sites: tuple[str, ...] = ("tool",), name: str | None = None) -> EnvSpec:
    """``spec`` with its environment class replaced by a faulty one (for ``run_policy`` and the rollout loop);
    ``name``: register it under another name (``agentlab.envs.register``) to train on it by name."""
    return replace(spec, env_class=inject_faults(spec.env_class, rate, kinds, seed, sites), name=name or spec.name)


def flaky_generate(generate, rate: float, seed: int = 0):
    """A generate function (``agentlab.engines.GenerateFn``) whose calls drop their connection a ``rate`` fraction
    of the time, like a vLLM server going away; the n-th call's fate is fixed by ``(seed, n)``."""
    calls = itertools.count()

    def wrapped(seqs):
        n = next(calls)
        if fault_for(seed, "generate", n, rate, ("dropped",)):
            INJECTED["generate"] += 1
            raise DroppedConnection(f"generate: injected dropped fault (call {n})")
        return generate(seqs)

    return wrapped


@dataclass(frozen=True)
class FlakyTerm:
    """A reward term standing in for an LLM judge that times out a ``rate`` fraction of its calls; when it answers,
    it gives ``value``. Decided by ``(seed, task id, call number)``.

    >>> FlakyTerm(rate=0.0, value=0.25)(None)
    0.25
    """

    rate: float
    seed: int = 0
    value: float = 0.0
    calls: Iterator[int] = field(default_factory=itertools.count, compare=False, repr=False)

    def __call__(self, ep) -> float:
        task_id = ep.task.id if ep is not None else ""
        if fault_for(self.seed, task_id + "/judge", next(self.calls), self.rate, ("timeout",)):
            INJECTED["judge"] += 1
            raise ToolTimeout(f"judge: injected timeout (task {task_id})")
        return self.value
