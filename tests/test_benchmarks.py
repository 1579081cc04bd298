"""The study's gatherer keeps what earlier sessions recorded (run folders are not committed)."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))

from rl_vs_sft import markdown_table, merge_earlier


def _point(run, steps):
    return {"run": run, "arm": "sft_best", "lr": 1e-3, "steps": steps, "validation": {"success": 0.1}}


def test_earlier_tried_points_and_seeds_survive_unless_rerun_here():
    earlier = {"env": "product_finder", "regime": "cheap:64",
               "tried": [_point("search/old", 8), _point("pf/seed-0", 4)],
               "seeds": [{"seed": 0, "n": 200, "from": "earlier"}, {"seed": 1, "n": 200, "from": "earlier"}]}
    tried, seeds = merge_earlier(earlier, [_point("pf/seed-0", 2)], [{"seed": 1, "n": 200, "from": "here"}],
                                 "product_finder", "cheap:64")
    assert [(t["run"], t["steps"]) for t in tried] == [("search/old", 8), ("pf/seed-0", 2)]  # a re-run folder wins
    assert [(s["seed"], s["from"]) for s in seeds] == [(0, "earlier"), (1, "here")]


def test_the_script_with_no_flags_is_the_study_in_the_committed_json():
    """`python benchmarks/rl_vs_sft.py` must re-run the recorded study, not `agentlab compare`'s defaults."""
    import json

    from rl_vs_sft import RESULTS, parse

    from agentlab.compare import CompareConfig

    recorded = json.loads((RESULTS / "rl_vs_sft.json").read_text())["config"]
    _, config = parse([])
    ours = {k: v for k, v in json.loads(json.dumps(config.to_config())).items() if k not in ("name", "seed")}
    added = {"rollout_backend", "select", "demos", "ei_rounds"}  # fields added to CompareConfig since the study ran, at their defaults (as resume reads them)
    defaults = CompareConfig().to_config()
    assert all(ours.pop(k) == defaults[k] for k in added if k not in recorded)
    assert ours == recorded
    assert parse(["--grpo-steps", "30"])[1].grpo.steps == 30  # a flag still overrides


def test_seeds_of_another_regime_are_not_mixed_in():
    earlier = {"env": "product_finder", "regime": "expert:32", "tried": [_point("search/x", 4)],
               "seeds": [{"seed": 0, "n": 200}]}
    tried, seeds = merge_earlier(earlier, [], [], "product_finder", "cheap:64")
    assert len(tried) == 1 and seeds == []


def test_checkpoint_evals_of_an_unfinished_grpo_run_are_gathered(tmp_path):
    import json

    from rl_vs_sft import gather_tried

    folder = tmp_path / "pf" / "seed-0"
    (folder / "grpo" / "evals").mkdir(parents=True)
    (folder / "tried.json").write_text(json.dumps({"env": "product_finder", "seed": 0, "tried": [
        {"arm": "sft_best", "regime": "cheap:64", "lr": 3e-4, "steps": 16, "validation": {"success": 0.375}}]}))
    (folder / "config.json").write_text(json.dumps({"regime": "cheap:64", "grpo_lr": 2e-4, "temperature": 1.0}))
    for step, mean in ((0, 0.375), (5, 0.4)):
        (folder / "grpo" / "evals" / f"step-{step:04d}.json").write_text(json.dumps(
            {"step": step, "success": {"mean": mean, "ci_low": 0.2, "ci_high": 0.6, "n": 64}}))
    tried = gather_tried(tmp_path)
    assert [(t["arm"], t["steps"]) for t in tried] == [("sft_best", 16), ("grpo", 5)]  # step 0 is sft_best itself
    assert tried[1]["validation"]["success"] == 0.4 and tried[1]["finished"] is False and tried[1]["run"] == "pf/seed-0"


