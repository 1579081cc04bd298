"""Every result table in README.md and docs/ rendered from its results JSON, by this one script.

A document names each table by a marker around it; the table between is this script's output, never typed:

    <!-- table: rl_vs_sft -->
    | seed | ... |
    <!-- /table -->

    python benchmarks/tables.py           # rewrite every marked table from benchmarks/results/
    python benchmarks/tables.py --check   # exit 1 naming each table that differs from its JSON (the test suite runs it)

A number that changes in a JSON without the documents being re-rendered (or one typed into a table) fails the suite.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import RESULTS

ROOT = Path(__file__).parent.parent
DOCUMENTS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
MARKER = re.compile(r"<!-- table: (\S+) -->\n(.*?)<!-- /table -->", re.DOTALL)
# Tables that hold no result (what an arm is, which notebook does what, where a module lives): left as written.
NOT_RESULTS = ("| arm | what it is |", "| notebook | what you do |", "| module |", "| you want | write it here |")


def _read(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _ci(x: dict, key: str = "success", sign: str = "") -> str:
    return f"{x[key]:{sign}.3f} [{x['ci_low']:{sign}.3f}, {x['ci_high']:{sign}.3f}]"


def _diff(x: dict) -> str:
    text = _ci(x, "mean", "+")
    return f"**{text}**" if x["ci_low"] > 0 else text  # bold: the paired CI is above 0


# Files written before results recorded their machine's CPU class: the class the session that ran them noted
# (docs/performance.md's history). A file re-run records its own (common.write_result) and this entry stops applying.
NOTED = {"grpo_step.json": "amx", "grpo_step_ablation.json": "amx", "precision.json": "amx",
         "search_latency.json": "amx", "train_forward.json": "amx", "rollout_throughput.json": "avx2",
         "eval_throughput.json": "avx2", "grpo_step_llama_cpp.json": "avx2"}


def _machine(m: dict | None, file: str = "") -> str:
    """A results file's machine: its CPU class, cores and precision, as far as it recorded them."""
    m = m or {}
    cpu = m.get("cpu_class") or (f"{NOTED[file]} (noted by its session)" if file in NOTED else "CPU not recorded")
    return f"{cpu}, {m.get('cpus', m.get('threads', 2))} cores" + (f", {m['precision']}" if "precision" in m else "")


def quickstart() -> str:
    """The README's quickstart table: ``benchmarks/results/quickstart.json``, a real run's ``report.json``."""
    r = _read("quickstart.json")
    cfg, sft, grpo, matched = r["config"], r["sft"], r["grpo"], r["sft_matched"]
    grid = f"{len(cfg['sft_lrs'])} learning rates × {{{', '.join(map(str, cfg['sft_steps']))}}} steps"
    longer = sorted({t["steps"] for t in r["tried"] if t["arm"] == "sft_best" and t["steps"] > max(cfg["sft_steps"])})
    grid += "".join(f", the best run extended to {s}" for s in longer)
    rows = [(f"`{r['env']}`, regime `{r['regime']}`, {r['n']} test tasks, greedy; {_machine(r['machine'])}; "
            f"{r['total_s'] / 60:.0f} min of stages (setup not included), commit {r['machine'].get('commit', '?')}:"),
            "", "| policy | test success, 95% CI | GRPO − policy, paired |", "|---|---|---|",
            f"| base model | {_ci(r['base'])} | |",
            (f"| SFT, lr {sft['lr']:g} × {sft['steps']} steps (best on validation of {grid}) | {_ci(sft)} | "
            f"{_diff(r['grpo_minus_sft'])} |"),
            (f"| SFT continued for GRPO's seconds (+{matched['extra_steps']} steps chosen on validation) | "
            f"{_ci(matched)} | {_diff(r['grpo_minus_sft_matched'])} |"),
            (f"| GRPO, {cfg['grpo_steps']} steps × {cfg['groups_per_step']} prompts × {cfg['group_size']} rollouts "
            f"from that SFT (checkpoint {grpo['step']} chosen on validation) | {_ci(grpo)} | |")]
    from agentlab.quickstart import report_spread, spread_text

    if spread := report_spread(r):
        rows += ["", f"GRPO's row is one seed: {spread_text(spread)}."]
    return "\n".join(rows + [line for other in sorted(RESULTS.glob("quickstart_*.json"))
                              if (line := quickstart_elsewhere(r, _read(other.name), other.name))])


