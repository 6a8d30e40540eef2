"""Skipped samples on every label route (CSV ``skip`` column, Label Studio JSON, Python
records), ``eada train --partial``, honest pending/labeled/skipped counts, annotator
conflicts, and the migration of a schema-1 store (toy data: seconds)."""

from __future__ import annotations

import csv
import json
import sqlite3
from pathlib import Path

import pytest

import eada
from eada.cli import main
from eada.store import Project
from eada.store.db import SCHEMA_VERSION
from support import flat as _flat
from support import toy_project


@pytest.fixture
def proj(tmp_path: Path) -> Project:
    """A toy project trained to round 1, with round 1 (5 samples) queried."""
    return toy_project(tmp_path, 5)


def _rows(p: Project, number: int = 1) -> list[dict]:
    with open(p.folder / "exports" / f"round-{number:03d}.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def _truth(p: Project, row: dict) -> str:
    return p.classes[int(p.task.target.y[int(row["index"])])]


def _write(path: Path, rows: list[dict]) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def test_csv_skip_partial_train_and_counts(proj: Project, tmp_path: Path, capsys) -> None:
    s = ["--store", str(proj.folder)]
    rows = _rows(proj)
    assert list(rows[0])[-3:] == ["label", "annotator", "skip"]
    rows[0]["label"] = _truth(proj, rows[0])  # one labeled, seven... here 4 await an answer
    _write(tmp_path / "one.csv", rows)
    assert main(["label", "import", str(tmp_path / "one.csv"), *s]) == 0
    assert "1 new, 0 corrections, 0 skipped" in _flat(capsys.readouterr().out)
    # the re-export counts right and shows the label in force
    assert main(["query", *s]) == 0
    out = _flat(capsys.readouterr().out)
    assert "round 1: 4 of its 5 samples still await an answer (1 labeled, 0 skipped)" in out
    again = _rows(proj)
    assert again[0]["label"] == rows[0]["label"] and not again[1]["label"]
    # training refuses while answers are pending, and says how many; --partial trains anyway
    assert main(["train", *s]) == 2
    err = _flat(capsys.readouterr().err)
    assert "awaits an answer for 4 of its 5 samples (1 labeled, 0 skipped)" in err
    assert "--partial" in err
    assert main(["train", *s, "--partial"]) == 0
    assert Project(proj.folder).status()["epoch"] == 2 and "with 1 target labels" in _flat(
        capsys.readouterr().out
    )
    assert main(["train", *s, "--partial"]) == 2  # nothing more to train before answers
    capsys.readouterr()
    # a skip column with a reason: the sample is answered, not labeled
    for r in again[1:]:
        r["label"] = _truth(proj, r)
    again[4]["label"], again[4]["skip"] = "", "blurred"
    _write(tmp_path / "rest.csv", again)
    assert main(["label", "import", str(tmp_path / "rest.csv"), *s]) == 0
    assert "3 new, 0 corrections, 1 skipped, 1 unchanged; 0 queried samples await" in _flat(
        capsys.readouterr().out
    )
    st = Project(proj.folder).status()
    assert st["n_labeled"] == 4 and st["n_skipped"] == 1
    assert st["skipped_by_reason"] == {"blurred": 1}
    assert st["rounds"][0]["pending"] == 0 and st["rounds"][0]["skipped"] == 1
    assert main(["status", *s]) == 0
    assert "skipped by reason: blurred: 1" in _flat(capsys.readouterr().out)
    # the skipped sample leaves the pool: round 2 never scores it
    p = Project(proj.folder)
    p.query()
    skipped_id = int(again[4]["sample_id"])
    r2 = p.store.rounds()[1]["id"]
    in_pool = p.store.conn.execute(
        "SELECT COUNT(*) FROM round_samples WHERE round_id = ? AND sample_id = ?", (r2, skipped_id)
    ).fetchone()[0]
    assert in_pool == 0
    # a later label undoes the skip (same annotator: no conflict); history keeps the skip
    who = next(a["annotator"] for a in p.store.answers() if a["sample_id"] == skipped_id)
    out = eada.import_labels(
        p, [{"sample_id": skipped_id, "label": _truth(p, again[4])}], annotator=who
    )
    assert out["unskipped"] == 1 and p.status()["n_skipped"] == 0
    p.export(tmp_path / "exp")
    with open(tmp_path / "exp" / "labels_history.csv", newline="") as fh:
        hist = [r for r in csv.DictReader(fh) if int(r["sample_id"]) == skipped_id]
    assert [(h["label"], h["skip"]) for h in hist] == [("", "blurred"), (_truth(p, again[4]), "")]


def test_skip_routes_json_label_studio_records_and_bad_rows(proj: Project, tmp_path: Path) -> None:
    rows = _rows(proj)
    ids = [int(r["sample_id"]) for r in rows]
    # Python records: a skip key with a reason
    out = eada.import_labels(proj, [{"sample_id": ids[0], "skip": "out of class"}], annotator="ann")
    assert out["skipped"] == 1 and out["pending"] == 4
    # JSON list
    (tmp_path / "a.json").write_text(json.dumps([{"sample_id": ids[1], "skip": "unreadable"}]))
    assert proj.import_labels(tmp_path / "a.json", "ann")["skipped"] == 1
    # a Label Studio export: a cancelled annotation is a skip
    task = {
        "data": {"sample_id": ids[2]},
        "annotations": [{"was_cancelled": True, "result": [], "completed_by": {"email": "x@y"}}],
    }
    (tmp_path / "ls.json").write_text(json.dumps([task]))
    assert proj.import_labels(tmp_path / "ls.json")["skipped"] == 1
    st = proj.status()
    assert st["skipped_by_reason"] == {
        "out of class": 1,
        "skipped in Label Studio": 1,
        "unreadable": 1,
    }
    assert st["annotators"]["label-studio:x@y"] == {"labeled": 0, "skipped": 1}
    # both a label and a skip in one row: refused, nothing written
    (tmp_path / "both.json").write_text(
        json.dumps([{"sample_id": ids[3], "label": proj.classes[0], "skip": "blurred"}])
    )
    with pytest.raises(ValueError, match=r"both a label .* and a skip reason"):
        proj.import_labels(tmp_path / "both.json")
    assert proj.status()["n_skipped"] == 3


def test_conflicts_are_disputes_unless_force_or_newest_wins(proj: Project, tmp_path: Path) -> None:
    sid = int(_rows(proj)[0]["sample_id"])
    a, b = proj.classes[0], proj.classes[1]
    other = int(_rows(proj)[1]["sample_id"])
    eada.import_labels(proj, [{"sample_id": sid, "label": a}], annotator="alice")
    eada.import_labels(proj, [{"sample_id": sid, "label": b}], annotator="alice")  # own label
    # bob contradicts alice: a dispute, alice's label stays in force, bob's other row imported
    out = eada.import_labels(
        proj, [{"sample_id": sid, "label": a}, {"sample_id": other, "label": a}], annotator="bob"
    )
    assert out["new"] == 1
    st = proj.status()
    assert st["annotators"] == {
        "alice": {"labeled": 1, "skipped": 0},
        "bob": {"labeled": 1, "skipped": 0},
    }
    (dispute,) = st["disputes"]
    assert dispute["sample_id"] == sid
    assert dispute["answers"] == {"alice": b, "bob": a} and dispute["in_force"] == b
    # a skip against another annotator's label is a disagreement too (still one dispute)
    eada.import_labels(proj, [{"sample_id": sid, "skip": "blurred"}], annotator="bob")
    assert [d["sample_id"] for d in proj.status()["disputes"]] == [sid]
    out = eada.import_labels(proj, [{"sample_id": sid, "label": a}], annotator="bob", force=True)
    assert out["corrections"] == 1 and out["replaced_other_annotators"] == 1
    # newest-wins, documented in the store section
    raw = json.loads(proj.store.get_meta("config") or "{}")
    raw["store"]["conflicts"] = "newest-wins"
    with proj.store.transaction():
        proj.store.set_meta("config", json.dumps(raw))
    p = Project(proj.folder)
    assert (
        eada.import_labels(p, [{"sample_id": sid, "label": b}], annotator="carol")["corrections"]
        == 1
    )


V1_LABELS = """CREATE TABLE labels (
    id INTEGER PRIMARY KEY,
    sample_id INTEGER NOT NULL REFERENCES samples (id),
    class_id INTEGER NOT NULL REFERENCES classes (id),
    annotator TEXT NOT NULL,
    created TEXT NOT NULL,
    round_id INTEGER REFERENCES rounds (id),
    source TEXT NOT NULL CHECK (source IN ('human', 'simulated')),
    supersedes INTEGER UNIQUE REFERENCES labels (id),
    import_id INTEGER REFERENCES imports (id)
)"""


def test_a_schema_1_store_is_migrated_with_every_label_kept(proj: Project) -> None:
    """A store written before skips (schema 1: labels.class_id NOT NULL, no n_skipped) opens,
    is upgraded in one transaction, keeps every label row, and takes skips."""
    ids = [int(r["sample_id"]) for r in _rows(proj)]
    eada.import_labels(proj, [{"sample_id": ids[0], "label": proj.classes[0]}], annotator="a")
    eada.import_labels(proj, [{"sample_id": ids[0], "label": proj.classes[1]}], annotator="a")
    before = [tuple(r) for r in proj.store.conn.execute("SELECT * FROM labels ORDER BY id")]
    proj.close()
    db = sqlite3.connect(proj.folder / "eada.sqlite")  # rewrite it as eada 0.x left it
    db.executescript(
        "PRAGMA foreign_keys=OFF; BEGIN;"
        + V1_LABELS.replace("TABLE labels", "TABLE old")
        + "; INSERT INTO old SELECT id, sample_id, class_id, annotator, created, round_id, "
        "source, supersedes, import_id FROM labels; DROP TABLE labels; "
        "ALTER TABLE old RENAME TO labels; CREATE INDEX labels_sample ON labels (sample_id);"
        "CREATE TABLE imp (id INTEGER PRIMARY KEY, file TEXT NOT NULL, sha256 TEXT NOT NULL, "
        "format TEXT NOT NULL, n_new INTEGER NOT NULL, n_corrections INTEGER NOT NULL, "
        "n_unchanged INTEGER NOT NULL, created TEXT NOT NULL); INSERT INTO imp SELECT id, file, "
        "sha256, format, n_new, n_corrections, n_unchanged, created FROM imports; "
        "DROP TABLE imports; ALTER TABLE imp RENAME TO "
        "imports; UPDATE meta SET value = '1' WHERE key = 'schema_version'; COMMIT;"
    )
    db.close()
    p = Project(proj.folder)
    assert p.store.get_meta("schema_version") == str(SCHEMA_VERSION)
    after = [tuple(r)[:9] for r in p.store.conn.execute("SELECT * FROM labels ORDER BY id")]
    assert after == [r[:9] for r in before]
    assert (
        eada.import_labels(p, [{"sample_id": ids[1], "skip": "blurred"}], annotator="a")["skipped"]
        == 1
    )
    assert p.status()["n_skipped"] == 1 and p.status()["corrections"] == 1
