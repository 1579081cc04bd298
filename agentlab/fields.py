"""Config fields from command-line text: one rule for the flags of ``agentlab compare``, ``sweep`` and ``train``.

A field's values have its default's type; a field whose default is ``None`` (a budget that means "the environment's")
takes ``int``; a tuple field, or a swept field, takes comma-separated values. A value that does not parse is named
with its flag in one line.

    >>> from agentlab.compare import CompareConfig
    >>> typed_fields(CompareConfig, {"sft_lrs": "1e-3,2e-3", "seed": "1", "env": None})
    {'seed': 1, 'sft_lrs': (0.001, 0.002)}
    >>> parse_value("lr", "1e-4,fast", float, many=True)
    Traceback (most recent call last):
    ValueError: --lr '1e-4,fast': expected comma-separated float values
"""

from __future__ import annotations

import dataclasses


def field_type(f: dataclasses.Field) -> type:
    """The type of a config field's values (``int`` for a budget field whose default, None, means the env's)."""
    default = f.default[0] if isinstance(f.default, tuple) else f.default
    return int if default is None else type(default)


def parse_value(name: str, raw: str, kind: type, many: bool = False):
    """``raw`` as one ``kind`` value or, with ``many``, a tuple of its comma-separated values."""
    try:
        return tuple(kind(v) for v in str(raw).split(",") if v.strip()) if many else kind(raw)
    except ValueError:
        raise ValueError(f"--{name.replace('_', '-')} {raw!r}: expected {'comma-separated ' if many else ''}"
                         f"{kind.__name__} values") from None


def typed_fields(cls, given: dict[str, str | None]) -> dict:
    """The fields of dataclass ``cls`` that ``given`` holds as text (``None``: not given), each parsed."""
    return {f.name: parse_value(f.name, given[f.name], field_type(f), many=isinstance(f.default, tuple))
            for f in dataclasses.fields(cls) if given.get(f.name) is not None}
