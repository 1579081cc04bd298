"""product_finder: seeded catalog, disjoint splits, ASR check, scripted policies and hostile tool inputs."""

from __future__ import annotations

import math

import pytest

from agentlab.corpora import catalog as cat
from agentlab.envs import load
from agentlab.envs import product_finder as pf
from agentlab.synth import audit_splits
from agentlab.types import InfraError, Outcome, ToolCall, call_tool, run_policy, tool_names


@pytest.fixture(scope="session")
def spec():
    return load("product_finder")


@pytest.fixture(scope="session")
def test_tasks(spec):
    return spec.make_tasks("test", 200, seed=0)


@pytest.fixture()
def env(spec, test_tasks):
    env = spec.make_env()
    env.reset(task=test_tasks[0].to_json())
    return env


def _asr(spec, tasks, policy) -> float:
    return sum(spec.evaluate(t, run_policy(spec, t, policy)[0])["success"] for t in tasks) / len(tasks)


# -- catalog ------------------------------------------------------------------------------------------------------


def test_catalog_is_large_deterministic_and_well_formed():
    products = cat.catalog()
    assert len(products) >= 10_000
    assert cat.build_catalog() == products  # a fresh build is identical
    assert cat.build_catalog(seed=1) != products
    assert len({p["id"] for p in products}) == len(products)
    all_types = [t for ts in cat.TYPES.values() for t in ts]
    assert len(all_types) == len(set(all_types)) >= 300
    assert {p["type"] for p in products} == set(all_types)  # every type is on sale
    for p in products[:2000]:
        assert 1.0 <= p["rating"] <= 5.0 and p["price"] > 0
        assert bool(p["size"]) == (p["category"] in cat.SIZES)
        assert p["type"] in cat.TYPES[p["category"]] and p["brand"] in p["title"]


def test_search_filters_and_ranking():
    idx = cat.index()
    hits, total = idx.search("hiking boots", brand="Cobalta", max_price=150, min_rating=3.5)
    assert 0 < len(hits) <= 10 and total >= len(hits)
    assert all(p["brand"] == "Cobalta" and p["price"] <= 150 and p["rating"] >= 3.5 for p in hits)
    assert hits[0]["type"] == "hiking boots"
    assert idx.search("hiking boots") == idx.search("Hiking  BOOTS!")  # deterministic, normalised
    assert idx.search("zzqx") == ([], 0)


def test_wordnet_parser_reads_hyponyms(tmp_path):
    data = tmp_path / "data.noun"
    data.write_text(
        "  1 This software and database is being provided\n"
        "00000001 06 n 01 garment 0 001 ~ 00000002 n 0000 | an article of clothing\n"
        "00000002 06 n 01 kilt 0 001 ~ 00000003 n 0000 | a skirt\n"
        "00000003 06 n 02 mini_kilt 0 t-shirt 0 000 | a short kilt\n"
    )
    extra = cat.wordnet_types(data)
    assert extra["clothing"] == ["kilt", "mini kilt"]  # "t-shirt" is taken already and not a plain word
    assert cat.wordnet_types(tmp_path / "missing") == {}


# -- tasks and splits ---------------------------------------------------------------------------------------------


def test_make_tasks_is_deterministic(spec, test_tasks):
    assert [t.to_json() for t in spec.make_tasks("test", 200, seed=0)] == [t.to_json() for t in test_tasks]
    assert spec.make_tasks("test", 20, seed=1) != test_tasks[:20]
    assert len({t.question for t in test_tasks}) == len({t.answer["target"] for t in test_tasks}) == 200


def test_every_task_has_a_satisfying_product(test_tasks):
    products = cat.catalog()
    by_id = cat.index().by_id
    for i, task in enumerate(test_tasks):
        constraints = task.answer["constraints"]
        assert cat.satisfies(by_id[task.answer["target"]], constraints)
        assert task.answer["n_satisfying"] >= 1
        assert len(constraints) == task.difficulty + 1 and "type" in constraints
        if i < 20:  # the recorded count is a brute-force count over the whole catalog
            assert task.answer["n_satisfying"] == sum(cat.satisfies(p, constraints) for p in products)


