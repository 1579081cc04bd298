"""The seed systems learn: doc_search on its F-beta reward (and code_search), base vs ``sft_best`` vs GRPO per seed.

    python benchmarks/seed_systems.py --env doc_search --seeds 0        # one seed: ~100 min on 2 cores
    python benchmarks/seed_systems.py --env code_search --seeds 0 1 2   # few expert traces (STUDY["code_search"])
    python benchmarks/seed_systems.py --env doc_search --gather-only    # rebuild the JSON from finished seeds
    python benchmarks/seed_systems.py --table                           # the README's table, from the JSON
    python benchmarks/seed_systems.py --env doc_search --seeds 0 --tune grpo_steps=12,groups_per_step=4
                                        # GRPO settings tried from seed 0's SFT start on its validation split
    python benchmarks/seed_systems.py --env doc_search --regime cheap:64 --set grpo_steps=12 --seeds 0
                                        # another regime beside the study's (reported under "also")

Each seed is ``agentlab compare`` with the arms ``sft_best`` and ``grpo`` (``STUDY[env]``: the regime, the SFT
search, GRPO's budget, and ``select``: every choice maximises validation *reward*, doc_search's F4, which GRPO
maximises too), plus the base model on the same test tasks. A run folder per seed
(``runs/seed-systems/<env>/seed-<k>``) resumes after a kill. Each policy is reported with every metric the issue
asks for (``f4 f1 precision recall success curated``), mean and 95% bootstrap CI over the test tasks, and GRPO
minus ``sft_best`` paired over tasks. Writes ``benchmarks/results/seed_systems.json``:
``{env: {"n", "regime", "budget", "config", "tried", "seeds": [{"seed", "base", "sft_best", "grpo",
"grpo_minus_sft_best", "choices", "exits", "seconds"}]}}``; seeds already recorded and not re-run here are kept
(run folders are not committed; a seed longer than a session is packed into ``benchmarks/carry/`` and carried in
by the next run of this script).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import RESULTS, carry_in, scripted_policies, write_result

# What each environment reports per policy: doc_search the curated set (F-beta and its parts, its size), code_search
# the answer (success: exactly the names asked, precision / recall of the names given, covered: every name in it).
METRICS = {"doc_search": ("f4", "f1", "success", "precision", "recall", "curated"),
           "code_search": ("success", "precision", "recall", "covered")}
# Chosen on seed 0's validation split (doc_search: benchmarks/results/seed_systems_probe.json found lr 1e-3 on
# easy:64 still rising at 32 steps, so the search starts at 16 and extends twice, to 128: seed 0's validation reward
# was 0.196 / 0.403 / 0.491 at 16 / 32 / 64 steps, still rising); GRPO's budget is what 2 cores give a
# seed in about half an hour (8 rollouts a step; 64 validation episodes took 460 s on the AVX-512 EPYC).
STUDY = {
    "doc_search": {"regime": "easy:64", "sft_lrs": "1e-3", "sft_steps": "16,32", "sft_extend": "2",
                   "grpo_steps": "6", "eval_every": "3", "groups_per_step": "2", "group_size": "4",
                   "temperature": "1.0", "select": "reward"},
    # code_search has one difficulty and no cheap strategy: the practitioner's regime is few expert traces. The
    # probe (seed_systems_probe.json, 16 traces, lr 1e-3, 32 validation tasks) found success 0.31 / 0.09 / 0.50 at
    # 8 / 16 / 32 steps, 3-7 s an episode: room for RL, so the search starts at 16 and 32 and extends twice.
    "code_search": {"regime": "expert:16", "sft_lrs": "1e-3", "sft_steps": "16,32", "sft_extend": "2",
                    "grpo_steps": "12", "eval_every": "4", "groups_per_step": "4", "group_size": "4",
                    "temperature": "1.0", "select": "success"},
}


def metric_entry(episodes: list, metric: str) -> dict:
    from agentlab.evals import mean_ci

    return mean_ci([ep.success if metric == "success" else ep.metrics.get(metric, 0.0) for ep in episodes])


def policy_entry(rollouts: Path, metrics: tuple[str, ...]) -> tuple[dict, list]:
    from agentlab.evals import read_rollouts

    episodes = read_rollouts(rollouts)[0]
    return {m: metric_entry(episodes, m) for m in metrics}, episodes


def by_difficulty(episodes: list) -> dict:
    """Mean success, recall, precision and curated-set size per task difficulty (doc_search: facts asked), and n."""
    out = {}
    for k in sorted({ep.task.difficulty for ep in episodes}):
        eps = [ep for ep in episodes if ep.task.difficulty == k]
        values = {m: [ep.success if m == "success" else ep.metrics.get(m, 0.0) for ep in eps]
                  for m in ("success", "recall", "precision", "curated")}
        out[str(k)] = {m: round(sum(v) / len(v), 4) for m, v in values.items()} | {"n": len(eps)}
    return out


def answer_sizes(episodes: list) -> dict:
    """How many ids each episode's answer held (doc_search: chunks curated), counted per task difficulty: whether a
    policy ever *samples* a bigger set, which GRPO can only reinforce if it does
    (``{"<difficulty>": {"<size>": episodes}}``)."""
    out: dict[str, Counter] = {}
    for ep in episodes:
        out.setdefault(str(ep.task.difficulty), Counter())[str(len(ep.outcome.final))] += 1
    return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}


def scripted_scores(env: str, run: Path) -> dict[str, dict[str, dict]]:
    """The environment's scripted strategies (expert, cheap and named ones, random) played on the seed's own test
    tasks: ``{strategy: {task id: its metrics}}`` — the calibration rows, where the arms' figures stand."""
    from agentlab.envs import load
    from agentlab.synth import load_tasks
    from agentlab.types import run_policy

    spec = load(env)
    test = load_tasks(run / "tasks" / "test.jsonl")
    return {name: {t.id: spec.evaluate(t, run_policy(spec, t, policy)[0]) for t in test}
            for name, policy in scripted_policies(spec).items()}


