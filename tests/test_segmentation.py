"""Segmentation Active DA: metrics, data layouts, per-pixel energies and image aggregation,
image selection, the DeepLab models, configs, and the tiny synthetic pair end to end."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from eada import energy as energy_ops
from eada.cli import main
from eada.config import ConfigError
from eada.segmentation.cli import resolve_seg_config
from eada.segmentation.config import (
    SegActiveConfig,
    SegModelConfig,
    SegOptimConfig,
    parse_seg_config,
)
from eada.segmentation.data import (
    CITYSCAPES_CLASSES,
    IGNORE_INDEX,
    FolderSegDataset,
    cityscapes_pairs,
    gtav_pairs,
    load_seg_task,
    make_synthetic_pair,
    map_label_ids,
)
from eada.segmentation.metrics import ConfusionMatrix, confusion_matrix
from eada.segmentation.model import ASPPSum, build_seg_model
from eada.segmentation.scoring import ImageScores, aggregate, pixel_scores, select_images
from eada.segmentation.train import (
    SegActiveTrainer,
    build_seg_optimizer,
    pixel_nll,
    plan_rounds,
    poly_lr,
)
from eada.strategies import BudgetTooLargeError

REPO = Path(__file__).resolve().parents[1]
SYN = REPO / "configs" / "seg_synthetic.yaml"
REAL = REPO / "configs" / "gtav_cityscapes.yaml"


@pytest.fixture(autouse=True)
def _one_thread(one_thread: None) -> None:
    """Every test of this file on one torch thread (conftest's ``one_thread``)."""


# -- metrics -----------------------------------------------------------------------------------


def test_confusion_and_iou_match_sklearn() -> None:
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    y = rng.integers(0, 5, size=(3, 17, 9))
    y[rng.random(y.shape) < 0.2] = IGNORE_INDEX
    p = rng.integers(0, 5, size=y.shape)
    p[0, 0, 0] = 4
    cm = ConfusionMatrix(5)
    for i in range(3):  # accumulate over batches
        cm.update(torch.from_numpy(p[i]), torch.from_numpy(y[i]))
    keep = y != IGNORE_INDEX
    expected = metrics.confusion_matrix(y[keep], p[keep], labels=list(range(5)))
    np.testing.assert_array_equal(cm.matrix.numpy(), expected)
    iou = metrics.jaccard_score(y[keep], p[keep], labels=list(range(5)), average=None)
    np.testing.assert_allclose(cm.per_class_iou(), iou)
    assert cm.miou() == pytest.approx(iou.mean())
    assert cm.pixel_accuracy() == pytest.approx((y[keep] == p[keep]).mean())


def test_absent_class_is_nan_and_left_out_of_the_mean() -> None:
    cm = ConfusionMatrix(3)
    cm.update(torch.tensor([0, 1, 1, 0]), torch.tensor([0, 1, 0, 255]))
    iou = cm.per_class_iou()
    assert iou[0] == pytest.approx(0.5) and iou[1] == pytest.approx(0.5) and np.isnan(iou[2])
    assert cm.miou() == pytest.approx(0.5)
    s = cm.summary(["a", "b", "c"])
    assert s["miou"] == pytest.approx(50.0) and s["pixels"] == 3


def test_confusion_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="differ"):
        confusion_matrix(torch.zeros(2, 2), torch.zeros(2, 3), 2)
    with pytest.raises(ValueError, match="labels outside"):
        confusion_matrix(torch.zeros(3), torch.tensor([0, 2, 255]), 2)
    with pytest.raises(ValueError, match="predictions outside"):
        confusion_matrix(torch.tensor([0, 5]), torch.tensor([0, 1]), 2)


# -- data --------------------------------------------------------------------------------------


def test_label_id_mapping_is_the_standard_19_classes() -> None:
    ids = np.arange(256, dtype=np.uint8)
    train = map_label_ids(ids)
    kept = ids[train != IGNORE_INDEX].tolist()
    assert kept == [7, 8, 11, 12, 13, 17, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 31, 32, 33]
    assert train[kept].tolist() == list(range(19))
    assert len(CITYSCAPES_CLASSES) == 19 and CITYSCAPES_CLASSES[13] == "car"


def _png(path: Path, arr: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path)


