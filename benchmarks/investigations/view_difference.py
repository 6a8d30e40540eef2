"""How far the per-batch train view (decode cache + jitter on tensors) is from the old PIL view.

Both start from the same pixels (the cache holds exactly what PIL's ``Resize`` gives) and crop
the same window; they differ only in the colour jitter: the old path adjusts a uint8 PIL image
(rounded to integers after each of the four adjustments; PIL's own hue conversion), the new one
float tensors with torchvision's tensor formulas (:func:`eada.data.transforms.batch_view`). For
every image of ``--n`` real Office-31 webcam images, the SAME factors and order are applied both
ways (drawn by :func:`eada.data.transforms.draw_batch_params`, seed 0); reported: the mean and
99.9th-percentile absolute difference of the ``[0, 1]`` pixels (x 255: grey levels), per
adjustment alone and for the four in their drawn order.

    OMP_NUM_THREADS=1 python benchmarks/investigations/view_difference.py --n 200 \\
        --out benchmarks/results/view_difference.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torchvision.transforms import functional as F

from eada.data.transforms import Normalization, TransformSpec, batch_view, draw_batch_params

ROOT = Path(__file__).resolve().parents[2]
WEBCAM = ROOT.parent / "shared" / "data" / "office31" / "webcam"
PIL_OPS = [F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue]
NAMES = ["brightness", "contrast", "saturation", "hue"]
IDENT = Normalization("none", (0.0, 0.0, 0.0), (1.0, 1.0, 1.0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    files = sorted(WEBCAM.rglob("*.jpg"))[:: max(1, len(sorted(WEBCAM.rglob("*.jpg"))) // args.n)]
    files = files[: args.n]
    spec = TransformSpec()
    g = torch.Generator().manual_seed(0)
    diffs: dict[str, list[np.ndarray]] = {k: [] for k in [*NAMES, "all four"]}
    for f in files:
        img = F.resize(Image.open(f).convert("RGB"), [224, 224])
        crop = torch.from_numpy(np.asarray(img).copy())[None]
        hw = torch.tensor([224])
        p = draw_batch_params("train", spec, hw, hw, g)
        p.top, p.left = torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long)
        assert p.order is not None and p.factors is not None
        for op in range(5):
            order = p.order[0].tolist() if op == 4 else [op]
            q = draw_batch_params("train", spec, hw, hw, torch.Generator().manual_seed(1))
            q.top, q.left, q.factors = p.top, p.left, p.factors
            # only the chosen adjustment(s): the others made inactive
            q.active = tuple(k in order for k in range(4))  # type: ignore[assignment]
            q.order = torch.tensor([order + [k for k in range(4) if k not in order]])
            new = batch_view(crop, q, IDENT, torch.device("cpu"))[0]
            old = img
            for k in order:
                old = PIL_OPS[k](old, float(p.factors[0, k]))
            old_t = F.to_tensor(old)
            diffs[[*NAMES, "all four"][op]].append((new - old_t).abs().flatten().numpy())
    rows = {}
    for k, v in diffs.items():
        a = np.concatenate(v) * 255
        rows[k] = {
            "mean_abs_grey_levels": round(float(a.mean()), 3),
            "p99_9_abs_grey_levels": round(float(np.percentile(a, 99.9)), 2),
            "max_abs_grey_levels": round(float(a.max()), 1),
        }
        r = rows[k]
        print(
            f"{k:>11}: mean {r['mean_abs_grey_levels']:.3f}, 99.9% "
            f"{r['p99_9_abs_grey_levels']:.2f}, max {r['max_abs_grey_levels']:.1f} grey levels"
        )
    if args.out:
        rec = {
            "benchmark": "view_difference",
            "command": "python benchmarks/investigations/view_difference.py --n " + str(args.n),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{platform.machine()}, Python {platform.python_version()}",
            "threads": 1,
            "images": len(files),
            "jitter": list(spec.jitter or ()),
            "rows": rows,
        }
        args.out.write_text(json.dumps(rec, indent=2) + "\n")


if __name__ == "__main__":
    main()