def test_loss_types_runs_each_type_from_one_start_and_pairs_it_with_dapo(tmp_path, monkeypatch):
    import loss_types

    monkeypatch.setenv("AGENTLAB_RUNS", str(tmp_path))
    out = loss_types.main(["--smoke", "--types", "dapo", "luspo"])  # luspo: TRL's sequence-level rule applied
    assert list(out["types"]) == ["dapo", "luspo"] and out["sft"]["n"] == 4
    for loss_type in ("dapo", "luspo"):
        config = (tmp_path / "loss-types-smoke" / loss_type / "config.json").read_text()
        assert f'"loss_type": "{loss_type}"' in config
    diff = out["types"]["luspo"]["minus_dapo"]
    assert diff["ci_low"] <= diff["mean"] <= diff["ci_high"]
    assert out["types"]["dapo"]["train_seconds"] > 0
    assert out["start"]["sft_steps"] == 2 and 0 <= out["types"]["dapo"]["informative_steps"] <= out["steps"]


def test_the_readme_table_bolds_only_differences_whose_interval_is_above_zero():
    entry = {"success": 0.5, "ci_low": 0.4, "ci_high": 0.6}
    study = {"seeds": [{"seed": 0, "sft_best": entry, "grpo": {**entry, "success": 0.7},
                        "grpo_minus_sft_best": {"mean": 0.2, "ci_low": 0.1, "ci_high": 0.3}},
                       {"seed": 1, "sft_best": entry, "grpo": entry,
                        "grpo_minus_sft_best": {"mean": 0.0, "ci_low": -0.1, "ci_high": 0.1}}]}
    lines = markdown_table(study).splitlines()
    assert lines[0] == "| seed | `sft_best` | `grpo` | GRPO − `sft_best` |" and len(lines) == 4
    assert lines[2].endswith("| **+0.200 [+0.100, +0.300]** |") and "0.700 [0.400, 0.600]" in lines[2]
    assert lines[3].endswith("| +0.000 [-0.100, +0.100] |")


def test_the_eval_benchmark_reference_decodes_on_transformers_own_path_and_back(tiny):
    """eval_throughput's `reference` engine decodes on transformers' own path (generate's own cache, no folded head,
    its SDPA attention) with the same tokens, on the same model, and `agentlab`'s engine puts the levers back:
    configurations alternate on one model, chosen by the engine passed in (nothing patched)."""
    import copy

    from eval_throughput import engine_of

    from agentlab import trl_compat
    from agentlab.envs import load
    from agentlab.rollout import LoopConfig, Renderer

    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    model.config._attn_implementation = "sdpa"
    spec = load("lookup")
    seqs = [Renderer(tok, spec.env_class).prompt_ids(t) for t in spec.make_tasks("test", 3, seed=1)]
    seqs[0] = seqs[0] + seqs[0][-3:]
    cfg = LoopConfig(max_new_tokens=3, temperature=0, precision="fp32")
    ours = engine_of("agentlab")(model, tok, cfg, True, 0)(seqs)
    assert model.get_output_embeddings()._agentlab_folds is not None
    assert model.config._attn_implementation == trl_compat.GQA_PREFILL
    reference = engine_of("reference")(model, tok, cfg, True, 0)(seqs)
    assert getattr(model.get_output_embeddings(), "_agentlab_folds", None) is None
    assert model.config._attn_implementation == "sdpa"
    assert reference == ours == engine_of("agentlab")(model, tok, cfg, True, 0)(seqs)
    assert model.config._attn_implementation == trl_compat.GQA_PREFILL


def test_the_auto_engine_table_is_what_engine_agreement_measured():
    """``engine="auto"`` chooses from ``engines.choice.MEASURED``: the seconds the benchmark wrote, per class."""
    from agentlab.engines.choice import MEASURED

    results = json.loads((Path(__file__).parent.parent / "benchmarks/results/engine_agreement.json").read_text())
    assert MEASURED == {k: v["seconds"] for k, v in results["machines"].items()}


def test_calibration_rows_are_the_scripted_strategies_on_the_seeds_test_tasks():
    """The calibration rows are recomputed from the study's config and seed (the comparison's own test split):
    a changed split, strategy or environment fails here."""
    from rl_vs_sft import scripted_rows

    study = json.loads((Path(__file__).parent.parent / "benchmarks/results/rl_vs_sft.json").read_text())
    seed = study["seeds"][0]
    assert scripted_rows(study["env"], study["config"], seed["seed"]) == seed["scripted"]


