"""Where RL pays here, and where it does not: every finished RL-vs-SFT study on one map (no new runs).

    python benchmarks/rl_vs_sft_map.py            # writes benchmarks/results/rl_vs_sft_map.json, prints the table
    python benchmarks/rl_vs_sft_map.py --table    # the README's table, from the map

Reads the studies' own results — ``rl_vs_sft.json`` (product_finder, every arm, scripted calibration rows) and
``seed_systems.json`` (doc_search and code_search, each regime studied), ``third_party_env.json`` (a textarena
game as a user's own class, its win rate as the success) — and writes one entry per (environment,
regime): per seed, each arm's test success with its 95% CI, its seconds where the study recorded them, whether its
choice ended at the edge of its grid (``at_edge``: a search that may not have found its peak), and GRPO minus each
arm paired, and its calibration rows (``scripted``: each strategy's success on the study's test tasks, averaged over
its seeds). The top-level ``scripted``: the same per environment, over every seed any of its studies ran. The
README's map is rendered from this file (a test holds them together), so a study that lands or changes moves the map
with it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import RESULTS, write_result

ARMS = ("sft_best", "sft_all", "sft_matched", "rft", "expert_iteration", "grpo")


def _ci(x: dict) -> dict:
    mean = x["mean"] if "mean" in x else x["success"]
    return {"success": mean, "ci_low": x["ci_low"], "ci_high": x["ci_high"]}


def _arm_seconds(choice: dict) -> float | None:
    for key in ("train_seconds", "seconds"):
        if isinstance(choice.get(key), (int, float)):
            return round(float(choice[key]), 1)
    return None


def study_entry(env: str, regime: str, seeds: list[dict], success_key=None) -> dict:
    """One study on the map: ``seeds`` as the study's JSON holds them (an arm: ``{success|mean, ci_low, ci_high}``
    or, in seed_systems.json, a metric table from which ``success_key`` picks the one reported)."""
    out = []
    for s in seeds:
        arms = {}
        for arm in ARMS:
            if arm not in s:
                continue
            figure = s[arm][success_key] if success_key else s[arm]
            choice = s.get("choices", {}).get(arm, {})
            arms[arm] = {**_ci(figure), "seconds": _arm_seconds(choice), "at_edge": choice.get("at_edge")}
        minus = {}
        for key, d in s.items():
            if key.startswith("grpo_minus_"):
                d = d[success_key] if success_key else d
                minus[key.removeprefix("grpo_minus_")] = {k: d[k] for k in ("mean", "ci_low", "ci_high")}
        out.append({"seed": s["seed"], "n": s["n"], "arms": arms, "grpo_minus": minus})
    return {"env": env, "regime": regime, "metric": success_key or "success", "seeds": out,
            "scripted": scripted_means(seeds, success_key)}


def scripted_means(seeds: list[dict], success_key=None) -> dict:
    """Each scripted strategy's success averaged over the seeds that recorded it (``success_key`` as in
    :func:`study_entry`), each seed counted once: a seed's split fixes its test tasks, so two regimes' studies of
    one seed score a strategy on the same tasks."""
    per_strategy: dict[str, dict[int, float]] = {}
    for s in seeds:
        for name, x in s.get("scripted", {}).items():
            per_strategy.setdefault(name, {})[s["seed"]] = (x[success_key] if success_key else x)["mean"]
    return {k: round(sum(v.values()) / len(v), 4) for k, v in per_strategy.items()}


def build(results: Path = RESULTS) -> dict:
    from seed_systems import studies as seed_studies

    studies, scripted, seeds_of = [], {}, {}
    path = results / "rl_vs_sft.json"
    if path.exists():
        rl = json.loads(path.read_text())
        studies.append(study_entry(rl["env"], rl["regime"], rl["seeds"]))
        scripted[rl["env"]] = studies[-1]["scripted"]
    path = results / "seed_systems.json"
    if path.exists():
        for env, e in seed_studies(json.loads(path.read_text())):
            if not e["seeds"]:
                continue
            studies.append(study_entry(env, e["regime"], e["seeds"], "success"))
            seeds_of.setdefault(env, []).extend(e["seeds"])
    for env, seeds in seeds_of.items():
        scripted[env] = scripted_means(seeds, "success")
    path = results / "third_party_env.json"
    if path.exists():  # a game package's own class: its win rate is the success, its scripts the calibration rows
        tp = json.loads(path.read_text())
        seeds = [{**s, **{arm: s[arm]["win"] for arm in ARMS if arm in s}} for s in tp["seeds"]]
        env = f"{tp['game']} ({tp['package']})"
        studies.append(study_entry(env, tp["regime"], seeds))
        scripted[env] = studies[-1]["scripted"]
    return {"studies": studies, "scripted": scripted}


def markdown_table(out: dict) -> str:
    """One row per study: each arm's success averaged over seeds, per baseline how many seeds put GRPO above it
    (paired 95% CI above 0) out of the seeds run, and the scripted strategies' success on the same test tasks."""
    head = ["env", "regime", "seeds", *[f"`{a}`" for a in ARMS], "GRPO above, seeds (paired CI > 0)",
            "scripted strategies"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for st in out["studies"]:
        seeds = st["seeds"]
        cells = [st["env"], f"`{st['regime']}`", str(len(seeds))]
        for arm in ARMS:
            xs = [s["arms"][arm]["success"] for s in seeds if arm in s["arms"]]
            cells.append(f"{sum(xs) / len(xs):.3f}" if xs else "—")
        above = []
        for arm in ARMS[:-1]:
            ds = [s["grpo_minus"][arm] for s in seeds if arm in s["grpo_minus"]]
            if ds:
                above.append(f"`{arm}` {sum(d['ci_low'] > 0 for d in ds)}/{len(ds)}")
        cells.append(", ".join(above) or "—")
        cells.append(", ".join(f"{k} {v:.3f}" for k, v in st["scripted"].items()) or "—")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--table", action="store_true")
    a = p.parse_args(argv)
    if a.table:
        print(markdown_table(json.loads((RESULTS / "rl_vs_sft_map.json").read_text())))
        return 0
    out = build()
    print(f"-> {write_result('rl_vs_sft_map.json', out)}")
    print(markdown_table(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
