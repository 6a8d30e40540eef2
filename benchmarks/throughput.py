"""Training throughput: EADA's step against a plain cross-entropy loop, same model, same data,
measured side by side in one run (interleaved repetitions, median reported).

Variants (each ``--steps`` optimisation steps, repeated ``--reps`` times in turn):

* ``ce``: a plain PyTorch loop, one source batch a step, ``cross_entropy(-E(x), y)``, same
  optimiser (the baseline every other variant is divided by);
* ``eada``: :meth:`eada.train.ActiveDATrainer.train_step` after the last round (5% of the target
  labeled): three forward passes (source, unlabeled, labeled target) a step, NLL + gamma * L_fea,
  the Delta update;
* ``eada_fused``: the same step as ONE forward pass with per-stream batch norm
  (``train.forward: fused``);
* ``..._cl``: the same with ``train.channels_last: true`` (convolutional models only).

Models: ``lenet`` (the digits preset, MNIST -> USPS from ``../shared/data/digits``, batch 64) and
``lite0`` (EfficientNet-Lite0 fine-tuning, batch ``--lite0-batch`` of 224 x 224 images; random
tensors of that shape, the step's cost does not depend on pixel values).

    python benchmarks/throughput.py [--models lenet,lite0] [--steps 20] [--reps 3]
        [--threads 2] [--out benchmarks/results/throughput.json]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from eada.config import load_config
from eada.data.base import TensorDomain
from eada.data.tasks import Task, load_task
from eada.hparams import preset_config
from eada.models import build_model
from eada.runs import environment_info, write_json
from eada.train import ActiveDATrainer
from eada.train.loop import BatchStream, build_optimizer


def _lite0_task(n: int, size: int = 224) -> Task:
    """Source and target stand-ins of ``n`` images each, 31 classes (Office-31's shape)."""
    g = torch.Generator().manual_seed(0)
    mk = lambda name: TensorDomain(  # noqa: E731
        name,
        torch.randn(n, 3, size, size, generator=g),
        torch.randint(0, 31, (n,), generator=g),
        classes=[f"c{i}" for i in range(31)],
    )
    return Task(source=mk("source"), target=mk("target"))


def _setup(model: str, batch: int) -> tuple[Any, Task]:
    if model == "lenet":
        cfg = preset_config("digits/mnist-usps", "eada", 0, [])
        return cfg, load_task(cfg.data, 0)
    cfg = load_config(
        Path(__file__).parent.parent / "configs/office31_amazon_subset_webcam_lite0_frozen.yaml",
        [
            "model.weights=none",
            "model.freeze_backbone=false",
            f"train.batch_size={batch}",
            "optim.backbone_lr_mult=0.1",
        ],
    )
    return cfg, _lite0_task(max(4 * batch, 64))


def _eada_trainer(cfg: Any, task: Task, forward: str, channels_last: bool) -> ActiveDATrainer:
    c = cfg.model_copy(deep=True)
    c.train.forward = forward
    c.train.channels_last = channels_last
    tr = ActiveDATrainer(c, task)
    n_t = len(task.target)
    lab = torch.from_numpy(np.random.default_rng(0).choice(n_t, max(2, n_t // 20), replace=False))
    tr.set_labels(lab, task.target.y[lab])  # after the 5th round: 5% labeled, three passes
    return tr


def _ce_step(cfg: Any, task: Task, channels_last: bool) -> Any:
    torch.manual_seed(0)
    model = build_model(cfg.model, task.source.input_shape, task.source.num_classes)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = build_optimizer(cfg.optim, model)
    stream = BatchStream(
        task.source,
        torch.arange(len(task.source)),
        cfg.train.batch_size,
        torch.Generator().manual_seed(0),
    )
    model.train()

    def step() -> None:
        x, y = stream.next()
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        loss = F.cross_entropy(-model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def measure(model: str, steps: int, reps: int, batch: int) -> dict[str, Any]:
    """Steps per second of every variant on ``model``, interleaved repetitions."""
    cfg, task = _setup(model, batch)
    conv = len(task.source.input_shape) == 3
    variants: dict[str, Any] = {"ce": _ce_step(cfg, task, False)}
    for fwd in ("separate", "fused"):
        name = "eada" if fwd == "separate" else "eada_fused"
        variants[name] = _eada_trainer(cfg, task, fwd, False).train_step
    if conv:
        variants["ce_cl"] = _ce_step(cfg, task, True)
        variants["eada_cl"] = _eada_trainer(cfg, task, "separate", True).train_step
        variants["eada_fused_cl"] = _eada_trainer(cfg, task, "fused", True).train_step
    for fn in variants.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(reps):
        for k, fn in variants.items():
            t0 = time.perf_counter()
            for _ in range(steps):
                fn()
            times[k].append(time.perf_counter() - t0)
    bs = cfg.train.batch_size
    rows: dict[str, Any] = {}
    base = steps / statistics.median(times["ce"])
    for k, ts in times.items():
        sps = steps / statistics.median(ts)
        passes = 1 if k.startswith("ce") else 3
        rows[k] = {
            "steps_per_s": sps,
            "images_per_s": sps * bs * passes,
            "seconds": ts,
            "ratio_to_ce": sps / base,
        }
    return {
        "model": model,
        "batch_size": bs,
        "input_shape": list(task.source.input_shape),
        "steps": steps,
        "reps": reps,
        "variants": rows,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write its JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default="lenet,lite0")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--lite0-steps", type=int, default=2)
    p.add_argument("--lite0-batch", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="benchmarks/results/throughput.json")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = []
    for m in args.models.split(","):
        steps = args.lite0_steps if m == "lite0" else args.steps
        r = measure(m, steps, args.reps, args.lite0_batch)
        results.append(r)
        for k, v in r["variants"].items():
            print(
                f"{m:6s} {k:14s} {v['steps_per_s']:8.2f} steps/s "
                f"{v['images_per_s']:9.1f} img/s  x{v['ratio_to_ce']:.2f} of ce"
            )
    out = Path(args.out)
    write_json(
        out,
        {
            "command": "python benchmarks/throughput.py "
            + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
            "threads": args.threads,
            "load_average": list(map(float, open("/proc/loadavg").read().split()[:3])),
            "results": results,
            "meta": environment_info(),
        },
    )
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
