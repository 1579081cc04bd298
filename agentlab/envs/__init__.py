"""Environment registry: ``load(ref)`` returns the :class:`~agentlab.types.EnvSpec` of an environment.

An environment is found, in this order, as:

* a name given to :func:`register` (a notebook cell, a script);
* a shipped environment (``lookup``, ``code_search``, ``doc_search``, ``product_finder``);
* a name in the ``agentlab.envs`` entry-point group of an installed package
  (``[project.entry-points."agentlab.envs"] my_env = "my_pkg.env:SPEC"``);
* ``path/to/file.py:NAME`` or ``package.module:NAME`` — any command's ``--env`` takes these, so an environment
  written in one file outside the package needs no edit to it. ``NAME`` is an ``EnvSpec``, or a TRL-style class
  given with its dataset rows (``--tasks rows.jsonl``; :mod:`agentlab.trl_env`).

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
ENTRY_POINT_GROUP = "agentlab.envs"
_REGISTERED: dict[str, EnvSpec] = {}
_BY_REF: dict[str, object] = {}


def register(spec: EnvSpec) -> EnvSpec:
    """Make ``spec`` loadable by its name (``load(spec.name)``, ``Experiment(env=spec.name)``); returns it.

    Re-registering the same name replaces the earlier spec (re-running a notebook cell); a shipped name cannot be
    taken.
    """
    if not isinstance(spec, EnvSpec):
        raise TypeError(f"register() takes an EnvSpec, got {type(spec).__name__}")
    if spec.name in _MODULES:
        raise ValueError(f"{spec.name!r} is a shipped environment; give yours another name")
    _REGISTERED[spec.name] = spec
    return spec


def default_reward(ref: str):
    """The reward an environment trains on unless a config says otherwise (its ``EnvSpec.default_reward``, kept in
    the environment's own file).

    >>> default_reward("lookup").terms
    {'success': 1.0}
    """
    return load(ref).default_reward


def _entry_points() -> dict:
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def names() -> list[str]:
    """Every environment ``load`` finds by name: registered, shipped, and installed packages' entry points."""
    return list(dict.fromkeys([*_REGISTERED, *_MODULES, *_entry_points()]))


def load(ref: str) -> EnvSpec:
    """The spec of environment ``ref``: a name (see the module docstring), ``file.py:NAME`` or ``module:NAME``."""
    if ref in _REGISTERED:
        return _REGISTERED[ref]
    if ref in _MODULES:
        return importlib.import_module(_MODULES[ref]).SPEC
    if ":" in ref:
        return register(_as_spec(_import_ref(ref), ref))
    found = _entry_points().get(ref)
    if found is not None:
        return register(_as_spec(found.load(), f"entry point {ref!r} ({found.value})"))
    raise ValueError(f"unknown environment {ref!r}; expected one of {names()}, or path/to/file.py:NAME or "
                     f"package.module:NAME")


def _import_ref(ref: str):
    from agentlab.refs import import_object

    if ref not in _BY_REF:  # a file is executed once per process: its classes stay the same objects
        _BY_REF[ref] = import_object(ref)
    return _BY_REF[ref]


def _as_spec(obj, where: str) -> EnvSpec:
    if isinstance(obj, EnvSpec):
        return obj
    import inspect

    from agentlab.types import ToolEnv

    if inspect.isclass(obj) and callable(getattr(obj, "reset", None)) and not issubclass(obj, ToolEnv):  # TRL-style
        raise ValueError(f"{where} is a TRL-style class: give its task rows too (--tasks rows.jsonl, each row the "
                         f"keyword arguments of reset; or agentlab.trl_env.spec_from_class(cls, rows))")
    raise ValueError(f"{where} is a {type(obj).__name__}, not an EnvSpec; build one with agentlab.types.EnvSpec "
                     f"(tools on a ToolEnv subclass, make_tasks, evaluate, default_reward, expert, random_policy, "
                     f"audit_keys)")
