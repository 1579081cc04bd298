"""``agentlab compare``: regimes, the RFT row format, and every arm end to end with the tiny model (resumable)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentlab.compare import ARMS, CompareConfig, run_compare
from agentlab.engines.scripted import scripted_generate_fn
from agentlab.envs import load
from agentlab.rollout import Renderer, run_episodes
from agentlab.synth import episode_sft_row, parse_regime, regime_demos


@pytest.mark.parametrize("regime", ["cheap", "cheap:", "cheap:0", "oracle:8", "8"])
def test_bad_regime_is_refused_before_any_work(regime):
    with pytest.raises(ValueError, match="expected '<kind>:<n>'"):
        CompareConfig(regime=regime)


def test_regimes_give_what_they_promise():
    spec = load("product_finder")
    train = spec.make_tasks("train", 400, seed=0)
    easy = regime_demos(spec, "easy:16", train)
    by_id = {t.id: t for t in train}
    assert len(easy) == 16 and {by_id[d["task_id"]].difficulty for d in easy} == {1}
    cheap = regime_demos(spec, "cheap:16", train)
    # the cheap strategy searches once for the bare product type and recommends the first hit
    for demo in cheap:
        calls = [m["tool_calls"][0]["function"] for m in demo["messages"] if m["role"] == "assistant"]
        assert [c["name"] for c in calls] == ["search_products", "recommend"]
        assert calls[0]["arguments"] == {"query": by_id[demo["task_id"]].answer["constraints"]["type"]}
    assert parse_regime("expert:3") == ("expert", 3)
    # lookup's cheap strategy searches the last name alone and answers from the first record
    lookup = load("lookup")
    lookup_train = lookup.make_tasks("train", 64, seed=0)
    for demo in regime_demos(lookup, "cheap:4", lookup_train):
        calls = [m["tool_calls"][0]["function"] for m in demo["messages"] if m["role"] == "assistant"]
        question = next(t.question for t in lookup_train if t.id == demo["task_id"])
        assert calls[0]["name"] == "search_people" and len(calls[0]["arguments"]["query"].split()) == 1
        assert calls[0]["arguments"]["query"] in question
    with pytest.raises(ValueError, match="has no cheap_policy"):
        regime_demos(load("code_search"), "cheap:4", load("code_search").make_tasks("train", 4, seed=0))
    with pytest.raises(ValueError, match="only 3 successful demonstrations among 3"):
        regime_demos(load("lookup"), "expert:4", load("lookup").make_tasks("train", 3, seed=0))


def test_rft_rows_train_exactly_the_generated_tokens(tiny):
    _, tok = tiny
    spec = load("lookup")
    tasks = spec.make_tasks("train", 2, seed=1)
    renderer = Renderer(tok, spec.env_class)
    eps = run_episodes(None, tok, spec, tasks, progress=False,
                       generate_fn=scripted_generate_fn(renderer, tasks, spec.expert))
    for ep in eps:
        row = episode_sft_row(ep)
        trained = [t for t, m in zip(row["input_ids"], row["assistant_masks"], strict=True) if m]
        generated = [t for t, m in zip(ep.tokens["completion_ids"], ep.tokens["mask"], strict=True) if m]
        assert trained == generated and sum(t.n_generated for t in ep.turns) == len(trained)
        assert row["input_ids"][: len(ep.tokens["prompt_ids"])] == ep.tokens["prompt_ids"]


def test_every_arm_end_to_end_and_resume(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTLAB_RUNS", str(tmp_path))
    cfg = CompareConfig.smoke(name="cmp")
    result = run_compare(cfg)
    run = tmp_path / "cmp"
    saved = json.loads((run / "result.json").read_text())
    assert saved["n"] == cfg.test and set(ARMS) <= set(saved)
    for arm in ARMS:
        e = saved[arm]
        assert 0 <= e["ci_low"] <= e["success"] <= e["ci_high"] <= 1 and e["n"] == cfg.test
    for arm in ("sft_best", "sft_matched", "rft", "expert_iteration", "sft_all"):
        d = saved[f"grpo_minus_{arm}"]
        assert -1 <= d["ci_low"] <= d["mean"] <= d["ci_high"] <= 1
    # the SFT search covered every lr x steps point, each scored on validation
    search = [t for t in saved["tried"] if t["arm"] == "sft_best"]
    assert {(t["lr"], t["steps"]) for t in search} == {(lr, s) for lr in cfg.sft.lrs for s in cfg.sft.steps}
    best = max(search, key=lambda t: t["validation"]["success"])["validation"]["success"]
    assert saved["choices"]["sft_best"]["validation"]["success"] == best
    # sft_all is searched too: every rate, its step counts in epochs of its demonstrations (8 demos, batch 2)
    every = {(t["lr"], t["steps"]) for t in saved["tried"] if t["arm"] == "sft_all"}
    assert every >= {(lr, s) for lr in cfg.sft.lrs for s in (2, 4)}
    assert saved["choices"]["grpo"]["step"] >= 1  # GRPO's own checkpoint counts, never its SFT start
    # GRPO's step 0 is its start's validation pass, read back, not run again (same rollouts, same figure)
    start = run / saved["choices"]["sft_best"]["adapter"]
    step0 = json.loads((run / "grpo" / "evals" / "step-0000.json").read_text())
    scored = start.parent / f"validation-step-{saved['choices']['sft_best']['steps']}"
    assert step0["from"].endswith(f"{scored.parent.name}/{scored.name}")
    assert step0["success"] == json.loads((scored / "summary.json").read_text())["success"]
    assert (run / "grpo/evals/step-0000.rollouts.jsonl").read_text() == (scored / "rollouts.jsonl").read_text()
    # the test split is touched once per arm; GRPO's checkpoint evals read validation tasks only
    test_ids = {json.loads(line)["id"] for line in (run / "tasks" / "test.jsonl").read_text().splitlines()}
    val_ids = {json.loads(line)["id"] for line in (run / "tasks" / "validation.jsonl").read_text().splitlines()}
    for arm in ARMS:
        lines = (run / "test" / arm / "rollouts.jsonl").read_text().splitlines()
        assert {json.loads(line)["task"]["id"] for line in lines} == test_ids
    for path in (run / "grpo" / "evals").glob("*.rollouts.jsonl"):
        assert {json.loads(line)["task"]["id"] for line in path.read_text().splitlines()} <= val_ids
    # compute matching: both baselines ran for (about) GRPO's training seconds, and no longer than a step over
    grpo_s = saved["choices"]["grpo"]["train_seconds"]
    assert saved["choices"]["sft_matched"]["seconds"] >= grpo_s
    assert saved["choices"]["rft"]["sampling_s"] + saved["choices"]["rft"]["seconds"] >= grpo_s
    # ...and each kept the best of its checkpoints on validation, as GRPO does (never simply its last adapter)
    for arm in ("sft_matched", "rft"):
        points = [t for t in saved["tried"] if t["arm"] == arm]
        assert len(points) >= 1 and {t["steps"] for t in points} <= set(range(1, saved["choices"][arm]["steps_run"] + 1))
        best = max(t["validation"]["success"] for t in points)
        assert saved["choices"][arm]["validation"]["success"] == best
    # expert iteration: each round scored on validation, the best round kept; within GRPO's seconds (a step over)
    ei = saved["choices"]["expert_iteration"]
    rounds = [t for t in saved["tried"] if t["arm"] == "expert_iteration"]
    assert 1 <= ei["round"] <= len(ei["rounds"]) == len(rounds) <= cfg.ei_rounds
    assert ei["validation"]["success"] == max(t["validation"]["success"] for t in rounds)
    assert all(r["kept_total"] >= r["kept_new"] for r in ei["rounds"])
    for r, point in zip(ei["rounds"], rounds, strict=True):  # a round that kept nothing is not scored again
        if r["kept_total"] == 0:
            assert not (run / "expert_iteration" / f"round-{r['round']}" / "validation").exists()
            assert point["validation"] == saved["choices"]["sft_best"]["validation"]
    assert (run / "result.png").stat().st_size > 10_000
    # a stage timed inside an arm's own (its validations, its sampling) counts once in the total: the clock finds the
    # very stages the name rule for older results (benchmarks/rl_vs_sft.py) leaves out
    sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
    from rl_vs_sft import NESTED

    within = json.loads((run / "seconds-within.json").read_text())
    assert set(within) == {k for k in saved["seconds"] if k.startswith(NESTED)}
    assert saved["seconds_total"] == round(sum(v for k, v in saved["seconds"].items() if k not in within), 1)
    # resume: a finished comparison is read back, not redone
    stamps = {p: p.stat().st_mtime_ns for p in run.rglob("adapter_model.safetensors")}
    assert json.loads(json.dumps(run_compare(cfg))) == json.loads(json.dumps(result)) == saved
    assert stamps == {p: p.stat().st_mtime_ns for p in run.rglob("adapter_model.safetensors")}
    # our records name paths relative to their run folder: no record holds this machine's path, and the folder,
    # moved elsewhere, resumes as it is (every adapter its choices name is found, nothing is redone)
    ours = [p for p in run.rglob("*") if p.is_file() and (p.suffix in (".json", ".jsonl") or p.name == "DONE")
            and not {"checkpoints", "trainer"} & set(p.parts) and p.name != "adapter_config.json"]
    assert len(ours) > 20 and [p for p in ours if str(tmp_path) in p.read_text()] == []
    (tmp_path / "moved").mkdir()
    moved = run.rename(tmp_path / "moved" / "cmp")
    monkeypatch.setenv("AGENTLAB_RUNS", str(tmp_path / "moved"))
    assert json.loads(json.dumps(run_compare(cfg))) == saved
    assert stamps == {run / p.relative_to(moved): p.stat().st_mtime_ns
                      for p in moved.rglob("adapter_model.safetensors")}


def test_cli_refuses_bad_arms_in_one_line(tmp_path):
    env = {**os.environ, "AGENTLAB_RUNS": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "agentlab.cli", "compare", "--smoke", "--arms", "grpo,dpo"],
                         capture_output=True, text=True, env=env, check=False)
    assert out.returncode == 2 and "expected a subset of" in out.stderr and "Traceback" not in out.stderr


def test_lookup_cheap_strategy_succeeds_only_sometimes():
    from agentlab.types import run_policy

    spec = load("lookup")
    tasks = spec.make_tasks("validation", 300, seed=0)  # every validation question
    rates = {name: sum(spec.evaluate(t, run_policy(spec, t, policy)[0])["success"] for t in tasks) / len(tasks)
             for name, policy in (("cheap", spec.cheap_policy), ("expert", spec.expert))}
    assert rates["expert"] == 1.0 and 0.0 < rates["cheap"] < 0.2, rates


@pytest.mark.parametrize("select, chosen", [("success", 1), ("reward", 2)])
def test_choices_maximise_the_selected_validation_figure(tmp_path, monkeypatch, select, chosen):
    """doc_search's GRPO maximises F4, not exact success: a comparison selecting on ``reward`` picks the SFT step
    count with the higher validation reward even where success ranks the other first (fake scores; the choice is
    what is under test, not training)."""
    import agentlab.train
    from agentlab.compare import Comparison

    monkeypatch.setenv("AGENTLAB_RUNS", str(tmp_path))

    def fake_sft(model, demos, folder, settings, save_at=(), **_):
        for s in save_at:
            (folder / f"adapter-step-{s}").mkdir(parents=True)
            (folder / f"adapter-step-{s}" / "adapter_config.json").write_text("{}")

    scores = {1: (0.5, 0.1), 2: (0.25, 0.9)}  # steps: (success, reward)

    def fake_eval(self, folder, adapter, tasks, label):
        success, reward = scores[int(str(folder).rsplit("-", 1)[1])]
        return {"success": {"mean": success, "ci_low": 0.0, "ci_high": 1.0, "n": 4},
                "reward": {"mean": reward, "ci_low": 0.0, "ci_high": 1.0, "n": 4}}

    monkeypatch.setattr(agentlab.train, "run_sft", fake_sft)
    monkeypatch.setattr(Comparison, "evaluate", fake_eval)
    cmp = Comparison(CompareConfig.smoke(name="sel", select=select, sft_lrs=(1e-3,), sft_extend=0))
    choice = cmp.sft_search("sft_best", [], (1e-3,), [])
    assert choice["steps"] == chosen
    assert choice["validation"].get("reward", scores[chosen][1]) == scores[chosen][1]
    with pytest.raises(ValueError, match="select='f9'"):
        CompareConfig(select="f9")


def test_a_decaying_schedule_is_searched_beside_the_constant_one_and_lengthened_from_scratch(tmp_path, monkeypatch):
    """sft_schedules adds decaying runs to the grid; when one is best at the grid's edge, its longer point is a fresh
    run of twice the steps with the same schedule (a decayed rate cannot be continued). Fake training and scores:
    the search is under test."""
    import agentlab.train
    from agentlab.compare import Comparison, epoch_steps

    monkeypatch.setenv("AGENTLAB_RUNS", str(tmp_path))
    runs = []

    def fake_sft(model, demos, folder, settings, save_at=(), init_adapter=None, **_):
        runs.append((folder.name, settings.schedule, settings.steps, init_adapter is not None))
        for s in save_at or ():
            (folder / f"adapter-step-{s}").mkdir(parents=True)
            (folder / f"adapter-step-{s}" / "adapter_config.json").write_text("{}")
        if not save_at:
            (folder / "adapter").mkdir(parents=True)

    def fake_eval(self, folder, adapter, tasks, label):
        steps = int(str(folder).rsplit("-", 1)[1])
        success = steps / 8 if "cosine" in str(adapter) else 0.1  # cosine keeps rising with steps
        return {"success": {"mean": success, "ci_low": 0.0, "ci_high": 1.0, "n": 4}}

    monkeypatch.setattr(agentlab.train, "run_sft", fake_sft)
    monkeypatch.setattr(Comparison, "evaluate", fake_eval)
    cmp = Comparison(CompareConfig.smoke(name="sched", sft_lrs=(1e-3,), sft_schedules=("constant", "cosine"),
                                         sft_extend=1))
    choice = cmp.sft_search("sft_best", [], (1e-3,), [])
    assert (choice["steps"], choice["schedule"], choice["at_edge"]) == (4, "cosine", True)
    assert runs == [("lr=0.001", "constant", 2, False), ("lr=0.001-cosine", "cosine", 2, False),
                    ("run-4", "cosine", 4, False)]  # the longer cosine point: trained from scratch
    assert {(t["steps"], t.get("schedule", "constant")) for t in cmp.tried} == {
        (1, "constant"), (2, "constant"), (1, "cosine"), (2, "cosine"), (4, "cosine")}
    assert epoch_steps(8, 2, (0.5, 1)) == (2, 4) and epoch_steps(3, 2, (0.1,)) == (1,)
    with pytest.raises(ValueError, match="sft_schedules"):
        CompareConfig.of(sft_schedules=("warmup",))


@pytest.mark.parametrize("patience, reached, chosen", [(0, 4, 2), (1, 16, 16)])
def test_patience_continues_the_search_past_a_dip_in_validation(tmp_path, monkeypatch, patience, reached, chosen):
    """Validation by steps 1: .1, 2: .3, 4: .2 (a dip), 8: .4, 16: .5: without patience the search stops at the dip
    and keeps 2 steps; with patience 1 it continues from the dipped run to the later peak. Fake training and scores:
    the search is under test."""
    import agentlab.train
    from agentlab.compare import Comparison

    monkeypatch.setenv("AGENTLAB_RUNS", str(tmp_path))
    continued = []

    def fake_sft(model, demos, folder, settings, save_at=(), init_adapter=None, **_):
        if init_adapter is not None:
            continued.append(init_adapter.name)
        for s in save_at or ():
            (folder / f"adapter-step-{s}").mkdir(parents=True)
            (folder / f"adapter-step-{s}" / "adapter_config.json").write_text("{}")
        if not save_at:
            (folder / "adapter").mkdir(parents=True)

    curve = {1: 0.1, 2: 0.3, 4: 0.2, 8: 0.4, 16: 0.5}

    def fake_eval(self, folder, adapter, tasks, label):
        return {"success": {"mean": curve[int(str(folder).rsplit("-", 1)[1])], "ci_low": 0, "ci_high": 1, "n": 4}}

    monkeypatch.setattr(agentlab.train, "run_sft", fake_sft)
    monkeypatch.setattr(Comparison, "evaluate", fake_eval)
    cmp = Comparison(CompareConfig.smoke(name=f"patience-{patience}", sft_lrs=(1e-3,), sft_extend=3,
                                         sft_patience=patience))
    choice = cmp.sft_search("sft_best", [], (1e-3,), [])
    assert choice["steps"] == chosen and max(t["steps"] for t in cmp.tried) == reached
    assert continued == ["adapter-step-2", "adapter-step-4", "adapter-step-8"][: len(continued)] and continued
    with pytest.raises(ValueError, match="sft_patience"):
        CompareConfig.of(sft_patience=-1)


def test_expert_iteration_keeps_every_distinct_verified_success_once(tiny):
    """Two samples of one task that generated the same tokens are one demonstration; a failure or an infra-failed
    success is none; a different success of the same task is kept too (rft keeps one per task)."""
    from dataclasses import replace

    from agentlab.verified import verified

    _, tok = tiny
    spec = load("lookup")
    tasks = spec.make_tasks("train", 2, seed=1)
    eps = run_episodes(None, tok, spec, tasks, progress=False,
                       generate_fn=scripted_generate_fn(Renderer(tok, spec.env_class), tasks, spec.expert))
    assert all(ep.success == 1.0 for ep in eps)
    other = replace(eps[0], tokens={**eps[0].tokens, "completion_ids": [*eps[0].tokens["completion_ids"], 0]})
    pool = [eps[0], eps[0], other, replace(eps[1], metrics={**eps[1].metrics, "success": 0.0}),
            replace(eps[1], failure="infra")]
    assert verified(pool) == [eps[0], other]


OLDER_CONFIG = {  # a comparison's config.json as run folders hold it (written before the config was composed)
    "demos": "", "ei_rounds": 3, "env": "doc_search", "eval_every": 4, "group_size": 4, "groups_per_step": 4,
    "grpo_lr": 0.0002, "grpo_steps": 12, "max_context": 4096, "max_new_tokens": 160, "max_turns": 10,
    "model": "smollm2-135m", "name": "seed-systems/doc_search/cheap-64/seed-0", "regime": "cheap:64",
    "rollout_backend": "torch", "seed": 0, "select": "reward", "sft_all_demos": 256, "sft_batch": 2,
    "sft_extend": 2, "sft_lrs": [0.001], "sft_steps": [16, 32], "temperature": 1.0, "test": 200, "train": 1000,
    "validation": 64}


def test_the_composed_config_reads_and_writes_the_flat_config_json_run_folders_hold():
    flat = {k: tuple(v) if isinstance(v, list) else v for k, v in OLDER_CONFIG.items()}
    cfg = CompareConfig.of(**flat)
    assert (cfg.grpo.lr, cfg.grpo.steps, cfg.sft.steps, cfg.env) == (2e-4, 12, (16, 32), "doc_search")
    assert cfg.grpo.name == f"{cfg.name}/grpo" and cfg.grpo.eval_tasks == cfg.validation  # the comparison's
    assert json.loads(json.dumps(cfg.to_config())) == OLDER_CONFIG  # so that folder still resumes
    # a GRPO setting the flat form never named is written as grpo_<field>, only when it is not Experiment's default
    tuned = cfg.replace(grpo_loss_type="dr_grpo")
    assert tuned.grpo.loss_type == "dr_grpo" and tuned.to_config()["grpo_loss_type"] == "dr_grpo"
    assert CompareConfig.of(**tuned.to_config()) == tuned
    with pytest.raises(ValueError, match="unknown field.*grpo_nonsense"):
        cfg.replace(grpo_nonsense=1)


def test_another_environment_takes_its_own_budget_not_the_last_ones():
    cfg = CompareConfig.of(env="doc_search")
    lookup = cfg.replace(env="lookup")
    assert lookup.grpo.max_turns == load("lookup").budget.max_turns != cfg.grpo.max_turns
    assert cfg.replace(env="lookup", max_turns=2).grpo.max_turns == 2  # unless one is given


def test_the_quickstart_is_a_comparison_with_other_defaults_not_a_copy_of_its_fields():
    from dataclasses import fields

    from agentlab.quickstart import QuickstartConfig

    assert issubclass(QuickstartConfig, CompareConfig)
    assert [f.name for f in fields(QuickstartConfig)] == [f.name for f in fields(CompareConfig)]
    q = QuickstartConfig()
    assert (q.env, q.grpo.steps, q.grpo.temperature, q.sft.steps) == ("lookup", 12, 1.0, (4, 8, 16))
    assert QuickstartConfig.of(grpo_steps=6).sft.steps == (4, 8, 16)  # flat changes keep the quickstart's defaults


def test_the_quickstart_report_shows_its_grpo_stage_spread_over_seeds_where_it_was_measured(tmp_path):
    import json

    from agentlab.quickstart import SEED_SPREAD, QuickstartConfig, seed_spread, spread_text

    measured = json.loads(SEED_SPREAD.read_text())["per_k"]["0"]["per_seed"]
    spread = seed_spread(QuickstartConfig())
    assert spread["seeds"] == {s: round(r["validation"][-1]["success"], 4) for s, r in measured.items()}
    assert len(spread["seeds"]) >= 3 and spread["steps"] == QuickstartConfig().grpo.steps
    # another GRPO setting, or no results file: no spread is claimed for it
    assert seed_spread(QuickstartConfig.of(grpo_steps=6)) is None
    assert seed_spread(QuickstartConfig(), path=tmp_path / "missing.json") is None
    assert not spread["same_start"] and "the quickstart's SFT start on" in spread_text(spread)


def test_a_quickstart_is_shown_the_spread_from_its_own_start_where_it_was_measured():
    """The AVX2 quickstart's SFT search chose lr 1e-3 x 4 steps, a start benchmarks/zero_signal.py ran GRPO from on
    three seeds there: that spread, not the one from the AVX-512 quickstart's other start (which the report called
    'the same start')."""
    import json

    from agentlab.quickstart import STARTS_SPREAD, QuickstartConfig, report_spread, seed_spread, spread_text

    report = json.loads((STARTS_SPREAD.parent / "quickstart_avx2.json").read_text())
    measured = json.loads(STARTS_SPREAD.read_text())["starts"]["sft-lr=0.001-steps=4"]
    spread = report_spread(report)
    assert spread["same_start"] and spread["source"].endswith("zero_signal.json") and spread["machine"] == "avx2"
    assert spread["seeds"] == {s: round(r["validation"][-1]["mean"], 4) for s, r in measured["runs"]["step"].items()}
    assert spread["start"] == round(report["choices"]["sft_best"]["validation"]["success"], 4)  # the same adapter's
    assert "from the same SFT start" in spread_text(spread)
    # the same setting in bf16, scoring otherwise on validation, or another GRPO setting: not the same start
    same = {"lr": 1e-3, "steps": 4, "precision": "fp32", "validation": {"success": 11 / 48, "n": 48}}
    assert seed_spread(QuickstartConfig(), same)["same_start"]
    for start, cfg in (({**same, "precision": "bf16"}, QuickstartConfig()),
                       ({**same, "validation": {"success": 12 / 48, "n": 48}}, QuickstartConfig()),
                       ({**same, "validation": {"success": 11 / 48, "n": 40}}, QuickstartConfig()),
                       (same, QuickstartConfig.of(grpo_lr=1e-4))):
        assert not (seed_spread(cfg, start) or {"same_start": False})["same_start"]


def test_an_fp32_quickstart_on_another_machine_class_is_shown_the_spread_from_the_start_it_reproduced():
    """The AVX-512 Xeon's fp32 quickstart (no bf16 instructions) reproduced the AVX2 EPYC's: every validation point of
    the SFT grid and GRPO, and each arm's test success. Its start is the one benchmarks/zero_signal.py measured."""
    import json

    from agentlab.quickstart import STARTS_SPREAD, report_spread

    here, avx2 = (json.loads((STARTS_SPREAD.parent / f"quickstart_{c}.json").read_text()) for c in ("avx512", "avx2"))
    assert here["machine"]["cpu_class"] == "avx512" and here["machine"]["precision"] == avx2["machine"]["precision"]
    points = [{(t["arm"], t.get("lr"), t["steps"]): t["validation"] for t in r["tried"] if t["arm"] != "sft_matched"}
              for r in (here, avx2)]
    assert points[0] == points[1] and len(points[0]) >= 10
    assert [here[k]["success"] for k in ("base", "sft", "grpo")] == [avx2[k]["success"] for k in ("base", "sft", "grpo")]
    spread = report_spread(here)
    assert spread["same_start"] and spread["seeds"] == report_spread(avx2)["seeds"] and spread["machine"] == "avx2"