def quickstart_elsewhere(ref: dict, r: dict, name: str) -> str:
    """A line under the quickstart table for the same command run on another machine class (``quickstart_<class>.json``,
    that run's ``report.json``): its minutes, what it chose, and its rows beside the table's. Numerics differ with
    the precision (bf16 against fp32), so the same seed need not land on the same figures."""
    from agentlab.quickstart import report_spread, spread_text

    if r.get("config") != ref["config"]:
        return ""  # another configuration (or not a quickstart report): not the same command
    rows = " / ".join(f"{r[k]['success']:.3f}" for k in ("base", "sft", "sft_matched", "grpo"))
    return (f"\n\nThe same command on {_machine(r['machine'])} (commit {r['machine'].get('commit', '?')}, `{name}`): "
            f"{r['total_s'] / 60:.0f} min of stages against the table's {ref['total_s'] / 60:.0f}; SFT chose lr "
            f"{r['sft']['lr']:g} × {r['sft']['steps']} steps, GRPO checkpoint {r['grpo']['step']}; test success base / "
            f"SFT / SFT continued / GRPO {rows}, GRPO − SFT {_diff(r['grpo_minus_sft'])}"
            + (f"; {spread_text(spread)}." if (spread := report_spread(r)) and spread["same_start"] else "."))


def rl_vs_sft_seed0() -> str:
    """docs/rl_vs_sft.md's seed-0 table: what each arm chose on validation, from the study's ``tried`` points."""
    study = _read("rl_vs_sft.json")
    seed = next(s for s in study["seeds"] if s["seed"] == 0)
    tried = [t for t in study["tried"] if t.get("seed") == 0 and t.get("regime") == study["regime"]]
    c, ch = study["config"], seed["choices"]

    def curve(arm: str) -> str:
        points = sorted((t["steps"], t["validation"]["success"]) for t in tried if t["arm"] == arm)
        return " / ".join(f"+{s}: {v:.2f}" for s, v in points)

    best, rft = ch["sft_best"], ch["rft"]
    grid = f"{len(c['sft_lrs'])} lrs × {{{', '.join(map(str, c['sft_steps']))}}} steps"
    extended = [t for t in tried if t["arm"] == "sft_best" and t["steps"] > max(c["sft_steps"])]
    ext = "".join(f" (+{t['steps']}: {t['validation']['success']:.2f})" for t in extended)
    grpo_curve = " → ".join(f"{t['validation']['success']:.2f}" for t in sorted(
        (t for t in tried if t["arm"] == "grpo"), key=lambda t: t["steps"]))
    what = {
        "sft_best": f"lr {best['lr']:g}, {best['steps']} steps, of {grid}{ext}; validation "
                    f"{best['validation']['success']:.3f}",
        "sft_matched": f"`sft_best` + {ch['sft_matched']['steps_run']} SFT steps in GRPO's "
                       f"{ch['grpo']['train_seconds']:.0f} s; checkpoints {curve('sft_matched')}",
        "rft": f"{rft['sampling_s']:.0f} s sampling ({rft['episodes']} episodes, successes on {rft['kept']} "
               f"of {rft['tasks_sampled']} tasks) + {rft['seconds']:.0f} s SFT; checkpoints {curve('rft')}",
        "grpo": f"{c['grpo_steps']} steps × {c['groups_per_step'] * c['group_size']} rollouts at T={c['temperature']} "
                f"from `sft_best` ({ch['grpo']['train_seconds']:.0f} s of training); validation at steps "
                f"{', '.join(str(t['steps']) for t in tried if t['arm'] == 'grpo')}: {grpo_curve}",
    }
    rows = [f"| arm | chosen on validation (n={c['validation']}) | test success, 95% CI | GRPO − arm, paired |",
            "|---|---|---|---|"]
    for arm, text in what.items():
        diff = seed.get(f"grpo_minus_{arm}")
        rows.append(f"| `{arm}` | {text} | {_ci(seed[arm])} | {_diff(diff) if diff else ''} |")
    return "\n".join(rows)


