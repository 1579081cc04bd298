"""doc_search: corpus build and cache, task splits, tools under hostile input, evaluate/reward, scripted policies."""

from __future__ import annotations

import sqlite3
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from agentlab.corpora import manpages, pydocs
from agentlab.envs import doc_search, load
from agentlab.synth import audit_splits
from agentlab.types import InfraError, Outcome, ToolCall, call_tool, run_policy, tool_names


@pytest.fixture(scope="session")
def spec():
    return load("doc_search")


@pytest.fixture(scope="session")
def corpus():
    return pydocs.load("default")


@pytest.fixture(scope="session")
def test_tasks(spec, corpus):
    return spec.make_tasks("test", 200, seed=0)


@pytest.fixture
def env(spec, test_tasks):
    e = spec.make_env()
    e.reset(task=test_tasks[0].to_json())
    return e


def call(env, name, **arguments):
    return call_tool(env, ToolCall(name, arguments))


def listed_ids(result: str) -> list[str]:
    return [line.split(" | ", 1)[0] for line in result.splitlines() if " | " in line]


# -- corpus ----------------------------------------------------------------------------------------------

def test_default_corpus_chunks(corpus):
    assert len(corpus) > 3000
    assert len(set(corpus.ids)) == len(corpus)
    assert {"stdlib", "topics"} <= set(corpus.sources)
    assert all(len(t.split()) <= pydocs.MAX_WORDS for t in corpus.texts)
    assert not any(c in cid for cid in corpus.ids for c in " ,;")  # curate() splits on these
    assert corpus.title("json.dumps#0") == "json.dumps (function)"
    assert "JSON formatted" in corpus.text("json.dumps#0")
    assert corpus.title("topic:assert#0").startswith('The "assert" statement')


def test_stdlib_is_parsed_not_imported(monkeypatch):
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    monkeypatch.setattr(pydocs, "stdlib_files", lambda: [("antigravity", stdlib / "antigravity.py"),
                                                         ("this", stdlib / "this.py")])
    sys.modules.pop("antigravity", None)
    chunks = pydocs.stdlib_chunks()
    assert "antigravity" not in sys.modules  # importing it would open a web browser
    assert any(c["id"] == "antigravity.geohash#0" for c in chunks)


def test_store_rebuilds_corrupt_partial_and_stale(tmp_path):
    builds = []

    def build():
        builds.append(1)
        return [{"id": "a#0", "title": "A", "text": "alpha", "unit": "a", "source": "stdlib"}]

    path = tmp_path / "chunks.sqlite"
    assert pydocs.open_store(path, "v1", build)[0][0] == "a#0"
    pydocs.open_store(path, "v1", build)
    assert len(builds) == 1  # warm: read, not rebuilt
    pydocs.open_store(path, "v2", build)
    assert len(builds) == 2  # stale fingerprint
    path.write_bytes(b"not a database" * 100)
    assert pydocs.open_store(path, "v2", build)[0][2] == "alpha"
    assert len(builds) == 3  # corrupt
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM chunks")
    pydocs.open_store(path, "v2", build)
    assert len(builds) == 4  # partial (row count disagrees with meta)
    assert not list(tmp_path.glob("chunks.sqlite.*"))  # no temporary files left behind


def test_split_words_and_first_sentence():
    pieces = pydocs.split_words(["a " * 200, "b " * 200, "c " * 700])
    assert [len(p.split()) for p in pieces] == [200, 200, 300, 300, 100]
    assert pydocs.first_sentence("Return the sum.  More text. Even more.") == "Return the sum."


def test_man_page_parser():
    page = ('.TH printf 3 2023-02-05 "Linux man-pages 6.03"\n.SH NAME\nprintf, sprintf \\- formatted output '
            'conversion\n.SH DESCRIPTION\nThe functions in the\n.BR printf ()\nfamily produce \\fBoutput\\fP.\n')
    name, sections = manpages.man_page_text(page)
    assert name == "printf, sprintf - formatted output conversion"
    assert sections == [("DESCRIPTION", "The functions in the\nprintf()\nfamily produce output.")]


