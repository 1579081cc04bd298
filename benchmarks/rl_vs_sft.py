"""RL versus SFT on a seed environment, three seeds: ``agentlab compare`` per seed, gathered into one JSON.

    python benchmarks/rl_vs_sft.py                                   # the study's settings (STUDY), seeds 0 1 2
    python benchmarks/rl_vs_sft.py --seeds 0 --regime easy:32        # one seed of another regime
    python benchmarks/rl_vs_sft.py --gather-only                     # rebuild the JSON from finished run folders
    python benchmarks/rl_vs_sft.py --table                           # the README's table, from the JSON

Each seed is a resumable run folder ``runs/rl-vs-sft/<env>/<regime>/seed-<k>``: kill this script and start it
again and it continues where it stopped. Regimes and settings were chosen on seed 0's validation split only; every
comparison folder under ``runs/rl-vs-sft/`` (the regime search included) adds its tried settings, each with its
validation figure, to the JSON's ``"tried"`` list. Writes ``benchmarks/results/rl_vs_sft.json``:
``{"env", "regime", "tried", "seeds": [{"seed", "n", "sft_best", "sft_matched", "rft", "sft_all", "grpo",
"grpo_minus_sft_best", "grpo_minus_sft_matched", "grpo_minus_rft", "seconds"}]}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import RESULTS, carry_in, scripted_policies, write_result

from agentlab.compare import ARMS, CompareConfig, run_compare
from agentlab.paths import runs_dir

POLICY_KEYS = ("success", "ci_low", "ci_high")
# The study's settings where they differ from `agentlab compare`'s defaults (chosen on seed 0's validation split;
# `tried` in the JSON records the search): a flag given on the command line overrides them.
STUDY = {"sft_steps": "2,4,8,16", "grpo_steps": "15", "eval_every": "5", "temperature": "1.0"}


# Stages timed inside an arm's own stage (agentlab.compare: its checkpoints' validations, its sampling budget), for
# results written before the clock recorded which stage ran inside which (`seconds_total`): already in that arm's
# seconds, so a seed's total leaves them out.
NESTED = ("sft_matched_", "rft_", "ei_round", "expert_iteration_")


def total_seconds(result: dict) -> float:
    """A comparison's wall seconds: every stage once, none counted inside another too."""
    if "seconds_total" in result:
        return result["seconds_total"]
    return round(sum(v for k, v in result["seconds"].items() if not k.startswith(NESTED)), 1)


def seed_entry(result: dict) -> dict:
    entry = {"seed": result["seed"], "n": result["n"]}
    for arm in ARMS:
        if arm in result:
            entry[arm] = {k: result[arm][k] for k in POLICY_KEYS}
    for key in ("grpo_minus_sft_best", "grpo_minus_sft_matched", "grpo_minus_rft", "grpo_minus_expert_iteration",
                "grpo_minus_sft_all"):
        if key in result:
            entry[key] = result[key]
    entry["seconds"] = total_seconds(result)
    entry["choices"] = {arm: {k: v for k, v in c.items() if k != "adapter"} for arm, c in result["choices"].items()}
    return entry


def gather_tried(root: Path) -> list[dict]:
    """Every setting any comparison under ``root`` tried, with its validation figure (finished or not: the
    checkpoint evaluations of a GRPO run still going, or stopped, count too)."""
    from agentlab.evals import success_entry

    tried = []
    for path in sorted(root.rglob("tried.json")):
        record = json.loads(path.read_text())
        run = str(path.parent.relative_to(root))
        points = [{"run": run, "env": record["env"], "seed": record["seed"], **p} for p in record["tried"]]
        config = json.loads((path.parent / "config.json").read_text())
        if not any(p["arm"] == "grpo" for p in points):
            for f in sorted((path.parent / "grpo" / "evals").glob("step-*.json")):
                summary = json.loads(f.read_text())
                if summary["step"] > 0:
                    points.append({"run": run, "env": record["env"], "seed": record["seed"], "arm": "grpo",
                                   "regime": config["regime"], "lr": config["grpo_lr"], "steps": summary["step"],
                                   "temperature": config["temperature"], "finished": False,
                                   "validation": success_entry(summary)})
        tried += points
    return tried


def merge_earlier(earlier: dict | None, tried: list[dict], seeds: list[dict], env: str, regime: str):
    """Keep what an earlier session recorded and this machine no longer has (run folders are not committed):
    tried points of comparison folders absent here, and seeds of the same env and regime not re-run here."""
    if not earlier:
        return tried, seeds
    runs_here = {t["run"] for t in tried}
    tried = [t for t in earlier.get("tried", []) if t["run"] not in runs_here] + tried
    if (earlier.get("env"), earlier.get("regime")) == (env, regime):
        here = {s["seed"] for s in seeds}
        seeds = sorted([s for s in earlier.get("seeds", []) if s["seed"] not in here] + seeds, key=lambda s: s["seed"])
    return tried, seeds


