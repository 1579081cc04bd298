"""The library calls behind the command line's stages, for notebooks and scripts as much as for ``agentlab``:
synthesise an environment's tasks into a folder, read a split back, evaluate a policy into a folder.

    from agentlab.pipeline import evaluate, load_split, synth
    folder = synth("lookup", {"train": 240, "validation": 48, "test": 120})
    summary = evaluate("smollm2-135m", "lookup", load_split("lookup", "test"), Path("runs/my-eval"))
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from agentlab.paths import data_dir, shown


def tasks_dir(env: str) -> Path:
    """``data/tasks/<name>``, by the environment's own name (``--env file.py:SPEC`` included)."""
    from agentlab.envs import load

    return data_dir() / "tasks" / load(env).name


def synth(env: str, sizes: dict[str, int], seed: int = 0, demos: int = 48, folder: Path | None = None) -> Path:
    """Synthesise audited splits and expert demonstrations (from the train split) into ``folder``."""
    from agentlab.envs import load
    from agentlab.synth import audit_splits, build_splits, expert_demos, save_splits

    spec = load(env)
    if spec.expert is None:
        raise ValueError(f"environment {env!r} has no scripted expert: there is nothing to write demonstrations "
                         f"from; agentlab eval and train take its task rows directly")
    folder = folder or tasks_dir(env)
    splits = build_splits(spec, sizes, seed=seed)
    save_splits(splits, folder)
    rows = expert_demos(spec, splits["train"][:demos])
    (folder / "demos.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    audit = audit_splits(spec, splits)
    (folder / "audit.json").write_text(json.dumps({**audit, "seed": seed, "demos": len(rows)}, indent=2))
    print(f"{env}: {audit['sizes']} tasks, {len(rows)} expert demos, splits disjoint -> {shown(folder)}")
    return folder


def tasks_of(env: str, split: str, folder: Path | None = None) -> list:
    """A TRL-style class's tasks come from its rows; any other environment's from its synthesised split files."""
    from agentlab.envs import load

    spec = load(env)
    if getattr(spec.env_class, "_from_rows", False):
        return spec.make_tasks(split, 10**9)
    return load_split(env, split, folder)


def load_split(env: str, split: str, folder: Path | None = None) -> list:
    from agentlab.envs import load
    from agentlab.synth import load_tasks

    name = load(env).name  # an unknown environment is named as such, before any file is looked for
    path = (folder or tasks_dir(env)) / f"{split}.jsonl"
    quickstart = _quickstart_split(name, split) if folder is None and not path.exists() else None
    if quickstart is not None:
        # a newcomer's next command after `make quickstart`: its tasks live in its run folder, not in data/tasks
        print(f"{shown(path)} does not exist: using the quickstart's {split} split ({shown(quickstart)}); "
              f"`agentlab synth --env {env}` writes {shown(path.parent)}", flush=True)
        path = quickstart
    if not path.exists():
        raise FileNotFoundError(f"{shown(path)} does not exist; run `agentlab synth --env {env}` first")
    return load_tasks(path, env=name)


def _quickstart_split(env_name: str, split: str) -> Path | None:
    """The quickstart's ``split`` file, when the quickstart ran on ``env_name`` (else ``None``)."""
    from agentlab.paths import QUICKSTART_RUN, runs_dir

    run = runs_dir() / QUICKSTART_RUN
    config = json.loads((run / "config.json").read_text()) if (run / "config.json").exists() else {}
    found = run / "tasks" / f"{split}.jsonl"
    return found if config.get("env") == env_name and found.exists() else None


def evaluate(model_name: str, env: str, tasks: list, out_dir: Path, adapter: str | None = None, samples: int = 1,
             greedy: bool = True, loop=None, label: str = "", seed: int = 0, reuse: bool = False,
             workers: int | None = None, engine=None) -> dict:
    """Run the shared loop on ``tasks`` and write ``rollouts.jsonl``, ``summary.json`` and ``summary.png``.

    ``reuse``: when ``out_dir`` already holds a ``summary.json``, return it instead (resumable studies).
    ``workers``: processes sharing the tasks (default :func:`eval_workers`); see :func:`_evaluate_in_workers`.
    ``engine(model, tok, loop, greedy, seed) -> GenerateFn`` decodes instead of ``loop.engine`` (in this process)."""
    if reuse and (Path(out_dir) / "summary.json").exists():
        return json.loads((Path(out_dir) / "summary.json").read_text())
    from agentlab.envs import load
    from agentlab.evals import summarize
    from agentlab.plots import plot_eval_summary
    from agentlab.rollout import LoopConfig
    from agentlab.runs import _atomic_write

    spec = load(env)
    loop = (loop or LoopConfig(temperature=0.0 if greedy else 0.7)).resolved(spec)
    workers = 1 if engine is not None else min(eval_workers(env) if workers is None else workers, len(tasks))
    from agentlab.runs import RunDir

    recorded = RunDir(Path(out_dir)).rel(adapter) if adapter else None  # relative: the folder can move
    model_id = model_name + (f"+{recorded}" if adapter else "")
    t0 = time.time()
    if workers > 1:
        episodes = _evaluate_in_workers(workers, model_name, adapter, env, tasks, Path(out_dir), loop, samples, greedy,
                                        seed, model_id, label)
    else:
        from agentlab.models import load_policy

        interrupted = greedy and samples == 1 and not (Path(out_dir) / "summary.json").exists()  # else: run anew
        model, tok = load_policy(model_name, adapter=adapter)
        episodes = evaluate_resumable(
            model, tok, spec, tasks, Path(out_dir) / "rollouts.jsonl", loop, resume=interrupted, who=label,
            samples=samples, greedy=greedy, seed=seed, model_id=model_id, config_id=label, progress=True,
            generate_fn=engine(model, tok, loop, greedy, seed) if engine else None)
    summary = {"label": label, "model": model_name, "adapter": recorded, "env": env, "samples": samples,
               "greedy": greedy, "loop": dataclasses.asdict(loop), "seconds": time.time() - t0,
               "workers": max(workers, 1), **summarize(episodes)}
    if loop.engine == "auto":  # which engine that was here, and why
        from agentlab.engines.choice import choose

        summary["engine"] = choose(loop.precision)
    _atomic_write(out_dir / "summary.json", json.dumps(summary, indent=2, sort_keys=True))  # a kill: old or new
    plot_eval_summary(summary, out_dir / "summary.png")
    return summary


def eval_workers(env: str) -> int:
    """Processes an evaluation by model name uses: ``AGENTLAB_EVAL_WORKERS`` if set, else 1.

    Why 1: measured on 2 cores, 64 product_finder validation tasks, the seed-1 GRPO adapter, bf16, batch 32,
    one after the other with nothing beside them: 2 workers took 89 s against 107 s for 1 (1.20x), and 3 of the
    64 greedy outcomes differed (one thread per worker instead of two changes the bf16 reductions, and near-ties
    go the other way). A study keeps one setting for every arm and seed, so the default stays 1.

    Only an environment a fresh process can load again (shipped, ``file.py:NAME``, an installed entry point)
    runs in several; one registered in this process (a notebook cell) runs here."""
    import os

    from agentlab import envs

    if not (env in envs._MODULES or ":" in env or env in envs._entry_points()):
        return 1
    return max(1, int(os.environ.get("AGENTLAB_EVAL_WORKERS", "1")))


def _evaluate_in_workers(workers: int, model_name: str, adapter, env: str, tasks: list, out_dir: Path, loop,
                         samples: int, greedy: bool, seed: int, model_id: str, label: str) -> list:
    """Evaluation split over ``workers`` processes, each with its contiguous share of the tasks and of the cores.

    Why by hand: decoding a 135M model on a CPU is a stream of small operations, each paying the threads'
    start-and-join; one thread per process on its own share of the tasks avoids that. Each worker loads the policy
    by name (spawned, not forked: a forked OpenMP runtime can hang) and writes its own shard; the shards are joined
    in task order, group indices renumbered as one run would number them. Greedy results can differ from a
    one-process run where bf16 near-ties meet a different batch composition; a sampled run uses one seed per shard.
    """
    import concurrent.futures
    import itertools
    import multiprocessing
    import os

    from agentlab.evals import read_rollouts, write_episode
    from agentlab.rollout import _progress

    cores = len(os.sched_getaffinity(0))
    bounds = [round(i * len(tasks) / workers) for i in range(workers + 1)]
    shards = [(tasks[a:b], out_dir / f"rollouts.shard-{i}.jsonl", a)
              for i, (a, b) in enumerate(itertools.pairwise(bounds))]
    context = multiprocessing.get_context("spawn")
    bar = _progress(len(tasks) * samples, True, f"{env} episodes ({workers} processes)")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = [pool.submit(_evaluate_shard, model_name, adapter, env, shard, path, loop, samples, greedy,
                               seed + 7919 * i, model_id, label, max(1, cores // workers))
                   for i, (shard, path, _) in enumerate(shards)]
        while not all(f.done() for f in futures):
            concurrent.futures.wait(futures, timeout=1.0)
            bar.n = sum(p.read_bytes().count(b"\n") if p.exists() else 0 for _, p, _ in shards)
            bar.refresh()
        for f in futures:
            f.result()  # a worker's exception surfaces here, with its traceback
    bar.n = len(tasks) * samples
    bar.close()
    episodes = []
    with open(out_dir / "rollouts.jsonl", "w") as fh:
        for _, path, start in shards:
            for ep in read_rollouts(path)[0]:
                ep.group += start
                write_episode(fh, ep)
                episodes.append(ep)
            path.unlink()
    return episodes


def _evaluate_shard(model_name, adapter, env, tasks, path, loop, samples, greedy, seed, model_id, label,
                    threads) -> int:
    import torch

    from agentlab.envs import load
    from agentlab.models import load_policy

    torch.set_num_threads(threads)
    model, tok = load_policy(model_name, adapter=adapter)
    return len(evaluate_model(model, tok, load(env), tasks, path, loop, samples=samples, greedy=greedy, seed=seed,
                              model_id=model_id, config_id=label))


def finished_episodes(rollouts: Path, tasks: list, model_id: str) -> list:
    """The greedy episodes an interrupted evaluation of ``model_id`` on ``tasks`` already wrote to ``rollouts``
    (a torn last line dropped), the file rewritten to hold just those, so the rest is appended after them.

    Why resume at all: a doc_search test split is about an hour of 2-core CPU, and a session's end used to throw
    it away. What it costs: the remaining episodes are decoded in other batches than an uninterrupted run's, so a
    greedy near-tie can go the other way in a few of them (the same caveat as batch composition anywhere)."""
    from agentlab.evals import read_rollouts, write_rollouts

    if not rollouts.exists():
        return []
    wanted = {t.id for t in tasks}
    done = [ep for ep in read_rollouts(rollouts)[0] if ep.task.id in wanted and ep.model_id == model_id]
    write_rollouts(rollouts, done)
    return done


def evaluate_resumable(model, tok, spec, tasks: list, rollouts: Path, loop, resume: bool = True, who: str = "",
                       **episode_kwargs) -> list:
    """:func:`evaluate_model` on the tasks an interrupted greedy evaluation of ``episode_kwargs["model_id"]`` into
    ``rollouts`` did not finish (:func:`finished_episodes`; ``resume`` False: all of them, the file started anew);
    the episodes come back, and the file is rewritten, in task order, each group numbered as one uninterrupted run
    numbers it. Shared by :func:`evaluate` and training's checkpoint evaluations (a doc_search checkpoint's 64
    validation episodes are ~20 minutes here, and a session's end used to throw the finished ones away)."""
    done = finished_episodes(rollouts, tasks, episode_kwargs["model_id"]) if resume else []
    todo = [t for t in tasks if t.id not in {ep.task.id for ep in done}]
    if done:
        print(f"{who or spec.name}: {len(done)} of {len(tasks)} episodes read back from an interrupted evaluation; "
              f"{len(todo)} to go", flush=True)
    episodes = done + (evaluate_model(model, tok, spec, todo, rollouts, loop, append=bool(done), **episode_kwargs)
                       if todo else [])
    if done:
        position = {t.id: g for g, t in enumerate(tasks)}
        episodes.sort(key=lambda ep: position[ep.task.id])
        for ep in episodes:
            ep.group = position[ep.task.id]
    if episodes:  # the file holds them as they ended (or were read back); rewritten in the order they come back,
        # a reader re-reading it (and its seeded bootstrap CIs) agrees with the summary made from them
        from agentlab.evals import write_rollouts

        write_rollouts(rollouts, episodes)
    return episodes


def evaluate_model(model, tok, spec, tasks: list, rollouts_file: Path, loop, append: bool = False,
                   **episode_kwargs) -> list:
    """A loaded policy on ``tasks`` with the shared loop, in eval mode and without gradients, each episode written
    to ``rollouts_file`` as it ends (after what it holds, with ``append``); the model's train/eval mode comes back
    afterwards. The one evaluation core of :func:`evaluate` (a model by name, into a folder) and of training's
    checkpoint evaluations."""
    import torch

    from agentlab.rollout import run_episodes

    was_training = getattr(model, "training", False)
    if model is not None:
        model.eval()
    rollouts_file.parent.mkdir(parents=True, exist_ok=True)
    episode_kwargs.setdefault("progress", False)
    try:
        with torch.no_grad(), open(rollouts_file, "a" if append else "w") as fh:
            return run_episodes(model, tok, spec, tasks, config=loop, out=fh, **episode_kwargs)
    finally:
        if was_training:
            model.train()


def print_summary(summary: dict) -> None:
    s = summary["success"]
    print(f"{summary.get('label') or summary['env']}: success {s['mean']:.3f} [95% CI {s['ci_low']:.3f}, "
          f"{s['ci_high']:.3f}] over n={s['n']} episodes ({summary['seconds']:.0f} s)")
    b = summary.get("breakdown", {})
    if b:
        model = ", ".join(f"{k} {v}" for k, v in b.get("model", {}).items())
        print(f"  failures: model {b.get('model_total', 0)} ({model or 'none'}), infra {b.get('infra', 0)}")


def print_comparison(result: dict) -> None:
    """An ``agentlab compare`` result: each arm's test success, then GRPO minus each baseline (paired)."""
    print(f"\n{result['env']}, regime {result['regime']}, seed {result['seed']}: greedy success on "
          f"{result['n']} test tasks")
    for arm, e in result.items():
        if isinstance(e, dict) and {"success", "ci_low", "ci_high"} <= e.keys():
            print(f"  {arm:16s} {e['success']:.3f} [{e['ci_low']:.3f}, {e['ci_high']:.3f}]")
    for key, d in result.items():
        if key.startswith("grpo_minus_"):
            print(f"  {key:30s} {d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] (paired)")


def resolve_env(env: str, rows_file: str | None = None, eval_rows_file: str | None = None,
                reward_method: str | None = None, success_threshold: float = 1.0) -> str:
    """``env`` as a loadable name. A TRL-style class (``file.py:Class``) is built into a spec from the task rows in
    ``rows_file`` (and the held-out ``eval_rows_file`` if given) and registered under its name, so the rest runs as
    for any environment (the command line's ``--env``/``--tasks``/``--eval-rows``)."""
    from agentlab.envs import load, register
    from agentlab.refs import import_object
    from agentlab.runs import read_jsonl
    from agentlab.trl_env import is_trl_style, spec_from_class

    if ":" not in env or not rows_file:
        load(env)  # unknown names fail here, named
        return env
    cls = import_object(env)
    if not is_trl_style(cls):
        raise ValueError(f"--tasks {rows_file}: only a TRL-style class takes task rows; {env} is not one")

    def rows(path):
        if not Path(path).exists():
            raise FileNotFoundError(f"task rows file {path} does not exist")
        found, torn = read_jsonl(path)
        if torn:
            raise ValueError(f"{path}: {torn} line(s) are not JSON objects")
        return found

    eval_rows = rows(eval_rows_file) if eval_rows_file else None
    spec = register(spec_from_class(cls, rows(rows_file), reward_method=reward_method,
                                    success_threshold=success_threshold, eval_rows=eval_rows))
    print(f"{spec.name}: {spec.description}", flush=True)
    return spec.name
