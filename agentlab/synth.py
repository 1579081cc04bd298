"""Task synthesis helpers: split audits (and, with the training issue, dataset building and expert demos).

    >>> from agentlab.envs import load
    >>> spec = load("lookup")
    >>> splits = {s: spec.make_tasks(s, 20, seed=0) for s in ("train", "test")}
    >>> audit_splits(spec, splits)["ok"]
    True
"""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

from agentlab.types import EnvSpec, Episode, Task, prompt_messages, run_policy, tool_names


def audit_splits(spec: EnvSpec, splits: dict[str, list[Task]]) -> dict:
    """Check that no two splits share a task line, an answer id or a query text.

    Returns ``{"ok": bool, "overlaps": {"train/test/answer": [values…]}, "sizes": {split: n}}``; ``values`` lists
    at most 10 offending strings so a report stays readable.
    """
    keys = {name: _keys(spec, tasks) for name, tasks in splits.items()}
    overlaps: dict[str, list[str]] = {}
    for a, b in combinations(sorted(splits), 2):
        for kind in ("line", "answer", "query"):
            shared = keys[a].get(kind, set()) & keys[b].get(kind, set())
            if shared:
                overlaps[f"{a}/{b}/{kind}"] = sorted(shared)[:10]
    return {"ok": not overlaps, "overlaps": overlaps, "sizes": {k: len(v) for k, v in splits.items()}}


