"""Bring your own environment: one file outside the package, registered, or an installed package's entry point."""

import json
import textwrap

import pytest

from agentlab import envs
from agentlab.types import EnvSpec

ECHO = textwrap.dedent('''
    """A one-file environment, written outside agentlab: say the secret word back."""
    from agentlab.rewards import Reward
    from agentlab.types import EnvSpec, Task, ToolCall, ToolEnv, seeded_rng

    WORDS = ["apple", "river", "stone", "cloud", "maple", "ember", "frost", "cedar"]

    class EchoEnv(ToolEnv):
        name = "echo"
        final_tool = "say"
        system_prompt = "Call `reveal`, then call `say` with the word it shows."

        def reveal(self) -> str:
            """Show the secret word.

            Returns:
                The word.
            """
            if refusal := self._guard():
                return refusal
            return self._task.answer["word"]

        def say(self, word: str) -> str:
            """Say a word and end the episode.

            Args:
                word: The word.

            Returns:
                A confirmation.
            """
            if refusal := self._guard():
                return refusal
            self._outcome.final = [word]
            self._outcome.finished = True
            return "ok"

    def make_tasks(split, n, seed=0):
        rng = seeded_rng("echo", split, seed)
        offset = {"train": 0, "validation": 1000, "test": 2000}[split]
        return [Task(id=f"echo-{split}-{i}", env="echo", question=f"Task {offset + i}: what is the word?",
                     answer={"word": rng.choice(WORDS)}) for i in range(n)]

    def evaluate(task, outcome):
        ok = float(outcome.final == [task.answer["word"]])
        return {"success": ok, "exact": ok}

    def expert(task):
        word = yield ToolCall("reveal", {})
        yield ToolCall("say", {"word": word})

    def random_policy(task):
        yield ToolCall("say", {"word": "nope"})

    SPEC = EnvSpec(name="echo", env_class=EchoEnv, make_tasks=make_tasks, evaluate=evaluate,
                   default_reward=Reward({"success": 1.0}), expert=expert, random_policy=random_policy,
                   audit_keys=lambda t: {"line": [t.question], "query": [t.question]})
    NOT_A_SPEC = 42
''')


@pytest.fixture
def echo_file(tmp_path):
    path = tmp_path / "echo_env.py"
    path.write_text(ECHO)
    return path  # what loading it registers leaves with the test (conftest)


def test_a_file_reference_loads_and_registers_its_spec(echo_file):
    spec = envs.load(f"{echo_file}:SPEC")
    assert isinstance(spec, EnvSpec) and spec.name == "echo"
    assert envs.load("echo") is spec and "echo" in envs.names()  # now known by its name too
    assert envs.load(f"{echo_file}:SPEC") is spec  # the file ran once


@pytest.mark.parametrize("ref, message", [
    ("{dir}/nowhere.py:SPEC", "does not exist"),
    ("{file}:MISSING", "has no attribute 'MISSING'"),
    ("{file}:NOT_A_SPEC", "is a int, not an EnvSpec"),
    ("chess", "unknown environment 'chess'"),
])
def test_bad_references_name_what_is_wrong(echo_file, ref, message):
    with pytest.raises(ValueError, match=message):
        envs.load(ref.format(dir=echo_file.parent, file=echo_file))


def test_register_takes_a_spec_and_protects_shipped_names(echo_file):
    spec = envs.load(f"{echo_file}:SPEC")
    from dataclasses import replace

    assert envs.register(replace(spec, name="echo2")) is envs.load("echo2")
    with pytest.raises(ValueError, match="shipped environment"):
        envs.register(replace(spec, name="lookup"))


def test_an_installed_package_entry_point_is_found(tmp_path, monkeypatch):
    (tmp_path / "echo_pkg_env.py").write_text(ECHO)
    dist = tmp_path / "echo_pkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[agentlab.envs]\necho = echo_pkg_env:SPEC\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "echo" in envs.names()
    assert envs.load("echo").name == "echo"


def test_the_cli_runs_a_file_environment_end_to_end(echo_file, tmp_path, capsys, monkeypatch):
    """envs, synth and eval on a file environment, through `agentlab.cli.main` in this process (the console
    script's parser and dispatch; `python -m agentlab.cli` itself is run in tests/test_bad_input.py)."""
    from agentlab.cli import main

    monkeypatch.setenv("AGENTLAB_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("AGENTLAB_DATA", str(tmp_path / "data"))
    ref = f"{echo_file}:SPEC"
    assert main(["envs", "--env", ref, "--n", "5"]) == 0
    assert "expert 1.00  random 0.00" in capsys.readouterr().out
    assert main(["synth", "--env", ref, "--train", "6", "--validation", "2", "--test", "3", "--demos", "2"]) == 0
    assert (tmp_path / "data" / "tasks" / "echo" / "test.jsonl").exists()
    assert main(["eval", "--env", ref, "--model", "tiny-random", "--n", "3", "--max-new-tokens", "4", "--name", "e"]) == 0
    summary = json.loads((tmp_path / "runs" / "e" / "summary.json").read_text())
    assert summary["success"]["n"] == 3 and summary["env"] == ref


@pytest.mark.parametrize("name", ["lookup", "product_finder", "code_search", "doc_search"])
def test_each_budget_holds_its_experts_trajectories_and_sft_cuts_none(name, tiny):
    """An environment's budget is set from what its tasks need: the scripted expert finishes every episode within
    it (doc_search's old 4 turns x 96 tokens in 2,048 could not hold a median expert trajectory), with a tenth of
    the context to spare; and SFT's max length keeps every demonstration whole."""
    from agentlab.engines.scripted import scripted_generate_fn
    from agentlab.envs import load
    from agentlab.rollout import LoopConfig, Renderer, run_episodes
    from agentlab.sft import longest
    from agentlab.synth import expert_demos, tokenize_demos

    spec, tok = load(name), tiny[1]
    tasks = spec.make_tasks("train", 16, seed=0)
    eps = run_episodes(None, tok, spec, tasks, config=LoopConfig.of(spec, batch_size=16), progress=False,
                       generate_fn=scripted_generate_fn(Renderer(tok, spec.env_class), tasks, spec.expert))
    assert {ep.exit_reason for ep in eps} == {"final_answer"} and all(ep.success == 1.0 for ep in eps)
    used = max(len(ep.tokens["prompt_ids"]) + len(ep.tokens["completion_ids"]) for ep in eps)
    assert used <= 0.9 * spec.budget.max_context, used
    rows = tokenize_demos(expert_demos(spec, tasks), tok)
    assert longest(rows) >= max(len(ep.tokens["prompt_ids"]) + len(ep.tokens["completion_ids"]) for ep in eps) - 8
