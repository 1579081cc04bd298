"""``code_search``: find the standard-library function, method or class a question describes.

The seed's agentic-RAG task on an offline corpus: the public definitions of this Python's standard library
(:mod:`agentlab.corpora.stdlib_code`). Questions paraphrase docstrings with the definition's name masked out;
the agent searches (BM25, :class:`agentlab.search.SearchIndex`), reads candidates and answers with qualified
names such as ``json.decoder.JSONDecoder.decode``. Knobs: ``n_functions`` (1–3 definitions per question, the
answer is all of them) and ``distractors`` (prefer definitions whose BM25 neighbours score close to them).

    >>> from agentlab.envs import load
    >>> from agentlab.types import run_policy
    >>> spec = load("code_search")
    >>> task = spec.make_tasks("test", 1, seed=0)[0]
    >>> outcome, calls = run_policy(spec, task, spec.expert)
    >>> spec.evaluate(task, outcome)["success"]
    1.0
"""

from __future__ import annotations

import hashlib
import platform
import re
import sqlite3
from collections import Counter
from functools import lru_cache
from pathlib import Path

from agentlab.corpora import stdlib_code
from agentlab.corpora.stdlib_code import docstring_clue, leaks_name, mask_names, summary
from agentlab.paths import cache_dir
from agentlab.rewards import Reward
from agentlab.search import SearchIndex, words
from agentlab.types import Budget, EnvSpec, InfraError, Outcome, Task, ToolCall, ToolEnv, seeded_rng, tool

INDEX_VERSION = 1
READ_BUDGET = 1_500
MAX_ANSWER_NAMES = 10
MAX_NAME_CHARS = 300
# Splits by a stable hash of the answer's qualified name, so no definition is the answer in two splits.
SPLIT_PERCENT = {"train": (0, 70), "validation": (70, 80), "test": (80, 100)}
SYSTEM_PROMPT = (
    "You answer questions about the Python standard library's source code. Use `search_repo` with keywords "
    "from the question, `read_repo` to check a candidate's definition, then call `return_answer` with the "
    "qualified name(s) of the definition(s) the question describes, e.g. json.decoder.JSONDecoder.decode."
)
TEMPLATES = (
    'In the Python standard library, which {kind} is described as follows: "{clue}"',
    'Find the {kind} in the Python standard library whose documentation says: "{clue}"',
    'I need the standard-library {kind} that does this: "{clue}" What is its qualified name?',
)
MULTI = "Which definitions of the Python standard library are described below? Name all of them.\n{items}"


class _Store:
    """Texts in SQLite (primary-key reads, ~10k rows), search in tantivy.

    Why SQLite and not a dict in memory: TRL builds one environment per rollout slot; a read-only file is
    shared by all of them, costs no memory per process, and a missing file is a clean infra fault. A
    connection is opened per call (tens of microseconds) so a vanished file is noticed at once.
    """

    def __init__(self, db_path: Path, index: SearchIndex | None):
        self.db_path, self.index = Path(db_path), index

    def rows(self, sql: str, args: tuple = ()) -> list[tuple]:
        try:
            with sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True) as db:
                return db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise InfraError(f"code_search corpus unavailable at {self.db_path}: {exc}") from exc

    def search(self, text: str, k: int = 10) -> list[tuple[str, float]]:
        try:
            return self.index.search(text, k=k)
        except Exception as exc:  # agent text cannot break the query (search.py), so any failure is ours
            raise InfraError(f"code_search index unavailable: {exc}") from exc


@lru_cache(maxsize=4)
def _open_store(root: str) -> _Store:
    db_path = stdlib_code.ensure_corpus(Path(root) / "code_search" / "corpus.sqlite")
    db = stdlib_code.open_corpus(db_path)
    docs = ({"id": r["name"], "title": r["name"], "body": r["signature"] + "\n" + r["doc"]}
            for r in stdlib_code.iter_defs(db))
    index = SearchIndex.open_or_build(Path(root) / "code_search" / "index",
                                      f"{stdlib_code.fingerprint()} index v{INDEX_VERSION}", lambda: docs)
    db.close()
    return _Store(db_path, index)


def _store() -> _Store:
    return _open_store(str(cache_dir()))


