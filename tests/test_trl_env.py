"""TRL-style environment classes (defined here, never in the package) run unchanged, with TRL's semantics."""

import json
import textwrap

import pytest

from agentlab.rollout import LoopConfig, Renderer, run_episodes
from agentlab.trl_env import spec_from_class
from agentlab.types import InfraError, ToolCall

GUESS = textwrap.dedent('''
    class Guess:
        """Guess a number; a TRL-style environment: reset(**row), docstringed tools, a reward method."""

        def reset(self, **row):
            self.target, self.last = row["target"], None
            return row.get("observation")  # appended to the prompt, as GRPOTrainer does

        def guess(self, n: int) -> str:
            """Guess the number.

            Args:
                n: Your guess, from 0 to 9.

            Returns:
                "higher", "lower" or "correct".
            """
            self.last = n
            return "correct" if n == self.target else ("higher" if n < self.target else "lower")

        def explode(self, text: str) -> str:
            """A tool with a bug.

            Args:
                text: Anything.

            Returns:
                Nothing: it raises.
            """
            raise RuntimeError("boom")

        def get_reward(self) -> float:
            return 1.0 if self.last == self.target else 0.0
''')
namespace: dict = {}
exec(GUESS, namespace)  # noqa: S102 — the class must be plain user code, not a ToolEnv
Guess = namespace["Guess"]


def rows(n=40, observation=" (between 0 and 9)"):
    out = []
    for i in range(n):
        row = {"prompt": [{"role": "user", "content": f"Game {i}: guess my number."}], "target": i % 10}
        if observation:
            row["observation"] = observation
        out.append(row)
    return out


def _turns(tok, renderer, task_of_prompt):
    """A scripted policy at the token level: guess the target, then say "Done." (no more calls)."""
    from agentlab.types import ToolCall

    def generate(seqs):
        out = []
        for seq in seqs:
            text = tok.decode(seq)
            if "<tool_response>" in text:
                out.append(tok.encode("Done.") + [tok.eos_token_id])
            else:
                task = task_of_prompt(text)
                out.append(renderer.assistant_ids(ToolCall("guess", {"n": task.answer["target"]}), task))
        return out

    return generate


@pytest.mark.parametrize("observation", [" (between 0 and 9)", None])
def test_same_tokens_as_trl_for_a_trl_style_class(tiny, tmp_path, observation):
    """Prompt (with reset's observation where TRL puts it), completions and masks equal TRL's own tool loop."""
    import copy

    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model, tok = tiny
    model = copy.deepcopy(model)  # GRPOTrainer patches the model it is given; the session's shared one stays as loaded
    data = rows(2, observation)
    spec = spec_from_class(Guess, data, eval_rows=data)
    tasks = spec.make_tasks("train", 2)
    renderer = Renderer(tok, spec.env_class)
    by_game = {t.question: t for t in tasks}
    generate = _turns(tok, renderer, lambda text: next(t for q, t in by_game.items() if q in text))
    ours = run_episodes(None, tok, spec, tasks, samples=2, generate_fn=generate, progress=False)
    assert all(ep.success == 1.0 and ep.exit_reason == "no_tool_call" for ep in ours)

    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, num_generations=2, per_device_train_batch_size=2,
                      max_completion_length=1024, max_tool_calling_iterations=2, report_to=[], logging_steps=1)
    trl_rows = [t.answer for t in tasks]
    trainer = GRPOTrainer(model=model, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                          args=args, train_dataset=Dataset.from_list(trl_rows), processing_class=tok,
                          environment_factory=Guess)
    trainer._generate_single_turn = lambda prompt_ids, *a, **k: (generate([list(p) for p in prompt_ids]), None)
    out = trainer._generate_and_score_completions([trl_rows[0], trl_rows[0], trl_rows[1], trl_rows[1]])
    for i, ep in enumerate(ours):
        n = int(out["completion_mask"][i].sum())
        assert out["prompt_ids"][i][out["prompt_mask"][i].bool()].tolist() == ep.tokens["prompt_ids"]
        assert out["completion_ids"][i][:n].tolist() == ep.tokens["completion_ids"]
        assert out["tool_mask"][i][:n].tolist() == ep.tokens["mask"]
    if observation:
        assert observation in tok.decode(ours[0].tokens["prompt_ids"])


