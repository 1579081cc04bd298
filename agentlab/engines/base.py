"""What every decoding engine shares: the ``GenerateFn`` shape, the engine kinds, the shared-prefix rule.

    >>> common_prefix([[1, 2, 3, 4], [1, 2, 5]])
    2
"""

from __future__ import annotations

from collections.abc import Callable

GenerateFn = Callable[[list[list[int]]], list[list[int]]]

KINDS = ("torch", "llama_cpp")
BACKENDS = (*KINDS, "auto")  # what a config may name: "auto" is the engine measured fastest here (engines.choice)


class Sampled(list):
    """One row's new tokens, with the log-probability the engine drew each with (``.logprobs``), for engines that
    report them (vLLM): the behaviour policy's log-probs, which TRL's importance-sampling correction needs."""

    def __init__(self, ids, logprobs):
        super().__init__(ids)
        self.logprobs = list(logprobs)
        if len(self.logprobs) != len(self):
            raise ValueError(f"{len(self)} tokens but {len(self.logprobs)} log-probs")


def common_prefix(seqs: list[list[int]]) -> int:
    """Leading tokens all ``seqs`` share, each row keeping one of its own (both engines encode them once)."""
    n = min(map(len, seqs)) - 1
    return next((i for i in range(n) if any(s[i] != seqs[0][i] for s in seqs)), max(n, 0))
