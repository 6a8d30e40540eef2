"""The project store: one SQLite file (WAL mode) holding samples, classes, labels, rounds and
checkpoint records of an Active DA project.

Every change is one transaction (``with store.transaction(): ...``): a process killed at any
point leaves the database at its last committed state (SQLite's write-ahead log guarantees it).
Labels are never updated in place: a correction is a new row whose ``supersedes`` points at the
row it replaces, so the whole labeling history stays readable.

Schema version 4 (``meta.schema_version``; an older store is migrated when it is first
opened for writing, see :meth:`Store.migrate`):

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
labels          sample, class, annotator, time, round, source (human/simulated), supersedes;
                a row with ``skip_reason`` and no class is a *skip* (the sample is unusable);
                ``decided``: how it came to be in force (``agreed``, a policy, ``force``)
imports         one label import: file, its SHA-256, format, counts (skips included)
votes           every answer each annotator gave (label or skip), where it came from (a file's
                row, a Label Studio task id): agreement between annotators and disputes
                are read from the newest vote of each annotator for a sample
                (``answered``/``updated``: the annotation's own times where the source
                gives them, e.g. Label Studio's; ``deleted``: when a pull found it gone)
disputes        a sample whose annotators disagree: opened when an import cannot settle it
                (``store.conflicts``), ``resolved`` (time) and ``how`` once a policy, a
                reviewer or agreeing answers settle it
attention       an answer that cannot be used (an unknown class, one annotator's answers
                that contradict each other, an empty submission, a deleted task): the sample
                *needs attention* (``why``, the annotator, the task, the action that clears
                it) until ``cleared``; everything else imports
checkpoints     trainer checkpoint files with their SHA-256, epoch, segment and metrics
=============== ==========================================================================
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shlex
import sqlite3
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from eada.runs import STORE_DB_NAME

SCHEMA_VERSION = 4
DB_NAME = STORE_DB_NAME  # eada.runs names it: its output guard protects the file

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
    created TEXT NOT NULL,
    n_skipped INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE labels (
    id INTEGER PRIMARY KEY,
    sample_id INTEGER NOT NULL REFERENCES samples (id),
    class_id INTEGER REFERENCES classes (id),
    annotator TEXT NOT NULL,
    created TEXT NOT NULL,
    round_id INTEGER REFERENCES rounds (id),
    source TEXT NOT NULL CHECK (source IN ('human', 'simulated')),
    supersedes INTEGER UNIQUE REFERENCES labels (id),
    import_id INTEGER REFERENCES imports (id),
    skip_reason TEXT,
    decided TEXT,
    CHECK ((class_id IS NULL) <> (skip_reason IS NULL))
);
CREATE INDEX labels_sample ON labels (sample_id);
CREATE UNIQUE INDEX labels_one_first ON labels (sample_id) WHERE supersedes IS NULL;
CREATE TABLE votes (
    id INTEGER PRIMARY KEY,
    sample_id INTEGER NOT NULL REFERENCES samples (id),
    annotator TEXT NOT NULL,
    class_id INTEGER REFERENCES classes (id),
    skip_reason TEXT,
    created TEXT NOT NULL,
    import_id INTEGER REFERENCES imports (id),
    origin TEXT,
    answered TEXT,
    updated TEXT,
    deleted TEXT,
    CHECK ((class_id IS NULL) <> (skip_reason IS NULL))
);
CREATE INDEX votes_sample ON votes (sample_id, annotator);
CREATE TABLE disputes (
    sample_id INTEGER PRIMARY KEY REFERENCES samples (id),
    opened TEXT NOT NULL,
    resolved TEXT,
    how TEXT
);
CREATE TABLE attention (
    id INTEGER PRIMARY KEY,
    sample_id INTEGER NOT NULL REFERENCES samples (id),
    annotator TEXT NOT NULL,
    why TEXT NOT NULL,
    task INTEGER,
    origin TEXT,
    source TEXT,
    action TEXT NOT NULL,
    opened TEXT NOT NULL,
    cleared TEXT,
    how TEXT
);
CREATE UNIQUE INDEX attention_open ON attention (sample_id, annotator) WHERE cleared IS NULL;
"""
# One first label a sample (and ``supersedes`` UNIQUE): a sample's labels form one chain, so
# exactly one is in force whatever two writers do. Added on open to stores made before it.
_ONE_FIRST_LABEL = (
    "CREATE UNIQUE INDEX IF NOT EXISTS labels_one_first ON labels (sample_id) "
    "WHERE supersedes IS NULL"
)
# Version 1 -> 2: ``labels.class_id`` may be NULL on a skip row that holds ``skip_reason``, and
# ``imports.n_skipped``. SQLite cannot relax a NOT NULL column in place: the table is rebuilt.
_MIGRATE_V1 = [
    _SCHEMA[_SCHEMA.index("CREATE TABLE labels") : _SCHEMA.index("CREATE INDEX labels_sample")]
    .replace("CREATE TABLE labels (", "CREATE TABLE labels_v2 (")
    .strip()
    .rstrip(";"),
    "INSERT INTO labels_v2 (id, sample_id, class_id, annotator, created, round_id, source, "
    "supersedes, import_id) SELECT id, sample_id, class_id, annotator, created, round_id, "
    "source, supersedes, import_id FROM labels",
    "DROP TABLE labels",
    "ALTER TABLE labels_v2 RENAME TO labels",
    "CREATE INDEX labels_sample ON labels (sample_id)",
    "ALTER TABLE imports ADD COLUMN n_skipped INTEGER NOT NULL DEFAULT 0",
]
# Version 2 -> 3: every annotator's answers (``votes``, filled from the label history: the
# newest row of each annotator for a sample) and ``disputes`` (none: version 2 refused them).
_MIGRATE_V2 = [
    stmt.strip()
    .replace("CREATE TABLE ", "CREATE TABLE IF NOT EXISTS ")
    .replace("CREATE INDEX ", "CREATE INDEX IF NOT EXISTS ")
    .replace("CREATE UNIQUE INDEX ", "CREATE UNIQUE INDEX IF NOT EXISTS ")
    for stmt in _SCHEMA[_SCHEMA.index("CREATE TABLE votes") :].split(";")
    if stmt.strip()
] + [
    "INSERT INTO votes (sample_id, annotator, class_id, skip_reason, created, import_id, origin) "
    "SELECT l.sample_id, l.annotator, l.class_id, l.skip_reason, l.created, l.import_id, "
    "'label history' FROM labels l WHERE l.id = (SELECT MAX(m.id) FROM labels m "
    "WHERE m.sample_id = l.sample_id AND m.annotator = l.annotator) AND NOT EXISTS (SELECT 1 "
    "FROM votes x WHERE x.sample_id = l.sample_id AND x.annotator = l.annotator) ORDER BY l.id",
]
# Version 3 -> 4: the annotation's own times and a deletion mark on ``votes`` (NULL for the
# answers already there) and the ``attention`` table (empty: version 3 refused such imports).
_V4_VOTE_COLUMNS = ("answered", "updated", "deleted")
_MIGRATE_V3 = [
    stmt.strip()
    .replace("CREATE TABLE ", "CREATE TABLE IF NOT EXISTS ")
    .replace("CREATE UNIQUE INDEX ", "CREATE UNIQUE INDEX IF NOT EXISTS ")
    for stmt in _SCHEMA[_SCHEMA.index("CREATE TABLE attention") :].split(";")
    if stmt.strip()
]