def test_the_third_party_table_counts_seeds_by_where_each_paired_ci_lies():
    """third_party_env's README table: a row per seed, and a line counting, per arm, the seeds whose GRPO − arm
    CI lies above 0, below 0, or across it (a seed without that arm is not counted)."""
    from third_party_env import markdown_table

    def ci(mean, low, high):
        return {"mean": mean, "ci_low": low, "ci_high": high, "n": 200}

    def seed(i, d_best, d_matched=None):
        entry = {"seed": i, "sft_best": {"win": ci(0.7, 0.6, 0.8)}, "grpo": {"win": ci(0.8, 0.7, 0.9)},
                 "grpo_minus_sft_best": d_best, "scripted": {"cheap_hop": ci(0.6, 0.5, 0.7)}}
        if d_matched:
            entry.update({"sft_matched": {"win": ci(0.9, 0.85, 0.95)}, "grpo_minus_sft_matched": d_matched})
        return entry

    result = {"package": "textarena", "version": "0", "game": "g", "n": 200, "regime": "r", "regime_about": "a",
              "seeds": [seed(0, ci(0.1, 0.02, 0.2), ci(-0.1, -0.2, -0.03)), seed(1, ci(0.0, -0.05, 0.05))]}
    lines = markdown_table(result).splitlines()
    assert len([line for line in lines if line.startswith(("| 0 |", "| 1 |"))]) == 2
    assert lines[-1] == ("GRPO − `sft_best`: above 0 in 1, below 0 in 0, indistinguishable in 1 of 2 seeds; "
                         "GRPO − `sft_matched`: above 0 in 0, below 0 in 1, indistinguishable in 0 of 1 seeds.")


def test_pass_at_k_pairs_the_two_arms_by_task(tmp_path):
    """GRPO solves task a in every sample where sft_best solved it in one of 4, and both solve b always and c never:
    pass@1 rises by (1 − 1/4) / 3, pass@4 not at all (sharpening), each paired over the 3 tasks."""
    from pass_at_k import markdown_table, paired_pass

    from agentlab.types import Episode, Task

    def write(arm, wins):
        folder = tmp_path / arm
        folder.mkdir()
        eps = [Episode(task=Task(id=t, env="lookup", question=t, answer={}), metrics={"success": float(w)}, sample=i)
               for t, ws in wins.items() for i, w in enumerate(ws)]
        (folder / "rollouts.jsonl").write_text("".join(ep.to_json() + "\n" for ep in eps))

    write("sft_best", {"a": [1, 0, 0, 0], "b": [1, 1, 1, 1], "c": [0, 0, 0, 0]})
    write("grpo", {"a": [1, 1, 1, 1], "b": [1, 1, 1, 1], "c": [0, 0, 0, 0]})
    d = paired_pass(tmp_path, 4)
    assert d["pass@1"]["mean"] == pytest.approx(0.75 / 3) and d["pass@4"]["mean"] == 0 and d["pass@1"]["n"] == 3
    assert d["pass@4"]["ci_low"] == d["pass@4"]["ci_high"] == 0
    curve = [{"k": j, "mean": 0.5, "ci_low": 0.4, "ci_high": 0.6, "n": 3} for j in (1, 2, 3, 4)]
    entry = {"n": 3, "k": 4, "temperature": 1.0, "arms": {"sft_best": curve, "grpo": curve}, "grpo_minus_sft_best": d}
    assert markdown_table({"run": entry}).splitlines()[-1].endswith("| +0.250 [+0.000, +0.750] | +0.000 [+0.000, +0.000] |")


def test_the_grpo_step_benchmark_times_the_trainer_users_train_with(tmp_path):
    """benchmarks/grpo_step.py's agentlab trainer comes from train.build_trainer, so the step it times carries the
    metrics recorder and the non-finite-update guard (it used to rebuild the trainer from private parts, without)."""
    from grpo_step import make_trainer

    trainer, _, _, exp = make_trainer("agentlab", 1, None, tmp_path)
    names = {type(c).__name__ for c in trainer.callback_handler.callbacks}
    assert {"Recorder", "UpdateGuard"} <= names, names
    assert trainer.args.max_steps == exp.steps == 1 and trainer.args.save_strategy == "no"