def test_difficulty_knob(spec):
    assert all(len(t.answer["constraints"]) == 2 for t in spec.make_tasks("validation", 30, difficulty=1))
    assert all(len(t.answer["constraints"]) == 5 for t in spec.make_tasks("validation", 30, difficulty=4))
    with pytest.raises(ValueError, match="difficulty"):
        spec.make_tasks("train", 1, difficulty=9)
    with pytest.raises(ValueError, match="unknown split"):
        spec.make_tasks("dev", 1)


def test_splits_are_disjoint_and_the_audit_catches_overlap(spec, test_tasks):
    splits = {"train": spec.make_tasks("train", 3000), "validation": spec.make_tasks("validation", 250),
              "test": spec.make_tasks("test", 250)}
    assert audit_splits(spec, splits)["ok"]
    leaky = {"train": splits["train"][:50], "test": test_tasks[:50] + splits["train"][:1]}
    report = audit_splits(spec, leaky)
    assert not report["ok"] and {"test/train/line", "test/train/answer", "test/train/query"} <= set(report["overlaps"])


# -- success check and policies -----------------------------------------------------------------------------------


def test_evaluate_on_hand_written_outcomes(spec, test_tasks):
    task = next(t for t in test_tasks if t.answer["n_satisfying"] > 1)
    target, constraints = task.answer["target"], task.answer["constraints"]
    other = next(p["id"] for p in cat.catalog() if p["id"] != target and cat.satisfies(p, constraints))
    wrong = next(p["id"] for p in cat.catalog() if not cat.satisfies(p, constraints))
    assert spec.evaluate(task, Outcome(final=[target], finished=True))["exact"] == 1.0
    assert spec.evaluate(task, Outcome(final=[other], finished=True)) == {
        "success": 1.0, "exact": 0.0, "answered": 1.0, "found_target": 0.0}
    assert spec.evaluate(task, Outcome(final=[wrong], finished=True))["success"] == 0.0
    assert spec.evaluate(task, Outcome())["answered"] == 0.0
    assert spec.score(task, Outcome(final=[other], finished=True)) == 1.0


def test_expert_reaches_asr_095_and_random_stays_near_zero(spec, test_tasks):
    assert _asr(spec, test_tasks, spec.expert) >= 0.95
    assert _asr(spec, test_tasks, spec.random_policy) <= 0.05


def test_get_reward_after_an_expert_episode(spec, test_tasks):
    env = spec.make_env()
    env.reset(task=test_tasks[3].to_json())
    gen, result = spec.expert(test_tasks[3]), None
    while not env.done:
        result = call_tool(env, gen.send(result) if result is not None else next(gen))
    assert env.get_reward() == 1.0 and env.outcome.seen


# -- tools and hostile inputs -------------------------------------------------------------------------------------


def test_tools_are_exactly_the_three_documented_methods(env):
    assert tool_names(env) == ["recommend", "search_products", "view_product"]
    for name in tool_names(env):
        assert "Args:" in getattr(env, name).__doc__ and "Returns:" in getattr(env, name).__doc__


def test_tool_schemas_render_for_trl(env):
    get_json_schema = pytest.importorskip("transformers.utils").get_json_schema
    schema = get_json_schema(env.search_products)["function"]
    assert schema["parameters"]["properties"]["max_price"]["type"] == "number"
    assert schema["parameters"]["required"] == ["query"]


@pytest.mark.parametrize("arguments", [
    {"query": 'hiking AND (jacket* OR "x") NEAR: -boots ^2 ~ {}[]'},
    {"query": "jacket", "max_price": "120"},
    {"query": "jacket", "max_price": "$1,200", "min_rating": "4.5"},
    {"query": "jacket", "max_price": None, "min_rating": None, "brand": None},
    {"query": "", "category": "Clothing", "colour": "Gray"},
    {"query": "jacket " * 2000},  # ~14 kB
])
def test_odd_but_valid_search_arguments_answer_within_bounds(env, arguments):
    result = call_tool(env, ToolCall("search_products", arguments))
    assert not result.startswith("Error") and len(result) < 2000
    assert len(result.splitlines()) <= 11


