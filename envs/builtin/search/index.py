"""The corpus as a SQLite FTS5 index, and the two tools' bounded reads of it.

Built once per corpus digest into the cache (`$ENVHUB_CACHE/search`, default
`~/.cache/envhub/search`), written to a temporary file and renamed, so concurrent first uses
never see half an index. Ranking is FTS5's `bm25()` with the title weighted over the body (a
page titled exactly as the query first); a query is reduced to its words (each quoted, joined
by OR), so nothing the model types is FTS5 syntax. Every size the model controls is bounded:
query length and words, number of results, characters of a snippet and of an opened page.
"""

from __future__ import annotations

import os
import re
import sqlite3
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from envhub.envs.builtin.search.corpus import (
    Entity,
    Page,
    corpus_digest,
    generate_world,
    render_pages,
)
from envhub.envs.cache import cache_dir

MAX_QUERY_CHARS = 300
MAX_QUERY_WORDS = 16
MAX_RESULTS = 10
MAX_SNIPPET_CHARS = 160
MAX_PAGE_CHARS = 4000
MAX_TITLE_CHARS = 200
INDEX_VERSION = 1  # in the file name: a new layout builds a new file
TITLE_WEIGHT = 10.0  # bm25 column weights: a page titled with the query's words ranks first


class SearchInputError(ValueError):
    """A query or title the tools refuse; the message says how to call them right."""


@dataclass(frozen=True)
class Hit:
    title: str
    kind: str
    snippet: str


def cache_root() -> Path:
    return cache_dir() / "search"


def build_index(pages: list[Page], root: Path | None = None) -> Path:
    """The index file for `pages`, built unless the cache already holds it."""
    root = root or cache_root()
    path = root / f"corpus-{corpus_digest(pages)[:16]}-v{INDEX_VERSION}.sqlite"
    if path.is_file():
        return path
    root.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=root, prefix=".building-", suffix=".sqlite")
    os.close(fd)
    try:
        con = sqlite3.connect(tmp)
        with con:
            con.execute("CREATE VIRTUAL TABLE pages USING fts5(title, body, kind UNINDEXED)")
            # `ORDER BY rank` is then bm25 with these column weights, which FTS5 sorts itself
            con.execute("INSERT INTO pages(pages, rank) VALUES ('rank', ?)",
                        (f"bm25({TITLE_WEIGHT}, 1.0)",))
            con.execute("CREATE TABLE titles (title TEXT PRIMARY KEY COLLATE NOCASE, "
                        "page INTEGER NOT NULL)")
            for i, p in enumerate(pages, 1):
                con.execute("INSERT INTO pages(rowid, title, body, kind) VALUES (?, ?, ?, ?)",
                            (i, p.title, p.text, p.kind))
                con.execute("INSERT INTO titles VALUES (?, ?)", (p.title, i))
            con.execute("INSERT INTO pages(pages) VALUES ('optimize')")
        con.close()
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would keep other users off a shared cache
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def fts_query(query: str) -> str:
    """The model's text as an FTS5 query: its words, quoted, ORed (bounded)."""
    if len(query) > MAX_QUERY_CHARS:
        raise SearchInputError(f"query longer than {MAX_QUERY_CHARS} characters; search for a "
                               "name or a few keywords")
    words = re.findall(r"\w+", query.lower())[:MAX_QUERY_WORDS]
    if not words:
        raise SearchInputError('query has no words; pass e.g. {"query": "Port Almera"}')
    return " OR ".join(f'"{w}"' for w in words)


class Index:
    """Read-only access to one index file; a connection per call (cheap, thread-safe)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)

    def search(self, query: str, k: int = 5) -> list[Hit]:
        """The `k` best pages for `query` (k in 1..MAX_RESULTS): the page titled exactly as
        the query first, then by bm25."""
        k = max(1, min(MAX_RESULTS, k))
        match = fts_query(query)
        con = self._connect()
        try:
            exact = con.execute("SELECT page FROM titles WHERE title = ?",
                                (" ".join(query.split()),)).fetchone()
            rows = con.execute(
                "SELECT rowid, title, kind, snippet(pages, 1, '', '', ' ... ', 16) FROM pages "
                "WHERE pages MATCH ? ORDER BY rank LIMIT ?", (match, k)).fetchall()
            if exact is not None and exact[0] not in [row[0] for row in rows]:
                rows.insert(0, con.execute("SELECT rowid, title, kind, substr(body, 1, ?) "
                                           "FROM pages WHERE rowid = ?",
                                           (MAX_SNIPPET_CHARS, exact[0])).fetchone())
        finally:
            con.close()
        if exact is not None:
            rows.sort(key=lambda row: row[0] != exact[0])  # stable: the rest keep their rank
        return [Hit(t, kind, " ".join(s.split())[:MAX_SNIPPET_CHARS])
                for _, t, kind, s in rows[:k]]

    def page(self, title: str) -> str | None:
        """The page titled exactly `title` (case and spacing ignored), cut to MAX_PAGE_CHARS;
        None when there is none."""
        if len(title) > MAX_TITLE_CHARS:
            raise SearchInputError(f"title longer than {MAX_TITLE_CHARS} characters; pass a "
                                   "title exactly as search printed it")
        con = self._connect()
        try:
            row = con.execute("SELECT body FROM pages WHERE rowid = "
                              "(SELECT page FROM titles WHERE title = ?)",
                              (" ".join(title.split()),)).fetchone()
        finally:
            con.close()
        return None if row is None else str(row[0])[:MAX_PAGE_CHARS]

    def titles(self) -> list[str]:
        con = self._connect()
        try:
            return [t for (t,) in con.execute("SELECT title FROM pages")]
        finally:
            con.close()


@dataclass(frozen=True)
class Corpus:
    world: dict[str, Entity]
    digest: str  # corpus_digest of its pages
    index: Index


@lru_cache(maxsize=4)
def open_corpus(seed: int) -> Corpus:
    """The corpus of `seed`, its index built into the cache on first use (once per process)."""
    world = generate_world(seed)
    pages = render_pages(world)
    return Corpus(world, corpus_digest(pages), Index(build_index(pages)))
