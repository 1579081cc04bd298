"""Config fields from command-line text: one rule for the flags of ``agentlab compare``, ``sweep`` and ``train``.

A field's values have its default's type; a field whose default is ``None`` (a budget that means "the environment's")
takes ``int``; a tuple field, or a swept field, takes comma-separated values. A value that does not parse is named
with its flag in one line.

    >>> from agentlab.experiment import Experiment
    >>> typed_fields(Experiment, {"lr": "1e-3", "max_turns": "4", "env": None})
    {'lr': 0.001, 'max_turns': 4}
    >>> typed_values({"sft_lrs": (3e-4,), "seed": 0}, {"sft_lrs": "1e-3,2e-3", "seed": "1"})
    {'sft_lrs': (0.001, 0.002), 'seed': 1}
    >>> parse_value("lr", "1e-4,fast", float, many=True)
    Traceback (most recent call last):
    ValueError: --lr '1e-4,fast': expected comma-separated float values
"""

from __future__ import annotations

import dataclasses


def default_type(default) -> type:
    """The type of a config field's values from its default (``int`` for a budget field whose default, None,
    means the environment's; a tuple's items' type)."""
    default = default[0] if isinstance(default, tuple) else default
    return int if default is None else type(default)


def field_type(f: dataclasses.Field) -> type:
    return default_type(f.default)


def flag_type(default):
    """What argparse parses a config field's flag with, from the field's default: its type; true/false for a switch."""
    return _parser(default_type(default))


def _parser(kind: type):
    """The function that reads one ``kind`` value from text: ``kind`` itself, except for a switch."""
    return _boolean if kind is bool else kind


_BOOLS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}


def _boolean(raw: str) -> bool:
    """A switch's value from text (``bool("false")`` is ``True``, so not ``bool``)."""
    try:
        return _BOOLS[str(raw).strip().lower()]
    except KeyError:
        raise ValueError(raw) from None


_boolean.__name__ = "bool (true/false)"


def parse_value(name: str, raw: str, kind: type, many: bool = False):
    """``raw`` as one ``kind`` value or, with ``many``, a tuple of its comma-separated values.

    >>> parse_value("skip_zero_signal", "false", bool), parse_value("skip_zero_signal", "True", bool)
    (False, True)
    >>> parse_value("skip_zero_signal", "maybe", bool)
    Traceback (most recent call last):
    ValueError: --skip-zero-signal 'maybe': expected bool (true/false) values
    """
    kind = _parser(kind)
    try:
        return tuple(kind(v) for v in str(raw).split(",") if v.strip()) if many else kind(raw)
    except ValueError:
        raise ValueError(f"--{name.replace('_', '-')} {raw!r}: expected {'comma-separated ' if many else ''}"
                         f"{kind.__name__} values") from None


def typed_values(defaults: dict, given: dict[str, str | None]) -> dict:
    """The fields named in ``defaults`` (name -> default) that ``given`` holds as text (``None``: not given), each
    parsed to its default's type."""
    return {name: parse_value(name, given[name], default_type(d), many=isinstance(d, tuple))
            for name, d in defaults.items() if given.get(name) is not None}


def typed_fields(cls, given: dict[str, str | None]) -> dict:
    """The fields of dataclass ``cls`` that ``given`` holds as text, each parsed."""
    return typed_values({f.name: f.default for f in dataclasses.fields(cls)}, given)