def test_the_flat_rows_projection_weighs_each_steps_training_seconds_by_its_flat_rollouts_tokens(tmp_path):
    """Per step, the flat groups' share of the tokens after the step's shared prefix, times the step's forward and
    backward seconds, summed, over the steps' seconds (which hold their generation); a step of only flat groups
    keeps its shortest rollout; the machines are the seed's sessions'."""
    from flat_rows import projection

    run = tmp_path / "seed-0"
    (run / "grpo").mkdir(parents=True)
    steps = [{"step": 1, "zero_variance_groups": 0.5, "time_forward_s": 10, "time_backward_s": 30,
              "time_generate_s": 60, "time_step_s": 100},
             {"step": 2, "zero_variance_groups": 1.0, "time_forward_s": 5, "time_backward_s": 5,
              "time_generate_s": 40, "time_step_s": 50}]
    (run / "grpo" / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in steps))

    def episode(step, group, sample, reward, extra):  # 3 prompt tokens shared, then `extra` tokens of its own
        tokens = {"prompt_ids": [7, 8, 9], "completion_ids": [group * 10 + sample] * extra}
        return {"step": step, "group": group, "sample": sample, "reward": reward, "failure": None, "tokens": tokens}

    episodes = [episode(1, 0, 0, 1.0, 3), episode(1, 0, 1, 1.0, 3), episode(1, 1, 0, 0.0, 1), episode(1, 1, 1, 1.0, 1),
                episode(2, 0, 0, 0.0, 2), episode(2, 0, 1, 0.0, 6)]
    (run / "grpo" / "rollouts.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    (run / "sessions.jsonl").write_text(json.dumps({"cpu_class": "amx"}) + "\n")
    seed = projection(tmp_path)["seed-0"]
    assert seed["steps"] == 2 and seed["machines"] == ["amx"] and seed["flat_share"] == 0.75
    assert seed["forward_backward_share"] == 50 / 150
    # step 1: the flat group holds 6 of 8 tokens; step 2: all flat, its 2-token rollout still trains: 6 of 8
    assert seed["saved_share"] == (6 / 8 * 40 + 6 / 8 * 10) / 150


def test_a_lesson_pairs_its_two_settings_over_seed_and_task():
    """seed_lessons.py's comparison: pooled over (seed, task), per-seed means, and b − a paired on the same tasks —
    a run whose tasks differ pairs only the shared ones."""
    from seed_lessons import METRICS, lesson_entry

    def run(values):
        return {"per_task": {f"t{i}": dict.fromkeys(METRICS, v) for i, v in enumerate(values)},
                "train": {"entropy": [0.5], "zero_variance_groups": [0.0]}}

    runs = {"base": {0: run([0, 1, 0, 1]), 1: run([0, 0, 0, 1])}, "f1": {0: run([1, 1, 0, 1]), 1: run([1, 0, 1, 1])}}
    entry = lesson_entry("base", "f1", runs)
    assert entry["seeds"] == [0, 1] and entry["base"]["f4"]["mean"] == 3 / 8 and entry["f1"]["f4"]["n"] == 8
    assert entry["base"]["per_seed"]["f4"] == [0.5, 0.25]
    d = entry["f1_minus_base"]["f4"]
    assert d["mean"] == 3 / 8 and 0 < d["ci_low"] <= d["mean"] <= d["ci_high"]


def test_a_lesson_run_records_the_machine_each_of_its_sessions_ran_on(tmp_path):
    """seed_lessons.log_session: one line per start with the steps already done (complete checkpoints only) and the
    machine; ``machines`` lists the distinct ones in order, and a run that never logged one reads as unrecorded."""
    from seed_lessons import log_session, machines

    from agentlab.machine import cpu_class
    from agentlab.precision import resolve

    run = tmp_path / "lr_x10" / "seed-2"
    assert machines(run) == []
    log_session(run, started="2026-12-06T03:33:00+00:00")
    done = run / "checkpoints" / "checkpoint-3"
    done.mkdir(parents=True)
    (done / "trainer_state.json").write_text("{}")
    (run / "checkpoints" / "checkpoint-4").mkdir()  # torn: no trainer_state.json
    log_session(run)
    rows = [json.loads(line) for line in (run / "sessions.jsonl").read_text().splitlines()]
    assert [r["steps_before"] for r in rows] == [0, 1] and rows[0]["started"] == "2026-12-06T03:33:00+00:00"
    assert machines(run) == [f"{cpu_class()}/{resolve('auto')}"]


def test_the_lessons_read_back_every_finished_seed_whichever_seeds_a_call_trains(tmp_path):
    """seed_lessons.finished: the seeds with a finished run (``DONE``) under a setting's folder, ascending — what
    main() gathers, so ``--seeds 2`` cannot drop seeds 0 and 1 from the JSON; an unfinished run is left out."""
    from seed_lessons import finished

    assert finished(tmp_path / "absent") == []
    for seed, done in ((10, True), (0, True), (1, False), (2, True)):
        (tmp_path / f"seed-{seed}").mkdir()
        if done:
            (tmp_path / f"seed-{seed}" / "DONE").write_text("")
    assert finished(tmp_path) == [0, 2, 10]


def test_the_lessons_table_renders_each_finished_lesson_from_the_json():
    """Only lessons in the JSON get a row, in LESSONS' order, with both settings' pooled means, the paired difference
    (bold only where its CI excludes 0) and each setting's mean last-step entropy."""
    from seed_lessons import METRICS, lesson_entry, markdown_table

    def run(values, entropy):
        return {"per_task": {f"t{i}": dict.fromkeys(METRICS, v) for i, v in enumerate(values)},
                "train": {"entropy": [0.9, entropy], "zero_variance_groups": [0.0, 0.0]}}

    runs = {"base": {0: run([0.0] * 8, 0.5)}, "lr_x10": {0: run([1.0] * 8, 0.1)}, "few_groups": {0: run([0.0] * 8, 0.5)}}
    assert markdown_table({}).startswith("*No lesson")
    table = markdown_table({"lessons": {"start": {"regime": "cheap:64", "adapter": "0.001 x 32"},
                                        "batch": lesson_entry("few_groups", "base", runs),
                                        "lr": lesson_entry("base", "lr_x10", runs)}})
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]
    assert [r.split(" | ")[0] for r in rows] == ["| lr", "| batch"] and "cheap:64" in table and "beta" not in table
    assert "0.000 → 1.000; **+1.000 [+1.000, +1.000]**" in rows[0] and rows[0].endswith("| 0.500 → 0.100 |")
    assert "0.000 → 0.000; +0.000 [+0.000, +0.000] |" in rows[1] and "**" not in rows[1]