def _add_decided(c: sqlite3.Connection) -> None:
    """Add ``labels.decided`` (how a label came to be in force: ``agreed``, the policy's
    name, ``force``; NULL on older rows) where it is missing."""
    if "decided" not in {str(r[1]) for r in c.execute("PRAGMA table_info(labels)")}:
        c.execute("ALTER TABLE labels ADD COLUMN decided TEXT")


AUDIT = "audit"
"""The ``rounds.strategy`` of an audit round (``eada query --audit N``): uniformly random
samples for an accuracy estimate, outside the schedule of active rounds."""
BUSY_TIMEOUT_ENV = "EADA_BUSY_TIMEOUT"
DEFAULT_BUSY_TIMEOUT = 30.0
HOLDER_SUFFIX = ".writer"  # eada.sqlite.writer: who holds the write lock (pid, command, since)


class StoreError(ValueError):
    """A store that cannot be used as asked (missing, already there, wrong version, bad data)."""


class StoreBusyError(StoreError):
    """Another process held the store's write lock longer than the busy timeout."""


_INTERFACE = ["python"]  # "cli" once the `eada` command runs (eada.cli.main says so)


def set_interface(name: str) -> None:
    """Say who drives the store: ``"cli"`` (the ``eada`` command) or ``"python"`` (the
    default): messages then name the command, or the Python call, to run next."""
    if name not in ("cli", "python"):
        raise ValueError(f"interface must be 'cli' or 'python', got {name!r}")
    _INTERFACE[0] = name


