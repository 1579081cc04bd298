"""Every coupling of agentlab to TRL's or transformers' internals, behind one door.

TRL does the training; a few things it lacks are added here by reaching into code that is not its public API.
Each coupling below was checked against the versions in :data:`CHECKED` (those ``pyproject.toml`` pins); at
import, the installed versions are compared with them. On a different minor version :data:`COMPATIBLE` is
``False``, one warning says so, and the couplings that have one fall back to TRL's own code path (slower or
less frugal, still correct) instead of breaking:

==============================  ===============================================  =================================
coupling                        internals it relies on                           fallback
==============================  ===============================================  =================================
``shared_prefix_logps``         ``GRPOTrainer._get_per_token_logps_and_entropies``  TRL's own forward, row by row
                                (overridden); ``fused_lm_head=True`` outputs'
                                ``log_probs``/``entropy``; ``Cache.layers[i]``
``_lm_head_chunk``              ``trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE``  (only used by the above)
``scored_positions_only``       ``trl.trainer.utils._use_triton`` (its name in     TRL's head over every position
                                that module, read by the fused LM head)           (same numbers, ~1.6x slower SFT)
``_read_only``                  a cache instance's ``update`` replaced            (only used by the above)
``_checkpointed_layers``        ``GradientCheckpointingLayer`` attributes          (only used by the above)
                                ``gradient_checkpointing``,
                                ``_can_checkpoint_with_cache``,
                                ``_gradient_checkpointing_func``
``agent_trainer_class`` timing  ``GRPOTrainer._prepare_inputs`` (overridden)      no generation-time split
``trainer_rewards`` (train.py)  TRL leaves a ``None`` reward out of its group     none: checked by a test
                                baseline and gives it no advantage
``tool_suffix_ids``             the method of TRL's ``_get_tool_suffix_ids``,      none: token identity is tested
                                re-implemented (TRL's is a trainer method)        (``tests/test_rollout.py``)
``parse_response``              ``trl.chat_template_utils.parse_response``         none
``engines.vllm``                ``trainer.vllm_generation.generate`` and its       none (GPU only)
                                ``max_completion_length`` attribute
``trl_reward_func``             ``environments=``/``log_metric=`` keywords of      none: only for TRL's own
                                ``GRPOTrainer._calculate_rewards``                 ``environment_factory`` loop
``cache_of``                    ``out.cache`` or ``out.past_key_values``           none
``decode_cache``, ``row_cache``  ``DynamicLayer``'s ``update``/``keys``/``values``   generate's own ``DynamicCache``
                                and ``Cache.layer_class_to_replicate``             (copies the cache every token;
                                                                                  no reuse across turns)
``gqa_prefill``                 ``AttentionInterface``/``AttentionMaskInterface``  transformers' SDPA (copies the
``stock_attention``             registration; ``sdpa_attention_forward``'s        key/value heads per query head
                                signature; ``sdpa_mask``; ``config._attn_impl…``  in a padded prefill)
``drop_instance_forwards``      forwards patched onto module instances (TRL's     none: checked by a test
                                fused LM head, accelerate's autocast wrapper)     (``tests/test_precision.py``)
``off_policy`` (async runs)     ``GRPOTrainer._generate_and_score_completions``   refused: an async run needs it
                                output keys ``sampling_per_token_logps``,         (``max_staleness=0`` trains)
                                ``old_per_token_logps``; ``compute_loss`` inputs
``resume_training``             transformers' ``Trainer.train`` resumed at         none: checked by a test
                                ``max_steps`` trains one step more (the limit is  (``tests/test_train.py``)
                                checked after a step, not before the first)
``snap_flat_groups``            ``GRPOTrainer._generate_and_score_completions``   not snapped: a flat group keeps
                                output ``advantages`` (this process's rows, in    rounding-sized advantages, and a
                                prompt order) (``skip_zero_signal`` only)         step of them is not skipped
``drop_flat_rows``              ``compute_loss`` inputs (per-row tensors,         every row trained, as TRL does
                                ``num_items_in_batch``); ``_compute_loss``'s
                                loss types (``rows_separable``)
``trainer_metrics``             ``GRPOTrainer._metrics["train"]``                 none (benchmarks only)
``generate_and_score``          ``GRPOTrainer._generate_and_score_completions``   none (benchmarks only)
``per_token_logps_and_…``       ``GRPOTrainer._get_per_token_logps_and_entropies`` none (benchmarks only)
==============================  ===============================================  =================================

Each coupling has a test against the pinned versions (``tests/test_train.py``, ``tests/test_precision.py``,
``tests/test_rollout.py``, ``tests/test_gpu.py``, ``tests/test_trl_envs.py``), and ``tests/test_trl_compat.py``
forces the fallback and trains one step through TRL's own forward.

    >>> sorted(CHECKED)
    ['transformers', 'trl']
"""

from __future__ import annotations

import functools
import json
import os
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from contextlib import contextmanager
from importlib.metadata import version

from agentlab.types import Episode, Turn

