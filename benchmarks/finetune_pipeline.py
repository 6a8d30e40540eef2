"""Fine-tuning epochs on real Office-31 images: the old input path beside the new one (issue 29).

The old path (``data.decode_cache_mb: 0``, ``data.persistent_workers: false``) decodes every
image at every read, in a new pool of ``data.workers`` processes every pass (the labeled
stream, smaller than a batch: every step). The new path decodes each image once into the
decode cache (``eada.data.decoded``) and applies the views' random part per batch; a third
variant keeps decoding from the files but with persistent loaders (``data.decode_cache_mb: 0``).

Each variant runs in a fresh process (``torch`` on ``--threads`` threads, ``OMP_NUM_THREADS``
the same), one after the other, on the same subset: the first ``--per-class`` images of every
class of ``../shared/data/office31`` amazon(subset) -> webcam (as symlinks), EfficientNet-Lite0
(ImageNet weights, offline), FINE-TUNED (``model.freeze_backbone: false``), ``data.workers``
2, batch 32, ``--epochs`` epochs with a round after epoch 1. ``--views fixed`` (default) makes
every view deterministic (resize = crop = 224, no jitter, the unlabeled stream on the train view,
scoring on the test view): the paths must then give the same run, and the record says whether
they did; ``--views paper`` times the default views (random crops and jitter: the runs differ).

    OMP_NUM_THREADS=1 python benchmarks/finetune_pipeline.py --threads 1 \\
        --out benchmarks/results/finetune_pipeline.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OFFICE = ROOT.parent / "shared" / "data" / "office31"

VARIANTS = {
    "old": {"decode_cache_mb": 0, "persistent_workers": False},
    "persistent": {"decode_cache_mb": 0, "persistent_workers": True},
    "cache": {},
}
FIXED = {
    "resize": 224,
    "crop": 224,
    "test_resize": 224,
    "jitter": None,
    "scoring_view": "test",
    "unlabeled_view": "train",
}


def subset(tmp: Path, domain: str, per_class: int) -> Path:
    """``tmp/DOMAIN/images/CLASS/*.jpg``: links to the first ``per_class`` images a class."""
    for cls_dir in sorted((OFFICE / domain / "images").iterdir()):
        d = tmp / domain / "images" / cls_dir.name
        d.mkdir(parents=True)
        for f in sorted(cls_dir.glob("*.jpg"))[:per_class]:
            (d / f.name).symlink_to(f)
    return tmp / domain


def config(tmp: Path, args: argparse.Namespace, variant: str) -> dict[str, Any]:
    data: dict[str, Any] = {
        "kind": "images",
        "source": str(tmp / "amazon"),
        "target": str(tmp / "webcam"),
        "workers": args.workers,
        "cache_dir": str(tmp / "features"),
        "decode_cache_dir": str(tmp / f"decoded-{variant}"),
        **VARIANTS[variant],
    }
    if args.views == "fixed":
        data["transforms"] = FIXED
    return {
        "name": f"finetune-pipeline-{variant}",
        "seed": args.seed,
        "device": "cpu",
        "data": data,
        "model": {
            "name": "backbone",
            "backbone": "efficientnet_lite0",
            "weights": "pretrained",
            "bottleneck_dim": 256,
            "freeze_backbone": False,
        },
        "optim": {"name": "adadelta", "lr": 0.1, "backbone_lr_mult": 0.1},
        "train": {"epochs": args.epochs, "batch_size": 32, "gamma": 0.01, "eval_batch_size": 64},
        "active": {"strategy": "eada", "rounds_at": [1], "budget_per_round": 0.05, "alpha1": 0.5},
    }


def child(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from eada.config import parse_config
    from eada.data.tasks import load_task
    from eada.experiment import run_once
    from eada.threads import set_threads

    set_threads(args.threads)
    torch.set_num_threads(args.threads)
    raw = config(Path(args.tmp), args, args.child)
    cfg = parse_config(raw)
    t0 = time.perf_counter()
    task = load_task(cfg.data, cfg.seed, cfg.model)
    setup = time.perf_counter() - t0
    t1 = time.perf_counter()
    res = run_once(cfg, task, record_stats=False)["results"]
    run = time.perf_counter() - t1
    hist = [(h.get("loss"), h.get("metrics", {}).get("target", {})) for h in res["history"]]
    return {
        "variant": args.child,
        "setup_s": round(setup, 2),
        "run_s": round(run, 2),
        "epoch_s": round(run / args.epochs, 2),
        "final_target_accuracy": res["final"]["last_epoch"]["target"]["accuracy"],
        "trace": json.dumps(hist, sort_keys=True, default=str),
        "n_source": len(task.source),
        "n_target": len(task.target),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--per-class", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--views", choices=("fixed", "paper"), default="fixed")
    ap.add_argument("--variants", default="old,persistent,cache")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    if not (OFFICE / "webcam").is_dir():
        sys.exit(f"error: real data not found at {OFFICE}")
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(ROOT / "src")}
    rows = []
    load_before = os.getloadavg()  # the machine is shared: say how busy it was
    with tempfile.TemporaryDirectory() as tmp:
        for dom in ("amazon", "webcam"):
            subset(Path(tmp), dom, args.per_class)
        for v in args.variants.split(","):
            cmd = [sys.executable, __file__, "--child", v, "--tmp", tmp]
            for k in ("threads", "workers", "epochs", "seed", "views"):
                cmd += [f"--{k}", str(getattr(args, k))]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                sys.exit(f"error: variant {v} failed:\n{out.stderr[-3000:]}")
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            r = rows[-1]
            print(
                f"{v:>10}: setup {r['setup_s']:7.1f} s  epoch {r['epoch_s']:7.1f} s  "
                f"target acc {r['final_target_accuracy']:.2f}",
                flush=True,
            )
    base = next((r for r in rows if r["variant"] == "old"), rows[0])
    for r in rows:
        r["speedup_per_epoch_vs_old"] = round(base["epoch_s"] / r["epoch_s"], 2)
        r["same_run_as_old"] = r["trace"] == base["trace"]
        print(
            f"{r['variant']:>10}: {r['speedup_per_epoch_vs_old']}x per epoch, same run as old: "
            f"{r['same_run_as_old']}"
        )
    record = {
        "benchmark": "finetune_pipeline",
        "command": "python benchmarks/finetune_pipeline.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.python_version()}",
        "threads": args.threads,
        "load_average_1_5_15_before_after": [list(load_before), list(os.getloadavg())],
        "workers": args.workers,
        "per_class": args.per_class,
        "epochs": args.epochs,
        "views": args.views,
        "seed": args.seed,
        "rows": [{k: v for k, v in r.items() if k != "trace"} for r in rows],
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
