"""The fine-tuning input pipeline (issue 29): the decode cache, views per batch, persistent
loaders (worker pools counted), and equal results with the old path where the views are the
same."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from eada.config import parse_config
from eada.data import batches as batches_mod
from eada.data.batches import chunks, iterate_items
from eada.data.decoded import decode_caches, gather_crops, plan_cache
from eada.data.images import scan_domain_folder, write_image_list
from eada.data.tasks import load_task
from eada.data.transforms import (
    BatchParams,
    TransformSpec,
    batch_view,
    build_transform,
    draw_batch_params,
    normalization_for,
)
from eada.experiment import run_once

sys.path.insert(0, str(Path(__file__).parent))
from support import real_data
from test_images import _make_domain

OFFICE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "office31"
#: every view deterministic: old and new paths must then give the same run, bit for bit
FIXED_VIEWS = {
    "resize": 32,
    "crop": 32,
    "test_resize": 32,
    "jitter": None,
    "scoring_view": "test",
    "unlabeled_view": "train",
}


@pytest.fixture
def factory_module(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    return "test_images:tiny_backbone"


def _raw(src: Path, tgt: Path, tmp: Path, factory: str, **data: Any) -> dict[str, Any]:
    return {
        "name": "pipeline",
        "device": "cpu",
        "data": {
            "kind": "images",
            "source": str(src),
            "target": str(tgt),
            "transforms": {"resize": 36, "crop": 32, "test_resize": 36},
            "workers": 0,
            "cache_dir": str(tmp / "features"),
            "decode_cache_dir": str(tmp / "decoded"),
            "allow_outside_root": True,
            **data,
        },
        "model": {
            "name": "backbone",
            "backbone": "tiny",
            "factory": factory,
            "weights": None,
            "bottleneck_dim": 4,
        },
        "optim": {"name": "adadelta", "lr": 0.1, "backbone_lr_mult": 0.1},
        "train": {"epochs": 3, "batch_size": 8, "eval_batch_size": 16},
        "active": {"strategy": "eada", "rounds_at": [1, 2], "budget_per_round": 2},
    }


def _run(raw: dict[str, Any]) -> dict[str, Any]:
    cfg = parse_config(raw)
    torch.manual_seed(0)
    task = load_task(cfg.data, 0, cfg.model)
    return run_once(cfg, task, record_stats=False)["results"]


def _trace(res: dict[str, Any]) -> list[Any]:
    return [(h.get("loss"), h.get("metrics", {}).get("target")) for h in res["history"]]


def test_cached_views_are_the_old_views(tmp_path: Path) -> None:
    """The cache holds what the PIL transforms make: the test view equals the old path's
    tensor exactly, the train view's crop (no jitter) too, for the same corner."""
    src = _make_domain(tmp_path, "d", n=3)
    il = scan_domain_folder(src)
    spec = TransformSpec(resize=36, crop=32, test_resize=40, jitter=None)
    norm = normalization_for("resnet50")
    plan = plan_cache("d", il.paths, spec, ["square", "shorter", "test"])
    msgs: list[str] = []
    (cache,) = decode_caches([plan], tmp_path / "dec", 100, 2, msgs.append) or []
    assert "decode cache: " in msgs[0] and "to decode into" in msgs[0]
    img = Image.open(il.paths[0]).convert("RGB")
    old_test = build_transform("test", spec, norm)(img)
    zero = torch.zeros(1, dtype=torch.long)
    crops = torch.from_numpy(gather_crops(cache, "test", [0], zero, zero, 32))
    fixed = BatchParams(zero, zero, None, None, None)
    new_test = batch_view(crops, fixed, norm, torch.device("cpu"))
    assert torch.equal(new_test[0], old_test)
    from torchvision.transforms import functional as F

    top, left = torch.tensor([3]), torch.tensor([1])
    old_train = build_transform("train", spec, norm)  # Resize, RandomCrop: cut by hand
    resized = F.resize(img, [36, 36])
    want = old_train.transforms[-2:][1](old_train.transforms[-2](F.crop(resized, 3, 1, 32, 32)))
    crops = torch.from_numpy(gather_crops(cache, "square", [0], top, left, 32))
    got = batch_view(crops, BatchParams(top, left, None, None, None), norm, torch.device("cpu"))
    assert torch.equal(got[0], want)
    # a second plan of the same images reads the file: nothing decoded again
    msgs.clear()
    decode_caches([plan], tmp_path / "dec", 100, 2, msgs.append)
    assert "read from" in msgs[0]