def scripted_entry(env: str, scores: dict) -> dict:
    """Each strategy's every metric with a 95% CI over the test tasks (``scripted_scores``' figures)."""
    from agentlab.evals import mean_ci

    return {name: {m: mean_ci([x.get(m, 0.0) for x in by_task.values()]) for m in METRICS[env]}
            for name, by_task in scores.items()}


def minus_scripted(env: str, episodes: list, scores: dict) -> dict:
    """GRPO minus each strategy that is neither the expert nor the random floor, every metric, paired by test task:
    does training stand above the one-line strategies a practitioner would try first?"""
    from agentlab.evals import paired_bootstrap_ci, per_task

    out, mine_of = {}, {m: {t: sum(v) / len(v) for t, v in per_task(episodes, m).items()} for m in METRICS[env]}
    for name, by_task in scores.items():
        if name in ("expert", "random"):
            continue
        out[name] = {}
        for m, mine in mine_of.items():
            common = sorted(set(mine) & set(by_task))
            theirs, ours = [by_task[t].get(m, 0.0) for t in common], [mine[t] for t in common]
            low, high = paired_bootstrap_ci(theirs, ours)
            out[name][m] = {"mean": (sum(ours) - sum(theirs)) / len(common), "ci_low": low, "ci_high": high}
    return out