def how(cli: str, python: str) -> str:
    """What to run, in the words of the interface in use, in backticks: the ``eada``
    command ``cli`` from the command line, the Python call ``python`` otherwise (a
    :class:`StoreError` raised in a notebook names the API call, not a command).

    Example:
        >>> how("eada train", "project.train()")
        '`project.train()`'
    """
    return f"`{cli}`" if _INTERFACE[0] == "cli" else f"`{python}`"


def q(path: object) -> str:
    """``path`` as one shell word (quoted where it holds a space or a shell character), for
    the commands messages print.

    >>> q("/data/my project"), q("/data/p")
    ("'/data/my project'", '/data/p')
    """
    return shlex.quote(str(path))


def busy_timeout() -> float:
    """Seconds to wait for another process's write lock: ``$EADA_BUSY_TIMEOUT`` or 30.

    Raises:
        StoreError: ``$EADA_BUSY_TIMEOUT`` is not a number >= 0.
    """
    raw = os.environ.get(BUSY_TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_BUSY_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise StoreError(f"{BUSY_TIMEOUT_ENV}={raw!r}: expected a number of seconds >= 0")
    return value


def _writable(path: Path) -> bool:
    """Whether this process may write the store file and its folder (WAL needs both)."""
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)


def pid_alive(pid: int) -> bool:
    """Whether a process with this id runs on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def translate_sqlite_error(err: sqlite3.Error, folder: Path) -> StoreError | None:
    """A :class:`StoreError` naming the store and what to do for an SQLite error a user can
    cause (read-only store, disk full, corrupt file), or ``None`` for anything else."""
    msg = str(err).lower()
    if "readonly" in msg or "read-only" in msg:
        return StoreError(
            f"the project store {folder} is read-only ({err}): "
            f"{how('eada status', 'project.status()')} and {how('eada export', 'project.export()')}"
            " read it; give this user write permission on the folder to change it"
        )
    if "disk is full" in msg or "disk i/o error" in msg:
        return StoreError(
            f"could not write the project store {folder} ({err}): free disk space and retry; "
            "the store keeps its last committed state"
        )
    if "not a database" in msg or "malformed" in msg or "file is encrypted" in msg:
        return StoreError(
            f"{folder / DB_NAME} is damaged or not an eada project store ({err}); restore it "
            "from a backup"
        )
    if "locked" in msg or "busy" in msg:
        return StoreBusyError(
            f"the project store {folder} is locked by another process ({err}); retry when it "
            f"has finished (or raise ${BUSY_TIMEOUT_ENV})"
        )
    return None


def check_creatable(folder: Path) -> None:
    """Raise :class:`StoreError` when a store that is not half-made (:func:`half_made`) is at
    ``folder``: ``eada init`` checks it before any work."""
    if (folder / DB_NAME).exists() and not half_made(folder):
        raise StoreError(f"a project store already exists at {folder}")


def remove_stale_tmp(*folders: Path) -> list[Path]:
    """Delete the temporary files (``.NAME.PID.tmp``) that killed processes left in ``folders``;
    those of a live process stay (it may be writing them now).

    Returns:
        The files removed.
    """
    removed = []
    for folder in folders:
        if not folder.is_dir():
            continue
        for f in folder.glob(".*.tmp"):
            pid_text = f.name[: -len(".tmp")].rsplit(".", 1)[-1]
            if pid_text.isdigit() and pid_alive(int(pid_text)):
                continue
            if not pid_text.isdigit() and time.time() - f.stat().st_mtime < 3600:
                continue  # an older eada's name without a pid: only when clearly abandoned
            try:
                f.unlink()
                removed.append(f)
            except OSError:
                pass
    return removed


_CONTENT_TABLES = ("samples", "labels", "votes", "rounds", "checkpoints", "imports")


def _half_made(conn: sqlite3.Connection) -> bool:
    """Whether the database behind ``conn`` is what an interrupted or failed ``eada init``
    left: no project config committed and no sample, label, vote, round, checkpoint or import
    in it (an empty file, or a schema without a registration, as eada before 0.x left when
    registering failed). Never true of a store that holds anything a user made."""
    names = {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "meta" in names and conn.execute("SELECT 1 FROM meta WHERE key = 'config'").fetchone():
        return False
    return not any(
        t in names and conn.execute(f"SELECT 1 FROM {t} LIMIT 1").fetchone()
        for t in _CONTENT_TABLES
    )


def half_made(folder: str | Path) -> bool:
    """Whether ``folder/eada.sqlite`` is a store that ``eada init`` left half-made (killed, or
    failed before this eada made init one transaction; :func:`_half_made`): ``eada init``
    replaces such a store without ``--force``, and every other command names it. ``False``
    when there is no such file, or it is not an SQLite database."""
    path = Path(folder) / DB_NAME
    if not path.is_file():
        return False
    try:
        conn = sqlite3.connect(path, isolation_level=None, timeout=1.0)
    except sqlite3.Error:
        return False
    try:
        return _half_made(conn)
    except sqlite3.Error:
        return False
    finally:
        conn.close()


def half_made_error(folder: Path) -> StoreError:
    """The error every command but ``eada init`` gives on a half-made store."""
    return StoreError(
        f"the project store {folder} is half-made: an `eada init` was interrupted or failed "
        "before it committed (no project config, no samples); create it again with "
        + how(f"eada init --store {q(folder)} ...", "eada.create_project(folder, config)")
        + " (it replaces the half-made store; nothing else is lost)"
    )


def now() -> str:
    """The current UTC time as ISO-8601 text."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


