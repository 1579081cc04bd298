"""GRPO's steps with no signal: today's behaviour (AdamW steps on its momentum) against ``skip_zero_signal`` (the
optimiser left alone, ``agentlab.update_guard``), from one SFT start, the same seeds and steps.

    python benchmarks/zero_signal.py                       # both modes x seeds 0, 1, 2 (resumable run folders)
    python benchmarks/zero_signal.py --sft-lr 3e-4 --sft-steps 16   # another start (each start its own entry)
    python benchmarks/zero_signal.py --gather-only         # rebuild the start's entry from finished runs

The start is the quickstart's, at one SFT setting instead of its search: the quickstart's tasks and demonstrations
(``QuickstartConfig``, seed 0: 48 successful traces of lookup's cheap strategy) and SFT at ``--sft-lr`` x
``--sft-steps``; the default, 1e-3 x 4, is what the quickstart's search chose on an AVX2-only machine
(``benchmarks/results/quickstart_avx2.json``), the start from which every GRPO group after step 1 had zero variance.
GRPO is the quickstart's (``quickstart._grpo_default``: 12 steps x 2 prompts x 4 rollouts at T = 1.0), evaluated
greedily on the 48 validation tasks every ``--eval-every`` steps.

Writes ``benchmarks/results/zero_signal.json``: ``{"starts": {"sft-lr=…-steps=…": entry}}`` (other starts' entries
kept), each entry with the start's validation, per mode and seed the validation curve, which steps had a zero
gradient, the adapter's L2 distance from the start at each evaluated checkpoint and the seconds; per mode the last
checkpoint pooled over (seed, task); ``skip_minus_step``, paired on (seed, task), per seed and pooled.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import RESULTS, write_result

MODES = {"step": False, "skip": True}  # mode -> Experiment.skip_zero_signal
ROOT = "zero-signal"


def start_name(args) -> str:
    return f"sft-lr={args.sft_lr:g}-steps={args.sft_steps}"


def start_adapter(args) -> tuple:
    """The SFT start (made once): the quickstart's data at seed 0, SFT at one setting. Returns the comparison that
    holds the data (its tasks, demonstrations and evaluation) and the adapter."""
    from agentlab.compare import Comparison
    from agentlab.paths import runs_dir
    from agentlab.quickstart import QuickstartConfig
    from agentlab.sft import run_sft

    cmp = Comparison(QuickstartConfig(name=f"{ROOT}/start"))
    cmp.tasks()
    out = runs_dir() / ROOT / "start" / start_name(args)
    if not (out / "adapter_config.json").exists():
        run_sft(cmp.cfg.model, cmp.demos(), out.parent / (out.name + "-run"),
                cmp.sft_settings(args.sft_lr, args.sft_steps), save_at=(args.sft_steps,))
        (out.parent / (out.name + "-run") / f"adapter-step-{args.sft_steps}").rename(out)
    return cmp, out


def scored_start(start: Path) -> Path:
    """Where the start's validation evaluation lives (every run's step 0)."""
    return start.parent / f"{start.name}-validation"


def experiment(args, mode: str, seed: int):
    from agentlab.quickstart import _grpo_default

    return replace(_grpo_default(), name=f"{ROOT}/{start_name(args)}/{mode}/seed-{seed}", seed=seed,
                   eval_every=args.eval_every,
                   skip_zero_signal=MODES[mode])


def distance(a: Path, b: Path) -> float:
    """L2 distance between two LoRA adapters' weights (same keys)."""
    from safetensors.torch import load_file

    x, y = (load_file(p / "adapter_model.safetensors") for p in (a, b))
    return round(float(sum(((x[k].float() - y[k].float()) ** 2).sum() for k in x)) ** 0.5, 4)


def summarise(run, start: Path) -> dict:
    from agentlab.evals import read_rollouts

    metrics, evals = run.metrics(), run.evals()
    last = evals[-1]["step"]
    episodes = read_rollouts(run.evals_dir / f"step-{last:04d}.rollouts.jsonl")[0]
    kept = {int(c.name.split("-")[1]): c for c in run.checkpoints()}
    return {
        "validation": [{"step": e["step"], **{k: e["success"][k] for k in ("mean", "ci_low", "ci_high")}}
                       for e in evals],
        "zero_signal_steps": [m["step"] for m in metrics if m.get("zero_signal")],
        "skipped_steps": [m["step"] for m in metrics if m.get("skipped_zero_signal_update")],
        "zero_variance_groups": [m.get("zero_variance_groups") for m in metrics],
        "grad_norm": [m.get("grad_norm") for m in metrics],
        "entropy": [m.get("entropy") for m in metrics],
        "distance_from_start": {str(s): distance(start, c) for s, c in sorted(kept.items())},
        "seconds": round(sum(m.get("time_step_s") or 0 for m in metrics), 1),
        "last": {"step": last, "per_task": {ep.task.id: float(ep.success) for ep in episodes}},
    }


