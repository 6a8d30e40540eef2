"""Answers needed per sample and credit for every annotator (issue 37, the team half), on a
real Office-Caltech10 SURF features project (amazon -> webcam; seconds): with
``store.answers_needed=2`` one annotator's answers leave the samples awaiting (pending, out of
training, named by import, status, ``next:`` and train's refusal); a second, agreeing
annotator makes them labels, a disagreeing one a dispute; every answer is counted per
annotator (status, report) and exported one a row (``votes.csv``); the policy messages fit the
policy in force and "settled" is said only when something changed."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from eada.cli import main
from eada.store import Project
from support import flat as _flat
from support import real_data

SURF = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "office_caltech10_surf"

pytestmark = pytest.mark.data


@pytest.fixture
def surf(tmp_path: Path, one_thread: None) -> Path:
    """A SURF features project (amazon -> webcam, labeled target) trained to round 1 and
    queried: 6 samples out for labeling."""
    real_data("office_caltech10_surf")
    raw = {
        "name": "surf-team",
        "data": {
            "kind": "features",
            "source": str(SURF / "amazon_SURF_L10.mat"),
            "target": str(SURF / "webcam_SURF_L10.mat"),
            "features_key": "fts",
            "labels_key": "labels",
            "normalize": "l1_zscore",
        },
        "model": {"name": "mlp", "hidden": [64]},
        "train": {"epochs": 3, "batch_size": 64},
        "active": {"rounds_at": [1, 2], "budget_per_round": 6},
    }
    (tmp_path / "surf.yaml").write_text(yaml.safe_dump(raw))
    store = tmp_path / "P"
    assert main(["init", "--store", str(store), "--config", str(tmp_path / "surf.yaml")]) == 0
    assert main(["train", "--store", str(store)]) == 0
    assert main(["query", "--store", str(store)]) == 0
    return store


def _truth(store: Path) -> dict[int, str]:
    """The webcam ground truth of round 1's samples (the features file's labels)."""
    p = Project(store)
    ids = [r["sample_id"] for r in p.store.selected(p.store.active_rounds()[-1]["id"])]
    pos = {r["id"]: r["position"] for r in p.store.samples("target")}
    return {sid: p.classes[int(p.task.target.y[pos[sid]])] for sid in ids}


def _answers(path: Path, who: str, answers: dict[int, str]) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["sample_id", "label", "annotator"])
        w.writerows([(sid, label, who) for sid, label in answers.items()])
    return path


def test_two_answers_needed_wait_credit_and_export(surf: Path, tmp_path: Path, capsys) -> None:
    """The issue's done-check: alice alone labels 0 (6 awaiting, train refuses); bob agreeing
    on 5 of 6 makes 5 labels and 1 dispute; both are credited with 6 answers; votes.csv holds
    alice's 6 rows."""
    s = ["--store", str(surf)]
    capsys.readouterr()
    # an unknown key is called unknown; a known one that is fixed at init says so
    assert main(["config", "set", *s, "store.answer_needed=2"]) == 2
    assert "store.answer_needed is not a store setting (unknown key)" in capsys.readouterr().err
    assert main(["config", "set", *s, "store.target=unlabeled"]) == 2
    assert "store.target cannot change after `eada init`" in capsys.readouterr().err
    for bad in ("0", "101", "true", "two"):
        assert main(["config", "set", *s, f"store.answers_needed={bad}"]) == 2
        assert "store.answers_needed" in capsys.readouterr().err
    assert main(["config", "set", *s, "store.answers_needed=2"]) == 0
    assert "store.answers_needed=2" in _flat(capsys.readouterr().out)

    truth = _truth(surf)
    ids = sorted(truth)
    classes = Project(surf).classes
    assert main(["label", "import", str(_answers(tmp_path / "a.csv", "alice", truth)), *s]) == 0
    out = _flat(capsys.readouterr().out)
    assert "0 new" in out and "6 awaiting 1 more answer (store.answers_needed=2)" in out
    assert "6 queried samples await an answer" in out
    assert "next: eada label import" in out and "6 awaiting 1 more answer" in out
    st = Project(surf).status()
    assert st["n_labeled"] == 0 and st["answers_needed"] == 2
    assert [a["sample_id"] for a in st["awaiting"]] == ids
    assert all(
        a["more"] == 1 and a["answers"] == {"alice": truth[a["sample_id"]]} for a in st["awaiting"]
    )
    assert st["rounds"][0]["pending"] == 6 and st["rounds"][0]["awaiting"] == 6
    assert st["answers_by_annotator"]["alice"]["answers"] == 6
    assert main(["train", *s]) == 2
    err = _flat(capsys.readouterr().err)
    assert "round 1 awaits an answer for 6 of its 6 samples" in err
    assert "6 awaiting 1 more answer (store.answers_needed=2)" in err and "--partial" in err
    assert main(["query", *s]) == 0  # the round is out still: exported again, and says why
    assert "6 of them awaiting more answers" in _flat(capsys.readouterr().out)
    assert main(["status", *s]) == 0
    text = _flat(capsys.readouterr().out)
    assert "answers needed per sample: 2; 6 awaiting 1 more answer" in text
    assert "alice: 6 (6 labels, 0 skips; 0 as in force)" in text

    # bob agrees on 5 of 6: 5 labels, 1 dispute
    odd = ids[2]
    other = next(c for c in classes if c != truth[odd])
    bob = {sid: (other if sid == odd else truth[sid]) for sid in ids}
    assert main(["label", "import", str(_answers(tmp_path / "b.csv", "bob", bob)), *s]) == 0
    out = _flat(capsys.readouterr().out)
    assert "5 new" in out and "1 disputed" in out and "awaiting" not in out.split("next:")[0]
    assert f"sample {odd}" in out and f"alice '{truth[odd]}'" in out and f"bob '{other}'" in out
    st = Project(surf).status()
    assert st["n_labeled"] == 5 and [d["sample_id"] for d in st["disputes"]] == [odd]
    assert st["awaiting"] == []
    credit = st["answers_by_annotator"]
    assert credit["alice"]["answers"] == 6 and credit["bob"]["answers"] == 6
    assert credit["alice"]["match_in_force"] == 5 and credit["bob"]["match_in_force"] == 5
    assert main(["status", *s, "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["answers_needed"] == 2 and js["awaiting"] == []
    assert js["answers_by_annotator"]["alice"]["answers"] >= 5
    assert js["answers_by_annotator"]["bob"]["answers"] >= 5

    # majority with two annotators: a 1-1 tie; the message says so and names the tie rule
    assert main(["config", "set", *s, "store.conflicts=majority"]) == 0
    out = _flat(capsys.readouterr().out)
    assert "dispute(s) settled" not in out
    assert "majority cannot settle" in out and "store.conflict_tie=newest-wins" in out
    assert "store.conflicts=majority (or" not in out  # never the policy already set
    # a re-import that changes nothing says nothing is settled
    assert main(["label", "import", str(tmp_path / "b.csv"), *s]) == 0
    out = _flat(capsys.readouterr().out)
    assert "settled" not in out.split(";")[0] and "0 new" in out
    # the tie rule settles it (the newest answer: bob's), once
    assert main(["config", "set", *s, "store.conflict_tie=newest-wins"]) == 0
    assert "1 dispute(s) settled by the new policy" in _flat(capsys.readouterr().out)
    labels = {r["sample_id"]: r["class_name"] for r in Project(surf).store.current_labels()}
    assert len(labels) == 6 and labels[odd] == other
    assert main(["label", "import", str(tmp_path / "b.csv"), *s]) == 0
    assert "settled" not in _flat(capsys.readouterr().out)

    # export: every answer one a row, alice's 6 among them
    assert main(["export", *s, "--out", str(tmp_path / "x")]) == 0
    capsys.readouterr()
    with open(tmp_path / "x" / "votes.csv", newline="") as fh:
        votes = list(csv.DictReader(fh))
    mine = [v for v in votes if v["annotator"] == "alice"]
    assert len(mine) == 6 and len(votes) == 12
    assert {int(v["sample_id"]): v["label"] for v in mine} == truth
    assert all(v["source"] == f"file {tmp_path / 'a.csv'}" and v["time"] for v in mine)
    assert {v["origin"] for v in mine} == {f"row {i}" for i in range(2, 8)}
    # an export holding votes.csv is one of eada's: --force replaces it
    assert main(["export", *s, "--out", str(tmp_path / "x"), "--force"]) == 0
    capsys.readouterr()
    # the report credits both and shows their agreement
    from eada.reports.project import build_project_report

    html = build_project_report(surf, tmp_path / "r.html").read_text()
    assert "Who answered what" in html and "votes.csv" in html and "alice / bob" in html


def test_partial_trains_on_what_is_settled_and_fewer_answers_settle_at_once(
    surf: Path, tmp_path: Path, capsys
) -> None:
    """``--partial`` trains with the settled labels only; lowering answers_needed settles
    the samples that now have enough answers."""
    s = ["--store", str(surf)]
    assert main(["config", "set", *s, "store.answers_needed=3"]) == 0
    truth = _truth(surf)
    ids = sorted(truth)
    first = {sid: truth[sid] for sid in ids[:4]}
    for who in ("alice", "bob"):
        path = _answers(tmp_path / f"{who}.csv", who, first)
        assert main(["label", "import", str(path), *s]) == 0
    capsys.readouterr()
    assert (
        main(
            [
                "label",
                "import",
                str(_answers(tmp_path / "c.csv", "carol", {ids[0]: truth[ids[0]]})),
                *s,
            ]
        )
        == 0
    )
    out = _flat(capsys.readouterr().out)
    assert "1 new" in out and "3 awaiting 1 more answer (store.answers_needed=3)" in out
    assert main(["train", *s, "--partial"]) == 0
    assert "with 1 target labels" in _flat(capsys.readouterr().out)
    assert main(["config", "set", *s, "store.answers_needed=2"]) == 0
    out = _flat(capsys.readouterr().out)
    assert "3 sample(s) awaiting answers now have enough" in out
    st = Project(surf).status()
    assert st["n_labeled"] == 4 and st["awaiting"] == [] and st["rounds"][0]["pending"] == 2


def test_on_surf_unusable_answers_stop_one_sample_and_policies_apply_when_set(
    surf: Path, tmp_path: Path, capsys
) -> None:
    """On real SURF features: an unknown label and a self-contradiction in one file leave
    the other rows imported, `train --partial` runs, `status --json` lists 2 samples that need
    attention; newest-wins set afterwards prints each changed label at `config set` and status
    shows it before any import; votes.csv keeps a superseded answer."""
    s = ["--store", str(surf)]
    truth = _truth(surf)
    ids = sorted(truth)
    classes = Project(surf).classes
    other = {sid: next(c for c in classes if c != truth[sid]) for sid in ids}
    f = tmp_path / "mixed.csv"
    with open(f, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["sample_id", "label", "annotator"])
        w.writerow([ids[0], "not_a_class", "alice"])
        w.writerow([ids[1], truth[ids[1]], "alice"])
        w.writerow([ids[1], other[ids[1]], "alice"])
        w.writerows([(sid, truth[sid], "alice") for sid in ids[2:]])
    assert main(["label", "import", str(f), *s]) == 0
    assert "4 new" in _flat(capsys.readouterr().out)
    assert main(["train", "--partial", *s]) == 0
    capsys.readouterr()
    assert main(["status", "--json", *s]) == 0
    js = json.loads(capsys.readouterr().out)
    assert sorted(a["sample_id"] for a in js["needs_attention"]) == ids[:2]
    assert js["n_labeled"] == 4
    # bob disagrees on two: disputes; newest-wins settles them at config set, printed
    bob = {sid: (other[sid] if sid in ids[2:4] else truth[sid]) for sid in ids[2:]}
    assert main(["label", "import", str(_answers(tmp_path / "b.csv", "bob", bob)), *s]) == 0
    capsys.readouterr()
    assert main(["config", "set", *s, "store.conflicts=newest-wins"]) == 0
    out = _flat(capsys.readouterr().out)
    for sid in ids[2:4]:
        assert f"sample {sid}: '{truth[sid]}' (alice) -> '{other[sid]}' (bob, newest-wins)" in out
    labels = {r["sample_id"]: r["class_name"] for r in Project(surf).store.current_labels()}
    assert all(labels[sid] == other[sid] for sid in ids[2:4])
    assert Project(surf).status()["disputes"] == []
    alice = _answers(tmp_path / "a2.csv", "alice", {ids[2]: other[ids[2]]})  # changes hers
    assert main(["label", "import", str(alice), *s]) == 0
    assert main(["export", *s, "--out", str(tmp_path / "x")]) == 0
    capsys.readouterr()
    with open(tmp_path / "x" / "votes.csv", newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["sample_id"] == str(ids[2])]
    first = next(r for r in rows if r["annotator"] == "alice" and r["label"] == truth[ids[2]])
    assert first["superseded_at"] and first["newest"] == "0"