def performance() -> str:
    """docs/performance.md's table: each row one side-by-side run, as its results file holds it now."""
    step, abl, lcpp = _read("grpo_step.json"), _read("grpo_step_ablation.json"), _read("grpo_step_llama_cpp.json")
    roll, ev, prec = _read("rollout_throughput.json"), _read("eval_throughput.json"), _read("precision.json")
    fwd, search = _read("train_forward.json"), _read("search_latency.json")
    llama = lcpp["agentlab:rollout_backend=llama_cpp"]
    med = ev["median_seconds"]
    syn = search["synthetic"]["index.search"]
    rows = [
        ("GRPO step, 8 rollouts, median s: stock TRL → agentlab", "grpo_step", None,
         f"{step['stock']['median_step_s']:.1f} → {step['agentlab']['median_step_s']:.1f}",
         f"{step['ratio_step_time_agentlab_over_stock']:.2f}×", "≤ 0.33×"),
        ("peak RSS of that step, GB: stock → agentlab", "grpo_step", None,
         f"{step['stock']['peak_rss_gb']:.2f} → {step['agentlab']['peak_rss_gb']:.2f}",
         f"{step['ratio_peak_rss_agentlab_over_stock']:.2f}×", "≤ 0.6×"),
        ("that step in fp32 instead of bf16, s / GB", "grpo_step_ablation", None,
         (f"{abl['agentlab']['median_step_s']:.1f} / {abl['agentlab']['peak_rss_gb']:.2f} → "
         f"{abl['agentlab:precision=fp32']['median_step_s']:.1f} / {abl['agentlab:precision=fp32']['peak_rss_gb']:.2f}"),
         f"{abl['ratio_step_time_agentlab:precision=fp32_over_agentlab']:.2f}×", ""),
        ("GRPO step, rollouts torch → llama.cpp, median s (peak GB)", "grpo_step_llama_cpp", None,
         (f"{lcpp['agentlab']['median_step_s']:.1f} ({lcpp['agentlab']['peak_rss_gb']:.2f}) → "
         f"{llama['median_step_s']:.1f} ({llama['peak_rss_gb']:.2f})"),
         f"{lcpp['ratio_step_time_agentlab:rollout_backend=llama_cpp_over_agentlab']:.2f}×", ""),
        ("rollout throughput, tok/s: TRL's generation → our loop → our loop on llama.cpp", "rollout_throughput",
         roll.get("machine"), (f"{roll['trl']['median_tokens_per_s']:.1f} → {roll['agentlab']['median_tokens_per_s']:.1f}"
         f" → {roll['agentlab:llama_cpp']['median_tokens_per_s']:.1f}"), f"{roll['ratio_agentlab_over_trl']:.2f}×",
         "≥ 2×"),
        (f"{ev['n']} greedy `{ev['env']}` episodes, batch {ev['batch_size']}, s: torch → llama.cpp", "eval_throughput",
         ev.get("machine"), (f"{med['agentlab']:.0f} → {med['llama_cpp']:.0f} ({ev['identical_episodes_llama_cpp']} of "
         f"{ev['n']} identical)"), f"{med['llama_cpp'] / med['agentlab']:.2f}×", f"≤ {ev['target_seconds_for_200']} s"),
        ((f"{prec['n']} greedy `{prec['env']}` episodes, s: fp32 → bf16 (greedy token agreement "
         f"{prec['greedy_agreement']:.3f})"), "precision", None,
         f"{prec['runs']['fp32']['seconds']:.0f} → {prec['runs']['bf16']['seconds']:.0f}", f"{1 / prec['speedup']:.2f}×",
         ""),
        (f"GRPO forward + backward, {fwd['grpo']['rows']} `product_finder` episodes, s: TRL's → ours", "train_forward",
         fwd.get("machine"), f"{fwd['grpo']['median_total_s']['trl']:.0f} → {fwd['grpo']['median_total_s']['agentlab']:.0f}",
         f"{fwd['grpo']['agentlab_over_trl']:.2f}×", ""),
        (f"SFT, {fwd['sft']['steps']} steps × {fwd['sft']['batch_size']}, s: TRL's LM head → labelled positions only",
         "train_forward", fwd.get("machine"),
         f"{fwd['sft']['median_s']['trl']:.0f} → {fwd['sft']['median_s']['agentlab']:.0f}",
         f"{fwd['sft']['agentlab_over_trl']:.2f}×", ""),
        (f"BM25 search p50 / p99, ms, {search['synthetic']['chunks']:,} chunks", "search_latency", None,
         f"{syn['p50_ms']:.2f} / {syn['p99_ms']:.2f}", "", "≤ 1 / 5 ms"),
    ]
    out = ["| benchmark | results file | machine | measured | ratio | target |", "|---|---|---|---|---|---|"]
    for what, file, machine, measured, ratio, target in rows:
        out.append(f"| {what} | `{file}.json` | {_machine(machine, f'{file}.json')} | {measured} | {ratio} | {target} |")
    return "\n".join(out)


