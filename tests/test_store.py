"""The project store: one code path for simulated and human labels, a human round trip on the
digits, and every bad input refused with a clear error and no change to the store."""

from __future__ import annotations

import csv
import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from eada.cli import main
from eada.data.tasks import load_task
from eada.hparams import preset_config
from eada.store import (
    ImportFileError,
    ImportValidationError,
    Project,
    Store,
    StoreError,
    init_project,
)
from eada.train import ActiveDATrainer
from support import truth_rows

TOY = [
    "data.n_per_class=60",
    "train.epochs=3",
    "active.rounds_at=[1,2]",
    "active.budget_per_round=5",
]


def _flat(text: str) -> str:
    """Console text with rich's line wrapping undone."""
    return " ".join(text.split())


def _counts(folder: Path) -> tuple[int, int, int]:
    with sqlite3.connect(folder / "eada.sqlite") as c:
        return tuple(  # type: ignore[return-value]
            c.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
            for t in ("labels", "imports", "rounds")
        )


def _fill(csv_path: Path, out: Path, classes: list[str], truth: torch.Tensor) -> list[dict]:
    with open(csv_path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:  # the annotator writes the class NAME in the empty label column
        r["label"] = classes[int(truth[int(r["index"])])]
        r["annotator"] = "alice"
    _write_csv(out, rows)
    return rows


def _write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def test_simulated_store_run_equals_the_plain_trainer(tmp_path: Path) -> None:
    cfg = preset_config("toy", "eada", 1, TOY)
    plain = ActiveDATrainer(cfg, load_task(cfg.data, 1)).run()
    proj = init_project(tmp_path / "p", cfg)
    st = proj.run_simulated()
    got = sorted(r["position"] for r in proj.store.current_labels())
    assert got == plain.labeled_indices
    assert st["by_source"] == {"human": 0, "simulated": 10}
    assert st["history"][-1]["target_accuracy"] == pytest.approx(
        plain.final["last_epoch"]["target"]["accuracy"]
    )
    # per-sample scores of the whole pool were recorded for every round
    with sqlite3.connect(tmp_path / "p" / "eada.sqlite") as c:
        n = c.execute("SELECT COUNT(*) FROM round_samples").fetchone()[0]
        keys = json.loads(c.execute("SELECT scores FROM round_samples").fetchone()[0])
    assert n == 120 + 115 and {"free_energy", "mvsm", "predicted"} <= set(keys)
    with pytest.raises(StoreError, match="simulated run"):
        proj.import_labels(tmp_path / "x.csv")  # mode is fixed once a run started
    assert proj.next_action() == "done"


def test_human_round_trip_on_digits(tmp_path: Path, digits_root: Path, capsys) -> None:
    folder = tmp_path / "proj"
    s = ["--store", str(folder)]
    sets = [
        f"data.root={digits_root}",
        "data.source=usps",
        "data.source_split=test",
        "data.target=mnist",
        "data.target_split=all",
        "data.heldout_split=null",
        "train.epochs=2",
        "train.batch_size=256",
        "data.image_size=20",
        "active.rounds_at=[1]",
        "active.budget_per_round=30",
    ]
    init_args = ["init", *s, "--preset", "digits/mnist-usps"]
    assert main([*init_args, *[a for x in sets for a in ("--set", x)]]) == 0
    assert main(["query", *s]) == 2  # the model has not trained to round 1's epoch yet
    assert "run `eada train` first" in _flat(capsys.readouterr().err)
    assert main(["train", *s]) == 0
    assert main(["query", *s]) == 0
    out = _flat(capsys.readouterr().out)
    assert "round 1: 30 samples selected" in out
    exports = folder / "exports"
    for name in ("round-001.csv", "round-001.json", "round-001.labelstudio.json"):
        assert (exports / name).is_file()
    tasks = json.loads((exports / "round-001.labelstudio.json").read_text())
    assert len(tasks) == 30 and "free_energy" in tasks[0]["data"]
    target = Project(folder).task.target
    filled = tmp_path / "filled.csv"
    rows = _fill(exports / "round-001.csv", filled, target.classes, target.y)
    assert main(["train", *s]) == 2  # round 1 awaits labels
    assert main(["label", "import", str(filled), *s]) == 0
    assert "30 new, 0 corrections" in _flat(capsys.readouterr().out)
    assert main(["train", *s]) == 0
    # a later correction is recorded as a new row, never overwriting the first
    fix = dict(rows[0])
    old = fix["label"]
    fix["label"] = "7" if old != "7" else "1"
    fix["annotator"] = "bob"
    _write_csv(tmp_path / "fix.csv", [fix])
    # bob contradicting alice's label is a dispute: imported, named, alice's label stays
    before = Project(folder).status()
    assert main(["label", "import", str(tmp_path / "fix.csv"), *s]) == 0
    out = _flat(capsys.readouterr().out)
    assert f"sample {fix['sample_id']}" in out and "disput" in out
    assert f"alice '{old}'" in out and f"bob '{fix['label']}'" in out
    after = Project(folder).status()
    assert after["n_labeled"] == before["n_labeled"]
    assert [d["sample_id"] for d in after["disputes"]] == [int(fix["sample_id"])]
    assert main(["label", "import", str(tmp_path / "fix.csv"), *s, "--force"]) == 0
    out = _flat(capsys.readouterr().out)
    assert "0 new, 1 corrections" in out and "replaced another annotator's label" in out
    assert Project(folder).status()["disputes"] == []  # the newest answer settled it
    assert main(["status", *s, "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["n_labeled"] == 30 and st["corrections"] == 1 and st["by_source"]["human"] == 30
    # near-duplicates are flags; on decoded digit pixels only from a cosine of 0.999 (at 0.95
    # distinct digits of one round were flagged: benchmarks/investigations/near_duplicates.py)
    dups = st["rounds"][0].pop("near_duplicates")
    assert all(d["cosine"] >= 0.999 and d["of"] != d["sample_id"] for d in dups)
    info = json.loads(Project(folder).store.rounds()[0]["info"])
    assert info["near_duplicate_threshold"] == 0.999
    assert st["rounds"] == [
        {
            "round": 1,
            "epoch": 1,
            "strategy": "eada",
            "selected": 30,
            "labeled": 30,
            "skipped": 0,
            "pending": 0,
            "awaiting": 0,
            "needs_attention": 0,
        }
    ]
    assert st["annotators"] == {
        "alice": {"labeled": 29, "skipped": 0},
        "bob": {"labeled": 1, "skipped": 0},
    }
    assert [h["epoch"] for h in st["history"]] == [1, 2] and st["next"] == "done"
    assert all(0 <= h["target_accuracy"] <= 100 for h in st["history"])
    assert main(["export", *s, "--out", str(tmp_path / "out")]) == 0
    with open(tmp_path / "out" / "labels.csv", newline="") as fh:
        cur = {r["sample_id"]: r for r in csv.DictReader(fh)}
    assert cur[fix["sample_id"]]["label"] == fix["label"] and cur[fix["sample_id"]]["supersedes"]
    with open(tmp_path / "out" / "labels_history.csv", newline="") as fh:
        hist = [r for r in csv.DictReader(fh) if r["sample_id"] == fix["sample_id"]]
    assert [h["label"] for h in hist] == [old, fix["label"]]
    weights = torch.load(tmp_path / "out" / "model.pt", weights_only=True)
    assert any(k.endswith("weight") for k in weights)
    # a Label Studio export of the same answers imports as "unchanged"
    for t in tasks:
        k = int(t["data"]["sample_id"])
        label = cur[str(k)]["label"]
        t["annotations"] = [
            {
                "completed_by": 3,
                "result": [
                    {"type": "choices", "from_name": "label", "value": {"choices": [label]}}
                ],
            }
        ]
    (tmp_path / "ls.json").write_text(json.dumps(tasks))
    assert main(["label", "import", str(tmp_path / "ls.json"), *s]) == 0
    assert "0 new, 0 corrections, 0 skipped, 30 unchanged" in _flat(capsys.readouterr().out)


@pytest.fixture
def queried(tmp_path: Path) -> tuple[Project, list[dict], Path]:
    """A toy project with one open round of 5 samples and its export rows."""
    cfg = preset_config("toy", "eada", 0, TOY)
    proj = init_project(tmp_path / "p", cfg)
    out = proj.query(budget=5)
    rows = truth_rows(proj, out["files"]["csv"])
    return proj, rows, tmp_path


def _bad(proj: Project, path: Path, match: str, **kw) -> None:
    before = _counts(proj.folder)
    with pytest.raises((ImportValidationError, ImportFileError, FileNotFoundError), match=match):
        proj.import_labels(path, **kw)
    assert _counts(proj.folder) == before  # nothing written


def test_bad_imports_are_refused_whole(queried) -> None:
    proj, rows, tmp = queried
    f = tmp / "bad.csv"
    src_id = proj.store.samples("source")[0]["id"]
    unqueried = next(
        r["id"]
        for r in proj.store.samples("target")
        if str(r["id"]) not in {x["sample_id"] for x in rows}
    )
    cases = [
        ([{**rows[0], "sample_id": "999999"}], "unknown sample id 999999"),
        ([{**rows[0], "sample_id": str(unqueried)}], "never queried"),
        ([{**rows[0], "sample_id": str(src_id)}], "source sample"),
        ([{**rows[0], "sample_id": "12a"}], "not an integer"),
        # a valid row with a bad one: the whole file is refused
        ([rows[1], {**rows[0], "sample_id": "999999"}], "1 problem"),
    ]
    for data, match in cases:
        _write_csv(f, data)
        _bad(proj, f, match)
    f.write_text("sample_id,klass\n1,plus\n")
    _bad(proj, f, "must name a 'label' column")
    f.write_text("sample_id,label\n1,plus,extra\n")
    _bad(proj, f, "more values than header")
    j = tmp / "bad.json"
    j.write_text('[{"sample_id": 1, "label": "plus"')
    _bad(proj, j, "malformed JSON")
    j.write_text('{"a": 1}')
    _bad(proj, j, "must be a list")
    ls = [
        {
            "data": {"sample_id": int(rows[0]["sample_id"])},
            "annotations": [
                {"result": [{"type": "choices", "value": {"choices": [c]}}]} for c in proj.classes
            ],
        }
    ]
    j.write_text(json.dumps(ls))
    _bad(proj, j, "conflicting annotations")
    t = tmp / "labels.txt"
    t.write_text("x")
    _bad(proj, t, "unknown label file type")
    _bad(proj, tmp / "missing.csv", "not found")
    # duplicates that agree are fine; an unqueried sample passes with the explicit flag
    _write_csv(f, [rows[0], rows[0], {**rows[1], "sample_id": str(unqueried), "label": "plus"}])
    out = proj.import_labels(f, allow_unqueried=True)
    assert out["new"] == 2


def test_cli_reports_bad_input_and_exit_code(queried, capsys) -> None:
    proj, rows, tmp = queried
    _write_csv(tmp / "b.csv", [{**rows[0], "sample_id": "999999"}])
    assert main(["label", "import", str(tmp / "b.csv"), "--store", str(proj.folder)]) == 2
    err = _flat(capsys.readouterr().err)
    assert "unknown sample id 999999" in err and "nothing was imported" in err


def test_newer_schema_and_tampered_checkpoint_are_refused(tmp_path: Path) -> None:
    cfg = preset_config("toy", "eada", 0, TOY)
    proj = init_project(tmp_path / "p", cfg)
    proj.train()
    ck = proj.store.latest_checkpoint()
    (tmp_path / "p" / ck["path"]).write_bytes(b"not a checkpoint")
    with pytest.raises(StoreError, match="does not match its recorded SHA-256"):
        proj.query()
    with proj.store.transaction():
        proj.store.set_meta("schema_version", "99")
    proj.close()
    with pytest.raises(StoreError, match="newer eada"):
        Store(tmp_path / "p")
    with pytest.raises(StoreError, match="no project store"):
        Project(tmp_path / "nothing")
    with pytest.raises(StoreError, match="already exists"):
        init_project(tmp_path / "p", cfg)


def _images(root: Path, n: int = 6) -> None:
    rng = np.random.default_rng(0)
    for domain in ("src", "tgt"):
        for k, cls in enumerate(("bike", "mug")):
            d = root / domain / "images" / cls
            d.mkdir(parents=True)
            for i in range(n):
                a = (rng.random((12, 12, 3)) * 80 + 150 * k).astype(np.uint8)
                Image.fromarray(a).save(d / f"{i:02d}.png")


def test_image_folders_paths_confined_and_corrupt_images(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _images(data)
    (data / "tgt" / "images" / "mug" / "bad.png").write_bytes(b"\x89PNG broken")
    args = [
        "--source-dir",
        str(data / "src"),
        "--target-dir",
        str(data / "tgt"),
        "--image-size",
        "20",
        "--set",
        "active.budget_per_round=3",
        "--set",
        "train.epochs=2",
        "--set",
        "active.rounds_at=[1]",
    ]
    assert main(["init", "--store", str(tmp_path / "p0"), *args]) == 2  # corrupt image
    (data / "tgt" / "images" / "mug" / "bad.png").unlink()
    assert main(["init", "--store", str(tmp_path / "p"), *args]) == 0
    proj = Project(tmp_path / "p")
    out = proj.query(budget=3)
    rows = json.loads(Path(out["files"]["json"]).read_text())["samples"]
    assert all(Path(r["path"]).is_file() for r in rows)
    outside = tmp_path / "outside.png"
    Image.fromarray(np.zeros((12, 12, 3), np.uint8)).save(outside)
    link = data / "tgt" / "images" / "mug" / "link.png"
    link.symlink_to(outside)
    f = tmp_path / "paths.json"
    label = rows[0]["predicted"]
    for path, match in (
        (str(outside), "outside the registered data roots"),
        (str(data / "tgt" / "images" / ".." / ".." / ".." / "outside.png"), "outside"),
        (str(link), "outside the registered data roots"),
        (str(data / "src" / "images" / "bike" / "00.png"), "source sample"),
    ):
        f.write_text(json.dumps([{"path": path, "label": label}]))
        _bad(proj, f, match, allow_unqueried=True)
    # the queried image gets corrupted after init: refused, nothing written
    victim = Path(rows[0]["path"])
    good = victim.read_bytes()
    victim.write_bytes(good[:20])
    f.write_text(json.dumps([{"path": rows[0]["path"], "label": label}]))
    _bad(proj, f, "changed since")
    victim.write_bytes(good)
    # by path (absolute, or relative to a root) it imports
    rel = Path(rows[1]["path"]).relative_to((data / "tgt").resolve())
    f.write_text(
        json.dumps([{"path": rows[0]["path"], "label": label}, {"path": str(rel), "label": label}])
    )
    assert proj.import_labels(f)["new"] == 2
