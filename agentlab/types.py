"""The few types every part of agentlab shares: tasks, tool calls, episodes, and the environment base class.

An *environment* is tasks + tools + a verifier: an :class:`EnvSpec` (``agentlab.envs.load(name)``). Its class is what
TRL's ``GRPOTrainer(environment_factory=...)`` and our loop (``agentlab.rollout``) both drive, so they never disagree
about tools: TRL exposes **every public method** (alphabetically) except ``reset`` and ``get_reward``, so helpers on
an environment class must start with an underscore.

Example (a scripted episode, no model)::

    >>> from agentlab.envs import load
    >>> spec = load("lookup")
    >>> task = spec.make_tasks("train", 1, seed=0)[0]
    >>> outcome, calls = run_policy(spec, task, spec.expert)
    >>> spec.evaluate(task, outcome)["success"]
    1.0
"""

from __future__ import annotations

import inspect
import json
import random
from collections.abc import Callable, Generator
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True)
class Task:
    """One episode's instruction and its reference answer.

    ``answer`` is environment specific (qualified names, supporting chunk ids, product constraints …); only the
    environment's ``evaluate`` reads it. ``query`` is the text a split audit compares for leakage.

    >>> t = Task(id="lookup-1", env="lookup", question="Where does Ada Vell live?", answer={"value": "Oslo"})
    >>> Task.from_json(t.to_json()) == t
    True
    """

    id: str
    env: str
    question: str
    answer: dict
    difficulty: int = 1
    meta: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Task:
        return cls(**json.loads(text))


@dataclass
class ToolCall:
    """A call the policy made (or wants to make): tool name and keyword arguments.

    >>> ToolCall("lookup_person", {"name": "Ada Vell"}).as_message()["tool_calls"][0]["function"]["name"]
    'lookup_person'
    """

    name: str
    arguments: dict

    def as_message(self, content: str = "") -> dict:
        """The assistant message that carries this call, in the shape chat templates render."""
        return {
            "role": "assistant",
            "content": content,
            "tool_calls": [{"type": "function", "function": {"name": self.name, "arguments": self.arguments}}],
        }


@dataclass
class Outcome:
    """What an episode produced, as the verifier sees it.

    ``final`` is the submitted answer (qualified names, curated chunk ids, recommended product ids); ``seen`` is
    every id that appeared in a tool result (for trajectory recall); ``finished`` says whether the final-answer
    tool was called.
    """

    final: list[str] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)
    finished: bool = False
    tool_calls: int = 0
    tool_errors: int = 0
    score: float | None = None  # a score the environment computed itself (a TRL-style class's reward method)


@dataclass
class Turn:
    """One assistant turn and the tool results it triggered.

    ``tool_calls`` items: ``{"name", "arguments", "result", "error"}`` where ``error`` is ``None``, ``"policy"``
    (the tool answered "Error: …") or ``"infra"`` (the environment failed after retries). ``off_form`` marks a
    turn whose text tried to call a tool but could not be parsed. ``n_generated`` tokens are trained on;
    ``n_context`` tokens (tool results and template glue) that follow are masked from the loss. ``lenient``
    marks a turn whose calls *were* parsed although its text breaks the declared format (words around the call, a
    missing closing tag …): the parser was lenient, so a format penalty has something to bite on.
    """

    text: str
    tool_calls: list[dict] = field(default_factory=list)
    off_form: bool = False
    lenient: bool = False
    n_generated: int = 0
    n_context: int = 0


