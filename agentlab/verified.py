"""The arms of ``agentlab compare`` that use the verifier without RL: ``rft`` and ``expert_iteration``.

Both start from ``sft_best``, sample at GRPO's temperature, keep what the verifier calls a success and fine-tune on
it, within GRPO's training seconds; both keep their best checkpoint on validation, as GRPO does. They answer the
reviewer's question "is it RL, or verifier-filtered on-policy data, that does the work?":

==================  ================================================================================================
``rft``             one round: sample for half the budget, keep one success per task, SFT on those plus the
                    regime's demonstrations for the other half
``expert_iteration`` ``rounds`` rounds of (sample G per training task, keep every *distinct* verified success, SFT on
                    all kept so far from the previous round's adapter) — no demonstrations after the start
==================  ================================================================================================

``cmp`` is the :class:`agentlab.compare.Comparison` whose stages these are (its config, run folder, evaluation and
records); nothing here imports it, so the module sits below ``compare.py``.
"""

from __future__ import annotations

import time
from pathlib import Path

from agentlab.synth import episode_sft_row
from agentlab.types import Episode, Task


def sample(cmp, adapter: Path, tasks: list[Task], budget_s: float, file: Path, key: str,
           seed_base: int) -> tuple[list[Episode], list[Task]]:
    """G samples per task (``groups_per_step`` tasks a batch, GRPO's temperature) appended to ``file`` until
    ``budget_s`` seconds are spent (recorded under ``key`` in the comparison's ``seconds.json``, so a killed run
    resumes with what it spent) or ``tasks`` run out. Returns every episode in ``file`` and the tasks not sampled."""
    from agentlab.evals import read_rollouts, repair_rollouts
    from agentlab.models import load_policy
    from agentlab.rollout import run_episodes

    cfg = cmp.cfg
    episodes = read_rollouts(file)[0] if file.exists() else []
    done_ids = {ep.task.id for ep in episodes}
    todo = [t for t in tasks if t.id not in done_ids]
    spent = cmp.seconds.get(key, 0.0)
    if spent < budget_s and todo:
        model, tok = load_policy(cfg.model, adapter=adapter)
        loop = cfg.grpo.loop()  # GRPO's sampling: its temperature and batch
        file.parent.mkdir(parents=True, exist_ok=True)
        if file.exists():
            repair_rollouts(file)  # a kill mid-write left a torn line: cut it before appending
        with open(file, "a") as fh:
            while spent < budget_s and todo:
                t0 = time.time()
                batch, todo = todo[: cfg.grpo.groups_per_step], todo[cfg.grpo.groups_per_step:]
                seed = seed_base + len(done_ids)
                run_episodes(model, tok, cmp.spec, batch, samples=cfg.grpo.group_size, config=loop, seed=seed, out=fh,
                             progress=False,
                             generate_fn=cmp.engine(model, tok, loop, False, seed) if cmp.engine else None)
                done_ids.update(t.id for t in batch)
                spent += time.time() - t0
                # Unrounded: a resumed run compares it with the budget again, and a value rounded below the budget
                # would sample another batch the first run never drew (its result would then differ).
                cmp.clock.record(key, spent)
        episodes = read_rollouts(file)[0]
    return episodes, todo


def verified(episodes: list[Episode]) -> list[Episode]:
    """The verified successes (no infra or policy failure), each distinct (task, generated tokens) once."""
    seen, out = set(), []
    for ep in episodes:
        key = (ep.task.id, tuple(ep.tokens.get("completion_ids", ())))
        if ep.success >= 1.0 and ep.failure is None and key not in seen:
            seen.add(key)
            out.append(ep)
    return out


