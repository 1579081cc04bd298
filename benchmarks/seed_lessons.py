"""The doc-search write-up's RL lessons, reproduced at our scale: short GRPO runs from one SFT start, 3 seeds each.

    python benchmarks/seed_lessons.py                       # every lesson, seeds 0 1 2 (hours on 2 cores: resumable)
    python benchmarks/seed_lessons.py --lessons lr --seeds 0
    python benchmarks/seed_lessons.py --gather-only         # rebuild the JSON from the run folders here
    python benchmarks/seed_lessons.py --seeds 2 --only lr_x10 few_groups   # only these runs (the rest read back)

Each lesson compares two settings that differ in one thing, from the same start (seed 0's ``sft_best`` of
``benchmarks/seed_systems.py``'s study in the regime ``START`` names), with everything else that study's GRPO
settings:

=========  =====================================================================================================
``beta``   the reward's β: F4 (recall weighs 16x precision; the study's) against F1 — do recall, precision and
           curated-set size move the way the write-up found (F4: more recall, bigger sets)?
``lr``     the study's learning rate against 10x it: does the high one collapse (validation falls, entropy falls)?
``batch``  few groups a step (1 task x 16 rollouts) against many (the study's 4 x 4), equal rollouts: does
           curate-everything appear (curated-set size up, precision down)?
``penalty``  the empty-set penalty (-0.2 for curating nothing) against none: how often is nothing curated?
``format``   format shaping: +0.1 for an episode that ends with ``finish`` and no off-form call, against the study's
           reward, which pays F4 wherever an episode stops (the ``cheap:64`` study's GRPO learned to never finish,
           spending every turn): does the bonus keep episodes finishing, and at what cost in F4?
=========  =====================================================================================================

Runs are ``runs/seed-lessons/doc_search/<regime>/<setting>/seed-<k>`` (settings shared by lessons run once). Every run's last
checkpoint is evaluated greedily on the same validation tasks (the study's, ≥ 64); a lesson reports each setting's
metrics pooled over seeds (mean and 95% bootstrap CI over (seed, task) pairs), per-seed means, the difference paired
over (seed, task), and the training side (policy entropy, zero-variance groups). Writes the ``lessons`` entry of
``benchmarks/results/seed_systems.json``. A lesson that does not reproduce is reported as such, with its numbers.
A finished run travels as its records (``agentlab pack RUN --to benchmarks/carry --records``: ~8 MB, no adapter).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import RESULTS, carry_in, write_result
from seed_systems import STUDY, seed_name

METRICS = ("f4", "f1", "precision", "recall", "curated", "success", "empty", "finished")
# One validation, of the last checkpoint (the one a lesson reads): on a CPU GRPO saves every step, so a stopped run
# resumes where it stopped without a mid-run evaluation (~20 minutes of doc_search validation each).
STEPS, EVAL_EVERY = 6, 6
# The regime whose seed-0 sft_best the lessons start from: doc_search's `cheap:64` study (seed_systems.py --regime
# cheap:64), the start GRPO trains from in docs/seed_systems.md; notebook 06 reads runs/seed-lessons/doc_search/cheap-64.
START = {"doc_search": "cheap:64"}
SETTINGS = {  # name -> the Experiment fields that differ from the study's GRPO experiment
    "base": {},
    "f1": {"reward": "f1=1,empty=-0.2"},
    "lr_x10": {"lr_factor": 10.0},
    "few_groups": {"groups_per_step": 1, "group_size": 16},  # against base's 4 x 4: the same 16 rollouts a step
    "no_penalty": {"reward": "f4=1"},
    "finish_bonus": {"reward": "f4=1,empty=-0.2,format=0.1"},
}
# In the order they run: notebook 06 reads the first two (its learning-rate and batch sections) from these runs; the
# third asks whether paying for a finish stops the study's GRPO from learning to spend every turn.
LESSONS = {"lr": ("base", "lr_x10"), "batch": ("few_groups", "base"), "format": ("base", "finish_bonus"),
           "beta": ("base", "f1"), "penalty": ("base", "no_penalty")}


def experiment(start: Path, setting: str, seed: int):
    """The study's GRPO experiment (its config.json), shortened, with ``setting`` applied."""
    from agentlab.compare import CompareConfig

    cfg = json.loads((start / "config.json").read_text())
    study = CompareConfig.of(**{k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items()})  # flat names
    exp = replace(study.grpo, name=f"seed-lessons/{study.env}/{study.regime.replace(':', '-')}/{setting}/"
                  f"seed-{seed}", seed=seed,
                  steps=STEPS, eval_every=EVAL_EVERY)
    diff = dict(SETTINGS[setting])
    if factor := diff.pop("lr_factor", None):
        diff["lr"] = exp.lr * factor
    return replace(exp, **diff)


