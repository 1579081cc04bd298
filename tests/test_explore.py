"""The rollout explorer (notebooks 07-08) and doc_search's noisy expert (notebook 05's rollouts)."""

import functools
from dataclasses import replace

from agentlab.engines.scripted import scripted_generate_fn
from agentlab.envs import load
from agentlab.rollout import Renderer, run_episodes

SPEC = load("lookup")


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
