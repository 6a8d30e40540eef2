"""EADA with ``L_fea`` against EADA without it, paired, over 20 seeds (issue 23, part 6).

``eada_no_fea`` is paired (``train.fea_gate: zero``: ``L_fea`` weighted 0 on EADA's own
batches), so seed ``s`` of both trains on the same batches and draws the same random numbers
until ``L_fea`` has moved the weights; the per-seed difference ``with - without`` is then the
effect of ``L_fea`` plus the noise it sets off. This script reports its mean over seeds 0-19
with the standard error of that mean, and the same difference on seeds 0-2 alone (the
leaderboard's protocol), for:

* the 12 ten-class SURF pairs (``configs/office_caltech10_surf.yaml``, the leaderboard's
  protocol): ``eada`` (``normalized`` without a gate, the default before the ``labels`` gate
  became it) and ``eada_no_fea``, records written by
  ``eada bench`` under ``benchmarks/results/paired_seeds/surf/<S>-<T>/``, and ``eada`` with
  the ``labels`` gate under ``benchmarks/results/paired_seeds_labels/surf/<S>-<T>/``;
* the two-class tasks of ``benchmarks/investigations/two_class.py`` (12 SURF pairs and 4
  Office-31 pairs), records under ``benchmarks/results/two_class_20seeds/``, with every
  variant that has 20 seeds there (the default, the gates, the paper's loss).

Nothing is trained here; ``--commands`` prints the commands that write the records.

Usage (repository root): ``python benchmarks/investigations/paired_seeds.py [--markdown]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from eada.reports.tables import markdown_table
from eada.runs import read_jsonl, write_json

sys.path.insert(0, str(Path(__file__).parent))  # two_class
sys.path.insert(0, str(Path(__file__).parents[1]))  # leaderboard, at the top of benchmarks/
from two_class import last_acc, read_runs

from leaderboard import SURF_DIR, SURF_FILES, SURF_PAIRS

R = Path("benchmarks/results")
TEN_CLASS = R / "paired_seeds" / "surf"
TEN_CLASS_LABELS = R / "paired_seeds_labels" / "surf"  # eada with train.fea_gate=labels
TWO_CLASS = R / "two_class_20seeds"
SEEDS = list(range(20))
VARIANTS = ["normalized", "normalized_confidence", "normalized_dann", "normalized_labels", "paper"]
SHOWN = {  # column names: the default is the labels gate since issue 23
    "normalized": "no gate (default before)",
    "normalized_labels": "labels gate (default)",
    "normalized_confidence": "confidence gate",
    "normalized_dann": "dann gate",
    "paper": "paper",
}


def paired(with_: dict[int, float], without: dict[int, float]) -> dict[str, Any] | None:
    """Mean and standard error of ``with - without`` over :data:`SEEDS` (``None`` unless both
    have every seed), and the mean over seeds 0-2.

    >>> r = paired({s: 50.0 + s % 2 for s in SEEDS}, {s: 50.0 for s in SEEDS})
    >>> r["mean"], round(r["se"], 3), round(r["seeds_0_2"], 3)
    (0.5, 0.115, 0.333)
    """
    if not all(s in with_ and s in without for s in SEEDS):
        return None
    d = np.array([with_[s] - without[s] for s in SEEDS])
    return {
        "mean": float(d.mean()),
        "se": float(d.std(ddof=1) / np.sqrt(len(d))),
        "seeds_0_2": float(d[:3].mean()),
        "without_mean": float(np.mean([without[s] for s in SEEDS])),
    }


def ten_class() -> dict[str, Any]:
    """Per SURF pair: the paired difference of the default and of the ``labels`` gate
    (``eada bench`` records)."""

    def accs(log: Path, method: str) -> dict[int, float]:
        return {
            r["seed"]: float(r["final"]["target/accuracy"])
            for r in read_jsonl(log)
            if r["method"] == method
        }

    out = {}
    for pair in SURF_PAIRS:
        base = accs(TEN_CLASS / pair / "runs.jsonl", "eada_no_fea")
        row = {
            "normalized": paired(accs(TEN_CLASS / pair / "runs.jsonl", "eada"), base),
            "normalized_labels": paired(accs(TEN_CLASS_LABELS / pair / "runs.jsonl", "eada"), base),
        }
        if row["normalized"] is not None:
            out[f"SURF {pair.replace('-', '->')}"] = {k: v for k, v in row.items() if v}
    return out


def two_class() -> dict[str, Any]:
    """Per two-class task: each variant's paired difference (``two_class.py`` records)."""

    def accs(folder: Path) -> dict[int, float]:
        return {r["seed"]: last_acc(r) for r in read_runs(folder)}

    out: dict[str, Any] = {}
    for kind in ("surf", "office31"):
        for task in sorted((TWO_CLASS / kind).glob("*")):
            base = accs(task / "no_fea")
            row = {v: paired(accs(task / v), base) for v in VARIANTS}
            out[f"{kind} {task.name} (2 classes)"] = {k: v for k, v in row.items() if v}
    return out