@pytest.mark.skipif(not pydocs.RST_ROOT.is_dir(), reason="python3.11-doc not installed")
def test_rich_sources_listed_when_present():
    assert "rst" in pydocs.sources("rich")
    assert "rst" not in pydocs.sources("default")
    assert "rst" in pydocs.fingerprint("rich") and "rst" not in pydocs.fingerprint("default")


@pytest.mark.slow  # a cold rich build takes ~30 s on 2 cores
@pytest.mark.skipif(not pydocs.RST_ROOT.is_dir(), reason="python3.11-doc not installed")
def test_rich_corpus_tasks(spec):
    rich = pydocs.load("rich")
    assert {"stdlib", "topics", "rst"} <= set(rich.sources) and len(rich) > 2 * len(pydocs.load("default"))
    splits = {s: spec.make_tasks(s, 50, seed=0, corpus="rich") for s in doc_search.SPLITS}
    assert audit_splits(spec, splits)["ok"]
    scores = [spec.evaluate(t, run_policy(spec, t, spec.expert)[0])["success"] for t in splits["test"]]
    assert sum(scores) / len(scores) >= 0.95


# -- tasks -----------------------------------------------------------------------------------------------

def test_tasks_are_deterministic_and_splits_disjoint(spec, test_tasks):
    assert spec.make_tasks("test", 200, seed=0) == test_tasks
    assert spec.make_tasks("test", 20, seed=1) != test_tasks[:20]
    splits = {s: spec.make_tasks(s, 150, seed=0) for s in ("train", "validation")} | {"test": test_tasks}
    report = audit_splits(spec, splits)
    assert report["ok"], report["overlaps"]
    task = test_tasks[0]
    assert set(task.answer) == {"facts"} and 1 <= len(task.answer["facts"]) <= 3
    for sentence in (s for t in test_tasks for s in t.meta["statements"]):
        assert sentence not in task.question  # phrased by keywords, never quoting the chunk


def test_facts_knob(spec):
    assert {len(t.answer["facts"]) for t in spec.make_tasks("validation", 30, seed=0, facts=1)} == {1}
    assert {len(t.answer["facts"]) for t in spec.make_tasks("validation", 30, seed=0, facts=3)} == {3}
    assert {len(t.answer["facts"]) for t in spec.make_tasks("validation", 60, seed=0)} == {1, 2, 3}
    for bad in (0, 4, (2, 1)):
        with pytest.raises(ValueError):
            spec.make_tasks("test", 1, facts=bad)
    with pytest.raises(ValueError):
        spec.make_tasks("dev", 1)


# -- evaluate and reward ----------------------------------------------------------------------------------

def test_evaluate_and_reward_on_hand_written_outcomes(spec, test_tasks):
    task = next(t for t in test_tasks if len(t.answer["facts"]) == 2)
    a, b = (f[0] for f in task.answer["facts"])
    junk = [cid for cid in pydocs.load("default").ids[:40] if not any(cid in f for f in task.answer["facts"])]
    assert spec.score(task, Outcome()) == -0.2
    perfect = spec.evaluate(task, Outcome(final=[a, b], seen=[a, b], finished=True))
    assert perfect["success"] == perfect["exact"] == perfect["f4"] == 1.0
    quarter = spec.evaluate(task, Outcome(final=[a, b] + junk[:6]))
    assert quarter["precision"] == 0.25 and round(quarter["f4"], 2) == 0.85 and quarter["success"] == 1.0
    flood = spec.evaluate(task, Outcome(final=[a, b] + junk[:28]))
    assert flood["recall"] == 1.0 and flood["success"] == 0.0  # curating everything is not success
    half = spec.evaluate(task, Outcome(final=[a], seen=[a, b]))
    assert (half["recall"], half["precision"], half["trajectory_recall"], half["success"]) == (0.5, 1.0, 1.0, 0.0)
    assert spec.score(task, Outcome(final=junk[:3])) == 0.0


def test_expert_and_random_on_200_test_tasks(spec, test_tasks):
    t0 = time.perf_counter()
    expert = [spec.evaluate(t, run_policy(spec, t, spec.expert)[0])["success"] for t in test_tasks]
    rand = [spec.evaluate(t, run_policy(spec, t, spec.random_policy)[0])["success"] for t in test_tasks]
    assert sum(expert) / 200 >= 0.95
    assert sum(rand) / 200 <= 0.05
    assert time.perf_counter() - t0 < 20