def test_every_lesson_setting_builds_from_the_study_config_as_written(tmp_path):
    """seed_lessons.experiment reads the study's ``config.json`` (flat names, lists for tuples, as
    ``CompareConfig.to_config`` writes it through JSON) and changes just its setting's fields."""
    from seed_lessons import SETTINGS, experiment
    from seed_systems import STUDY

    from agentlab.compare_config import CompareConfig

    study = CompareConfig.from_text({"env": "doc_search", **STUDY["doc_search"], "regime": "cheap:64",
                                     "grpo_steps": "12", "groups_per_step": "4", "eval_every": "4"})
    (tmp_path / "config.json").write_text(json.dumps(study.to_config()))
    built = {s: experiment(tmp_path, s, seed=1) for s in SETTINGS}
    base = built["base"]
    assert base.name == "seed-lessons/doc_search/cheap-64/base/seed-1" and base.seed == 1 and base.steps == 6
    assert (base.lr, base.groups_per_step, base.reward) == (study.grpo.lr, 4, study.grpo.reward)
    assert built["lr_x10"].lr == 10 * base.lr and built["few_groups"].groups_per_step == 1
    assert built["f1"].reward.startswith("f1=") and built["f1"].max_turns == base.max_turns


def test_the_lessons_start_where_notebook_06_reads_them():
    """seed_lessons.py's default start (the regime whose runs it makes) is the folder notebook 06 reads back."""
    from seed_lessons import START

    notebook = (Path(__file__).parent.parent / "notebooks/06_ablations.ipynb").read_text()
    assert f"seed-lessons/doc_search/{START['doc_search'].replace(':', '-')}" in notebook


