"""The ``code_search`` corpus: every public function, method and class of this Python's standard library.

Parsed with :mod:`ast` (nothing is imported, so no module side effects) from
``sysconfig.get_paths()['stdlib']`` and cached as one SQLite table under ``cache_dir()/code_search/``. The
cache carries a fingerprint (builder version + Python version + stdlib path); a different Python or a new
builder version rebuilds it.

    >>> from agentlab.corpora.stdlib_code import corpus_path, open_corpus
    >>> db = open_corpus()                                        # builds on first use (a few seconds)
    >>> db.execute("SELECT signature FROM defs WHERE name = 'json.dumps'").fetchone()[0][:15]
    'def dumps(obj, '

What is left out, and why:

* ``test``/``tests`` folders, ``idlelib``, ``lib2to3``, ``turtledemo``, ``ensurepip``, ``site-packages``,
  ``__main__.py``: tests and tools, not library API (and lib2to3's fixtures are not even valid Python 3).
* private modules (any path part starting with ``_``, e.g. ``_pyio``, ``_pydecimal``): they are pure-Python
  twins of public modules with the *same docstrings*, so keeping them would give questions two right answers,
  and the name a user imports is the public one.
* private and dunder names (``_helper``, ``__init__``): not API; a class's own docstring describes it.
"""

from __future__ import annotations

import ast
import os
import platform
import re
import sqlite3
import sys
import sysconfig
import tempfile
import tokenize
from collections.abc import Iterator
from pathlib import Path

from agentlab.paths import cache_dir
from agentlab.search import words

BUILDER_VERSION = 1
SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "ensurepip", "site-packages", "__pycache__"}
# Sources are stored capped: read_repo shows ~1,500 characters and a few classes (tkinter.Misc) run to 100 kB
SOURCE_CAP = 8_000
COLUMNS = ("name", "kind", "module", "signature", "doc", "source", "file", "line")


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def fingerprint(root: Path | None = None) -> str:
    """What the cached corpus depends on: a change in any part rebuilds it."""
    impl = sys.implementation.name
    return f"stdlib_code v{BUILDER_VERSION} {impl} {platform.python_version()} {root or stdlib_root()}"


def corpus_path() -> Path:
    return cache_dir() / "code_search" / "corpus.sqlite"


def module_files(root: Path) -> Iterator[tuple[str, Path]]:
    """``(module name, file)`` for every public module under ``root``, in a stable order."""
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        # Packages must be importable (no dashes: config-3.11-x86_64-linux-gnu) and public.
        dirnames[:] = sorted(d for d in dirnames
                             if d not in SKIP_DIRS and d.isidentifier() and not d.startswith("_"))
        for fname in sorted(filenames):
            stem = fname[:-3]
            private = stem.startswith("_") and stem != "__init__"
            if not fname.endswith(".py") or stem == "__main__" or private or not stem.isidentifier():
                continue
            parts = list(rel.parts) + ([] if stem == "__init__" else [stem])
            if parts:
                yield ".".join(parts), Path(dirpath) / fname


def _signature(node: ast.AST) -> str:
    if isinstance(node, ast.ClassDef):
        bases = [ast.unparse(b) for b in node.bases] + [ast.unparse(k) for k in node.keywords]
        return f"class {node.name}" + (f"({', '.join(bases)})" if bases else "")
    prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
    return f"{prefix} {node.name}({ast.unparse(node.args)}){returns}"


