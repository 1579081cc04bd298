"""``doc_search``: a retrieval subagent curates the documentation chunks that support a query's facts.

A published GRPO document-curation agent's harness, on Python's own documentation
(``agentlab.corpora.pydocs``): lexical tools only (``bm25_search``, ``grep_corpus``, ``read_document``), a curated
set that exists from the first turn (``curate``/``drop_curated``, capped at 30) and ``finish``. Reward is F-beta
with β = 4 (recall weighs 16× more than precision) and -0.2 when nothing was curated.

A task names one stdlib module (or one language-reference topic) and 1–3 facts, each given as the content words
of a docstring's first sentence (a keyword paraphrase, never the chunk's text); a fact's support is every chunk
whose text holds that sentence. Splits are assigned by a stable hash of the module/topic, so no module, answer
chunk or query text is shared between train, validation and test.

    >>> from agentlab.envs import load
    >>> spec = load("doc_search")                                           # doctest: +SKIP
    >>> task = spec.make_tasks("test", 1, seed=0)[0]                       # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache

from agentlab.corpora import pydocs
from agentlab.rewards import Reward
from agentlab.search import words
from agentlab.types import Budget, EnvSpec, InfraError, Outcome, Task, ToolCall, ToolEnv, seeded_rng, tool

try:  # `regex` (a transformers dependency) has a match timeout; stdlib `re` has none, see _compile
    import regex as _re
except ImportError:  # pragma: no cover - always installed with transformers
    import re as _re

MAX_CURATED, MAX_HITS, GREP_BUDGET_S, BETA = 30, 8, 0.5, 4.0
SPLITS = {"train": range(8), "validation": range(8, 9), "test": range(9, 10)}  # stable hash of the unit % 10
STOP = frozenset(re.findall(r"\w+", "a an and are as at be by for from if in into is it its of on or that the this to "
                            "was with which will can return returns given object objects value values none true "
                            "false self may"))
RANDOM_WORDS = ("file", "value", "list", "string", "error", "time", "data", "name", "type", "path", "line", "mode")
SYSTEM_PROMPT = (
    "You are a retrieval subagent. Your role is to find and curate the documentation chunks that support the "
    "facts in the user's query; you do not answer the query yourself. Search with bm25_search (keywords) and "
    "grep_corpus (a short regex), read promising chunks with read_document, add every supporting chunk id with "
    "curate (drop mistakes with drop_curated), then call finish. Missing a supporting chunk costs far more than "
    "curating an extra one.")


def _snippet(text: str, at: int, width: int = 160) -> str:
    start = max(0, at - 40)
    return ("…" if start else "") + " ".join(text[start:start + width].split())


def _norm(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def _parse_ids(doc_ids) -> list[str]:
    ids = [i.strip("'\"[](){}") for i in re.split(r"[\s,;]+", str(doc_ids)[:4000])]
    return list(dict.fromkeys(i for i in ids if i))[:50]


def _compile(pattern: str):
    # Counted repeats multiply compile time (`((a{99}){99}){99}` takes 0.5 s before any timeout applies).
    product = 1
    for lo, hi in re.findall(r"\{(\d+)(?:,(\d*))?\}", pattern):
        product *= max(int(lo), int(hi or 0), 1)
    if product > 1000:
        raise ValueError("counted repeats like {n} are limited to a product of 1000")
    # Without `regex` there is no match timeout: refuse the usual catastrophic shapes (quantified groups,
    # backreferences, many unbounded repeats). Best effort only; `regex` ships with transformers.
    risky = re.search(r"\)[*+?{]|\\\d", pattern) or len(re.findall(r"(?<!\\)[*+]", pattern)) > 2
    if _re.__name__ == "re" and risky:
        raise ValueError("quantified groups, backreferences and more than two * or + need the `regex` package")
    return _re.compile(pattern, _re.IGNORECASE | _re.MULTILINE)


class DocSearchEnv(ToolEnv):
    name = "doc_search"
    final_tool = "finish"
    system_prompt = SYSTEM_PROMPT

    def _start(self, task: Task) -> None:
        try:
            self._corpus = pydocs.load(task.meta.get("corpus", "default"))
        except Exception as exc:  # a cache we cannot build or read is the environment's fault
            raise InfraError(f"doc_search corpus unavailable: {exc}") from exc
        self._curated: list[str] = []

    def _status(self) -> str:
        return f"[seen {len(self._outcome.seen)} chunks, curated {len(self._curated)}/{MAX_CURATED}]"

    @tool
    def bm25_search(self, query: str) -> str:
        """Keyword (BM25) search over every documentation chunk.

        Args:
            query: Keywords, for example "serialize JSON string". Punctuation and operators are plain words.

        Returns:
            Up to 8 hits, one per line: chunk id | title | score | snippet; then the running count of chunks
            seen and curated so far.
        """
        if not isinstance(query, str) or not query.strip():
            return self._error("query must be a non-empty string, e.g. bm25_search(query='serialize JSON').")
        try:
            hits = self._corpus.index.search(query, k=MAX_HITS)
        except Exception as exc:
            raise InfraError(f"search index failed: {exc}") from exc
        if not hits:
            return f"No chunk matches {query[:60]!r}. {self._status()}"
        self._record([cid for cid, _ in hits])
        terms = words(query)[:8]
        lines = []
        for cid, score in hits:
            text = self._corpus.text(cid)
            at = min((m.start() for t in terms if (m := re.search(re.escape(t), text, re.IGNORECASE))), default=0)
            lines.append(f"{cid} | {self._corpus.title(cid)} | {score:.1f} | {_snippet(text, at)}")
        return "\n".join(lines + [self._status()])

    @tool
    def grep_corpus(self, pattern: str) -> str:
        """Scan every chunk with a short Python regular expression (case-insensitive, ^/$ match at lines).

        Args:
            pattern: A regex of at most 200 characters, for example "def dumps" or "JSON (encoder|decoder)".

        Returns:
            Up to 10 matching chunks, one per line: chunk id | title | snippet around the match; then the
            running counts. The scan stops after 0.5 s, so prefer specific patterns.
        """
        if not isinstance(pattern, str) or not pattern or len(pattern) > 200:
            return self._error("pattern must be a regex string of 1 to 200 characters, e.g. 'JSON formatted'.")
        try:
            compiled = _compile(pattern)
        except (_re.error, ValueError, OverflowError, RecursionError) as exc:  # bad syntax or our limits
            return self._error(f"invalid pattern {pattern[:60]!r}: {exc}")
        hits, complete = self._corpus.grep(compiled, max_hits=10, budget_s=GREP_BUDGET_S)
        note = "" if complete else " (scan stopped at the time limit; results may be incomplete)"
        if not hits:
            return f"No chunk matches {pattern[:60]!r}{note}. {self._status()}"
        ids = [self._corpus.ids[i] for i, _ in hits]
        self._record(ids)
        lines = [f"{cid} | {self._corpus.titles[i]} | {_snippet(self._corpus.texts[i], at)}"
                 for cid, (i, at) in zip(ids, hits)]
        return "\n".join(lines + [f"{self._status()}{note}"])

    @tool
    def read_document(self, doc_id: str) -> str:
        """Read the title and full text of one chunk you have already seen in a result list.

        Args:
            doc_id: A chunk id from an earlier result, for example "json.dumps#0".

        Returns:
            The chunk's id, title and text, and the ids of its neighbouring chunks in the same document.
        """
        cid = str(doc_id).strip().strip("'\"")[:300] if isinstance(doc_id, (str, int)) else ""
        if cid not in self._corpus.pos:
            return self._error(f"unknown chunk id {cid[:80]!r}; use an id from a search result.")
        if cid not in self._outcome.seen:
            return self._error(f"{cid!r} has not appeared in a result yet; search for it first.")
        stem, _, part = cid.rpartition("#")
        near = [n for n in (f"{stem}#{int(part) - 1}", f"{stem}#{int(part) + 1}") if n in self._corpus.pos]
        self._record(near)
        tail = f"\n[neighbouring chunks: {', '.join(near)}]" if near else ""
        return f"{cid} | {self._corpus.title(cid)}\n{self._corpus.text(cid)}{tail}"

    @tool
    def curate(self, doc_ids: str) -> str:
        """Add chunks to the curated result set (at most 30 chunks in all).

        Args:
            doc_ids: One or more chunk ids you have seen, separated by commas or spaces, e.g. "json.dumps#0, json.dump#0".

        Returns:
            What was added and what was skipped (unknown, not yet seen, or over the cap), with the running counts.
        """
        if not (ids := _parse_ids(doc_ids)):
            return self._error("doc_ids must list chunk ids, e.g. curate(doc_ids='json.dumps#0, json.dump#0').")
        added, skipped = [], []
        for cid in ids:
            if cid in self._curated:
                continue
            if cid not in self._corpus.pos or cid not in self._outcome.seen:
                skipped.append(f"{cid[:80]} ({'unknown' if cid not in self._corpus.pos else 'not seen yet'})")
            elif len(self._curated) >= MAX_CURATED:
                skipped.append(f"{cid} (the curated set is full: drop some first)")
            else:
                self._curated.append(cid)
                added.append(cid)
        self._outcome.final = list(self._curated)  # the set counts even if the episode never calls finish
        if not added and skipped:
            return self._error(f"nothing curated; skipped {', '.join(skipped[:5])}. {self._status()}")
        skip = f" Skipped: {', '.join(skipped[:5])}." if skipped else ""
        return f"Curated {len(added)}: {', '.join(added) or '-'}.{skip} {self._status()}"

    @tool
    def drop_curated(self, doc_ids: str) -> str:
        """Remove chunks from the curated result set.

        Args:
            doc_ids: Curated chunk ids separated by commas or spaces.

        Returns:
            What was removed, with the running counts.
        """
        drop = [cid for cid in _parse_ids(doc_ids) if cid in self._curated]
        if not drop:
            return self._error(f"none of those ids is curated. {self._status()}")
        self._curated = [c for c in self._curated if c not in drop]
        self._outcome.final = list(self._curated)
        return f"Dropped {len(drop)}: {', '.join(drop)}. {self._status()}"

    @tool
    def finish(self) -> str:
        """End the episode and hand the curated set back.

        Returns:
            A confirmation with the number of curated chunks; no further tool calls are possible.
        """
        self._outcome.final = list(self._curated)
        self._outcome.finished = True
        return f"Finished with {len(self._curated)} curated chunks."


# -- tasks ------------------------------------------------------------------------------------------------

def _split_of(unit: str) -> str:
    bucket = int(hashlib.sha256(unit.encode()).hexdigest()[:8], 16) % 10
    return next(name for name, r in SPLITS.items() if bucket in r)


def _keywords(sentence: str, limit: int = 8) -> list[str]:
    out = [w for w in dict.fromkeys(re.findall(r"[a-z][a-z0-9_]*", sentence.lower())) if w not in STOP and len(w) > 1]
    return out[:limit]


@lru_cache(maxsize=2)
def _candidates(corpus: str) -> dict[str, dict[str, list[tuple[int, str, str]]]]:
    """``{split: {unit: [(chunk index, kind, sentence), …]}}`` of the statements that can become facts."""
    c = pydocs.load(corpus)
    out: dict[str, dict[str, list]] = {name: {} for name in SPLITS}
    for i, kind, sentence in pydocs.statements(c):
        if len(_keywords(sentence)) >= 3:
            out[_split_of(c.units[i])].setdefault(c.units[i], []).append((i, kind, sentence))
    return out


@lru_cache(maxsize=50_000)
def _support(corpus: str, index: int, sentence: str) -> tuple[str, ...] | None:
    """Every chunk whose text holds ``sentence`` (found among the BM25 top 20), or None when the fact is unusable:
    supported across two modules/topics (it would leak between splits) or by more than 4 chunks (too generic)."""
    c = pydocs.load(corpus)
    needle = _norm(sentence)
    hits = {c.pos[cid] for cid, _ in c.index.search(sentence, k=20) if needle in _norm(c.texts[c.pos[cid]])}
    hits.add(index)
    # Optional rich sources (reST pages, man pages) may quote a docstring; they carry no split of their own.
    if len(hits) > 4 or any(c.units[h] != c.units[index] and c.sources[h] in ("stdlib", "topics") for h in hits):
        return None
    return tuple(c.ids[h] for h in sorted(hits))


def _question(unit: str, kinds: list[str], sentences: list[str]) -> str:
    where = (f'the Python language reference topic "{unit[6:]}"' if unit.startswith("topic:")
             else f"the Python standard library module `{unit}`")
    items = [f"{n}. a {kind} about: {', '.join(_keywords(s))}" for n, (kind, s) in enumerate(zip(kinds, sentences), 1)]
    return f"Find the documentation chunks of {where} that cover:\n" + "\n".join(items)


def make_tasks(split: str, n: int, seed: int = 0, facts: int | tuple[int, int] = (1, 3),
               corpus: str = "default") -> list[Task]:
    """``n`` distinct queries of 1–3 facts (``facts=2`` fixes the count) about modules/topics of ``split``."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {sorted(SPLITS)}")
    lo, hi = (facts, facts) if isinstance(facts, int) else facts
    if not 1 <= lo <= hi <= 3:
        raise ValueError(f"facts must be 1..3 or a (lo, hi) range inside it; got {facts!r}")
    units = _candidates(corpus)[split]
    names = sorted(units)
    rng = seeded_rng("doc_search-tasks", corpus, split, seed, lo, hi)
    tasks: dict[str, Task] = {}
    for _ in range(n * 50):
        if len(tasks) == n:
            break
        unit = rng.choice(names)  # uniform over modules/topics: tkinter alone would otherwise fill a split
        chosen, support = [], []
        for i, kind, sentence in rng.sample(units[unit], len(units[unit])):
            ids = _support(corpus, i, sentence)
            taken = {x for ids_ in support for x in ids_}
            if ids and not taken & set(ids) and _norm(sentence) not in {_norm(s) for _, s in chosen}:
                chosen.append((kind, sentence))
                support.append(list(ids))
            if len(chosen) == hi:
                break
        k = rng.randint(lo, hi)
        if len(chosen) < k:
            continue
        question = _question(unit, [k_ for k_, _ in chosen[:k]], [s for _, s in chosen[:k]])
        tid = f"doc_search-{split}-{hashlib.sha256(question.encode()).hexdigest()[:12]}"
        tasks.setdefault(question, Task(id=tid, env="doc_search", question=question,
                                        answer={"facts": support[:k]}, difficulty=k,
                                        meta={"corpus": corpus, "unit": unit,
                                              "statements": [s for _, s in chosen[:k]]}))
    if len(tasks) < n:
        raise ValueError(f"split {split!r} yielded only {len(tasks)} distinct tasks; asked for {n}")
    return list(tasks.values())


