"""BM25 keyword search shared by the environments, on tantivy.

Why tantivy and not SQLite FTS5 (the seed's choice): at 55k chunks FTS5 answered in 9.3 ms p50 / 38 ms p99,
tantivy in 0.20 / 0.46 ms with the same top-10 (DESIGN.md; re-measure with ``benchmarks/search_latency.py``).
Agent text never reaches a query parser: we tokenise it ourselves and build a plain OR of term queries, so
quotes, ``*``, ``:``, ``NEAR`` or ``AND`` are just words and cannot raise.

    >>> import tempfile
    >>> idx = SearchIndex.build(tempfile.mkdtemp(), [{"id": "a", "title": "read_file", "body": "Read a file."}],
    ...                         fingerprint="demo")
    >>> idx.search("readFile")
    [('a', ...)]
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

MAX_QUERY_TERMS = 32
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+|[0-9]+")


def words(text: str) -> list[str]:
    """Lower-cased search terms: snake_case and camelCase split into words, whole identifiers kept too.

    >>> words("os.path.joinPath NEAR \\"x*")
    ['os', 'path', 'join', 'joinpath', 'near', 'x']
    """
    out: list[str] = []
    for token in re.findall(r"[A-Za-z0-9]+", text):
        parts = [p.lower() for p in _WORD.findall(token)]
        for w in parts + ([token.lower()] if len(parts) > 1 else []):
            if w not in out:
                out.append(w)
    return out


def index_text(text: str) -> str:
    """Text as indexed: the original plus the split words of every identifier, so both forms match."""
    return text + "\n" + " ".join(words(text))


class SearchIndex:
    """A tantivy BM25 index over documents ``{"id", "title", "body"}``; stores only ids (texts live elsewhere)."""

    FIELDS = ("title", "body")

    def __init__(self, path: str | Path):
        import tantivy

        self.path = Path(path)
        self._index = tantivy.Index.open(str(self.path))
        self._index.reload()
        self._searcher = self._index.searcher()
        self._schema = self._index.schema

    @staticmethod
    def _schema_builder():
        import tantivy

        sb = tantivy.SchemaBuilder()
        sb.add_text_field("id", stored=True, tokenizer_name="raw")
        for name in SearchIndex.FIELDS:
            sb.add_text_field(name, stored=False)
        return sb.build()

    @classmethod
    def build(cls, path: str | Path, docs: Iterable[dict], fingerprint: str) -> SearchIndex:
        """Build into a temporary folder, then move into place, so a killed build never leaves half an index."""
        import tantivy

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=path.name + ".", dir=path.parent))
        index = tantivy.Index(cls._schema_builder(), path=str(tmp))
        writer = index.writer(heap_size=128_000_000, num_threads=1)
        for doc in docs:
            writer.add_document(tantivy.Document(
                id=doc["id"], title=index_text(doc.get("title", "")), body=index_text(doc.get("body", ""))))
        writer.commit()
        writer.wait_merging_threads()
        (tmp / "FINGERPRINT").write_text(fingerprint)
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
        try:
            os.replace(tmp, path)
        except OSError:  # another process finished the same build first: use theirs
            shutil.rmtree(tmp, ignore_errors=True)
        return cls(path)

    @classmethod
    def open_or_build(cls, path: str | Path, fingerprint: str, docs: callable) -> SearchIndex:
        """Open the cached index when its fingerprint matches; otherwise (or if it is unreadable) rebuild it."""
        path = Path(path)
        stamp = path / "FINGERPRINT"
        if stamp.exists() and stamp.read_text() == fingerprint:
            try:
                return cls(path)
            except Exception:  # noqa: BLE001, S110 — a corrupt index is rebuilt, never used
                pass
        return cls.build(path, docs(), fingerprint)

    def search(self, text: str, k: int = 10, title_boost: float = 2.0) -> list[tuple[str, float]]:
        """Top-``k`` ``(id, score)`` by BM25 over title and body; an OR of the query's words."""
        import tantivy

        terms = words(text[:2000])[:MAX_QUERY_TERMS]
        if not terms:
            return []
        clauses = []
        for field, boost in (("title", title_boost), ("body", 1.0)):
            for term in terms:
                q = tantivy.Query.term_query(self._schema, field, term)
                clauses.append((tantivy.Occur.Should, tantivy.Query.boost_query(q, boost) if boost != 1 else q))
        hits = self._searcher.search(tantivy.Query.boolean_query(clauses), k).hits
        return [(self._searcher.doc(addr)["id"][0], float(score)) for score, addr in hits]

    def __len__(self) -> int:
        return self._searcher.num_docs