PRIVATE_DIR = 0o700
"""The mode of the folders a store creates (its own, ``checkpoints``, ``exports``): the store
holds annotator identities and their answers, so only the owner may read it."""
PRIVATE_FILE = 0o600
"""The mode of the files a store creates (its database, checkpoints, exported files)."""


def _create_private(path: Path) -> None:
    """Create the empty file ``path`` with mode :data:`PRIVATE_FILE` (whatever the umask)
    unless it exists; SQLite then opens it and gives its journal files the same mode."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
    except FileExistsError:
        return
    os.close(fd)


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
        '4'
    """

    def __init__(
        self,
        folder: str | Path,
        create: bool = False,
        timeout: float | None = None,
        _defer_schema: bool = False,
    ) -> None:
        self.folder = Path(folder)
        self.path = self.folder / DB_NAME
        self.timeout = busy_timeout() if timeout is None else float(timeout)
        self._depth = 0  # nesting of this object's write transactions (one BEGIN IMMEDIATE)
        if create:
            check_creatable(self.folder)
            self.folder.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
            _create_private(self.path)  # its -wal and -shm files take its mode
        elif not self.path.is_file():
            raise StoreError(
                f"no project store at {self.folder} (expected {self.path}); create one first with "
                + how(f"eada init --store {q(self.folder)}", "eada.create_project(folder, config)")
            )
        self.readonly = not create and not _writable(self.path)
        #: the schema version of a read-only store's file when it was upgraded in memory only
        #: (:meth:`migrate`), else ``None``
        self.upgraded_in_memory: int | None = None
        try:
            self.conn = self._connect()
            if _defer_schema:  # Store.creating: the caller's transaction creates it
                return
            if create:
                with self.transaction():
                    self._create_schema()
            self._check_version()
        except sqlite3.Error as err:
            if getattr(self, "conn", None) is not None:
                self.conn.close()
            raise translate_sqlite_error(err, self.folder) or StoreError(
                f"cannot open the project store {self.path}: {err}"
            ) from None
        if not self.readonly:
            (self.folder / "checkpoints").mkdir(mode=PRIVATE_DIR, exist_ok=True)
            remove_stale_tmp(self.folder / "checkpoints", self.folder / "exports")

    def _connect(self) -> sqlite3.Connection:
        if self.readonly:  # `eada status` on a store this user may not write
            uri = f"file:{self.path}?mode=ro"
            try:
                conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=self.timeout)
                conn.execute("SELECT 1 FROM meta LIMIT 1")
            except sqlite3.OperationalError:  # no -shm it may create: read the file as is
                uri = f"file:{self.path}?mode=ro&immutable=1"
                conn = sqlite3.connect(uri, uri=True, isolation_level=None)
            conn.row_factory = sqlite3.Row
            return conn
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=self.timeout)
        self.conn = conn
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        return conn

    @classmethod
    @contextmanager
    def creating(cls, folder: str | Path, timeout: float | None = None) -> Iterator[Store]:
        """A new store whose schema and everything the block writes commit in ONE write
        transaction (``eada init``: schema, registration and config): an error in the block,
        or a kill at any point, leaves no store. On an error the files this call made go too
        (the database, its ``-wal``/``-shm``, ``checkpoints/`` and a folder it created), so a
        failed init leaves nothing behind; a kill leaves an empty database that
        :func:`half_made` recognises and the next ``eada init`` replaces. A half-made store
        already there is replaced inside the same transaction.

        Raises:
            StoreError: a store (not a half-made one) is already at ``folder``.
        """
        folder = Path(folder)
        made = [p for p in (folder, *folder.parents) if not p.exists()]  # deepest first
        had_file = (folder / DB_NAME).exists()
        store = cls(folder, create=True, timeout=timeout, _defer_schema=True)
        try:
            try:
                with store.transaction():
                    store._create_schema()
                    yield store
            except sqlite3.Error as err:
                raise translate_sqlite_error(err, folder) or StoreError(
                    f"cannot create the project store {store.path}: {err}"
                ) from err
        except BaseException:
            store.close()
            if not had_file:
                for tail in ("", "-wal", "-shm", "-journal", HOLDER_SUFFIX):
                    Path(f"{store.path}{tail}").unlink(missing_ok=True)
            for p in [folder / "checkpoints", *made]:
                try:
                    p.rmdir()  # only if empty: a folder holding anything else stays
                except OSError:
                    pass
            raise
        (folder / "checkpoints").mkdir(mode=PRIVATE_DIR, exist_ok=True)

    def _create_schema(self) -> None:
        """The schema (inside the caller's write transaction); the tables of a half-made
        store at this path are dropped first (checked again under the write lock)."""
        left = [
            (str(r[0]), str(r[1]))
            for r in self.conn.execute(
                "SELECT type, name FROM sqlite_master WHERE type IN ('table', 'index') "
                "AND name NOT LIKE 'sqlite_%'"
            )
        ]
        if left:
            if not _half_made(self.conn):  # another init completed it meanwhile
                raise StoreError(f"a project store already exists at {self.folder}")
            for kind, name in left:
                if kind == "table":
                    self.conn.execute(f'DROP TABLE IF EXISTS "{name}"')
        for stmt in _SCHEMA.split(";"):
            if stmt.strip():
                self.conn.execute(stmt)
        self.set_meta("schema_version", str(SCHEMA_VERSION))
        self.set_meta("created", now())

    def _check_version(self) -> None:
        try:
            raw = self.get_meta("schema_version")
        except sqlite3.DatabaseError as err:
            try:
                if _half_made(self.conn):
                    raise half_made_error(self.folder) from None
            except sqlite3.Error:
                pass
            raise StoreError(f"{self.path} is not an eada project store: {err}") from None
        if raw is None:
            raise StoreError(f"{self.path} has no schema version: not an eada project store")
        try:
            version = int(raw)
        except ValueError:
            raise StoreError(
                f"{self.path}: schema_version {raw!r} in table meta is not an integer: the store "
                "was edited or damaged; restore it from a backup"
            ) from None
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"the store at {self.folder} was written by a newer eada (schema version "
                f"{version}; this eada reads up to version {SCHEMA_VERSION}): upgrade eada"
            )
        if version < SCHEMA_VERSION:
            self.migrate(version)
        has_index = self.conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'labels_one_first'"
        ).fetchone()
        if has_index is None and not self.readonly:
            try:
                self.conn.execute(_ONE_FIRST_LABEL)
            except sqlite3.Error:
                pass  # a store that already holds two first labels: opened as it is
        if not self.readonly:
            try:
                _add_decided(self.conn)  # a schema-4 store made before the column
            except sqlite3.OperationalError:
                pass  # another process added it meanwhile (or holds the lock: added later)

    def migrate(self, version: int) -> None:
        """Bring a store of an older schema ``version`` to :data:`SCHEMA_VERSION` in one
        transaction (nothing changes if it fails). Version 1 -> 2 adds skips: the labels table
        is rebuilt with every row kept (ids, corrections and imports included); 2 -> 3 adds
        ``votes`` (filled from the label history) and ``disputes``; 3 -> 4 adds the answers'
        own times and deletion mark (``votes``) and ``attention``.

        A store this user may not write is upgraded in memory only: its file is copied into an
        in-memory database (SQLite's backup API, one consistent snapshot), which is upgraded
        and read from; the file is not touched (:attr:`upgraded_in_memory` names the version
        it has), writes stay refused, and the next user who may write upgrades the file.
        """
        if self.readonly:
            memory = sqlite3.connect(":memory:", isolation_level=None)
            self.conn.backup(memory)
            self.conn.close()
            memory.row_factory = sqlite3.Row
            self.conn = memory
            memory.execute("PRAGMA foreign_keys=OFF")
            memory.execute("BEGIN")
            self._upgrade(memory, version)
            memory.execute("COMMIT")
            memory.execute("PRAGMA foreign_keys=ON")
            self.upgraded_in_memory = version
            return
        self.conn.execute("PRAGMA foreign_keys=OFF")  # the rebuild drops a referenced table
        try:
            with self.transaction() as c:
                if self.get_meta("schema_version") != str(version):
                    return  # another process upgraded it while this one waited for the lock
                self._upgrade(c, version)
        finally:
            self.conn.execute("PRAGMA foreign_keys=ON")

    def _upgrade(self, c: sqlite3.Connection, version: int) -> None:
        """The statements of :meth:`migrate`, inside the caller's transaction on ``c``
        (:attr:`conn`: the file's connection, or the in-memory copy of a read-only store)."""
        if version == 1:
            for stmt in _MIGRATE_V1:
                c.execute(stmt)
            try:
                c.execute(_ONE_FIRST_LABEL)
            except sqlite3.IntegrityError:
                pass  # a store that already holds two first labels: kept as it is
        if version <= 2:
            for stmt in _MIGRATE_V2:
                c.execute(stmt)
        if version <= 3:
            have = {str(r[1]) for r in c.execute("PRAGMA table_info(votes)")}
            for col in _V4_VOTE_COLUMNS:
                if col not in have:
                    c.execute(f"ALTER TABLE votes ADD COLUMN {col} TEXT")
            _add_decided(c)
            for stmt in _MIGRATE_V3:
                c.execute(stmt)
        bad = c.execute("PRAGMA foreign_key_check").fetchall()
        if bad:
            raise StoreError(f"{self.path}: upgrade refused, broken references {bad[:3]}")
        self.set_meta("schema_version", str(SCHEMA_VERSION))  # c is self.conn in both paths

    def close(self) -> None:
        """Close the database connection."""
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT``; rolls back on any exception.

        Waits up to :attr:`timeout` seconds for another process's write lock, then raises
        :class:`StoreBusyError` naming the holder. SQLite errors a user can cause (read-only
        store, disk full, damaged file) become a :class:`StoreError` naming the store.
        """
        self.check_writable()
        if self._depth:  # inside this store's own write transaction: part of it, one commit
            self._depth += 1
            try:
                yield self.conn
            finally:
                self._depth -= 1
            return
        self._begin()
        self._depth = 1
        try:
            yield self.conn
            self._release_holder()
            self.conn.execute("COMMIT")
        except BaseException as err:
            self._release_holder()
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            if isinstance(err, sqlite3.DatabaseError) and not isinstance(
                err, sqlite3.IntegrityError
            ):
                mapped = translate_sqlite_error(err, self.folder)
                if mapped is not None:
                    raise mapped from err
            raise
        finally:
            self._depth = 0

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """One read transaction: every query in the block sees the store as it was at its
        first read, whatever other processes commit meanwhile (WAL readers are not blocked
        and do not block writers). Exports and reports read through it, so their files agree
        with each other."""
        if self.conn.in_transaction:  # already inside one (a write transaction): the same view
            yield self.conn
            return
        self.conn.execute("BEGIN DEFERRED")
        try:
            self.conn.execute("SELECT 1 FROM meta LIMIT 1").fetchone()  # the snapshot starts
            yield self.conn
        finally:
            if self.conn.in_transaction:
                self.conn.execute("COMMIT")

    def check_writable(self) -> None:
        """Raise :class:`StoreError` when this process may not write the store."""
        if self.readonly:
            raise StoreError(
                f"the project store {self.folder} is read-only for this user: "
                f"{how('eada status', 'project.status()')} and "
                f"{how('eada export', 'project.export()')} read it; give write permission on the "
                "folder to change it"
            )

    @property
    def holder_path(self) -> Path:
        """``eada.sqlite.writer``: the process in a write transaction (pid, command, since)."""
        return self.path.with_name(self.path.name + HOLDER_SUFFIX)

    def _begin(self) -> None:
        t0 = time.monotonic()
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) and "busy" not in str(err):
                raise translate_sqlite_error(err, self.folder) or err from None
            raise StoreBusyError(
                f"the project store {self.folder} is locked: {self.lock_holder()} has held its "
                f"write lock for more than {time.monotonic() - t0:.0f} s. Nothing was changed; "
                f"retry when it has finished, or set ${BUSY_TIMEOUT_ENV}=SECONDS to wait longer"
            ) from None
        if self.readonly:
            return
        try:  # written and removed only while this process holds the lock
            self.holder_path.write_text(
                json.dumps({"pid": os.getpid(), "command": " ".join(sys.argv), "since": now()})
            )
        except OSError:
            pass  # only a courtesy for the busy message

    def _release_holder(self) -> None:
        if not self.readonly:
            try:
                self.holder_path.unlink()
            except OSError:
                pass

    def lock_holder(self) -> str:
        """Who holds the write lock, as far as the store can tell (for the busy message)."""
        try:
            info = json.loads(self.holder_path.read_text())
            pid = int(info["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            info, pid = None, 0
        if info is not None and pid_alive(pid):
            return f"process {pid} ({info.get('command', '?')}, since {info.get('since', '?')})"
        return (
            "a process outside eada (e.g. an sqlite3 shell, a backup or sync tool with "
            f"{self.path.name} open)"
        )

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
        """Sample rows of one role (``source``/``target``/``heldout``) in position order
        (target files that vanished, left out by ``eada target scan``, hold a negative
        position and are not among them)."""
        return list(
            self.conn.execute(
                "SELECT * FROM samples WHERE role = ? AND position >= 0 ORDER BY position",
                (role,),
            )
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

    def answers(self) -> list[sqlite3.Row]:
        """The answer in force for every answered target sample: its label row or its skip
        row (``class_id`` NULL, ``skip_reason`` set; ``class_name`` NULL), ordered by sample
        id."""
        return list(
            self.conn.execute(
                "SELECT l.*, s.position AS position, c.name AS class_name FROM labels l "
                "JOIN samples s ON s.id = l.sample_id LEFT JOIN classes c ON c.id = l.class_id "
                "WHERE NOT EXISTS (SELECT 1 FROM labels n WHERE n.supersedes = l.id) "
                "ORDER BY l.sample_id"
            )
        )

    def current_skips(self) -> list[sqlite3.Row]:
        """The skips in force (samples marked unusable that no later label undid)."""
        return [r for r in self.answers() if r["class_id"] is None]

    def rounds(self) -> list[sqlite3.Row]:
        """Round rows in order."""
        return list(self.conn.execute("SELECT * FROM rounds ORDER BY number"))

    def active_rounds(self) -> list[sqlite3.Row]:
        """The rounds of the schedule (every round but the audit rounds), in order."""
        return [r for r in self.rounds() if r["strategy"] != AUDIT]

    def audit_rounds(self) -> list[sqlite3.Row]:
        """The audit rounds (``eada query --audit N``), in order."""
        return [r for r in self.rounds() if r["strategy"] == AUDIT]

    def audit_sample_ids(self) -> set[int]:
        """The samples drawn by any audit round (labeled or not)."""
        return {
            int(r[0])
            for r in self.conn.execute(
                "SELECT rs.sample_id FROM round_samples rs JOIN rounds r ON r.id = rs.round_id "
                "WHERE r.strategy = ? AND rs.rank IS NOT NULL",
                (AUDIT,),
            )
        }

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
