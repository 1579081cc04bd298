"""bf16 on CPU (agentlab.precision) and the memory savers of the training forward: each checked against what the
model computes from scratch in fp32, with the tolerance stated."""

import pytest

from agentlab.envs import load

SPEC = load("lookup")


def test_resolve_honours_request_and_environment(monkeypatch):
    from agentlab.precision import cpu_has_fast_bf16, resolve

    monkeypatch.delenv("AGENTLAB_PRECISION", raising=False)
    assert resolve("fp32") == "fp32" and resolve("bf16") == "bf16"
    import torch

    if not torch.cuda.is_available():
        assert resolve("auto") == ("bf16" if cpu_has_fast_bf16() else "fp32")
    monkeypatch.setenv("AGENTLAB_PRECISION", "fp32")
    assert resolve("auto") == "fp32" and resolve("bf16") == "bf16"  # the variable decides "auto" only
    with pytest.raises(ValueError, match="fp16"):
        resolve("fp16")


def _lora_model(tiny):
    import copy

    import torch
    from peft import get_peft_model
    from trl.trainer.utils import add_fused_lm_head

    from agentlab.train import lora_config

    base, tok = tiny
    base = copy.deepcopy(base)
    add_fused_lm_head(base)  # as GRPOTrainer does: the copy must not run through this patched forward
    model = get_peft_model(base, lora_config(4))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return model, tok


