"""max_staleness on GPUs: TRL's AsyncGRPOTrainer built for our experiments and environments, checked on CPU.

TRL's trainer is constructed for real on the tiny model (its rollout worker and weight transfer replaced through
its own injection points; the CUDA device-name query behind its FLOPs meter stubbed): what is checked is what we
hand it. It cannot generate here (that needs a vLLM server).
"""

import pickle
import queue

import pytest

from agentlab.envs import load
from agentlab.experiment import Experiment
from agentlab.gpu import recipe_experiment_fields
from agentlab.gpu_async import ScoredEnv, async_kwargs, build_async_trainer, check, refusals, server_url
from agentlab.models import vllm_settings
from agentlab.rewards import Reward, parse_reward
from agentlab.types import Episode

RECIPE = "qwen3-4b-instruct-2507"


class StandInWorker:  # TRL's RolloutWorkerProtocol, without a vLLM server
    def __init__(self):
        self.rollout_buffer = queue.Queue()

    def start(self): ...
    def stop(self): ...
    def update_model_version(self, version): ...
    def check_health(self, stale_after_s): ...


class StandInTransfer:  # TRL's WeightTransferProtocol
    def init_weight_transfer(self): ...
    def pause(self): ...
    def send_weights(self, iterator): ...
    def resume(self): ...
    def destroy(self): ...


def test_the_recipe_maps_onto_trls_async_config(tmp_path):
    from trl.experimental.async_grpo import AsyncGRPOConfig

    exp = Experiment(env="product_finder", max_staleness=2, **recipe_experiment_fields(RECIPE))
    url = server_url(vllm_settings(RECIPE, "server"))
    cfg = AsyncGRPOConfig(**{**async_kwargs(exp, tmp_path, url), "bf16": False, "use_cpu": True})
    assert url == "http://127.0.0.1:8000" and cfg.vllm_server_base_url == url
    # 32 rollouts a step (4 groups of G = 8), in passes of 8, as the synchronous GRPOConfig has them
    assert (cfg.max_staleness, cfg.num_generations, cfg.per_device_train_batch_size,
            cfg.gradient_accumulation_steps) == (2, 8, 8, 4)
    assert (cfg.learning_rate, cfg.max_tool_calling_iterations, cfg.temperature, cfg.save_steps) == (1e-5, 12, 1.0, 20)
    assert cfg.max_completion_length == exp.max_new_tokens  # a turn's tokens: vLLM's max_tokens per request
    with pytest.raises(ValueError, match="vLLM server"):
        server_url(vllm_settings(RECIPE, "colocate"))


@pytest.mark.parametrize("change, reason", [
    ({"beta": 0.04}, "reference model"),
    ({"loss_type": "grpo"}, "one loss"),
    ({"reward": "success=1,off_form=-0.1"}, "read the turns"),
    ({"reward": lambda ep: 1.0}, "callable reward"),
    ({"reward": Reward({"success": 1.0, "own": lambda ep: 0.5})}, "callable reward"),
])
def test_what_the_async_trainer_cannot_run_is_refused_before_any_work(change, reason, tmp_path):
    exp = Experiment(env="lookup", max_staleness=1, **change)
    assert any(reason in r for r in refusals(exp))
    with pytest.raises(ValueError, match=reason):
        check(exp)
    # run_grpo hands a vLLM run with max_staleness to TRL's async trainer, which refuses it before any folder
    from agentlab.runs import RunDir
    from agentlab.train import run_grpo

    run = RunDir("x", root=tmp_path)
    with pytest.raises(ValueError, match=reason):
        run_grpo(exp, [], [], run=run, trainer_overrides=vllm_settings(RECIPE, "server"))
    assert not run.path.exists()
    assert refusals(Experiment(env="doc_search", max_staleness=1, reward="f4=1,empty=-0.2")) == []


def test_the_environment_factory_scores_with_the_runs_reward_in_a_spawned_process():
    spec = load("doc_search")
    task = spec.make_tasks("train", 1, seed=0)[0]
    reward = parse_reward("f1=1,empty=-0.2")
    factory = pickle.loads(pickle.dumps(ScoredEnv(spec.env_class, reward)))  # what TRL's spawn does to it
    env = factory()
    env.reset(task=task.to_json())
    policy = spec.expert(task)
    result = None
    try:
        while True:
            call = policy.send(result)
            result = getattr(env, call.name)(**call.arguments)
    except StopIteration:
        pass
    ep = Episode(task=task, outcome=env.outcome, metrics=spec.evaluate(task, env.outcome))
    assert env.get_reward() == pytest.approx(reward(ep)[0])
    default = ScoredEnv(spec.env_class)()  # no reward: the environment's default (F4, the empty-set penalty)
    default.reset(task=task.to_json())
    assert default.get_reward() == pytest.approx(spec.default_reward(Episode(task=task, metrics=spec.evaluate(
        task, default.outcome)))[0]) == -0.2


def test_trls_async_trainer_is_built_on_our_environment(tiny, tmp_path, monkeypatch):
    import trl.experimental.async_grpo.async_grpo_trainer as async_trainer

    monkeypatch.setattr(async_trainer, "get_peak_flops_per_device", lambda *args: 1.0)  # asks CUDA for its name
    model, tok = tiny
    model.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    exp = Experiment(env="doc_search", max_staleness=1, group_size=2, groups_per_step=2, steps=2, lora_r=4,
                     reward="f4=1,empty=-0.2", precision="fp32")
    tasks = load("doc_search").make_tasks("train", 3, seed=0)
    worker = StandInWorker()
    trainer = build_async_trainer(exp, tasks, tmp_path / "base", tok, tmp_path / "out", "http://127.0.0.1:8000",
                                  rollout_worker=worker, weight_transfer=StandInTransfer())
    assert trainer.rollout_worker is worker and trainer.args.max_staleness == 1 and trainer.args.max_steps == 2
    assert type(trainer.model).__name__.startswith("PeftModel")  # a fresh LoRA, r as configured
    assert trainer.model.peft_config["default"].r == 4
    rows = trainer.train_dataset
    assert len(rows) == 3 and rows[0]["prompt"][0]["role"] == "system"
    assert rows[0]["task"] == tasks[0].to_json()
