"""Python documentation as a chunked search corpus, built from what the machine already has (no network).

``default`` works on every Python install (macOS too): docstrings of the public standard library, read with
``ast`` from ``sysconfig.get_paths()['stdlib']`` (nothing is imported), plus the language-reference topics of
``pydoc_data/topics.py``. ``rich`` adds whatever optional sources exist: Debian's ``python3.11-doc`` reST sources
and the Linux man-pages (``manpages``/``manpages-dev``). Chunks are ≤ ~300 words with stable ids
(``json.dumps#0``, ``topic:assert#1``, ``rst:library/json#4``, ``man:printf.3#2``), a title and text.

The chunk store (SQLite) and the tantivy index are cached under ``cache_dir()/doc_search/<corpus>/`` and keyed by
a fingerprint of Python version, builder version and the sources' files; a stale or corrupt cache is rebuilt.

    >>> corpus = load("default")                                # doctest: +SKIP
    >>> corpus.title("json.dumps#0")                            # doctest: +SKIP
    'json.dumps (function)'
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import sqlite3
import sys
import sysconfig
import tempfile
import time
from bisect import bisect_right
from functools import lru_cache
from pathlib import Path

from agentlab.corpora import manpages
from agentlab.paths import cache_dir
from agentlab.search import SearchIndex

BUILDER_VERSION = 2
MAX_WORDS = 300
CORPORA = ("default", "rich")
RST_ROOT = Path("/usr/share/doc/python3.11/html/_sources")
_SKIP_DIRS = {"site-packages", "test", "tests", "idle_test", "__pycache__"}
_ROLE = re.compile(r":[a-z:]+:`~?!?([^`<]*?)(?:\s*<[^>]*>)?`")  # :func:`json.dumps` -> json.dumps


# -- chunking ---------------------------------------------------------------------------------------------

def split_words(paragraphs: list[str], limit: int = MAX_WORDS) -> list[str]:
    """Greedily pack paragraphs into pieces of ≤ ``limit`` words; an over-long paragraph is cut by words.

    >>> [len(p.split()) for p in split_words(["a " * 200, "b " * 200, "c " * 700])]
    [200, 200, 300, 300, 100]
    """
    pieces, cur, n = [], [], 0
    for para in paragraphs:
        words = para.split()
        if not words:
            continue
        if n and n + len(words) > limit:
            pieces.append("\n\n".join(cur))
            cur, n = [], 0
        while len(words) > limit:
            pieces.append(" ".join(words[:limit]))
            words = words[limit:]
            para = " ".join(words)
        cur.append(para.strip())
        n += len(words)
    if cur:
        pieces.append("\n\n".join(cur))
    return pieces


def _paragraphs(text: str) -> list[str]:
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


def _chunks(prefix: str, title: str, text: str, unit: str, source: str) -> list[dict]:
    return [{"id": f"{prefix}#{i}", "title": title, "text": piece, "unit": unit, "source": source}
            for i, piece in enumerate(split_words(_paragraphs(text)))]


# -- sources ----------------------------------------------------------------------------------------------

def stdlib_files() -> list[tuple[str, Path]]:
    """``(module name, path)`` of every public stdlib module (no tests, no ``_private`` modules)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and d.isidentifier() and d[0] != "_")
        for fn in sorted(filenames):
            if fn.endswith(".py") and (fn == "__init__.py" or (fn[0] != "_" and fn[:-3].isidentifier())):
                parts = [*rel.parts] + ([] if fn == "__init__.py" else [fn[:-3]])
                if parts and (rel.parts or fn != "__init__.py"):
                    out.append((".".join(parts), Path(dirpath) / fn))
    return out


