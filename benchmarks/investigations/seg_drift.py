"""The segmentation trainer's drift and runaway warnings on the synthetic pair (issue 23, part 7).

Runs ``configs/seg_synthetic.yaml`` (240 iterations, log windows of 10 iterations, so 24
windows) for each ``train.gamma`` x ``train.alignment`` cell, one run folder a cell under
``--out`` (``OUT/g<gamma>_<alignment>``; stored runs of the same config are reused, see
docs/segmentation.md), and writes a summary: per run the final validation mIoU, the
iteration where each warning fired (or none), the per-window means of ``Delta``, ``L_fea`` and
the source NLL, and the commit, command and time that made it.

Usage (repository root, one torch thread):

    python benchmarks/investigations/seg_drift.py [--seeds 0-1] [--gammas 0.01,0.1,1.0] \\
        [--out runs/seg_drift] [--summary benchmarks/results/seg_synthetic_drift.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from eada.runs import parse_seeds, read_jsonl, write_json
from eada.segmentation.config import SegExperimentConfig, load_seg_config
from eada.segmentation.train import run_seg_seeds

CONFIG = "configs/seg_synthetic.yaml"
ALIGNMENTS = ("paper", "centered", "balanced")


def cell_config(gamma: float, alignment: str, seed: int) -> SegExperimentConfig:
    """The synthetic config with log windows of 10 iterations, ``gamma``, ``alignment``, seed
    (what ``eada run configs/seg_synthetic.yaml --set train.log_every=10 --set
    train.gamma=G --set train.alignment=A --seeds S`` runs)."""
    sets = ["train.log_every=10", f"train.gamma={gamma}", f"train.alignment={alignment}"]
    return load_seg_config(CONFIG, [*sets, f"seed={seed}"])


def run_summary(rec: dict[str, Any]) -> dict[str, Any]:
    """One stored run: mIoU, warnings (kind -> first iteration), per-window traces, maker."""
    res = rec["results"]
    hist = [h for h in res["history"] if "loss_align" in h]
    first: dict[str, int] = {}
    for w in res.get("warnings", []):
        first.setdefault(w["kind"], w["iteration"])
    return {
        "seed": rec["seed"],
        "final_miou": res["final"]["miou"],
        "warnings": first,
        "messages": [w["message"] for w in res.get("warnings", [])],
        "iterations": [h["iteration"] for h in hist],
        "delta": [h["delta"] for h in hist],
        "loss_align": [h["loss_align"] for h in hist],
        "loss_source": [h["loss_source"] for h in hist],
        "seconds": res["seconds"],
        "meta": rec.get("meta"),
    }


def main(argv: list[str] | None = None) -> int:
    """Run (or reuse) every cell and write the summary."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0-1")
    ap.add_argument("--gammas", default="0.01,0.1,1.0")
    ap.add_argument("--out", type=Path, default=Path("runs/seg_drift"))
    ap.add_argument(
        "--summary", type=Path, default=Path("benchmarks/results/seg_synthetic_drift.json")
    )
    args = ap.parse_args(argv)
    seeds = parse_seeds(args.seeds)
    cells = []
    for gamma in (float(g) for g in args.gammas.split(",")):
        for alignment in ALIGNMENTS:
            out = args.out / f"g{gamma}_{alignment}"
            run_seg_seeds(
                lambda s, g=gamma, a=alignment: cell_config(g, a, s),
                seeds,
                out,
                progress=lambda m: print(m, file=sys.stderr) if "reused" in m else None,
            )
            runs = {r["seed"]: r for r in read_jsonl(out / "runs.jsonl")}
            cells.append(
                {
                    "gamma": gamma,
                    "alignment": alignment,
                    "runs": [run_summary(runs[s]) for s in seeds],
                }
            )
            print(f"gamma {gamma} {alignment}: done", file=sys.stderr)
    write_json(args.summary, {"config": CONFIG, "seeds": seeds, "cells": cells})
    for c in cells:
        mious = " / ".join(f"{r['final_miou']:.2f}" for r in c["runs"])
        warns = " / ".join(str(r["warnings"] or "-") for r in c["runs"])
        print(f"| {c['gamma']} | {c['alignment']} | {mious} | {warns} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
