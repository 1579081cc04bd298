"""The reward and the loss a learner configures are the ones that train: specs, config.json, resume, errors."""

import functools
import json
import math
import os
import subprocess
import sys

import pytest

from agentlab.envs import load
from agentlab.judge import llm_judge
from agentlab.rewards import Reward, compose, parse_reward, reward_config
from agentlab.runs import RunDir, RunExistsError
from agentlab.train import LOSS_TYPES, Experiment, grpo_config, run_grpo

LOOKUP = load("lookup")


def brevity(ep):
    """A reward defined outside agentlab: success, minus a little per turn."""
    return ep.success - 0.01 * len(ep.turns)


def test_reward_specs_parse_to_terms():
    assert parse_reward("success").terms == {"success": 1.0}
    assert parse_reward("f4=1, empty=-0.2,trajectory_recall=0.1").terms == {
        "f4": 1.0, "empty": -0.2, "trajectory_recall": 0.1}
    assert parse_reward("fbeta:beta=2,empty=-0.5").terms == {"f2": 1.0, "empty": -0.5}
    from agentlab.rewards import success

    assert parse_reward("agentlab.rewards:success") is success


@pytest.mark.parametrize("spec, message", [
    ("sucess", "unknown reward term 'sucess'"),
    ("success=high", "weight 'high' of 'success' is not a number"),
    ("fbeta:beta=x", "expected 'fbeta:beta=<number>'"),
    ("no_such_module_xyz:reward", "cannot import 'no_such_module_xyz'"),
    ("agentlab.rewards:no_such_reward", "has no attribute 'no_such_reward'"),
    ("/nowhere/reward.py:r", "does not exist"),
    (" , ", "names no term"),
])
def test_bad_reward_spec_is_one_clear_error_before_any_work(spec, message):
    with pytest.raises(ValueError, match=message):
        Experiment(reward=spec)


def test_a_designed_reward_is_handed_on_as_a_file(tmp_path):
    from agentlab.rewards import load_reward, save_reward

    designed = compose(f2=1.0, empty=-0.5, trajectory_recall=0.2)
    save_reward(designed, tmp_path / "reward.json")
    exp = Experiment(env="doc_search", reward=str(tmp_path / "reward.json"))
    assert exp.reward_object() == designed == load_reward(tmp_path / "reward.json")
    assert exp.to_config()["reward"]["terms"] == {"f2": 1.0, "empty": -0.5, "trajectory_recall": 0.2}
    with pytest.raises(ValueError, match="only a Reward of named terms"):
        save_reward(compose(x=lambda ep: 1.0), tmp_path / "other.json")
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="is not a saved reward"):
        Experiment(reward=str(tmp_path / "bad.json"))
    with pytest.raises(ValueError, match="does not exist"):
        Experiment(reward=str(tmp_path / "missing.json"))


def test_unknown_loss_or_scaling_is_refused():
    with pytest.raises(ValueError, match="loss_type='ppo' unknown"):
        Experiment(loss_type="ppo")
    with pytest.raises(ValueError, match="scale_rewards='std' unknown"):
        Experiment(scale_rewards="std")


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_loss_choice_reaches_trl(loss_type, tmp_path):
    """Every loss type trains as TRL defines it from the experiment alone (luspo: sequence-level importance
    ratios, which `--loss-type luspo` used to leave at TRL's token-level default)."""
    cfg = grpo_config(Experiment(loss_type=loss_type, scale_rewards="none"), tmp_path)
    assert (cfg.loss_type, cfg.scale_rewards) == (loss_type, "none")
    assert cfg.importance_sampling_level == ("sequence" if loss_type in ("luspo",) else "token")


def test_reward_is_recorded_as_configuration_and_a_changed_reward_refuses_to_resume(tmp_path):
    terms = Experiment(reward="f4=1,empty=-0.2").to_config()["reward"]
    assert terms == {"spec": "f4=1,empty=-0.2", "terms": {"f4": 1.0, "empty": -0.2}}
    composed = Experiment(reward=compose(success=1.0, format=0.1)).to_config()
    assert json.loads(json.dumps(composed))["reward"] == {"terms": {"success": 1.0, "format": 0.1}}
    called = reward_config(brevity)
    assert called["callable"] == f"{brevity.__module__}:brevity" and len(called["sha256"]) == 64
    assert "source" not in called  # importable: the name and hash are enough
    judged = reward_config(compose(success=1.0, judge=functools.partial(llm_judge, weight=0.5)))
    assert judged["terms"]["judge"]["callable"] == "agentlab.judge:llm_judge" and "weight=0.5" in judged["terms"][
        "judge"]["partial"]
    run = RunDir(tmp_path / "r")
    run.prepare(Experiment(reward="success"))
    run.prepare(Experiment(reward="success"))  # same reward: resumes
    with pytest.raises(RunExistsError, match="different config.*reward"):
        run.prepare(Experiment(reward="success=1,format=0.1"))