def test_a_regime_beside_the_study_is_kept_apart_and_rendered_with_its_name(tmp_path):
    """seed_systems.py: the study's own regime fills ``out[env]``; another (``--regime``) lands under ``also`` and
    neither overwrites the other; the table names each row's regime, and run folders differ by regime."""
    from seed_systems import STUDY, regime_slot, seed_name
    from seed_systems import markdown_table as seed_table

    own = STUDY["doc_search"]["regime"]
    out = {}
    seed = {"seed": 0, "n": 2, **{arm: {m: {"mean": 0.5, "ci_low": 0.25, "ci_high": 0.75}
                                     for m in ("f4", "f1", "success", "precision", "recall", "curated")}
                                   for arm in ("sft_best", "grpo")}}
    regime_slot(out, "doc_search", own).update({"regime": own, "seeds": [seed]})
    regime_slot(out, "doc_search", "expert:16").update({"regime": "expert:16", "seeds": [seed]})
    assert out["doc_search"]["regime"] == own and out["doc_search"]["also"]["expert:16"]["regime"] == "expert:16"
    assert regime_slot(out, "doc_search", own) is out["doc_search"]
    rows = seed_table(out).splitlines()[2:]
    assert [r.split(" | ")[1] for r in rows] == [f"`{own}`"] * 2 + ["`expert:16`"] * 2
    assert seed_name("doc_search", "expert:16", 1) == "seed-systems/doc_search/expert-16/seed-1"
    assert seed_name("doc_search", own, 1) != seed_name("doc_search", "expert:16", 1)
    # code_search reports its answer's metrics, in a table of its own
    code = {"seed": 0, "n": 2, **{arm: {m: {"mean": 0.5, "ci_low": 0.25, "ci_high": 0.75}
                                     for m in ("success", "precision", "recall", "covered")}
                                   for arm in ("sft_best", "grpo")}}
    regime_slot(out, "code_search", STUDY["code_search"]["regime"]).update(
        {"regime": STUDY["code_search"]["regime"], "seeds": [code]})
    doc_table, code_table = seed_table(out).split("\n\n")
    assert doc_table.splitlines()[0].endswith("| F4 | success | precision | recall | curated |")
    assert code_table.splitlines()[0].endswith("| success | precision | recall | covered |")
    assert len(code_table.splitlines()) == 4 and "code_search" in code_table.splitlines()[2]
    # a seed's calibration rows (its scripted strategies on the same test tasks) follow its policies
    code["scripted"] = {"question_first_hit": {m: {"mean": 0.56, "ci_low": 0.5, "ci_high": 0.62}
                                               for m in ("success", "precision", "recall", "covered")}}
    last = seed_table(out).split("\n\n")[1].splitlines()[-1]
    assert last.startswith("| code_search | `expert:16` | 0 | scripted: question_first_hit | 0.560 [0.500, 0.620] |")
    # the plot: a row per (environment, regime), a column per seed (a single row grew one panel per seed unbounded)
    import matplotlib.image
    from seed_systems import plot

    regime_slot(out, "code_search", STUDY["code_search"]["regime"])["seeds"] += [{**code, "seed": 1}]
    height, width = matplotlib.image.imread(plot(out, tmp_path / "p.png")).shape[:2]
    assert abs(height / width - (3 * 4.2) / (2 * 6.5)) < 0.02


