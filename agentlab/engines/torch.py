"""The torch engine: transformers' ``generate``, batched, the episodes' shared prefix encoded once.

    from agentlab.engines.torch import hf_generate_fn
    generate = hf_generate_fn(model, tok, LoopConfig.of(spec), greedy=True, seed=0)
"""

from __future__ import annotations

from agentlab.engines.base import GenerateFn, Sampled, common_prefix
from agentlab.trl_compat import cache_of, decode_cache, gqa_prefill, row_cache


def hf_generate_fn(model, tokenizer, config, greedy: bool, seed: int,
                   prefix_cache: bool = True, levers: bool = True, reuse_rows: bool = True,
                   logprobs: bool = False) -> GenerateFn:
    """Batched ``model.generate``; each sequence is cut after its first EOS.

    Prefix caching (why): every episode starts with the same system prompt and tool schemas (~370 of the ~400 prompt
    tokens on ``lookup``), and without a cache every turn re-encodes the whole conversation. We encode the batch's
    longest common prefix once, then lay rows out as ``prefix | pads | rest`` — the attention mask hides the pads
    and position ids come from the mask, so each row computes exactly what it would alone (``tests/test_rollout.py``
    compares against uncached generation). Weights must not change meanwhile: ``run_episodes`` makes one per call.

    Rows reused across turns (why): a live episode's sequence at its next turn is its last one plus the tokens it
    generated and the tool's reply, yet ``generate`` would prefill all of it again. On ``doc_search`` (tool replies
    of ~500 tokens, contexts to 4,096) prefill was 63% of an evaluation's decoding time (profiled, 8 validation
    episodes of the SFT start, AVX-512 EPYC). So each row's keys and values are kept after a call, under the tokens
    they encode, and a later row that extends those tokens starts from them (``trl_compat.row_cache``: each row's
    own cache right-aligned, pads before it and before its new tokens, all masked); only its new tokens are
    prefilled. Rows kept are the last call's only (an episode that ended drops out). A generated token's keys then
    come from its decoding step rather than from a prefill: the same function, another float order, so a greedy
    near-tie can go the other way (``tests/test_rollout.py`` compares with uncached decoding). Measured
    (``benchmarks/eval_throughput.py --env doc_search``, 32 episodes, alternating): 183.5 → 126.5 s, 31 of 32
    episodes identical.
    ``generate.stats`` counts rows and tokens reused; ``reuse_rows=False`` prefills every row whole each call.

    ``logprobs=True`` (sampling only): each row comes back as :class:`~agentlab.engines.base.Sampled`, with the
    log-probability each token was drawn with at ``config.temperature`` (the behaviour policy's, which an
    asynchronous trainer corrects its update with: ``agentlab.async_rollouts``).

    Precision: ``config.precision`` "auto" decodes with a bf16 copy of the weights (LoRA merged in) on CPUs with
    bf16 hardware (``agentlab.engines.weights.for_generation``), fp32 ``model`` itself elsewhere.

    ``levers=False`` decodes as transformers does on its own (its growing cache, the LM head on a strided input, SDPA
    copying the key/value heads in a padded prefill): the reference ``benchmarks/eval_throughput.py`` measures
    the levers (``decode_cache``, ``_fold_lm_head_input``, ``gqa_prefill``) against, on the same model.
    """
    import copy

    import torch

    from agentlab.engines.weights import for_generation

    model = for_generation(model, config.precision)
    device = next(model.parameters()).device  # inputs go where the weights are (a CUDA model on a GPU)
    if levers:
        _fold_lm_head_input(model)
        gqa_prefill(model)
    else:
        _stock_decoding(model)
    calls = [0]
    cached: dict = {}
    keep_rows = prefix_cache and levers and reuse_rows  # the reuse rides on the preallocated cache's buffers
    kept: list[tuple[list[int], list]] = []  # the last call's rows: (tokens, each layer's (keys, values))
    stats = {"calls": 0, "rows": 0, "rows_reused": 0, "tokens_reused": 0, "tokens_prefilled": 0}

    def encode_prefix(prefix: tuple[int, ...]):
        if cached.get("key") != prefix:
            with torch.no_grad():
                out = model(input_ids=torch.tensor([prefix], device=device), use_cache=True, logits_to_keep=1)
            cached.update(key=prefix, cache=cache_of(out))
        return cached["cache"]

    def reusable(seqs: list[list[int]], shared: int) -> list:
        """Each row's kept ``(tokens, layers)`` that it extends by at least one token and that holds more than the
        shared prefix, else ``None``."""
        return [next((k for k in kept if shared < len(k[0]) < len(s) and s[:len(k[0])] == k[0]), None)
                for s in seqs]

    def generate(seqs: list[list[int]]) -> list[list[int]]:
        pad = tokenizer.pad_token_id
        shared = common_prefix(seqs) if prefix_cache and seqs else 0
        hits = reusable(seqs, shared)
        prefix = encode_prefix(tuple(seqs[0][:shared])) if shared else None
        own = [len(h[0]) if h else shared for h in hits]  # positions each row starts with in the cache
        width_cached, rests = max(own), [s[n:] for s, n in zip(seqs, own, strict=True)]
        width = max(map(len, rests))
        ids = torch.tensor([[pad] * (width_cached - n) + s[:n] + [pad] * (width - len(r)) + r
                            for s, n, r in zip(seqs, own, rests, strict=True)], device=device)
        attn = torch.tensor([[0] * (width_cached - n) + [1] * n + [0] * (width - len(r)) + [1] * len(r)
                             for n, r in zip(own, rests, strict=True)], device=device)
        capacity = width_cached + width + config.max_new_tokens
        kwargs = {}
        if any(hits):
            prefix_layers = [(layer.keys[0], layer.values[0]) for layer in prefix.layers] if prefix else None
            past = row_cache([h[1] if h else prefix_layers for h in hits], width_cached, capacity)
            kept.clear()
        else:
            past = decode_cache(prefix, len(seqs), capacity) if levers else None
        if past is None and prefix is not None:  # the couplings are off: repeat a copy of the prefix's cache
            past = copy.deepcopy(prefix)
            past.batch_repeat_interleave(len(seqs))
        if past is not None:
            kwargs["cache"] = past
        stats["calls"] += 1
        stats["rows"] += len(seqs)
        stats["rows_reused"] += sum(h is not None for h in hits)
        stats["tokens_reused"] += sum(n for n, h in zip(own, hits, strict=True) if h)
        stats["tokens_prefilled"] += sum(map(len, rests))
        del hits  # the kept tensors the cache was filled from: not held twice while decoding
        torch.manual_seed(seed * 1_000_003 + calls[0])  # reproducible from the seed, different per call
        calls[0] += 1
        sampling = {"do_sample": False} if greedy or config.temperature == 0 else {
            "do_sample": True, "temperature": config.temperature, "top_p": config.top_p, "top_k": 0}
        scored = logprobs and sampling["do_sample"]
        if scored:  # the processed scores are the logits at the sampling temperature (top_p 1, top_k 0: no cut)
            kwargs.update(output_scores=True, return_dict_in_generate=True)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=config.max_new_tokens,
                                 pad_token_id=pad, eos_token_id=tokenizer.eos_token_id, **sampling, **kwargs)
        drawn = None
        if scored:
            new = out.sequences[:, ids.shape[1]:]
            drawn = torch.stack([torch.log_softmax(s.float(), -1).gather(1, new[:, k:k + 1]).squeeze(1)
                                 for k, s in enumerate(out.scores)], 1).tolist()
            out = out.sequences
        result = []
        for i, row in enumerate(out[:, ids.shape[1]:].tolist()):
            if tokenizer.eos_token_id in row:
                row = row[: row.index(tokenizer.eos_token_id) + 1]
            result.append(Sampled(row, drawn[i][: len(row)]) if drawn is not None else row)
        if keep_rows and past is not None and hasattr(past.layers[0], "k_buf"):
            kept[:] = [_row_of(past, i, s, n, width_cached, len(r), width_cached + width, row)
                       for i, (s, n, r, row) in enumerate(zip(seqs, own, rests, result, strict=True))]
        return result

    generate.stats = stats
    return generate


