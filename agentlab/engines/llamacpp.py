"""llama.cpp as the CPU rollout engine: the policy's weights exported to GGUF, episodes decoded as one batch.

    config = LoopConfig(engine="llama_cpp")        # run_episodes decodes through llama.cpp
    run_episodes(model, tok, spec, tasks, config=config)

The CPU counterpart of the GPU path's vLLM engine: training stays in torch, sampling moves to an inference engine,
and the weights are synced into it whenever they changed (here: written to a GGUF file and loaded, ``export_gguf``).
Why by hand: llama-cpp-python's ``Llama`` class decodes one sequence at a time; batching many sequences, sharing
their system prompt and syncing weights per update need its low-level API (``llama_batch``, per-sequence KV
streams), which nothing in TRL or llama-cpp-python wraps. Needs ``pip install llama-cpp-python``
(``make setup-llamacpp`` builds it for this CPU).

Same weights, other arithmetic. The export is the policy ``for_generation`` decodes with (bf16 with the LoRA merged
in on a CPU with bf16 hardware, fp32 elsewhere), bit for bit; llama.cpp then multiplies in its own order, keeps
its KV cache in f16 and computes attention in fp32, so logits differ from torch's in low bits and a near-tie can
go the other way. ``benchmarks/eval_throughput.py`` counts the greedy episodes that come out identical to torch's;
``benchmarks/rollout_throughput.py`` measures the gap between the log-probs the sampler drew from and the ones the
trainer computes for the same tokens.
"""

from __future__ import annotations

import ctypes
import os
import tempfile
import weakref
from pathlib import Path

import numpy as np

from agentlab.engines.base import common_prefix
from agentlab.engines.gguf_export import export_gguf


def available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def system_info() -> str:
    """What this llama.cpp build uses on this CPU (``"AVX2 = 1 | AVX512 = 0 | …"``): builds differ per machine."""
    return _require().llama_print_system_info().decode()


def _require():
    try:
        import llama_cpp
    except ImportError as e:
        raise ImportError("LoopConfig(engine='llama_cpp') needs llama-cpp-python: run `make setup-llamacpp` "
                          "(or `pip install llama-cpp-python`)") from e
    return llama_cpp


