"""The alignment variants side by side on every in-repo task: `train.alignment` paper, centered,
balanced, normalized (the default).

Collects final target accuracies (whole target set, last epoch) from the committed run records
and the new runs under ``benchmarks/results/alignment`` and writes
``benchmarks/results/alignment/summary.json`` plus a Markdown table (stdout):

* toy, Office-Caltech10 SURF (12 tasks): everything from ``benchmarks/results/alignment``
  (``toy/``, ``surf/<S>-<T>/``); SURF Random, and SURF EADA-paper where it was not re-run
  here, from the committed ``benchmarks/results/caltech_surf.json`` (EADA-paper re-run on
  C->A, C->W, C->D reproduces those numbers exactly);
* digits (3 tasks), Office-31 frozen Lite0 (2 tasks): Random, the baselines, ``eada``
  (which ran with the paper's alignment) and ``eada_no_fea`` from the committed grids
  ``bench_digits`` / ``bench_office31``; EADA centred and balanced from ``alignment/digits``,
  ``alignment/office31`` (digits seeds that ran in other lanes: ``alignment/digits_seed1``,
  ``alignment/digits_seed2``);
* the baselines on the toy and on SURF: ``toy/`` and ``surf/<S>-<T>/`` (a method that ran there).

A cell lists its seeds; one with fewer than 3 seeds is marked. Nothing is trained here.

Usage (repository root): ``python benchmarks/investigations/alignment_table.py``
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from eada.hparams import METHOD_LABELS
from eada.runs import find_jsonl, read_jsonl, write_json

R = Path("benchmarks/results")
A = R / "alignment"
BASELINES = [
    "entropy",
    "margin",
    "least_confidence",
    "coreset",
    "badge",
    "waal",
    "aada",
    "dbal",
    "tqs",
    "clue",
]
VARIANTS = ("paper", "centered", "balanced", "normalized")
SURF = ["C-A", "C-W", "C-D", "A-C", "A-W", "A-D", "W-C", "W-A", "W-D", "D-C", "D-A", "D-W"]


def _row(rec: dict[str, Any]) -> str | None:
    """The row a bench record belongs to (None: not one of this table's rows)."""
    m, var = rec["method"], rec["variant"]
    if m == "eada":
        if not var:
            return None
        return "eada_" + var[0].removeprefix("train.alignment=")
    return m if not var else None


def collect() -> dict[str, dict[str, dict[int, float]]]:
    """task -> row -> seed -> accuracy."""
    cells: dict[str, dict[str, dict[int, float]]] = {}

    def add(task: str, row: str, seed: int, acc: float) -> None:
        cells.setdefault(task, {}).setdefault(row, {})[seed] = acc

    for rec in read_jsonl(A / "toy" / "runs.jsonl"):
        if (row := _row(rec)) is not None:
            add("toy", row, rec["seed"], rec["final"]["target/accuracy"])
    committed = [
        (R / "bench_digits" / "runs.jsonl", find_jsonl(A, "digits*/runs.jsonl")),
        (R / "bench_office31" / "runs.jsonl", [A / "office31" / "runs.jsonl"]),
    ]
    for old, news in committed:
        for rec in read_jsonl(old):
            if rec["variant"]:
                continue
            row = "eada_paper" if rec["method"] == "eada" else rec["method"]
            add(_task_name(rec["task"]), row, rec["seed"], rec["final"]["target/accuracy"])
        for rec in (r for new in news for r in read_jsonl(new)):
            if (row := _row(rec)) is not None:
                add(_task_name(rec["task"]), row, rec["seed"], rec["final"]["target/accuracy"])
    surf_old = R / "caltech_surf.json"
    old = json.loads(surf_old.read_text())["tasks"] if surf_old.is_file() else {}
    for pair in SURF:
        task = f"SURF {pair.replace('-', '->')}"
        for rec in read_jsonl(A / "surf" / pair / "runs.jsonl"):
            if (row := _row(rec)) is not None:
                add(task, row, rec["seed"], rec["final"]["target/accuracy"])
        prev = old.get(pair.replace("-", "->"), {})
        for method, row in (("random", "random"), ("eada", "eada_paper")):
            if method in prev and row not in cells.get(task, {}):
                values = prev[method]["final"]["last_epoch/target/accuracy"]["values"]
                for seed, acc in zip(prev[method]["seeds"], values, strict=True):
                    add(task, row, seed, acc)
    return cells


def _task_name(task: str) -> str:
    names = {
        "digits/mnist-usps": "MNIST->USPS",
        "digits/usps-mnist": "USPS->MNIST",
        "digits/mnist-mnistm": "MNIST->MNIST-M",
        "configs/office31_amazon_subset_webcam_lite0_frozen.yaml": "Office-31 A(sub)->W",
        "configs/office31_webcam_amazon_subset_lite0_frozen.yaml": "Office-31 W->A(sub)",
    }
    return names.get(task, task)


def summarize(cells: dict[str, dict[str, dict[int, float]]]) -> dict[str, Any]:
    """Mean, std and seeds per cell; the best baseline per task; each variant's difference to
    ``eada_no_fea``, the acceptance criterion's reference (paper, centred, balanced - no_fea)."""
    out: dict[str, Any] = {}
    for task, rows in cells.items():
        stats = {
            row: {
                "seeds": sorted(v),
                "values": [v[s] for s in sorted(v)],
                "mean": statistics.fmean(v.values()),
                "std": statistics.stdev(v.values()) if len(v) > 1 else 0.0,
            }
            for row, v in rows.items()
        }
        base = [b for b in BASELINES if b in stats]
        best = max(base, key=lambda b: stats[b]["mean"]) if base else None
        entry: dict[str, Any] = {"rows": stats, "best_baseline": best}
        n = stats.get("eada_no_fea")
        for variant in VARIANTS:
            v = stats.get(f"eada_{variant}")
            if v and n:
                entry[f"{variant}_minus_no_fea"] = v["mean"] - n["mean"]
        out[task] = entry
    return out


def _cell(st: dict[str, Any] | None) -> str:
    if st is None:
        return "missing"
    mark = "" if len(st["seeds"]) >= 3 else f" (seeds {st['seeds']})"
    return f"{st['mean']:.1f} ± {st['std']:.1f}{mark}"


def _diff(e: dict[str, Any], variant: str) -> str:
    key = f"{variant}_minus_no_fea"
    return f"{e[key]:+.1f}" if key in e else "–"


def markdown(summary: dict[str, Any]) -> str:
    """Two tables, a row a task: the default (``normalized``) against the paper's loss,
    w/o ``L_fea``, Random and the best baseline; then every variant's difference to w/o
    ``L_fea``."""
    head = [
        "task",
        "Random",
        "best baseline",
        "EADA w/o L_fea",
        "EADA paper",
        "EADA normalized (default)",
        "normalized - w/o L_fea",
        "paper - w/o L_fea",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for task, e in summary.items():
        rows = e["rows"]
        best = e["best_baseline"]
        best_cell = f"{_cell(rows[best])} ({METHOD_LABELS[best]})" if best else "not run"
        cells = [
            task,
            _cell(rows.get("random")),
            best_cell,
            _cell(rows.get("eada_no_fea")),
            _cell(rows.get("eada_paper")),
            _cell(rows.get("eada_normalized")),
            _diff(e, "normalized"),
            _diff(e, "paper"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    head2 = ["task", *(f"{v} - w/o L_fea" for v in VARIANTS), "EADA centered", "EADA balanced"]
    lines += ["", "| " + " | ".join(head2) + " |", "|" + "---|" * len(head2)]
    for task, e in summary.items():
        rows = e["rows"]
        cells = [
            task,
            *(_diff(e, v) for v in VARIANTS),
            _cell(rows.get("eada_centered")),
            _cell(rows.get("eada_balanced")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *criterion(summary)]
    return "\n".join(lines)


def criterion(summary: dict[str, Any]) -> list[str]:
    """The issue's acceptance rule per variant: the worst difference to w/o ``L_fea`` over the
    tasks, the tasks more than a point below, and the share of the paper's gain kept where the
    paper's loss gains more than a point."""
    out = []
    for v in VARIANTS:
        diffs = {t: e[f"{v}_minus_no_fea"] for t, e in summary.items() if f"{v}_minus_no_fea" in e}
        if not diffs:
            continue
        worst = min(diffs, key=lambda t: diffs[t])
        below = [f"{t} {d:+.1f}" for t, d in diffs.items() if d < -1.0]
        gains = [
            (t, diffs[t], summary[t]["paper_minus_no_fea"])
            for t in diffs
            if summary[t].get("paper_minus_no_fea", 0.0) > 1.0
        ]
        kept = sum(g for _, g, _ in gains) / sum(p for _, _, p in gains) if gains else float("nan")
        out.append(
            f"- `{v}`: {len(diffs)} tasks; worst {diffs[worst]:+.1f} ({worst}); more than 1 point "
            f"below w/o L_fea: {', '.join(below) if below else 'none'}; where the paper's loss "
            f"gains > 1 point ({len(gains)} tasks) it keeps {100 * kept:.0f}% of that gain."
        )
    return out


def main() -> int:
    """Write the summary JSON and print the table."""
    summary = summarize(collect())
    write_json(A / "summary.json", summary)
    print(markdown(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