def test_generation_copy_follows_the_trained_weights(tiny):
    """The merged copy computes what the LoRA model computes (fp32 copy: 1e-5), goes stale when the LoRA weights
    change, and matches again after ``sync`` — so a step never decodes with last step's policy."""
    import torch

    from agentlab.engines.weights import MergedCopy

    model, _ = _lora_model(tiny)
    ids = torch.randint(0, 200, (2, 12))
    copy = MergedCopy(model, torch.float32)
    gen = copy.sync(model)
    with torch.no_grad():
        assert torch.allclose(gen(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5)
        for name, p in model.named_parameters():  # an optimiser step
            if "lora_" in name:
                p.add_(torch.randn_like(p) * 0.05)
        fresh = model(input_ids=ids).logits
        assert not torch.allclose(gen(input_ids=ids).logits, fresh, atol=1e-3)  # stale until synced
        assert torch.allclose(copy.sync(model)(input_ids=ids).logits, fresh, atol=1e-5)


def test_bf16_generation_copy_is_close_to_fp32(tiny):
    """``for_generation(model, "bf16")`` decodes with bf16 weights: its next-token log-probs stay within 0.05 nats
    of the fp32 LoRA model's (tiny model; the real one is checked in benchmarks/precision.py)."""
    import torch

    from agentlab.engines.weights import for_generation

    model, _ = _lora_model(tiny)
    assert for_generation(model, "fp32") is model
    gen = for_generation(model, "bf16")
    assert next(gen.parameters()).dtype == torch.bfloat16
    assert for_generation(model, "bf16") is gen  # cached per model
    ids = torch.randint(0, 200, (2, 16))
    with torch.no_grad():
        ref = model(input_ids=ids).logits.log_softmax(-1)
        got = gen(input_ids=ids).logits.float().log_softmax(-1)
    assert (got - ref).abs().max() < 0.05


def test_checkpointed_bf16_training_forward_matches_fp32_from_scratch(tiny, scripted_batch):
    """The training forward as GRPO runs it on a bf16 CPU — shared prefix, checkpointed layers, autocast — gives
    the per-token log-probs of the plain fp32 forward within 0.02 nats, and checkpointing alone changes nothing
    (fp32: log-probs 1e-5, gradients 1e-5 absolute / 1e-3 relative)."""
    import torch

    from agentlab.trl_compat import shared_prefix_logps

    model, tok = _lora_model(tiny)
    model.train()
    ids, mask, C = scripted_batch(tok, SPEC.make_tasks("train", 3, seed=4))
    keep = mask[:, -C:].bool()

    def run(checkpoint: bool, bf16: bool):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logps, _ = shared_prefix_logps(model, ids, mask, C, checkpoint=checkpoint)
        (logps * keep).sum().backward()
        return logps.detach().float(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    plain, plain_grads = run(checkpoint=False, bf16=False)
    ckpt, ckpt_grads = run(checkpoint=True, bf16=False)
    assert torch.allclose(ckpt[keep], plain[keep], atol=1e-5)
    for name, g in plain_grads.items():
        assert torch.allclose(ckpt_grads[name], g, atol=1e-5, rtol=1e-3), name
    # from scratch: the whole sequence through the model, no cache, no checkpointing, fp32
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, fused_lm_head=False).logits[:, -C - 1:-1]
        scratch = logits.log_softmax(-1).gather(-1, ids[:, -C:, None])[..., 0]
    assert torch.allclose(plain[keep], scratch[keep], atol=1e-4)
    fast, _ = run(checkpoint=True, bf16=True)
    assert (fast[keep] - scratch[keep]).abs().max() < 0.02
    # the layers' own checkpointing settings are back afterwards
    from transformers.modeling_layers import GradientCheckpointingLayer

    assert not any(m.gradient_checkpointing for m in model.modules() if isinstance(m, GradientCheckpointingLayer))


def test_micro_batches_divide_the_step():
    from agentlab.train import Experiment, grpo_kwargs, micro_batch_size

    assert [micro_batch_size(8, k) for k in (0, 1, 3, 4, 8, 16)] == [8, 1, 2, 4, 8, 8]
    assert micro_batch_size(12, 5) == 4
    kw = grpo_kwargs(Experiment(groups_per_step=2, group_size=4, micro_batch=4), "/tmp/x")
    assert (kw["per_device_train_batch_size"], kw["gradient_accumulation_steps"], kw["steps_per_generation"]) == (4, 2, 2)
    with pytest.raises(ValueError, match="micro_batch"):
        Experiment(micro_batch=-1)


def test_shared_prefix_survives_transformers_gradient_checkpointing(tiny, scripted_batch):
    """The GPU recipe turns on transformers' gradient checkpointing, which drops any KV cache passed to a layer:
    the shared prefix must still be encoded and seen (log-probs = the from-scratch forward's, fp32, 1e-4), and the
    model's own checkpointing setting must be back afterwards."""
    import torch

    from agentlab.trl_compat import shared_prefix_logps

    model, tok = _lora_model(tiny)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    ids, mask, C = scripted_batch(tok, SPEC.make_tasks("train", 3, seed=5))
    keep = mask[:, -C:].bool()
    logps, _ = shared_prefix_logps(model, ids, mask, C)
    logps.sum().backward()  # the checkpointed replay runs too
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, fused_lm_head=False).logits[:, -C - 1:-1]
        scratch = logits.log_softmax(-1).gather(-1, ids[:, -C:, None])[..., 0]
    assert torch.allclose(logps.detach()[keep], scratch[keep], atol=1e-4)
    from transformers.modeling_layers import GradientCheckpointingLayer

    assert all(m.gradient_checkpointing for m in model.modules() if isinstance(m, GradientCheckpointingLayer))


def test_a_model_off_the_cpu_decodes_from_the_bf16_copy_too(tiny):
    """On CUDA the trainer's model carries accelerate's autocast wrapper, which ``generate`` bypasses: decoding it
    directly mixed bf16 and fp32 in one cache (seen on an H200). An fp32 model anywhere decodes from the copy (a
    model on the meta device stands in for one on a GPU here); a bf16 one is used as it is."""
    import copy

    import torch

    from agentlab.engines.weights import for_generation

    model = copy.deepcopy(tiny[0]).to("meta")
    decoding = for_generation(model, "bf16")
    assert decoding is not model and next(decoding.parameters()).dtype == torch.bfloat16
    half = model.to(torch.bfloat16)
    assert for_generation(half, "bf16") is half