def _label_ids(h: int, w: int) -> np.ndarray:
    lab = np.full((h, w), 7, dtype=np.uint8)  # road
    lab[:, w // 2 :] = 26  # car
    lab[:5, :] = 0  # unlabeled -> 255
    return lab


def test_gtav_and_cityscapes_layouts(tmp_path: Path) -> None:
    rgb = np.random.default_rng(0).integers(0, 255, size=(20, 40, 3), dtype=np.uint8)
    for name in ("00002.png", "00001.png"):
        _png(tmp_path / "gtav" / "images" / name, rgb)
        _png(tmp_path / "gtav" / "labels" / name, _label_ids(20, 40))
    pairs = gtav_pairs(tmp_path / "gtav")
    assert [p[0].name for p in pairs] == ["00001.png", "00002.png"]
    ds = FolderSegDataset("gtav", pairs, size=(16, 8))
    x, y, i = ds[0]
    assert x.shape == (3, 8, 16) and y.shape == (8, 16) and i == 0
    assert set(y.unique().tolist()) == {0, 13, IGNORE_INDEX}
    x2, y2, _ = ds.with_crop((8, 4))[1]
    assert x2.shape == (3, 4, 8) and y2.shape == (4, 8)

    cs = tmp_path / "cs"
    for split in ("train", "val"):
        stem = "aachen_000000_000019"
        _png(cs / "leftImg8bit" / split / "aachen" / f"{stem}_leftImg8bit.png", rgb)
        _png(cs / "gtFine" / split / "aachen" / f"{stem}_gtFine_labelIds.png", _label_ids(20, 40))
    val = FolderSegDataset("val", cityscapes_pairs(cs, "val"), size=(16, 8), label_full_res=True)
    x, y, _ = val[0]
    assert x.shape == (3, 8, 16) and y.shape == (20, 40)  # evaluation at label resolution
    assert (y[:5] == IGNORE_INDEX).all() and (y[5:, :20] == 0).all() and (y[5:, 20:] == 13).all()


def test_layout_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="images"):
        gtav_pairs(tmp_path)
    _png(tmp_path / "images" / "1.png", np.zeros((4, 4, 3), np.uint8))
    (tmp_path / "labels").mkdir()
    with pytest.raises(FileNotFoundError, match="no label"):
        gtav_pairs(tmp_path)
    with pytest.raises(FileNotFoundError, match="leftImg8bit"):
        cityscapes_pairs(tmp_path, "train")


def test_synthetic_pair_is_deterministic_with_ignored_rims() -> None:
    a = make_synthetic_pair(4, 4, 2, image_size=24, seed=3)
    b = make_synthetic_pair(4, 4, 2, image_size=24, seed=3)
    assert torch.equal(a.source.x, b.source.x) and torch.equal(a.val.y, b.val.y)
    a.check()
    assert a.source.x.shape == (4, 3, 24, 24) and len(a.target) == 4 and len(a.val) == 2
    labels = torch.cat([a.source.y.flatten(), a.target.y.flatten()])
    assert set(labels.unique().tolist()) <= {0, 1, 2, 3, IGNORE_INDEX}
    assert (labels == IGNORE_INDEX).any() and (labels > 0).any()
    # the domains differ in appearance: mean background colour shifts
    bg_s = a.source.x.permute(0, 2, 3, 1)[a.source.y == 0].mean(0)
    bg_t = a.target.x.permute(0, 2, 3, 1)[a.target.y == 0].mean(0)
    assert (bg_s - bg_t).abs().max() > 0.3


# -- per-pixel energies and aggregation --------------------------------------------------------


def test_pixel_scores_are_eada_energy_per_pixel() -> None:
    e = torch.randn(2, 5, 3, 4)
    f, u = pixel_scores(e, tau=0.5)
    rows = e.permute(0, 2, 3, 1).reshape(-1, 5)
    torch.testing.assert_close(f.flatten(), energy_ops.free_energy(rows, 0.5))
    torch.testing.assert_close(u.flatten(), energy_ops.mvsm(rows))
    assert float(f[1, 2, 3]) == pytest.approx(
        float(energy_ops.free_energy(e[1, :, 2, 3][None], 0.5)[0])
    )