def test_jitter_per_sample_matches_torchvision_tensor_jitter() -> None:
    """Each sample gets its own factors in its own order, with torchvision's tensor formulas
    (checked against ``torchvision.transforms.functional`` on each sample alone)."""
    from torchvision.transforms import functional as F

    g = torch.Generator().manual_seed(1)
    crops = torch.randint(0, 256, (5, 8, 8, 3), dtype=torch.uint8, generator=g)
    spec = TransformSpec(resize=8, crop=8, test_resize=8)
    hw = torch.full((5,), 8)
    p = draw_batch_params("train", spec, hw, hw, g)
    from eada.data.transforms import Normalization

    ident = Normalization("none", (0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    out = batch_view(crops, p, ident, torch.device("cpu"))
    ops = [F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue]
    for k in range(5):
        x = crops[k].permute(2, 0, 1).float() / 255
        for op in p.order[k].tolist():
            x = ops[op](x, float(p.factors[k, op]))
        torch.testing.assert_close(out[k], x, atol=2e-5, rtol=0)
    assert len({tuple(o) for o in p.order.tolist()}) > 1  # orders differ between samples


def test_cache_over_the_limit_says_so_and_runs_without(tmp_path: Path, factory_module: str):
    src, tgt = _make_domain(tmp_path, "s", n=4), _make_domain(tmp_path, "t", n=4, shift=20)
    msgs: list[str] = []
    spec = TransformSpec(resize=2000, crop=32, test_resize=2000)
    il = scan_domain_folder(src)
    plan = plan_cache("s", il.paths, spec, ["square"])
    assert plan.nbytes == 8 * 2000 * 2000 * 3  # stated before anything is decoded
    assert decode_caches([plan], tmp_path / "dec", 1, 1, msgs.append) is None
    assert "over data.decode_cache_mb: 1 MiB" in msgs[0] and "decoding every batch" in msgs[0]
    assert not (tmp_path / "dec").exists()
    # and a run with a too-small limit trains from the files, with the same message
    raw = _raw(src, tgt, tmp_path, factory_module, decode_cache_mb=1)
    raw["data"]["transforms"] = {"resize": 600, "crop": 32, "test_resize": 600}
    cfg = parse_config(raw)
    task = load_task(cfg.data, 0, cfg.model)
    assert task.target.decode_cache is None and task.notes["decode_cache"] == "off"


@pytest.mark.parametrize("data", [{}, {"decode_cache_mb": 0, "workers": 2}])
def test_same_run_as_the_old_path_where_the_views_are_the_same(
    tmp_path: Path, factory_module: str, data: dict[str, Any]
) -> None:
    """Deterministic views: the decode cache (no workers), and persistent loaders with 2
    workers, give the old path's run exactly (losses, accuracies every epoch)."""
    src, tgt = _make_domain(tmp_path, "s", n=8), _make_domain(tmp_path, "t", n=8, shift=20)
    old = _raw(src, tgt, tmp_path, factory_module, decode_cache_mb=0, persistent_workers=False)
    old["data"]["transforms"] = FIXED_VIEWS
    new = _raw(src, tgt, tmp_path, factory_module, **data)
    new["data"]["transforms"] = FIXED_VIEWS
    assert _trace(_run(new)) == _trace(_run(old))


class _PoolCounter:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from torch.utils.data import dataloader

        self.n = 0
        real = dataloader._MultiProcessingDataLoaderIter.__init__

        def counting(it: Any, loader: Any) -> None:
            self.n += 1
            real(it, loader)

        monkeypatch.setattr(dataloader._MultiProcessingDataLoaderIter, "__init__", counting)


@pytest.fixture
def office80(tmp_path: Path) -> tuple[Path, Path]:
    """40 amazon(subset) and 40 webcam images of ``../shared/data/office31`` as list files."""
    real_data("office31/webcam")
    out = []
    for dom in ("amazon", "webcam"):
        il = scan_domain_folder(OFFICE / dom)
        keep = [i for i, y in enumerate(il.labels) if y < 4][:40]
        il.paths, il.labels = [il.paths[i] for i in keep], [il.labels[i] for i in keep]
        il.classes = il.classes[:4]
        out.append(write_image_list(il, tmp_path / f"{dom}.txt", checksums=False))
    return out[0], out[1]


def test_worker_pools_do_not_grow_with_epochs(
    office80: tuple[Path, Path],
    tmp_path: Path,
    factory_module: str,
    monkeypatch: pytest.MonkeyPatch,
    one_thread: None,
) -> None:
    """80 real images, data.workers 2: the old path started a pool every pass (the labeled
    stream, smaller than a batch, one every step); persistent loaders start one a stream and
    view, the same number for 2 epochs as for 6; the decode cache starts none."""
    src, tgt = office80
    counts = {}
    for name, data, epochs in [
        ("old2", {"decode_cache_mb": 0, "persistent_workers": False}, 2),
        ("old6", {"decode_cache_mb": 0, "persistent_workers": False}, 6),
        ("persistent2", {"decode_cache_mb": 0}, 2),
        ("persistent6", {"decode_cache_mb": 0}, 6),
        ("cache6", {}, 6),
    ]:
        counter = _PoolCounter(monkeypatch)
        raw = _raw(src, tgt, tmp_path, factory_module, workers=2, **data)
        raw["train"]["epochs"] = epochs
        rounds = [1] if epochs == 2 else [1, 3, 5]
        raw["active"] = {"strategy": "eada", "rounds_at": rounds, "budget_per_round": 3}
        _run(raw)
        batches_mod.LOADERS.close()
        counts[name] = counter.n
    # streams: source train, target unlabeled, target train (labeled); evaluation: source
    # and target test; scoring: target score
    assert counts["persistent2"] == counts["persistent6"] <= 6
    assert counts["cache6"] == 0
    assert counts["old6"] > counts["old2"] > counts["persistent2"]
    print("worker pools started:", counts)


def test_a_pass_read_while_another_is_open_gets_its_own_loader(tmp_path: Path) -> None:
    """Two passes of one view read at once (interleaved) each get a loader; read one after
    the other, they share one."""
    from eada.data.datasets import ImageDomain

    il = scan_domain_folder(_make_domain(tmp_path, "d", n=4))
    spec = TransformSpec(resize=36, crop=32, test_resize=36)
    tf = {"test": build_transform("test", spec, normalization_for("resnet50"))}
    d = ImageDomain(il, tf, (3, 32, 32), workers=1, current="test")
    pool = batches_mod.LoaderPool()
    b = chunks(torch.arange(8), 2)
    first = pool.read(d, b)
    next(first)
    second = pool.read(d, b)
    xs = [x for x, _ in second]
    assert pool.pools_started == 2
    rest = [x for x, _ in first]
    assert len(xs) == 4 and len(rest) == 3
    for _ in range(3):
        assert len(list(pool.read(d, b))) == 4
    assert pool.pools_started == 2
    pool.close()
    assert np.allclose(torch.cat(xs).numpy(), torch.cat([x for x, _ in iterate_items(d, b)]))


# -- the step's read-backs (train.sync_every) ------------------------------------------------
def _toy(sync_every: int, *extra: str) -> Any:
    from eada.data.tasks import load_task as load
    from eada.hparams import preset_config
    from eada.train import ActiveDATrainer

    sets = ["train.epochs=3", "active.rounds_at=[1]", f"train.sync_every={sync_every}", *extra]
    cfg = preset_config("toy", "eada", 0, sets)
    return ActiveDATrainer(cfg, load(cfg.data, 0))


def test_losses_read_back_every_n_steps_give_the_same_run(monkeypatch: pytest.MonkeyPatch):
    """``train.sync_every 10``: the losses and Delta stay on the device (here the CPU stands
    in for it: every read-back of a tensor is counted) and are read once a window, with the
    same history as reading every step."""
    reads = {"n": 0}
    for name in ("__float__", "__bool__", "item"):
        real = getattr(torch.Tensor, name)

        def counted(self: torch.Tensor, *a: Any, _real: Any = real) -> Any:
            reads["n"] += 1
            return _real(self, *a)

        monkeypatch.setattr(torch.Tensor, name, counted)
    counts, hist = {}, {}
    for every in (1, 10):
        tr = _toy(every)
        steps = tr.steps_per_epoch()
        assert tr.sync_every == every
        sums: dict[str, Any] = {}
        reads["n"] = 0
        for _ in range(steps):
            for k, v in tr._train_step(lazy=every > 1).items():
                sums[k] = sums.get(k, 0.0) + v
        counts[every] = reads["n"] / steps
        res = _toy(every).run()
        hist[every] = [
            (h["loss"], h["delta"], h["metrics"]["target"]["accuracy"]) for h in res.history
        ]
    assert counts[10] == 0 and counts[1] >= 5  # no read-back inside a window
    for a, b in zip(hist[1], hist[10], strict=True):
        assert a[2] == b[2] and a[0] == pytest.approx(b[0], rel=1e-12)
        assert a[1] == pytest.approx(b[1], rel=1e-12)


def test_a_non_finite_loss_is_caught_at_the_cadence() -> None:
    """NaN energies are the same error whether each step is read back (the CPU's default) or
    a window of steps at once (CUDA's; here ``sync_every 4`` on the CPU): on CUDA it was a
    ``FloatingPointError`` about the loss where the CPU named the energies."""
    from eada.energy import NonFiniteEnergiesError

    for every in (1, 4):
        tr = _toy(every)
        tr.task.source.x[:] = float("nan")  # every energy NaN from the first step
        with pytest.raises(NonFiniteEnergiesError, match="energies contain NaN or infinite") as e:
            tr.run()
        if every > 1:  # the window it happened in
            assert re.search(r"\(\d+ rows within steps 1-4 of epoch 1\)", str(e.value))
    # finite energies but a loss that is not: the loss's error, at the cadence
    from eada.train.step import NONFINITE_ROWS, StepMixin

    sums = {"loss": torch.tensor(float("inf")), NONFINITE_ROWS: torch.tensor(0)}
    with pytest.raises(FloatingPointError, match=r"non-finite within steps 1-4 of epoch 1"):
        StepMixin.check_finite(sums, "steps 1-4 of epoch 1")
    sums = {"loss": torch.tensor(1.0), NONFINITE_ROWS: torch.tensor(0)}
    StepMixin.check_finite(sums, "steps 1-4 of epoch 1")
    assert list(sums) == ["loss"]  # the count is taken out: it is no loss to log
    auto = _toy(0)  # auto: every step on the CPU (checked before the update), 25 on CUDA
    assert auto.sync_every == (25 if auto.device.type == "cuda" else 1)


def test_train_compile_wraps_the_step_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """``train.compile``: the step's forward passes go through ``torch.compile`` (recorded
    here: inductor needs a compiler this test does not assume); off by default.
    ``train.compile_mode`` turns it on with that mode; ``reduce-overhead`` (CUDA graphs)
    compiles as ``default`` on the CPU; both recorded in ``step_setup``."""
    from eada.train.forward import StepForward

    seen: list[Any] = []
    monkeypatch.setattr(torch, "compile", lambda m, **kw: seen.append((m, kw)) or m)
    tr = _toy(1)
    assert not seen and tr.step_setup["compile_mode"] is None and not tr.cuda_graphs
    tr = _toy(1, "train.compile=true")
    assert len(seen) == 1 and isinstance(seen[0][0], StepForward)
    assert seen[0][1] == {"mode": "default"} and tr.step_setup["compile_mode"] == "default"
    assert set(tr.train_step()) >= {"loss", "delta"}
    seen.clear()
    tr = _toy(1, "train.compile_mode=reduce-overhead", "device=cpu")
    assert tr.cfg.train.compile and seen[-1][1] == {"mode": "default"} and not tr.cuda_graphs
    if torch.cuda.is_available():  # CUDA graphs where there is CUDA (the GPU check's suite)
        tr = _toy(1, "train.compile_mode=reduce-overhead", "device=cuda")
        assert seen[-1][1] == {"mode": "reduce-overhead"} and tr.cuda_graphs
        assert tr.step_setup["compile_mode"] == "reduce-overhead"
        assert set(tr.train_step()) >= {"loss", "delta"}
    tr = _toy(1, "train.compile_mode=max-autotune")
    assert seen[-1][1] == {"mode": "max-autotune"}
    assert tr.step_setup["compile_mode"] == "max-autotune"


def test_compile_mode_and_cudnn_benchmark_in_a_config() -> None:
    """``train.compile_mode`` and ``train.cudnn_benchmark`` are config keys (``eada run
    --set``), validated; ``reduce-overhead`` is CUDA graphs on CUDA only; cuDNN's benchmark
    flag is set (either way) for a run on CUDA and untouched on the CPU."""
    from eada.cli import main
    from eada.config import ConfigError
    from eada.hparams import preset_config
    from eada.train.step import compile_mode_on, set_cudnn_benchmark

    sets = ["--set", "train.cudnn_benchmark=true", "--set", "train.compile_mode=reduce-overhead"]
    assert main(["run", "toy", "--dry-run", *sets]) == 0
    cfg = preset_config("toy", "eada", 0, ["train.compile_mode=reduce-overhead"])
    assert cfg.train.compile and cfg.train.effective_compile_mode == "reduce-overhead"
    assert cfg.resolved()["train"]["compile_mode"] == "reduce-overhead"
    assert preset_config("toy", "eada", 0, []).train.effective_compile_mode is None
    with pytest.raises(ConfigError, match="compile_mode: reduce-overhead compiles the step, but"):
        preset_config(
            "toy", "eada", 0, ["train.compile=false", "train.compile_mode=reduce-overhead"]
        )
    with pytest.raises(ConfigError, match="compile_mode"):
        preset_config("toy", "eada", 0, ["train.compile_mode=fast"])
    assert compile_mode_on("reduce-overhead", torch.device("cuda")) == "reduce-overhead"
    assert compile_mode_on("reduce-overhead", torch.device("cpu")) == "default"
    before = torch.backends.cudnn.benchmark
    try:
        assert set_cudnn_benchmark(True, torch.device("cpu")) is None
        assert torch.backends.cudnn.benchmark == before
        assert set_cudnn_benchmark(True, torch.device("cuda")) is True
        assert torch.backends.cudnn.benchmark is True
        assert set_cudnn_benchmark(False, torch.device("cuda")) is False
        assert torch.backends.cudnn.benchmark is False
    finally:
        torch.backends.cudnn.benchmark = before
    short = ["train.epochs=2", "active.rounds_at=[1]", sets[1]]
    cfg = preset_config("toy", "eada", 0, [*short, "device=cpu"])
    rec = run_once(cfg, record_stats=False)  # on the CPU: recorded as not set
    assert rec["results"]["step_setup"] == {
        "device": "cpu",
        "forward": "separate",
        "amp": None,
        "channels_last": False,
        "compile_mode": None,
        "cudnn_benchmark": None,
    }
    assert torch.backends.cudnn.benchmark == before
    if torch.cuda.is_available():  # set, and recorded, on CUDA (the GPU check's suite)
        try:
            cuda = preset_config("toy", "eada", 0, [*short, "device=cuda"])
            rec = run_once(cuda, record_stats=False)
            assert rec["results"]["step_setup"]["cudnn_benchmark"] is True
            assert torch.backends.cudnn.benchmark is True
        finally:
            torch.backends.cudnn.benchmark = before


def test_each_image_is_decoded_once_the_check_fills_the_cache(
    tmp_path: Path, factory_module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """First task load: each image decoded once (the data check fills the cache); a second
    load (another seed, run, method) decodes none: the cache vouches for them; a changed
    file changes the key and is checked again."""
    from eada.data import images as images_mod

    src, tgt = _make_domain(tmp_path, "s", n=3), _make_domain(tmp_path, "t", n=3, shift=20)
    cfg = parse_config(_raw(src, tgt, tmp_path, factory_module))
    loads = {"n": 0}
    real = images_mod.open_image

    def counted(path: Path) -> Any:  # every decode of an image goes through it
        loads["n"] += 1
        return real(path)

    monkeypatch.setattr(images_mod, "open_image", counted)
    load_task(cfg.data, 0, cfg.model)
    assert loads["n"] == 12  # 12 images, each decoded once: the check IS the fill
    loads["n"] = 0
    task = load_task(cfg.data, 1, cfg.model)
    assert loads["n"] == 0 and task.target.decode_cache is not None
    (tgt / "images" / "blue" / "img 0.jpg").write_bytes(b"not a jpeg")  # changed: checked
    with pytest.raises(Exception, match=r"img 0\.jpg"):
        load_task(cfg.data, 2, cfg.model)


def test_views_run_on_the_training_device_without_reading_it_back(
    tmp_path: Path, factory_module: str
) -> None:
    """The device side of the cached path on a stand-in device: ``meta`` tensors have no
    values, so any read-back (a ``.item()``, a Python ``if`` on a tensor) would raise; every
    batch of every view comes out on that device, labels on the host."""
    src, tgt = _make_domain(tmp_path, "s", n=4), _make_domain(tmp_path, "t", n=4, shift=20)
    raw = _raw(src, tgt, tmp_path, factory_module)
    raw["data"]["transforms"] = {"resize": 36, "crop": 32, "test_resize": 40, "hflip": True}
    cfg = parse_config(raw)
    task = load_task(cfg.data, 0, cfg.model)
    meta = torch.device("meta")
    for view in ("train", "unlabeled", "test", "score"):
        d = task.target.view(view)
        d.device = meta
        for x, y in iterate_items(d, chunks(torch.arange(8), 3)):
            assert x.device == meta and tuple(x.shape[1:]) == (3, 32, 32)
            assert y.device.type == "cpu"