def evaluate(task: Task, outcome: Outcome) -> dict:
    """Fact recall, precision, F1/F4 and trajectory recall of the curated set.

    ``success`` = every fact covered *and* F4 ≥ 0.8, i.e. precision ≥ ~0.2: curating everything seen does not
    count as success, while a few extra chunks do (β = 4 weighs recall 16×). ``exact``: recall and precision 1.
    """
    facts = [set(f) for f in task.answer["facts"]]
    curated, seen = set(outcome.final), set(outcome.seen)
    relevant = set().union(*facts)
    recall = sum(bool(f & curated) for f in facts) / len(facts)
    precision = len(curated & relevant) / len(curated) if curated else 0.0

    def fbeta(beta: float) -> float:
        denom = beta * beta * precision + recall
        return (1 + beta * beta) * precision * recall / denom if denom else 0.0

    f4 = fbeta(BETA)
    return {"success": float(recall == 1.0 and f4 >= 0.8), "exact": float(recall == 1.0 and precision == 1.0),
            "recall": recall, "precision": precision, "f1": fbeta(1.0), "f4": f4,
            "trajectory_recall": sum(bool(f & seen) for f in facts) / len(facts),
            "curated": float(len(curated)), "finished": float(outcome.finished)}


def _ids_in(result: str) -> list[str]:
    return [line.split(" | ", 1)[0] for line in result.splitlines() if " | " in line]