def test_mean_free_energy_and_max_mvsm_are_the_exact_image_scores() -> None:
    """Brute force over every label map of a 3-pixel, 3-class image with
    E(x, y) = sum_p E_p(y_p): image F = sum_p F_p (= mean x pixels), image MvSM = max_p U_p."""
    e = torch.randn(1, 3, 1, 3, dtype=torch.float64) * 2
    f, u = pixel_scores(e)
    maps = itertools.product(range(3), repeat=3)
    totals = torch.tensor(
        [sum(float(e[0, c, 0, p]) for p, c in enumerate(y)) for y in maps], dtype=torch.float64
    )
    image_f = -torch.logsumexp(-totals, 0)
    assert float(aggregate(f, "mean")[0]) * 3 == pytest.approx(float(image_f))
    two = torch.sort(totals).values[:2]
    assert float(two[0] - two[1]) == pytest.approx(float(aggregate(u, "top_k", 1e-9)[0]))


def test_aggregations() -> None:
    s = torch.arange(8.0).reshape(1, 2, 4)
    assert aggregate(s, "mean").item() == pytest.approx(3.5)
    assert aggregate(s, "top_k", 0.25).item() == pytest.approx(6.5)  # top 2 of 8
    assert aggregate(s, "top_k", 0.3).item() == pytest.approx(6.0)  # ceil(2.4) = 3
    pred = torch.tensor([[[0, 0, 0, 0], [0, 0, 0, 1]]])
    assert aggregate(s, "class_balanced", predicted=pred).item() == pytest.approx((3 + 7) / 2)
    with pytest.raises(ValueError, match="predicted"):
        aggregate(s, "class_balanced")
    with pytest.raises(ValueError, match="top_k_share"):
        aggregate(s, "top_k", 0.0)
    with pytest.raises(ValueError, match=r"\(N, H, W\)"):
        aggregate(s[0], "mean")


def test_eada_selects_whole_images_in_two_steps() -> None:
    f = np.array([5.0, 1.0, 4.0, 3.0, 0.0, 2.0])
    u = np.array([-0.9, -0.0, -0.1, -0.5, -0.01, -0.2])
    scores = ImageScores(np.arange(6) + 10, f, u, np.zeros((6, 2)))
    sel = select_images(scores, 1, "eada", np.random.default_rng(0), alpha1=0.5)
    # step 1 keeps images {0, 2, 3} (highest F); step 2 the highest MvSM among them: 2
    assert sel.indices.tolist() == [2] and sel.info["n_stage1"] == 3
    rnd = select_images(scores, 3, "random", np.random.default_rng(0))
    assert len(set(rnd.indices.tolist())) == 3
    with pytest.raises(BudgetTooLargeError):
        select_images(scores, 4, "eada", np.random.default_rng(0), alpha1=0.5)


def test_round_plan_splits_the_total_budget() -> None:
    for total, n in ((0.01, 2975), (0.025, 2975), (0.05, 2975)):
        plan = plan_rounds(SegActiveConfig(budget_total=total), n)
        assert sum(p["budget"] for p in plan) == math.ceil(total * n)
        assert all(p["stage1"] == math.ceil(0.5 * p["pool_before"]) for p in plan)
    with pytest.raises(ValueError, match="too small to split"):
        plan_rounds(SegActiveConfig(budget_total=0.01), 100)
    with pytest.raises(ValueError, match="round 1"):
        plan_rounds(SegActiveConfig(budget_total=0.9, alpha1=0.1, rounds_at=[1]), 10)
    assert plan_rounds(SegActiveConfig(strategy="none"), 10) == []


# -- models, loss, optimiser -------------------------------------------------------------------


