"""examples/: a third-party game package (textarena, installed by `make setup-examples`) as a user's own task."""

import itertools
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
pytest.importorskip("textarena", reason="the example's own requirement: run `make setup-examples`")

from textarena_games import GuessTheNumber, binary_search, cheap_hop, game_figures, play, rows, rows_needed


def test_the_wrapped_game_plays_the_real_engine():
    """Against textarena's own game: binary search wins every game within 6 guesses; the cheap hop moves 1 to 4
    toward each hint, is the same for the same game, differs between games and wins some but not all; a tool
    result carries only what the game added, never its echo."""
    hops, wins = set(), []
    for row in rows(40):
        env = GuessTheNumber()
        env.reset(**row)
        target = env.game.state.game_state["game_number"]
        calls, won = play(row, binary_search)
        assert won and len(calls) <= 6 and calls[-1]["arguments"]["number"] == target
        calls, won = play(row, cheap_hop)
        assert (calls, won) == play(row, cheap_hop) and calls[0]["arguments"]["number"] == 25
        steps = [b["arguments"]["number"] - a["arguments"]["number"] for a, b in itertools.pairwise(calls)]
        assert all(1 <= abs(d) <= 4 and (d > 0) == (c["arguments"]["number"] < target) for d, c in zip(steps, calls))
        hops |= {abs(d) for d in steps}
        wins.append(won)
    assert hops == {1, 2, 3, 4} and 0.3 < sum(wins) / len(wins) < 0.9
    env = GuessTheNumber()
    intro = env.reset(**rows(1, first_seed=5)[0])
    assert "between 1 and 50 within 10 turns" in intro
    target = env.game.state.game_state["game_number"]
    reply = env.guess(1 if target > 1 else 50)
    assert reply in ("The target number is higher.", "The target number is lower.") and env.reward() == 0.0
    assert env.guess(target) == "Correct: you won." and env.reward() == 1.0 and env.guess(3) == "The game is over."


def test_shipped_calls_replay_into_demonstrations_of_the_cheap_strategy(tmp_path, capsys, monkeypatch):
    """The README's three steps, first two: rows with both scripts, `agentlab replay` of the cheap one keeps exactly
    its won games (the lost ones listed), each conversation ending in the closing message."""
    from agentlab.cli import main

    monkeypatch.setenv("AGENTLAB_RUNS", str(tmp_path / "runs"))
    data = rows(40)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    example = Path(__file__).resolve().parent.parent / "examples" / "textarena_games.py"
    out = tmp_path / "cheap.jsonl"
    assert main(["replay", "--env", f"{example}:GuessTheNumber", "--tasks", str(tmp_path / "rows.jsonl"),
                 "--column", "cheap_calls", "--out", str(out), "--final", "I won."]) == 0
    said = capsys.readouterr().out
    demos = [json.loads(line) for line in out.read_text().splitlines()]
    replies = [m["content"] for d in demos for m in d["messages"] if m["role"] == "tool"]
    assert demos and all(d["messages"][-2]["content"] == "Correct: you won." for d in demos)
    assert all(d["messages"][-1] == {"role": "assistant", "content": "I won."} for d in demos)
    assert not any("[Player]" in r for r in replies)
    assert "the verifier says no" in said  # the cheap walk loses some games, and says which


def test_rows_needed_fill_every_split_of_the_hash_split(tmp_path):
    """The study's and notebook 10's row count: the class's hash split then holds every split's asked size."""
    from agentlab.envs import load
    from agentlab.pipeline import resolve_env

    sizes = {"train": 120, "validation": 12, "test": 12}
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(rows_needed(sizes))))
    example = Path(__file__).resolve().parent.parent / "examples" / "textarena_games.py"
    spec = load(resolve_env(f"{example}:GuessTheNumber", str(tmp_path / "rows.jsonl")))
    assert {name: len(spec.make_tasks(name, n)) for name, n in sizes.items()} == sizes


def test_game_figures_count_wins_and_guesses_of_a_rollouts_file(tmp_path):
    """Win rate and guesses per game as the study's table reports them, from rollouts written by the library."""
    from agentlab.types import Episode, Task, Turn

    def episode(guesses: int, won: bool) -> str:
        calls = [{"name": "guess", "arguments": {"number": 25}}] * guesses
        task = Task(id="t", env="GuessTheNumber", question="", answer={})
        return Episode(task=task, turns=[Turn(text="", tool_calls=calls)], metrics={"success": float(won)}).to_json()

    (tmp_path / "rollouts.jsonl").write_text("".join(episode(*x) + "\n" for x in ((3, True), (10, False), (5, True))))
    figures = game_figures(tmp_path / "rollouts.jsonl")
    assert figures["win"]["mean"] == pytest.approx(2 / 3) and figures["moves"]["mean"] == pytest.approx(6.0)
    assert figures["win"]["n"] == 3 and figures["moves"]["ci_low"] <= 6.0 <= figures["moves"]["ci_high"]


def test_the_third_party_study_runs_end_to_end_on_the_tiny_model(tmp_path, monkeypatch, capsys):
    """benchmarks/third_party_env.py --smoke: rows, the cheap script replayed into demonstrations, and every arm of
    `agentlab compare` on the class loaded from its file, held-out games evaluated, the base model too (tiny model, tiny
    sizes)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import third_party_env

    monkeypatch.setenv("AGENTLAB_RUNS", str(tmp_path / "runs"))
    assert third_party_env.main(["--smoke", "--seeds", "0"]) == 0
    run = tmp_path / "runs" / "third-party-smoke" / "guess-the-number" / "seed-0"
    for arm in ("base", "sft_best", "grpo", "sft_matched", "expert_iteration"):
        episodes = (run / "test" / arm / "rollouts.jsonl").read_text().splitlines()
        assert len(episodes) == 6, arm  # every arm on the same held-out games
    said = capsys.readouterr().out
    assert "won games kept" in said and '"grpo_minus_sft_best"' in said
    trained = third_party_env.grpo_training(run)  # what the README's line on GRPO's training reads
    assert trained["steps"] == 1 and trained["rollouts"] == 2 and 0 <= trained["zero_variance"] <= 1