CHECKED = {"trl": "1.16.0", "transformers": "5.24.0"}


def _minor(v: str) -> tuple[str, ...]:
    return tuple(v.split(".")[:2])


def mismatched() -> dict[str, str]:
    """Installed versions whose minor release differs from the checked one (``{name: installed}``).

    >>> mismatched()
    {}
    """
    return {name: version(name) for name, checked in CHECKED.items() if _minor(version(name)) != _minor(checked)}


# AGENTLAB_TRL_FALLBACK=1 forces TRL's own code paths (tests, or a suspected coupling bug).
_MISMATCHED = mismatched()
COMPATIBLE = not _MISMATCHED and os.environ.get("AGENTLAB_TRL_FALLBACK", "") in ("", "0")
if _MISMATCHED:
    warnings.warn(f"agentlab's TRL couplings were checked against {CHECKED}, found {_MISMATCHED}: training falls "
                  f"back to TRL's own forward (slower, more memory; same results)", stacklevel=2)


def cache_of(out):
    """The KV cache of a forward output: ``out.cache`` where the model returns one, else ``past_key_values``."""
    return out.cache if getattr(out, "cache", None) is not None else out.past_key_values


# -- the shared-prefix forward -------------------------------------------------------------------------------------


def shared_prefix_logps(model, input_ids, attention_mask, logits_to_keep: int, compute_entropy: bool = False,
                        min_prefix: int = 16, checkpoint: bool = True):
    """Per-token log-probs of the last ``logits_to_keep`` tokens, encoding the batch's shared prefix once.

    Why: every rollout of a step starts with the same system prompt and tool schemas (~370 of ~550 tokens on
    ``lookup``), and TRL's forward encodes it once per row, forward and backward. Here the prefix is encoded
    once with gradients, its KV cache repeated across the batch (gradients sum back through the repeat), and
    each row's remainder (its real tokens after the prefix) laid out as ``pads | rest`` with explicit position
    ids — the same attention each row had alone. Remainders run in buckets of similar length (``_length_buckets``):
    TRL pads every completion to the longest one, and on an environment whose episodes range from 100 to 960
    tokens (product_finder, a GRPO step of 16 rollouts, bf16) running the pads cost half the step.
    ``tests/test_train.py`` checks log-probs and gradients against TRL's own computation.
    Returns ``(logps_BT, entropy_BT | None)`` or ``None`` when the shared prefix is too short to bother.

    ``checkpoint``: activation checkpointing of the remainder's decoder layers (each layer keeps only its input
    and is replayed in backward). Transformers' own gradient checkpointing drops the cache, so the prefix could
    not be shared under it; here the cache is made read-only for the remainder (``_read_only``), which makes a
    replay see exactly the states of the first pass. Measured on the GRPO step benchmark's step (8 rollouts, ~200
    tokens each after the prefix, bf16): peak RSS 5.9 GB without, 4.3 GB with; 3.3 GB with ``LM_HEAD_CHUNK`` too.
    """
    import torch
    from transformers.modeling_layers import GradientCheckpointingLayer

    if not any(isinstance(m, GradientCheckpointingLayer) for m in model.modules()) and getattr(
            model, "is_activation_checkpointing", False):
        return None  # checkpointing we cannot steer would drop the prefix cache: TRL's own forward is the safe one
    rows = [ids[m.bool()] for ids, m in zip(input_ids, attention_mask, strict=True)]
    width = input_ids.size(1)
    scored = [int(k) for k in attention_mask[:, width - logits_to_keep:].sum(1)]  # real completion tokens per row
    # the prefix ends before every row's last prompt token (whose logit scores the row's first completion token)
    limit = min(len(r) - k for r, k in zip(rows, scored, strict=True)) - 1
    prefix_len = 0
    while prefix_len < limit and all(int(r[prefix_len]) == int(rows[0][prefix_len]) for r in rows):
        prefix_len += 1
    if prefix_len < min_prefix:
        return None
    prefix = rows[0][:prefix_len].unsqueeze(0)
    # The prefix must fill the cache: transformers' gradient checkpointing (on in the GPU recipe) would drop it and
    # silently score every remainder without its prefix. One row: its activations are cheap to keep.
    with _checkpointed_layers(model, False):
        out = model(input_ids=prefix, use_cache=True, logits_to_keep=1)  # only the cache, not prefix logits
    prefix_cache = cache_of(out)
    per_row: dict[int, tuple] = {}
    for bucket in _length_buckets([len(r) - prefix_len for r in rows]):
        rests = [rows[b][prefix_len:] for b in bucket]
        n, rest_width = len(bucket), max(len(r) for r in rests)
        rest_ids = torch.zeros((n, rest_width), dtype=input_ids.dtype, device=input_ids.device)
        rest_mask = torch.zeros((n, rest_width), dtype=attention_mask.dtype, device=input_ids.device)
        labels = torch.full((n, rest_width), -100, dtype=input_ids.dtype, device=input_ids.device)
        for i, (b, rest) in enumerate(zip(bucket, rests, strict=True)):
            rest_ids[i, rest_width - len(rest):] = rest
            rest_mask[i, rest_width - len(rest):] = 1
            labels[i, rest_width - scored[b]:] = rest[len(rest) - scored[b]:]  # k = 0: empty on both sides
        positions = (prefix_len + rest_mask.cumsum(1) - 1).clamp(min=0)
        full_mask = torch.cat([rest_mask.new_ones((n, prefix_len)), rest_mask], dim=1)
        cache = _repeated(prefix_cache, n)  # its own cache object: a checkpoint replay reads this bucket's states
        with _checkpointed_layers(model, checkpoint), _lm_head_chunk(LM_HEAD_CHUNK), scored_positions_only():
            outputs = model(input_ids=rest_ids, attention_mask=full_mask, position_ids=positions, cache=cache,
                            labels=labels, fused_lm_head=True, use_cache=False)
        for i, b in enumerate(bucket):
            per_row[b] = (outputs.log_probs[i], outputs.entropy[i] if compute_entropy else None)

    def laid_out(j: int):  # row b's completion scores at columns 0..k-1, zeros on TRL's right pads
        return torch.stack([torch.cat([per_row[b][j][len(per_row[b][j]) - k:], per_row[b][j].new_zeros(logits_to_keep - k)])
                            for b, k in enumerate(scored)])

    return laid_out(0), laid_out(1) if compute_entropy else None