def test_the_rl_vs_sft_map_is_built_from_the_studies_and_rendered_in_the_readme():
    """rl_vs_sft_map.json is what rl_vs_sft_map.py builds from the committed study files (a study that changed
    without the map being rebuilt fails here), and the README's map is its table."""
    from rl_vs_sft_map import build
    from rl_vs_sft_map import markdown_table as map_table

    root = Path(__file__).parent.parent
    committed = json.loads((root / "benchmarks/results/rl_vs_sft_map.json").read_text())
    assert committed == json.loads(json.dumps(build(root / "benchmarks/results")))
    assert {(s["env"], s["regime"]) for s in committed["studies"]} >= {("product_finder", "cheap:64")}
    assert map_table(committed) in (root / "README.md").read_text()


def test_each_study_on_the_map_carries_the_calibration_rows_of_its_own_seeds(tmp_path):
    """Two regimes of one environment: each row shows its seeds' scripted success (its test tasks), and the
    environment's summary counts a seed shared by both regimes once."""
    from rl_vs_sft_map import build, markdown_table

    def seed(k: int, cheap: float) -> dict:
        figure = {"success": {"mean": 0.5, "ci_low": 0.4, "ci_high": 0.6}}
        return {"seed": k, "n": 200, "sft_best": figure, "grpo": figure,
                "scripted": {"cheap": {"success": {"mean": cheap}}}}

    (tmp_path / "seed_systems.json").write_text(json.dumps({"doc_search": {
        "regime": "easy:64", "seeds": [seed(0, 0.7)], "also": {"cheap:64": {"regime": "cheap:64",
                                                                           "seeds": [seed(0, 0.7), seed(1, 0.9)]}}}}))
    out = build(tmp_path)
    assert [s["scripted"]["cheap"] for s in out["studies"]] == [0.7, 0.8]
    assert out["scripted"]["doc_search"]["cheap"] == 0.8
    assert "| doc_search | `cheap:64` | 2 |" in markdown_table(out) and "cheap 0.800 |" in markdown_table(out)


def test_every_result_table_in_the_readme_and_docs_is_its_json_rendered(capsys):
    """benchmarks/tables.py --check: each marked table equals its renderer's output over the committed JSON, and
    no result table sits outside a marker (typed by hand)."""
    import tables

    assert tables.main(["--check"]) == 0, capsys.readouterr().out
    marked = {m.group(1) for doc in tables.DOCUMENTS for m in tables.MARKER.finditer(doc.read_text())}
    assert marked == set(tables.TABLES)  # every renderer has its place, and only those


def test_the_table_check_catches_a_number_typed_into_a_table_and_a_table_typed_by_hand():
    import tables

    doc = "<!-- table: reliability -->\n" + tables.reliability() + "\n<!-- /table -->\n"
    assert tables.render(doc) == doc
    drifted = doc.replace("| none | 0 |", "| none | 1 |")
    assert drifted != doc and tables.render(drifted) == doc  # re-rendering restores the JSON's figure
    typed = doc + "\n| policy | success |\n|---|---|\n| sft | 0.9 |\n"
    assert tables.unmarked(typed) == ["| policy | success |"] and tables.unmarked(doc) == []
    with pytest.raises(KeyError, match="no such table"):
        tables.render("<!-- table: nonsense -->\nx\n<!-- /table -->")


def test_the_notebook_minutes_table_has_a_column_per_class_and_a_dash_where_untimed(tmp_path):
    import tables

    entry = {"commit": "abc1234", "date": "2026-12-07", "slow": []}
    (tmp_path / "timings.json").write_text(json.dumps({
        "03_b": {"avx2": {**entry, "minutes": 13.5}, "amx with AGENTLAB_FULL=1": {**entry, "minutes": 23.4}},
        "01_a": {"amx": {**entry, "minutes": 0.4, "read_back_minutes": 0.1}, "avx2": {**entry, "minutes": 2.6}}}))
    rows = tables.notebook_minutes(tmp_path / "timings.json").splitlines()
    # bf16 before fp32, the larger size last; notebooks in order
    assert rows[0] == "| notebook | amx (bf16) | avx2 (fp32) | amx (bf16), with AGENTLAB_FULL=1 |"
    assert rows[2:] == ["| `01_a` | <1 (<1 read back) | 3 | — |", "| `03_b` | — | 14 | 23 |"]