def seed_entry(run: Path, result: dict) -> dict:
    """One seed's test figures, every metric, read from the comparison's test rollouts (and the base model's)."""
    from agentlab.evals import paired_bootstrap_ci
    from agentlab.runs import read_jsonl

    entry, episodes, metrics = {"seed": result["seed"], "n": result["n"]}, {}, METRICS[result["env"]]
    for arm in ("base", "sft_best", "grpo"):
        if (run / "test" / arm / "rollouts.jsonl").exists():
            entry[arm], episodes[arm] = policy_entry(run / "test" / arm / "rollouts.jsonl", metrics)
    entry["exits"] = {arm: dict(Counter(ep.exit_reason for ep in eps)) for arm, eps in episodes.items()}
    entry["by_difficulty"] = {arm: by_difficulty(eps) for arm, eps in episodes.items()}
    entry["answer_sizes"] = {arm: answer_sizes(eps) for arm, eps in episodes.items()}
    if "grpo" in entry:
        entry["grpo_minus_sft_best"] = {}
        for m in metrics:
            low, high = paired_bootstrap_ci(episodes["sft_best"], episodes["grpo"], metric=m)
            entry["grpo_minus_sft_best"][m] = {"mean": entry["grpo"][m]["mean"] - entry["sft_best"][m]["mean"],
                                               "ci_low": low, "ci_high": high}
    entry["choices"] = {arm: {k: v for k, v in c.items() if k != "adapter"} for arm, c in result["choices"].items()}
    scores = scripted_scores(result["env"], run)
    entry["scripted"] = scripted_entry(result["env"], scores)
    if "grpo" in episodes:
        entry["grpo_vs_scripted"] = minus_scripted(result["env"], episodes["grpo"], scores)
    if (run / "grpo" / "metrics.jsonl").exists():  # what GRPO's steps looked like: signal left, entropy, time
        from agentlab.evals import read_rollouts

        steps = read_jsonl(run / "grpo" / "metrics.jsonl")[0]
        entry["grpo_training"] = {k: [s.get(k) for s in steps] for k in (
            "reward_mean", "zero_variance_groups", "entropy", "grad_norm", "time_generate_s", "time_step_s")}
        entry["grpo_training"]["answer_sizes"] = answer_sizes(read_rollouts(run / "grpo" / "rollouts.jsonl")[0])
    entry["seconds"] = result["seconds"]
    sessions = read_jsonl(run / "sessions.jsonl")[0]  # (folders older than this record have none)
    if sessions:
        entry["machines"] = sorted({s["cpu_class"] for s in sessions})
    return entry


def seed_name(env: str, regime: str, seed: int) -> str:
    """A seed's run folder under ``runs/``: ``seed-systems/<env>/<kind>-<n>/seed-<k>`` (one per regime)."""
    return f"seed-systems/{env}/{regime.replace(':', '-')}/seed-{seed}"


def run_seed(base, seed: int, arms: tuple[str, ...]) -> tuple[Path, dict]:
    from agentlab.compare import Comparison, run_compare
    from agentlab.paths import runs_dir

    cfg = base.replace(name=seed_name(base.env, base.regime, seed), seed=seed)
    run_compare(cfg, arms=arms)
    cmp = Comparison(cfg)
    test = cmp.tasks()["test"]
    print(f"[{cfg.name}] test evaluation of the base model on {len(test)} tasks (greedy, once)", flush=True)
    cmp._timed("test_base", cmp.evaluate, cmp.run.path / "test" / "base", None, test, "base")
    return runs_dir() / cfg.name, json.loads((runs_dir() / cfg.name / "result.json").read_text())


def tune(base, seed: int, text: str) -> dict:
    """GRPO with ``text``'s settings (``field=value,...`` of ``CompareConfig``: ``grpo_steps``, ``groups_per_step``,
    ``group_size``, ``grpo_lr``, ``temperature``, ``eval_every``) from the seed's chosen SFT start, on its own
    training and validation tasks, into ``<seed run>/tune/<field-value_...>``: how GRPO's setting is chosen on seed 0's
    validation split before the study's seeds run with it. Resumes; returns its validation curve and training side."""
    from agentlab.compare import CompareConfig, search_validation
    from agentlab.evals import read_rollouts
    from agentlab.paths import runs_dir
    from agentlab.runs import RunDir
    from agentlab.synth import load_tasks
    from agentlab.train import run_grpo

    seed_run = RunDir(runs_dir() / seed_name(base.env, base.regime, seed))
    given = dict(kv.split("=", 1) for kv in text.split(","))
    saved = json.loads(seed_run.config_file.read_text())
    cfg = CompareConfig.from_text({**{k: ",".join(map(str, v)) if isinstance(v, list) else str(v)
                                      for k, v in saved.items() if v is not None}, **given})
    start = json.loads((seed_run.path / "sft_best" / "choice.json").read_text())
    adapter = seed_run.resolve(start["adapter"])
    exp = replace(cfg.grpo, name=f"{cfg.name}/tune/" + "_".join(f"{k}-{v}" for k, v in given.items()))
    tasks = {s: load_tasks(seed_run.path / "tasks" / f"{s}.jsonl") for s in ("train", "validation")}
    run = RunDir(runs_dir() / exp.name)
    if not run.finished:
        run_grpo(exp, tasks["train"], tasks["validation"], init_adapter=adapter, run=run,
                 start_eval=search_validation(adapter, start["steps"]))
    steps = run.metrics()
    return {"seed": seed, "settings": given, "start": {k: start[k] for k in ("lr", "steps")},
            "validation": [{"step": e["step"], "reward": e["reward"]["mean"], "success": e["success"]["mean"],
                            "success_ci": [e["success"]["ci_low"], e["success"]["ci_high"]]} for e in run.evals()],
            "training": {k: [x.get(k) for x in steps] for k in (
                "reward_mean", "zero_variance_groups", "entropy", "time_step_s")}
            | {"answer_sizes": answer_sizes(read_rollouts(run.rollouts_file)[0])}}