def _length_buckets(lengths: list[int], waste: float = 0.25) -> list[list[int]]:
    """Row indices grouped by length (shortest first), a bucket closed when padding it to its longest row would
    add more than ``waste`` of its real tokens.

    >>> _length_buckets([100, 960, 104, 451, 443])
    [[0, 2], [4, 3], [1]]
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    buckets: list[list[int]] = []
    for i in order:
        current = buckets[-1] if buckets else None
        if current and (len(current) + 1) * lengths[i] <= (1 + waste) * (sum(lengths[j] for j in current) + lengths[i]):
            current.append(i)
        else:
            buckets.append([i])
    return buckets


def _repeated(cache, n: int):
    """A read-only copy of a one-row prefix cache with its states repeated for ``n`` rows (gradients sum back
    through the repeat into the prefix's forward)."""
    import copy

    out = copy.copy(cache)
    out.layers = []
    for layer in cache.layers:
        twin = copy.copy(layer)
        twin.keys, twin.values = layer.keys.repeat_interleave(n, 0), layer.values.repeat_interleave(n, 0)
        out.layers.append(twin)
    _read_only(out)
    return out


# -- decoding into a preallocated KV cache ----------------------------------------------------------------------------


def decode_cache(prefix_cache, rows: int, capacity: int):
    """A cache for ``model.generate`` over ``rows`` rows of up to ``capacity`` positions, starting from a one-row
    ``prefix_cache`` (or empty when it is ``None``); ``None`` where the couplings are off (generate's own cache).

    Why: transformers' ``DynamicCache`` grows by ``torch.cat`` on every layer at every decoded token, copying the
    whole cache each time. At an eval batch of 48 on ``lookup`` (~420 positions) those copies were a third of the
    time of ``generate`` (profiled: ``aten::cat`` 5.8 s of 17.9 s). Its ``StaticCache`` avoids them but attends
    over its full length, padded, which changes the float sums. Here each layer writes into a buffer sized once and
    hands attention a view of exactly the filled positions: the same values, in the same order, as the
    concatenated cache, so decoding is unchanged bit for bit (``tests/test_rollout.py``).
    """
    if not COMPATIBLE:
        return None
    from transformers.cache_utils import DynamicCache

    layer = functools.partial(_preallocated_layer_class(), rows, capacity)
    cache = DynamicCache()
    if prefix_cache is not None:
        for cached in prefix_cache.layers:
            cache.layers.append(layer())
            cache.layers[-1].update(cached.keys.expand(rows, -1, -1, -1), cached.values.expand(rows, -1, -1, -1))
    cache.layer_class_to_replicate = layer
    return cache


def row_cache(rows_kv: list, width: int, capacity: int):
    """A decode cache like :func:`decode_cache` whose row ``i`` starts with its own keys and values, ``rows_kv[i]``
    (one ``(keys, values)`` pair per layer, each ``[heads, n_i, dim]``, or ``None`` for none), right-aligned in the
    first ``width`` positions with zeros before them (the caller's attention mask hides those); ``None`` where the
    couplings are off. The engine's per-row reuse across turns (``agentlab.engines.torch``) decodes into it."""
    if not COMPATIBLE:
        return None
    from transformers.cache_utils import DynamicCache

    layer = functools.partial(_preallocated_layer_class(), len(rows_kv), capacity)
    cache = DynamicCache()
    for depth in range(len(next(kv for kv in rows_kv if kv is not None))):
        cache.layers.append(layer())
        cache.layers[-1].fill([kv[depth] if kv is not None else None for kv in rows_kv], width)
    cache.layer_class_to_replicate = layer
    return cache


GQA_PREFILL = "agentlab_sdpa"


def gqa_prefill(model) -> bool:
    """Let ``model`` (a decoding copy) attend in a padded prefill on its key/value heads as they are; ``False``
    (nothing changed) where the couplings are off or the model does not use transformers' SDPA attention.

    Why: given a padding mask, transformers' SDPA path copies the 3 key/value heads of SmolLM2 out to its 9 query
    heads (``repeat_kv``: its test is "CUDA needs no mask", on CPU too) before calling torch's flash kernel. Profiled
    on a ``lookup`` evaluation's second-turn prefill (48 rows, 171 new positions against 541 cached): the copies took
    5.4 ms a layer and the kernel 65 ms on the repeated heads against 45 ms reading them in place
    (``enable_gqa=True``), with the same output bit for bit (``tests/test_rollout.py`` compares whole generations).
    Everything else -- decode steps (transformers packs the query heads per key/value head there; ``enable_gqa``
    would change the kernel's blocking and a last bit), unmasked calls, anything that needs gradients -- goes
    through transformers' own function unchanged. So does CUDA: there the two calls pick different kernels and fp32
    logits differed in the last bits (this test, run on an H200); the copies it saves were measured on a CPU.
    """
    if not COMPATIBLE:
        return False
    if model.config._attn_implementation == GQA_PREFILL:
        return True
    if model.config._attn_implementation != "sdpa":
        return False
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(GQA_PREFILL, _gqa_prefill_attention)
    AttentionMaskInterface.register(GQA_PREFILL, sdpa_mask)
    model.set_attn_implementation(GQA_PREFILL)
    return True


def stock_attention(model) -> None:
    """Undo :func:`gqa_prefill`: transformers' own SDPA attention (the reference a benchmark measures against)."""
    if model.config._attn_implementation == GQA_PREFILL:
        model.set_attn_implementation("sdpa")


def drop_instance_forwards(model) -> None:
    """Remove forwards patched onto ``model``'s module instances (TRL's fused LM head, accelerate's autocast
    wrapper): they are closures over the *original* module, which ``copy.deepcopy`` keeps, so a copy would silently
    run the original's weights. Each module then runs its class's own forward."""
    for module in model.modules():
        module.__dict__.pop("forward", None)


def resume_training(trainer, checkpoint: str | None, max_steps: int, evaluate: Callable[[int], None]) -> None:
    """``trainer.train(resume_from_checkpoint=checkpoint)``, except from a checkpoint at ``max_steps`` (a run stopped
    during its last step's evaluation): transformers resumed there trains one step more before it checks the limit
    (5.24's ``_inner_training_loop`` enters the epoch loop first; a doc_search study got a 13th step of 12 that way),
    so the checkpoint's adapter is loaded into the model, ``evaluate(max_steps)`` finishes the step's evaluation, and
    nothing trains."""
    if checkpoint is None or int(checkpoint.rsplit("-", 1)[1]) < max_steps:
        trainer.train(resume_from_checkpoint=checkpoint)
        return
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    set_peft_model_state_dict(trainer.model, load_file(os.path.join(checkpoint, "adapter_model.safetensors")))
    evaluate(max_steps)


def trainer_metrics(trainer) -> dict:
    """What TRL's trainer has gathered to log for training (``GRPOTrainer._metrics["train"]``: name -> values)."""
    return trainer._metrics["train"]


def generate_and_score(trainer, batch: list[dict]) -> dict:
    """TRL's own generation of a batch, tools and scoring included (``_generate_and_score_completions``): what a
    step of ``GRPOTrainer(environment_factory=...)`` spends before its forward (``benchmarks/rollout_throughput``)."""
    return trainer._generate_and_score_completions(batch)


def per_token_logps_and_entropies(trainer, *args, **kwargs):
    """The training forward of a GRPO trainer (``_get_per_token_logps_and_entropies``; ours when the couplings are
    on, TRL's otherwise), for ``benchmarks/train_forward``."""
    return trainer._get_per_token_logps_and_entropies(*args, **kwargs)


def _gqa_prefill_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                           is_causal=None, **kwargs):
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if (query.device.type == "cpu" and query.shape[2] > 1 and attention_mask is not None
            and getattr(module, "num_key_value_groups", 1) > 1 and not torch.is_grad_enabled()
            and kwargs.get("position_bias") is None and kwargs.get("softcap") is None
            and not kwargs.get("output_attentions")):
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                               dropout_p=dropout, scale=scaling, enable_gqa=True)
        return out.transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)


