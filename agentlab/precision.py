"""Numeric precision on CPU: bf16 where the CPU multiplies bf16 in hardware, fp32 everywhere else.

    from agentlab.precision import resolve
    resolve("auto")            # "bf16" on CUDA or on a CPU with AMX / AVX512-BF16, else "fp32"

Why: the CPUs we measured on (Xeon with AMX, 2 cores) multiply a 512x576 by 576x1536 matrix in 2.96 ms in fp32
and 0.45 ms in bf16; a prefill of 8 x 400 tokens through SmolLM2-135M takes 5.4 s in fp32 with LoRA and 1.0 s in
bf16 with the LoRA merged (``benchmarks/`` has the step-level numbers). Where bf16 has no hardware support
(most laptops: Apple silicon, AVX2-only x86) it is *slower* than fp32, so "auto" keeps fp32 there and results
on those machines are unchanged. ``AGENTLAB_PRECISION=fp32|bf16`` overrides "auto" for every call.

Training in bf16 is mixed precision (``torch.autocast``; fp32 master weights and optimiser state — TRL's own
default, ``GRPOConfig(bf16=True)``). Generation uses a separate bf16 copy of the weights
(``agentlab.engines.weights.for_generation``) because autocast would re-cast every frozen weight on every decode
step (measured: ~40k casts for 32 tokens at batch 8).
"""

from __future__ import annotations

import os

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
