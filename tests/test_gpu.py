"""GPU path configuration, checked on CPU: recipe values, vLLM modes, launch configs (async GRPO: test_gpu_async.py).

Execution needs CUDA and the Qwen3-4B weights; those tests carry the ``gpu`` marker and skip cleanly here.
"""

import pytest
import yaml

from agentlab import gpu
from agentlab.engines.vllm import vllm_generate_fn
from agentlab.train import Experiment, grpo_kwargs

RECIPE = "qwen3-4b-instruct-2507"


def test_recipe_mirrors_seed_000():
    fields = gpu.recipe_experiment_fields(RECIPE)
    assert fields["model"] == "Qwen/Qwen3-4B-Instruct-2507"
    assert fields["group_size"] == 8 and fields["max_turns"] == 12 and fields["lora_r"] == 32
    assert fields["beta"] == 0.0 and fields["lr"] == 1e-5
    Experiment(**fields)  # a valid experiment


@pytest.mark.parametrize("mode", ["colocate", "server"])
def test_vllm_modes_give_a_valid_trl_config(mode, tmp_path):
    from trl import GRPOConfig

    exp = Experiment(**gpu.recipe_experiment_fields(RECIPE))
    kwargs = grpo_kwargs(exp, tmp_path, **gpu.grpo_overrides(RECIPE, mode))
    assert kwargs["use_vllm"] and kwargs["vllm_mode"] == mode and kwargs["bf16"]
    assert kwargs["per_device_train_batch_size"] == 8 and kwargs["num_generations"] == 8
    # the recipe's 8 rollouts x 4 accumulation = one generation of 4 groups per optimiser step, trained in 4 passes
    assert exp.groups_per_step == 4 and exp.micro_batch == 8 and exp.eval_every == 20
    assert kwargs["gradient_accumulation_steps"] == kwargs["steps_per_generation"] == 4
    assert kwargs["save_steps"] == 20
    if mode == "server":
        assert kwargs["vllm_server_port"] == 8000
    else:
        assert kwargs["vllm_gpu_memory_utilization"] == 0.45
    # every key is a real GRPOConfig field (bf16 needs a GPU, so it is switched off for construction here)
    cfg = GRPOConfig(**{**kwargs, "bf16": False, "use_cpu": True})
    assert cfg.use_vllm and cfg.vllm_mode == mode


def test_the_recipe_on_three_processes_keeps_its_per_device_batch(tmp_path, monkeypatch):
    """Launched on 3 training GPUs, each device still runs the recipe's 4 groups of 8 a step: 12 groups a step."""
    monkeypatch.setenv("WORLD_SIZE", "3")
    exp = Experiment(**gpu.recipe_experiment_fields(RECIPE))
    kwargs = grpo_kwargs(exp, tmp_path, **gpu.grpo_overrides(RECIPE, "server"))
    assert exp.groups_per_step == 12
    assert (kwargs["per_device_train_batch_size"], kwargs["gradient_accumulation_steps"]) == (8, 4)


@pytest.mark.parametrize("name, kind, stage", [("multi_gpu", "MULTI_GPU", None), ("zero2", "DEEPSPEED", 2),
                                              ("zero3", "DEEPSPEED", 3)])
def test_accelerate_launch_configs(name, kind, stage):
    cfg = yaml.safe_load(gpu.accelerate_config(name).read_text())
    assert cfg["distributed_type"] == kind and cfg["mixed_precision"] == "bf16"
    if stage:
        assert cfg["deepspeed_config"]["zero_stage"] == stage
    with pytest.raises(ValueError, match="available"):
        gpu.accelerate_config("fsdp9")


@pytest.mark.gpu
def test_unsloth_loads_the_recipe_on_cuda():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from agentlab.models import load_policy

    _, tok = load_policy("Qwen/Qwen3-4B-Instruct-2507", loader="unsloth", recipe=RECIPE)
    assert tok.padding_side == "left"


def test_vllm_turns_are_capped_at_the_source():
    """vLLM is asked for at most one turn's tokens per call (not the run's whole budget), then restored."""
    from types import SimpleNamespace

    seen = []

    class Engine:
        max_completion_length = 8192

        def generate(self, prompts, images, num_generations):
            seen.append(self.max_completion_length)
            return None, [[5] * 200 for _ in prompts], None, None

    trainer = SimpleNamespace(vllm_generation=Engine(), processing_class=SimpleNamespace(eos_token_id=2))
    out = vllm_generate_fn(trainer, max_new_tokens=48)([[1, 2, 3], [4]])
    assert seen == [48] and trainer.vllm_generation.max_completion_length == 8192
    assert [len(o) for o in out] == [48, 48]


