"""Inference-time scaffolds (notebook 09): a grounded verifier, best-of-n, sequential refinement."""

from dataclasses import replace

from agentlab.engines.scripted import scripted_generate_fn
from agentlab.envs import load
from agentlab.rollout import Renderer
from agentlab.types import Episode, Outcome, ToolCall, Turn

SPEC = load("lookup")


def _wrong(task):
    yield ToolCall("answer", {"value": "nobody"})


def test_grounded_verifier_accepts_only_values_seen_in_tool_results():
    from agentlab.reward_design import scripted_episode
    from agentlab.scaffolds import grounded

    task = SPEC.make_tasks("test", 1, seed=0)[0]
    assert grounded(scripted_episode(SPEC, task, SPEC.expert))
    assert not grounded(scripted_episode(SPEC, task, _wrong))
    assert not grounded(Episode(task=task, turns=[Turn("")], outcome=Outcome(final=[])))


def test_grounded_ignores_the_final_tools_echo_and_error_messages():
    """``recommend`` and ``return_answer`` echo the submitted id in their result, and a failed read names what
    it was asked for: counting those as seen made every answer on product_finder and code_search grounded."""
    from agentlab.reward_design import scripted_episode
    from agentlab.scaffolds import grounded

    for env, tool, arg in (("product_finder", "recommend", "product_id"), ("code_search", "return_answer", "answer")):
        spec = load(env)
        task, other = spec.make_tasks("test", 2, seed=0)
        assert grounded(scripted_episode(spec, task, spec.expert)), env
        guess = other.answer.get("target") or other.answer["names"][0]  # a real id, never looked up here

        def blind(task, tool=tool, arg=arg, guess=guess):
            yield ToolCall(tool, {arg: guess})
        ep = scripted_episode(spec, task, blind)
        assert ep.outcome.final == [guess] and guess.lower() in ep.turns[-1].tool_calls[-1]["result"].lower()
        assert not grounded(ep), env

    def read_then_answer(task):  # the read fails, and its error message repeats the name
        yield ToolCall("read_repo", {"name": "made.up.name"})
        yield ToolCall("return_answer", {"answer": "made.up.name"})
    spec = load("code_search")
    ep = scripted_episode(spec, spec.make_tasks("test", 1, seed=0)[0], read_then_answer)
    assert "made.up.name" in ep.turns[0].tool_calls[0]["result"] and not grounded(ep)


def test_parallel_best_of_n_picks_a_verified_sample(tiny):
    from agentlab.scaffolds import parallel_best_of_n

    _, tok = tiny
    tasks = SPEC.make_tasks("test", 4, seed=0)
    renderer = Renderer(tok, SPEC.env_class)
    calls = {"n": 0}
    expert_fn = scripted_generate_fn(renderer, tasks, SPEC.expert)
    wrong_fn = scripted_generate_fn(renderer, tasks, _wrong)

    def gen(seqs):  # sample 0 of every task answers blindly; the other samples play the expert
        calls["n"] += 1
        return [wrong_fn([s])[0] if i % 2 == 0 and calls["n"] == 1 else expert_fn([s])[0] for i, s in enumerate(seqs)]

    from agentlab.rollout import LoopConfig

    out = parallel_best_of_n(None, tok, SPEC, tasks, 2, LoopConfig(batch_size=8), generate_fn=gen, progress=False)
    assert len(out["chosen"]) == 4 and len(out["samples"]) == 8 and out["accepted"] == 1.0
    assert all(ep.success == 1.0 for ep in out["chosen"])
    assert sum(ep.success for ep in out["samples"]) == 4


def test_sequential_refinement_retries_rejected_attempts_with_feedback(tiny):
    from agentlab.rollout import LoopConfig
    from agentlab.scaffolds import feedback, sequential_refinement

    _, tok = tiny
    tasks = SPEC.make_tasks("test", 3, seed=0)
    renderer = Renderer(tok, SPEC.env_class)
    first = [Episode(task=t, outcome=Outcome(final=["nobody"])) for t in tasks]
    retried = [replace(t, question=f"{t.question}\n\n{feedback(e)}") for t, e in zip(tasks, first, strict=True)]
    wrong_fn, expert_fn = scripted_generate_fn(renderer, tasks, _wrong), scripted_generate_fn(renderer, retried, SPEC.expert)
    prompts = {tuple(renderer.prompt_ids(t)) for t in retried}

    def gen(seqs):
        return [(expert_fn if any(tuple(s[:len(p)]) == p for p in prompts) else wrong_fn)([s])[0] for s in seqs]

    out = sequential_refinement(None, tok, SPEC, tasks, 3, LoopConfig(), generate_fn=gen, progress=False)
    assert out["per_round"] == [0.0, 1.0, 1.0] and out["attempts"] == [2, 2, 2]
    assert [ep.task.question for ep in out["final"]] == [t.question for t in tasks]  # recorded on the original task