def gather(args, start: Path) -> dict:
    from agentlab.evals import mean_ci, paired_bootstrap_ci
    from agentlab.machine import describe
    from agentlab.paths import runs_dir
    from agentlab.runs import RunDir

    runs = {mode: {} for mode in MODES}
    for mode in MODES:
        for seed in args.seeds:
            run = RunDir(runs_dir() / experiment(args, mode, seed).name)
            if run.finished:
                runs[mode][seed] = summarise(run, start)
    scored = json.loads((scored_start(start) / "summary.json").read_text())
    out = {"config": {k: v for k, v in vars(args).items() if k != "gather_only"},
           "grpo": {k: v for k, v in experiment(args, "step", 0).to_config().items()
                    if k not in ("name", "seed", "skip_zero_signal")},
           "start_validation": {k: scored["success"][k] for k in ("mean", "ci_low", "ci_high", "n")},
           "machine": describe(), "modes": MODES, "runs": {m: {str(s): r for s, r in v.items()} for m, v in runs.items()}}
    seeds = sorted(set(runs["step"]) & set(runs["skip"]))
    if seeds:
        def pairs(seed_list):
            return [(runs["step"][s]["last"]["per_task"][t], runs["skip"][s]["last"]["per_task"][t])
                    for s in seed_list for t in runs["step"][s]["last"]["per_task"]]

        def diff(p):
            low, high = paired_bootstrap_ci([a for a, _ in p], [b for _, b in p])
            return {"mean": round(sum(b - a for a, b in p) / len(p), 4), "ci_low": low, "ci_high": high, "n": len(p)}

        out["seeds"] = seeds
        out["last_pooled"] = {m: mean_ci([x for s in seeds for x in runs[m][s]["last"]["per_task"].values()])
                              for m in MODES}
        out["skip_minus_step"] = {"pooled": diff(pairs(seeds)), "per_seed": {str(s): diff(pairs([s])) for s in seeds}}
    return out


def _paired(x: dict) -> str:
    return f"{x['mean']:+.3f} [{x['ci_low']:+.3f}, {x['ci_high']:+.3f}]"


LABELS = {"step": "`step` (TRL: AdamW steps every time)", "skip": "`skip` (`--skip-zero-signal true`)"}


def markdown_table(out: dict) -> str:
    """docs/performance.md's table: per start and mode, the zero-gradient steps, how far the adapter went, the last
    checkpoint's validation per seed and pooled; skip − step paired."""
    from tables import _machine

    rows = []
    for e in out["starts"].values():
        g, v, seeds = e["grpo"], e["start_validation"], [str(s) for s in e.get("seeds", [])]
        c = e["config"]
        rows += [(f"*{_machine(e['machine'])}; `{g['env']}`, SFT start lr {c['sft_lr']:g} × {c['sft_steps']} steps "
                  f"(validation {v['mean']:.2f} [{v['ci_low']:.2f}, {v['ci_high']:.2f}], n = {v['n']}); GRPO {g['steps']} steps "
                  f"× {g['groups_per_step']} × {g['group_size']} rollouts, lr {g['lr']:g}, T = {g['temperature']:g};"
                  f" seeds {', '.join(seeds)}:*"), "",
                 ("| mode | zero-gradient steps, per seed | adapter's L2 distance from the start at the last "
                  "checkpoint, per seed | last checkpoint's validation, per seed | pooled over (seed, task) |"),
                 "|---|---|---|---|---|"]
        for mode in MODES:
            runs = [e["runs"][mode][s] for s in seeds]
            steps = " / ".join(str(len(r["zero_signal_steps"])) for r in runs)
            moved = " / ".join(f"{list(r['distance_from_start'].values())[-1]:.2f}" for r in runs)
            last = " / ".join(f"{r['validation'][-1]['mean']:.2f}" for r in runs)
            p = e["last_pooled"][mode]
            rows.append(f"| {LABELS[mode]} | {steps} | {moved} | {last} | "
                        f"{p['mean']:.3f} [{p['ci_low']:.3f}, {p['ci_high']:.3f}] |")
        if "skip_minus_step" in e:
            d = e["skip_minus_step"]
            rows += ["", (f"`skip` − `step`, paired over (seed, task): {_paired(d['pooled'])}; per seed "
                          + ", ".join(_paired(x) for x in d["per_seed"].values()) + "."), ""]
    return "\n".join(rows).rstrip()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    p.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES))
    p.add_argument("--sft-lr", type=float, default=1e-3)
    p.add_argument("--sft-steps", type=int, default=4)
    p.add_argument("--eval-every", type=int, default=4)
    p.add_argument("--gather-only", action="store_true")
    p.add_argument("--table", action="store_true", help="the docs' table, from the JSON")
    args = p.parse_args(argv)
    if args.table:
        print(markdown_table(json.loads((RESULTS / "zero_signal.json").read_text())))
        return 0
    cmp, start = start_adapter(args)
    if not args.gather_only:
        from agentlab.paths import runs_dir
        from agentlab.runs import RunDir
        from agentlab.train import run_grpo

        splits = cmp.tasks()  # (read back: start_adapter made them)
        scored = scored_start(start)  # step 0 of every run: the start, scored once
        cmp.evaluate(scored, start, splits["validation"], "start")
        for seed in args.seeds:  # seed by seed, both modes: a stopped study still has pairs
            for mode in args.modes:
                exp = experiment(args, mode, seed)
                run = RunDir(runs_dir() / exp.name)
                if not run.finished:
                    print(f"[zero-signal] {mode} seed {seed}", flush=True)
                    run_grpo(exp, splits["train"], splits["validation"], init_adapter=start, run=run,
                             start_eval=scored)
    entry = gather(args, start)
    print(json.dumps(entry.get("skip_minus_step", {}).get("pooled", "no pairs yet")))
    before = RESULTS / "zero_signal.json"
    out = {"starts": (json.loads(before.read_text()) if before.exists() else {}).get("starts", {})}
    out["starts"][start_name(args)] = entry
    print(f"-> {write_result('zero_signal.json', out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