class Engine:
    """One loaded GGUF and a context holding ``n_seq`` sequences of up to ``n_ctx_seq`` tokens each, every sequence
    in its own KV stream (``kv_unified=False``: a row attends over its own cells, not the whole cache)."""

    def __init__(self, gguf_path: str | Path, n_seq: int, n_ctx_seq: int, n_threads: int | None = None):
        L = _require()
        _quiet(L)
        self.L = L
        self.keep_streams = True  # a row keeps its stream across calls (_place)
        self.n_seq, self.n_ctx_seq = n_seq, n_ctx_seq
        mparams = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(str(gguf_path).encode(), mparams)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf_path}")
        cparams = L.llama_context_default_params()
        cparams.n_ctx = (n_seq + 1) * n_ctx_seq  # the rows, and one stream that keeps the shared prefix
        cparams.n_seq_max = n_seq + 1
        self.prefix_seq, self.prefix = n_seq, []
        cparams.n_batch = cparams.n_ubatch = 512
        threads = n_threads or _threads()
        cparams.n_threads = cparams.n_threads_batch = threads
        # One KV stream per row. A unified cache would store the shared prompt once (seq_cp only tags cells) but
        # every row's query then spans every row's cells: at 48 rows of lookup it measured 248 vs 294 ms a step,
        # on 4-turn product_finder episodes (~400 own positions a row) it would multiply attention by the rows.
        cparams.kv_unified = False
        cparams.no_perf = True
        self.ctx = L.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            L.llama_model_free(self.model)
            raise RuntimeError("llama.cpp could not create a context")
        self.mem = L.llama_get_memory(self.ctx)
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.n_batch = 512
        self.batch = L.llama_batch_init(self.n_batch, 0, 1)
        self.held: list[list[int]] = [[] for _ in range(n_seq)]  # the tokens each row's stream holds

    def close(self):
        if getattr(self, "ctx", None):
            self.L.llama_batch_free(self.batch)
            self.L.llama_free(self.ctx)
            self.L.llama_model_free(self.model)
            self.ctx = None

    def __del__(self):
        try:
            self.close()
        except TypeError:  # interpreter shutdown: the bindings are already gone, and so is the process
            pass

    def _decode(self, items: list[tuple[int, int, int, bool]]) -> np.ndarray:
        """Decode ``(token, pos, seq, want_logits)`` items, in chunks of ``n_batch``; the logits asked for, in order."""
        L, b = self.L, self.batch
        out = []
        for start in range(0, len(items), self.n_batch):
            chunk = items[start:start + self.n_batch]
            for i, (tok, pos, seq, logits) in enumerate(chunk):
                b.token[i] = tok
                b.pos[i] = pos
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = seq
                b.logits[i] = logits
            b.n_tokens = len(chunk)
            rc = L.llama_decode(self.ctx, b)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc} (a batch of {len(chunk)} tokens)")
            n_out = sum(1 for it in chunk if it[3])
            if n_out:
                ptr = L.llama_get_logits(self.ctx)
                out.append(np.ctypeslib.as_array(ptr, shape=(n_out, self.n_vocab)).copy())
        return np.concatenate(out) if out else np.zeros((0, self.n_vocab), np.float32)

    def generate(self, seqs: list[list[int]], max_new_tokens: int, eos: int, sample,
                 logprobs: list[list[float]] | None = None, temperature: float = 1.0) -> list[list[int]]:
        """New tokens for each sequence (cut after ``eos``, at most ``max_new_tokens``). ``sample(logits) -> ids``.
        ``logprobs``: a list to fill, per row, with each drawn token's log-probability at ``temperature`` (what the
        sampler drew from, for comparing with the trainer's).

        The rows' longest common prefix (the system prompt and tool schemas) lives in a stream of its own, encoded
        once and kept across calls (extended or cut back as the next call's common prefix differs, as the torch
        path's ``hf_generate_fn`` keeps its prefix cache); a row's stream starts as a copy of it, or keeps what
        it held of this row from the last call (``_place``), then each row's rest is encoded and the rows decode
        together."""
        if len(seqs) > self.n_seq:
            raise ValueError(f"{len(seqs)} sequences for a context of {self.n_seq}")
        longest = max(map(len, seqs)) + max_new_tokens
        if longest > self.n_ctx_seq:
            raise ValueError(f"a sequence needs {longest} positions; the engine holds {self.n_ctx_seq}")
        L = self.L
        first, shared = seqs[0], common_prefix(seqs)
        kept = 0
        while kept < min(shared, len(self.prefix)) and self.prefix[kept] == first[kept]:
            kept += 1
        L.llama_memory_seq_rm(self.mem, self.prefix_seq, kept, -1)
        self._decode([(t, kept + p, self.prefix_seq, False) for p, t in enumerate(first[kept:shared])])
        self.prefix = first[:shared]
        streams, starts = self._place(seqs, shared)
        items = []
        for s, i, start in zip(seqs, streams, starts, strict=True):
            items += [(t, start + p, i, start + p == len(s) - 1) for p, t in enumerate(s[start:])]
        logits = self._decode(items)
        for s, i in zip(seqs, streams, strict=True):
            self.held[i] = list(s)
        rows = list(range(len(seqs)))
        pos = [len(s) for s in seqs]
        new: list[list[int]] = [[] for _ in seqs]
        if logprobs is not None:
            logprobs[:] = [[] for _ in seqs]
        while rows:
            ids = sample(logits)
            if logprobs is not None:
                z = logits.astype(np.float64) / temperature
                top = z.max(axis=1)
                lse = top + np.log(np.exp(z - top[:, None]).sum(axis=1))
                for k, (r, tok) in enumerate(zip(rows, ids, strict=True)):
                    logprobs[r].append(float(z[k, tok] - lse[k]))
            nxt, items = [], []
            for r, tok in zip(rows, ids, strict=True):
                new[r].append(int(tok))
                if tok == eos or len(new[r]) >= max_new_tokens:
                    continue
                items.append((int(tok), pos[r], streams[r], True))
                pos[r] += 1
                nxt.append(r)
            rows = nxt
            if rows:
                logits = self._decode(items)
                for tok, _, i, _ in items:
                    self.held[i].append(tok)
        return new


    def _place(self, seqs: list[list[int]], shared: int) -> tuple[list[int], list[int]]:
        """A stream for each sequence, and the position its encoding starts from. A stream whose tokens all begin
        a sequence (its earlier turns: the conversation so far and the tokens it generated) keeps them, so the
        next turn encodes only what is new (the tool's answer); the other sequences start from a copy of the
        prefix stream. Without this every turn re-encodes the whole conversation after the system prompt (on
        ``lookup`` ~40 of ~165 tokens a row at turn two; more with every turn). Only whole streams are kept: a
        stream cut back to a shorter common start (a new episode whose question begins like the last one's)
        decoded twice as slowly afterwards (1012 against 455 ms a step at 48 rows; measured, cause not found)."""
        L = self.L
        if not self.keep_streams:  # every row from the prefix stream (the side-by-side measure of the reuse)
            self.held = [[] for _ in self.held]
        streams, starts = [-1] * len(seqs), [shared] * len(seqs)
        free = set(range(self.n_seq))
        for j, s in enumerate(seqs):  # the longest free stream whose tokens all begin this row
            fits = [i for i in free if shared < len(self.held[i]) <= len(s) and s[:len(self.held[i])] == self.held[i]]
            if fits:
                best = max(fits, key=lambda i: (len(self.held[i]), -i))
                streams[j], starts[j] = best, min(len(self.held[best]), len(s) - 1)  # logits need one token
                free.discard(best)
        for j in range(len(seqs)):
            if streams[j] < 0:
                streams[j] = min(free)
                free.discard(streams[j])
        for j, i in enumerate(streams):
            self.held[i] = []  # unknown until this call has filled it (an error midway leaves it empty)
            if starts[j] > shared:
                L.llama_memory_seq_rm(self.mem, i, starts[j], -1)
            else:
                L.llama_memory_seq_rm(self.mem, i, -1, -1)
                if shared:
                    L.llama_memory_seq_cp(self.mem, self.prefix_seq, i, -1, -1)
        return streams, starts