def test_a_callable_from_a_notebook_cell_is_recorded_by_its_source(tmp_path):
    code = ("from agentlab.rewards import reward_config\n"
            "def shaped(ep):\n    return 2.0 * ep.success\n"
            "import json; print(json.dumps(reward_config(shaped)))\n")
    script = tmp_path / "cell.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    recorded = json.loads(out.stdout)
    assert recorded["callable"] == "__main__:shaped" and "2.0 * ep.success" in recorded["source"]
    script.write_text(code.replace("2.0 *", "3.0 *"))
    changed = json.loads(subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True,
                                        env={**os.environ, "PYTHONPATH": os.getcwd()}).stdout)
    assert changed["sha256"] != recorded["sha256"]


@pytest.mark.parametrize("bad, message", [
    (lambda ep: math.nan, "returned nan"),
    (lambda ep: "high", "must be a number"),
    (lambda ep: 1 / 0, "ZeroDivisionError"),
])
def test_a_reward_that_fails_on_scripted_episodes_stops_training_before_it_starts(tmp_path, bad, message):
    run = RunDir(tmp_path / "r")
    with pytest.raises(ValueError, match=message):
        run_grpo(Experiment(model="tiny-random", reward=bad, steps=1), [], [], run=run)
    assert not run.path.exists()  # nothing written


def test_training_rewards_are_the_configured_reward(tmp_path, tiny):
    """The handoff: a designed reward reaches GRPO's rollouts (not the environment's default)."""
    designed = Reward({"success": 1.0, "brevity": lambda ep: 0.37 - 0.01 * len(ep.turns)})
    exp = Experiment(name="r", model="tiny-random", env="lookup", steps=1, eval_every=1, eval_tasks=2,
                     groups_per_step=1, group_size=2, max_new_tokens=8, max_turns=2, reward=designed)
    tasks = LOOKUP.make_tasks("train", 4, seed=0)
    run = run_grpo(exp, tasks, LOOKUP.make_tasks("validation", 2, seed=0), run=RunDir(tmp_path / "r"))
    rollouts = [json.loads(line) for line in run.rollouts_file.read_text().splitlines()]
    assert rollouts
    for r in rollouts:
        expected = r["metrics"]["success"] + 0.37 - 0.01 * len(r["turns"])
        assert r["reward"] == pytest.approx(expected) and set(r["reward_terms"]) == {"success", "brevity"}
    config = json.loads(run.config_file.read_text())
    assert config["reward"]["terms"]["success"] == 1.0 and config["reward"]["terms"]["brevity"]["callable"]
    assert (config["loss_type"], config["scale_rewards"]) == ("dapo", "group")


@pytest.fixture
def judge_server():
    """A local OpenAI-compatible endpoint that answers 429 to its first ``fail`` requests, then grades 1."""
    import http.server
    import threading

    state = {"fail": 0, "seen": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            state["seen"] += 1
            if state["seen"] <= state["fail"]:
                self.send_response(429)
                self.end_headers()
                return
            body = json.dumps({"choices": [{"message": {"content": "1"}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/v1", state
    server.shutdown()


def test_judge_reward_is_retried_then_infra_never_a_zero_for_the_policy(tiny, judge_server):
    from agentlab.engines.scripted import scripted_generate_fn
    from agentlab.judge import Judge
    from agentlab.rollout import LoopConfig, Renderer, run_episodes
    from agentlab.train import step_metrics, trainer_rewards

    url, state = judge_server
    _, tok = tiny
    tasks = LOOKUP.make_tasks("train", 2, seed=0)
    reward = compose(judge=functools.partial(llm_judge, judge=Judge(base_url=url, api_key_env="", timeout_s=5)))
    cfg = LoopConfig(retries=2, backoff_s=0.01)

    def play(batch):
        generate = scripted_generate_fn(Renderer(tok, LOOKUP.env_class), batch, LOOKUP.expert)
        return run_episodes(None, tok, LOOKUP, batch, config=cfg, generate_fn=generate, reward_fn=reward,
                            progress=False)

    state["fail"] = 2  # two 429s, then an answer: retried and scored
    ep = play(tasks[:1])[0]
    assert (ep.reward, ep.failure, state["seen"]) == (1.0, None, 3)
    state.update(fail=10**6, seen=0)  # the judge stays down
    eps = play(tasks)
    assert [e.failure for e in eps] == ["infra", "infra"] and state["seen"] == 2 * (cfg.retries + 1)
    assert trainer_rewards(eps) == [None, None]  # GRPO gives them no advantage (TRL excludes None rewards)
    mixed = [ep, *eps]
    assert trainer_rewards(mixed) == [1.0, None, None] and step_metrics(mixed, 3)["reward_mean"] == 1.0
    assert step_metrics(mixed, 3)["infra_failures"] == 2
