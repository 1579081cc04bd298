"""Demonstrations a user brings (agentlab.demos): checked against the environment's tools, rendered as the loop does."""

import json

import pytest

from agentlab.demos import load_demos
from agentlab.envs import load
from agentlab.synth import expert_demos

SPEC = load("lookup")


def _as_user_would_write(row: dict) -> dict:
    """An expert conversation as a user would hold it: their own system prompt, arguments as JSON strings."""
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    for m in row["messages"][1:]:
        if m.get("tool_calls"):
            m = {**m, "tool_calls": [{"type": "function", "function": {
                "name": c["function"]["name"], "arguments": json.dumps(c["function"]["arguments"])}}
                for c in m["tool_calls"]]}
        messages.append(m)
    return {"messages": messages}


def test_a_users_demonstrations_render_as_the_expert_demonstrations_do(tmp_path):
    """Same conversations, another system prompt and string arguments: once loaded they are exactly the rows the
    scripted expert writes (the environment's system prompt, its tools in TRL's order), so SFT sees what the loop
    will show."""
    tasks = SPEC.make_tasks("train", 3, seed=0)
    expert = expert_demos(SPEC, tasks)
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(_as_user_would_write(r)) + "\n" for r in expert))
    mine = load_demos(SPEC, path)
    assert [r["messages"] for r in mine] == [r["messages"] for r in expert]
    assert all(r["tools"] == expert[0]["tools"] for r in mine)


@pytest.mark.parametrize("change, message", [
    (lambda c: c.update(name="lookup_person"), "demos.jsonl:2: unknown tool 'lookup_person'"),
    (lambda c: c.update(arguments={"qeury": "Ada"}), "demos.jsonl:2: search_people takes no argument 'qeury'"),
    (lambda c: c.update(arguments="{not json"), "demos.jsonl:2: arguments of"),
])
def test_a_bad_call_names_the_file_and_line(tmp_path, change, message):
    good = _as_user_would_write(expert_demos(SPEC, SPEC.make_tasks("train", 1, seed=0))[0])
    bad = json.loads(json.dumps(good))
    call = next(m for m in bad["messages"] if m.get("tool_calls"))["tool_calls"][0]["function"]
    change(call)
    path = tmp_path / "demos.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        load_demos(SPEC, path)


def test_the_cli_trains_sft_on_a_users_file(tmp_path, monkeypatch, capsys):
    from agentlab.cli import main

    monkeypatch.setenv("AGENTLAB_RUNS", str(tmp_path / "runs"))
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(_as_user_would_write(r)) + "\n"
                            for r in expert_demos(SPEC, SPEC.make_tasks("train", 2, seed=0))))
    assert main(["sft", "--env", "lookup", "--model", "tiny-random", "--demos", str(path), "--steps", "1",
                 "--name", "mine"]) == 0
    assert "SFT on 2 demonstrations" in capsys.readouterr().out
    assert (tmp_path / "runs" / "mine" / "adapter" / "adapter_config.json").exists()


def test_replayed_calls_equal_the_experts_rows_and_failures_are_listed():
    """Ground-truth calls played through the environment give exactly the scripted expert's rows (results from the
    environment); a wrong call list, an unknown tool or a missing column is a listed failure, never a row."""
    from agentlab.demos import replay
    from agentlab.types import run_policy

    tasks = SPEC.make_tasks("train", 4, seed=0)
    truth = {t.id: [{"name": c.name, "arguments": c.arguments} for c, _ in run_policy(SPEC, t, SPEC.expert)[1]]
             for t in tasks}
    rows, failures = replay(SPEC, tasks, lambda t: truth[t.id])
    assert failures == [] and [r["messages"] for r in rows] == [r["messages"] for r in expert_demos(SPEC, tasks)]
    wrong = {**truth, tasks[1].id: truth[tasks[1].id][:-1] + [{"name": "answer", "arguments": {"value": "Nobody"}}],
             tasks[2].id: [{"name": "lookup_person", "arguments": {}}]}
    rows, failures = replay(SPEC, tasks, lambda t: wrong[t.id])
    assert [r["task_id"] for r in rows] == [tasks[0].id, tasks[3].id]
    assert [f["task_id"] for f in failures] == [tasks[1].id, tasks[2].id]
    assert "the verifier says no" in failures[0]["why"] and "unknown tool 'lookup_person'" in failures[1]["why"]
    assert "no calls to replay in column 'calls'" in replay(SPEC, tasks[:1])[1][0]["why"]
