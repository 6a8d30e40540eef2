"""The gate of ``L_fea`` (``train.fea_gate``) on the multi-class tasks: EADA with the default
``normalized`` alignment and a gate beside the same without the gate and EADA w/o ``L_fea``.

Reads the gated runs under ``benchmarks/results/fea_gate`` (``surf/<S>-<T>/``, ``toy/``,
``office31/``, written by ``eada bench ... --sweep train.fea_gate=GATE``) and the committed
records of the ungated default and of ``eada_no_fea``: ``benchmarks/results/alignment``
(``surf/<S>-<T>``, ``toy``, ``office31``) and, for Office-31's ``eada_no_fea``,
``benchmarks/results/bench_office31``. Final target accuracy (whole target, last epoch), mean
over seeds 0-2. Nothing is trained here.

Usage (repository root): ``python benchmarks/investigations/fea_gate_table.py [--gate confidence]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from eada.reports.tables import markdown_table
from eada.runs import read_jsonl, write_json

R = Path("benchmarks/results")
PAIRS = [f"{s}-{t}" for s in "CAWD" for t in "CAWD" if s != t]
OFFICE31 = {
    "Office-31 A(sub)->W": "office31_amazon_subset_webcam_lite0_frozen.yaml",
    "Office-31 W->A(sub)": "office31_webcam_amazon_subset_lite0_frozen.yaml",
}


def _accs(recs: list[dict[str, Any]], method: str, variant: list[str], task: str = "") -> dict:
    return {
        r["seed"]: float(r["final"]["target/accuracy"])
        for r in recs
        if r["method"] == method
        and r["variant"] == variant
        and r["task"].endswith(task)
        and r["seed"] <= 2
    }


def _mean(accs: dict[int, float]) -> float | None:
    return statistics.fmean(accs.values()) if len(accs) == 3 else None


def collect(gate: str) -> dict[str, dict[str, Any]]:
    """Per task the per-seed accuracies of w/o ``L_fea``, the default and the gated default."""
    gated = [f"train.fea_gate={gate}"]
    rows: dict[str, tuple[dict, dict, dict]] = {}
    for p in PAIRS:
        old = read_jsonl(R / "alignment" / "surf" / p / "runs.jsonl")
        new = read_jsonl(R / "fea_gate" / "surf" / p / "runs.jsonl")
        rows[f"SURF {p}"] = (
            _accs(old, "eada_no_fea", []),
            _accs(old, "eada", ["train.alignment=normalized"]),
            _accs(new, "eada", gated),
        )
    old, new = (
        read_jsonl(R / "alignment" / "toy" / "runs.jsonl"),
        read_jsonl(R / "fea_gate" / "toy" / "runs.jsonl"),
    )
    rows["toy"] = (
        _accs(old, "eada_no_fea", []),
        _accs(old, "eada", ["train.alignment=normalized"]),
        _accs(new, "eada", ["train.alignment=normalized", *gated]) or _accs(new, "eada", gated),
    )
    bench = read_jsonl(R / "bench_office31" / "runs.jsonl")
    old, new = (
        read_jsonl(R / "alignment" / "office31" / "runs.jsonl"),
        read_jsonl(R / "fea_gate" / "office31" / "runs.jsonl"),
    )
    for name, cfg in OFFICE31.items():
        rows[name] = (
            _accs(bench, "eada_no_fea", [], cfg),
            _accs(old, "eada", ["train.alignment=normalized"], cfg),
            _accs(new, "eada", gated, cfg),
        )
    return {
        name: {"no_fea": a, "normalized": b, f"normalized_{gate}": c}
        for name, (a, b, c) in rows.items()
    }


def main(argv: list[str] | None = None) -> int:
    """Print the table; write ``benchmarks/results/fea_gate/summary_<gate>.json``."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--gate", default="confidence", choices=["dann", "labels", "confidence"])
    args = p.parse_args(argv)
    table = collect(args.gate)
    head = ["task", "EADA w/o L_fea", "normalized (default)", f"normalized + {args.gate} gate"]
    head += ["default - w/o", "gated - w/o", "gated - default"]
    body = []
    for name, cols in table.items():
        a, b, c = (_mean(v) for v in cols.values())
        if c is None:
            continue

        def d(x: float | None, y: float | None) -> str:
            return "–" if x is None or y is None else f"{x - y:+.1f}"

        body.append(
            [
                name,
                *("–" if m is None else f"{m:.1f}" for m in (a, b, c)),
                d(b, a),
                d(c, a),
                d(c, b),
            ]
        )
    write_json(R / "fea_gate" / f"summary_{args.gate}.json", table)
    print(markdown_table(head, body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
