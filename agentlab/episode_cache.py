"""Each live episode's KV cache kept from one turn to the next, so a turn encodes only its new tokens.

Why: ``run_episodes`` calls the generate function once per turn with every live episode's *whole* token sequence
(prompt, earlier turns, tool results). Prefix caching alone (``rollout.hf_generate_fn``) shares only the system
prompt, so a fifth turn re-encodes four turns of conversation for every row, every turn. Here the cache a row
ended a turn with is cut out of the batch's cache and kept under the tokens it covers; the next turn's row, which
starts with those tokens, resumes from it and encodes only the last generated token and the tool result.

Layout of a batch resumed from kept caches (``C`` the longest kept length, ``R`` the longest new part)::

    row b:  [pads (C - c_b)] [kept c_b tokens] [pads (R - r_b)] [new r_b tokens]  -> generate

pads are hidden by the attention mask and position ids come from the mask (as in ``hf_generate_fn``), so each
row attends to what it would alone. ``tests/test_rollout.py`` checks greedy tokens against uncached generation.

The cache's internals are read and built through ``trl_compat.cache_states`` / ``cache_from_states``; a cache
of another kind (sliding windows, quantised, static) is not kept, and generation runs exactly as without this.
"""

from __future__ import annotations

from agentlab.trl_compat import cache_from_states, cache_states


class EpisodeCache:
    """Kept per-row KV states, keyed by the token sequence they cover; entries live one generate call."""

    def __init__(self):
        self.kept: dict[tuple[int, ...], list[tuple]] = {}  # tokens -> [(keys, values) per layer], one row each
        self.template = None  # a cache object of the model's kind, copied to build a batch's cache

    def find(self, seq: list[int]) -> tuple[int, ...] | None:
        """The longest kept token sequence that ``seq`` starts with and extends by at least one token."""
        for n in sorted({len(k) for k in self.kept}, reverse=True):
            if n < len(seq):
                key = tuple(seq[:n])
                if key in self.kept:
                    return key
        return None

    def batch(self, seqs: list[list[int]], prefix_len: int, prefix_cache, pad: int):
        """``(ids, attention_mask, cache, kept_lengths)`` for ``seqs``, each row resumed from its kept states or
        else from the shared prefix's cache (``prefix_len`` tokens; ``None`` when every row has kept states)."""
        import torch

        found = [self.find(s) for s in seqs]
        layers_of = [self.kept[key] if key is not None else cache_states(prefix_cache) for key in found]
        kept = [len(k) if k is not None else prefix_len for k in found]
        C = max(kept)
        rests = [s[c:] for s, c in zip(seqs, kept, strict=True)]
        R = max(map(len, rests))
        ids = torch.full((len(seqs), C + R), pad, dtype=torch.long)
        attn = torch.zeros((len(seqs), C + R), dtype=torch.long)
        for b, (s, c, rest) in enumerate(zip(seqs, kept, rests, strict=True)):
            ids[b, C - c:C] = torch.tensor(s[:c])
            attn[b, C - c:C] = 1
            ids[b, C + R - len(rest):] = torch.tensor(rest)
            attn[b, C + R - len(rest):] = 1
        states = []
        for i in range(len(layers_of[0])):
            k0, v0 = layers_of[0][i]
            keys = k0.new_zeros((len(seqs), k0.size(1), C, k0.size(3)))
            values = v0.new_zeros((len(seqs), v0.size(1), C, v0.size(3)))
            for b, c in enumerate(kept):
                keys[b, :, C - c:] = layers_of[b][i][0][0]
                values[b, :, C - c:] = layers_of[b][i][1][0]
            states.append((keys, values))
        cache = cache_from_states(self.template, states)
        return ids, attn, cache, kept

    def keep(self, seqs: list[list[int]], new: list[list[int]], cache, attn_width: int, kept: list[int],
             rest_width: int) -> None:
        """After a generate call: cut each row's states out of the batch's final ``cache`` and keep them under the
        tokens they cover (the row's sequence and its generated tokens but the last, which was never fed back).
        Entries not resumed by this call (their episodes finished) are dropped."""
        import torch

        self.kept = {}
        states = cache_states(cache)
        if states is None:
            return
        self.template = cache_from_states(cache, [(None, None)] * len(states))  # the kind, not the batch's states
        C = attn_width - rest_width
        for b, (seq, gen) in enumerate(zip(seqs, new, strict=True)):
            if not gen:
                continue
            c, r = kept[b], len(seq) - kept[b]
            columns = torch.cat([torch.arange(C - c, C), torch.arange(attn_width - r, attn_width),
                                 torch.arange(attn_width, attn_width + len(gen) - 1)])
            self.kept[tuple(seq + gen[:-1])] = [(k[b:b + 1, :, columns].clone(), v[b:b + 1, :, columns].clone())
                                                for k, v in states]