def _defs(body: list[ast.stmt]):
    """Function and class definitions in a body, including those under top-level ``if``/``try`` blocks."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node
        elif isinstance(node, (ast.If, ast.Try)):
            yield from _defs(node.body + node.orelse + getattr(node, "finalbody", []))


def stdlib_chunks() -> list[dict]:
    chunks: list[dict] = []
    taken: set[str] = set()
    for module, path in stdlib_files():
        taken.add(module)
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError, OSError):  # a few files target other Python versions (lib2to3 data)
            continue
        if doc := ast.get_docstring(tree):
            chunks += _chunks(module, f"{module} (module)", doc, module, "stdlib")
        stack = [(module, None, node) for node in _defs(tree.body)]
        while stack:
            prefix, owner, node = stack.pop(0)
            name = node.name
            if name.startswith("_") and name != "__init__":
                continue
            qual = f"{prefix}.{name}"
            while qual in taken:  # defined twice (an if/else per platform): the second copy gets a suffix
                qual += "~2"
            taken.add(qual)
            if isinstance(node, ast.ClassDef):
                kind = "class"
                stack += [(qual, name, n) for n in _defs(node.body)]
                signature = f"class {name}({', '.join(ast.unparse(b) for b in node.bases)})"
            else:
                kind = "method" if owner else "function"
                signature = f"def {name}({ast.unparse(node.args)})"[:300]
            if doc := ast.get_docstring(node):
                chunks += _chunks(qual, f"{qual} ({kind})", f"{signature}\n\n{doc}", module, "stdlib")
    return chunks


def topic_chunks() -> list[dict]:
    """The language reference topics ``help('assert')`` shows, read from ``pydoc_data/topics.py`` with ast."""
    path = Path(sysconfig.get_paths()["stdlib"]) / "pydoc_data" / "topics.py"
    tree = ast.parse(path.read_bytes())
    topics = ast.literal_eval(next(n.value for n in tree.body if isinstance(n, ast.Assign)))
    chunks = []
    for key in sorted(topics):
        text = topics[key]
        heading = text.strip().splitlines()[0].strip() if text.strip() else key
        chunks += _chunks(f"topic:{key}", f"{heading} (language reference: {key})", text, f"topic:{key}", "topics")
    return chunks


def _rst_clean(text: str) -> str:
    text = _ROLE.sub(r"\1", text)
    return re.sub(r"`([^`<]+?)\s*<[^>]+>`_", r"\1", text).replace("``", "")


def rst_chunks() -> list[dict]:
    """Debian ``python3.11-doc`` reST sources, one chunk run per section."""
    chunks = []
    underline = re.compile(r"^([=\-~^*#+\"'])\1{2,}\s*$")
    for path in sorted(RST_ROOT.rglob("*.rst.txt")):
        doc = path.relative_to(RST_ROOT).as_posix()[: -len(".rst.txt")]
        lines = _rst_clean(path.read_text(errors="replace")).splitlines()
        sections, title, doc_title, buf = [], "", "", []
        for i, line in enumerate(lines):
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            if underline.match(nxt) and line.strip() and not underline.match(line) and len(nxt) >= len(line.strip()):
                sections.append((title, buf))
                title, buf = line.strip(), []
                doc_title = doc_title or title
            elif not underline.match(line):
                buf.append(line)
        sections.append((title, buf))
        n = 0
        for sec_title, sec_lines in sections:
            head = f"{doc_title} · {sec_title}" if sec_title and sec_title != doc_title else doc_title or doc
            for piece in split_words(_paragraphs("\n".join(sec_lines))):
                chunks.append({"id": f"rst:{doc}#{n}", "title": f"{head} ({doc})", "text": piece,
                               "unit": f"rst:{doc}", "source": "rst"})
                n += 1
    return chunks


def man_chunks() -> list[dict]:
    """Linux man-pages project pages (read by :mod:`agentlab.corpora.manpages`), one chunk run per section."""
    chunks = []
    for page, title, sections in manpages.linux_man_pages():
        n = 0
        for head, text in sections:
            for piece in split_words(_paragraphs(text)):
                chunks.append({"id": f"man:{page}#{n}", "title": f"{title} · {head}", "text": piece,
                               "unit": f"man:{page}", "source": "man"})
                n += 1
    return chunks


def _stat_digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        st = p.stat()
        h.update(f"{p}\x1f{st.st_size}\x1f{st.st_mtime_ns}\n".encode())
    return f"{len(paths)}:{h.hexdigest()[:16]}"


def sources(corpus: str) -> dict[str, tuple]:
    """``{source name: (chunk builder, fingerprint part)}`` of a corpus; rich sources only where present."""
    if corpus not in CORPORA:
        raise ValueError(f"unknown corpus {corpus!r}; expected one of {CORPORA}")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out = {"stdlib": (stdlib_chunks, _stat_digest([p for _, p in stdlib_files()])),
           "topics": (topic_chunks, _stat_digest([stdlib / "pydoc_data" / "topics.py"]))}
    if corpus == "rich":
        if RST_ROOT.is_dir():
            out["rst"] = (rst_chunks, _stat_digest(sorted(RST_ROOT.rglob("*.rst.txt"))))
        if manpages.available():
            out["man"] = (man_chunks, _stat_digest(manpages.man_paths()))
    return out


def fingerprint(corpus: str) -> str:
    parts = [f"python={sys.version.split()[0]}", f"builder={BUILDER_VERSION}", f"corpus={corpus}"]
    parts += [f"{name}={digest}" for name, (_, digest) in sources(corpus).items()]
    return " ".join(parts)


# -- the cached store -------------------------------------------------------------------------------------

def open_store(path: Path, stamp: str, build) -> list[tuple]:
    """Rows ``(id, title, text, unit, source)`` from the SQLite store at ``path``; (re)built by ``build()`` when
    missing, stale or unreadable. Written to a temporary file and renamed, so a killed build leaves no half-store.
    """
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            (meta,) = db.execute("SELECT value FROM meta WHERE key = 'fingerprint'").fetchone()
            (count,) = db.execute("SELECT value FROM meta WHERE key = 'rows'").fetchone()
            rows = db.execute("SELECT id, title, text, unit, source FROM chunks ORDER BY rowid").fetchall()
        if meta == stamp and int(count) == len(rows):
            return rows
    except (sqlite3.Error, TypeError, ValueError):  # missing, corrupt or partial: rebuild below
        pass
    rows = [(c["id"], c["title"], c["text"], c["unit"], c["source"]) for c in build()]
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    os.close(fd)
    with sqlite3.connect(tmp) as db:
        db.execute("CREATE TABLE chunks (id TEXT PRIMARY KEY, title TEXT, text TEXT, unit TEXT, source TEXT)")
        db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
        db.executemany("INSERT INTO chunks VALUES (?, ?, ?, ?, ?)", rows)
        db.executemany("INSERT INTO meta VALUES (?, ?)", [("fingerprint", stamp), ("rows", str(len(rows)))])
    os.replace(tmp, path)
    return rows


class Corpus:
    """Chunks in memory (ids, titles, texts) plus the BM25 index; ``grep`` scans one joined text."""

    def __init__(self, name: str, rows: list[tuple], index: SearchIndex, build_s: float = 0.0):
        self.name, self.index, self.build_s = name, index, build_s
        self.ids = [r[0] for r in rows]
        self.titles = [r[1] for r in rows]
        self.texts = [r[2] for r in rows]
        self.units = [r[3] for r in rows]
        self.sources = [r[4] for r in rows]
        self.pos = {cid: i for i, cid in enumerate(self.ids)}
        # One joined text for grep: a NUL between chunks keeps line anchors working and marks boundaries.
        self._blob = "\n\0\n".join(f"{t}\n{x}" for t, x in zip(self.titles, self.texts))
        self._starts, at = [], 0
        for t, x in zip(self.titles, self.texts):
            self._starts.append(at)
            at += len(t) + 1 + len(x) + 3

    def __len__(self) -> int:
        return len(self.ids)

    def title(self, cid: str) -> str:
        return self.titles[self.pos[cid]]

    def text(self, cid: str) -> str:
        return self.texts[self.pos[cid]]

    def grep(self, pattern, max_hits: int = 10, budget_s: float = 0.5) -> tuple[list[tuple[int, int]], bool]:
        """``([(chunk index, match offset in its text), …], complete)`` for a compiled ``regex`` pattern.

        Bounded in time: each search gets the budget left as the ``regex`` timeout, so catastrophic patterns like ``(a+)+$`` stop at ``budget_s``; after a hit the scan jumps to the next
        chunk, so one chunk gives one hit.
        """
        deadline, hits, at = time.perf_counter() + budget_s, [], 0
        while len(hits) < max_hits and at < len(self._blob):
            left = deadline - time.perf_counter()
            if left <= 0:
                return hits, False
            # Only `regex` patterns take a timeout; a stdlib `re` pattern is checked against the deadline between
            # searches only (the environment refuses the risky shapes for it).
            timeout = {"timeout": left} if "regex" in type(pattern).__module__ else {}
            try:
                m = pattern.search(self._blob, at, **timeout)
            except TimeoutError:
                return hits, False
            if m is None:
                break
            i = bisect_right(self._starts, m.start()) - 1
            text_at = self._starts[i] + len(self.titles[i]) + 1
            if m.end() <= text_at + len(self.texts[i]) and "\0" not in m.group():
                hits.append((i, max(0, m.start() - text_at)))
            at = self._starts[i + 1] if i + 1 < len(self._starts) else len(self._blob)
        return hits, True


def first_sentence(paragraph: str, max_words: int = 40) -> str:
    """The first sentence of a paragraph, whitespace collapsed.

    >>> first_sentence("Serialize ``obj`` to a JSON formatted ``str``.  If ``skipkeys`` is true ...")
    'Serialize ``obj`` to a JSON formatted ``str``.'
    """
    flat = " ".join(paragraph.split())
    return " ".join(re.split(r"(?<=[.!?])\s+(?=[A-Z(`'\"])", flat, maxsplit=1)[0].split()[:max_words])


def statements(corpus: Corpus) -> list[tuple[int, str, str]]:
    """``(chunk index, kind, sentence)`` candidates for task facts: the first sentence of each stdlib function,
    class or method docstring, and of the first prose paragraph of each language-reference topic chunk."""
    out = []
    for i, (cid, title, text) in enumerate(zip(corpus.ids, corpus.titles, corpus.texts)):
        source = corpus.sources[i]
        if source == "stdlib" and cid.endswith("#0") and not title.endswith("(module)"):
            kind = title.rsplit("(", 1)[-1].rstrip(")")
            paras = _paragraphs(text)[1:2]  # paragraph 0 is the signature line
        elif source == "topics":
            kind = "passage"
            paras = [p for p in _paragraphs(text) if not p[0].isspace() and "::=" not in p
                     and not re.search(r"\n[*=~\-^]{3,}\s*$", p)][:1]
        else:
            continue
        if paras and 6 <= len((sentence := first_sentence(paras[0])).split()) <= 40:
            out.append((i, kind, sentence))
    return out


def build(corpus: str = "default", root: Path | None = None) -> Corpus:
    """Open (or build) the cached corpus ``corpus`` under ``root`` (default ``cache_dir()/doc_search``)."""
    folder = Path(root or cache_dir() / "doc_search") / corpus
    stamp = fingerprint(corpus)
    t0 = time.perf_counter()
    rows = open_store(folder / "chunks.sqlite", stamp,
                      lambda: [c for fn, _ in sources(corpus).values() for c in fn()])
    docs = lambda: ({"id": r[0], "title": r[1], "body": r[2]} for r in rows)
    index = SearchIndex.open_or_build(folder / "index", stamp, docs)
    return Corpus(corpus, rows, index, build_s=time.perf_counter() - t0)


@lru_cache(maxsize=2)
def load(corpus: str = "default") -> Corpus:
    """The corpus, built once per process (environments created by TRL share it)."""
    return build(corpus)