def test_vllm_logprobs_reach_trl_aligned_with_the_completion(tiny, tmp_path):
    """TRL's importance-sampling correction for vLLM generation (on by default) subtracts the sampler's log-probs
    from the trainer's: our rollout must hand them over, one per completion token (tool-result tokens 0.0, as TRL's
    own tool loop fills them), not ``None``. The stand-in engine answers the way TRL's ``vllm_generation.generate``
    does: ``(prompt_ids, completion_ids, logprobs[row][token][rank], token_ids)``."""
    from types import SimpleNamespace

    from agentlab.engines.scripted import scripted_generate_fn
    from agentlab.envs import load
    from agentlab.rollout import Renderer
    from agentlab.runs import RunDir
    from agentlab.train import Experiment, _StepStats, make_rollout_func

    model, tok = tiny
    spec = load("lookup")
    tasks = spec.make_tasks("train", 2, seed=0)
    renderer = Renderer(tok, spec.env_class)
    expert = scripted_generate_fn(renderer, tasks, spec.expert)

    class Engine:
        max_completion_length = 1024

        def generate(self, prompts, images, num_generations):
            ids = expert(prompts)
            return prompts, ids, [[[-0.25 - 0.01 * i] for i in range(len(row))] for row in ids], None

    exp = Experiment(env="lookup", model="tiny-random", groups_per_step=2, group_size=2)
    trainer = SimpleNamespace(vllm_generation=Engine(), use_vllm=True, processing_class=tok, model=model,
                              state=SimpleNamespace(global_step=0),
                              accelerator=SimpleNamespace(process_index=0, is_main_process=True, unwrap_model=lambda m: m))
    stats = _StepStats()
    out = make_rollout_func(spec, tok, tasks, exp, RunDir(tmp_path), stats)(
        [renderer.grpo_row(t)["prompt"] for t in tasks for _ in range(2)], trainer)
    assert out["logprobs"] is not None and len(out["logprobs"]) == 4
    for lps, ids, mask in zip(out["logprobs"], out["completion_ids"], out["env_mask"], strict=True):
        assert len(lps) == len(ids) == len(mask)
        assert all(lp == 0.0 for lp, m in zip(lps, mask) if not m) and all(lp < 0 for lp, m in zip(lps, mask) if m)
    assert all(ep.success == 1.0 for ep in stats.episodes)


def test_unsloth_with_an_init_adapter_trains_that_one_lora(tmp_path):
    """With Unsloth, the loader applies the SFT start as the one trainable LoRA; run_grpo must not wrap a second
    LoRA around it (it did: load_unsloth added the recipe's LoRA, then PeftModel.from_pretrained wrapped another).
    The stand-in loader does what load_unsloth does, on the tiny CPU model."""
    from peft import PeftModel, get_peft_model
    from safetensors import safe_open

    from agentlab.envs import load
    from agentlab.experiment import lora_config
    from agentlab.models import load_policy
    from agentlab.runs import RunDir
    from agentlab.train import run_grpo

    init = tmp_path / "init"
    get_peft_model(load_policy("tiny-random")[0], lora_config(4)).save_pretrained(init)
    calls = []

    def loader(name, loader, recipe, adapter=None):
        calls.append((loader, adapter))
        model, tok = load_policy("tiny-random")
        return (PeftModel.from_pretrained(model, str(adapter), is_trainable=True) if adapter else model), tok

    spec = load("lookup")
    exp = Experiment(name="unsloth-stand-in", model="tiny-random", env="lookup", steps=1, eval_every=1, eval_tasks=2,
                     groups_per_step=1, group_size=2, max_new_tokens=8, lora_r=4)
    run = run_grpo(exp, spec.make_tasks("train", 4), spec.make_tasks("validation", 2), init_adapter=init,
                   run=RunDir(tmp_path / "run"), loader="unsloth", load_fn=loader)
    assert calls == [("unsloth", init)]

    def lora_keys(folder):
        with safe_open(str(folder / "adapter_model.safetensors"), "pt") as f:
            return sorted(f.keys())
    assert lora_keys(run.path / "adapter") == lora_keys(init)  # the same one LoRA, trained; no LoRA inside a LoRA