def rft(cmp, start: dict, budget_s: float, train: list[Task], val: list[Task]) -> dict:
    """Rejection sampling for half of GRPO's seconds, then SFT on verified successes (one per task) plus the
    demonstrations for the other half, from ``sft_best``, checkpoints chosen on validation."""
    from agentlab.train import run_sft

    folder = cmp.run.path / "rft"
    if not (folder / "adapter" / "adapter_config.json").exists():
        episodes, _ = sample(cmp, cmp.adapter(start), train, budget_s / 2, folder / "samples.jsonl", "rft_sampling",
                             cmp.cfg.seed * 100_003)
        spent = cmp.seconds.get("rft_sampling", 0.0)
        kept: dict[str, Episode] = {}
        for ep in verified(episodes):
            kept.setdefault(ep.task.id, ep)
        rows = cmp.demos() + [episode_sft_row(ep) for ep in kept.values()]
        left = max(1.0, budget_s - spent)
        run_sft(cmp.cfg.model, rows, folder, cmp.sft_settings(start["lr"], 100_000),
                init_adapter=cmp.adapter(start), max_seconds=left, save_every_s=left / cmp.checkpoints())
        cmp.run.write_json("rft/pool.json", {"tasks_sampled": len({ep.task.id for ep in episodes}),
                                             "episodes": len(episodes), "kept": len(kept), "sampling_s": spent})
    choice = {**cmp.choose("rft", folder, start["lr"], val), **cmp.run.read_json("rft/pool.json")}
    cmp.run.write_json("rft/choice.json", choice)
    return choice


def expert_iteration(cmp, start: dict, budget_s: float, train: list[Task], val: list[Task]) -> dict:
    """``cfg.ei_rounds`` rounds within GRPO's seconds, each half sampling (the next training tasks, G each) and
    half SFT on every distinct verified success kept so far, continuing the previous round's adapter (the first
    round's: ``sft_best``); each round's adapter scored on validation, the best kept (ties: the earlier round).
    A round that keeps nothing trains nothing: its adapter is the previous one, and its figure the one already
    measured (the start's from its search) rather than a second pass over the same validation tasks."""
    from agentlab.train import run_sft

    folder, rounds = cmp.run.path / "expert_iteration", cmp.cfg.ei_rounds
    per_round, adapter, kept, todo = budget_s / rounds, cmp.adapter(start), [], list(train)
    log = cmp.run.read_json("expert_iteration/rounds.json") or {"rounds": []}
    best = None
    for r in range(1, rounds + 1):
        here = folder / f"round-{r}"
        episodes, todo = sample(cmp, adapter, todo, per_round / 2, here / "samples.jsonl", f"ei_round{r}_sampling",
                                cmp.cfg.seed * 100_003 + r * 10_007)
        new = verified(episodes)
        kept += new
        if kept and not (here / "adapter" / "adapter_config.json").exists():
            left = max(1.0, per_round - cmp.seconds.get(f"ei_round{r}_sampling", 0.0))
            run_sft(cmp.cfg.model, [episode_sft_row(ep) for ep in kept], here,
                    cmp.sft_settings(start["lr"], 100_000), init_adapter=adapter, max_seconds=left)
        if (here / "adapter" / "adapter_config.json").exists():
            adapter = here / "adapter"
        if len(log["rounds"]) < r:
            log["rounds"].append({"round": r, "sampled": len(episodes), "kept_new": len(new),
                                  "kept_total": len(kept), "adapter": cmp.run.rel(adapter)})
            cmp.run.write_json("expert_iteration/rounds.json", log)
        if adapter == cmp.adapter(start):  # nothing kept yet: still the start, as its search scored it
            figure = dict(start["validation"])
        else:
            figure = cmp.figure(cmp._timed(f"expert_iteration_round{r}_validation", cmp.evaluate, here / "validation",
                                           adapter, val, f"expert_iteration round {r}"))
        point = {"arm": "expert_iteration", "regime": cmp.cfg.data(), "lr": start["lr"], "steps": r,
                 "validation": figure}
        cmp._tried(point)
        if best is None or point["validation"][cmp.cfg.select] > best[0]["validation"][cmp.cfg.select]:
            best = (point, adapter)
        if not todo:
            break
    point, adapter = best
    choice = {"adapter": cmp.run.rel(adapter), "round": point["steps"], "validation": point["validation"],
              "rounds": log["rounds"]}
    cmp.run.write_json("expert_iteration/choice.json", choice)
    return choice
