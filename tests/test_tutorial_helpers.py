"""Package pieces the notebooks 05-09 stand on: sweeps, hints, scaffolds, the explorer, the noisy expert."""

import functools
from dataclasses import replace

import pytest

from agentlab.envs import load
from agentlab.rollout import Renderer, run_episodes, scripted_generate_fn
from agentlab.types import Episode, Outcome, ToolCall, Turn

SPEC = load("lookup")


# -- sweeps --------------------------------------------------------------------------------------------------------


def test_sweep_settings_vary_one_field_at_a_time_and_share_the_base():
    from agentlab.sweeps import plan, run_key, settings
    from agentlab.train import Experiment

    base = Experiment(lr=2e-4, groups_per_step=2)
    axes = {"lr": [5e-5, 2e-4, 1e-3], "groups_per_step": [1, 2, 4]}
    got = settings(base, axes)
    assert got == [{"lr": 5e-5}, {}, {"lr": 1e-3}, {"groups_per_step": 1}, {"groups_per_step": 4}]
    assert len(settings(base, axes, mode="grid")) == 9
    sweep = plan("s", base, axes)
    assert list(sweep.runs) == ["lr=5e-05", "base", "lr=0.001", "groups_per_step=1", "groups_per_step=4"]
    assert sweep.runs["lr=0.001"].name == "s/lr=0.001" and sweep.runs["lr=0.001"].groups_per_step == 2
    assert run_key({"lr": 1e-3, "groups_per_step": 4}) == "groups_per_step=4,lr=0.001"
    with pytest.raises(ValueError, match="cannot sweep"):
        settings(base, {"env": ["lookup"]})
    with pytest.raises(ValueError, match="lr=-1"):  # every run validated before any starts
        plan("s", base, {"lr": [1e-4, -1.0]})


def test_sweep_runs_land_in_run_folders_and_are_read_back(tiny, tmp_path, monkeypatch):
    """A two-run sweep with the tiny model: each setting is a finished run folder under runs/<sweep>/, the second
    call skips them, and ``select`` picks one axis back out."""
    from agentlab.sweeps import load_sweep, plan, run_sweep, select
    from agentlab.train import Experiment

    monkeypatch.setenv("AGENTLAB_RUNS", str(tmp_path))
    base = Experiment(model="tiny-random", steps=1, eval_every=1, eval_tasks=1, groups_per_step=1, group_size=2,
                      max_new_tokens=4)
    sweep = plan("sw", base, {"lr": [1e-4, 2e-4]})
    train, val = SPEC.make_tasks("train", 4, seed=0), SPEC.make_tasks("validation", 1, seed=0)
    run_sweep(sweep, train, val)
    runs = load_sweep(tmp_path / "sw")
    assert set(runs) == {"lr=0.0001", "base"} and all(r["finished"] for r in runs.values())
    assert all([m["step"] for m in r["metrics"]] == [1] and [e["step"] for e in r["evals"]] == [0, 1]
               for r in runs.values())
    assert list(select(runs, "lr", base)) == ["0.0001", "0.0002"]
    mtimes = {p: p.stat().st_mtime for p in (tmp_path / "sw").glob("*/metrics.jsonl")}
    run_sweep(sweep, train, val)  # finished runs are skipped, not redone
    assert {p: p.stat().st_mtime for p in mtimes} == mtimes


def test_a_config_field_added_later_at_its_default_keeps_old_runs_resumable(tmp_path):
    from agentlab.runs import RunDir, RunExistsError

    run = RunDir(tmp_path / "r")
    run.prepare({"lr": 1.0})
    run.prepare({"lr": 1.0, "hint_p": 0.0}, defaults={"hint_p": 0.0})
    other = RunDir(tmp_path / "r2")
    other.prepare({"lr": 1.0})
    with pytest.raises(RunExistsError, match="hint_p"):  # a non-default value is a real change
        other.prepare({"lr": 1.0, "hint_p": 0.5}, defaults={"hint_p": 0.0})


# -- hints ---------------------------------------------------------------------------------------------------------


def test_hint_schedule_is_per_group_and_switches_from_guidance_to_state():
    from agentlab.hints import HintSchedule

    s = HintSchedule(p=0.5, switch=0.5, guidance_turns=1, seed=0)
    share = sum(s.enriched(step, g) for step in range(100) for g in range(4)) / 400
    assert 0.4 < share < 0.6
    step, group = next((st, g) for st in range(1, 5) for g in range(4) if s.enriched(st, g))
    assert s.kind(step, 10, group, 1) == "guidance" and s.kind(step, 10, group, 2) == "state"
    assert s.kind(9, 10, group, 1) in ("state", None)
    assert HintSchedule(p=0.0).kind(1, 10, 0, 1) is None
    with pytest.raises(ValueError):
        HintSchedule(p=1.5)