def test_tool_schemas_are_trls_and_the_reward_method_is_no_tool():
    from transformers.utils import get_json_schema

    from agentlab.synth import tool_schemas

    spec = spec_from_class(Guess, rows())
    game = Guess()
    assert tool_schemas(spec.env_class) == [get_json_schema(getattr(game, n)) for n in ("explode", "guess")]


def test_a_raising_tool_answers_like_trl_and_infra_errors_are_retried(tiny):
    _, tok = tiny
    spec = spec_from_class(Guess, rows(4))
    task = spec.make_tasks("train", 1)[0] if spec.make_tasks("train", 1) else None
    task = task or spec.make_tasks("test", 1)[0]
    renderer = Renderer(tok, spec.env_class)
    from agentlab.types import ToolCall

    boom = renderer.assistant_ids(ToolCall("explode", {"text": "x"}), task)
    ep = run_episodes(None, tok, spec, [task], generate_fn=lambda seqs: [boom for _ in seqs], progress=False,
                      config=LoopConfig(max_turns=1))[0]
    call = ep.turns[0].tool_calls[0]
    assert call["result"] == "{'error': 'boom'}" and call["error"] == "policy" and ep.failure == "model"

    class Flaky(Guess):
        def explode(self, text: str) -> str:
            """Down.

            Args:
                text: Anything.
            """
            raise InfraError("service down")

    flaky = spec_from_class(Flaky, rows(4))
    ep = run_episodes(None, tok, flaky, [task], generate_fn=lambda seqs: [boom for _ in seqs], progress=False,
                      config=LoopConfig(max_turns=1, backoff_s=0.001))[0]
    assert ep.failure == "infra" and ep.exit_reason == "error"


def test_missing_reward_method_and_missing_docstrings_are_named():
    class NoReward:
        def reset(self, **row):
            return None

        def act(self, x: str) -> str:
            return x

    with pytest.raises(ValueError, match="NoReward has no reward method: expected reward or get_reward"):
        spec_from_class(NoReward, rows())
    NoReward.reward = lambda self: 0.0
    with pytest.warns(UserWarning, match="NoReward.act has no docstring"):
        spec_from_class(NoReward, rows())
    with pytest.raises(ValueError, match="has no method 'score'"):
        spec_from_class(NoReward, rows(), reward_method="score")


