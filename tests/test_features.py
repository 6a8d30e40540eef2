"""Feature-matrix input (.npy/.npz/.mat/.parquet), label maps, normalisation, cache keys."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from eada.config import ConfigError, parse_config
from eada.data.features import (
    cache_key,
    feature_domains,
    normalize_features,
    read_feature_file,
)
from eada.data.tasks import load_task
from eada.experiment import run_once
from support import real_data

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _data(n: int = 40, d: int = 6, seed: int = 0, offset: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 3 + offset  # raw labels 1..3, like the SURF release
    x = rng.normal(size=(n, d)) + 3.0 * (y[:, None] == np.arange(offset, offset + d)[None, :])
    return x.astype(np.float32), y


def test_every_format_reads_the_same(tmp_path: Path) -> None:
    from scipy.io import savemat

    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    x, y = _data()
    np.save(tmp_path / "f.npy", x)
    np.savetxt(tmp_path / "y.txt", y, fmt="%d")
    np.savez(tmp_path / "f.npz", features=x, labels=y)
    savemat(tmp_path / "f.mat", {"fts": x, "labels": y[:, None]})
    cols = {f"f{i}": x[:, i] for i in range(x.shape[1])} | {"label": y}
    pq.write_table(pa.table(cols), tmp_path / "wide.parquet")
    pq.write_table(pa.table({"features": list(x), "y": y}), tmp_path / "list.parquet")
    reads = [
        read_feature_file(tmp_path / "f.npy", labels=tmp_path / "y.txt"),
        read_feature_file(tmp_path / "f.npz"),
        read_feature_file(tmp_path / "f.mat"),
        read_feature_file(tmp_path / "wide.parquet"),
        read_feature_file(tmp_path / "list.parquet"),
    ]
    for xr, yr in reads:
        np.testing.assert_allclose(xr, x, rtol=1e-6)
        np.testing.assert_array_equal(yr, y)


def test_bad_feature_files(tmp_path: Path) -> None:
    x, y = _data()
    np.save(tmp_path / "f.npy", x)
    with pytest.raises(ValueError, match="separate labels"):
        read_feature_file(tmp_path / "f.npy")
    np.savez(tmp_path / "k.npz", emb=x, labels=y)
    with pytest.raises(ValueError, match=r"k\.npz: .*features_key"):
        read_feature_file(tmp_path / "k.npz")
    assert read_feature_file(tmp_path / "k.npz", features_key="emb")[0].shape == x.shape
    np.savez(tmp_path / "n.npz", features=np.full((2, 2), np.nan), labels=[0, 1])
    with pytest.raises(ValueError, match="NaN"):
        read_feature_file(tmp_path / "n.npz")
    np.savez(tmp_path / "m.npz", features=x, labels=y[:-1])
    with pytest.raises(ValueError, match="40 feature rows but 39 labels"):
        read_feature_file(tmp_path / "m.npz")
    (tmp_path / "f.csv").write_text("1,2\n")
    with pytest.raises(ValueError, match="unsupported"):
        read_feature_file(tmp_path / "f.csv")


def test_class_map_from_source_and_outside_labels() -> None:
    xs, ys = _data()
    xt, yt = _data(seed=1)
    doms = feature_domains({"source": (xs, ys), "target": (xt, yt)})
    assert doms["source"].classes == ["1", "2", "3"]
    assert doms["target"].y.tolist()[:4] == [0, 1, 2, 0]
    yt_bad = yt.copy()
    yt_bad[3] = 9
    with pytest.raises(ValueError, match=r"target has label ids outside the class map.*\[9\]"):
        feature_domains({"source": (xs, ys), "target": (xt, yt_bad)})
    with pytest.raises(ValueError, match="6-d"):
        feature_domains({"source": (xs, ys), "target": (xt[:, :4], yt)})


def test_normalisations() -> None:
    x = np.abs(np.random.default_rng(0).normal(size=(50, 4))) + 0.1
    z = normalize_features(x, "zscore")
    np.testing.assert_allclose(z.mean(0), 0, atol=1e-9)
    np.testing.assert_allclose(z.std(0), 1, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(normalize_features(x, "l2"), axis=1), 1)
    l1z = normalize_features(x, "l1_zscore")
    np.testing.assert_allclose(l1z, normalize_features(x / x.sum(1, keepdims=True), "zscore"))


def test_cache_key_tracks_model_weights_transform_and_files(tmp_path: Path) -> None:
    f = tmp_path / "a.jpg"
    f.write_bytes(b"1")
    base = cache_key("m", "w", "t", [f])
    assert base == cache_key("m", "w", "t", [f])
    assert len({base, cache_key("m2", "w", "t", [f]), cache_key("m", "w2", "t", [f])}) == 3
    assert cache_key("m", "w", "t2", [f]) != base
    f.write_bytes(b"22")
    assert cache_key("m", "w", "t", [f]) != base


def test_feature_task_trains_with_eada(tmp_path: Path) -> None:
    xs, ys = _data(60)
    xt, yt = _data(60, seed=2)
    np.savez(tmp_path / "s.npz", features=xs, labels=ys)
    np.savez(tmp_path / "t.npz", features=xt + 0.5, labels=yt)
    raw = {
        "data": {"kind": "features", "source": str(tmp_path / "s.npz"),
                 "target": str(tmp_path / "t.npz"), "normalize": "zscore"},
        "model": {"name": "mlp", "hidden": [16], "bottleneck_dim": 8},
        "train": {"epochs": 3, "batch_size": 8},
        "active": {"rounds_at": [1, 2], "budget_per_round": 0.05},
    }  # fmt: skip
    cfg = parse_config(raw)
    task = load_task(cfg.data)
    assert task.target.input_shape == (6,) and task.target.classes == ["1", "2", "3"]
    run = run_once(cfg, task, record_stats=False)
    assert [r["n_labeled"] for r in run["results"]["rounds"]] == [0, 3, 6]
    with pytest.raises(ConfigError, match="normalize"):
        parse_config({**raw, "data": {**raw["data"], "normalize": "minmax"}})


@pytest.mark.data
def test_real_surf_features() -> None:
    root = real_data("office_caltech10_surf")
    cfg = parse_config(
        {
            "data": {
                "kind": "features",
                "source": str(root / "Caltech10_SURF_L10.mat"),
                "target": str(root / "amazon_SURF_L10.mat"),
                "normalize": "l1_zscore",
            },
            "model": {"name": "mlp"},
        }
    )
    task = load_task(cfg.data)
    assert (len(task.source), len(task.target), task.source.num_classes) == (1123, 958, 10)
    assert task.source.classes == [str(i) for i in range(1, 11)]
    # 1-NN on these features reproduces the published C->A point (JDA, Long et al. 2013): 23.7%
    xs, xt = task.source.x, task.target.x  # type: ignore[union-attr]
    nn_idx = torch.cdist(xt.double(), xs.double()).argmin(dim=1)
    acc = 100 * (task.source.y[nn_idx] == task.target.y).double().mean().item()
    assert acc == pytest.approx(23.7, abs=0.05)