def reliability() -> str:
    """docs/reliability.md's table: per fault kind, its rates' figures side by side."""
    data = _read("reliability.json")
    names = {"none": "none", "tool": "tool call", "reset": "episode reset", "generation": "generation",
             "judge": "LLM judge (timeout)"}
    by_kind: dict[str, list[dict]] = {}
    for case in data["cases"]:
        by_kind.setdefault(case["kind"], []).append(case)
    rows = [("| fault kind | rate | faults injected | crashes | episodes broken (infra) | attributed to infra | "
            "policy errors called infra | lost / duplicate records |"), "|---|---|---|---|---|---|---|---|"]
    for kind, cases in by_kind.items():
        def col(key, fmt=str, cases=cases):
            return " / ".join(fmt(c[key]) for c in cases)
        attributed = [c["attributed_to_infra"] for c in cases if c["attributed_to_infra"] is not None]
        rows.append(f"| {names.get(kind, kind)} | {col('rate', lambda r: f'{r:g}')} | {col('faults_injected')} | "
                    f"{sum(c['crashed'] for c in cases)} | {col('broken_by_faults')} | "
                    f"{f'{min(attributed):.0%}' if attributed else '—'} | {sum(c['mislabelled_infra'] for c in cases)} | "
                    f"{sum(c['lost_records'] for c in cases)} / {sum(c['duplicate_records'] for c in cases)} |")
    return "\n".join(rows)


def async_grpo() -> str:
    """docs/performance.md's asynchronous GRPO table: per ``max_staleness`` K, from ``async_grpo.json``."""
    a = _read("async_grpo.json")
    rows = [(f"*{_machine(a['machine'])}; `{a['env']}`, {a['config']['steps']} steps × {a['config']['groups_per_step']}"
            f" × {a['config']['group_size']} rollouts from one SFT start, seeds {', '.join(map(str, a['seeds']))}:*"), "",
            ("| K | seconds per step | the trainer's wait for rollouts, s | its training, s | worker's generation, s | "
            "staleness: steps at 0 / 1 / 2 | log-prob gap, trained − behaviour | last checkpoint's validation success |"),
            "|---|---|---|---|---|---|---|---|"]
    for k, e in sorted(a["per_k"].items(), key=lambda kv: int(kv[0])):
        seeds = list(e["per_seed"].values())

        def med(key, seeds=seeds):
            xs = sorted(v[key] for v in seeds if v.get(key) is not None)
            return f"{xs[len(xs) // 2]:.1f}" if xs else "—"
        stale = {s: sum(v["staleness"].get(str(s), 0) for v in seeds) for s in range(3)}
        gaps = [v["behaviour_logprob_gap"] for v in seeds if v["behaviour_logprob_gap"] is not None]
        last = [v["validation"][-1] for v in seeds if v["validation"]]
        rows.append(f"| {k}{' (sync)' if k == '0' else ''} | {e['seconds_per_step']:.1f} | {med('generate_s')} | "
                    f"{med('train_s')} | {med('worker_generate_s')} | "
                    f"{' / '.join(str(stale[s]) for s in range(3)) if int(k) else '—'} | "
                    f"{f'{sum(gaps) / len(gaps):.3f}' if gaps else '—'} | "
                    + "; ".join(f"{x['success']:.2f} [{x['ci_low']:.2f}, {x['ci_high']:.2f}] (step {x['step']})"
                                for x in last) + " |")
    return "\n".join(rows)