def expert(task: Task):
    """Search each fact by its sentence (then grep its opening words), curate the supporting ids seen, finish."""
    for ids, sentence in zip(task.answer["facts"], task.meta["statements"]):
        found = set(_ids_in((yield ToolCall("bm25_search", {"query": sentence}))))
        if not found & set(ids):
            grep = r"\s+".join(re.escape(w) for w in sentence.split()[:6])
            found |= set(_ids_in((yield ToolCall("grep_corpus", {"pattern": grep[:200]}))))
        if hit := [i for i in ids if i in found]:
            yield ToolCall("curate", {"doc_ids": ", ".join(hit)})
    yield ToolCall("finish", {})


def noisy_expert(task: Task, drop: float = 0.3, extra: float = 0.4, give_up: float = 0.15, seed: int = 0):
    """The expert with a learner's mistakes, for reward-design lessons without a trained model (notebook 05):
    each supporting id is left out with probability ``drop`` (lower recall), a curate call adds 1-4 other ids
    seen so far with probability ``extra`` (lower precision), and with probability ``give_up`` nothing is
    curated at all (the empty set F-beta cannot tell from a wrong one). ``seed`` makes samples of a group
    differ; everything is reproducible from (task, seed)."""
    rng = seeded_rng("doc_search-noisy", task.id, seed)
    lazy = rng.random() < give_up
    seen: list[str] = []
    gen, result, started = expert(task), None, False
    while True:
        try:
            call = gen.send(result) if started else next(gen)
        except StopIteration:
            return
        started = True
        if call.name == "curate":
            ids = [i for i in _parse_ids(call.arguments["doc_ids"]) if rng.random() >= drop]
            if seen and rng.random() < extra:
                ids += rng.sample(seen, min(len(seen), rng.randint(1, 4)))
            if lazy or not ids:
                result = ""  # the expert ignores curate results
                continue
            call = ToolCall("curate", {"doc_ids": ", ".join(dict.fromkeys(ids))})
        result = yield call
        if call.name != "curate":
            seen += _ids_in(result)