def _names(text: str) -> list[str]:
    """Qualified names in an answer, lenient on formatting: `json.dumps()`, 'a.b, c.d' → [json.dumps, …]."""
    out = []
    for token in re.split(r"[\s,;]+", text):
        name = token.strip("`'\"*[]").split("(")[0].rstrip(".:")
        if name and name not in out:
            out.append(name)
    return out


class CodeSearchEnv(ToolEnv):
    name = "code_search"
    final_tool = "return_answer"
    system_prompt = SYSTEM_PROMPT

    @tool
    def search_repo(self, keywords: str) -> str:
        """Search the standard library's functions, methods and classes by keywords (BM25).

        Args:
            keywords: Words describing what the code does or what it is called, for example
                "parse json document into python object". Names are split into words, so "readline" and
                "read line" both match.

        Returns:
            Up to 10 hits, best first, one per line: qualified name, kind and a one-line summary.

        Example:
            search_repo(keywords="decode json document") ->
            "json.decoder.JSONDecoder.decode (method) — Return the Python representation of ``s`` …"
        """
        if not isinstance(keywords, str) or not words(keywords[:2000]):
            return self._error("keywords must be a non-empty string of words, "
                               "e.g. search_repo(keywords='json decode').")
        store = _store()
        hits = [name for name, _ in store.search(keywords)]
        if not hits:
            return "No definitions match those keywords; try other words."
        sql = f"SELECT name, kind, signature, doc FROM defs WHERE name IN ({', '.join('?' * len(hits))})"
        rows = {r[0]: r for r in store.rows(sql, tuple(hits))}
        self._record(hits)
        return "\n".join(f"{n} ({rows[n][1]}) — {summary(rows[n][3], rows[n][2])}" for n in hits if n in rows)

    @tool
    def read_repo(self, name: str) -> str:
        """Read one definition in full: where it is, its signature, docstring and source code.

        Args:
            name: The qualified name exactly as search_repo shows it, for example
                "json.decoder.JSONDecoder.decode".

        Returns:
            A header (name, kind, file and line) and the source; long definitions end with "[truncated]".

        Example:
            read_repo(name="json.dumps") ->
            "json.dumps (function) — json/__init__.py, line 183\\ndef dumps(obj, *, skipkeys=False, …"
        """
        if not isinstance(name, str) or not name.strip():
            return self._error("name must be a qualified name string, e.g. read_repo(name='json.dumps').")
        wanted = (_names(name[:MAX_NAME_CHARS]) or [""])[0]
        found = _store().rows("SELECT kind, file, line, source FROM defs WHERE name = ?", (wanted,))
        if len(name) > MAX_NAME_CHARS or not found:
            return self._error(f"no definition named {name[:80]!r}; "
                               "use a qualified name from search_repo's results.")
        kind, file, line, source = found[0]
        self._record([wanted])
        text = f"{wanted} ({kind}) — {file}, line {line}\n{source}"
        return text if len(text) <= READ_BUDGET else text[:READ_BUDGET] + "\n[truncated]"

    @tool
    def return_answer(self, answer: str) -> str:
        """Give the final answer and end the episode.

        Args:
            answer: The qualified name of the definition the question asks for; when it asks for several, all
                of them separated by commas, for example "json.dumps, json.loads".

        Returns:
            A confirmation; no further tool calls are possible.
        """
        if not isinstance(answer, str) or not _names(answer[:5000]):
            return self._error("answer must name at least one qualified name, "
                               "e.g. return_answer(answer='json.dumps').")
        names = _names(answer[:5000])
        if len(names) > MAX_ANSWER_NAMES:
            return self._error(f"name at most {MAX_ANSWER_NAMES} definitions; got {len(names)}.")
        self._outcome.final = names
        self._outcome.finished = True
        return f"Answer recorded: {', '.join(names)}."


# -- tasks ---------------------------------------------------------------------------------------------------

def _split_of(name: str) -> str:
    bucket = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) % 100
    return next(s for s, (lo, hi) in SPLIT_PERCENT.items() if lo <= bucket < hi)


