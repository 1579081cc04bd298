"""Latency of the search tools per call (p50/p99), with a SQLite FTS5 baseline over the same chunks.

    python benchmarks/search_latency.py                      # default + rich corpus (if installed), 1000 queries
    python benchmarks/search_latency.py --cold --synthetic 50000

Times whole tool calls through ``agentlab.types.call_tool`` (argument checks, search, snippets, formatting),
as the agent sees them. Queries come from task questions (one query per fact line, as an agent would phrase
it). The issue's target is p50 ≤ 1 ms and p99 ≤ 5 ms at ≥ 50k chunks; the real corpora are smaller, so
``--synthetic N`` also times the bare index on the rich (or default) chunks repeated up to N, labelled as such.
Prints a table and writes ``benchmarks/results/search_latency.json``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentlab.corpora import manpages, pydocs
from agentlab.envs import load
from agentlab.search import SearchIndex, index_text, words
from agentlab.types import ToolCall, call_tool, seeded_rng


def percentiles(times_s: list[float]) -> dict:
    ms = sorted(t * 1000 for t in times_s)
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 3),
            "p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 3), "max_ms": round(ms[-1], 3)}


def queries_from_tasks(n: int, corpus: str) -> list[str]:
    spec = load("doc_search")
    tasks = spec.make_tasks("train", n, seed=0, corpus=corpus)
    out = []
    for task in tasks:
        where = task.meta["unit"].removeprefix("topic:")
        out += [f"{where} {line.replace(',', '')}" for line in re.findall(r"about: (.*)", task.question)]
    return out[: max(n, 1000)]


def time_calls(env, calls: list[ToolCall], reset_every: int = 20, task_json: str | None = None) -> list[float]:
    times = []
    for n, call in enumerate(calls):
        if task_json and n % reset_every == 0:  # keep episodes episode-sized (the seen list grows per call)
            env.reset(task=task_json)
        t0 = time.perf_counter()
        call_tool(env, call)
        times.append(time.perf_counter() - t0)
    return times


def fts5_baseline(corpus, queries: list[str], tmp: str) -> dict:
    db = sqlite3.connect(f"{tmp}/fts.sqlite")
    t0 = time.perf_counter()
    db.execute("CREATE VIRTUAL TABLE chunks USING fts5(id UNINDEXED, title, body)")
    db.executemany("INSERT INTO chunks VALUES (?, ?, ?)", ((i, index_text(t), index_text(x)) for i, t, x in
                                                          zip(corpus.ids, corpus.titles, corpus.texts)))
    db.commit()
    build_s = time.perf_counter() - t0
    times, overlap = [], []
    for q in queries:
        # Every word quoted: FTS5 operators in agent text become plain terms, as in SearchIndex.search.
        match = " OR ".join(f'"{w}"' for w in words(q)[:32])
        t0 = time.perf_counter()
        ids = [r[0] for r in db.execute("SELECT id FROM chunks WHERE chunks MATCH ? ORDER BY "
                                        "bm25(chunks, 0.0, 2.0, 1.0) LIMIT 10", (match,))]
        times.append(time.perf_counter() - t0)
        ref = {cid for cid, _ in corpus.index.search(q, k=10)}
        overlap.append(len(ref & set(ids)) / max(1, len(ref)))
    db.close()
    return {**percentiles(times), "build_s": round(build_s, 2), "top10_overlap_with_tantivy": round(
        statistics.mean(overlap), 3)}


def bench_doc_search(name: str, n_queries: int, cold: bool) -> dict:
    row: dict = {"corpus": name}
    if cold:
        with tempfile.TemporaryDirectory() as root:
            t0 = time.perf_counter()
            pydocs.build(name, root=Path(root))
            row["build_cold_s"] = round(time.perf_counter() - t0, 2)
    pydocs.load.cache_clear()
    t0 = time.perf_counter()
    corpus = pydocs.load(name)  # the real cache (built here if missing)
    row["build_warm_s"] = round(time.perf_counter() - t0, 2)
    row["chunks"] = len(corpus)
    row["sources"] = {s: corpus.sources.count(s) for s in sorted(set(corpus.sources))}
    spec = load("doc_search")
    task = spec.make_tasks("test", 1, seed=0, corpus=name)[0]
    queries = queries_from_tasks(n_queries, name)
    rng = seeded_rng("bench", name)
    env = spec.make_env()
    row["bm25_search"] = percentiles(time_calls(
        env, [ToolCall("bm25_search", {"query": q}) for q in queries], task_json=task.to_json()))
    # grep: the longest word of each query as a literal, as an agent greps for a distinctive term
    pats = [max(words(q), key=len) for q in queries]
    row["grep_corpus"] = percentiles(time_calls(
        env, [ToolCall("grep_corpus", {"pattern": p}) for p in pats], task_json=task.to_json()))
    env.reset(task=task.to_json())
    ids = rng.sample(corpus.ids, min(len(queries), len(corpus)))
    env._record(ids)
    row["read_document"] = percentiles(time_calls(env, [ToolCall("read_document", {"doc_id": i}) for i in ids]))
    with tempfile.TemporaryDirectory() as tmp:
        row["fts5_baseline"] = fts5_baseline(corpus, queries, tmp)
    return row


def bench_synthetic(min_chunks: int, n_queries: int) -> dict:
    """The bare tantivy index (no tool formatting) on real chunks repeated until ``min_chunks``."""
    name = "rich" if pydocs.RST_ROOT.is_dir() else "default"
    corpus = pydocs.load(name)
    copies = -(-min_chunks // len(corpus))
    docs = ({"id": f"{cid}~{k}", "title": t, "body": x} for k in range(copies)
            for cid, t, x in zip(corpus.ids, corpus.titles, corpus.texts))
    queries = queries_from_tasks(n_queries, name)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        index = SearchIndex.build(Path(tmp) / "index", docs, fingerprint="synthetic")
        build_s = time.perf_counter() - t0
        times = []
        for q in queries:
            t0 = time.perf_counter()
            index.search(q, k=8)
            times.append(time.perf_counter() - t0)
    return {"corpus": f"{name} x{copies} (synthetic: repeated chunks)", "chunks": len(index),
            "index_build_s": round(build_s, 2), "index.search": percentiles(times)}


def bench_other_env(env_name: str, n_queries: int) -> dict:
    """Search-like tools of another environment, called with text from its task questions."""
    spec = load(env_name)
    tasks = spec.make_tasks("train", min(n_queries, 200), seed=0)
    env = spec.make_env()
    out = {}
    tools = [n for n in dir(spec.env_class) if not n.startswith("_") and ("search" in n or "grep" in n)]
    for tool in tools:
        sig = inspect.signature(getattr(spec.env_class, tool)).parameters.values()
        params = [p.name for p in sig if p.name != "self" and p.default is inspect.Parameter.empty]
        if len(params) != 1:  # one required text argument (optional filters keep their defaults)
            continue
        times = []
        for n in range(n_queries):
            task = tasks[n % len(tasks)]
            if n % 20 == 0:
                env.reset(task=task.to_json())
            if "grep" in tool:
                arg = max(re.findall(r"\w+", task.question), key=len, default="x")
            else:
                arg = " ".join(task.question.split()[:12])
            t0 = time.perf_counter()
            call_tool(env, ToolCall(tool, {params[0]: arg}))
            times.append(time.perf_counter() - t0)
        out[tool] = percentiles(times)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--corpora", default="default,rich")
    ap.add_argument("--cold", action="store_true", help="also time a cold build into a temporary cache")
    ap.add_argument("--synthetic", type=int, default=0, help="also time the index at ≥ N repeated chunks")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "search_latency.json"))
    args = ap.parse_args()

    results = {"config": vars(args), "python": sys.version.split()[0], "doc_search": [], "other_envs": {}}
    for name in args.corpora.split(","):
        if name == "rich" and not (pydocs.RST_ROOT.is_dir() or manpages.available()):
            continue
        results["doc_search"].append(bench_doc_search(name, args.queries, args.cold))
    if args.synthetic:
        results["synthetic"] = bench_synthetic(args.synthetic, args.queries)
    for env_name in ("code_search", "product_finder"):
        try:
            results["other_envs"][env_name] = bench_other_env(env_name, args.queries)
        except Exception as exc:  # noqa: BLE001 - other envs are optional here and may be mid-edit
            results["other_envs"][env_name] = {"error": f"{type(exc).__name__}: {exc}"[:200]}

    print(f"{'corpus':<44} {'chunks':>7} {'tool':<16} {'p50 ms':>8} {'p99 ms':>8}")
    for row in results["doc_search"]:
        for tool in ("bm25_search", "grep_corpus", "read_document", "fts5_baseline"):
            r = row[tool]
            print(f"{row['corpus']:<44} {row['chunks']:>7} {tool:<16} {r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f}")
    if syn := results.get("synthetic"):
        r = syn["index.search"]
        print(f"{syn['corpus']:<44} {syn['chunks']:>7} {'index.search':<16} {r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f}")
    for env_name, tools in results["other_envs"].items():
        for tool, r in tools.items():
            if tool == "error":
                print(f"{env_name:<44} {'':>7} (not measured: {r})")
            else:
                print(f"{env_name:<44} {'':>7} {tool:<16} {r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