@dataclass
class Episode:
    """One rollout, as written to ``rollouts.jsonl`` (one JSON object a line) and read back by evals/rewards.

    ``exit_reason``: ``final_answer`` | ``no_tool_call`` | ``max_turns`` | ``context`` | ``error``.
    ``failure``: ``None`` on success, ``"model"`` for a policy failure, ``"infra"`` when the environment failed
    (those are re-run, never counted against the model). ``group`` indexes the prompt the episode was sampled
    for (GRPO groups); ``sample`` its index inside the group.
    """

    task: Task
    turns: list[Turn] = field(default_factory=list)
    outcome: Outcome = field(default_factory=Outcome)
    metrics: dict = field(default_factory=dict)
    reward: float = 0.0
    reward_terms: dict = field(default_factory=dict)
    exit_reason: str = ""
    failure: str | None = None
    group: int = 0
    sample: int = 0
    timings: dict = field(default_factory=dict)
    model_id: str = ""
    config_id: str = ""
    step: int | None = None
    tokens: dict = field(default_factory=dict)  # prompt_ids, completion_ids, mask (1 = trained), when recorded

    @property
    def success(self) -> float:
        return float(self.metrics.get("success", 0.0))

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Episode:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, d: dict) -> Episode:
        d = dict(d)
        d["task"] = Task(**d["task"])
        d["turns"] = [Turn(**t) for t in d["turns"]]
        d["outcome"] = Outcome(**d["outcome"])
        return cls(**d)


class InfraError(RuntimeError):
    """Raised when the *environment* failed (database gone, timeout, dropped connection): retried, then recorded as
    infra (``agentlab.retries``). Policy mistakes (bad ids, malformed arguments) are answered as error strings."""


class ToolEnv:
    """Base class of every environment. Subclasses add typed, docstringed tool methods. Contract, shared with
    TRL's ``environment_factory``:

    * ``reset(**row)`` receives a dataset row (its ``task`` column: ``Task.to_json()``); returns ``None``.
    * tool methods return short strings; bad arguments give an ``"Error: …"`` string, never an exception.
    * ``get_reward()`` scores the finished episode: the instance's ``_reward`` if one was set, else the default.
    * ``done`` turns true when the final-answer tool has been called; later tool calls are refused.
    """

    name: ClassVar[str] = ""
    final_tool: ClassVar[str] = ""
    system_prompt: ClassVar[str] = ""

    def __init__(self) -> None:
        self._task: Task | None = None
        self._outcome = Outcome()

    def reset(self, **row: Any) -> str | None:
        task = row.get("task")
        if task is None:
            raise ValueError(f"{type(self).__name__}.reset needs a 'task' column; got columns {sorted(row)}")
        self._task = task if isinstance(task, Task) else Task.from_json(task)
        self._outcome = Outcome()
        self._start(self._task)
        return None

    def get_reward(self) -> float:
        """The episode's reward so far, for TRL's ``environment_factory`` loops: ``self._reward``'s if the instance's
        maker set one (``agentlab.gpu_async``), else its :class:`EnvSpec`'s default (set with the spec, no lookup)."""
        spec = getattr(type(self), "_spec", None)
        if spec is None:
            raise RuntimeError(f"{type(self).__name__} has no EnvSpec, so no default reward: build one with "
                               f"agentlab.types.EnvSpec(env_class={type(self).__name__}, ...)")
        return spec.score(self._task, self._outcome, getattr(self, "_reward", None))

    @property
    def done(self) -> bool:
        return self._outcome.finished

    @property
    def outcome(self) -> Outcome:
        """What the episode produced so far (read it; tools change it through their own methods)."""
        return self._outcome

    # -- helpers for subclasses (underscored so TRL does not expose them as tools) --------------------------

    def _start(self, task: Task) -> None:
        """Per-episode setup. Override to build episode state."""

    def _prompt_messages(self) -> list[dict] | None:
        """The episode's prompt messages when the environment writes them (after ``reset``); None: the default
        system prompt + question."""
        return None

    def _finalize(self) -> None:
        """Called once when the episode ends, before it is scored (a TRL-style class computes its reward here)."""

    def _record(self, ids: list[str]) -> None:
        seen = self._outcome.seen
        seen.extend(i for i in ids if i not in seen)

    def _guard(self) -> str | None:
        """Count the call; refuse it after the episode ended."""
        self._outcome.tool_calls += 1
        if self._task is None:
            return "Error: the environment was not reset with a task."
        if self._outcome.finished:
            return f"Error: the episode is over ({self.final_tool} was already called)."
        return None

    def _error(self, message: str) -> str:
        self._outcome.tool_errors += 1
        return f"Error: {message}"


