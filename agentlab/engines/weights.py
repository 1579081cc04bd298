"""The weights a torch engine decodes with: a bf16 copy of the policy (LoRA merged in) where the CPU has bf16.

    from agentlab.engines.weights import for_generation
    fast = for_generation(model)  # a bf16 copy (LoRA merged in), or ``model`` itself

Why a copy: ``agentlab.precision`` explains (autocast would re-cast every frozen weight on every decode step); the
llama.cpp engine exports the same weights (``engines/llamacpp.py``).
"""

from __future__ import annotations

import weakref

from agentlab.precision import resolve
from agentlab.trl_compat import drop_instance_forwards


class MergedCopy:
    """A plain bf16 copy of a (possibly LoRA-wrapped) model, refreshed in place from the live weights.

    Written by hand because PEFT's ``merge_and_unload`` changes the model it is given (and must be undone before
    the next optimiser step); here the trained model is never touched. The first ``sync`` pays a deep copy
    (~0.5 s for 135M parameters); later ones only rewrite the LoRA-targeted and trainable weights (~0.1 s).
    """

    def __init__(self, model, dtype):
        import copy

        self.lora = lora_layers(model)
        source = model.get_base_model() if self.lora is not None else model
        self.model = copy.deepcopy(model).merge_and_unload() if self.lora is not None else copy.deepcopy(model)
        drop_instance_forwards(self.model)  # else the copy would decode with the trained fp32 model (trl_compat)
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


def lora_layers(model) -> dict | None:
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

    ``model`` itself when the resolved precision is fp32 or the model is not fp32 (Unsloth's GPU models are bf16
    already); otherwise a cached bf16 copy with any LoRA merged in, re-synced on every call. Call it again after
    the weights change (``run_episodes`` does, once per call).

    On CUDA too (found on the first GPU run): the trainer's model carries accelerate's autocast wrapper on its
    forward, which ``generate`` bypasses, so a prefix encoded through the wrapper (bf16 values) and tokens decoded
    without it (fp32) met in one cache and attention refused the mixed dtypes. The copy has no wrapper."""
    import torch

    param = next(model.parameters(), None)
    if param is None or param.dtype != torch.float32 or resolve(precision) == "fp32":
        return model
    copy = _COPIES.get(model)
    if copy is None:
        copy = _COPIES[model] = MergedCopy(model, torch.bfloat16)
    return copy.sync(model)
