"""Office-31 amazon(SUBSET) <-> webcam with EfficientNet-Lite0 ImageNet weights (CPU fast path).

Source-only, Random and EADA with the paper's protocol (50 epochs, rounds of 1% at the end of
epochs 10-18, Adadelta lr 0.1, batch 32, gamma 0.01, alpha1 0.5, bottleneck 256). The backbone is
FROZEN: features of every image (test view) are extracted once and cached under
``.cache/eada/features``; the bottleneck + energy head is trained on them.
``--finetune`` instead fine-tunes the whole network on images (slow on a CPU).

Usage (repository root, ../shared/data beside it; needs ``pip install -e '.[images]'``):

    python benchmarks/office31.py [--seeds 0-2] [--methods source_only,random,eada]
                                  [--out benchmarks/results/office31] [--finetune --set ...]

The data folder holds webcam (all 795 images) and a SUBSET of amazon (1,000 of 2,817 images):
every table names it ``amazon(subset)``. Each (task, method) appends to ``runs.jsonl`` (resumes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from eada.config import load_config
from eada.experiment import run_seeds
from eada.hparams import METHOD_LABELS, METHODS
from eada.reports.tables import markdown_table
from eada.reports.tables import mean_std as _fmt
from eada.runs import environment_info, parse_seeds, write_json

CONFIGS = {
    "amazon(subset)->webcam": "configs/office31_amazon_subset_webcam_lite0_frozen.yaml",
    "webcam->amazon(subset)": "configs/office31_webcam_amazon_subset_lite0_frozen.yaml",
}


def markdown(summary: dict[str, Any]) -> str:
    """Accuracy after each round and at the last epoch, one row a method and task."""
    head = ["task", "method", "0% (epoch 10)", "1%", "2%", "3%", "4%", "5% = last epoch (50)"]
    head.append("per-class mean, last epoch")
    body = []
    for task, methods in summary["tasks"].items():
        for m, res in methods.items():
            rounds = res["rounds"]
            cells = [_fmt(r["target/accuracy"]) for r in rounds[:5]] + [""] * (5 - len(rounds))
            fin = res["final"]
            last = fin["last_epoch/target/accuracy"]
            per_class = fin["last_epoch/target/mean_class_accuracy"]
            body.append([task, METHOD_LABELS[m], *cells, _fmt(last), _fmt(per_class)])
    caption = f"Target accuracy (%), whole target set, mean ± std over seeds {summary['seeds']}.\n"
    return caption + "\n" + markdown_table(head, body)


def main(argv: list[str] | None = None) -> int:
    """Run the grid, write ``OUT.json`` and print the Markdown table."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", default="0-2")
    p.add_argument("--tasks", default=",".join(CONFIGS))
    p.add_argument("--methods", default="source_only,random,eada")
    p.add_argument("--out", default="benchmarks/results/office31")
    p.add_argument("--finetune", action="store_true", help="fine-tune the backbone on images")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--table-only", action="store_true")
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.table_only:
        print(markdown(json.loads(out.with_suffix(".json").read_text())))
        return 0
    seeds = parse_seeds(args.seeds)
    extra = list(args.set) + (["model.freeze_backbone=false"] if args.finetune else [])
    summary: dict[str, Any] = {"benchmark": "office31", "seeds": seeds, "tasks": {}}
    summary["meta"] = environment_info()
    summary["overrides"] = extra
    t_start = time.perf_counter()
    for task in args.tasks.split(","):
        summary["tasks"][task] = {}
        for method in args.methods.split(","):
            sets = [f"{s}.{k}={v}" for s, d in METHODS[method].items() for k, v in d.items()]
            path = CONFIGS[task]

            def make(seed: int, path: str = path, sets: list[str] = sets) -> Any:
                return load_config(path, [*sets, *extra, f"seed={seed}"])

            t0, c0 = time.perf_counter(), time.process_time()
            res = run_seeds(make, seeds, out / task.replace("->", "-") / method)
            res["seconds"] = time.perf_counter() - t0
            res["cpu_seconds"] = time.process_time() - c0
            summary["tasks"][task][method] = res
            print(
                f"{task} {method}: {_fmt(res['final']['last_epoch/target/accuracy'])} "
                f"({res['seconds']:.0f} s wall, {res['cpu_seconds']:.0f} s CPU, "
                f"load {os.getloadavg()[0]:.1f})",
                file=sys.stderr,
            )
    summary["seconds"] = time.perf_counter() - t_start
    summary["cpu_seconds"] = time.process_time()  # all threads of this process, since start
    summary["loadavg_end"] = os.getloadavg()
    write_json(out.with_suffix(".json"), summary)
    print(markdown(summary))
    print(
        f"\ntotal {summary['seconds']:.0f} s wall, {summary['cpu_seconds']:.0f} s CPU, "
        f"load average at the end {summary['loadavg_end']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
