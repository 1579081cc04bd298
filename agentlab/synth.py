"""Task synthesis helpers: split audits (and, with the training issue, dataset building and expert demos).

    >>> from agentlab.envs import load
    >>> spec = load("lookup")
    >>> splits = {s: spec.make_tasks(s, 20, seed=0) for s in ("train", "test")}
    >>> audit_splits(spec, splits)["ok"]
    True
"""

from __future__ import annotations

from itertools import combinations

from agentlab.types import EnvSpec, Task


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
