"""The project store under concurrent use, and one clear error (exit 2, store unchanged) for
every bad input a user can cause. The overlapping cases are forced, not left to timing: a
barrier holds every writer at ``BEGIN IMMEDIATE`` until all of them have done their reads, or
a second connection holds the write lock."""

from __future__ import annotations

import csv
import errno
import json
import os
import shutil
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from eada.cli import main
from eada.hparams import preset_config
from eada.store import Project, StoreError, init_project
from eada.store import db as store_db
from eada.store import project as store_project
from eada.store.labelfiles import csv_safe
from support import flat as _flat
from support import truth_rows

TOY = [
    "data.n_per_class=60",
    "train.epochs=3",
    "active.rounds_at=[1,2]",
    "active.budget_per_round=5",
]


def _dump(folder: Path) -> list[str]:
    """The whole database as SQL: equal dumps = an unchanged store."""
    with sqlite3.connect(folder / "eada.sqlite") as c:
        return list(c.iterdump())


def _count(folder: Path, table: str) -> int:
    with sqlite3.connect(folder / "eada.sqlite") as c:
        return int(c.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


@pytest.fixture
def queried(tmp_path: Path) -> tuple[Path, list[dict[str, Any]], list[str]]:
    """A toy project (closed) with one open round of 10 samples: folder, export rows with the
    true class names filled in, class names."""
    proj = init_project(tmp_path / "p", preset_config("toy", "eada", 0, TOY))
    out = proj.query(budget=10)
    rows = truth_rows(proj, out["files"]["csv"])
    classes = list(proj.classes)
    proj.close()
    return tmp_path / "p", rows, classes


def _gate_writers(monkeypatch: pytest.MonkeyPatch, n: int) -> threading.Barrier:
    """Every write transaction waits at BEGIN IMMEDIATE until ``n`` have arrived: all their
    reads before the transaction are done before any of them writes."""
    barrier = threading.Barrier(n, timeout=60)
    real = store_db.Store._begin

    def begin(self: store_db.Store) -> None:
        barrier.wait()
        real(self)

    monkeypatch.setattr(store_db.Store, "_begin", begin)
    return barrier


def _in_threads(fns: list[Any]) -> list[Any]:
    out: list[Any] = [None] * len(fns)

    def run(i: int) -> None:
        try:
            out[i] = fns[i]()
        except Exception as err:  # returned to the test
            out[i] = err

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def test_concurrent_conflicting_imports_leave_one_label_in_force(queried, monkeypatch) -> None:
    folder, rows, classes = queried
    other = [{**r, "label": next(c for c in classes if c != r["label"])} for r in rows]
    a, b = folder.parent / "a.csv", folder.parent / "b.csv"
    _write_csv(a, rows)
    _write_csv(b, other)
    _gate_writers(monkeypatch, 2)

    def importer(path: Path, who: str) -> Any:
        def go() -> dict[str, Any]:
            p = Project(folder)
            try:
                return p.import_labels(path, annotator=who)
            finally:
                p.close()

        return go

    res = _in_threads([importer(a, "alice"), importer(b, "bob")])
    # the second writer saw the first's labels: its differing answers contradict another
    # annotator's labels in force, so each is a dispute (both named) instead of winning
    # silently; the first writer's labels stay in force
    assert all(isinstance(r, dict) for r in res), res
    first = a if res[0]["new"] == 10 else b
    (second,) = [r for r in res if r["new"] == 0]
    assert res[0 if first == a else 1]["new"] == 10 and second["corrections"] == 0
    expected = {int(r["sample_id"]): r["label"] for r in (rows if first == a else other)}
    p = Project(folder)
    current = p.store.current_labels()
    assert {r["sample_id"]: r["class_name"] for r in current} == expected
    st = p.status()
    assert st["n_labeled"] == 10 and st["corrections"] == 0
    assert sorted(d["sample_id"] for d in st["disputes"]) == sorted(expected)
    assert all(set(d["answers"]) == {"alice", "bob"} for d in st["disputes"])
    assert st["rounds"][0]["labeled"] == 10 and st["rounds"][0]["pending"] == 0
    files = p.export(folder.parent / "out")
    p.close()
    with open(files["labels.csv"], newline="") as fh:
        assert len(list(csv.DictReader(fh))) == 10
    # the database itself refuses a second first label for a sample, whatever a writer does
    with sqlite3.connect(folder / "eada.sqlite") as c, pytest.raises(sqlite3.IntegrityError):
        c.execute(
            "INSERT INTO labels (sample_id, class_id, annotator, created, source) "
            "VALUES (?, 0, 'x', 'now', 'human')",
            (current[0]["sample_id"],),
        )


def test_concurrent_queries_one_round_no_unused_checkpoint(tmp_path: Path, monkeypatch) -> None:
    folder = tmp_path / "p"
    init_project(folder, preset_config("toy", "eada", 0, TOY)).close()
    _gate_writers(monkeypatch, 2)

    def querier() -> dict[str, Any]:
        p = Project(folder)
        try:
            return p.query(budget=5, export=False)
        finally:
            p.close()

    res = _in_threads([querier, querier])
    ok = [r for r in res if isinstance(r, dict)]
    lost = [r for r in res if isinstance(r, Exception)]
    assert len(ok) == 1 and ok[0]["round"] == 1 and len(lost) == 1, res
    assert isinstance(lost[0], StoreError) and "nothing was recorded" in str(lost[0])
    assert _count(folder, "rounds") == 1
    with sqlite3.connect(folder / "eada.sqlite") as c:
        recorded = {r[0] for r in c.execute("SELECT path FROM checkpoints")}
    on_disk = {f"checkpoints/{f.name}" for f in (folder / "checkpoints").iterdir()}
    assert on_disk == recorded and len(recorded) == 1  # the loser's checkpoint is gone


def test_write_lock_held_too_long_names_the_holder(queried, monkeypatch, capsys) -> None:
    folder, rows, _ = queried
    f = folder.parent / "l.csv"
    _write_csv(f, rows)
    monkeypatch.setenv("EADA_BUSY_TIMEOUT", "0.3")
    before = _dump(folder)
    blocker = sqlite3.connect(folder / "eada.sqlite", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        t0 = time.monotonic()
        assert main(["label", "import", str(f), "--store", str(folder)]) == 2
        assert time.monotonic() - t0 < 10
        err = capsys.readouterr().err
        assert err.startswith("error: the project store") and "Traceback" not in err
        assert "is locked" in err and "outside eada" in err and "EADA_BUSY_TIMEOUT" in err
        # an eada process that holds it is named (pid and command)
        (folder / "eada.sqlite.writer").write_text(
            json.dumps({"pid": os.getpid(), "command": "eada train --store p", "since": "t"})
        )
        assert main(["label", "import", str(f), "--store", str(folder)]) == 2
        assert f"process {os.getpid()} (eada train --store p, since t)" in capsys.readouterr().err
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert _dump(folder) == before
    monkeypatch.setenv("EADA_BUSY_TIMEOUT", "soon")
    assert main(["status", "--store", str(folder)]) == 2
    assert "EADA_BUSY_TIMEOUT='soon'" in capsys.readouterr().err
    monkeypatch.delenv("EADA_BUSY_TIMEOUT")
    assert main(["label", "import", str(f), "--store", str(folder)]) == 0
    assert not (folder / "eada.sqlite.writer").exists()


def _refused(argv: list[str], folder: Path, match: str, capsys) -> str:
    """``argv`` exits 2 with one ``error:`` line containing ``match``; the store is unchanged."""
    before = _dump(folder)
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    said = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    assert len(said) == 1 and "Traceback" not in err, err  # progress lines may come before
    assert match in lines[said[0]], err
    assert _dump(folder) == before
    return lines[said[0]]


def test_bad_label_files_are_one_clear_error(queried, capsys) -> None:
    folder, rows, _ = queried
    tmp = folder.parent
    s = ["--store", str(folder)]
    deep = tmp / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    _refused(["label", "import", str(deep), *s], folder, "nested too deeply", capsys)
    big = tmp / "big.json"
    big.write_text(json.dumps([{"sample_id": 1e20, "label": rows[0]["label"]}]))
    _refused(["label", "import", str(big), *s], folder, "sample_id 100000000000000000000", capsys)
    _write_csv(tmp / "big.csv", [{**rows[0], "sample_id": "-3"}])
    _refused(["label", "import", str(tmp / "big.csv"), *s], folder, "no sign", capsys)
    ls = tmp / "ls.json"
    sid = int(rows[0]["sample_id"])
    ls.write_text(json.dumps([{"data": {"sample_id": sid}, "annotations": [{"result": [7]}]}]))
    assert main(["label", "import", str(ls), *s]) == 0  # no choice: an empty submission
    assert f"sample {sid} needs attention: an empty submission" in _flat(capsys.readouterr().out)
    ls.write_text(
        json.dumps([{"data": {}, "annotations": [{"result": [{"type": "choices", "value": []}]}]}])
    )
    _refused(["label", "import", str(ls), *s], folder, "exactly one choice", capsys)


def test_reimport_and_header_only_csv_are_no_ops(queried, capsys) -> None:
    folder, rows, _ = queried
    f = folder.parent / "l.csv"
    _write_csv(f, rows)
    s = ["--store", str(folder)]
    assert main(["label", "import", str(f), *s]) == 0
    assert _count(folder, "imports") == 1
    before = _dump(folder)
    assert main(["label", "import", str(f), *s]) == 0
    assert "0 new, 0 corrections, 0 skipped, 10 unchanged" in " ".join(
        capsys.readouterr().out.split()
    )
    h = folder.parent / "h.csv"
    h.write_text("sample_id,label\n")
    assert main(["label", "import", str(h), *s]) == 0
    assert _dump(folder) == before  # no imports row, nothing


def test_damaged_and_edited_stores(queried, tmp_path: Path, capsys) -> None:
    folder, _, _ = queried
    for name, damage in (
        ("trunc", lambda b: b[:3000]),
        ("half", lambda b: b[: len(b) // 2]),
        ("random", lambda b: np.random.default_rng(0).bytes(len(b))),
    ):
        copy = tmp_path / name
        shutil.copytree(folder, copy)
        db = copy / "eada.sqlite"
        db.write_bytes(damage(db.read_bytes()))
        for extra in ("eada.sqlite-wal", "eada.sqlite-shm"):
            (copy / extra).unlink(missing_ok=True)
        assert main(["status", "--store", str(copy)]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "Traceback" not in err
        assert "damaged or not an eada project store" in err, (name, err)
    with sqlite3.connect(folder / "eada.sqlite") as c:
        c.execute("UPDATE meta SET value = 'abc' WHERE key = 'schema_version'")
    _refused(["status", "--store", str(folder)], folder, "schema_version 'abc'", capsys)


def test_read_only_store_status_works_writes_refused(queried, monkeypatch, capsys) -> None:
    folder, rows, _ = queried
    f = folder.parent / "l.csv"
    _write_csv(f, rows)
    # root may write anything; the store opens read-only exactly when this says it may not
    monkeypatch.setattr(store_db, "_writable", lambda path: False)
    before = sorted(p.name for p in (folder / "checkpoints").iterdir())
    assert main(["status", "--store", str(folder), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rounds"][0]["pending"] == 10
    _refused(["label", "import", str(f), "--store", str(folder)], folder, "read-only", capsys)
    _refused(["query", "--store", str(folder), "--budget", "3"], folder, "read-only", capsys)
    _refused(["train", "--store", str(folder), "--epochs", "1"], folder, "read-only", capsys)
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == before


def test_disk_full_leaves_no_temporary_file(queried, monkeypatch, capsys) -> None:
    folder, rows, _ = queried

    def full_save(obj: Any, fh: Any, *a: Any, **k: Any) -> None:
        fh.write(b"half a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_save)
    before = sorted((folder / "checkpoints").iterdir())
    _refused(["train", "--store", str(folder), "--epochs", "1"], folder, "no space left", capsys)
    assert sorted((folder / "checkpoints").iterdir()) == before
    # SQLite's own "database or disk is full" (a page limit stands in for the disk)
    real = store_db.Store._connect

    def capped(self: store_db.Store) -> sqlite3.Connection:
        conn = real(self)
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")
        return conn

    monkeypatch.setattr(store_db.Store, "_connect", capped)
    f = folder.parent / "l.csv"
    _write_csv(f, [{**r, "label": "", "skip": "x" * 20_000} for r in rows])  # a long reason
    _refused(["label", "import", str(f), "--store", str(folder)], folder, "free disk space", capsys)


def test_export_checkpoint_and_unexpected_errors(queried, monkeypatch, tmp_path, capsys) -> None:
    folder, _, _ = queried
    s = ["--store", str(folder)]
    existing = tmp_path / "file.txt"
    existing.write_text("keep me")
    _refused(["export", *s, "--out", str(existing)], folder, "is an existing file", capsys)
    assert existing.read_text() == "keep me"
    # a checkpoint holding a pickle payload (its SHA-256 updated): refused, never run
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.makedirs, (str(marker),))

    with sqlite3.connect(folder / "eada.sqlite") as c:
        rel = c.execute("SELECT path FROM checkpoints ORDER BY id DESC").fetchone()[0]
        torch.save({"model": Payload()}, folder / rel)
        sha = store_project._file_sha256(folder / rel)
        c.execute("UPDATE checkpoints SET sha256 = ? WHERE path = ?", (sha, rel))
    out = tmp_path / "out"
    _refused(["export", *s, "--out", str(out)], folder, "cannot be loaded as tensors", capsys)
    assert not marker.exists() and not (out / "model.pt").exists()
    # a bug: its traceback goes to a log file the message names (exit 1)
    monkeypatch.setenv("EADA_LOG_DIR", str(tmp_path / "logs"))

    def broken(self: Project) -> dict[str, Any]:
        raise KeyError("boom")

    monkeypatch.setattr(Project, "status", broken)
    assert main(["status", *s]) == 1
    err = capsys.readouterr().err
    logs = list((tmp_path / "logs").iterdir())
    assert len(logs) == 1 and str(logs[0]) in err and "unexpected KeyError" in err
    text = logs[0].read_text()
    assert "Traceback" in text and "KeyError: 'boom'" in text and text.startswith("eada status")


def test_stale_temporary_files_are_removed_on_open(queried) -> None:
    folder, _, _ = queried
    ck = folder / "checkpoints"
    dead = ck / ".epoch-e0001-x.pt.999999999.tmp"  # above any pid_max: no such process
    live = ck / f".epoch-e0001-y.pt.{os.getpid()}.tmp"
    old = ck / ".train-e0002-z.pt.tmp"  # an older eada's name, without a pid
    fresh = ck / ".train-e0002-w.pt.tmp"
    export = folder / "exports" / ".round-001.csv.999999999.tmp"
    for f in (dead, live, old, fresh, export):
        f.write_bytes(b"partial")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    Project(folder).close()
    assert not dead.exists() and not old.exists() and not export.exists()
    assert live.exists() and fresh.exists()


def test_csv_exports_neutralise_formulas(queried) -> None:
    folder, rows, _ = queried
    evil = ['=HYPERLINK("http://x","y")', "+1+1", "-2+3", "@SUM(A1)", "\tx", "\rx", "ok"]
    f = folder.parent / "l.csv"
    _write_csv(f, [{**r, "annotator": evil[i % len(evil)]} for i, r in enumerate(rows)])
    p = Project(folder)
    p.import_labels(f)
    files = p.export(folder.parent / "out")
    p.close()
    with open(files["labels.csv"], newline="") as fh:
        got = [r["annotator"] for r in csv.DictReader(fh)]
    assert set(got) == {"'" + e for e in evil[:4]} | {"x", "ok"}  # tab, CR: stripped on import
    assert all(not a.startswith(("=", "+", "-", "@", "\t", "\r")) for a in got)
    assert csv_safe("\tx") == "'\tx" and csv_safe("\rx") == "'\rx" and csv_safe("'=x") == "'=x"
    assert csv_safe(-1.5) == -1.5
    # the exported file imports back unchanged (the quote is dropped again)
    p = Project(folder)
    out = p.import_labels(files["labels.csv"])
    p.close()
    assert (out["new"], out["corrections"], out["unchanged"]) == (0, 0, 10)


def test_config_and_plan_decisions(capsys) -> None:
    assert main(["run", "toy", "--set", "optim.lr=inf", "--dry-run"]) == 2
    assert "optim.lr" in capsys.readouterr().err
    argv = ["run", "toy", "--method", "random", "--set", "active.budget_per_round=600"]
    assert main([*argv, "--dry-run"]) == 2
    assert "larger than the unlabeled pool" in capsys.readouterr().err
    assert main(["run", "toy", "--dry-run"]) == 0
    assert "fits the target pool (1000 samples" in " ".join(capsys.readouterr().out.split())


# -- inputs beyond the store --------------------------------------------------------------------
def _folder(root: Path, classes: tuple[str, ...], n: int = 2) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(n):
            px = rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)
            Image.fromarray(px).save(root / c / f"{i}.png")
    return root


def test_image_lists_are_confined_to_their_folder(tmp_path: Path, capsys) -> None:
    data = _folder(tmp_path / "data" / "src", ("a", "b"))
    _folder(tmp_path / "elsewhere", ("a",), n=1)
    lst = tmp_path / "data" / "tgt.txt"
    lst.write_text(
        f"# class 0 a\n# class 1 b\nsrc/a/0.png 0\n../elsewhere/a/0.png 0\n"
        f"{tmp_path}/elsewhere/a/0.png 1\n"
    )
    argv = ["data", "check", str(data), str(lst)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "2 image path(s) outside" in err
    assert "line 4: ../elsewhere/a/0.png" in err and "line 5:" in err and "line 3" not in err
    assert main([*argv, "--allow-outside-root"]) == 0
    assert "OK" in capsys.readouterr().out
    # `eada run --dry-run` refuses the list too (it is at hand, and bad), as the run would
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        f"data: {{kind: images, source: {data}, target: {lst}}}\n"
        "model: {name: backbone, weights: none}\n"
    )
    assert main(["run", str(cfg), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "2 image path(s) outside" in err


def test_target_lacking_source_classes_is_allowed_and_reported(tmp_path: Path, capsys) -> None:
    from eada.config import ImageListData, ModelConfig
    from eada.data.tasks import load_task

    src = _folder(tmp_path / "src", ("bike", "cup", "mug"))
    tgt = _folder(tmp_path / "tgt", ("bike", "mug"))
    assert main(["data", "check", str(src), str(tgt)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "target lacks 1 of the source's 3 classes (cup)" in out and "OK" in out
    cfg = ImageListData(source=src, target=tgt, workers=0)
    with pytest.warns(UserWarning, match=r"no samples of 1 of the 3 classes \(cup\)"):
        task = load_task(cfg, 0, ModelConfig(name="backbone", weights="none"))
        task.check()
    assert task.target.classes == ["bike", "cup", "mug"]
    assert sorted(set(task.target.y.tolist())) == [0, 2]  # mug keeps the source's id 2
    assert task.notes["target_missing_classes"] == ["cup"]
    (tgt / "pan").mkdir()  # a class the source lacks stays an error
    (tgt / "pan" / "0.png").write_bytes((tgt / "mug" / "0.png").read_bytes())
    assert main(["data", "check", str(src), str(tgt)]) == 2
    assert "only in target: pan" in " ".join(capsys.readouterr().out.split())


def test_feature_files_name_the_file_and_key(tmp_path: Path) -> None:
    from eada.data.features import read_feature_file

    x = np.ones((4, 3), dtype=np.float32)
    f = tmp_path / "s.npz"
    np.savez(f, features=x, labels=np.array(["cat", "dog", "cat", "dog"]))
    with pytest.raises(ValueError, match=r"s\.npz: labels 'labels' are <U3 values"):
        read_feature_file(f)
    np.savez(f, features=x)
    with pytest.raises(ValueError, match=r"s\.npz: no labels found"):
        read_feature_file(f)
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    p = tmp_path / "t.parquet"
    table = pa.table({"label": [0, 1, 0, 1], "f0": [1.0, 2.0, 3.0, 4.0], "name": list("abcd")})
    pq.write_table(table, p)
    with pytest.raises(ValueError, match=r"t\.parquet: .*not numeric: 'name' \(string\)"):
        read_feature_file(p)
    pq.write_table(pa.table({"label": list("abcd"), "f0": [1.0, 2.0, 3.0, 4.0]}), p)
    with pytest.raises(ValueError, match=r"t\.parquet: labels 'label' are object values"):
        read_feature_file(p)
    p.write_bytes(b"PAR1 not really")
    with pytest.raises(ValueError, match=r"t\.parquet: .*[Pp]arquet"):
        read_feature_file(p)


def test_killed_checkpoint_write_leaves_a_tmp_file_the_next_open_removes(queried) -> None:
    import signal
    import subprocess
    import sys

    folder, _, _ = queried
    env = {**os.environ, "EADA_CRASH_AT": "checkpoint:tmp_written"}
    argv = [sys.executable, "-m", "eada.cli", "train", "--store", str(folder), "--epochs", "1"]
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == -signal.SIGKILL, run.stderr
    left = list((folder / "checkpoints").glob(".*.tmp"))
    assert len(left) == 1 and left[0].name.endswith(".tmp")
    before = _dump(folder)
    Project(folder).close()
    assert not left[0].exists() and _dump(folder) == before


def test_concurrent_training_records_one_segment(queried, monkeypatch) -> None:
    folder, _, _ = queried
    _gate_writers(monkeypatch, 2)

    def trainer() -> dict[str, Any]:
        p = Project(folder)
        try:
            return p.train(epochs=1)
        finally:
            p.close()

    res = _in_threads([trainer, trainer])
    ok = [r for r in res if isinstance(r, dict)]
    lost = [r for r in res if isinstance(r, Exception)]
    assert len(ok) == 1 and len(lost) == 1 and isinstance(lost[0], StoreError), res
    assert "records nothing more" in str(lost[0])
    with sqlite3.connect(folder / "eada.sqlite") as c:
        recorded = {r[0] for r in c.execute("SELECT path FROM checkpoints")}
        kinds = [r[0] for r in c.execute("SELECT kind FROM checkpoints ORDER BY id")]
    assert kinds == ["query", "train"]
    assert {f"checkpoints/{f.name}" for f in (folder / "checkpoints").iterdir()} == recorded