@functools.cache
def _preallocated_layer_class():
    import torch
    from transformers.cache_utils import DynamicLayer

    class PreallocatedLayer(DynamicLayer):
        """A ``DynamicLayer`` that writes into a buffer of ``capacity`` positions instead of concatenating."""

        def __init__(self, rows: int, capacity: int):
            super().__init__()
            self.rows, self.capacity, self.filled = rows, capacity, 0

        def fill(self, pairs: list, width: int) -> None:
            """Start with row ``i``'s ``pairs[i] = (keys, values)`` (``[heads, n_i, dim]``) in positions
            ``width - n_i .. width``; zeros before them (finite: a masked position still enters the kernel)."""
            keys, values = next(p for p in pairs if p is not None)
            self.device, self.is_initialized = keys.device, True
            self.k_buf = keys.new_zeros(self.rows, keys.shape[0], max(self.capacity, width), keys.shape[-1])
            self.v_buf = values.new_zeros(self.rows, values.shape[0], max(self.capacity, width), values.shape[-1])
            for i, pair in enumerate(pairs):
                if pair is not None and pair[0].shape[-2]:
                    self.k_buf[i, :, width - pair[0].shape[-2]:width] = pair[0]
                    self.v_buf[i, :, width - pair[1].shape[-2]:width] = pair[1]
            self.filled = width
            self.keys, self.values = self.k_buf[:, :, :width], self.v_buf[:, :, :width]

        def update(self, key_states, value_states, *args, **kwargs):
            q = key_states.shape[-2]
            if not self.is_initialized:
                self.device, self.is_initialized = key_states.device, True
                _, h, _, d = key_states.shape
                self.k_buf = key_states.new_empty(self.rows, h, max(self.capacity, q), d)
                self.v_buf = value_states.new_empty(self.rows, h, max(self.capacity, q), value_states.shape[-1])
            elif self.filled + q > self.k_buf.shape[-2]:  # past the capacity asked for: grow (correct, slower)
                more = max(self.k_buf.shape[-2], q)  # at least double, and room for this update
                self.k_buf, self.v_buf = (torch.cat([buf, buf.new_empty(*buf.shape[:2], more, buf.shape[-1])], -2)
                                          for buf in (self.k_buf, self.v_buf))
            self.k_buf[:, :, self.filled:self.filled + q] = key_states
            self.v_buf[:, :, self.filled:self.filled + q] = value_states
            self.filled += q
            self.keys, self.values = self.k_buf[:, :, :self.filled], self.v_buf[:, :, :self.filled]
            return self.keys, self.values

    return PreallocatedLayer


