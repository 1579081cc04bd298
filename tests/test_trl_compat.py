"""The one door to TRL's internals: its version check, and the fallback to TRL's own code paths when forced."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentlab import trl_compat
from agentlab.envs import load
from agentlab.runs import RunDir
from agentlab.train import Experiment, run_grpo

LOOKUP = load("lookup")


def test_checked_versions_are_the_pinned_ones():
    """CHECKED must follow pyproject.toml's pins: a pin raised without re-checking the couplings fails here."""
    pins = (Path(__file__).parent.parent / "pyproject.toml").read_text()
    for name, version in trl_compat.CHECKED.items():
        assert f'"{name}=={version}"' in pins
    assert trl_compat.mismatched() == {} and trl_compat.COMPATIBLE


def test_a_different_minor_version_is_reported(monkeypatch):
    monkeypatch.setattr(trl_compat, "version", lambda name: "9.9.0" if name == "trl" else trl_compat.CHECKED[name])
    assert trl_compat.mismatched() == {"trl": "9.9.0"}


def test_forced_fallback_turns_the_couplings_off():
    code = "import warnings; warnings.simplefilter('error'); import agentlab.trl_compat as c; print(c.COMPATIBLE)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "AGENTLAB_TRL_FALLBACK": "1"})
    assert out.stdout.strip() == "False"


def test_fallback_trains_through_trls_own_forward(tmp_path, monkeypatch):
    """With the couplings off, no private TRL hook of ours runs, and GRPO still trains and records its step."""
    monkeypatch.setattr(trl_compat, "COMPATIBLE", False)

    def refuse(*a, **k):
        raise AssertionError("the shared-prefix forward ran although the couplings are off")

    monkeypatch.setattr(trl_compat, "shared_prefix_logps", refuse)
    exp = Experiment(name="fallback", model="tiny-random", env="lookup", steps=1, eval_every=1, eval_tasks=2,
                     groups_per_step=1, group_size=2, max_new_tokens=8, max_turns=2)
    run = run_grpo(exp, LOOKUP.make_tasks("train", 4, seed=0), LOOKUP.make_tasks("validation", 2, seed=0),
                   run=RunDir(tmp_path / "r"))
    metrics = [json.loads(line) for line in run.metrics_file.read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1] and metrics[0]["time_step_s"] > 0
    assert (run.path / "adapter" / "adapter_config.json").exists()


@pytest.mark.parametrize("name", ["shared_prefix_logps", "agent_trainer_class", "tool_suffix_ids", "parse_response",
                                  "trl_reward_func", "cache_of", "stock_attention", "trainer_metrics",
                                  "drop_instance_forwards"])
def test_each_coupling_lives_here_and_is_listed(name):
    assert callable(getattr(trl_compat, name)) and f"``{name}``" in trl_compat.__doc__


def test_the_vllm_engine_is_listed_among_the_couplings():
    """vLLM's engine lives with the other engines (agentlab/engines/vllm.py); its TRL coupling is in the table."""
    from agentlab.engines import vllm

    assert callable(vllm.vllm_generate_fn) and "``engines.vllm``" in trl_compat.__doc__
