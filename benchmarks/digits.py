"""Digits benchmark: MNIST->USPS, USPS->MNIST, MNIST->MNIST-M; Random and EADA (Source-only with
``--methods source_only,random,eada``).

Usage (from the repository root, ../shared/data beside it):

    python benchmarks/digits.py [--seeds 0-2] [--tasks mnist-usps,...] [--methods ...]
                                [--data ../shared/data/digits] [--out benchmarks/results/digits]

Every (task, method) writes ``OUT/<task>/<method>/runs.jsonl`` (one line per finished seed), so
an interrupted benchmark resumes where it stopped. The summary goes to ``OUT.json`` and the
Markdown table to stdout (pasted into BENCHMARKS.md). EADA here runs the paper's L_fea
(``train.alignment: paper``), as the committed runs did; the default ``normalized`` variant is
compared in BENCHMARKS.md ("Alignment variants").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from eada.experiment import run_seeds
from eada.hparams import METHOD_LABELS, preset_config
from eada.reports.tables import markdown_table, mean_std
from eada.runs import environment_info, parse_seeds, write_json

TASKS = ("mnist-usps", "usps-mnist", "mnist-mnistm")
# the methods whose runs are committed under benchmarks/results/digits (their records predate
# the data digests: a re-run into that folder is refused, use another --out); Source-only on
# digits: the `eada bench` grid (BENCHMARKS.md), or
# --methods source_only,random,eada here
METHODS = ("random", "eada")


def markdown(summary: dict[str, Any]) -> str:
    """One table per task: accuracy (%) after each round, mean ± std over seeds."""
    lines = []
    for task, methods in summary["tasks"].items():
        n_rounds = max(len(m["rounds"]) for m in methods.values())
        for split in ("target", "heldout"):
            if not any(f"last_epoch/{split}/accuracy" in m["final"] for m in methods.values()):
                continue
            head = ["method"] + [f"{r}%" for r in range(n_rounds)] + ["final (last epoch)"]
            lines.append(
                f"\n**{task}** — {split} accuracy (%), mean ± std over seeds {summary['seeds']}\n"
            )
            body = []
            for m, res in methods.items():
                cells = []
                for r in range(n_rounds):
                    row = res["rounds"][r] if r < len(res["rounds"]) else None
                    cells.append(mean_std(row[f"{split}/accuracy"]) if row else "")
                final = res["final"][f"last_epoch/{split}/accuracy"]
                body.append([METHOD_LABELS[m], *cells, mean_std(final)])
            lines.append(markdown_table(head, body))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the grid, write the summary JSON and print the Markdown tables."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", default="0-2")
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--data", default="../shared/data/digits")
    p.add_argument("--out", default="benchmarks/results/digits")
    p.add_argument("--table-only", action="store_true", help="print the table of OUT.json only")
    args = p.parse_args(argv)
    if args.table_only:
        print(markdown(json.loads(Path(args.out).with_suffix(".json").read_text())))
        return 0
    seeds = parse_seeds(args.seeds)
    out = Path(args.out)
    summary: dict[str, Any] = {
        "benchmark": "digits",
        "seeds": seeds,
        "tasks": {},
        "meta": environment_info(),
    }
    for task in args.tasks.split(","):
        summary["tasks"][task] = {}
        for method in args.methods.split(","):

            def make(seed: int, task: str = task, method: str = method) -> Any:
                # the committed runs predate train.alignment: they ran the paper's L_fea
                sets = [f"data.root={args.data}", "train.alignment=paper"]
                return preset_config(f"digits/{task}", method, seed, sets)

            print(f"== {task} / {method}", file=sys.stderr, flush=True)
            res = run_seeds(make, seeds, out / task / method)
            summary["tasks"][task][method] = {k: res[k] for k in ("final", "rounds")}
            summary["tasks"][task][method]["config"] = make(seeds[0]).resolved()
            write_json(out.with_suffix(".json"), summary)
    print(markdown(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
