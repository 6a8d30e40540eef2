"""Disagreement as a workflow (issue 30): two annotators who disagree leave the sample
disputed and listed (import message, `eada status` text and JSON, report, round re-export)
while the rest imports; `store.conflicts` policies (newest-wins, majority with its tie rule,
reviewer) settle it, set after init with `eada config set`; agreement per pair (percent and
Cohen's kappa); a schema-2 store is migrated with its answers kept as votes (toy data)."""

from __future__ import annotations

import csv
import json
import sqlite3
from pathlib import Path

import pytest
from sklearn.metrics import cohen_kappa_score

import eada
from eada.cli import main
from eada.store import Project
from eada.store.db import SCHEMA_VERSION
from support import flat as _flat
from support import round1_ids, toy_project


@pytest.fixture
def proj(tmp_path: Path) -> Project:
    return toy_project(tmp_path, 6)


def _csv(path: Path, rows: list[tuple[int, str, str, str]]) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["sample_id", "label", "skip", "annotator"])
        w.writerows(rows)
    return path


def test_a_dispute_does_not_stop_the_import_and_is_listed_everywhere(
    proj: Project, tmp_path: Path, capsys
) -> None:
    ids = round1_ids(proj)
    a, b = proj.classes[0], proj.classes[1]
    s = ["--store", str(proj.folder)]
    f = _csv(
        tmp_path / "team.csv",
        [
            (ids[0], a, "", "alice"),
            (ids[0], b, "", "bob"),  # disputed
            (ids[1], a, "", "alice"),
            (ids[1], a, "", "bob"),  # agreed
            (ids[2], "", "blurred", "alice"),
            (ids[2], b, "", "bob"),  # skip against a label: disputed too
            (ids[3], b, "", "alice"),
        ],
    )
    assert main(["label", "import", str(f), *s]) == 0
    out = _flat(capsys.readouterr().out)
    assert "2 new" in out and "2 disputed" in out
    assert f"sample {ids[0]}: alice '{a}' (row 2), bob '{b}' (row 3)" in out
    assert f"sample {ids[2]}: alice '(skip)' (row 6), bob '{b}' (row 7)" in out
    st = proj.status()
    assert st["n_labeled"] == 2 and st["n_skipped"] == 0
    assert [d["sample_id"] for d in st["disputes"]] == sorted([ids[0], ids[2]])
    assert st["disputes"][0]["answers"] in ({"alice": a, "bob": b}, {"alice": "(skip)", "bob": b})
    assert st["rounds"][0]["pending"] == 4  # the disputed samples stay unanswered
    assert main(["status", *s, "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert len(js["disputes"]) == 2 and js["agreement"][0]["annotators"] == ["alice", "bob"]
    assert main(["status", *s]) == 0
    text = _flat(capsys.readouterr().out)
    assert "2 disputed sample(s)" in text and "agreement alice / bob: 1/3" in text
    # the round's re-export names the dispute; the report lists it
    assert main(["query", *s]) == 0
    capsys.readouterr()
    with open(proj.folder / "exports" / "round-001.csv", newline="") as fh:
        rows = {int(r["sample_id"]): r for r in csv.DictReader(fh)}
    assert rows[ids[0]]["dispute"] == f"alice: {a}; bob: {b}" and rows[ids[1]]["dispute"] == ""
    from eada.reports.project import build_project_report

    html = build_project_report(proj.folder, tmp_path / "r.html").read_text()
    assert "Disagreements between annotators" in html and "Cohen&#x27;s kappa" in html

    # majority with the default tie rule: a 1-1 tie stays disputed; carol breaks it
    assert main(["config", "set", *s, "store.conflicts=majority"]) == 0
    assert "still disputed" in _flat(capsys.readouterr().out)
    _csv(tmp_path / "carol.csv", [(ids[0], b, "", "carol")])
    assert main(["label", "import", str(tmp_path / "carol.csv"), *s]) == 0
    assert "1 disagreement(s) settled" in _flat(capsys.readouterr().out)
    p = Project(proj.folder)
    force = {r["sample_id"]: r for r in p.store.answers()}
    assert force[ids[0]]["class_name"] == b and force[ids[0]]["annotator"] in ("bob", "carol")
    # a tie settled by the reviewer: the sample with alice's skip and bob's label
    assert main(["config", "set", *s, "store.conflict_tie=reviewer", "store.reviewer=rev"]) == 0
    capsys.readouterr()
    _csv(tmp_path / "rev.csv", [(ids[2], "", "blurred", "rev")])
    assert main(["label", "import", str(tmp_path / "rev.csv"), *s]) == 0
    p = Project(proj.folder)
    assert p.status()["disputes"] == [] and p.status()["n_skipped"] == 1
    # training goes on
    assert main(["train", *s, "--partial"]) in (0, 2)


def test_policies_newest_wins_and_reviewer(proj: Project) -> None:
    ids = round1_ids(proj)
    a, b = proj.classes[0], proj.classes[1]
    eada.import_labels(proj, [{"sample_id": ids[0], "label": a}], annotator="alice")
    proj.set_options({"conflicts": "reviewer", "reviewer": "lead"})
    out = eada.import_labels(proj, [{"sample_id": ids[0], "label": b}], annotator="bob")
    assert [d["sample_id"] for d in out["disputes"]] == [ids[0]]  # awaits the reviewer
    out = eada.import_labels(proj, [{"sample_id": ids[0], "label": b}], annotator="lead")
    assert out["disputes"] == [] and out["settled"] == 1
    assert {r["sample_id"]: r["class_name"] for r in proj.store.current_labels()}[ids[0]] == b
    proj.set_options({"conflicts": "newest-wins"})
    eada.import_labels(proj, [{"sample_id": ids[1], "label": a}], annotator="alice")
    out = eada.import_labels(proj, [{"sample_id": ids[1], "label": b}], annotator="bob")
    assert out["corrections"] == 1 and out["replaced_other_annotators"] == 1
    with pytest.raises(ValueError, match=r"store\.reviewer must name"):
        proj.set_options({"conflicts": "reviewer", "reviewer": None})
    with pytest.raises(ValueError, match="cannot change after"):
        proj.set_options({"target": "labeled"})


def test_agreement_is_percent_and_cohens_kappa_per_pair(proj: Project) -> None:
    ids = round1_ids(proj)
    c = proj.classes
    proj.set_options({"conflicts": "newest-wins"})
    alice = [c[0], c[0], c[1], c[1], "skip", c[0]]  # a skip is one answer
    bob = [c[0], c[1], c[1], c[1], "skip", "skip"]
    for who, labels in (("alice", alice), ("bob", bob)):
        eada.import_labels(
            proj,
            [
                {"sample_id": i, **({"skip": "blurred"} if y == "skip" else {"label": y})}
                for i, y in zip(ids, labels, strict=True)
            ],
            annotator=who,
        )
    (pair,) = proj.status()["agreement"]
    assert pair["annotators"] == ["alice", "bob"] and (pair["n"], pair["agree"]) == (6, 4)
    assert pair["percent"] == pytest.approx(66.67, abs=0.01)
    assert pair["kappa"] == pytest.approx(cohen_kappa_score(alice, bob), abs=1e-4)


def test_a_schema_2_store_is_migrated_with_its_answers_as_votes(proj: Project) -> None:
    ids = round1_ids(proj)
    eada.import_labels(proj, [{"sample_id": ids[0], "label": proj.classes[0]}], annotator="a")
    eada.import_labels(
        proj, [{"sample_id": ids[0], "label": proj.classes[1]}], annotator="b", force=True
    )
    before = [tuple(r) for r in proj.store.conn.execute("SELECT * FROM labels ORDER BY id")]
    proj.close()
    db = sqlite3.connect(proj.folder / "eada.sqlite")  # as eada with schema 2 left it
    db.executescript(
        "BEGIN; DROP TABLE votes; DROP TABLE disputes; "
        "UPDATE meta SET value = '2' WHERE key = 'schema_version'; COMMIT;"
    )
    db.close()
    p = Project(proj.folder)
    assert p.store.get_meta("schema_version") == str(SCHEMA_VERSION)
    assert [tuple(r) for r in p.store.conn.execute("SELECT * FROM labels ORDER BY id")] == before
    votes = {r["annotator"]: r["class_id"] for r in p.store.conn.execute("SELECT * FROM votes")}
    assert votes == {"a": 0, "b": 1}
    st = p.status()
    assert st["disputes"] == [] and st["agreement"][0]["agree"] == 0


def test_a_read_only_schema_2_store_is_read_through_an_upgrade_in_memory(
    proj: Project, tmp_path: Path, monkeypatch, capsys
) -> None:
    """A user who may not write a schema-2 store can still read it (status, export): it is
    upgraded in memory only; the file keeps its bytes, writes stay refused, and the first user
    who may write upgrades the file."""
    from eada.store import db as store_db

    ids = round1_ids(proj)
    eada.import_labels(proj, [{"sample_id": ids[0], "label": proj.classes[0]}], annotator="a")
    eada.import_labels(
        proj, [{"sample_id": ids[0], "label": proj.classes[1]}], annotator="b", force=True
    )
    proj.close()
    db = sqlite3.connect(proj.folder / "eada.sqlite")  # as eada with schema 2 left it
    db.executescript(
        "BEGIN; DROP TABLE votes; DROP TABLE disputes; "
        "UPDATE meta SET value = '2' WHERE key = 'schema_version'; COMMIT;"
    )
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    file_bytes = (proj.folder / "eada.sqlite").read_bytes()
    monkeypatch.setattr(store_db, "_writable", lambda path: False)
    s = ["--store", str(proj.folder)]
    assert main(["status", *s, "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["read_only"] is True and st["upgraded_in_memory_from"] == 2
    assert st["n_labeled"] == 1 and st["agreement"][0]["agree"] == 0
    assert main(["status", *s]) == 0
    assert "schema version 2 and is read-only for you" in capsys.readouterr().out
    assert main(["export", *s, "--out", str(tmp_path / "out")]) == 0
    with open(tmp_path / "out" / "labels.csv", newline="") as fh:
        assert [r["sample_id"] for r in csv.DictReader(fh)] == [str(ids[0])]
    f = _csv(tmp_path / "more.csv", [(ids[1], proj.classes[0], "", "a")])
    assert main(["label", "import", str(f), *s]) == 2
    assert "read-only" in capsys.readouterr().err
    assert (proj.folder / "eada.sqlite").read_bytes() == file_bytes  # not a byte changed
    monkeypatch.undo()  # a user who may write: the file itself is upgraded
    p = Project(proj.folder)
    assert p.store.get_meta("schema_version") == str(SCHEMA_VERSION)
    assert p.status()["upgraded_in_memory_from"] is None
    p.close()


def test_the_export_lists_open_disputes(proj: Project, tmp_path: Path) -> None:
    ids = round1_ids(proj)
    a, b = proj.classes[0], proj.classes[1]
    eada.import_labels(
        proj,
        [
            {"sample_id": ids[0], "label": a, "annotator": "alice"},
            {"sample_id": ids[0], "label": b, "annotator": "bob"},
        ],
    )
    files = proj.export(tmp_path / "out")
    with open(files["disputes.csv"], newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["sample_id"], r["annotator"], r["answer"]) for r in rows] == [
        (str(ids[0]), "alice", a),
        (str(ids[0]), "bob", b),
    ]


def test_a_policy_change_resettles_at_once_both_ways_and_asks_before_rewriting(
    proj: Project, tmp_path: Path, capsys
) -> None:
    """`config set store.conflicts=...` re-settles in its own transaction, printing every
    changed label (sample, old label and annotator, new label, annotator and how); `status`
    shows it before any import. Going back restores the previous policy's labels; a change of
    more than a fifth of the settled labels, or of a reviewer's decision, needs --yes."""
    ids = round1_ids(proj)
    a, b = proj.classes[0], proj.classes[1]
    s = ["--store", str(proj.folder)]
    assert (
        main(
            [
                "label",
                "import",
                str(_csv(tmp_path / "a.csv", [(i, a, "", "alice") for i in ids])),
                *s,
            ]
        )
        == 0
    )
    bob = [(i, b if n < 2 else a, "", "bob") for n, i in enumerate(ids)]
    assert main(["label", "import", str(_csv(tmp_path / "b.csv", bob)), *s]) == 0
    capsys.readouterr()
    before = {r["sample_id"]: r["class_name"] for r in proj.store.current_labels()}
    assert main(["config", "set", *s, "store.conflicts=newest-wins"]) == 0
    out = _flat(capsys.readouterr().out)
    assert "2 label(s) changed" in out
    for sid in ids[:2]:
        assert f"sample {sid}: '{a}' (alice) -> '{b}' (bob, newest-wins)" in out
    st = Project(proj.folder).status()  # no import in between
    assert st["disputes"] == [] and st["n_labeled"] == 6
    now = {r["sample_id"]: r["class_name"] for r in proj.store.current_labels()}
    assert now == {**before, ids[0]: b, ids[1]: b}
    # back to refuse: 2 of 6 settled labels would change (more than a fifth): asks first
    assert main(["config", "set", *s, "store.conflicts=refuse"]) == 2
    err = _flat(capsys.readouterr().err)
    assert "2 of the 6 settled labels" in err and "--yes" in err and "Nothing was written" in err
    assert Project(proj.folder).options.conflicts == "newest-wins"
    assert main(["config", "set", *s, "store.conflicts=refuse", "--yes"]) == 0
    out = _flat(capsys.readouterr().out)
    assert (
        f"sample {ids[0]}: '{b}' (bob) -> '{a}' (alice, refused: back to before newest-wins)" in out
    )
    st = Project(proj.folder).status()
    assert sorted(d["sample_id"] for d in st["disputes"]) == sorted(ids[:2])
    assert {r["sample_id"]: r["class_name"] for r in proj.store.current_labels()} == before
    # a reviewer's decision is never overwritten without --yes
    assert main(["config", "set", *s, "store.conflicts=reviewer", "store.reviewer=bob"]) == 0
    capsys.readouterr()
    assert main(["config", "set", *s, "store.reviewer=alice"]) == 2
    assert "overwrite 2 reviewer decision(s)" in _flat(capsys.readouterr().err)
    assert main(["config", "set", *s, "store.reviewer=alice", "--yes"]) == 0
    assert {r["sample_id"]: r["class_name"] for r in proj.store.current_labels()} == before