def _keys(spec: EnvSpec, tasks: list[Task]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for task in tasks:
        for kind, values in spec.audit_keys(task).items():
            out.setdefault(kind, set()).update(" ".join(v.lower().split()) for v in values)
    return out


# -- datasets ---------------------------------------------------------------------------------------------------------

DEFAULT_SIZES = {"train": 240, "validation": 48, "test": 120}


def build_splits(spec: EnvSpec, sizes: dict[str, int] | None = None, seed: int = 0, **knobs) -> dict[str, list[Task]]:
    """Generate train / validation / test tasks and audit them disjoint; raises if the audit fails."""
    sizes = sizes or DEFAULT_SIZES
    splits = {name: spec.make_tasks(name, n, seed=seed, **knobs) for name, n in sizes.items() if n > 0}
    report = audit_splits(spec, splits)
    if not report["ok"]:
        raise ValueError(f"{spec.name}: splits overlap: {report['overlaps']}")
    return splits


def save_splits(splits: dict[str, list[Task]], folder: Path) -> dict[str, Path]:
    """Write one ``<split>.jsonl`` per split (one Task JSON a line), atomically."""
    import os
    import tempfile

    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, tasks in splits.items():
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.")
        with os.fdopen(fd, "w") as fh:
            fh.writelines(t.to_json() + "\n" for t in tasks)
        paths[name] = folder / f"{name}.jsonl"
        os.replace(tmp, paths[name])
    return paths


def load_tasks(path: Path, env: str | None = None) -> list[Task]:
    """Tasks from a JSONL file (one ``Task`` a line); a bad line is an error naming the file and its line, and a
    task of another environment than ``env`` is refused."""
    import json

    tasks = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            task = Task.from_json(line)
        except (json.JSONDecodeError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: not a task record ({type(exc).__name__}: {exc})") from None
        if env is not None and task.env != env:
            raise ValueError(f"{path}:{number}: a task of environment {task.env!r}, expected {env!r}")
        tasks.append(task)
    return tasks


def tool_schemas(env_class) -> list[dict]:
    """JSON schemas of the environment's tools, in the order TRL renders them (alphabetical)."""
    from transformers.utils import get_json_schema


    env = env_class()
    return [get_json_schema(getattr(env, n)) for n in tool_names(env_class)]


def expert_demos(spec: EnvSpec, tasks: list[Task], policy=None) -> list[dict]:
    """Conversations of the scripted expert, rendered with exactly the tool list (and order) the trainer uses.

    Each row: ``{"messages": [...], "tools": json, "task_id": ...}`` — TRL's SFTTrainer conversational format.
    Only successful demonstrations are kept: we teach what works.
    """
    import json as _json


    tools = _json.dumps(tool_schemas(spec.env_class))
    rows = []
    for task in tasks:
        outcome, history = run_policy(spec, task, policy or spec.expert)
        if spec.evaluate(task, outcome)["success"] < 1.0:
            continue
        rows.append({"messages": conversation(spec, prompt_messages(spec.env_class, task), history), "tools": tools,
                     "task_id": task.id})
    return rows


def conversation(spec: EnvSpec, prompt: list[dict], history: list[tuple]) -> list[dict]:
    """``prompt`` then a played episode's ``[(ToolCall, result), …]`` as chat messages: each call an assistant
    message, each result a tool message (the final-answer tool's echo left out, as the loop shows it)."""
    messages = list(prompt)
    for call, result in history:
        messages.append(call.as_message())
        if call.name != spec.env_class.final_tool:
            messages.append({"role": "tool", "name": call.name, "content": result})
    return messages


def tokenize_demos(demos: list[dict], tokenizer) -> list[dict]:
    """Tokenize demonstrations for SFT: ``input_ids`` + ``assistant_masks`` (1 on the assistant's tokens).

    Why we tokenize here instead of letting SFTTrainer do it: a ``datasets`` column of messages unifies the
    tool-call ``arguments`` dicts of all rows into one struct, so ``{"query": "Ada"}`` comes back as
    ``{"query": "Ada", "value": None}`` and the model learns to emit null arguments (seen: 100% failed calls).
    Rendering from the Python dicts avoids the round trip. The template is TRL's training variant of the
    policy's template (same tokens, plus generation markers for the mask).
    """
    import json as _json

    from trl.chat_template_utils import get_training_chat_template

    template = get_training_chat_template(tokenizer)
    rows = []
    for demo in demos:
        tools = _json.loads(demo["tools"]) if isinstance(demo["tools"], str) else demo["tools"]
        out = tokenizer.apply_chat_template(demo["messages"], tools=tools, chat_template=template, tokenize=True,
                                            return_dict=True, return_assistant_tokens_mask=True)
        rows.append({"input_ids": list(out["input_ids"]), "assistant_masks": list(out["assistant_masks"])})
    return rows


# -- data regimes: the demonstrations a practitioner really has (agentlab.compare) --------------------------------

REGIMES = {
    "expert": "N scripted expert demonstrations over every difficulty",
    "easy": "N expert demonstrations of the easiest difficulty only",
    "cheap": "N successful traces of the environment's cheaper, imperfect strategy (EnvSpec.cheap_policy)",
}


def parse_regime(regime: str) -> tuple[str, int]:
    """``"cheap:64"`` -> ``("cheap", 64)``; a clear error for anything else.

    >>> parse_regime("easy:32")
    ('easy', 32)
    """
    kind, _, n = regime.partition(":")
    if kind not in REGIMES or not n.isdigit() or int(n) < 1:
        raise ValueError(f"regime {regime!r}: expected '<kind>:<n>' with kind one of {sorted(REGIMES)} and n >= 1, "
                         f"e.g. 'cheap:64'")
    return kind, int(n)


def regime_demos(spec: EnvSpec, regime: str, train: list[Task]) -> list[dict]:
    """The SFT demonstrations a regime allows, drawn from ``train`` (verified successes only: we teach what works).

    ``expert:N`` — the scripted expert on the first tasks; ``easy:N`` — the expert on tasks of the lowest
    difficulty only; ``cheap:N`` — the successful traces of ``spec.cheap_policy``, a cheaper strategy that
    succeeds only sometimes (the logs one has before building an expert).
    """
    kind, n = parse_regime(regime)
    policy = None
    if kind == "easy":
        low = min(t.difficulty for t in train)
        train = [t for t in train if t.difficulty == low]
    elif kind == "cheap":
        if spec.cheap_policy is None:
            raise ValueError(f"regime {regime!r}: environment {spec.name!r} has no cheap_policy in its EnvSpec")
        policy = spec.cheap_policy
    rows: list[dict] = []
    for start in range(0, len(train), 64):  # stop as soon as there are enough: the scripted runs cost time
        rows += expert_demos(spec, train[start:start + 64], policy=policy)
        if len(rows) >= n:
            return rows[:n]
    raise ValueError(f"regime {regime!r}: only {len(rows)} successful demonstrations among {len(train)} training "
                     f"tasks; synthesise more training tasks (--train) or ask for fewer")


def episode_sft_row(ep: Episode) -> dict:
    """A rollout as a pre-tokenized SFT row: exactly the tokens the policy produced, tool results masked."""
    prompt, completion, mask = ep.tokens["prompt_ids"], ep.tokens["completion_ids"], ep.tokens["mask"]
    return {"input_ids": list(prompt) + list(completion), "assistant_masks": [0] * len(prompt) + list(mask)}