def _definitions(body: list[ast.stmt], prefix: str, in_class: bool) -> Iterator[tuple[str, str, ast.AST]]:
    """``(qualified name, kind, node)``; descends into if/try/with blocks (platform-specific definitions)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name.startswith("_"):
                continue
            qualname = f"{prefix}.{node.name}"
            if isinstance(node, ast.ClassDef):
                yield qualname, "class", node
                yield from _definitions(node.body, qualname, in_class=True)
            else:
                yield qualname, "method" if in_class else "function", node
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            blocks = [node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])]
            blocks += [h.body for h in getattr(node, "handlers", [])]
            for block in blocks:
                yield from _definitions(block, prefix, in_class)


def parse_module(module: str, path: Path, root: Path) -> Iterator[dict]:
    """Rows for one file; a file that does not parse yields nothing (the build counts it)."""
    with tokenize.open(path) as f:  # honours encoding cookies
        text = f.read()
    tree = ast.parse(text, filename=str(path))
    lines = text.splitlines()
    for qualname, kind, node in _definitions(tree.body, module, in_class=False):
        start = node.lineno  # the def line: decorators are left out so the source opens on the signature
        source = "\n".join(lines[start - 1:node.end_lineno])
        yield {
            "name": qualname, "kind": kind, "module": module, "signature": _signature(node),
            "doc": ast.get_docstring(node) or "", "source": source[:SOURCE_CAP],
            "file": str(path.relative_to(root)), "line": start,
        }


def build_corpus(path: Path, root: Path | None = None) -> dict:
    """Parse ``root`` (default: this Python's stdlib) into the SQLite file ``path``; returns build stats.

    Written to a temporary file and moved into place, so a killed build never leaves a half corpus behind.
    The first definition of a qualified name wins (a platform ``if`` can define a function twice).
    """
    root = root or stdlib_root()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="corpus.", suffix=".sqlite", dir=path.parent)
    os.close(fd)
    stats = {"files": 0, "unparsable": 0, "definitions": 0}
    db = sqlite3.connect(tmp)
    try:
        db.execute(f"CREATE TABLE defs ({', '.join(COLUMNS)}, PRIMARY KEY (name)) WITHOUT ROWID")
        db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
        for module, file in module_files(root):
            stats["files"] += 1
            try:
                rows = list(parse_module(module, file, root))
            except (SyntaxError, UnicodeDecodeError, ValueError):
                stats["unparsable"] += 1
                continue
            db.executemany(f"INSERT OR IGNORE INTO defs VALUES ({', '.join('?' * len(COLUMNS))})",
                           [tuple(r[c] for c in COLUMNS) for r in rows])
        stats["definitions"] = db.execute("SELECT count(*) FROM defs").fetchone()[0]
        db.executemany("INSERT INTO meta VALUES (?, ?)",
                       [("fingerprint", fingerprint(root)), *((k, str(v)) for k, v in stats.items())])
        db.commit()
    finally:
        db.close()
    os.replace(tmp, path)
    return stats


def stored_fingerprint(path: Path) -> str | None:
    if not path.exists():
        return None
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'fingerprint'").fetchone()
        return row[0] if row else None
    except sqlite3.Error:  # corrupt or foreign file: rebuild
        return None


def ensure_corpus(path: Path | None = None, root: Path | None = None) -> Path:
    """The corpus file, (re)built when missing or when its fingerprint differs."""
    path = path or corpus_path()
    if stored_fingerprint(path) != fingerprint(root):
        build_corpus(path, root)
    return path


def open_corpus(path: Path | None = None, root: Path | None = None) -> sqlite3.Connection:
    """A read-only connection to the corpus of ``root``, (re)built first if needed."""
    path = ensure_corpus(path, root)
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)


def iter_defs(db: sqlite3.Connection) -> Iterator[dict]:
    """All rows, ordered by qualified name."""
    for row in db.execute(f"SELECT {', '.join(COLUMNS)} FROM defs ORDER BY name"):
        yield dict(zip(COLUMNS, row))


# -- docstring text helpers (search summaries, masked question clues) ----------------------------------------

def summary(doc: str, signature: str, limit: int = 100) -> str:
    """The docstring's first paragraph on one line (or the signature), cut to ``limit`` characters."""
    line = " ".join(doc.split("\n\n")[0].split()) or signature
    return line if len(line) <= limit else line[:limit - 1].rsplit(" ", 1)[0] + " …"


def _name_parts(names: list[str]) -> tuple[list[str], set[str]]:
    """Short names (last dotted part, lower case) and their split words of ≥ 3 letters ("is", "to" stay)."""
    shorts = [n.rsplit(".", 1)[-1].lower() for n in names]
    return shorts, {w for s in shorts for w in words(s) if len(w) >= 3}


def _gives_away(token: str, shorts: list[str], parts: set[str]) -> bool:
    # A short name is matched inside longer tokens ("decoded" for decode) only from 3 letters on: "ln" must
    # not hide "only".
    low = token.lower()
    return any(s in low if len(s) >= 3 else s == low for s in shorts) or bool(parts & set(words(token)))


def mask_names(text: str, names: list[str]) -> tuple[str, int]:
    """Replace every token that gives a name away by "…"; returns the text and how many tokens were hidden.

    Tokens that merely contain the name go too (``JSONDecoder`` for ``decode``): they would spell it out.

    >>> mask_names("Decode a JSON document, as JSONDecoder.decode does.", ["json.decoder.JSONDecoder.decode"])
    ('… a JSON document, as ….… does.', 3)
    """
    shorts, parts = _name_parts(names)
    hidden = 0

    def sub(m: re.Match) -> str:
        nonlocal hidden
        if _gives_away(m.group(0), shorts, parts):
            hidden += 1
            return "…"
        return m.group(0)

    return re.sub(r"[A-Za-z0-9_]+", sub, text), hidden


def leaks_name(text: str, names: list[str]) -> bool:
    """Does ``text`` give away one of ``names`` (the check every generated question passes)?

    >>> leaks_name("Return the Python representation of s", ["json.decoder.JSONDecoder.decode"])
    False
    """
    shorts, parts = _name_parts(names)
    return any(_gives_away(t, shorts, parts) for t in re.findall(r"[A-Za-z0-9_]+", text))


def docstring_clue(doc: str, name: str, limit: int = 300) -> str | None:
    """The docstring's first paragraph with the name masked; None when under 4 words or mostly the name."""
    para = " ".join(doc.split("\n\n")[0].split(">>>")[0].split())
    if len(para) > limit:
        para = para[:limit].rsplit(" ", 1)[0] + " …"
    masked, hidden = mask_names(para, [name])
    kept = re.findall(r"[A-Za-z]+", masked)
    return masked if len(kept) >= 4 and hidden * 2 <= len(kept) else None
