"""Each environment class runs unchanged under TRL's own GRPOTrainer(environment_factory=...) tool loop.

The tiny random model cannot call tools, so TRL's generation is replaced by the scripted expert's tokens: what
is tested is TRL driving our environment classes (tool discovery, schemas, reset, calls, get_reward) for one
real optimiser step.
"""

import pytest
from datasets import Dataset

from agentlab.engines.scripted import scripted_generate_fn
from agentlab.envs import load, names
from agentlab.rollout import Renderer


@pytest.mark.parametrize("env_name", names())
def test_one_grpo_step_with_trl_environment_factory(env_name, tiny, tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    model, tok = tiny
    spec = load(env_name)
    tasks = spec.make_tasks("train", 2, seed=0)
    renderer = Renderer(tok, spec.env_class)
    rows = [{"prompt": renderer.messages(t), "task": t.to_json()} for t in tasks]
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, num_generations=2, per_device_train_batch_size=2,
                      max_completion_length=2048, max_tool_calling_iterations=6, max_steps=1, report_to=[],
                      logging_steps=1, save_strategy="no", gradient_checkpointing=False)
    trainer = GRPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok,
                          environment_factory=spec.env_class)  # reward: the environment's own get_reward
    scripted = scripted_generate_fn(renderer, tasks, spec.expert)
    trainer._generate_single_turn = lambda prompt_ids, *a, **k: (scripted([list(p) for p in prompt_ids]), None)
    trainer.train()
    logs = next(h for h in trainer.state.log_history if "reward" in h)
    assert trainer.state.global_step == 1
    assert logs["tools/call_frequency"] >= 2 and logs["tools/failure_frequency"] == 0
    assert logs["reward"] > 0  # the scripted expert solves its tasks, scored by the environment
    assert sorted(trainer._env_tools[None], key=lambda f: f.__name__) == trainer._env_tools[None]
