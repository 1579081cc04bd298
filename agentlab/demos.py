"""Demonstrations a user brings: conversational rows in TRL's format, checked against an environment's tools and
rendered exactly as the agent loop will show them.

    agentlab sft --env my_env.py:MyEnv --tasks rows.jsonl --demos my_demos.jsonl
    from agentlab.demos import load_demos
    rows = load_demos(spec, "my_demos.jsonl")       # ready for run_sft

A row is ``{"messages": [...]}`` (``tools`` may be given; the environment's own are used): a user message with
the task, then assistant messages with ``tool_calls`` (``{"type": "function", "function": {"name", "arguments"}}``,
arguments as an object or a JSON string) and ``tool`` messages with the results — ground-truth calls, logged
traces, a stronger model's transcripts. A system message in the row is replaced by the environment's system prompt
(the one the loop shows, which a user need not know), and the tools are rendered from the environment's methods in
TRL's order, so SFT trains on exactly the text the policy will see. A call to a tool the environment lacks, or with
an argument its tool does not take, is refused naming the file and line: nothing is trained on a guess.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

from agentlab.synth import tool_schemas
from agentlab.types import EnvSpec, tool_names


def _calls(message: dict, where: str) -> list[tuple[str, dict]]:
    out = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError(f"{where}: a tool call needs a function name, got {str(call)[:80]!r}")  # noqa: TRY004 (bad input: the CLI's one line)
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args or "{}")
            except json.JSONDecodeError:
                raise ValueError(f"{where}: arguments of {fn['name']!r} are not JSON: {args[:80]!r}") from None
        if not isinstance(args, dict):
            raise ValueError(  # noqa: TRY004 (bad input, reported as the CLI's one line)
                f"{where}: arguments of {fn['name']!r} must be an object, got {type(args).__name__}")
        out.append((fn["name"], args))
    return out


def check_row(spec: EnvSpec, row: dict, where: str) -> list[dict]:
    """The row's messages as the loop renders them (the environment's system prompt, normalised tool calls), or a
    ``ValueError`` naming ``where`` (``file:line``) and what is wrong."""
    messages = row.get("messages") if isinstance(row, dict) else None
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: expected an object with a non-empty 'messages' list")
    tools = set(tool_names(spec.env_class))
    out = [{"role": "system", "content": spec.env_class.system_prompt}]
    for message in messages:
        role = message.get("role") if isinstance(message, dict) else None
        if role == "system":
            continue
        if role not in ("user", "assistant", "tool"):
            raise ValueError(f"{where}: unknown message role {role!r}; expected user, assistant or tool")
        if role != "assistant" or not message.get("tool_calls"):
            out.append({k: v for k, v in message.items() if k in ("role", "content", "name")})
            continue
        calls = []
        for name, args in _calls(message, where):
            if name not in tools:
                raise ValueError(f"{where}: unknown tool {name!r}; {spec.name}'s tools: {', '.join(sorted(tools))}")
            params = inspect.signature(getattr(spec.env_class, name)).parameters
            unknown = sorted(set(args) - set(params) - {"self"})
            if unknown:
                raise ValueError(f"{where}: {name} takes no argument {', '.join(map(repr, unknown))}; its "
                                 f"arguments: {', '.join(p for p in params if p != 'self')}")
            calls.append({"type": "function", "function": {"name": name, "arguments": args}})
        out.append({"role": "assistant", "content": message.get("content") or "", "tool_calls": calls})
    if out[1:2] and out[1]["role"] != "user":
        raise ValueError(f"{where}: the first message after the system prompt must be the user's task")
    if not any(m.get("tool_calls") for m in out):
        raise ValueError(f"{where}: no assistant tool call to learn from")
    return out


def load_demos(spec: EnvSpec, path: str | Path) -> list[dict]:
    """Every row of ``path`` checked and rendered for ``spec`` (``expert_demos``' row shape, ready for ``run_sft``)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"demonstrations file {path} does not exist")
    tools = json.dumps(tool_schemas(spec.env_class))
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
        rows.append({"messages": check_row(spec, row, f"{path}:{number}"), "tools": tools,
                     "task_id": f"{path.name}:{number}"})
    if not rows:
        raise ValueError(f"{path}: no demonstrations in it")
    return rows


def replay(spec: EnvSpec, tasks: list, calls="calls", final: str = "") -> tuple[list[dict], list[dict]]:
    """Demonstrations from ground-truth calls a benchmark ships: each task's calls played through the environment.

    ``calls``: the row column holding them (a TRL-style class's row is ``task.answer``), or a function
    ``task -> calls``; a call is ``{"name", "arguments"}`` or TRL's ``{"type": "function", "function": {...}}``.
    Each list is played in order on a fresh environment (tool results come from the environment, never from the
    file) and kept only when the environment's verifier calls the episode a success. Returns ``(rows, failures)``:
    the rows are ``load_demos``' shape; every task not kept is a failure ``{"task_id", "why"}`` (no calls, an
    unknown tool or argument, a tool's error, a verifier's no), never dropped silently. Where the environment has
    no final tool (TRL-style classes end when the model stops calling tools), the conversation ends with an
    assistant message ``final``, so SFT also teaches the policy to stop.
    """
    from agentlab.synth import conversation
    from agentlab.types import ToolCall, prompt_messages, run_policy

    tools, kept, failures = json.dumps(tool_schemas(spec.env_class)), [], []
    for task in tasks:
        where = f"task {task.id}"
        try:
            listed = calls(task) if callable(calls) else task.answer.get(calls)
            if not listed:
                raise ValueError(f"{where}: no calls to replay" + ("" if callable(calls) else f" in column {calls!r}"))
            checked = check_row(spec, {"messages": [{"role": "user", "content": task.question},
                                                    {"role": "assistant", "tool_calls": list(listed)}]}, where)
        except ValueError as exc:
            failures.append({"task_id": task.id, "why": str(exc)})
            continue
        env = spec.make_env()
        env.reset(task=task.to_json())
        prompt = [{"role": "system", "content": spec.env_class.system_prompt},
                  *(env._prompt_messages() or prompt_messages(spec.env_class, task)[1:])]
        errors: list[str] = []

        def shipped(_task, env=env, calls=checked[-1]["tool_calls"], errors=errors):
            for c in calls:  # each call's result comes back from the environment; a failed one is noted
                before = env.outcome.tool_errors
                result = yield ToolCall(c["function"]["name"], c["function"]["arguments"])
                if env.outcome.tool_errors > before:
                    errors.append(f"{c['function']['name']}: {result[:120]}")

        outcome, history = run_policy(spec, task, shipped, max_calls=len(checked[-1]["tool_calls"]), env=env)
        messages = conversation(spec, [m for m in prompt if m["role"] != "system" or m["content"]], history)
        if not spec.env_class.final_tool:
            messages.append({"role": "assistant", "content": final})
        verdict = spec.evaluate(task, outcome)
        if errors or verdict["success"] < 1.0:
            why = f"tool error ({errors[0]})" if errors else f"the verifier says no (success {verdict['success']:g})"
            failures.append({"task_id": task.id, "why": f"{where}: {why}"})
            continue
        kept.append({"messages": messages, "tools": tools, "task_id": task.id})
    return kept, failures
