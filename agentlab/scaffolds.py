"""Evaluation scaffolds: spend more inference on a task without changing the policy.

* :func:`parallel_best_of_n` — sample n episodes per task, let a *verifier* pick one.
* :func:`sequential_refinement` — run, check, and if the check fails run again with feedback about the last
  attempt in the prompt, up to ``rounds`` attempts.

The verifier must not see the reference answer — otherwise it is an oracle, and "best-of-n" is pass@n. The
default, :func:`grounded`, only asks whether the submitted answer appears verbatim in a tool result the
episode itself saw (an answer the agent could not have read is a guess). Scores are always the environment's
own ``success`` on the unmodified task, so scaffolds compare with plain evaluation on the same tasks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from agentlab.rollout import LoopConfig, run_episodes
from agentlab.types import Episode

Verifier = Callable[[Episode], bool]


def grounded(ep: Episode, final_tool: str | None = None) -> bool:
    """The episode submitted something, and every submitted value occurs in a result of one of its own look-up
    calls: the final tool's results (``recommend`` and ``return_answer`` echo the submitted id back) and error
    messages (a failed read names what it was asked for) do not count as seen, or every answer would be grounded.

    ``final_tool``: the tool that submits the answer; default: the episode's environment's (``EnvSpec``).
    Meant for single-value answers (lookup, product_finder, code_search); a set-valued environment whose look-up
    tools echo the ids (doc_search's ``curate``) needs its own verifier.
    """
    if final_tool is None:
        from agentlab.envs import load

        final_tool = load(ep.task.env).env_class.final_tool
    answers = [str(a).strip().lower() for a in ep.outcome.final if str(a).strip()]
    seen = "\n".join(str(c.get("result", "")) for t in ep.turns for c in t.tool_calls
                     if c.get("name") != final_tool and not c.get("error")).lower()
    return bool(answers) and all(a in seen for a in answers)


def parallel_best_of_n(model, tok, spec, tasks, n: int, config: LoopConfig, verifier: Verifier = grounded,
                       seed: int = 0, progress: bool = True, **loop) -> dict:
    """n sampled episodes per task; the first one the verifier accepts is chosen (sample 0 if none is).

    Returns ``{"chosen": [Episode per task], "samples": [all episodes], "accepted": share of tasks with an
    accepted sample}``; the oracle upper bound is ``agentlab.evals.best_of_n(samples, n)``. ``loop``: more
    ``run_episodes`` arguments (``generate_fn`` for another backend or a scripted test policy).
    """
    if n < 1:
        raise ValueError(f"n={n} must be >= 1")
    samples = run_episodes(model, tok, spec, tasks, samples=n, config=config, seed=seed, progress=progress, **loop)
    chosen, accepted = [], 0
    for i in range(len(tasks)):
        group = samples[i * n:(i + 1) * n]
        ok = [ep for ep in group if verifier(ep)]
        accepted += bool(ok)
        chosen.append(ok[0] if ok else group[0])
    return {"chosen": chosen, "samples": samples, "accepted": accepted / max(1, len(tasks))}


def feedback(ep: Episode) -> str:
    """What the next attempt is told about a rejected one (no reference answer involved)."""
    if not ep.outcome.final or not any(str(a).strip() for a in ep.outcome.final):
        return "A previous attempt gave no answer. Search first, then answer with a value copied from a result."
    given = ", ".join(str(a) for a in ep.outcome.final)[:120]
    return (f"A previous attempt answered {given!r}, but that value does not appear in any result it retrieved. "
            "Search again and copy the value exactly from the matching record.")


def sequential_refinement(model, tok, spec, tasks, rounds: int, config: LoopConfig, verifier: Verifier = grounded,
                          greedy: bool = True, seed: int = 0, progress: bool = True, **loop) -> dict:
    """Attempt 1 on every task; each task whose attempt fails the verifier gets another attempt with
    :func:`feedback` appended to its question, up to ``rounds`` attempts. The last attempt counts.

    Returns ``{"final": [Episode per task], "attempts": [attempts used per task], "per_round": [success after
    each round]}``; every episode is scored against the original task.
    """
    if rounds < 1:
        raise ValueError(f"rounds={rounds} must be >= 1")
    final: list[Episode | None] = [None] * len(tasks)
    attempts = [0] * len(tasks)
    todo = list(range(len(tasks)))
    prompts = list(tasks)
    per_round = []
    for r in range(rounds):
        eps = run_episodes(model, tok, spec, [prompts[i] for i in todo], config=config, greedy=greedy,
                           seed=seed + r, progress=progress, **loop)
        retry = []
        for i, ep in zip(todo, eps, strict=True):
            final[i] = replace(ep, task=tasks[i])  # scored on, and recorded as, the original task
            attempts[i] += 1
            if not verifier(ep):
                retry.append(i)
                prompts[i] = replace(tasks[i], question=f"{tasks[i].question}\n\n{feedback(ep)}")
        per_round.append(sum(ep.success for ep in final) / len(tasks))
        todo = retry
        if not todo:
            per_round += [per_round[-1]] * (rounds - r - 1)
            break
    return {"final": final, "attempts": attempts, "per_round": per_round}