def notebook_minutes(timings: Path | None = None) -> str:
    """The README's notebook minutes: each notebook's whole top-to-bottom run on 2 cores, per machine class, as
    ``notebooks/timings.json`` holds them (``python -m agentlab.notebook`` writes them after a real execution; each
    notebook's header renders the same entries, in prose, with its slow cells)."""
    from agentlab.notebook import FP32_CLASSES, FULL_RUN, TIMINGS

    def fp32(cls: str) -> bool:
        return cls.removesuffix(FULL_RUN) in FP32_CLASSES

    def label(cls: str) -> str:
        return f"{cls.removesuffix(FULL_RUN)} ({'fp32' if fp32(cls) else 'bf16'})" + (
            f",{FULL_RUN}" if cls.endswith(FULL_RUN) else "")

    def minutes(x: float) -> str:  # terse for a table cell; the headers say "under a minute" in prose
        return f"{x:.0f}" if x >= 1 else "<1"

    def cell(e: dict | None) -> str:
        if e is None:
            return "—"
        return minutes(e["minutes"]) + (f" ({minutes(e['read_back_minutes'])} read back)"
                                        if "read_back_minutes" in e else "")

    table = json.loads((timings or TIMINGS).read_text())
    classes = sorted({cls for row in table.values() for cls in row},  # bf16 classes first, larger sizes last
                     key=lambda c: (c.endswith(FULL_RUN), fp32(c), c))
    rows = ["| notebook | " + " | ".join(label(c) for c in classes) + " |", "|---" * (len(classes) + 1) + "|"]
    rows += [f"| `{stem}` | " + " | ".join(cell(row.get(c)) for c in classes) + " |" for stem, row in sorted(table.items())]
    return "\n".join(rows)


# Tables a study script renders itself (its ``--table``): name -> (script, its function, the results file it reads).
BY_SCRIPT = {"rl_vs_sft": ("rl_vs_sft", "markdown_table", "rl_vs_sft.json"),
             "rl_vs_sft_calibration": ("rl_vs_sft", "calibration_table", "rl_vs_sft.json"),
             "rl_vs_sft_map": ("rl_vs_sft_map", "markdown_table", "rl_vs_sft_map.json"),
             "seed_systems": ("seed_systems", "markdown_table", "seed_systems.json"),
             "seed_lessons": ("seed_lessons", "markdown_table", "seed_systems.json"),
             "engine_agreement": ("engine_agreement", "markdown_table", "engine_agreement.json"),
             "third_party_env": ("third_party_env", "markdown_table", "third_party_env.json"),
             "pass_at_k": ("pass_at_k", "markdown_table", "pass_at_k.json"),
             "zero_signal": ("zero_signal", "markdown_table", "zero_signal.json"),
             "flat_rows": ("flat_rows", "markdown_table", "flat_rows.json")}


def _by_script(script: str, function: str, results: str):
    def render() -> str:
        return getattr(importlib.import_module(script), function)(_read(results))
    return render


TABLES = {**{name: _by_script(*where) for name, where in BY_SCRIPT.items()},
          **{f.__name__: f for f in (quickstart, rl_vs_sft_seed0, performance, reliability, async_grpo,
                                    notebook_minutes)}}


def render(text: str) -> str:
    """``text`` with every marked table re-rendered from its JSON."""
    def one(m: re.Match) -> str:
        name = m.group(1)
        if name not in TABLES:
            raise KeyError(f"<!-- table: {name} -->: no such table; expected one of {', '.join(TABLES)}")
        return f"<!-- table: {name} -->\n{TABLES[name]()}\n<!-- /table -->"
    return MARKER.sub(one, text)


def unmarked(text: str) -> list[str]:
    """The header lines of result tables outside any marker (a table typed by hand)."""
    outside = MARKER.sub("", text).splitlines()
    return [outside[i - 1] for i, line in enumerate(outside) if line.startswith("|---") and i > 0
            and not outside[i - 1].startswith(NOT_RESULTS)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 naming every table that differs")
    a = p.parse_args(argv)
    bad = []
    for doc in DOCUMENTS:
        text = doc.read_text()
        new = render(text)
        if a.check:
            bad += [f"{doc.relative_to(ROOT)}: table `{m.group(1)}` differs from its JSON (run benchmarks/tables.py)"
                    for m, n in zip(MARKER.finditer(text), MARKER.finditer(new), strict=True)
                    if m.group(0) != n.group(0)]
        bad += [f"{doc.relative_to(ROOT)}: a result table outside a marker: {h[:80]}" for h in unmarked(text)]
        if not a.check and new != text:
            doc.write_text(new)
            print(f"-> {doc.relative_to(ROOT)}")
    for line in bad:
        print(line)
    return 1 if a.check and bad else 0


if __name__ == "__main__":
    sys.exit(main())