def test_the_cheap_strategy_reads_nothing_but_the_question(spec, test_tasks):
    """The cheap policy, ``per_fact_top_hit`` (a calibration row and the ``cheap:N`` regime): the same calls with the answer and statements removed from the
    task, and lexical search alone solves some tasks but not all — between the random policy and the expert."""
    from dataclasses import replace

    policy = spec.cheap_policy
    for t in test_tasks[:10]:
        blind = replace(t, answer={"facts": []}, meta={})
        assert [c for c, _ in run_policy(spec, t, policy)[1]] == [c for c, _ in run_policy(spec, blind, policy)[1]]
    wins = [spec.evaluate(t, run_policy(spec, t, policy)[0])["success"] for t in test_tasks[:60]]
    assert 0.2 < sum(wins) / len(wins) < 0.95


# -- tools -----------------------------------------------------------------------------------------------

def test_tool_names_match_the_seed(env):
    assert tool_names(env) == ["bm25_search", "curate", "drop_curated", "finish", "grep_corpus", "read_document"]


def test_search_read_curate_drop_finish(env):
    result = call(env, "bm25_search", query="serialize obj JSON formatted str")
    ids = listed_ids(result)
    assert "json.dumps#0" in ids and 1 <= len(ids) <= 8
    assert result.splitlines()[-1] == f"[seen {len(ids)} chunks, curated 0/30]"
    assert set(ids) <= set(env.outcome.seen)
    assert call(env, "read_document", doc_id="json.dumps#0").startswith("json.dumps#0 | json.dumps (function)\n")
    grep = call(env, "grep_corpus", pattern=r"def loads\(")
    assert "json.loads#0" in listed_ids(grep)
    assert "Curated 2" in call(env, "curate", doc_ids="json.dumps#0, json.loads#0")
    assert env.outcome.final == ["json.dumps#0", "json.loads#0"]  # counts even without finish
    assert "Dropped 1" in call(env, "drop_curated", doc_ids="json.loads#0")
    assert env.outcome.final == ["json.dumps#0"]
    assert call(env, "finish") == "Finished with 1 curated chunks."
    assert env.done and env.outcome.final == ["json.dumps#0"]
    for name, args in [("bm25_search", {"query": "json"}), ("curate", {"doc_ids": "json.loads#0"}), ("finish", {})]:
        assert call(env, name, **args).startswith("Error: the episode is over")


def test_read_and_curate_need_seen_known_ids(env):
    assert "has not appeared" in call(env, "read_document", doc_id="json.dumps#0")
    assert "unknown chunk id" in call(env, "read_document", doc_id="no.such#9")
    assert call(env, "curate", doc_ids="json.dumps#0").startswith("Error: nothing curated")
    assert call(env, "curate", doc_ids="nope#1 , ").startswith("Error:")
    assert call(env, "drop_curated", doc_ids="json.dumps#0").startswith("Error:")
    assert env.outcome.final == []


def test_curated_set_is_capped(env, corpus):
    ids = corpus.ids[:40]
    env._record(ids)
    result = call(env, "curate", doc_ids=" ".join(ids))
    assert "Curated 30" in result and "the curated set is full" in result
    assert len(env.outcome.final) == doc_search.MAX_CURATED


@pytest.mark.parametrize("pattern", [r"(a+)+$", r"(.*a){20}", r"(\w+\s?)+!{3}", r"(.*,){12}X", r"([\s\S]*)*\0z"])
def test_regex_bombs_are_bounded(env, pattern):
    t0 = time.perf_counter()
    result = call(env, "grep_corpus", pattern=pattern)
    assert time.perf_counter() - t0 < 1.0
    assert not result.startswith("Error") or "invalid" in result


def test_catastrophic_backtracking_on_long_text():
    rows = [("x#0", "X", "a" * 20000 + "b", "x", "stdlib")]
    corpus = pydocs.Corpus("tiny", rows, index=None)
    t0 = time.perf_counter()
    hits, complete = corpus.grep(doc_search._compile(r"(a+)+$"), budget_s=0.3)
    assert time.perf_counter() - t0 < 1.0 and not complete and hits == []