def sampler(greedy: bool, temperature: float, top_p: float, rng: np.random.Generator):
    """``logits [rows, vocab] -> ids``: argmax, or a draw at ``temperature`` (nucleus ``top_p``)."""
    if greedy or temperature == 0:
        return lambda logits: logits.argmax(axis=1)

    def draw(logits: np.ndarray) -> np.ndarray:
        z = logits.astype(np.float64) / temperature
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        if top_p < 1.0:
            order = np.argsort(-p, axis=1)
            sorted_p = np.take_along_axis(p, order, axis=1)
            keep = np.cumsum(sorted_p, axis=1) - sorted_p < top_p
            mask = np.zeros_like(keep)
            np.put_along_axis(mask, order, keep, axis=1)
            p = np.where(mask, p, 0.0)
            p /= p.sum(axis=1, keepdims=True)
        u = rng.random((p.shape[0], 1))
        return np.minimum((np.cumsum(p, axis=1) < u).sum(axis=1), p.shape[1] - 1)

    return draw


# One engine per trained model, re-exported only when its weights changed (a GRPO step), kept across evaluations.
_ENGINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _fingerprint(model) -> tuple:
    import torch

    with torch.no_grad():  # what can change between calls: trained weights and LoRA factors (else everything)
        params = [p for n, p in model.named_parameters() if p.requires_grad or "lora_" in n] or list(model.parameters())
        return tuple(float(p.double().sum()) for p in params) + tuple(float(p.double().abs().sum()) for p in params)


_FP32_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def decoding_weights(model, precision: str = "auto"):
    """A plain model holding the weights ``agentlab.engines.weights.for_generation`` decodes with: its bf16 copy, or in
    fp32 a cached fp32 copy with the LoRA merged in (``for_generation`` runs the PEFT model itself there)."""
    import torch

    from agentlab.engines.weights import MergedCopy, for_generation, lora_layers

    fast = for_generation(model, precision)
    if lora_layers(fast) is None:
        return fast
    merged = _FP32_COPIES.get(model)
    if merged is None:
        merged = _FP32_COPIES[model] = MergedCopy(model, torch.float32)
    return merged.sync(model)