def markdown(rows: dict[str, Any]) -> str:
    """One row a task: w/o ``L_fea``'s 20-seed mean, then per variant ``mean ± se`` of the
    paired difference (seeds 0-2 in brackets); ``**`` where the mean is below -1."""
    used = [v for v in VARIANTS if any(v in r for r in rows.values())]
    head = ["task", "w/o L_fea (20 seeds)", *[f"{SHOWN.get(v, v)} - w/o" for v in used]]
    body = []
    for name, r in rows.items():
        base = next(iter(r.values()))["without_mean"]
        cells = []
        for v in used:
            c = r.get(v)
            if c is None:
                cells.append("–")
                continue
            text = f"{c['mean']:+.1f} ± {c['se']:.1f} ({c['seeds_0_2']:+.1f})"
            cells.append(f"**{text}**" if c["mean"] < -1 else text)
        body.append([name, f"{base:.1f}", *cells])
    return markdown_table(head, body)


def commands() -> list[str]:
    """The commands that write the records read here."""
    d = SURF_DIR
    out = []
    for pair in SURF_PAIRS:
        s, t = pair.split("-")
        base = (
            f"eada bench configs/office_caltech10_surf.yaml --seeds 0-19 "
            f"--set data.source={d}/{SURF_FILES[s]}_SURF_L10.mat "
            f"--set data.target={d}/{SURF_FILES[t]}_SURF_L10.mat --set 'name=surf/{s}->{t}' "
            "--set train.alignment=normalized --jobs 1 --threads 1"
        )
        out += [
            f"{base} --methods eada_no_fea --out {TEN_CLASS}/{pair}",
            f"{base} --methods eada --set train.fea_gate=none --out {TEN_CLASS}/{pair}",
            f"{base} --methods eada --set train.fea_gate=labels --out {TEN_CLASS_LABELS}/{pair}",
        ]
    out.append(
        "python benchmarks/investigations/two_class.py --variants no_fea,normalized,"
        f"normalized_confidence,normalized_labels --seeds 0-19 --out {TWO_CLASS}"
    )
    out.append(
        "python benchmarks/investigations/two_class.py --office31 --variants no_fea,normalized,"
        "normalized_confidence,normalized_dann,normalized_labels,paper --seeds 0-19 "
        f"--only office31/<the four pairs> --out {TWO_CLASS}"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the table (and write ``benchmarks/results/paired_seeds/summary.json``)."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--commands", action="store_true", help="print the commands and stop")
    args = p.parse_args(argv)
    if args.commands:
        print("\n".join(commands()))
        return 0
    rows = ten_class() | two_class()
    write_json(R / "paired_seeds" / "summary.json", {"seeds": SEEDS, "tasks": rows})
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
