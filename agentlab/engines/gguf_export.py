"""Our policy's weights as a GGUF file, for llama.cpp (``agentlab.engines.llamacpp``), bit for bit.

    export_gguf(model, smollm2_gguf_path(), "policy.gguf")   # tokenizer and template from the shipped GGUF

Why by hand: llama.cpp's ``convert_hf_to_gguf.py`` is a script of its repository (no installed package ships it)
and reads a saved Hugging Face folder: every GRPO update would write the weights twice. ``gguf`` (the package
transformers reads GGUF with) writes the file; this module maps names, restores llama.cpp's q/k layout and writes
the model's own hyperparameters beside the source file's tokenizer.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

# llama.cpp's LLaMA layout rotates q/k heads in interleaved pairs where transformers rotates halves; transformers'
# GGUF loader undoes this on load (``reverse_permute``), the export redoes it (as llama.cpp's convert_hf_to_gguf does).


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def export_gguf(model, source_gguf: str | Path, path: str | Path) -> Path:
    """Write ``model``'s weights (a plain LLaMA-architecture transformers model, fp32 or bf16) as a GGUF file with
    ``source_gguf``'s tokenizer and chat template and the model's own hyperparameters. bf16 weights are stored as
    BF16 and fp32 as F32, so llama.cpp reads exactly the numbers torch decodes with; 1-D weights (norms) as F32,
    as llama.cpp expects (exact for bf16 values)."""
    import gguf
    import torch

    arch, fields = _source_metadata(str(source_gguf))
    if arch != "llama":
        raise ValueError(f"export_gguf writes LLaMA-architecture models; {source_gguf} is {arch!r}")
    cfg = model.config
    n_head, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    state = model.state_dict()
    dtypes = {t.dtype for t in state.values() if t.is_floating_point()}
    if not dtypes <= {torch.float32, torch.bfloat16} or len(dtypes) != 1:
        raise ValueError(f"export_gguf takes an all-fp32 or all-bf16 model, got {sorted(map(str, dtypes))}")
    bf16 = dtypes == {torch.bfloat16}
    path = Path(path)
    writer = _writer_class()(str(path), arch)
    ours = _hyperparameters(cfg)
    for key, value, vtype, sub in fields:
        if key.removeprefix("llama.") not in ours:
            writer.add_key_value(key, value, vtype, sub_type=sub)
    for key, (value, vtype) in ours.items():  # the model's own shape (a smaller test model shares the tokenizer)
        writer.add_key_value(f"llama.{key}", value, vtype)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16 if bf16 else gguf.LlamaFileType.ALL_F32)
    tied = getattr(cfg, "tie_word_embeddings", False)
    for hf_name, tensor in state.items():
        if tied and hf_name == "lm_head.weight":
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ValueError(f"export_gguf: no GGUF name for {hf_name!r}")
        t = tensor.detach()
        if hf_name.endswith("q_proj.weight"):
            t = torch.from_numpy(_permute(t.view(torch.int16).numpy() if bf16 else t.numpy(), n_head)).view(t.dtype)
        elif hf_name.endswith("k_proj.weight"):
            t = torch.from_numpy(_permute(t.view(torch.int16).numpy() if bf16 else t.numpy(), n_kv)).view(t.dtype)
        if t.dim() == 1 or not bf16:
            writer.add_tensor(name, t.float().contiguous().numpy())
        else:
            writer.add_tensor(name, t.contiguous().view(torch.int16).numpy().view(np.uint16),
                              raw_dtype=gguf.GGMLQuantizationType.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _hyperparameters(cfg) -> dict:
    """GGUF's LLaMA hyperparameters from a transformers config: ``{key after "llama.": (value, type)}``."""
    import gguf

    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"export_gguf writes plain RoPE; this model scales it ({rope})")
    theta = getattr(cfg, "rope_theta", None) or rope["rope_theta"]
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    u32, f32 = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32
    return {"block_count": (cfg.num_hidden_layers, u32), "context_length": (cfg.max_position_embeddings, u32),
            "embedding_length": (cfg.hidden_size, u32), "feed_forward_length": (cfg.intermediate_size, u32),
            "attention.head_count": (cfg.num_attention_heads, u32),
            "attention.head_count_kv": (cfg.num_key_value_heads, u32), "rope.freq_base": (float(theta), f32),
            "attention.layer_norm_rms_epsilon": (float(cfg.rms_norm_eps), f32), "vocab_size": (cfg.vocab_size, u32),
            "rope.dimension_count": (head_dim, u32)}


@functools.cache
def _writer_class():
    """``gguf.GGUFWriter`` that packs each long array value once per process: the 49k-token vocabulary and its
    merges took 0.6 s of a 0.8 s export, on every GRPO update."""
    import gguf

    packed: dict[int, tuple] = {}

    class Writer(gguf.GGUFWriter):
        def _pack_val(self, val, vtype, add_vtype, sub_type=None):
            if not (isinstance(val, list) and len(val) > 1000):
                return super()._pack_val(val, vtype, add_vtype, sub_type)
            hit = packed.get(id(val))
            if hit is None or hit[0] is not val or hit[1] != (vtype, add_vtype, sub_type):
                hit = packed[id(val)] = (val, (vtype, add_vtype, sub_type),
                                         super()._pack_val(val, vtype, add_vtype, sub_type))
            return hit[2]

    return Writer


@functools.lru_cache(maxsize=4)
def _source_metadata(source_gguf: str) -> tuple[str, list]:
    """The source GGUF's architecture and key/values (its 49k-token vocabulary takes ~2 s to parse: once)."""
    import gguf

    reader = gguf.GGUFReader(source_gguf)
    fields = []
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue
        vtype = field.types[0]
        fields.append((key, field.contents(), vtype, field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None))
    return reader.fields["general.architecture"].contents(), fields
