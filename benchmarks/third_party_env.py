"""A third-party environment package trained end to end on a CPU: textarena's Guess-the-Number, 3 seeds.

    make setup-examples
    python benchmarks/third_party_env.py --seeds 0 1 2       # resumable; writes benchmarks/results/third_party_env.json
    python benchmarks/third_party_env.py --smoke --seeds 0   # tiny model, a minute (the test)

The user's three steps, as the README gives them, on ``examples/textarena_games.py`` (a TRL-style class the library
never sees before run time): task rows with each game's scripted calls; ``agentlab replay`` of the *cheap* script
(start at 25, hop 1 to 4 toward the hint at random: wins about 0.6 of games) into demonstrations, keeping its won
games only; ``agentlab compare`` with those demonstrations (``--demos``) and the arms that need no scripted expert.
Every arm greedy on ``--test`` held-out games; reported: the game's win rate and moves per game with CIs, GRPO minus
each arm paired.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import write_result

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "textarena_games.py"
# Budgets from the game: up to 11 guesses and a closing message, a guess call is ~25 tokens, a game ~900 tokens.
STUDY = {"train": "1000", "validation": "64", "test": "200", "max_turns": "13", "max_new_tokens": "48",
         "max_context": "2048", "sft_lrs": "3e-4,1e-3", "sft_steps": "8,16,32", "grpo_steps": "12",
         "eval_every": "4", "groups_per_step": "2", "group_size": "4", "temperature": "1.0"}
SMOKE = {"model": "tiny-random", "train": "40", "validation": "4", "test": "6", "max_turns": "3",
         "max_new_tokens": "8", "sft_lrs": "1e-3", "sft_steps": "1", "sft_extend": "0", "grpo_steps": "1",
         "eval_every": "1", "groups_per_step": "1", "group_size": "2", "ei_rounds": "1"}


def game_entry(run: Path, arm: str) -> dict:
    """Win rate and moves per game of one arm's test rollouts, each with a 95% CI."""
    sys.path.insert(0, str(EXAMPLE.parent))
    from textarena_games import game_figures

    return game_figures(run / "test" / arm / "rollouts.jsonl")


def base_entry(cfg) -> dict:
    """The model as it comes, greedy, on the seed's test games (the same loop and budgets as every arm): the floor."""
    from agentlab.compare import Comparison
    from agentlab.synth import load_tasks

    cmp = Comparison(cfg)
    cmp.evaluate(cmp.run.path / "test" / "base", None, load_tasks(cmp.run.path / "tasks" / "test.jsonl"), "base")
    return game_entry(cmp.run.path, "base")


def scripted_entry(run: Path) -> dict:
    """Calibration rows: the game's two scripts played on the same test games (win rate with a 95% CI)."""
    from agentlab.evals import mean_ci

    sys.path.insert(0, str(EXAMPLE.parent))
    from textarena_games import binary_search, cheap_hop, play

    games = [json.loads(line)["answer"] for line in (run / "tasks" / "test.jsonl").read_text().splitlines()]
    return {name: mean_ci([play(row, strategy)[1] for row in games])
            for name, strategy in (("cheap_hop", cheap_hop), ("binary_search", binary_search))}


def grpo_training(run: Path) -> dict:
    """What GRPO had to learn from, per step of its ``metrics.jsonl``: the share of groups with zero reward variance
    (no advantage, no gradient), the policy's entropy at the first and last step, the rollouts it saw."""
    from agentlab.runs import read_jsonl

    steps = [r for r in read_jsonl(run / "grpo" / "metrics.jsonl")[0] if "zero_variance_groups" in r]
    cfg = json.loads((run / "config.json").read_text())
    return {"steps": len(steps), "rollouts": len(steps) * int(cfg["groups_per_step"]) * int(cfg["group_size"]),
            "zero_variance": sum(r["zero_variance_groups"] for r in steps) / len(steps),
            "entropy_first": steps[0]["entropy"], "entropy_last": steps[-1]["entropy"],
            "train_success": sum(r["success_mean"] for r in steps) / len(steps)}


TABLE_ARMS = ("base", "sft_best", "sft_matched", "expert_iteration", "grpo")