def log_session(run: Path, started: str | None = None) -> None:
    """One line in the run's ``sessions.jsonl`` per start (:func:`agentlab.machine.session_line`), with the GRPO
    steps already done. A lesson's seeds run on whatever machine a session has (bf16 on AMX, fp32 on AVX2-only
    CPUs); this says which ran where."""
    from agentlab.machine import session_line
    from agentlab.runs import RunDir

    folder = RunDir(run)
    run.mkdir(parents=True, exist_ok=True)
    folder.append(run / "sessions.jsonl", session_line(started, steps_before=len(folder.checkpoints())))


def machines(run: Path) -> list[str]:
    """The distinct ``cpu_class/precision`` a run's sessions ran on, in order (empty: unrecorded)."""
    from agentlab.runs import read_jsonl

    return list(dict.fromkeys(f"{r['cpu_class']}/{r['precision']}" for r in read_jsonl(run / "sessions.jsonl")[0]))


def finished(folder: Path) -> list[int]:
    """The seeds whose run under ``folder`` (one setting's ``seed-<k>`` folders) has finished, ascending."""
    from agentlab.runs import RunDir

    return sorted(int(p.name.removeprefix("seed-")) for p in folder.glob("seed-*") if RunDir(p.resolve()).finished)


def run_metrics(run: Path) -> dict:
    """A finished run's last validation checkpoint (per-task metrics), its training side and its machines."""
    from agentlab.evals import read_rollouts
    from agentlab.runs import RunDir

    r = RunDir(run)
    last = r.evals()[-1]["step"]
    episodes = read_rollouts(run / "evals" / f"step-{last:04d}.rollouts.jsonl")[0]
    per_task = {ep.task.id: {m: (float(not ep.outcome.final) if m == "empty" else
                                 ep.success if m == "success" else ep.metrics.get(m, 0.0)) for m in METRICS}
                for ep in episodes}
    steps = r.metrics()
    train = {k: [s.get(k) for s in steps] for k in ("entropy", "zero_variance_groups", "reward_mean")}
    return {"step": last, "per_task": per_task, "train": train, "machines": machines(run)}


def pooled(values: list[float]) -> dict:
    from agentlab.evals import mean_ci

    return {k: round(v, 4) if isinstance(v, float) else v for k, v in mean_ci(values).items()}


def lesson_entry(a: str, b: str, runs: dict) -> dict:
    """Settings ``a`` and ``b`` over the seeds both finished: pooled metrics, per-seed means, ``b − a`` paired."""
    from agentlab.evals import paired_bootstrap_ci

    seeds = sorted(set(runs[a]) & set(runs[b]))
    out = {"settings": {a: SETTINGS[a], b: SETTINGS[b]}, "seeds": seeds, "steps": STEPS}
    for name in (a, b):
        out[name] = {m: pooled([t[m] for s in seeds for t in runs[name][s]["per_task"].values()]) for m in METRICS}
        out[name]["per_seed"] = {m: [round(sum(t[m] for t in runs[name][s]["per_task"].values())
                                           / len(runs[name][s]["per_task"]), 4) for s in seeds] for m in METRICS}
        out[name]["train"] = {k: [runs[name][s]["train"][k] for s in seeds] for k in ("entropy", "zero_variance_groups")}
        out[name]["machines"] = [runs[name][s].get("machines", []) for s in seeds]  # per seed; [] where unrecorded
    diff = {}
    for m in METRICS:
        pairs = [(runs[a][s]["per_task"][t][m], runs[b][s]["per_task"][t][m])
                 for s in seeds for t in runs[a][s]["per_task"] if t in runs[b][s]["per_task"]]
        low, high = paired_bootstrap_ci([x for x, _ in pairs], [y for _, y in pairs])
        diff[m] = {"mean": round(sum(y - x for x, y in pairs) / len(pairs), 4), "ci_low": low, "ci_high": high}
    out[f"{b}_minus_{a}"] = diff
    return out


# The table's metric columns: METRICS key -> header. `finished`: the share of episodes that ended with a finish call.
TABLE_METRICS = {"f4": "F4", "precision": "precision", "recall": "recall", "curated": "curated-set size",
                 "success": "success", "finished": "finished"}


def _paired(x: dict) -> str:
    """A paired difference as ``+mean [low, high]``."""
    return f"{x['mean']:+.3f} [{x['ci_low']:+.3f}, {x['ci_high']:+.3f}]"


def _last_entropy(setting: dict) -> str:
    """A setting's policy entropy at its runs' last step, averaged over seeds."""
    last = [s[-1] for s in setting["train"]["entropy"] if s and s[-1] is not None]
    return f"{sum(last) / len(last):.3f}" if last else "—"