@pytest.mark.parametrize("arguments, fragment", [
    ({"query": ""}, "give a query"),
    ({"query": "?!*"}, "give a query"),
    ({"query": None}, "give a query"),
    ({"query": 123}, "must be a string"),
    ({"query": ["jacket"]}, "must be a string"),
    ({"query": "jacket", "brand": ["Northpeak"]}, "must be a string"),
    ({"query": "jacket", "max_price": "cheap"}, "must be a number"),
    ({"query": "jacket", "max_price": [10]}, "must be a number"),
    ({"query": "jacket", "max_price": True}, "must be a number"),
    ({"query": "jacket", "max_price": -5}, "between 0"),
    ({"query": "jacket", "max_price": math.nan}, "between 0"),
    ({"query": "jacket", "max_price": "inf"}, "between 0"),
    ({"query": "jacket", "min_rating": 7}, "between 0 and 5"),
    ({"query": "jacket", "category": "weapons"}, "unknown category"),
    ({"query": "jacket", "colour": "chartreuse"}, "unknown colour"),
    ({"query": "jacket", "brand": "Nortpeak"}, "did you mean one of: northpeak"),
    ({"query": "jacket", "brand": "x" * 10_000}, "unknown brand"),
    ({"query": "jacket", "sort": "price"}, "bad arguments"),
])
def test_bad_search_arguments_give_short_errors(env, arguments, fragment):
    result = call_tool(env, ToolCall("search_products", arguments))
    assert result.startswith("Error:") and fragment in result and len(result) < 400
    assert env.outcome.tool_errors == 1


@pytest.mark.parametrize("tool", ["view_product", "recommend"])
@pytest.mark.parametrize("product_id", ["P99999", "", None, 42, ["P00001"], "P0" * 5000, "'; DROP TABLE --"])
def test_bad_product_ids_give_short_errors(env, tool, product_id):
    result = call_tool(env, ToolCall(tool, {"product_id": product_id}))
    assert result.startswith("Error:") and len(result) < 200
    assert not env.done


def test_view_and_recommend_normalise_ids_and_record_seen(env):
    view = call_tool(env, ToolCall("view_product", {"product_id": " p00042 "}))
    assert view.startswith("P00042 |") and "rating:" in view and env.outcome.seen == ["P00042"]
    assert call_tool(env, ToolCall("recommend", {"product_id": "P00042"})).startswith("Recommended P00042")
    assert env.done and env.outcome.final == ["P00042"]


def test_calls_after_recommend_unknown_tools_and_private_methods_are_refused(env):
    call_tool(env, ToolCall("recommend", {"product_id": "P00001"}))
    for call in (ToolCall("search_products", {"query": "tent"}), ToolCall("recommend", {"product_id": "P00002"})):
        assert "episode is over" in call_tool(env, call)
    assert env.outcome.final == ["P00001"]
    for name in ("buy_product", "_lookup", "reset", "get_reward"):
        assert "unknown tool" in call_tool(env, ToolCall(name, {}))
    assert "arguments must be a JSON object" in call_tool(env, ToolCall("view_product", ["P00001"]))


def test_tools_before_reset_are_refused(spec):
    assert "not reset" in spec.make_env().search_products("tent")


def test_an_environment_fault_raises_infra_error(env, monkeypatch):
    def broken():
        raise OSError("catalog store unreachable")

    monkeypatch.setattr(pf, "index", broken)
    with pytest.raises(InfraError, match="unreachable"):
        call_tool(env, ToolCall("search_products", {"query": "tent"}))
    with pytest.raises(InfraError):
        call_tool(env, ToolCall("view_product", {"product_id": "P00001"}))