def _row_of(past, i: int, seq: list[int], cached: int, width_cached: int, rest: int, end: int, new: list[int]):
    """Row ``i``'s ``(tokens, layers)`` after a call: the ``cached`` positions it started with (right-aligned before
    ``width_cached``), its ``rest`` new positions (right-aligned before ``end``) and what it generated after them,
    less the last token (whose keys were never computed). Copies: the call's buffers are freed."""
    import torch

    generated = new[:-1]
    spans = (slice(width_cached - cached, width_cached), slice(end - rest, end + len(generated)))
    return seq + generated, [tuple(torch.cat([buf[i, :, span] for span in spans], -2)
                                   for buf in (layer.k_buf, layer.v_buf)) for layer in past.layers]


def _stock_decoding(model) -> None:
    """Undo the decoding levers on ``model``: the LM head's fold hook removed, transformers' SDPA attention back."""
    from agentlab.trl_compat import stock_attention

    head = model.get_output_embeddings()
    if getattr(head, "_agentlab_folds", None) is not None:
        head._agentlab_folds.remove()
        head._agentlab_folds = None
    stock_attention(model)


def _fold_lm_head_input(model) -> None:
    """Hand the LM head a contiguous input (once per model; a no-op where it already is).

    Why: ``generate``'s prefill keeps the last position only (``hidden[:, -1:, :]``, a strided view), and torch's
    matmul does not fold a strided 3-D input into one GEMM: it expands the head's weight per row and runs a batched
    GEMM — at an eval batch of 48 a 2.7 GB copy of the bf16 head, 4.2 s of a 13 s ``generate`` call (profiled),
    against 9 ms for the folded product. Logits may differ in the last bit (another GEMM order); on 200 greedy
    ``lookup`` episodes none changed (``benchmarks/eval_throughput.py``)."""
    head = model.get_output_embeddings()
    if head is not None and getattr(head, "_agentlab_folds", None) is None:  # the hook's handle, kept to undo it
        head._agentlab_folds = head.register_forward_pre_hook(lambda module, args: (args[0].contiguous(), *args[1:]))