@lru_cache(maxsize=4)
def _candidates(root: str) -> dict[str, tuple[tuple[str, str, str], ...]]:
    """Per split: ``(name, kind, clue)`` of every definition a question can be written from, sorted by name.

    A docstring (or masked clue) shared by several definitions (inherited copies, twins like posixpath and
    ntpath) is dropped for all of them, so each question has exactly one answer.
    """
    rows = _open_store(root).rows("SELECT name, kind, doc FROM defs WHERE doc != '' ORDER BY name")
    paras = Counter(" ".join(doc.split("\n\n")[0].split()).lower() for _, _, doc in rows)
    clued = [(n, k, docstring_clue(d, n)) for n, k, d in rows
             if paras[" ".join(d.split("\n\n")[0].split()).lower()] == 1]
    clue_counts = Counter(c.lower() for _, _, c in clued if c)
    out: dict[str, list] = {s: [] for s in SPLIT_PERCENT}
    for n, k, c in clued:
        if c and clue_counts[c.lower()] == 1:
            out[_split_of(n)].append((n, k, c))
    return {s: tuple(v) for s, v in out.items()}


def _closeness(store: _Store, name: str, clue: str) -> float:
    """Best other BM25 score / the answer's, the clue as query (2.0: the answer is not in the top 10)."""
    hits = dict(store.search(clue))
    others = [s for n, s in hits.items() if n != name]
    return (max(others, default=0.0) / hits[name]) if name in hits else 2.0


def make_tasks(split: str, n: int, seed: int = 0, n_functions: int = 1,
               distractors: bool = False) -> list[Task]:
    """``n`` questions from ``split``; the same arguments give the same tasks (on the same Python version).

    ``n_functions`` (1–3): definitions per question, preferably from one module. ``distractors``: draw 4n
    candidates and keep the n whose nearest BM25 neighbour scores closest to them.
    """
    if split not in SPLIT_PERCENT:
        raise ValueError(f"unknown split {split!r}; expected one of {sorted(SPLIT_PERCENT)}")
    if n_functions not in (1, 2, 3):
        raise ValueError(f"n_functions must be 1, 2 or 3; got {n_functions!r}")
    pool = _candidates(str(cache_dir()))[split]
    if n > len(pool):
        raise ValueError(f"split {split!r} has only {len(pool)} candidate definitions; asked for {n}")
    rng = seeded_rng("code_search-tasks", split, seed, n_functions, distractors)
    order = rng.sample(pool, len(pool))
    if distractors:
        store = _store()
        order[:4 * n] = sorted(order[:4 * n], key=lambda c: (-_closeness(store, c[0], c[2]), c[0]))
    by_package: dict[str, list] = {}
    for cand in pool:
        by_package.setdefault(cand[0].split(".")[0], []).append(cand)
    tasks = []
    for first in order:
        group = [first]
        for source in (by_package[first[0].split(".")[0]], pool) if n_functions > 1 else ():
            others = [c for c in source if c not in group]
            while len(group) < n_functions and others:
                group.append(others.pop(rng.randrange(len(others))))
        names = [c[0] for c in group]
        clues = [mask_names(c[2], names)[0] for c in group]
        if n_functions == 1:
            question = rng.choice(TEMPLATES).format(kind=first[1], clue=clues[0])
        else:
            items = [f"{i}. A {c[1]}: {clue}" for i, (c, clue) in enumerate(zip(group, clues), 1)]
            question = MULTI.format(items="\n".join(items))
        if leaks_name(question, names):  # a template word can be a name ("Name all …" for a method `name`)
            continue
        tasks.append(Task(id=f"code_search-{split}-{'+'.join(names)}", env="code_search", question=question,
                          answer={"names": names}, difficulty=n_functions + int(distractors),
                          meta={"clues": clues, "python": platform.python_version()}))
        if len(tasks) == n:
            break
    return tasks


# -- verifier, reward, policies ------------------------------------------------------------------------------

def evaluate(task: Task, outcome: Outcome) -> dict:
    """Success: the answer names exactly the definitions the question asks for (names compared exactly,
    formatting stripped). Over-answering fails, as the seed's LLM judge failed an answer that differed from the
    reference: with up to 10 names allowed and 10 hits a search, "every reference name is in the answer" paid a
    policy that lists every hit. ``covered`` keeps that weaker check (every reference name is in the answer)."""
    ref, given = set(task.answer["names"]), set(outcome.final)
    hit = len(ref & given)
    return {"success": float(ref == given), "exact": float(ref == given), "covered": float(ref <= given),
            "recall": hit / len(ref),
            "precision": hit / len(given) if given else 0.0, "answered": float(bool(given)),
            "found": len(ref & set(outcome.seen)) / len(ref)}


