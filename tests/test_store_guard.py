"""The store's own files are never an output: every command that writes files refuses an
``--out`` that is the store's database, its ``-wal``/``-shm``/``-journal`` (also through a
symlink or a hard link) or a folder holding a store, before any work, and the store stays
byte for byte as it was."""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path

import pytest

from eada.cli import main
from eada.runs import (
    StoreFileError,
    append_jsonl,
    check_not_store,
    staged_folder,
    write_bytes_atomic,
)
from eada.store.db import Store


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """An empty project store (closed: no -wal or -shm beside it)."""
    folder = tmp_path / "P"
    Store(folder, create=True).close()
    return folder


def _digest(folder: Path) -> str:
    return hashlib.sha256((folder / "eada.sqlite").read_bytes()).hexdigest()


def _intact(folder: Path) -> None:
    with sqlite3.connect(folder / "eada.sqlite") as c:
        assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert c.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    Store(folder).close()


@pytest.mark.parametrize("tail", ["", "-wal", "-shm", "-journal"])
def test_report_onto_the_store_files_is_refused(
    store: Path, tail: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _digest(store)
    target = store / f"eada.sqlite{tail}"
    existed = target.exists()
    assert main(["report", str(store), "--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out ") and "project store's own file" in err
    assert _digest(store) == before
    assert target.exists() == existed  # no -journal made, no -wal replaced
    _intact(store)


def test_links_and_folders_are_refused(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _digest(store)
    soft = tmp_path / "report.html"
    soft.symlink_to(store / "eada.sqlite-wal")  # dangling: the WAL appears while a writer is on
    hard = tmp_path / "copy.html"
    os.link(store / "eada.sqlite", hard)
    dirlink = tmp_path / "outdir"
    dirlink.symlink_to(store)
    cases = [
        (["report", str(store), "--out", str(soft)], "through a symlink"),
        (["report", str(store), "--out", str(hard)], "is an SQLite database"),
        (["report", str(store), "--out", str(dirlink / "eada.sqlite")], "own file"),
        (["export", "--store", str(store), "--out", str(store)], "folder holding a project"),
        (["export", "--store", str(store), "--out", str(dirlink), "--force"], "folder holding"),
        (["report", str(store), "--figures", str(store)], "--figures"),
        (["data", "index", str(tmp_path), "--out", str(store / "eada.sqlite")], "own file"),
        (["data", "features", "x.yaml", "--out", str(store / "eada.sqlite-wal")], "own file"),
        (["bench", "toy", "--methods", "eada", "--out", str(store)], "folder holding"),
        (["run", "toy", "--out", str(dirlink)], "folder holding"),
        (["demo", "--out", str(store)], "folder holding"),
    ]
    for argv, says in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: --"), (argv, err)
        assert says in err, (argv, err)
    assert _digest(store) == before
    assert hard.read_bytes() == (store / "eada.sqlite").read_bytes()
    assert not (store / "eada.sqlite-wal").exists() or soft.is_symlink()
    _intact(store)


def test_every_writer_checks_it(store: Path) -> None:
    """The writers under the commands refuse too (a Python caller, a path the CLI never saw)."""
    before = _digest(store)
    with pytest.raises(StoreFileError, match="own file"):
        write_bytes_atomic(store / "eada.sqlite", b"<html>")
    with pytest.raises(StoreFileError, match="own file"):
        append_jsonl(store / "eada.sqlite-journal", {"a": 1})
    with pytest.raises(StoreFileError, match="folder holding"):
        with staged_folder(store):
            pass
    from eada.reports.project import build_project_report

    with pytest.raises(StoreFileError):
        build_project_report(store, store / "eada.sqlite")
    assert _digest(store) == before
    assert not (store / "eada.sqlite-journal").exists()
    check_not_store(store / "report.html")  # the default report beside the store is fine
    check_not_store(store / "final")  # so is a new export folder inside it
