"""The project store: one SQLite file (WAL mode) holding samples, classes, labels, rounds and
checkpoint records of an Active DA project.

Every change is one transaction (``with store.transaction(): ...``): a process killed at any
point leaves the database at its last committed state (SQLite's write-ahead log guarantees it).
Labels are never updated in place: a correction is a new row whose ``supersedes`` points at the
row it replaces, so the whole labeling history stays readable.

Schema version 1 (``meta.schema_version``):

=============== ==========================================================================
table           what
=============== ==========================================================================
meta            key/value: schema version, eada version, project config (JSON), mode
roots           the registered data roots; file paths in imports must resolve inside one
classes         class id (the model's output index) and name
samples         role (source/target/heldout), domain, position in the loaded domain, file
                path (image projects) or NULL (feature rows), content hash (SHA-256)
rounds          one query round: number, strategy, epoch, budget, config, selection info
round_samples   per-sample scores of the whole pool a round scored; ``rank`` of the selected
labels          sample, class, annotator, time, round, source (human/simulated), supersedes
imports         one label import: file, its SHA-256, format, counts
checkpoints     trainer checkpoint files with their SHA-256, epoch, segment and metrics
=============== ==========================================================================
"""

from __future__ import annotations

import datetime as _dt
import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
DB_NAME = "eada.sqlite"

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE roots (id INTEGER PRIMARY KEY, path TEXT UNIQUE NOT NULL);
CREATE TABLE classes (id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL);
CREATE TABLE samples (
    id INTEGER PRIMARY KEY,
    role TEXT NOT NULL CHECK (role IN ('source', 'target', 'heldout')),
    domain TEXT NOT NULL,
    position INTEGER NOT NULL,
    path TEXT,
    content_hash TEXT NOT NULL,
    UNIQUE (role, position)
);
CREATE INDEX samples_path ON samples (path);
CREATE TABLE checkpoints (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL CHECK (kind IN ('epoch', 'train', 'query')),
    path TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    segment_start INTEGER NOT NULL,
    segment_end INTEGER NOT NULL,
    n_labeled INTEGER NOT NULL,
    metrics TEXT,
    created TEXT NOT NULL
);
CREATE TABLE rounds (
    id INTEGER PRIMARY KEY,
    number INTEGER UNIQUE NOT NULL,
    strategy TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    budget INTEGER NOT NULL,
    config TEXT NOT NULL,
    info TEXT NOT NULL,
    checkpoint_id INTEGER NOT NULL REFERENCES checkpoints (id),
    created TEXT NOT NULL
);
CREATE TABLE round_samples (
    round_id INTEGER NOT NULL REFERENCES rounds (id),
    sample_id INTEGER NOT NULL REFERENCES samples (id),
    rank INTEGER,
    scores TEXT NOT NULL,
    PRIMARY KEY (round_id, sample_id)
);
CREATE TABLE imports (
    id INTEGER PRIMARY KEY,
    file TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    format TEXT NOT NULL,
    n_new INTEGER NOT NULL,
    n_corrections INTEGER NOT NULL,
    n_unchanged INTEGER NOT NULL,
    created TEXT NOT NULL
);
CREATE TABLE labels (
    id INTEGER PRIMARY KEY,
    sample_id INTEGER NOT NULL REFERENCES samples (id),
    class_id INTEGER NOT NULL REFERENCES classes (id),
    annotator TEXT NOT NULL,
    created TEXT NOT NULL,
    round_id INTEGER REFERENCES rounds (id),
    source TEXT NOT NULL CHECK (source IN ('human', 'simulated')),
    supersedes INTEGER UNIQUE REFERENCES labels (id),
    import_id INTEGER REFERENCES imports (id)
);
CREATE INDEX labels_sample ON labels (sample_id);
"""


class StoreError(ValueError):
    """A store that cannot be used as asked (missing, already there, wrong version, bad data)."""


def now() -> str:
    """The current UTC time as ISO-8601 text."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