def tool(method):
    """Mark an environment method as a tool: the call is counted, and refused with an error the model reads before
    ``reset`` or after the final-answer tool — the guard every tool needs, written once. ``functools.wraps``
    keeps the name, signature and docstring, so the schema the model sees is the method's own.

    >>> class Env(ToolEnv):
    ...     @tool
    ...     def ping(self) -> str:
    ...         "Ping."
    ...         return "pong"
    >>> env = Env()
    >>> env.ping(), env.outcome.tool_calls
    ('Error: the environment was not reset with a task.', 1)
    """
    import functools

    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        if refusal := self._guard():
            return refusal
        return method(self, *args, **kwargs)

    return guarded


@dataclass(frozen=True)
class Budget:
    """What one episode may spend, written once in its :class:`EnvSpec`; configs derive theirs from it."""

    max_turns: int = 4            # assistant generations per episode
    max_new_tokens: int = 96      # per turn
    max_context: int = 2048       # prompt + completion tokens; the episode ends before exceeding it


BUDGET_FIELDS = ("max_turns", "max_new_tokens", "max_context")


# A scripted policy is a generator: it yields tool calls and receives each call's result string.
Policy = Callable[[Task], Generator[ToolCall, str, None]]


@dataclass(frozen=True)
class EnvSpec:
    """Everything agentlab needs to know about one environment.

    * ``env_class`` — the ToolEnv subclass (pass it as TRL's ``environment_factory``).
    * ``make_tasks(split, n, seed, **knobs)`` — deterministic task generator; splits are disjoint.
    * ``evaluate(task, outcome)`` — pure success check: a dict with at least ``success`` (0..1) and ``exact``.
    * ``default_reward`` — the :class:`agentlab.rewards.Reward` GRPO trains on unless a config names another.
    * ``expert`` / ``random_policy`` — scripted policies (expert demos for SFT; a floor for evaluation); ``expert``
      may be None (an environment nobody scripted: evaluation and GRPO still work, SFT needs demonstrations).
    * ``audit_keys(task)`` — the strings (line, answer ids, query) that must not repeat across splits.
    * ``valid_rollout(outcome)`` — optional: what the write-up calls a valid rollout (default: finished).
    * ``answer_cap`` — the most items a final answer may hold (1: a single answer).
    * ``hint(kind, task, call, result)`` — optional: the environment's own training-time hint text.
    * ``budget`` — the :class:`Budget` an episode needs (turns, tokens per turn, context).
    * ``cheap_policy`` — optional: a cheaper, imperfect strategy that succeeds only sometimes (the traces one has
      before an expert exists; the ``cheap`` regime of ``agentlab.compare``).
    * ``strategies`` — optional: other scripted strategies by name (with the expert, cheap and random policies, the
      calibration rows of a study's tables).
    """

    name: str
    env_class: type[ToolEnv]
    make_tasks: Callable[..., list[Task]]
    evaluate: Callable[[Task, Outcome], dict]
    default_reward: Callable[[Episode], tuple[float, dict[str, float]]]
    expert: Policy | None
    random_policy: Policy
    audit_keys: Callable[[Task], dict[str, list[str]]]
    description: str = ""
    cheap_policy: Policy | None = None
    valid_rollout: Callable[[Outcome], bool] | None = None  # None: the final-answer tool was called
    answer_cap: int = 1           # most items a final answer may hold (reward-hacking probes submit up to this)
    hint: Callable[[str, Task, ToolCall, str], str] | None = None  # training-time feedback (agentlab.hints)
    budget: Budget = Budget()
    strategies: dict[str, Policy] = field(default_factory=dict)

    def __post_init__(self):
        self.env_class._spec = self  # ToolEnv.get_reward scores with this spec's reward

    def is_valid(self, outcome: Outcome) -> bool:
        """A *valid rollout* as the environment's write-up defines it (training curves plot their share)."""
        return self.valid_rollout(outcome) if self.valid_rollout is not None else outcome.finished

    def make_env(self) -> ToolEnv:
        return self.env_class()

    def score(self, task: Task, outcome: Outcome, reward: Callable | None = None) -> float:
        """An outcome's reward: ``reward``'s or the default (an episode with no turns: terms reading turns see none)."""
        ep = Episode(task=task, outcome=outcome, metrics=self.evaluate(task, outcome))
        return float((reward or self.default_reward)(ep)[0])