def test_pass_at_k_curve_is_the_unbiased_estimator_averaged_over_tasks(tmp_path, monkeypatch):
    """pass_at_k.py: pass@j rises with j to the share of tasks ever solved; tasks short of k samples are left out;
    a run folder that holds no comparison is refused with what to do."""
    import itertools

    import pass_at_k
    import pytest

    from agentlab.evals import pass_at_k_curve

    samples = {"a": [1, 0, 0, 0], "b": [0, 0, 0, 0], "c": [1, 1, 1, 1], "short": [1]}
    points = pass_at_k_curve(samples, 4)
    assert [p["k"] for p in points] == [1, 2, 3, 4] and all(p["n"] == 3 for p in points)
    assert points[0]["mean"] == (0.25 + 0 + 1) / 3 and points[-1]["mean"] == 2 / 3
    assert all(x["mean"] <= y["mean"] for x, y in itertools.pairwise(points))
    monkeypatch.setenv("AGENTLAB_RUNS", str(tmp_path))
    with pytest.raises(SystemExit, match="no comparison"):
        pass_at_k.main(["--run", "nothing-here"])


def test_grpo_minus_a_scripted_strategy_is_paired_by_test_task():
    """seed_systems.py: GRPO against each one-line strategy (not the expert or the random floor), paired by task id
    whatever the order the episodes came in."""
    from seed_systems import minus_scripted

    from agentlab.types import Episode, Task

    def ep(task_id, success):
        return Episode(task=Task(id=task_id, env="code_search", question="q", answer={}), metrics={"success": success})

    grpo = [ep("t2", 1.0), ep("t1", 1.0), ep("t3", 0.0), ep("t4", 1.0)]
    scores = {name: {f"t{i}": {"success": v} for i, v in enumerate(values, 1)}
              for name, values in {"expert": (1, 1, 1, 1), "question_first_hit": (1, 0, 0, 0),
                                   "random": (0, 0, 0, 0)}.items()}
    out = minus_scripted("code_search", grpo, scores)
    assert list(out) == ["question_first_hit"]
    d = out["question_first_hit"]["success"]
    assert d["mean"] == 0.5 and d["ci_low"] <= 0.5 <= d["ci_high"]
    assert set(out["question_first_hit"]) == {"success", "precision", "recall", "covered"}


def test_gpu_check_keeps_grpo_step_metrics_from_a_run_cut_short():
    """A step killed at its limit writes no result.json; its GRPO step lines are what it measured."""
    from gpu_check import logged_steps

    log = ("{'loss': '1.2', 'grad_norm': '3', 'entropy': '0.7', 'epoch': '0.5'}\n"  # SFT: no reward
           "{'loss': '-0.1', 'reward': '0.68', 'frac_reward_zero_std': '0.25', 'entropy': '0.043', "
           "'step_time': '73.04'}\r 50%|#####     | 1/2\n")
    assert logged_steps(log) == [{"step_time": 73.04, "reward": 0.68, "frac_reward_zero_std": 0.25, "entropy": 0.043}]


def test_a_seeds_seconds_count_each_stage_once():
    """An arm's checkpoint validations and sampling budget are timed inside the arm's own stage; summing every entry of
    seconds.json counted them twice."""
    from rl_vs_sft import total_seconds

    seconds = {"tasks": 1.0, "sft_best_lr=0.001_train": 10.0, "sft_best_lr=0.001_steps=16_validation": 5.0,
               "grpo": 100.0, "sft_matched": 90.0, "sft_matched_steps=4_validation": 7.0, "rft": 95.0,
               "rft_sampling": 40.0, "rft_steps=2_validation": 6.0, "expert_iteration": 98.0,
               "ei_round0_sampling": 30.0, "expert_iteration_round0_validation": 8.0, "test_grpo": 20.0}
    assert total_seconds({"seconds": seconds}) == 1 + 10 + 5 + 100 + 90 + 95 + 98 + 20  # an older result
    assert total_seconds({"seconds": seconds, "seconds_total": 12.5}) == 12.5  # one whose clock knew the nesting