# Vocabulary columns per tile of TRL's fused LM head. TRL's 32768 makes each CPU tile (positions x 32768, fp32)
# ~200 MB for an 8-rollout step, and its CPU fallback makes several temporaries of that size; 8192 cut the peak of a
# forward+backward from 3.6 to 2.4 GB at the same speed (measured on the GRPO step benchmark's batch).
LM_HEAD_CHUNK = 8192


@contextmanager
def _lm_head_chunk(size: int):
    """Set TRL's fused-LM-head tile width within the block (read when the forward runs; backward reuses it)."""
    import trl.trainer.utils as trl_utils

    saved, trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE = trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE, size
    try:
        yield
    finally:
        trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE = saved


@contextmanager
def scored_positions_only():
    """Within the block, TRL's fused LM head scores only the positions that have a label, on CPU as on GPU.

    Why: TRL compacts to the labelled positions only where Triton runs (elsewhere a changing row count would
    recompile its kernels); on CPU it projects *every* position onto the 49k-token vocabulary, in fp32, though the
    loss reads only the assistant's tokens (about a tenth of a tool-use conversation). Measured on the RL-vs-SFT
    study's SFT (product_finder demonstrations, batch 2, bf16, 2 cores): 6 steps in 98 s before, 56-63 s after, the
    same losses to bf16 noise. Without the coupling (``COMPATIBLE`` false) TRL's own behaviour stays.
    """
    if not COMPATIBLE:
        yield
        return
    import trl.trainer.utils as trl_utils

    saved = trl_utils._use_triton
    trl_utils._use_triton = lambda device: device.type == "cpu" or saved(device)
    try:
        yield
    finally:
        trl_utils._use_triton = saved


def _read_only(cache) -> None:
    """Make ``cache`` return (cached + new) keys and values without storing the new ones, so a decoder layer can
    run twice (activation checkpointing replays it in backward) and read the same states both times."""
    import torch

    def update(key_states, value_states, layer_idx, *args, **kwargs):
        layer = cache.layers[layer_idx]
        return torch.cat([layer.keys, key_states], dim=-2), torch.cat([layer.values, value_states], dim=-2)

    cache.update = update


@contextmanager
def _checkpointed_layers(model, enabled: bool = True):
    """Within the block, decoder layers (transformers' ``GradientCheckpointingLayer``) run under non-reentrant
    activation checkpointing even with a (read-only) cache if ``enabled``, and without checkpointing otherwise,
    whatever the model's own setting; their own settings come back afterwards. Checkpointing only acts with
    gradients in train mode (the layer checks both)."""
    from functools import partial

    from torch.utils.checkpoint import checkpoint
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    # the backbone's own flag only turns use_cache off (and with it the prefix cache): off inside the block
    backbones = [m for m in model.modules() if isinstance(m.__dict__.get("gradient_checkpointing"), bool)
                 and not isinstance(m, GradientCheckpointingLayer)]
    keys = ("gradient_checkpointing", "_can_checkpoint_with_cache", "_gradient_checkpointing_func")
    saved = [(m, {k: m.__dict__[k] for k in keys if k in m.__dict__}) for m in layers + backbones]
    for layer in layers:
        layer.gradient_checkpointing = enabled
        layer._can_checkpoint_with_cache = True  # our cache is read-only: the replay reads the same states
        layer._gradient_checkpointing_func = partial(checkpoint, use_reentrant=False)
    for backbone in backbones:
        backbone.gradient_checkpointing = False
    try:
        yield
    finally:
        for module, state in saved:
            for key in keys:
                module.__dict__.pop(key, None)
            module.__dict__.update(state)


