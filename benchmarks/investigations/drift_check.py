"""How the drift warning (``eada.energy.alignment_drift``) does on the committed runs.

Reads every run record under ``benchmarks/results`` that has per-epoch ``Delta``, ``L_fea`` and
source NLL means (``eada run`` records: ``results.history``; ``eada bench`` records:
``epochs``), runs with ``train.gamma > 0`` only, feeds the rule epoch by epoch as the trainer
does, and writes per run: the variant, the first epoch it fires (or none), the target
accuracy's peak and last value. Runs of the same folder and variant are grouped; records that
predate ``train.alignment`` ran the paper's loss.

Usage (repository root):

    python benchmarks/investigations/drift_check.py [--out benchmarks/results/drift/check.json]
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from eada.energy import alignment_drift
from eada.runs import find_jsonl, read_jsonl, write_json


def epochs_of(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-epoch records with ``delta``, ``loss_align``, ``loss_source`` and ``acc``."""
    if "results" in rec:
        hist = rec["results"].get("history", [])
        acc = [h.get("metrics", {}).get("target", {}).get("accuracy") for h in hist]
    else:
        hist = rec.get("epochs", [])
        acc = [h.get("target_accuracy") for h in hist]
    return [
        {**h, "acc": a}
        for h, a in zip(hist, acc, strict=True)
        if "loss_align" in h and "loss_source" in h
    ]


def first_fire(eps: list[dict[str, Any]]) -> int | None:
    """The epoch at which the rule first fires, fed one epoch at a time."""
    d = [e["delta"] for e in eps]
    n = [e["loss_source"] for e in eps]
    for k in range(1, len(eps) + 1):
        if alignment_drift(d[:k], n[:k]) is not None:
            return int(eps[k - 1]["epoch"])
    return None


def main(argv: list[str] | None = None) -> int:
    """Check every committed run; write the JSON; print one line a group."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--root", default="benchmarks/results")
    p.add_argument("--out", default="benchmarks/results/drift/check.json")
    args = p.parse_args(argv)
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for f in find_jsonl(Path(args.root)):
        for rec in read_jsonl(f):
            cfg = rec.get("config")
            if not cfg or cfg.get("train", {}).get("gamma", 0) == 0:
                continue
            eps = epochs_of(rec)
            if not eps:
                continue
            variant = cfg["train"].get("alignment", "paper")
            accs = [e["acc"] for e in eps if e["acc"] is not None]
            key = f"{f.parent.relative_to(args.root)} [{variant}]"
            groups[key].append(
                {
                    "seed": rec.get("seed"),
                    "method": rec.get("method"),
                    "epochs": len(eps),
                    "fires_at": first_fire(eps),
                    "acc_peak": max(accs) if accs else None,
                    "acc_last": accs[-1] if accs else None,
                    "delta_first": eps[0]["delta"],
                    "delta_last": eps[-1]["delta"],
                }
            )
    write_json(Path(args.out), {"rule": "eada.energy.alignment_drift defaults", "groups": groups})
    for key, runs in groups.items():
        fired = [r["fires_at"] for r in runs]
        drop = [r["acc_peak"] - r["acc_last"] for r in runs if r["acc_peak"] is not None]
        print(
            f"{key}: {sum(x is not None for x in fired)}/{len(runs)} fire {fired}; "
            f"peak - last {', '.join(f'{x:.1f}' for x in drop)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