def engine_for(model, config, source_gguf: str | Path | None = None) -> Engine:
    """The engine decoding ``model``'s current weights for ``config`` (a ``LoopConfig``): the cached one while the
    weights and the batch shape are unchanged, else a fresh export (the old engine is closed)."""
    import torch

    if source_gguf is None:
        from agentlab.models import smollm2_gguf_path

        source_gguf = smollm2_gguf_path()
    n_seq, n_ctx_seq = config.batch_size, _round_up(config.max_context, 256)
    key = _fingerprint(model)
    state = _ENGINES.get(model)
    if state is None or state["key"] != key or state["shape"] != (n_seq, n_ctx_seq):
        if state is not None:
            state["engine"].close()
        fast = decoding_weights(model, config.precision)
        folder = Path(os.environ.get("AGENTLAB_LLAMACPP_DIR") or _shm_or_tmp())
        with tempfile.NamedTemporaryFile(dir=folder, suffix=".gguf", delete=False) as fh:
            path = Path(fh.name)
        try:
            with torch.no_grad():
                export_gguf(fast, source_gguf, path)
            engine = Engine(path, n_seq, n_ctx_seq)
        finally:
            path.unlink(missing_ok=True)  # llama.cpp holds the weights in memory (mmap of an unlinked file)
        state = _ENGINES[model] = {"key": key, "shape": (n_seq, n_ctx_seq), "engine": engine}
    return state["engine"]


def generate_fn(model, tokenizer, config, greedy: bool, seed: int, source_gguf: str | Path | None = None,
                keep_streams: bool = True, logprobs: bool = False):
    """A ``GenerateFn`` for ``run_episodes`` that decodes ``model``'s current weights with llama.cpp.
    ``keep_streams=False``: every call starts each row from the shared prefix (``Engine._place``'s reuse off).
    ``logprobs=True`` (sampling only): rows come back as ``Sampled``, with each token's behaviour log-probability."""
    from agentlab.engines.base import Sampled

    engine = engine_for(model, config, source_gguf)
    engine.keep_streams = keep_streams
    calls = [0]
    scored = logprobs and not greedy and config.temperature > 0

    def generate(seqs: list[list[int]]) -> list[list[int]]:
        rng = np.random.default_rng([seed, calls[0]])  # reproducible from the seed, different per call
        calls[0] += 1
        pick = sampler(greedy, config.temperature, config.top_p, rng)
        drawn: list[list[float]] | None = [] if scored else None
        rows = engine.generate(seqs, config.max_new_tokens, tokenizer.eos_token_id, pick, logprobs=drawn,
                               temperature=config.temperature)
        return [Sampled(r, lp) for r, lp in zip(rows, drawn, strict=True)] if scored else rows

    return generate


def _round_up(n: int, k: int) -> int:
    return (n + k - 1) // k * k


def _shm_or_tmp() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def _threads() -> int:
    import torch

    return max(1, torch.get_num_threads())


_LOG_CB = None


def _quiet(L) -> None:
    """Silence llama.cpp's loading chatter (it logs every tensor to stderr); errors still raise here."""
    global _LOG_CB
    if _LOG_CB is None:
        _LOG_CB = L.llama_log_callback(lambda level, text, user: None)
        L.llama_log_set(_LOG_CB, ctypes.c_void_p(0))


def check() -> None:
    """Decode a few tokens of the shipped GGUF in this process (``make setup-llamacpp`` runs it in a subprocess: a
    build with instructions this CPU refuses dies here, not in a test or a training run)."""
    from agentlab.models import smollm2_gguf_path

    engine = Engine(smollm2_gguf_path(), n_seq=2, n_ctx_seq=256, n_threads=1)
    out = engine.generate([[1, 2, 3, 4], [1, 2, 3, 5]], 4, -1, sampler(True, 0, 1, None))
    engine.close()
    assert [len(x) for x in out] == [4, 4], out
    print("agentlab: llama.cpp decodes here")


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--check"]:
        check()