_TRAINER_CLASS = None


def snap_flat_groups(advantages, flat: list[bool]):
    """``advantages`` (this process's rows, in prompt order: ``len(flat)`` groups of equal size) with every row of a
    flat group set to exactly 0.

    Why: TRL's advantage is ``(r - mean) / (std + 1e-4)``, and the float32 mean of G equal rewards is not always
    the reward (on an AVX2 EPYC, for G = 8, about half of the rewards in [0, 1]: the summation order is the CPU's);
    a group whose rollouts all earned 0.1 there gets advantages ~1e-4 of one sign, a push towards (or away from)
    everything it sampled, and a step of only such groups has a small, non-zero gradient that ``update_guard``
    cannot tell from a signal.

    >>> import torch
    >>> snap_flat_groups(torch.tensor([7e-5, 7e-5, 0.5, -0.5]), [True, False]).tolist()
    [0.0, 0.0, 0.5, -0.5]
    """
    import torch

    size = advantages.shape[0] // len(flat)
    mask = torch.tensor(flat, device=advantages.device).repeat_interleave(size)
    return advantages.masked_fill(mask.view(-1, *[1] * (advantages.dim() - 1)), 0.0)


# TRL 1.16's loss types whose loss is a sum over trained tokens divided by a normaliser fixed for the whole generation
# batch (``num_items_in_batch``), each token's term a multiple of its row's advantage: a row whose advantage is exactly
# 0 adds exactly nothing to them. ("grpo", "bnpo", "dr_grpo", "sapo", "luspo" average over the micro-batch's rows or
# tokens: leaving a row out would rescale the others.)
ROW_SEPARABLE_LOSSES = ("dapo", "cispo", "vespo")


def rows_separable(trainer) -> bool:
    """Whether a rollout whose advantage is exactly 0 adds exactly nothing to ``trainer``'s loss, so leaving it out
    of the forward and backward changes no gradient: a loss type in :data:`ROW_SEPARABLE_LOSSES`, no KL term (its
    per-token penalty has no advantage factor), no entropy bonus, no top-entropy mask (a quantile over the batch's
    tokens), no auxiliary loss."""
    return (trainer.loss_type in ROW_SEPARABLE_LOSSES and trainer.beta == 0.0 and trainer.top_entropy_quantile >= 1.0
            and not getattr(trainer, "_entropy_bonus_enabled", True) and not trainer.aux_loss_enabled)


def trained_rows(inputs: dict) -> list[int] | None:
    """The rows of a GRPO micro-batch that can move the gradient, those whose advantage is not exactly 0; ``None``
    when that is every row. When it is none, the row with the fewest completion tokens: the micro-batch still runs
    one forward, so the step still logs its entropy and, across processes, every collective call still happens.

    >>> import torch
    >>> mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    >>> trained_rows({"advantages": torch.tensor([0.0, 0.5, -0.5]), "completion_mask": mask})
    [1, 2]
    >>> trained_rows({"advantages": torch.tensor([0.0, 0.0, 0.0]), "completion_mask": mask})
    [1]
    >>> trained_rows({"advantages": torch.tensor([1e-4, 0.5, -0.5]), "completion_mask": mask}) is None
    True
    """
    advantages = inputs["advantages"]
    signal = (advantages != 0).reshape(advantages.shape[0], -1).any(1)
    if bool(signal.all()):
        return None
    if bool(signal.any()):
        return signal.nonzero().flatten().tolist()
    return [int(inputs["completion_mask"].sum(1).argmin())]


def take_rows(inputs: dict, rows: list[int]) -> dict:
    """A GRPO micro-batch cut to ``rows``: every per-row tensor (first dimension the batch's) and per-row list
    indexed; the rest kept, ``num_items_in_batch`` (the generation batch's token count, the dapo normaliser) among
    them."""
    import torch

    n = inputs["advantages"].shape[0]

    def cut(value):
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == n:
            return value.index_select(0, torch.tensor(rows, device=value.device))
        return [value[i] for i in rows] if isinstance(value, list) and len(value) == n else value

    return {key: cut(value) for key, value in inputs.items()}


