"""Ablations as plain run folders: one GRPO run per setting, read back and overlaid in notebook 06.

    agentlab sweep --name lr-sweep --init-adapter runs/quickstart/sft/adapter --tasks runs/quickstart/tasks \\
        --lr 5e-5,1e-4,2e-4,5e-4,1e-3 --groups-per-step 1,2,4 --steps 8

By default each axis is varied *one at a time* around the base experiment (``--mode axes``: 5 + 3 settings, the
base shared, 7 runs) — on a CPU a full grid (``--mode grid``: 15 runs) costs twice as much for little more
insight. Every run is an ordinary ``runs/<sweep>/<key>/`` folder written by :func:`agentlab.train.run_grpo`, so
an interrupted sweep resumes where it stopped, finished runs are skipped, and a GPU sweep's folders read the
same way (:func:`load_sweep` needs only the files, never a model).
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

from agentlab.runs import RunDir, held_out
from agentlab.train import Experiment

SWEEPABLE = ("lr", "groups_per_step", "group_size", "temperature", "beta", "max_turns", "lora_r", "seed", "hint_p")


def _fmt(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def settings(base: Experiment, axes: dict[str, list], mode: str = "axes", seeds: tuple[int, ...] = ()) -> list[dict]:
    """The settings a sweep runs, each a dict of the fields that differ from ``base`` (``{}`` is the base).

    ``seeds``: every setting once per seed (the seed changes GRPO's sampling and the order prompts are drawn in),
    so a conclusion can rest on more than one run.

    >>> settings(Experiment(lr=2e-4, groups_per_step=2), {"lr": [1e-4, 2e-4], "groups_per_step": [1, 2]})
    [{'lr': 0.0001}, {}, {'groups_per_step': 1}]
    >>> settings(Experiment(lr=2e-4, seed=0), {"lr": [1e-4, 2e-4]}, seeds=(0, 1))
    [{'lr': 0.0001}, {'lr': 0.0001, 'seed': 1}, {}, {'seed': 1}]
    """
    bad = [k for k in axes if k not in SWEEPABLE]
    if bad:
        raise ValueError(f"cannot sweep {bad}; sweepable fields: {list(SWEEPABLE)}")
    if seeds and "seed" in axes:
        raise ValueError("give the seeds either as an axis (seed=...) or as repeats (seeds=...), not both")
    if mode not in ("axes", "grid"):
        raise ValueError(f"mode={mode!r}; expected 'axes' (one field at a time) or 'grid' (every combination)")
    if mode == "grid":
        combos = [dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())]
    else:
        combos = [{name: v} for name, values in axes.items() for v in values]
    out: list[dict] = []
    for combo in combos:
        diff = {k: v for k, v in combo.items() if getattr(base, k) != v}
        if diff not in out:
            out.append(diff)
    if seeds:
        out = [{**diff, "seed": seed} if seed != base.seed else diff for diff in out for seed in dict.fromkeys(seeds)]
    return out


def run_key(diff: dict) -> str:
    """Folder name of one setting: ``base``, ``lr=0.0001`` or ``groups_per_step=4,lr=0.001``."""
    return ",".join(f"{k}={_fmt(v)}" for k, v in sorted(diff.items())) or "base"


@dataclass(frozen=True)
class SweepPlan:
    name: str
    base: Experiment
    runs: dict[str, Experiment]  # key -> experiment

    def describe(self) -> str:
        lines = [(f"sweep {self.name!r}: {len(self.runs)} runs of {self.base.steps} steps "
                 f"({self.base.env}, base lr {self.base.lr:g}, {self.base.groups_per_step} x {self.base.group_size})")]
        lines += [f"  {key}" for key in self.runs]
        return "\n".join(lines)


def plan(name: str, base: Experiment, axes: dict[str, list], mode: str = "axes",
         seeds: tuple[int, ...] = ()) -> SweepPlan:
    """Validate every experiment of the sweep before any of them starts."""
    runs = {run_key(d): replace(base, name=f"{name}/{run_key(d)}", **d) for d in settings(base, axes, mode, seeds)}
    return SweepPlan(name, base, runs)


def run_sweep(sweep: SweepPlan, train_tasks, eval_tasks, init_adapter: str | Path | None = None) -> RunDir:
    """Run each setting in turn (finished runs skipped, a half-done one resumed); write ``sweep.json``."""
    from agentlab.train import run_grpo

    root = RunDir(sweep.name)
    root.path.mkdir(parents=True, exist_ok=True)
    root.write_json("sweep.json", {"name": sweep.name, "base": sweep.base.to_config(),
                                   "init_adapter": str(init_adapter) if init_adapter else None,
                                   "runs": {k: e.to_config() for k, e in sweep.runs.items()}})
    todo = [key for key, exp in sweep.runs.items() if not RunDir(exp.name).finished]
    print(f"[{sweep.name}] {len(todo)} of {len(sweep.runs)} runs to train"
          + (f", {len(sweep.runs) - len(todo)} finished (read back)" if len(todo) < len(sweep.runs) else ""), flush=True)
    spent = []
    for i, (key, exp) in enumerate(sweep.runs.items(), 1):
        if key not in todo:
            print(f"[{i}/{len(sweep.runs)}] {key}: finished, skipped", flush=True)
            continue
        print(f"[{i}/{len(sweep.runs)}] {key}", flush=True)
        t0 = time.perf_counter()
        run_grpo(exp, train_tasks, eval_tasks, init_adapter=init_adapter, run=RunDir(exp.name))
        spent.append(time.perf_counter() - t0)
        left = len(todo) - len(spent)
        print(f"[{i}/{len(sweep.runs)}] {key}: {spent[-1] / 60:.1f} min"
              + (f"; {left} to go, about {left * sum(spent) / len(spent) / 60:.0f} min at this pace" if left else ""),
              flush=True)
    return root


def load_run(path: str | Path) -> dict:
    """Everything a plot needs from one run folder: config, per-step metrics, checkpoint evals (sorted)."""
    run = RunDir(Path(path).resolve())
    metrics = run.metrics() if run.metrics_file.exists() else []
    return {"path": str(run.path), "config": json.loads(run.config_file.read_text()), "metrics": metrics,
            "evals": run.evals(), "finished": run.finished}


def load_sweep(path: str | Path) -> dict[str, dict]:
    """``{key: load_run(...)}`` for every run folder under a sweep (or any folder of run folders)."""
    path = Path(path)
    return {p.parent.name: load_run(p.parent) for p in sorted(path.glob("*/config.json"))}


def _axis_runs(runs: dict[str, dict], field: str, base: Experiment | dict, ignore: tuple[str, ...] = ()):
    """``(value, run)`` for each run differing from ``base`` in ``field`` only (fields in ``ignore`` aside)."""
    base = base.to_config() if isinstance(base, Experiment) else base
    for run in runs.values():
        cfg = run["config"]
        if not [k for k in SWEEPABLE if k not in (field, *ignore) and k in cfg and cfg[k] != base.get(k)]:
            yield _fmt(cfg[field]), run


def select(runs: dict[str, dict], field: str, base: Experiment | dict) -> dict[str, dict]:
    """The runs of one axis: those differing from ``base`` in ``field`` only (the base included), by value."""
    return dict(sorted(_axis_runs(runs, field, base), key=lambda kv: float(kv[0])))


def select_seeds(runs: dict[str, dict], field: str, base: Experiment | dict) -> dict[str, list[dict]]:
    """Like :func:`select`, but every seed of a setting kept: ``{value: [run per seed, by seed]}``."""
    keep: dict[str, list[dict]] = {}
    for value, run in _axis_runs(runs, field, base, ignore=("seed",)):
        keep.setdefault(value, []).append(run)
    return {k: sorted(v, key=lambda r: r["config"].get("seed", 0))
            for k, v in sorted(keep.items(), key=lambda kv: float(kv[0]))}


def final_success(runs: list[dict], metric: str = "success") -> dict:
    """The last checkpoint's validation ``metric`` (success, or ``held_out:<name>``, :func:`agentlab.runs.held_out`)
    of each seed's run, their mean and range: ``{"per_seed", "mean", "low", "high", "step"}`` (runs that have no
    evaluation yet, or none with the metric, are left out)."""
    finals = [(e["step"], v["mean"]) for r in runs if r["evals"] and (v := held_out(e := r["evals"][-1], metric))]
    values = [v for _, v in finals]
    if not values:
        return {"per_seed": [], "mean": float("nan"), "low": float("nan"), "high": float("nan"), "step": None}
    return {"per_seed": values, "mean": sum(values) / len(values), "low": min(values), "high": max(values),
            "step": min(step for step, _ in finals)}


def load_seeded(path: str | Path) -> dict[str, list[dict]]:
    """``{setting: [load_run(...) per seed, by seed]}`` for a folder laid out ``<setting>/seed-<k>/`` (the lessons of
    ``benchmarks/seed_lessons.py``); a setting with no run folder yet is left out."""
    out: dict[str, list[dict]] = {}
    for config in sorted(Path(path).glob("*/seed-*/config.json"), key=lambda p: int(p.parent.name.split("-")[1])):
        out.setdefault(config.parent.parent.name, []).append(load_run(config.parent))
    return dict(sorted(out.items()))
