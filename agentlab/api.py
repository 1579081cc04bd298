"""The notebooks' one door: every name the tutorial uses, importable from here.

    from agentlab.api import Experiment, run_grpo, evaluate, plot_training

Names resolve lazily (PEP 562): importing this module imports nothing heavy; a name's home module is imported the
first time the name is used, so a notebook pays for torch only when it trains or evaluates. The table below is the
public surface a notebook may rely on; where a name lives may change behind it.
"""

from __future__ import annotations

import importlib

HOMES = {
    # agentlab.carry
    "unpack": "agentlab.carry",
    # agentlab.compare, agentlab.demos (your own task: demonstrations a user brings, the comparison)
    "CompareConfig": "agentlab.compare",
    "run_compare": "agentlab.compare",
    "load_demos": "agentlab.demos",
    "replay": "agentlab.demos",
    "resolve_env": "agentlab.pipeline",
    # agentlab.envs
    "load": "agentlab.envs",
    "names": "agentlab.envs",
    "register": "agentlab.envs",
    # agentlab.envs.doc_search
    "noisy_expert": "agentlab.envs.doc_search",
    # agentlab.envs.lookup
    "LookupEnv": "agentlab.envs.lookup",
    # agentlab.evals
    "best_of_n": "agentlab.evals",
    "failure_breakdown": "agentlab.evals",
    "mean_ci": "agentlab.evals",
    "paired_bootstrap_ci": "agentlab.evals",
    "pass_at_k": "agentlab.evals",
    "pass_at_k_curve": "agentlab.evals",
    "per_task": "agentlab.evals",
    "predicted_zero_variance": "agentlab.evals",
    "read_rollouts": "agentlab.evals",
    "rescore_infra": "agentlab.evals",
    "summarize": "agentlab.evals",
    "write_episode": "agentlab.evals",
    "zero_variance_share": "agentlab.evals",
    # agentlab.explore
    "episode_html": "agentlab.explore",
    "groups_of": "agentlab.explore",
    # agentlab.faults
    "inject_faults": "agentlab.faults",
    # agentlab.gpu
    "grpo_overrides": "agentlab.gpu",
    "recipe_experiment_fields": "agentlab.gpu",
    # agentlab.hints
    "HintSchedule": "agentlab.hints",
    "observer": "agentlab.hints",
    # agentlab.machine
    "made_on": "agentlab.machine",
    # agentlab.models
    "load_policy": "agentlab.models",
    "load_recipe": "agentlab.models",
    # agentlab.notebook
    "setup_notebook": "agentlab.notebook",
    "notebook_header": "agentlab.notebook",
    # agentlab.paths
    "runs_dir": "agentlab.paths",
    "shown": "agentlab.paths",
    # agentlab.pipeline
    "evaluate": "agentlab.pipeline",
    "load_split": "agentlab.pipeline",
    "print_summary": "agentlab.pipeline",
    "synth": "agentlab.pipeline",
    # agentlab.plots
    "RUN_METRICS": "agentlab.plots",
    "plot_objective": "agentlab.plots_grpo",
    "plot_async": "agentlab.plots_grpo",
    "plot_report": "agentlab.plots",
    "plot_pass_at_k": "agentlab.plots",
    "plot_failures": "agentlab.plots",
    "plot_rewards": "agentlab.plots",
    "plot_runs": "agentlab.plots",
    "plot_seeds": "agentlab.plots",
    "plot_training": "agentlab.plots",
    "success_bars": "agentlab.plots",
    "metric_groups": "agentlab.plots",
    # agentlab.quickstart
    "QuickstartConfig": "agentlab.quickstart",
    "report_spread": "agentlab.quickstart",
    "seed_spread": "agentlab.quickstart",
    "spread_text": "agentlab.quickstart",
    "run_quickstart": "agentlab.quickstart",
    # agentlab.reward_design
    "episode_advantages": "agentlab.reward_design",
    "group_advantages": "agentlab.reward_design",
    "probe_report": "agentlab.reward_design",
    "rescore": "agentlab.reward_design",
    "scripted_episode": "agentlab.reward_design",
    # agentlab.rewards
    "Reward": "agentlab.rewards",
    "compose": "agentlab.rewards",
    "fbeta": "agentlab.rewards",
    "off_form_calls": "agentlab.rewards",
    "save_reward": "agentlab.rewards",
    "load_reward": "agentlab.rewards",
    # agentlab.rollout
    "LoopConfig": "agentlab.rollout",
    "run_episodes": "agentlab.rollout",
    # agentlab.runs
    "RunDir": "agentlab.runs",
    # agentlab.scaffolds
    "grounded": "agentlab.scaffolds",
    "parallel_best_of_n": "agentlab.scaffolds",
    "sequential_refinement": "agentlab.scaffolds",
    # agentlab.sweeps
    "final_success": "agentlab.sweeps",
    "load_run": "agentlab.sweeps",
    "load_seeded": "agentlab.sweeps",
    "load_sweep": "agentlab.sweeps",
    "plan": "agentlab.sweeps",
    "run_sweep": "agentlab.sweeps",
    "select": "agentlab.sweeps",
    "select_seeds": "agentlab.sweeps",
    # agentlab.synth
    "audit_splits": "agentlab.synth",
    "build_splits": "agentlab.synth",
    "expert_demos": "agentlab.synth",
    "load_tasks": "agentlab.synth",
    "regime_demos": "agentlab.synth",
    "save_splits": "agentlab.synth",
    "tokenize_demos": "agentlab.synth",
    "tool_schemas": "agentlab.synth",
    # agentlab.train
    "Experiment": "agentlab.train",
    "SFTSettings": "agentlab.train",
    "run_grpo": "agentlab.train",
    "run_sft": "agentlab.train",
    # agentlab.types
    "EnvSpec": "agentlab.types",
    "Episode": "agentlab.types",
    "Task": "agentlab.types",
    "ToolCall": "agentlab.types",
    "ToolEnv": "agentlab.types",
    "Turn": "agentlab.types",
    "call_tool": "agentlab.types",
    "run_policy": "agentlab.types",
    "seeded_rng": "agentlab.types",
    "tool": "agentlab.types",
    "tool_names": "agentlab.types",
}

__all__ = sorted(HOMES)  # noqa: PLE0605 (a list, built from the one table)


def __getattr__(name: str):
    if name not in HOMES:
        raise AttributeError(f"agentlab.api has no {name!r}; the notebooks' names: {', '.join(__all__)}")
    value = getattr(importlib.import_module(HOMES[name]), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return __all__