def agent_trainer_class():
    """TRL's GRPOTrainer plus two things it lacks: a step-time split (generation / forward / backward) and the
    shared-prefix forward (``shared_prefix_logps``). Built on first use so importing agentlab stays light."""
    global _TRAINER_CLASS
    if _TRAINER_CLASS is not None:
        return _TRAINER_CLASS
    from trl import GRPOTrainer

    class AgentGRPOTrainer(GRPOTrainer):
        # Thin timing hooks: generation happens inside _prepare_inputs, the policy forward in compute_loss,
        # the rest of training_step is backward + optimiser.
        shared_prefix = True  # set False to get TRL's own forward (benchmarks, tests); COMPATIBLE gates it too
        off_policy = False    # an asynchronous run's groups: the clipped ratio is taken against the behaviour policy
        flat_groups = None    # per group of this process's batch: every rollout earned the same (skip_zero_signal)
        drop_flat_rows = False  # leave rows whose advantage is exactly 0 out of the forward and backward (only where
                                # rows_separable: then no gradient changes; train.build_trainer checks it)

        def __init__(self, *a, **k):
            self.timing: dict[str, float] = {}
            self._timed_step = -1
            self._behaviour = None  # (behaviour log-probs, trained-token mask) while an off-policy loss is computed
            super().__init__(*a, **k)

        def training_step(self, *a, **k):
            # called once per micro-batch: the step's timings add up over its micro-batches
            if self._timed_step != self.state.global_step:
                self.timing.clear()
                self._timed_step = self.state.global_step
            t0 = time.perf_counter()
            out = super().training_step(*a, **k)
            self.timing["step_s"] = self.timing.get("step_s", 0) + time.perf_counter() - t0
            return out

        def _prepare_inputs(self, *a, **k):  # generation time: a private method, hooked only when checked
            if not COMPATIBLE:
                return super()._prepare_inputs(*a, **k)
            t0 = time.perf_counter()
            out = super()._prepare_inputs(*a, **k)
            self.timing["prepare_s"] = self.timing.get("prepare_s", 0) + time.perf_counter() - t0
            return out

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                               batch_size=None, compute_entropy=False, compute_aux_loss=False,
                                               **multimodal):
            if self.shared_prefix and COMPATIBLE and not compute_aux_loss and not any(v is not None for v in multimodal.values()):
                with self.accelerator.autocast():
                    shared = shared_prefix_logps(model, input_ids, attention_mask, logits_to_keep, compute_entropy)
                if shared is not None:
                    self._behaviour_gap(shared[0])
                    return shared[0], shared[1], None
            out = super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss,
                **multimodal)
            self._behaviour_gap(out[0])
            return out

        def _generate_and_score_completions(self, *a, **k):
            out = super()._generate_and_score_completions(*a, **k)
            if (flat := self.flat_groups) is not None and COMPATIBLE:
                out["advantages"] = snap_flat_groups(out["advantages"], flat)
            self.flat_groups = None
            if self.off_policy:
                behaviour = out.get("sampling_per_token_logps")
                if behaviour is None or not COMPATIBLE:
                    raise RuntimeError("an asynchronous run needs its worker's behaviour log-probs in TRL's batch "
                                       "(sampling_per_token_logps, TRL 1.16); this TRL version is not checked: "
                                       "train with max_staleness=0")
                # TRL's "old" log-probs are what its clipped ratio divides by: on-policy TRL leaves them None (the
                # ratio is 1); an off-policy group's are the policy that drew it, so the ratio corrects the update
                # for the staleness and TRL's clip (and delta, experiment.grpo_kwargs) caps it.
                out["old_per_token_logps"] = behaviour
            return out

        def compute_loss(self, model, inputs, *a, **k):
            t0 = time.perf_counter()
            if self.drop_flat_rows and COMPATIBLE and inputs.get("pixel_values") is None and (
                    rows := trained_rows(inputs)) is not None:
                inputs = take_rows(inputs, rows)
            self.timing["trained_rows"] = self.timing.get("trained_rows", 0) + len(inputs["advantages"])
            self._behaviour = (inputs.get("old_per_token_logps"), inputs["completion_mask"]
                               * inputs.get("tool_mask", 1)) if self.off_policy else None
            out = super().compute_loss(model, inputs, *a, **k)
            self._behaviour = None
            self.timing["forward_s"] = self.timing.get("forward_s", 0) + time.perf_counter() - t0
            return out

        def _behaviour_gap(self, logps) -> None:
            """Mean |trained - behaviour| log-prob over the trained tokens of an off-policy batch (a diagnostic)."""
            if self._behaviour is not None and logps.requires_grad:
                behaviour, mask = self._behaviour
                gap = ((logps.detach() - behaviour).abs() * mask).sum() / mask.sum().clamp(min=1)
                self.timing["behaviour_gap"] = float(gap)

    _TRAINER_CLASS = AgentGRPOTrainer
    return AgentGRPOTrainer


# -- chat-template tokens and parsing --------------------------------------------------------------------------------