def test_held_out_rows_never_train_and_the_hash_split_is_disjoint():
    data = rows(200)
    spec = spec_from_class(Guess, data)
    split = {s: {t.id for t in spec.make_tasks(s, 1000)} for s in ("train", "validation", "test")}
    assert sum(map(len, split.values())) == 200 and not (split["train"] & (split["validation"] | split["test"]))
    held = spec_from_class(Guess, data[:100], eval_rows=data[100:])
    assert len(held.make_tasks("train", 1000)) == 100
    assert {t.question for t in held.make_tasks("validation", 1000) + held.make_tasks("test", 1000)} == {
        r["prompt"][0]["content"] for r in data[100:]}
    # held-out rows are split in halves, whatever their count (8 rows gave 2 test tasks and 20 gave none)
    for n in (8, 20, 7):
        few = spec_from_class(Guess, data[:100], eval_rows=data[100:100 + n])
        val, test = few.make_tasks("validation", 1000), few.make_tasks("test", 1000)
        assert (len(val), len(test)) == ((n + 1) // 2, n // 2) and not {t.id for t in val} & {t.id for t in test}
        assert [t.id for t in test] == [t.id for t in few.make_tasks("test", 1000)]  # deterministic


def test_the_cli_evaluates_and_trains_a_trl_style_class(tmp_path, capsys, monkeypatch):
    """`agentlab eval` and `agentlab train` on a class from a file and its rows; `sft` refuses in one line. The
    commands run through `agentlab.cli.main` in this process (the same parser and dispatch as the console script,
    without three more imports of torch and TRL; `python -m agentlab.cli` itself is run in tests/test_bad_input.py)."""
    from agentlab.cli import main

    (tmp_path / "guess_env.py").write_text(GUESS)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(60)))
    monkeypatch.setenv("AGENTLAB_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("AGENTLAB_DATA", str(tmp_path / "data"))
    ref, data = f"{tmp_path / 'guess_env.py'}:Guess", str(tmp_path / "rows.jsonl")

    assert main(["eval", "--env", ref, "--tasks", data, "--model", "tiny-random", "--n", "4", "--max-new-tokens", "4",
                 "--name", "guess-eval"]) == 0
    summary = json.loads((tmp_path / "runs" / "guess-eval" / "summary.json").read_text())
    assert summary["success"]["n"] >= 1 and (tmp_path / "runs" / "guess-eval" / "rollouts.jsonl").exists()
    assert main(["train", "--env", ref, "--tasks", data, "--model", "tiny-random", "--steps", "1", "--eval-every", "1",
                 "--eval-tasks", "2", "--groups-per-step", "1", "--group-size", "2", "--max-new-tokens", "4",
                 "--name", "guess-grpo"]) == 0
    assert (tmp_path / "runs" / "guess-grpo" / "DONE").exists()
    capsys.readouterr()
    assert main(["sft", "--env", ref, "--tasks", data, "--model", "tiny-random"]) == 2
    err = capsys.readouterr().err
    assert "has no scripted expert" in err and "Traceback" not in err


def test_envs_lists_a_trl_style_class_built_from_its_rows(tmp_path, capsys):
    """`agentlab envs --env file.py:Class --tasks rows.jsonl` scores the class as the other subcommands see it (it
    was refused: --tasks unknown); a class without a scripted expert says so."""
    from agentlab.cli import main

    (tmp_path / "guess_env.py").write_text(GUESS)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(40)))
    held = tmp_path / "held.jsonl"
    held.write_text("".join(json.dumps(r) + "\n" for r in rows(48)[40:]))
    assert main(["envs", "--env", f"{tmp_path / 'guess_env.py'}:Guess", "--tasks", str(tmp_path / "rows.jsonl"),
                 "--eval-rows", str(held), "--n", "10"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith("Guess") and "expert - (none)" in line and "(4 test tasks)" in line, line


def test_ground_truth_calls_replay_into_demonstrations_and_compare_trains_on_them(tmp_path, capsys, monkeypatch):
    """The benchmark ships each row's calls: `agentlab replay` plays them through the class (results from the
    environment), keeps the ones its reward calls a success and lists the rest; `agentlab compare --demos` then
    warm-starts from that file on a class with no scripted expert (sft_all, which needs one, is left out)."""
    from agentlab.cli import main

    monkeypatch.setenv("AGENTLAB_RUNS", str(tmp_path / "runs"))
    data = rows(40)
    for i, row in enumerate(data):
        wrong = i == 3  # a row whose shipped answer is wrong: the reward says no, and it is listed
        row["calls"] = [{"name": "guess", "arguments": {"n": 5}},
                        {"type": "function", "function": {"name": "guess",
                                                          "arguments": json.dumps({"n": row["target"] + wrong})}}]
    (tmp_path / "guess_env.py").write_text(GUESS)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    ref = [f"{tmp_path / 'guess_env.py'}:Guess", "--tasks", str(tmp_path / "rows.jsonl")]
    out = tmp_path / "demos.jsonl"
    assert main(["replay", "--env", *ref, "--out", str(out), "--final", "Found it."]) == 0
    said = capsys.readouterr().out
    demos = [json.loads(line) for line in out.read_text().splitlines()]
    n_train = len(spec_from_class(Guess, data).make_tasks("train", 100))
    shipped_wrong = data[3]["prompt"][0]["content"]
    kept_wrong = any(d["messages"][0]["content"].startswith(shipped_wrong) for d in demos)
    assert not kept_wrong and len(demos) in (n_train, n_train - 1)
    assert ("the verifier says no" in said) == (len(demos) == n_train - 1)
    first = demos[0]["messages"]
    assert [m["role"] for m in first] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert first[0]["content"].endswith(" (between 0 and 9)")  # reset's observation, as the loop shows it
    assert first[4]["content"] == "correct" and first[-1] == {"role": "assistant", "content": "Found it."}
    assert first[2]["content"] in ("higher", "lower", "correct")  # from the environment, not the file
    assert main(["compare", "--env", *ref, "--demos", str(out), "--smoke", "--name", "mine", "--arms",
                 "sft_best,grpo"]) == 0
    result = json.loads((tmp_path / "runs" / "mine" / "result.json").read_text())
    assert result["regime"] == "own:demos.jsonl" and "grpo" in result
    assert len((tmp_path / "runs" / "mine" / "tasks" / "demos.jsonl").read_text().splitlines()) == len(demos)
    from agentlab.compare import CompareConfig, run_compare

    with pytest.raises(ValueError, match="sft_all needs a scripted expert, and 'Guess' has none"):
        run_compare(CompareConfig.smoke(env="Guess", demos=str(out), name="x"), arms=("sft_best", "sft_all"))


def test_rows_that_share_their_prompt_text_train_as_their_own_tasks(tiny, tmp_path):
    """Every game of a TRL-style environment may start with the same prompt ("Win this game"), the game set by
    another column. GRPO must still give each group its own task: the rollout used to key tasks by prompt text and
    raised on two such games in one step."""
    from types import SimpleNamespace

    from datasets import Dataset

    from agentlab.runs import RunDir
    from agentlab.train import Experiment, _StepStats, make_rollout_func

    model, tok = tiny
    data = [{"prompt": [{"role": "user", "content": "Guess my number."}], "target": t} for t in (3, 7)]
    spec = spec_from_class(Guess, data, eval_rows=data)
    tasks = spec.make_tasks("train", 2)
    assert len({t.question for t in tasks}) == 1 and len({t.id for t in tasks}) == 2
    renderer = Renderer(tok, spec.env_class)
    dataset = Dataset.from_list([renderer.grpo_row(t) for t in tasks])  # as TRL stores it (Arrow structs)
    assert renderer.tok.apply_chat_template(dataset[0]["prompt"], tokenize=False) == \
        renderer.tok.apply_chat_template(renderer.messages(tasks[0]), tokenize=False)

    def guess_three(seqs):  # the same first move in every game: only the target decides the reward
        return [renderer.assistant_ids(ToolCall("guess", {"n": 3}), tasks[0]) if "<tool_response>" not in
                tok.decode(s) else tok.encode("Done.") + [tok.eos_token_id] for s in seqs]

    exp = Experiment(env="lookup", model="tiny-random", groups_per_step=2, group_size=2)  # only G and the loop
    stats = _StepStats()
    rollout = make_rollout_func(spec, tok, tasks, exp, RunDir(tmp_path), stats, reward_fn=spec.default_reward,
                                engine=lambda *_: guess_three)
    trainer = SimpleNamespace(state=SimpleNamespace(global_step=0), model=model,
                              accelerator=SimpleNamespace(process_index=0, is_main_process=True, unwrap_model=lambda m: m))
    out = rollout([dataset[i]["prompt"] for i in (0, 0, 1, 1)], trainer)
    assert [ep.task.id for ep in stats.episodes] == [tasks[0].id] * 2 + [tasks[1].id] * 2
    assert out["agentlab_reward"] == [float(t.answer["target"] == 3) for t in tasks for _ in range(2)] != [0.0] * 4