def markdown_table(out: dict) -> str:
    """docs/seed_systems.md's lessons table: per lesson, both settings' validation figures pooled over the seeds both
    finished (``a → b``), the paired ``b − a`` (bold where its 95% CI excludes 0), and the last step's entropy."""
    lessons = out.get("lessons", {})
    done = [name for name in LESSONS if name in lessons]
    if not done:
        return "*No lesson has finished a seed yet: `python benchmarks/seed_lessons.py` writes them.*"
    start = lessons.get("start", {})
    rows = [(f"*From `{start.get('regime', '?')}` seed 0's `sft_best` (lr {start.get('adapter', '?')} steps), "
             f"{STEPS} GRPO steps a run, each run's last checkpoint greedy on the study's validation tasks; "
             "a → b pooled over (seed, task), b − a paired on the same tasks (bold: 95% CI excludes 0).*"), "",
            "| lesson | a → b | seeds | " + " | ".join(TABLE_METRICS.values()) + " | entropy, last step |",
            "|" + "---|" * (4 + len(TABLE_METRICS))]
    for name in done:
        e = lessons[name]
        a, b = LESSONS[name]
        d = e[f"{b}_minus_{a}"]
        cells = []
        for m in TABLE_METRICS:
            diff = _paired(d[m])
            excludes = d[m]["ci_low"] > 0 or d[m]["ci_high"] < 0
            cells.append(f"{e[a][m]['mean']:.3f} → {e[b][m]['mean']:.3f}; {'**' + diff + '**' if excludes else diff}")
        rows.append(f"| {name} | `{a}` → `{b}` | {', '.join(map(str, e['seeds']))} | " + " | ".join(cells)
                    + f" | {_last_entropy(e[a])} → {_last_entropy(e[b])} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    from agentlab.compare import search_validation
    from agentlab.paths import runs_dir
    from agentlab.runs import RunDir
    from agentlab.synth import load_tasks
    from agentlab.train import run_grpo

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="doc_search")
    p.add_argument("--lessons", nargs="+", default=list(LESSONS), choices=list(LESSONS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--gather-only", action="store_true")
    p.add_argument("--only", nargs="+", default=None, choices=list(SETTINGS), metavar="SETTING",
                   help="run only these settings (the rest are read back where finished): fit a session's hours")
    p.add_argument("--regime", default=None, help="start from that regime's seed-0 sft_best (seed_systems.py "
                   "--regime) instead of START's")
    a = p.parse_args(argv)
    regime = a.regime or START.get(a.env, STUDY[a.env]["regime"])
    carry_in()
    start = runs_dir() / seed_name(a.env, regime, 0)
    choice = start / "sft_best" / "choice.json"
    if not choice.exists():
        raise SystemExit(f"{choice} does not exist: run benchmarks/seed_systems.py --env {a.env} --seeds 0 first "
                         f"(the lessons start from its sft_best)")
    chosen = json.loads(choice.read_text())
    adapter = start / chosen["adapter"]
    scored = search_validation(adapter, chosen["steps"])  # step 0 of a run under the study's reward
    train, val = load_tasks(start / "tasks" / "train.jsonl"), load_tasks(start / "tasks" / "validation.jsonl")
    settings = list(dict.fromkeys(s for lesson in a.lessons for s in LESSONS[lesson]))
    runs: dict[str, dict[int, dict]] = {s: {} for s in settings}
    for seed in a.seeds:  # seed-major: each finished seed completes every lesson's pair before the next starts
        for setting in settings:
            exp = experiment(start, setting, seed)
            folder = runs_dir() / exp.name
            if not a.gather_only and (a.only is None or setting in a.only) and not RunDir(exp.name).finished:
                print(f"[{setting} seed {seed}] {STEPS} GRPO steps from {adapter.parent.name}/{adapter.name}", flush=True)
                log_session(folder)
                run_grpo(exp, train, val, init_adapter=adapter, start_eval=scored)
    for setting in settings:  # every finished seed, not only this call's: `--seeds 2` must not drop seeds 0 and 1
        folder = (runs_dir() / experiment(start, setting, 0).name).parent
        for seed in finished(folder):
            runs[setting][seed] = run_metrics(folder / f"seed-{seed}")
    path = RESULTS / "seed_systems.json"
    out = json.loads(path.read_text()) if path.exists() else {}
    lessons = out.setdefault("lessons", {})
    lessons["start"] = {"regime": regime, "adapter": f"{chosen['lr']:g} x {chosen['steps']}"}
    for lesson in a.lessons:
        x, y = LESSONS[lesson]
        if set(runs[x]) & set(runs[y]):
            lessons[lesson] = lesson_entry(x, y, runs)
            d = lessons[lesson][f"{y}_minus_{x}"]
            print(f"{lesson}: {y} − {x} over seeds {lessons[lesson]['seeds']}: "
                  + ", ".join(f"{m} {_paired(d[m])}" for m in METRICS))
    print(f"-> {write_result('seed_systems.json', out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