def test_stdlib_re_fallback(env, monkeypatch):
    import re

    monkeypatch.setattr(doc_search, "_re", re)
    assert "json.loads#0" in listed_ids(call(env, "grep_corpus", pattern=r"def loads\("))
    for risky in [r"(a+)+$", r"(.*a){20}", r"a*b*c*d", r"(x)\1"]:
        assert call(env, "grep_corpus", pattern=risky).startswith("Error: invalid pattern")


@pytest.mark.parametrize("pattern", ["(", "[a-", "*a", "a{5000}", "((a{99}){99}){99}", "(?P<", "", "x" * 300])
def test_invalid_patterns_are_errors(env, pattern):
    t0 = time.perf_counter()
    assert call(env, "grep_corpus", pattern=pattern).startswith("Error:")
    assert time.perf_counter() - t0 < 1.0


@pytest.mark.parametrize("query", ['"json" AND dumps* NEAR/2 (loads) title:x ^2 -', "::", "\x00", "é" * 10,
                                   "json " * 2000])
def test_hostile_queries(env, query):
    result = call(env, "bm25_search", query=query)
    assert not result.startswith("Error") and len(result) < 4000


@pytest.mark.parametrize("name,args", [
    ("bm25_search", {"query": ""}), ("bm25_search", {"query": 3}), ("bm25_search", {"query": None}),
    ("bm25_search", {}), ("bm25_search", {"q": "json"}), ("grep_corpus", {"pattern": ["json"]}),
    ("read_document", {"doc_id": ""}), ("read_document", {"doc_id": {"a": 1}}), ("curate", {"doc_ids": ""}),
    ("curate", {"doc_ids": "x" * 10_000}), ("drop_curated", {"doc_ids": None}), ("finish", {"now": True}),
    ("delete_corpus", {}), ("_start", {}), ("reset", {}),
])
def test_bad_calls_are_error_strings(env, name, args):
    result = call(env, name, **args)
    assert result.startswith("Error:") and len(result) < 1000
    assert not env.done


def test_ten_kilobyte_arguments(env):
    for name, key in [("bm25_search", "query"), ("grep_corpus", "pattern"), ("read_document", "doc_id"),
                      ("curate", "doc_ids"), ("drop_curated", "doc_ids")]:
        assert len(call(env, name, **{key: "json.dumps#0 " * 800})) < 4000


def test_infra_fault_raises_infra_error(env, monkeypatch):
    def broken(*a, **k):
        raise OSError("index files vanished")

    monkeypatch.setattr(env._corpus.index, "search", broken)
    with pytest.raises(InfraError):
        call(env, "bm25_search", query="json")


def test_unbuildable_corpus_is_infra_error(spec, test_tasks, monkeypatch):
    def broken(name):
        raise PermissionError("cache dir is read-only")

    monkeypatch.setattr(pydocs, "load", broken)
    with pytest.raises(InfraError):
        spec.make_env().reset(task=test_tasks[0].to_json())


def test_valid_rollout_and_checkpoint_metrics_as_the_write_up_defines_them(spec, test_tasks):
    """A valid doc_search rollout curated at least one chunk (finishing is not enough), and an evaluation
    summary carries precision, recall, F1, F4 and the curated-set size per checkpoint."""
    from agentlab.evals import summarize
    from agentlab.reward_design import scripted_episode

    assert not spec.is_valid(Outcome(finished=True)) and spec.is_valid(Outcome(final=["x"]))
    assert load("lookup").is_valid(Outcome(finished=True)) and not load("lookup").is_valid(Outcome(final=["x"]))
    eps = [scripted_episode(spec, t, p) for t in test_tasks[:6] for p in (spec.expert, spec.random_policy)]
    metrics = summarize(eps)["env_metrics"]
    assert {"precision", "recall", "f1", "f4", "curated"} <= set(metrics)
    expected = sum(ep.metrics["f4"] for ep in eps) / len(eps)
    assert metrics["f4"]["mean"] == pytest.approx(expected) and metrics["f4"]["n"] == len(eps)
