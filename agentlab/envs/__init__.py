"""Environment registry: ``load(name)`` returns the :class:`~agentlab.types.EnvSpec` of an environment.

    >>> from agentlab.envs import load, names
    >>> "lookup" in names()
    True
"""

from __future__ import annotations

import importlib

from agentlab.types import EnvSpec

_MODULES = {
    "lookup": "agentlab.envs.lookup",
    "code_search": "agentlab.envs.code_search",
    "doc_search": "agentlab.envs.doc_search",
    "product_finder": "agentlab.envs.product_finder",
}


def names() -> list[str]:
    return list(_MODULES)


def load(name: str) -> EnvSpec:
    """The spec of environment ``name`` (imported on first use)."""
    if name not in _MODULES:
        raise ValueError(f"unknown environment {name!r}; expected one of {names()}")
    return importlib.import_module(_MODULES[name]).SPEC
