"""Image decodes of a frozen-backbone task on real Office-31 images, before/after a code change.

The first run of a frozen-backbone config checks every image (missing or unreadable files are
reported before training) and extracts the backbone's features. Before, the check decoded
every image and the extraction decoded it again; after, the extraction is the check (one decode
an image). A second run reads the cached features.

For each code tree (``--code LABEL=TREE``, its ``src`` first on ``PYTHONPATH``) a fresh process,
with one thread (``OMP_NUM_THREADS=1``), loads the task of
``configs/office31_amazon_subset_webcam_lite0_frozen.yaml`` on a subset of the real Office-31
amazon and webcam folders (the first ``--per-class`` images of every class, as symlinks) with an
empty feature cache, counting the ``PIL.Image.open`` calls (``data.workers: 0``: every decode
in that process) and the wall time; then loads it again (cache hit).

    python benchmarks/investigations/decode_once.py --code before=/tmp/tree_main --code after=. \\
        --out benchmarks/results/decode_once.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "office31_amazon_subset_webcam_lite0_frozen.yaml"
sys.path.insert(0, str(Path(__file__).parents[1]))  # finetune_pipeline, at the top of benchmarks/

from finetune_pipeline import subset  # noqa: E402


def child(per_class: int) -> dict[str, Any]:
    """Load the task twice (empty cache, then cached), counting the image decodes."""
    import PIL.Image
    import yaml

    from eada.config import parse_config
    from eada.data.tasks import load_task

    opened: list[str] = []
    real_open = PIL.Image.open

    def counting_open(fp: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(str(fp))
        return real_open(fp, *args, **kwargs)

    PIL.Image.open = counting_open  # type: ignore[assignment]
    with tempfile.TemporaryDirectory() as tmp:
        raw = yaml.safe_load(CONFIG.read_text())
        raw["data"].update(
            source=str(subset(Path(tmp), "amazon", per_class)),
            target=str(subset(Path(tmp), "webcam", per_class)),
            cache_dir=str(Path(tmp) / "cache"),
            workers=0,
        )
        cfg = parse_config(raw)
        out: dict[str, Any] = {}
        for name in ("first run (empty cache)", "second run (cached features)"):
            opened.clear()
            t0 = time.perf_counter()
            task = load_task(cfg.data, 0, cfg.model)
            out[name] = {
                "seconds": round(time.perf_counter() - t0, 2),
                "image_opens": len(opened),
                "distinct_images_opened": len(set(opened)),
                "images": len(task.source) + len(task.target),
            }
    return out


def main() -> None:
    """Run :func:`child` for every code tree and write the JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--code", action="append", default=[], metavar="LABEL=TREE")
    p.add_argument("--per-class", type=int, default=5)
    p.add_argument("--out", default=None)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.per_class)))
        return
    from eada.runs import environment_info

    results = {}
    for item in a.code:
        label, _, tree = item.partition("=")
        env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve() / "src")}
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        cmd = [sys.executable, __file__, "--child", "--per-class", str(a.per_class)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            raise RuntimeError(f"{label} failed:\n{proc.stderr[-3000:]}")
        results[label] = json.loads(proc.stdout.strip().splitlines()[-1])
        results[label]["tree"] = str(Path(tree).resolve())
        print(label, json.dumps(results[label]), flush=True)
    out = {
        "what": "image decodes (PIL.Image.open calls) and wall time of loading a frozen-backbone "
        "task (EfficientNet-Lite0) on real Office-31 images, 1 thread",
        "config": str(CONFIG.relative_to(ROOT)),
        "per_class": a.per_class,
        "results": results,
        "meta": environment_info(),
    }
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