def regime_slot(out: dict, env: str, regime: str) -> dict:
    """Where one regime's study lives in the results: ``out[env]`` for the study's own regime (``STUDY``), else
    ``out[env]["also"][regime]`` — the regimes tried beside it, reported too (a regime is not chosen silently)."""
    study = out.setdefault(env, {})
    if regime == STUDY[env]["regime"]:
        return study
    return study.setdefault("also", {}).setdefault(regime, {})


def studies(out: dict):
    """``(env, regime entry)`` for every environment's study and each regime tried beside it."""
    for env, e in out.items():
        if env != "lessons" and "seeds" in e:
            yield env, e
        for also in e.get("also", {}).values() if env != "lessons" else ():
            if "seeds" in also:
                yield env, also


def markdown_table(out: dict) -> str:
    """The README's table: per env, regime and seed, F4 / success / precision / recall / curated of each policy,
    GRPO − sft_best, and the calibration rows (the scripted strategies on the same test tasks, and GRPO minus each
    one-line strategy, paired)."""
    tables = []
    for env in dict.fromkeys(env for env, _ in studies(out)):  # one table per environment: its own metrics
        shown = [m for m in METRICS[env] if m != "f1"]
        head = ["env", "regime", "seed", "policy", *(m.upper() if m[0] == "f" else m for m in shown)]
        rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for e in (e for name, e in studies(out) if name == env):
            for s in e["seeds"]:
                policies = {f"`{arm}`": s[arm] for arm in ("base", "sft_best", "grpo") if arm in s}
                policies |= {"GRPO − `sft_best`": s["grpo_minus_sft_best"]} if "grpo_minus_sft_best" in s else {}
                policies |= {f"scripted: {name}": x for name, x in s.get("scripted", {}).items()}
                policies |= {f"GRPO − {name}": x for name, x in s.get("grpo_vs_scripted", {}).items()}
                for label, entry in policies.items():
                    sign = "+" if label.startswith("GRPO −") else ""
                    cells = [env, f"`{e['regime']}`", str(s["seed"]), label]
                    for m in shown:
                        x = entry[m]
                        cells.append(f"{x['mean']:{sign}.3f} [{x['ci_low']:{sign}.3f}, {x['ci_high']:{sign}.3f}]")
                    rows.append("| " + " | ".join(cells) + " |")
        tables.append("\n".join(rows))
    return "\n\n".join(tables)


