"""A team that never stalls, on label files (no Label Studio server): an unusable answer (an
unknown class, one annotator's answers that contradict each other) puts that one sample in
*needs attention* while the rest imports and `train`/`train --partial` go on; `status`
(text and JSON) names each sample with its action, and following the action clears it."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from eada.cli import main
from eada.store import Project
from support import flat as _flat
from support import round1_ids, toy_project


@pytest.fixture
def proj(tmp_path: Path) -> Project:
    return toy_project(tmp_path, 6)


def _csv(path: Path, rows: list[tuple[int, str, str]]) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["sample_id", "label", "annotator"])
        w.writerows(rows)
    return path


def test_unusable_answers_stop_one_sample_not_the_team(
    proj: Project, tmp_path: Path, capsys
) -> None:
    ids = round1_ids(proj)
    a, b = proj.classes[0], proj.classes[1]
    s = ["--store", str(proj.folder)]
    rows = [
        (ids[0], "caat", "alice"),  # not a class of the project
        (ids[1], a, "alice"),
        (ids[1], b, "alice"),  # alice contradicts herself
        (ids[2], a, "alice"),
        (ids[3], b, "alice"),
        (ids[4], a, "alice"),
    ]
    f = _csv(tmp_path / "round-001.csv", rows)
    assert main(["label", "import", str(f), *s]) == 0
    out = _flat(capsys.readouterr().out)
    assert "3 new" in out and "2 need attention" in out
    assert f"sample {ids[0]} needs attention: unknown class name 'caat'" in out
    assert "correct row 2 of" in out and "correct row 3 and row 4 of" in out
    st = proj.status()
    assert st["n_labeled"] == 3 and st["rounds"][0]["needs_attention"] == 2
    assert st["rounds"][0]["pending"] == 1  # ids[5]: nobody answered it yet
    assert main(["train", "--partial", *s]) == 0  # the rest trains
    capsys.readouterr()
    assert proj.store.latest_checkpoint()["n_labeled"] == 3
    assert main(["status", *s, "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    att = js["needs_attention"]
    assert [x["sample_id"] for x in att] == sorted([ids[0], ids[1]])
    for x in att:
        assert x["annotator"] == "alice" and x["task"] is None
        assert "eada label import" in x["action"] and x["why"]
    assert main(["status", *s]) == 0
    text = _flat(capsys.readouterr().out)
    assert "2 sample(s) need attention" in text and "annotator alice" in text
    from eada.reports.project import build_project_report

    html = build_project_report(proj.folder, tmp_path / "r.html").read_text()
    assert "Samples that need attention" in html and "unknown class name" in html
    # following the action (the rows corrected, the file imported again) clears both
    rows[0] = (ids[0], a, "alice")
    rows[2] = (ids[1], a, "alice")
    _csv(f, [*rows, (ids[5], b, "alice")])
    assert main(["label", "import", str(f), *s]) == 0
    out = _flat(capsys.readouterr().out)
    assert "2 no longer need attention" in out
    st = proj.status()
    assert st["needs_attention"] == [] and st["n_labeled"] == 6
    assert st["rounds"][0]["pending"] == 0 and st["next"] == "query"  # --partial trained on


def test_a_plain_train_goes_on_without_the_sample_and_a_repeat_keeps_it(
    proj: Project, tmp_path: Path
) -> None:
    """Every other sample answered: `eada train` (not only --partial) trains without the
    sample that needs attention; importing the same bad row again keeps one entry."""
    ids = round1_ids(proj)
    a = proj.classes[0]
    rows = [(i, a, "bob") for i in ids[1:]]
    f = _csv(tmp_path / "r.csv", [(ids[0], "dog", "bob"), *rows])
    got = proj.import_labels(f)
    assert [x["sample_id"] for x in got["needs_attention"]] == [ids[0]]
    again = proj.import_labels(f)
    assert again["needs_attention_total"] == 1 and again["unchanged"] == 5
    assert proj.next_action() == "train"
    proj.train()
    assert proj.store.latest_checkpoint()["n_labeled"] == 5


def test_credit_superseded_answers_and_the_audit_count(proj: Project, tmp_path: Path) -> None:
    """Two annotators who agree are both credited with the label in force; an annotator's
    changed answer keeps the first in votes.csv with its superseded_at; an audit drawn after
    `train --partial` says how many labels the model actually trained on."""
    ids = round1_ids(proj)
    a, b = proj.classes[0], proj.classes[1]
    proj.import_labels(_csv(tmp_path / "a.csv", [(i, a, "alice") for i in ids[:4]]))
    proj.import_labels(_csv(tmp_path / "b.csv", [(i, a, "bob") for i in ids[:4]]))
    credit = proj.status()["answers_by_annotator"]
    assert credit["alice"]["in_force"] == 4 and credit["bob"]["in_force"] == 4
    proj.train(partial=True)  # 4 labels; 2 samples still pending
    proj.import_labels(_csv(tmp_path / "a2.csv", [(ids[0], b, "alice")]))  # alice changes hers
    st = proj.status()
    assert [d["sample_id"] for d in st["disputes"]] == [ids[0]]  # it now disagrees with bob
    assert st["answers_by_annotator"]["alice"]["in_force"] == 3
    proj.export(tmp_path / "x")
    with open(tmp_path / "x" / "votes.csv", newline="") as fh:
        votes = [v for v in csv.DictReader(fh) if v["annotator"] == "alice"]
    first, second = [v for v in votes if v["sample_id"] == str(ids[0])]
    assert first["label"] == a and first["newest"] == "0" and first["superseded_at"]
    assert first["superseded_at"] == second["time"] and second["superseded_at"] == ""
    assert len(votes) == 5 and all(v["recorded"] for v in votes)
    proj.import_labels(_csv(tmp_path / "c.csv", [(i, b, "alice") for i in ids[4:]]))
    proj.audit(2)
    (audit,) = proj.status()["audit"]["rounds"]
    assert audit["model"]["trained_labels"] == 4  # not the 6 in force now


def test_a_schema_3_store_is_migrated_with_its_answers_kept(proj: Project, tmp_path: Path) -> None:
    """A store as eada with schema 3 left it (no attention table, no answer times, no
    labels.decided) opens as schema 4 with every label and vote kept."""
    import sqlite3

    from eada.store.db import SCHEMA_VERSION

    ids = round1_ids(proj)
    proj.import_labels(_csv(tmp_path / "a.csv", [(i, proj.classes[0], "alice") for i in ids]))
    votes = [tuple(r)[:8] for r in proj.store.conn.execute("SELECT * FROM votes ORDER BY id")]
    proj.close()
    db = sqlite3.connect(proj.folder / "eada.sqlite")
    db.executescript(
        "BEGIN; DROP TABLE attention; ALTER TABLE votes DROP COLUMN answered; "
        "ALTER TABLE votes DROP COLUMN updated; ALTER TABLE votes DROP COLUMN deleted; "
        "ALTER TABLE labels DROP COLUMN decided; "
        "UPDATE meta SET value = '3' WHERE key = 'schema_version'; COMMIT;"
    )
    db.close()
    p = Project(proj.folder)
    assert p.store.get_meta("schema_version") == str(SCHEMA_VERSION) == "4"
    assert [tuple(r)[:8] for r in p.store.conn.execute("SELECT * FROM votes ORDER BY id")] == votes
    assert p.status()["needs_attention"] == [] and p.status()["n_labeled"] == 6
    got = p.import_labels(_csv(tmp_path / "b.csv", [(ids[0], "dog", "bob")]))
    assert [a["sample_id"] for a in got["needs_attention"]] == [ids[0]]