def prompt_messages(env_class: type[ToolEnv], task: Task) -> list[dict]:
    """The conversation an episode starts from: the environment's system prompt, then the task's question. The one
    place it is written: the agent loop, SFT demonstrations and GRPO's dataset rows all start here.

    >>> [m["role"] for m in prompt_messages(ToolEnv, Task(id="t", env="e", question="Where?", answer={}))]
    ['system', 'user']
    """
    return [{"role": "system", "content": env_class.system_prompt}, {"role": "user", "content": task.question}]


def call_tool(env: ToolEnv, call: ToolCall) -> str:
    """Run one tool call on ``env`` and return its result string.

    Unknown tools and wrong arguments become error strings, exactly as the policy would see them. InfraError
    propagates (the caller decides about retries).
    """
    method = getattr(type(env), call.name, None) if not call.name.startswith("_") else None
    if method is None or call.name in ("reset", "get_reward") or not callable(method):
        env.outcome.tool_calls += 1
        return env._error(f"unknown tool {call.name!r}; available tools: {', '.join(tool_names(env))}")
    if not isinstance(call.arguments, dict):
        env.outcome.tool_calls += 1
        return env._error(f"arguments must be a JSON object, got {type(call.arguments).__name__}")
    try:  # wrong or missing argument names: the policy's mistake, counted once, answered with an error
        inspect.signature(method).bind(env, **call.arguments)
    except TypeError as exc:
        env.outcome.tool_calls += 1
        return env._error(f"bad arguments for {call.name}: {exc}")
    # anything the body raises is the environment's (a tool answers bad values with "Error: …" strings)
    return str(getattr(env, call.name)(**call.arguments))


def tool_names(env: ToolEnv | type[ToolEnv]) -> list[str]:
    """Tool method names in the order TRL renders them (alphabetical, public, not reset/get_reward)."""
    cls = env if isinstance(env, type) else type(env)
    return [n for n, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
            if not n.startswith("_") and n not in ("reset", "get_reward")]


def run_policy(spec: EnvSpec, task: Task, policy: Policy, max_calls: int = 30, env: ToolEnv | None = None):
    """Play a scripted policy on a fresh environment (or ``env``, reset for ``task``): outcome, [(call, result)…]."""
    if policy is None:
        raise ValueError(f"environment {spec.name!r} has no scripted expert: evaluation and GRPO work without one; "
                         f"SFT needs demonstrations (write an expert policy in its EnvSpec)")
    if env is None:
        (env := spec.make_env()).reset(task=task.to_json())
    gen = policy(task)
    history: list[tuple[ToolCall, str]] = []
    result: str | None = None
    try:
        for _ in range(max_calls):
            call = gen.send(result) if history else next(gen)
            result = call_tool(env, call)
            history.append((call, result))
            if env.done:
                break
    except StopIteration:
        pass
    env._finalize()
    return env.outcome, history


def seeded_rng(*parts: object) -> random.Random:
    """A random.Random seeded from any parts (stable across runs and Python versions)."""
    import hashlib

    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))
