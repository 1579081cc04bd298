"""Numeric precision on CPU: bf16 where the CPU multiplies bf16 in hardware, fp32 everywhere else.

    from agentlab.precision import resolve, for_generation
    resolve("auto")            # "bf16" on CUDA or on a CPU with AMX / AVX512-BF16, else "fp32"
    fast = for_generation(model)  # what to decode with: a bf16 copy (LoRA merged in), or ``model`` itself

Why: the CPUs we measured on (Xeon with AMX, 2 cores) multiply a 512x576 by 576x1536 matrix in 2.96 ms in fp32
and 0.45 ms in bf16; a prefill of 8 x 400 tokens through SmolLM2-135M takes 5.4 s in fp32 with LoRA and 1.0 s in
bf16 with the LoRA merged (``benchmarks/`` has the step-level numbers). Where bf16 has no hardware support
(most laptops: Apple silicon, AVX2-only x86) it is *slower* than fp32, so "auto" keeps fp32 there and results
on those machines are unchanged. ``AGENTLAB_PRECISION=fp32|bf16`` overrides "auto" for every call.

Training in bf16 is mixed precision (``torch.autocast``; fp32 master weights and optimiser state — TRL's own
default, ``GRPOConfig(bf16=True)``). Generation uses a separate bf16 copy of the weights because autocast would
re-cast every frozen weight on every decode step (measured: ~40k casts for 32 tokens at batch 8).
"""

from __future__ import annotations

import os
import weakref

PRECISIONS = ("auto", "fp32", "bf16")


def cpu_has_fast_bf16() -> bool:
    """True when this CPU has bf16 matrix instructions (Intel AMX tiles or AVX512-BF16)."""
    import torch

    try:
        return bool(torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())
    except AttributeError:  # a torch without these probes: assume not
        return False


def resolve(precision: str = "auto") -> str:
    """``"fp32"`` or ``"bf16"`` for a requested precision (``AGENTLAB_PRECISION`` decides an ``"auto"``)."""
    if precision == "auto":
        precision = os.environ.get("AGENTLAB_PRECISION", "auto") or "auto"
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} unknown; expected one of {PRECISIONS}")
    if precision != "auto":
        return precision
    import torch

    return "bf16" if torch.cuda.is_available() or cpu_has_fast_bf16() else "fp32"


class _MergedCopy:
    """A plain bf16 copy of a (possibly LoRA-wrapped) model, refreshed in place from the live weights.

    Written by hand because PEFT's ``merge_and_unload`` changes the model it is given (and must be undone before
    the next optimiser step); here the trained model is never touched. The first ``sync`` pays a deep copy
    (~0.5 s for 135M parameters); later ones only rewrite the LoRA-targeted and trainable weights (~0.1 s).
    """

    def __init__(self, model, dtype):
        import copy

        self.lora = _lora_layers(model)
        source = model.get_base_model() if self.lora is not None else model
        self.model = copy.deepcopy(model).merge_and_unload() if self.lora is not None else copy.deepcopy(model)
        # Forwards patched onto instances (TRL's fused LM head, accelerate's autocast wrapper) are closures over the
        # *original* module, which deepcopy keeps: decoding would silently run the trained fp32 model. Drop them so
        # the copy runs its class's own forward.
        for module in self.model.modules():
            module.__dict__.pop("forward", None)
        self.model.to(dtype).eval().requires_grad_(False)
        self.modules = dict(self.model.named_modules())
        self.params = dict(self.model.named_parameters())
        # trainable weights that are not LoRA factors (modules_to_save, full fine-tuning) are copied on each sync
        self.trainable = [(name, p) for name, p in source.named_parameters()
                          if p.requires_grad and "lora_" not in name and name in self.params]

    def sync(self, model):
        import torch

        with torch.no_grad():
            for name, layer in (self.lora or {}).items():
                weight = layer.get_base_layer().weight
                if not layer.merged:
                    weight = weight + sum(layer.get_delta_weight(a) for a in layer.active_adapters
                                          if a in layer.lora_A)
                self.modules[name].weight.copy_(weight)
            for name, p in self.trainable:
                self.params[name].copy_(p)
        return self.model


def _lora_layers(model) -> dict | None:
    """``{module name in the unwrapped model: LoRA layer}`` for a PEFT LoRA model, else None."""
    try:
        from peft import PeftModel
        from peft.tuners.lora import LoraLayer
    except ImportError:
        return None
    if not isinstance(model, PeftModel):
        return None
    return {name: m for name, m in model.get_base_model().named_modules() if isinstance(m, LoraLayer)}


_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def for_generation(model, precision: str = "auto"):
    """The model to decode with, reflecting ``model``'s weights *now*.

    ``model`` itself when the resolved precision is fp32, the model is not an fp32 CPU model (GPU models are
    bf16 already), or ``precision`` says so; otherwise a cached bf16 copy with any LoRA merged in, re-synced on
    every call. Call it again after the weights change (``run_episodes`` does, once per call)."""
    import torch

    param = next(model.parameters(), None)
    if param is None or param.device.type != "cpu" or param.dtype != torch.float32 or resolve(precision) == "fp32":
        return model
    copy = _COPIES.get(model)
    if copy is None:
        copy = _COPIES[model] = _MergedCopy(model, torch.bfloat16)
    return copy.sync(model)