def markdown_table(study: dict) -> str:
    """The README's table of the study, one row per seed, every figure read from ``rl_vs_sft.json``."""
    arms = [a for a in ("sft_best", "sft_matched", "rft", "expert_iteration", "grpo")
            if any(a in s for s in study["seeds"])]
    diffs = [f"grpo_minus_{a}" for a in arms if a != "grpo"]
    head = ["seed", *(f"`{a}`" for a in arms), *(f"GRPO − `{d.removeprefix('grpo_minus_')}`" for d in diffs)]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in study["seeds"]:
        cells = [str(s["seed"])]
        cells += [f"{s[a]['success']:.3f} [{s[a]['ci_low']:.3f}, {s[a]['ci_high']:.3f}]" if a in s else "" for a in arms]
        for d in diffs:
            x = s.get(d)
            text = f"{x['mean']:+.3f} [{x['ci_low']:+.3f}, {x['ci_high']:+.3f}]" if x else ""
            cells.append(f"**{text}**" if x and x["ci_low"] > 0 else text)  # bold: the paired CI is above 0
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def scripted_rows(env: str, config: dict, seed: int) -> dict:
    """Every scripted strategy of ``env`` on the seed's test tasks (the comparison's own split, rebuilt from its
    config and seed): success with a 95% CI — the calibration rows of the table."""
    from agentlab.envs import load
    from agentlab.evals import mean_ci
    from agentlab.synth import build_splits
    from agentlab.types import run_policy

    spec = load(env)
    sizes = {k: config[k] for k in ("train", "validation", "test")}
    test = build_splits(spec, sizes, seed=seed)["test"]
    return {name: mean_ci([spec.evaluate(t, run_policy(spec, t, policy)[0])["success"] for t in test])
            for name, policy in scripted_policies(spec).items()}


def calibration_table(study: dict) -> str:
    """Scripted strategies on each seed's test tasks, where the arms' figures stand (from ``rl_vs_sft.json``)."""
    names = list(next(s["scripted"] for s in study["seeds"] if "scripted" in s))
    rows = ["| seed | " + " | ".join(f"`{n}` (scripted)" for n in names) + " |", "|" + "---|" * (len(names) + 1)]
    for s in study["seeds"]:
        if "scripted" in s:
            rows.append(f"| {s['seed']} | " + " | ".join(
                f"{s['scripted'][n]['mean']:.3f} [{s['scripted'][n]['ci_low']:.3f}, {s['scripted'][n]['ci_high']:.3f}]"
                for n in names) + " |")
    return "\n".join(rows)


def parse(argv=None) -> tuple[argparse.Namespace, CompareConfig]:
    """The command line and the comparison config it asks for (the study's, with no flags)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--gather-only", action="store_true", help="only rebuild the JSON from finished seeds")
    parser.add_argument("--table", action="store_true", help="print the README's markdown tables from the JSON")
    parser.add_argument("--calibrate", action="store_true",
                        help="add the scripted strategies' test success to every seed of the JSON (seconds, no model)")
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset of the arms (default: all)")
    defaults = {k: v for k, v in CompareConfig.flat_defaults().items() if k not in ("name", "seed")}
    names = set(defaults)
    for name in sorted(names):
        default = defaults[name]
        parser.add_argument("--" + name.replace("_", "-"), default=STUDY.get(name),
                            help=f"default {STUDY.get(name, default)}"
                                 + (" (comma-separated)" if isinstance(default, tuple) else ""))
    args = parser.parse_args(argv)
    return args, CompareConfig.from_text({name: getattr(args, name) for name in names})


def main(argv=None) -> int:
    args, base = parse(argv)
    if args.table:
        study = json.loads((RESULTS / "rl_vs_sft.json").read_text())
        print(markdown_table(study) + "\n\n" + calibration_table(study))
        return 0
    if args.calibrate:
        study = json.loads((RESULTS / "rl_vs_sft.json").read_text())
        for s in study["seeds"]:
            s["scripted"] = scripted_rows(study["env"], study["config"], s["seed"])
        print(calibration_table(study))
        print(f"-> {write_result('rl_vs_sft.json', study)}")
        return 0
    carry_in()
    root = runs_dir() / "rl-vs-sft"
    seeds = []
    for seed in args.seeds:
        name = f"rl-vs-sft/{base.env}/{base.regime.replace(':', '-')}/seed-{seed}"
        result_file = runs_dir() / name / "result.json"
        if args.gather_only:
            if not result_file.exists():
                continue
            result = json.loads(result_file.read_text())
        else:
            result = run_compare(base.replace(name=name, seed=seed), arms=tuple(args.arms.split(",")))
        seeds.append(seed_entry(result))
    out = {"env": base.env, "regime": base.regime, "model": base.model, "config": {
        k: v for k, v in json.loads(json.dumps(base.to_config())).items() if k not in ("name", "seed")},
        "tried": [], "seeds": []}
    earlier_file = RESULTS / "rl_vs_sft.json"
    earlier = json.loads(earlier_file.read_text()) if earlier_file.exists() else None
    out["tried"], out["seeds"] = merge_earlier(earlier, gather_tried(root), seeds, base.env, base.regime)
    print(f"-> {write_result('rl_vs_sft.json', out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