def tool_suffix_ids(tok, tool_messages: list[dict]) -> list[int]:
    """Tokens of tool results plus the next assistant header. Same method as TRL's ``_get_tool_suffix_ids`` (a
    trainer method, so not callable from our loop): render a dummy call with and without the results, cut at the
    last EOS of the shorter one."""
    dummy = [{"role": "user", "content": "dummy"},
             {"role": "assistant", "content": "",
              "tool_calls": [{"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}]}]
    prefix = tok.apply_chat_template(dummy, add_generation_prompt=False, tokenize=True, return_dict=False)
    full = tok.apply_chat_template(dummy + tool_messages, add_generation_prompt=True, tokenize=True,
                                   return_dict=False)
    eos = [i for i, t in enumerate(prefix) if t == tok.eos_token_id]
    if eos:
        prefix = prefix[: eos[-1] + 1]
    if full[: len(prefix)] != prefix:
        raise ValueError("chat template is not prefix-preserving; run agentlab.models.preflight")
    return list(full[len(prefix):])


def parse_response(tok, new_ids: list[int], prefix: list[int], tools: list) -> dict:
    """TRL's parser of one generated turn (content, tool calls) for the tokenizer's chat template."""
    from trl.chat_template_utils import parse_response as trl_parse

    return trl_parse(tok, new_ids, prefix=prefix, tools=tools)


# -- vLLM (GPU) ----------------------------------------------------------------------------------------------------


# -- TRL's own environment_factory loop -----------------------------------------------------------------------------------------------

# Text that shows an attempted tool call; in an assistant message with no parsed tool_calls it marks off-form.
TOOL_CALL_MARKERS = ("<tool_call>", "<function=", "<|tool_call", '"arguments":')


def turns_from_messages(completion: list[dict] | str) -> list[Turn]:
    """Turns from a TRL completion (assistant and tool messages, or plain text). TRL turns any tool exception
    into an ``{'error': …}`` result, so errors here are all marked ``"policy"``."""
    if isinstance(completion, str):
        return [Turn(text=completion, off_form=any(m in completion for m in TOOL_CALL_MARKERS))]
    turns: list[Turn] = []
    for message in completion:
        content = message.get("content") or ""
        content = content if isinstance(content, str) else json.dumps(content)
        if message.get("role") == "assistant":
            calls = [{"name": c.get("function", {}).get("name", ""), "arguments": c.get("function", {}).get(
                "arguments", {}), "result": None, "error": None} for c in message.get("tool_calls") or []]
            off_form = not calls and any(m in content for m in TOOL_CALL_MARKERS)
            turns.append(Turn(text=content, tool_calls=calls, off_form=off_form))
        elif message.get("role") == "tool" and turns:
            pending = next((c for c in turns[-1].tool_calls if c["result"] is None), None)
            if pending is not None:
                pending["result"] = content
                pending["error"] = "policy" if content.startswith(("Error:", "{'error'")) else None
    return turns


def trl_reward_func(reward_fn: Callable, spec) -> Callable[..., list[float | None]]:
    """A reward function with TRL's custom signature, scoring each rollout from its environment instance.

    Not a training path of ours (``run_grpo`` uses the ``rollout_func``): it lets an environment class be trained by
    TRL's own ``GRPOTrainer(environment_factory=spec.env_class)`` loop, which ``tests/test_trl_envs.py`` checks.

    TRL (1.16, ``GRPOTrainer._calculate_rewards``) passes ``environments=`` — the instances the rollouts ran in —
    to every reward function when ``environment_factory`` is set; we read ``env._task`` and ``env.outcome``,
    evaluate with ``spec`` (an ``EnvSpec``), and apply ``reward_fn``. Rollouts of another environment get ``None``
    (TRL ignores them as NaN).
    Each term's batch mean is logged as ``reward_terms/<name>`` through TRL's ``log_metric``.
    """
    env_name = spec.name

    def reward_func(prompts, completions, environments=None, **kwargs) -> list[float | None]:
        if environments is None:
            raise ValueError(f"{env_name}_reward scores from environment state: pass "
                             "GRPOTrainer(environment_factory=...) so TRL hands it `environments`")
        totals: list[float | None] = []
        sums: dict[str, float] = defaultdict(float)
        for env, completion in zip(environments, completions, strict=True):
            if getattr(env, "name", None) != env_name or env._task is None:
                totals.append(None)
                continue
            outcome = env.outcome
            ep = Episode(task=env._task, turns=turns_from_messages(completion), outcome=outcome,
                         metrics=spec.evaluate(env._task, outcome),
                         exit_reason="final_answer" if outcome.finished else "no_tool_call")
            scored = reward_fn(ep)
            totals.append(float(scored[0] if isinstance(scored, tuple) else scored))
            for name, value in (scored[1] if isinstance(scored, tuple) else {}).items():
                sums[name] += value
        scored_n = sum(t is not None for t in totals)
        if (log_metric := kwargs.get("log_metric")) and scored_n:
            for name, value in sums.items():
                log_metric(f"reward_terms/{name}", value / scored_n)
        return totals

    reward_func.__name__ = reward_func.__qualname__ = f"{env_name}_reward"
    return reward_func
