"""Decoding engines: what turns the live episodes' token sequences into each one's next tokens.

    from agentlab.engines import make
    generate = make("torch", model, tok, config, greedy=True, seed=0)   # or "llama_cpp"
    new_tokens = generate([prompt_ids_1, prompt_ids_2])

A ``GenerateFn`` maps token sequences (one per live episode) to the new tokens of each; ``rollout.run_episodes``
calls one per turn and takes any (``generate_fn=``): the torch engine (:mod:`agentlab.engines.torch`, transformers'
``generate`` with a shared-prefix cache), llama.cpp (:mod:`agentlab.engines.llamacpp`, the CPU rollout engine), vLLM on GPUs
(:mod:`agentlab.engines.vllm`) and a scripted policy replayed as tokens (:mod:`agentlab.engines.scripted`, for
tests and demonstrations). An engine must follow weight updates and state its agreement with the torch path.
"""

from __future__ import annotations

from agentlab.engines.base import BACKENDS, KINDS, GenerateFn, Sampled, common_prefix

__all__ = ["BACKENDS", "KINDS", "GenerateFn", "Sampled", "common_prefix", "make"]


def make(kind: str, model, tokenizer, config, greedy: bool, seed: int, logprobs: bool = False) -> GenerateFn:
    """The ``kind`` engine (``KINDS``, or ``"auto"``: :func:`agentlab.engines.choice.choose`) decoding ``model``'s
    current weights under ``config`` (a ``LoopConfig`` with its budget resolved: ``LoopConfig.of(spec)``).
    ``logprobs``: sampled rows carry the behaviour log-probability of each token (``Sampled``)."""
    unset = [name for name in ("max_new_tokens", "max_context") if getattr(config, name) is None]
    if unset:
        raise ValueError(f"the loop's {' and '.join(unset)} are unset: an engine decodes within a budget; pass "
                         f"LoopConfig.of(spec) or config.resolved(spec) (run_episodes resolves its own)")
    if kind == "auto":
        from agentlab.engines.choice import choose

        kind = choose(config.precision)["engine"]
    if kind == "torch":
        from agentlab.engines.torch import hf_generate_fn

        return hf_generate_fn(model, tokenizer, config, greedy, seed, logprobs=logprobs)
    if kind == "llama_cpp":
        from agentlab.engines.llamacpp import generate_fn

        return generate_fn(model, tokenizer, config, greedy, seed, logprobs=logprobs)
    raise ValueError(f"unknown engine {kind!r}; expected one of {KINDS}")
