"""TRL-style environment classes, run unchanged: an ``EnvSpec`` built from a class and its dataset rows.

    agentlab eval  --env my_env.py:MyEnv --tasks rows.jsonl --name my-eval
    agentlab train --env my_env.py:MyEnv --tasks rows.jsonl --name my-grpo
    from agentlab.trl_env import spec_from_class
    spec = spec_from_class(MyEnv, rows)            # rows: reset(**row) keyword arguments, as TRL passes columns

The class is written the way TRL's documentation writes one: ``reset(**row)`` (may return an observation
string), public tool methods whose docstrings are their schemas, and a reward method read from the episode's
state (``reward`` by default, ``get_reward`` accepted). TRL's semantics are kept where our loop meets them:

* tool schemas are rendered from the class's methods, exactly as TRL renders them;
* the prompt is the row's ``prompt`` column (messages), and ``reset``'s returned string is appended to the last
  message's content, as ``GRPOTrainer`` does (``tests/test_trl_env.py`` compares the tokens with TRL's);
* a tool that raises answers the model ``{'error': '<message>'}`` — the policy's failure — except
  ``InfraError``, ``TimeoutError`` and ``ConnectionError``, which the loop retries and then records as infra;
* an episode ends when the model stops calling tools (or at the turn budget); its reward is the class's reward
  method; ``success`` is reward ≥ ``success_threshold`` (default 1.0).

Differences, on purpose: TRL would also show a public ``reward`` method to the model as a tool; here the reward
method is never a tool (name it ``get_reward`` and the tool lists are the same). There is no scripted expert, so
``agentlab sft`` / ``synth`` say so; the floor is a random policy (a random tool, arguments from the schema's
types). Held-out rows come from ``eval_rows`` (``--eval-rows``), or else from an audited hash split of ``rows``.

Why hand-written: TRL runs such a class only inside ``GRPOTrainer``'s own loop; evaluating it, comparing it with
SFT or training it through our loop (turn budgets, infra retries, episode records) needs this adapter.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json

from agentlab.rewards import Reward
from agentlab.types import EnvSpec, InfraError, Outcome, Task, ToolCall, ToolEnv, seeded_rng

SPLITS = (("train", 0.8), ("validation", 0.9), ("test", 1.0))
REWARD_METHODS = ("reward", "get_reward")


def is_trl_style(obj) -> bool:
    """A class with ``reset`` that is not one of ours (our environments are ``ToolEnv`` subclasses)."""
    return inspect.isclass(obj) and callable(getattr(obj, "reset", None)) and not issubclass(obj, ToolEnv)


def tool_methods(cls, reward_method: str) -> list[str]:
    """The methods TRL exposes as tools (public, not ``reset``/``get_reward``), minus the reward method."""
    names = [n for n, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
             if not n.startswith("_") and n not in ("reset", "get_reward", reward_method)]
    if not names:
        raise ValueError(f"{cls.__name__} has no public tool methods")
    return names


def _row_id(row: dict) -> str:
    return hashlib.sha256(json.dumps(row, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _question(row: dict) -> str:
    prompt = row.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        return str(prompt[-1].get("content", ""))
    return str(prompt) if prompt is not None else json.dumps(row, sort_keys=True, default=str)[:500]


def spec_from_class(cls, rows: list[dict], *, name: str | None = None, reward_method: str | None = None,
                    success_threshold: float = 1.0, eval_rows: list[dict] | None = None) -> EnvSpec:
    """An ``EnvSpec`` for a TRL-style class and its dataset rows (see the module docstring)."""
    import warnings

    if not is_trl_style(cls):
        raise ValueError(f"{cls!r} is not a TRL-style environment class (a class with reset(**row))")
    if reward_method is None:
        reward_method = next((m for m in REWARD_METHODS if callable(getattr(cls, m, None))), None)
        if reward_method is None:
            raise ValueError(f"{cls.__name__} has no reward method: expected {' or '.join(REWARD_METHODS)}() "
                             f"returning the episode's reward (or pass reward_method=...)")
    elif not callable(getattr(cls, reward_method, None)):
        raise ValueError(f"{cls.__name__} has no method {reward_method!r} (the reward method asked for)")
    if not rows:
        raise ValueError(f"{cls.__name__}: no task rows (each row: the keyword arguments of reset)")
    tools = tool_methods(cls, reward_method)
    for tool in tools:
        if not inspect.getdoc(getattr(cls, tool)):
            warnings.warn(f"{cls.__name__}.{tool} has no docstring: TRL needs it to build the tool's schema",
                          stacklevel=2)
    env_name = name or cls.__name__
    env_class = _adapted_class(cls, env_name, tools, reward_method)

    def task_of(row: dict, split: str) -> Task:
        return Task(id=f"{env_name}-{_row_id(row)}", env=env_name, question=_question(row), answer=dict(row),
                    meta={"split": split})

    def hashed(row: dict) -> float:
        return int(hashlib.sha256(("trl-split\x1f" + _row_id(row)).encode()).hexdigest()[:12], 16) / 16**12

    def split_of(row: dict) -> str:
        return next(s for s, bound in SPLITS if hashed(row) < bound)

    # held-out rows in hash order: the first half validates, the second tests (8 rows: 4 and 4, whatever their hashes)
    held = sorted(eval_rows or [], key=hashed)
    halves = {"validation": held[: (len(held) + 1) // 2], "test": held[(len(held) + 1) // 2:]}

    def make_tasks(split: str, n: int, seed: int = 0) -> list[Task]:
        """Rows split by a stable hash (80/10/10); with ``eval_rows``, every row trains and the held-out rows are
        split in two halves by the same hash, validation (the larger when odd) and test."""
        if split not in dict(SPLITS):
            raise ValueError(f"unknown split {split!r}; expected one of {[s for s, _ in SPLITS]}")
        if eval_rows is None:
            pool = [r for r in rows if split_of(r) == split]
        elif split == "train":
            pool = rows
        else:
            pool = halves[split]
        tasks = [task_of(r, split) for r in pool]
        seeded_rng("trl-tasks", env_name, split, seed).shuffle(tasks)
        return tasks[:n]

    def evaluate(task: Task, outcome: Outcome) -> dict:
        score = outcome.score
        return {"success": float(score is not None and score >= success_threshold), "reward": score or 0.0,
                "tool_calls": float(outcome.tool_calls)}

    return EnvSpec(
        name=env_name, env_class=env_class, make_tasks=make_tasks, evaluate=evaluate,
        default_reward=Reward({"score": 1.0}), expert=None, random_policy=_random_policy(env_class),
        # A row is its task (reset gets every column): the audit compares whole rows, not the prompt alone, which
        # many rows share when another column holds the task (a game's seed, a ticket's id).
        audit_keys=lambda t: {"line": [json.dumps(t.answer, sort_keys=True, default=str)]},
        description=f"TRL-style class {cls.__module__}.{cls.__qualname__}; success = {reward_method}() >= "
                    f"{success_threshold:g}")


def _adapted_class(cls, env_name: str, tools: list[str], reward_method: str) -> type[ToolEnv]:
    def wrap(tool_name: str):
        original = getattr(cls, tool_name)

        @functools.wraps(original)
        def tool(self, *args, **kwargs):
            self._outcome.tool_calls += 1
            try:
                return getattr(self._inner, tool_name)(*args, **kwargs)
            except (InfraError, TimeoutError, ConnectionError):
                raise  # the environment's failure: the loop retries, then records infra
            except Exception as exc:  # noqa: BLE001 — TRL's semantics: the error text goes back to the model
                self._outcome.tool_errors += 1
                return str({"error": str(exc)})

        return tool

    def reset(self, **row):
        task = Task.from_json(row["task"]) if isinstance(row.get("task"), str) else row["task"]
        self._task, self._outcome = task, Outcome()
        self._inner = cls()
        self._observation = self._inner.reset(**task.answer)

    def prompt_messages(self) -> list[dict]:
        prompt = self._task.answer.get("prompt")
        messages = [dict(m) for m in prompt] if isinstance(prompt, list) else [{"role": "user", "content": ""}]
        if isinstance(self._observation, str):  # as GRPOTrainer does: appended to the last message's content
            messages[-1] = {**messages[-1], "content": messages[-1]["content"] + self._observation}
        return messages

    def finalize(self) -> None:
        self._outcome.score = float(getattr(self._inner, reward_method)())

    namespace = {t: wrap(t) for t in tools}
    namespace.update(name=env_name, final_tool="", system_prompt="", reset=reset, _prompt_messages=prompt_messages,
                     _from_rows=True,
                     _finalize=finalize, __module__=cls.__module__, __doc__=cls.__doc__)
    return type(cls.__name__, (ToolEnv,), namespace)


def _random_policy(env_class: type[ToolEnv]):
    """A floor: one to three random tool calls, arguments drawn from the schema's types."""
    from agentlab.synth import tool_schemas

    schemas: list[dict] = []  # rendered on first use: a tool without a docstring warns at build time, fails here

    def value(kind: str, rng, task: Task):
        words = task.question.split() or ["x"]
        return {"integer": rng.randint(0, 10), "number": round(rng.uniform(0, 10), 2), "boolean": rng.random() < 0.5,
                "array": [], "object": {}}.get(kind, rng.choice(words))

    def policy(task: Task):
        rng = seeded_rng("trl-random", task.id)
        schemas[:] = schemas or tool_schemas(env_class)
        for _ in range(rng.randint(1, 3)):
            fn = rng.choice(schemas)["function"]
            props = fn.get("parameters", {}).get("properties", {})
            yield ToolCall(fn["name"], {k: value(p.get("type", "string"), rng, task) for k, p in props.items()})

    return policy