class Store:
    """An open project store.

    Args:
        folder: the project folder (holding ``eada.sqlite``, ``checkpoints/``, ``exports/``).
        create: create a new store (error if one exists) instead of opening one.

    Raises:
        StoreError: no store at ``folder`` (or one already there with ``create``), or a store
            written by a newer eada (its schema version is higher than :data:`SCHEMA_VERSION`).

    Example:
        >>> import tempfile
        >>> s = Store(Path(tempfile.mkdtemp()) / "p", create=True)
        >>> s.get_meta("schema_version")
        '1'
    """

    def __init__(self, folder: str | Path, create: bool = False) -> None:
        self.folder = Path(folder)
        self.path = self.folder / DB_NAME
        if create:
            if self.path.exists():
                raise StoreError(f"a project store already exists at {self.folder}")
            self.folder.mkdir(parents=True, exist_ok=True)
        elif not self.path.is_file():
            raise StoreError(
                f"no project store at {self.folder} (expected {self.path}); run `eada init` first"
            )
        self.conn = sqlite3.connect(self.path, isolation_level=None, timeout=30.0)
        self.conn.row_factory = sqlite3.Row
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute("PRAGMA foreign_keys=ON")
        if create:
            with self.transaction():
                self._create_schema()
        self._check_version()
        (self.folder / "checkpoints").mkdir(exist_ok=True)

    def _create_schema(self) -> None:
        for stmt in _SCHEMA.split(";"):
            if stmt.strip():
                self.conn.execute(stmt)
        self.set_meta("schema_version", str(SCHEMA_VERSION))
        self.set_meta("created", now())

    def _check_version(self) -> None:
        try:
            raw = self.get_meta("schema_version")
        except sqlite3.DatabaseError as err:
            raise StoreError(f"{self.path} is not an eada project store: {err}") from None
        if raw is None:
            raise StoreError(f"{self.path} has no schema version: not an eada project store")
        version = int(raw)
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"the store at {self.folder} was written by a newer eada (schema version "
                f"{version}; this eada reads up to version {SCHEMA_VERSION}): upgrade eada"
            )

    def close(self) -> None:
        """Close the database connection."""
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT``; rolls back on any exception."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    # -- meta ---------------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        """A ``meta`` value, or ``None``."""
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        """Insert or replace a ``meta`` value (call inside a transaction)."""
        self.conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def get_json(self, key: str) -> Any:
        """A ``meta`` value parsed as JSON (``None`` when absent)."""
        raw = self.get_meta(key)
        return None if raw is None else json.loads(raw)

    # -- reads ----------------------------------------------------------------------------------
    def roots(self) -> list[Path]:
        """The registered data roots."""
        return [Path(r[0]) for r in self.conn.execute("SELECT path FROM roots ORDER BY id")]

    def classes(self) -> list[str]:
        """Class names in id order."""
        return [r[0] for r in self.conn.execute("SELECT name FROM classes ORDER BY id")]

    def samples(self, role: str) -> list[sqlite3.Row]:
        """Sample rows of one role (``source``/``target``/``heldout``) in position order."""
        return list(
            self.conn.execute("SELECT * FROM samples WHERE role = ? ORDER BY position", (role,))
        )

    def current_labels(self) -> list[sqlite3.Row]:
        """The label in force for every labeled sample (rows no later row supersedes), with
        the sample's position in the target domain, ordered by sample id."""
        return list(
            self.conn.execute(
                "SELECT l.*, s.position AS position, c.name AS class_name FROM labels l "
                "JOIN samples s ON s.id = l.sample_id JOIN classes c ON c.id = l.class_id "
                "WHERE NOT EXISTS (SELECT 1 FROM labels n WHERE n.supersedes = l.id) "
                "ORDER BY l.sample_id"
            )
        )

    def rounds(self) -> list[sqlite3.Row]:
        """Round rows in order."""
        return list(self.conn.execute("SELECT * FROM rounds ORDER BY number"))

    def selected(self, round_id: int) -> list[sqlite3.Row]:
        """The selected samples of a round (rank order) with their scores and positions."""
        return list(
            self.conn.execute(
                "SELECT rs.*, s.position, s.path, s.domain FROM round_samples rs "
                "JOIN samples s ON s.id = rs.sample_id "
                "WHERE rs.round_id = ? AND rs.rank IS NOT NULL ORDER BY rs.rank",
                (round_id,),
            )
        )

    def latest_checkpoint(self) -> sqlite3.Row | None:
        """The most recent checkpoint row."""
        return self.conn.execute("SELECT * FROM checkpoints ORDER BY id DESC LIMIT 1").fetchone()

    def checkpoints(self) -> list[sqlite3.Row]:
        """Every checkpoint row in order."""
        return list(self.conn.execute("SELECT * FROM checkpoints ORDER BY id"))