def per_fact_top_hit(task: Task):
    """The cheap strategy (``EnvSpec.cheap_policy``: a calibration row, and the ``cheap:N`` regime's traces): it reads
    only the question — one ``bm25_search`` per numbered fact (the module's name and the fact's words), curate each
    search's first hit, finish. What lexical search alone gets, with no reading and nothing privileged."""
    unit = re.search(r"`([^`]+)`", task.question)
    for line in re.findall(r"^\d+\. (.*)$", task.question, re.MULTILINE):
        query = f"{unit.group(1) if unit else ''} {line.split(':', 1)[-1]}".strip()
        if ids := _ids_in((yield ToolCall("bm25_search", {"query": query}))):
            yield ToolCall("curate", {"doc_ids": ids[0]})
    yield ToolCall("finish", {})


def random_policy(task: Task):
    """A floor: search two random common words, curate three random hits, finish."""
    rng = seeded_rng("doc_search-random", task.id)
    ids = _ids_in((yield ToolCall("bm25_search", {"query": " ".join(rng.sample(RANDOM_WORDS, 2))})))
    yield ToolCall("curate", {"doc_ids": ", ".join(rng.sample(ids, min(3, len(ids))))})
    yield ToolCall("finish", {})


def audit_keys(task: Task) -> dict[str, list[str]]:
    ids = sorted({i for f in task.answer["facts"] for i in f})
    return {"line": [task.question + " => " + " ".join(ids)], "answer": ids, "query": [task.question]}