def expert(task: Task):
    """Search each clue (then the name, if needed), read the definition, answer what was found."""
    found: list[str] = []
    first_hits: list[str] = []
    for name, clue in zip(task.answer["names"], task.meta["clues"]):
        for keywords in (clue, name):
            result = yield ToolCall("search_repo", {"keywords": keywords})
            hits = [line.split(" ", 1)[0] for line in result.splitlines()]
            first_hits = first_hits or hits
            if name in hits:
                yield ToolCall("read_repo", {"name": name})
                found.append(name)
                break
    yield ToolCall("return_answer", {"answer": ", ".join(found or first_hits[:1] or ["nothing"])})


def question_first_hit(task: Task):
    """A calibration strategy: search the question's own words once and answer the first hit, never reading a
    definition. It sees only what a policy sees; where a trained policy stands against it says what its reading and
    choosing among the hits is worth."""
    result = yield ToolCall("search_repo", {"keywords": task.question})
    hits = [line.split(" ", 1)[0] for line in result.splitlines()]
    yield ToolCall("return_answer", {"answer": hits[0] if hits else "nothing"})


RANDOM_WORDS = ("file", "list", "read", "write", "time", "data", "name", "value", "path", "line", "string",
                "object", "error", "set", "get", "open", "close", "return", "start", "stop", "text", "number")


def random_policy(task: Task):
    rng = seeded_rng("code_search-random", task.id)
    result = yield ToolCall("search_repo", {"keywords": " ".join(rng.sample(RANDOM_WORDS, 2))})
    hits = [line.split(" ", 1)[0] for line in result.splitlines()] or ["os.path.join"]
    yield ToolCall("return_answer", {"answer": rng.choice(hits)})


def audit_keys(task: Task) -> dict[str, list[str]]:
    names = task.answer["names"]
    return {"line": [task.question + " => " + ", ".join(names)], "answer": names, "query": [task.question]}


def hint(kind: str, task: Task, call: ToolCall, result: str) -> str:
    """Training-time feedback (``agentlab.hints``): procedural ``guidance``, or an enriched ``state`` observation
    (where the definitions asked for stand among the hits, or whether the one read is one of them)."""
    names = task.answer["names"]
    if call.name not in ("search_repo", "read_repo") or result.startswith("Error:"):
        return ""
    if kind == "guidance":
        return ("Hint: read_repo the candidate whose summary matches the description, then return_answer with "
                "exactly the name(s) the question asks for, nothing more.")
    hits = [line.split(" ", 1)[0] for line in result.splitlines()]
    if call.name == "read_repo":
        return f"[state: this is {'' if hits[:1] and hits[0] in names else 'not '}a definition the question asks for]"
    ranks = [f"{n} at rank {hits.index(n) + 1}" for n in names if n in hits]
    return f"[state: asked-for definitions in these hits: {', '.join(ranks) or 'none - search with other words'}]"


# Success is the exact set, so listing every search hit fails; precision adds a partial credit that still ranks
# the exact set first and a padded answer above a wrong one.
DEFAULT_REWARD = Reward({"success": 1.0, "precision": 0.5})


SPEC = EnvSpec(
    name="code_search", env_class=CodeSearchEnv, make_tasks=make_tasks, evaluate=evaluate,
    default_reward=DEFAULT_REWARD, answer_cap=MAX_ANSWER_NAMES, hint=hint,
    # the expert on 64 training tasks: 3 turns (max 4), 42 tokens a turn (max 93), 1,332 tokens of context
    # (max 1,792 over a ~750-token prompt); room for a policy that reads another candidate or two
    budget=Budget(max_turns=6, max_new_tokens=128, max_context=3072),
    expert=expert, random_policy=random_policy, audit_keys=audit_keys,
    strategies={"question_first_hit": question_first_hit},
    description="Python stdlib source: search and read definitions, answer the qualified names a question "
                "describes.",
)