def test_deeplab_v2_resnet101_structure_and_frozen_bn() -> None:
    pytest.importorskip("torchvision")
    net = build_seg_model(SegModelConfig(), num_classes=19)  # weights=None: nothing downloaded
    assert isinstance(net.head, ASPPSum)
    assert [c.dilation for c in net.head.convs] == [(r, r) for r in (6, 12, 18, 24)]
    bb = net.backbone  # output stride 8: layer3/layer4 dilated 2/4 instead of strided
    assert bb.layer3[1].conv2.dilation == (2, 2) and bb.layer4[1].conv2.dilation == (4, 4)
    assert bb.layer3[0].conv2.stride == (1, 1) and bb.layer4[0].conv2.stride == (1, 1)
    assert sum(p.numel() for p in net.backbone.parameters()) > 42e6  # ResNet-101 trunk
    net.train()
    bns = [m for m in net.backbone.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert not any(m.training for m in bns) and not any(
        p.requires_grad for m in bns for p in m.parameters()
    )
    with torch.no_grad():
        out = net(torch.zeros(1, 3, 64, 64))
    assert out.shape == (1, 19, 8, 8)
    opt_cfg = SegOptimConfig(lr=1.0, head_lr_mult=10.0)
    groups = build_seg_optimizer(opt_cfg, net).param_groups
    assert [g["lr"] for g in groups] == [1.0, 10.0]


def test_deeplab_v3plus_head_and_bad_weights_path(tmp_path: Path) -> None:
    pytest.importorskip("torchvision")
    cfg = SegModelConfig(
        head="deeplabv3plus", backbone="tiny", aspp_rates=[1, 2, 3], freeze_bn=False
    )
    net = build_seg_model(cfg, 4)
    assert net(torch.zeros(2, 3, 32, 32)).shape == (2, 4, 16, 16)
    with pytest.raises(FileNotFoundError, match="weights file"):
        build_seg_model(SegModelConfig(backbone="resnet50", weights=str(tmp_path / "no.pt")), 19)


def test_pixel_nll_is_cross_entropy_with_ignore() -> None:
    e = torch.randn(2, 4, 3, 3)
    y = torch.randint(0, 4, (2, 6, 6))
    y[0, 0] = IGNORE_INDEX
    up = F.interpolate(e, size=(6, 6), mode="bilinear", align_corners=False)
    expected = F.cross_entropy(-up, y, ignore_index=IGNORE_INDEX)
    torch.testing.assert_close(pixel_nll(e, y), expected)
    assert pixel_nll(e, torch.full((2, 3, 3), IGNORE_INDEX)).item() == 0.0


def test_poly_lr() -> None:
    assert poly_lr(2.5e-4, 0, 10) == pytest.approx(2.5e-4)
    assert poly_lr(1.0, 10, 10) == 0.0
    assert poly_lr(1.0, 5, 10, 0.9) == pytest.approx(0.5**0.9)
    with pytest.raises(ValueError, match="outside"):
        poly_lr(1.0, 11, 10)


# -- configs and the CLI -----------------------------------------------------------------------


def _syn_raw() -> dict:
    import yaml

    return yaml.safe_load(SYN.read_text())


def test_config_errors_are_named() -> None:
    raw = _syn_raw()
    raw["train"]["itrations"] = 3
    raw["active"]["strategy"] = "entropy"
    with pytest.raises(ConfigError) as err:
        parse_seg_config(raw)
    msg = str(err.value)
    assert "train.itrations" in msg and "whole images do not have" in msg
    with pytest.raises(ConfigError, match="must end before"):
        resolve_seg_config(str(SYN), None, ["active.rounds_at=[100,240]"], 0)
    with pytest.raises(ConfigError, match="batch_size >= 2"):
        resolve_seg_config(
            str(REAL), None, ["model.head=deeplabv3plus", "model.aspp_rates=[12,24,36]"], 0
        )
    with pytest.raises(ConfigError, match="larger than source_size"):
        resolve_seg_config(str(REAL), None, ["data.source_crop=[2000,512]"], 0)


def test_real_protocol_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = resolve_seg_config(str(REAL), None, [], 0)
    assert (cfg.model.backbone, cfg.model.head, cfg.model.aspp_rates) == (
        "resnet101",
        "deeplabv2",
        [6, 12, 18, 24],
    )
    assert (cfg.optim.lr, cfg.optim.momentum, cfg.optim.weight_decay) == (2.5e-4, 0.9, 1e-4)
    assert (cfg.train.gamma, cfg.active.alpha1, cfg.data.source_size) == (0.001, 0.5, (1280, 720))
    assert main(["run", str(REAL), "--dry-run", "--method", "random"]) == 0
    out = capsys.readouterr().out
    assert "config valid; no data touched" in out and "strategy random" in out
    assert "label 30 images" in out and "label 29 images" in out  # 149 = 5% of 2,975 images


# -- the synthetic pair end to end -------------------------------------------------------------


def test_synthetic_pair_end_to_end(tmp_path: Path) -> None:
    """Energies, two-step image selection, training with L_fea, mIoU, run records via the CLI."""
    out = tmp_path / "run"
    args = [
        "run",
        str(SYN),
        "--out",
        str(out),
        "--set",
        "train.iterations=90",
        "--set",
        "active.rounds_at=[40,60]",
        "--set",
        "train.log_every=30",
    ]
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    meta = json.loads((out / "meta.json").read_text())
    run = json.loads((out / "runs.jsonl").read_text().splitlines()[0])["results"]
    assert meta["torch"] and results["task"] == "segmentation"
    rounds = run["rounds"]
    assert [r["n_labeled"] for r in rounds] == [0, 5, 10]  # ceil(0.15 * 64) = 10 over 2 rounds
    labeled = [i for r in rounds[1:] for i in r["selected"]]
    assert sorted(labeled) == run["labeled_indices"] and len(set(labeled)) == 10
    for r in rounds[1:]:
        info = r["selection_info"]
        assert info["n_stage1"] == math.ceil(0.5 * r["pool_before"])
        assert info["free_energy_aggregation"] == "mean" and info["mvsm_aggregation"] == "top_k"
        # step 1 keeps the high-free-energy half: every pick is at or above its threshold
        assert min(r["selected_free_energy"]) >= info["free_energy_threshold"]
        assert r["selected_mvsm"] == sorted(r["selected_mvsm"], reverse=True)
        assert r["selected_ids"][0].startswith("synthetic_target/")
    losses = [h for h in run["history"] if "loss_align" in h]
    assert losses and all(math.isfinite(h["loss_align"]) for h in losses)
    assert any("loss_target" in h for h in run["history"])
    assert run["warnings"] == [] and results["warnings"] == []  # no L_fea runaway here
    final = run["final"]
    assert set(final["per_class_iou"]) == {"background", "square", "disc", "triangle"}
    assert final["miou"] == results["final"]["miou"]["mean"]
    print("synthetic mIoU after 90 iterations:", final["miou"])
    assert final["miou"] > 50.0  # learned far beyond chance in 90 iterations


def test_runaway_is_reported_by_the_segmentation_trainer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The segmentation loop runs the same check on its log windows and reports a find once."""
    from eada.segmentation import train as seg_train

    def fake(history, found, at, unit):  # finds a runaway in the second log window only
        assert unit == "log windows"
        if len(history) != 2:
            return None
        found.append({"kind": "alignment_runaway", **at, "message": "Delta x"})
        return "Delta x"

    monkeypatch.setattr(seg_train, "record_alignment_runaway", fake)
    out = tmp_path / "run"
    sets = ["train.iterations=20", "active.rounds_at=[10]", "train.log_every=10"]
    assert main(["run", str(SYN), "--out", str(out), *(a for x in sets for a in ("--set", x))]) == 0
    run = json.loads((out / "runs.jsonl").read_text().splitlines()[0])["results"]
    assert run["warnings"] == [{"kind": "alignment_runaway", "iteration": 20, "message": "Delta x"}]
    printed = capsys.readouterr()
    assert "warning (iteration 20): Delta x" in printed.err  # the progress lines
    assert "warning (seed 0, iteration 20): Delta x" in printed.out  # the summary


def test_trainer_uses_labels_only_of_selected_images() -> None:
    cfg = resolve_seg_config(
        str(SYN),
        "eada",
        ["train.iterations=12", "active.rounds_at=[6]", "data.n_target=20", "data.n_val=4"],
        0,
    )
    task = load_seg_task(cfg.data)
    reads: list[int] = []
    target = task.target
    original_get = target.get

    def spy(i: int, with_label: bool = True) -> tuple[torch.Tensor, torch.Tensor, int]:
        if with_label:
            reads.append(i)
        return original_get(i, with_label)

    target.get = spy  # type: ignore[method-assign]
    trainer = SegActiveTrainer(cfg, task)
    assert len(trainer.labeled_stream) == 0
    for _ in range(6):
        trainer.train_step()
    rec = trainer.select_round(trainer.plan[0])
    assert rec["budget"] == 3 and trainer.labeled.sum() == 3
    assert set(trainer.labeled_stream.indices.tolist()) == set(rec["selected"])
    assert not set(trainer.unlabeled_stream.indices.tolist()) & set(rec["selected"])
    assert reads == []  # training on the pool and scoring it never read a label
    for _ in range(3):
        trainer.train_step()
    assert reads and set(reads) <= set(rec["selected"])