def hint(kind: str, task: Task, call: ToolCall, result: str) -> str:
    """Training-time feedback (``agentlab.hints``): procedural ``guidance``, or an enriched ``state`` observation
    (which listed or curated chunks support a fact the question asks about)."""
    ids = _ids_in(result) if call.name != "curate" else re.findall(r"[\w.]+#\d+", result.split("Skipped")[0])
    if call.name == "finish" or not ids:
        return ""
    if kind == "guidance":
        return "Hint: curate the chunk ids that state a fact the question asks about; finish once each fact has one."
    support = {i for f in task.answer["facts"] for i in f}
    good = [i for i in ids if i in support]
    return f"[state: chunks here that support a fact asked about: {', '.join(good) or 'none'}]"


# The write-up's reward: F4 of the curated set (recall counts 16x precision), and -0.2 for curating nothing, since
# an empty set and a wrong set both score F4 = 0 and GRPO needs them told apart.
DEFAULT_REWARD = Reward({"f4": 1.0, "empty": -0.2})


SPEC = EnvSpec(
    name="doc_search", env_class=DocSearchEnv, make_tasks=make_tasks, evaluate=evaluate,
    default_reward=DEFAULT_REWARD, answer_cap=MAX_CURATED, hint=hint,
    # the expert on 64 training tasks: 5 turns (max 7), 46 tokens a turn (max 139, a long curate), 2,287 tokens of
    # context (max 3,262 over a ~1,040-token prompt); room for a policy that reads one or two chunks more
    budget=Budget(max_turns=10, max_new_tokens=160, max_context=4096),
    valid_rollout=lambda outcome: bool(outcome.final),  # the write-up: at least one document curated
    expert=expert, random_policy=random_policy, audit_keys=audit_keys, cheap_policy=per_fact_top_hit,
    description="Curate the Python-documentation chunks that support 1-3 facts (F4 reward: recall weighs 16x precision).",
)
