"""The torch engine: transformers' ``generate``, batched, the episodes' shared prefix encoded once.

    from agentlab.engines.torch import hf_generate_fn
    generate = hf_generate_fn(model, tok, LoopConfig(), greedy=True, seed=0)
"""

from __future__ import annotations

from agentlab.engines.base import GenerateFn, common_prefix
from agentlab.trl_compat import cache_of, decode_cache, gqa_prefill


def hf_generate_fn(model, tokenizer, config, greedy: bool, seed: int,
                   prefix_cache: bool = True, levers: bool = True) -> GenerateFn:
    """Batched ``model.generate``; each sequence is cut after its first EOS.

    Prefix caching (why): every episode starts with the same system prompt and tool schemas (~370 of the ~400 prompt
    tokens on ``lookup``), and without a cache every turn re-encodes the whole conversation. We encode the batch's
    longest common prefix once, then lay rows out as ``prefix | pads | rest`` — the attention mask hides the pads
    and position ids come from the mask, so each row computes exactly what it would alone (``tests/test_rollout.py``
    compares against uncached generation). Weights must not change meanwhile: ``run_episodes`` makes one per call.

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
    if levers:
        _fold_lm_head_input(model)
        gqa_prefill(model)
    else:
        _stock_decoding(model)
    calls = [0]
    cached: dict = {}

    def encode_prefix(prefix: tuple[int, ...]):
        if cached.get("key") != prefix:
            with torch.no_grad():
                out = model(input_ids=torch.tensor([prefix]), use_cache=True, logits_to_keep=1)
            cached.update(key=prefix, cache=cache_of(out))
        return cached["cache"]

    def generate(seqs: list[list[int]]) -> list[list[int]]:
        pad = tokenizer.pad_token_id
        shared = common_prefix(seqs) if prefix_cache and seqs else 0
        rests = [s[shared:] for s in seqs]
        width = max(map(len, rests))
        ids = torch.tensor([seqs[0][:shared] + [pad] * (width - len(r)) + r for r in rests])
        attn = torch.tensor([[1] * shared + [0] * (width - len(r)) + [1] * len(r) for r in rests])
        kwargs = {}
        prefix = encode_prefix(tuple(seqs[0][:shared])) if shared else None
        past = decode_cache(prefix, len(seqs), shared + width + config.max_new_tokens) if levers else None
        if past is None and prefix is not None:  # the couplings are off: repeat a copy of the prefix's cache
            past = copy.deepcopy(prefix)
            past.batch_repeat_interleave(len(seqs))
        if past is not None:
            kwargs["cache"] = past
        torch.manual_seed(seed * 1_000_003 + calls[0])  # reproducible from the seed, different per call
        calls[0] += 1
        sampling = {"do_sample": False} if greedy or config.temperature == 0 else {
            "do_sample": True, "temperature": config.temperature, "top_p": config.top_p, "top_k": 0}
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=config.max_new_tokens,
                                 pad_token_id=pad, eos_token_id=tokenizer.eos_token_id, **sampling, **kwargs)
        result = []
        for row in out[:, ids.shape[1]:].tolist():
            if tokenizer.eos_token_id in row:
                row = row[: row.index(tokenizer.eos_token_id) + 1]
            result.append(row)
        return result

    return generate


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
