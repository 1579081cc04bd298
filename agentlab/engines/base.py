"""What every decoding engine shares: the ``GenerateFn`` shape, the engine kinds, the shared-prefix rule.

    >>> common_prefix([[1, 2, 3, 4], [1, 2, 5]])
    2
"""

from __future__ import annotations

from collections.abc import Callable

GenerateFn = Callable[[list[list[int]]], list[list[int]]]

KINDS = ("torch", "llama_cpp")


def common_prefix(seqs: list[list[int]]) -> int:
    """Leading tokens all ``seqs`` share, each row keeping one of its own (both engines encode them once)."""
    n = min(map(len, seqs)) - 1
    return next((i for i in range(n) if any(s[i] != seqs[0][i] for s in seqs)), max(n, 0))