def plot(out: dict, path: Path) -> Path:
    """Every seed of every environment and regime: F4, F1, precision, recall and success of each policy with CIs; one
    row per (environment, regime), one column per seed."""
    import matplotlib.pyplot as plt

    from agentlab.plots import metric_groups

    rows = list(studies(out))
    width = max(len(e["seeds"]) for _, e in rows)
    fig, axes = plt.subplots(len(rows), width, figsize=(6.5 * width, 4.2 * len(rows)), squeeze=False)
    for ax_row, (env, e) in zip(axes, rows, strict=True):
        for ax, s in zip(ax_row, e["seeds"], strict=False):
            policies = {arm: s[arm] for arm in ("base", "sft_best", "grpo") if arm in s}
            metric_groups(ax, policies, tuple(m for m in METRICS[env] if m != "curated"),
                          f"{env} {e['regime']}, seed {s['seed']}: {s['n']} test tasks, greedy")
        for ax in ax_row[len(e["seeds"]):]:
            ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def study_config(base, seeds) -> dict:
    """The settings the regime's seeds ran with: the first seed folder's ``config.json`` (so a ``--gather-only``
    without the run's ``--set`` still reports them), else ``base``."""
    from agentlab.paths import runs_dir

    for seed in seeds:
        path = runs_dir() / seed_name(base.env, base.regime, seed) / "config.json"
        if path.exists():
            return json.loads(path.read_text())
    return json.loads(json.dumps(base.to_config()))


def main(argv=None) -> int:
    from agentlab.compare import CompareConfig
    from agentlab.envs import load
    from agentlab.machine import describe
    from agentlab.paths import runs_dir

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="doc_search", choices=sorted(STUDY))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--arms", default="sft_best,grpo")
    p.add_argument("--gather-only", action="store_true")
    p.add_argument("--table", action="store_true")
    p.add_argument("--regime", default=None, help="the SFT start's data regime instead of the study's (STUDY), "
                   "e.g. expert:64; reported beside it under 'also'")
    p.add_argument("--set", default=None, help="the study's settings changed, field=value,... of CompareConfig (e.g. "
                   "grpo_steps=12,groups_per_step=4): recorded in the regime's config; a seed's folder refuses others")
    p.add_argument("--tune", default=None, help="GRPO settings to try from each seed's SFT start on validation, "
                   "e.g. groups_per_step=4,group_size=4,grpo_steps=15,eval_every=5 (recorded under 'tuning')")
    a = p.parse_args(argv)
    path = RESULTS / "seed_systems.json"
    out = json.loads(path.read_text()) if path.exists() else {}
    if a.table:
        print(markdown_table(out))
        return 0
    carry_in()
    changed = dict(kv.split("=", 1) for kv in a.set.split(",")) if a.set else {}
    base = CompareConfig.from_text({"env": a.env, **STUDY[a.env], **({"regime": a.regime} if a.regime else {}),
                                    **changed})
    slot = regime_slot(out, a.env, base.regime)
    if a.tune:
        tuning = slot.setdefault("tuning", [])
        for seed in a.seeds:
            entry = tune(base, seed, a.tune)
            tuning[:] = [t for t in tuning if (t["seed"], t["settings"]) != (seed, entry["settings"])] + [entry]
            print(json.dumps(entry["validation"]))
        print(f"-> {write_result('seed_systems.json', out)}")
        return 0
    seeds = {s["seed"]: s for s in slot.get("seeds", [])}  # kept: seeds not re-run here
    tried = {json.dumps(t, sort_keys=True): t for t in slot.get("tried", [])}
    for seed in a.seeds:
        run = runs_dir() / seed_name(base.env, base.regime, seed)
        if a.gather_only:
            if not (run / "result.json").exists():
                continue
            result = json.loads((run / "result.json").read_text())
        else:
            run, result = run_seed(base, seed, tuple(a.arms.split(",")))
        seeds[seed] = seed_entry(run, result)
        for t in result["tried"]:
            tried.setdefault(json.dumps({"seed": seed, **t}, sort_keys=True), {"seed": seed, **t})
    kept = {k: v for k, v in slot.items() if k in ("tuning", "also")}  # written by --tune, and other regimes
    slot.clear()
    slot.update({**kept, "n": base.test, "regime": base.regime, "budget": vars(load(a.env).budget),
                 "config": {k: v for k, v in study_config(base, a.seeds).items() if k not in ("name", "seed")},
                 "machine": describe(), "tried": list(tried.values()), "seeds": [seeds[k] for k in sorted(seeds)]})
    print(f"-> {write_result('seed_systems.json', out)}")
    print(f"-> {plot(out, RESULTS / 'seed_systems.png')}")
    print(markdown_table(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