def markdown_table(result: dict) -> str:
    """README's table: per seed, each arm's win rate on the held-out games, GRPO minus each arm (paired; bold
    where the CI is above 0), and the two scripts on the same games."""
    from tables import _ci, _diff  # the other tables' formats: "mean [low, high]", a difference bold above 0

    arms = [a for a in TABLE_ARMS if any(a in s for s in result["seeds"])]
    others = [a for a in arms if a not in ("grpo", "base")]
    title = (f"*{result['package']} {result['version']}, {result['game']}: wins on {result['n']} held-out games per "
             f"arm (greedy); demonstrations: {result['regime']} ({result['regime_about']})*")
    rows = [title, "",
            "| seed | " + " | ".join(f"`{a}`" for a in arms) + " | " + " | ".join(f"GRPO − `{a}`" for a in others)
            + " | scripts: cheap hop / binary search |",
            "|---" * (1 + len(arms) + len(others) + 1) + "|"]
    for s in result["seeds"]:
        scripted = s.get("scripted", {})
        rows.append(f"| {s['seed']} | " + " | ".join(_ci(s[a]["win"], "mean") if a in s else "—" for a in arms) + " | "
                    + " | ".join(_diff(s[f"grpo_minus_{a}"]) if f"grpo_minus_{a}" in s else "—" for a in others)
                    + " | " + " / ".join(f"{scripted[k]['mean']:.3f}" for k in ("cheap_hop", "binary_search")
                                         if k in scripted) + " |")
    rows += ["", "; ".join(_tally(result["seeds"], a) for a in others) + "."]
    trained = [(s["seed"], s["grpo_training"]) for s in result["seeds"] if "grpo_training" in s]
    if trained:
        rows += ["", "GRPO's own training, by seed: " + "; ".join(
            f"{seed}: {t['steps']} steps, {t['rollouts']} rollouts, {t['zero_variance']:.0%} of groups with zero "
            f"reward variance, entropy {t['entropy_first']:.3f} → {t['entropy_last']:.3f} nats a token"
            for seed, t in trained) + "."]
    return "\n".join(rows)


def seed_counts(seeds: list[dict], arm: str) -> tuple[int, int, int]:
    """``(above, below, n)``: of the ``n`` seeds that ran ``arm``, those whose paired 95% CI of GRPO − ``arm`` lies
    above 0 and below 0."""
    ds = [s[f"grpo_minus_{arm}"] for s in seeds if f"grpo_minus_{arm}" in s]
    return sum(d["ci_low"] > 0 for d in ds), sum(d["ci_high"] < 0 for d in ds), len(ds)


def _tally(seeds: list[dict], arm: str) -> str:
    """"GRPO − `arm`: above 0 in a, below 0 in b, indistinguishable in c of n seeds" (paired 95% CIs)."""
    up, down, n = seed_counts(seeds, arm)
    return f"GRPO − `{arm}`: above 0 in {up}, below 0 in {down}, indistinguishable in {n - up - down} of {n} seeds"


def main(argv=None) -> int:
    from agentlab.compare import ARMS, CompareConfig, run_compare
    from agentlab.demos import replay
    from agentlab.envs import load
    from agentlab.paths import runs_dir
    from agentlab.pipeline import resolve_env
    from agentlab.runs import write_jsonl

    sys.path.insert(0, str(EXAMPLE.parent))
    from textarena_games import GAME, rows, rows_needed

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--arms", default="sft_best,grpo,sft_matched,expert_iteration")
    a = p.parse_args(argv)
    settings = {**STUDY, **(SMOKE if a.smoke else {})}
    root = runs_dir() / ("third-party-smoke" if a.smoke else "third-party") / "guess-the-number"
    rows_file, demos_file = root / "rows.jsonl", root / "cheap_demos.jsonl"
    sizes = {k: int(settings[k]) for k in ("train", "validation", "test")}
    n_rows = rows_needed(sizes)
    root.mkdir(parents=True, exist_ok=True)
    if not rows_file.exists():  # the class's rows are split by a hash: ~80% train, ~10% validation, ~10% test
        write_jsonl(rows_file, rows(n_rows))
    env = resolve_env(f"{EXAMPLE}:GuessTheNumber", str(rows_file))
    spec = load(env)
    if not demos_file.exists():
        kept, failures = replay(spec, spec.make_tasks("train", 10**6), "cheap_calls", final="I won.")
        write_jsonl(demos_file, kept[: 8 if a.smoke else 64])
        print(f"cheap script replayed: {len(kept)} won games kept, {len(failures)} lost ones listed, "
              f"{min(len(kept), 8 if a.smoke else 64)} used as demonstrations", flush=True)
    base = CompareConfig.from_text({"env": env, "demos": str(demos_file), **settings})
    arms = tuple(x for x in a.arms.split(",") if x in ARMS)
    seeds = []
    for seed in a.seeds:
        cfg = base.replace(name=f"{root.relative_to(runs_dir()).as_posix()}/seed-{seed}", seed=seed)
        result = run_compare(cfg, arms=arms)
        run = runs_dir() / cfg.name
        entry = {"seed": seed, "n": result["n"], "base": base_entry(cfg),
                 **{arm: game_entry(run, arm) for arm in arms if arm in result}, "scripted": scripted_entry(run)}
        entry.update({k: v for k, v in result.items() if k.startswith("grpo_minus_")})
        if "grpo" in result:
            entry["grpo_training"] = grpo_training(run)
        entry["choices"] = {k: {x: y for x, y in c.items() if x != "adapter"} for k, c in result["choices"].items()}
        seeds.append(entry)
        if a.smoke:
            print(json.dumps(entry, indent=1)[:2000])
            continue
        # Written after every seed, so a study stopped part way still reports the seeds it finished.
        from importlib.metadata import version

        out = {"package": "textarena", "version": version("textarena"), "game": GAME, "n": int(settings["test"]),
               "regime": "own:cheap_demos.jsonl", "regime_about": "the cheap script's won games", "config": settings, "seeds": seeds}
        print(f"-> {write_result('third_party_env.json', out)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