def test_hints_reach_the_tokens_but_not_the_score_and_are_consistent_within_a_group(tiny):
    """The model sees the hinted result (in the masked tool tokens); the episode records the raw result and the
    hint separately; every sample of a group gets the same treatment."""
    from agentlab.hints import HintSchedule, observer

    _, tok = tiny
    tasks = SPEC.make_tasks("train", 6, seed=0)
    schedule = HintSchedule(p=0.5, seed=0)
    renderer = Renderer(tok, SPEC.env_class)
    eps = run_episodes(None, tok, SPEC, tasks, samples=2, generate_fn=scripted_generate_fn(renderer, tasks, SPEC.expert),
                       observe=observer("lookup", "answer", schedule, 1, 10), progress=False, step=1)
    hinted = {ep.group: bool(ep.turns[0].tool_calls[0].get("hint")) for ep in eps}
    assert set(hinted.values()) == {True, False}
    for ep in eps:
        call = ep.turns[0].tool_calls[0]
        assert bool(call.get("hint")) == hinted[ep.group] == schedule.enriched(1, ep.group)
        assert "Hint:" not in call["result"] and ep.success == 1.0
        masked = tok.decode([t for t, m in zip(ep.tokens["completion_ids"], ep.tokens["mask"], strict=True) if not m])
        assert ("Hint: use only the record" in masked) == hinted[ep.group]


def test_experiment_rejects_bad_hint_settings():
    from agentlab.train import Experiment

    with pytest.raises(ValueError, match="hint_p"):
        Experiment(hint_p=2.0)


# -- scaffolds -----------------------------------------------------------------------------------------------------


def _wrong(task):
    yield ToolCall("answer", {"value": "nobody"})


def test_grounded_verifier_accepts_only_values_seen_in_tool_results():
    from agentlab.reward_design import scripted_episode
    from agentlab.scaffolds import grounded

    task = SPEC.make_tasks("test", 1, seed=0)[0]
    assert grounded(scripted_episode(SPEC, task, SPEC.expert))
    assert not grounded(scripted_episode(SPEC, task, _wrong))
    assert not grounded(Episode(task=task, turns=[Turn("")], outcome=Outcome(final=[])))


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


# -- explorer and the noisy expert -----------------------------------------------------------------------------------


def test_episode_html_marks_trained_and_masked_tokens(tiny):
    from agentlab.explore import episode_html, groups_of
    from agentlab.reward_design import episode_advantages

    _, tok = tiny
    tasks = SPEC.make_tasks("test", 1, seed=0)
    eps = run_episodes(None, tok, SPEC, tasks, samples=2, progress=False, step=3,
                       generate_fn=scripted_generate_fn(Renderer(tok, SPEC.env_class), tasks, SPEC.expert))
    group = groups_of(eps)[(3, 0)]
    page = episode_html(eps[0], tokenizer=tok, group=group, advantages=episode_advantages(group))
    n_masked = eps[0].tokens["mask"].count(0)
    assert page.count('title="masked"') == n_masked and page.count('title="trained"') == sum(eps[0].tokens["mask"])
    assert "search_people" in page and "its group" in page
    hostile = replace(eps[0], task=replace(tasks[0], question="<script>alert(1)</script>"))
    assert "<script>" not in episode_html(hostile)


def test_noisy_expert_is_reproducible_and_spans_the_reward_range():
    from agentlab.envs.doc_search import noisy_expert
    from agentlab.reward_design import scripted_episode

    spec = load("doc_search")
    tasks = spec.make_tasks("train", 10, seed=0)
    eps = [scripted_episode(spec, t, functools.partial(noisy_expert, seed=s)) for t in tasks for s in range(4)]
    again = [scripted_episode(spec, t, functools.partial(noisy_expert, seed=s)) for t in tasks for s in range(4)]
    assert [e.outcome.final for e in eps] == [e.outcome.final for e in again]
    assert any(not e.outcome.final for e in eps)  # gave up
    assert any(e.success == 1.0 and e.metrics["precision"] < 1.0 for e in eps)  # extra chunks
    assert any(e.outcome.final and e.metrics["recall"] < 1.0 for e in eps)  # missed a fact
    assert [e.reward for e in eps] == [spec.default_reward(e)[0] for e in eps]  # scored with the env's reward


# -- the GRPO objective, drawn --------------------------------------------------------------------------------------


def test_the_objective_figure_shows_that_group_scaling_enlarges_a_small_bonus():
    """A group whose rewards differ by a 0.1 bonus gets advantages as large as a 0-or-1 group once divided by
    the group's std (scale_rewards="group"), and ten times smaller without the division."""
    import matplotlib

    matplotlib.use("Agg")
    from agentlab.plots import plot_objective
    from agentlab.reward_design import scripted_episode

    tasks = SPEC.make_tasks("train", 2, seed=0)
    episodes = [replace(scripted_episode(SPEC, tasks[g], SPEC.expert), step=1, group=g, sample=s, reward=r)
                for g, rewards in enumerate([[0.0, 0.1], [0.0, 1.0]]) for s, r in enumerate(rewards)]
    run = {"config": {"scale_rewards": "group"}, "metrics": [
        {"step": 1, "grad_norm": 0.5, "entropy": 0.9, "clip_ratio": 0.0, "completion_length": 60.0}]}
    fig = plot_objective(run, episodes)
    scaling = fig.axes[7]
    by_std, plain = (c.get_offsets().data.ravel().tolist() for c in scaling.collections)
    assert by_std == pytest.approx([0.1, 0.7071, 1.0, 0.7071], abs=1e-3)  # (spread, mean |advantage|) per group
    assert plain == pytest.approx([0.1, 0.05, 1.0, 0.5])
    assert fig.axes[1].texts[0].get_text() == "not logged"  # no KL without a reference model (β = 0)
    assert fig.axes[6].patches  # tool calls per episode drawn
