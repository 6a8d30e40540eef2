"""Calibrate the toy example's open parameters to the paper's two baselines (Fig. 5).

The paper gives the toy's design (two Gaussian classes, the target the source rotated, one
fully-connected layer, 3 rounds of 2 % of the target) and four target errors: Source-only 52.0,
Random 8.5, BADGE 4.2, EADA 1.0. It leaves the numbers open: class separation, spread, rotation,
samples per class and training length. This script chooses them so that the two baselines that
involve no selection method, **Source-only and Random, land on 52.0 and 8.5** (mean over seeds
0-4). It runs only those two methods; EADA's and BADGE's settings and results play no part in
the choice (they are measured afterwards on the chosen point with ``--report``).

What is searched (everything else is the ``toy`` preset of :mod:`eada.hparams`: Adadelta lr 0.1,
batch 32, 2 % of the target a round, rounds at 1/4, 1/2 and 3/4 of the epochs):

* ``std`` stays 1: only ``separation / std`` shapes the data (the network is linear with a
  bias, so scaling every input changes the optimiser's path, not the problem);
* stage A, a grid: ``separation`` 3.5-7 x ``rotation_deg`` 90 and 95 (500 a class, 40 epochs;
  separation 7 at 90 degrees is the original ``toy`` preset);
* stage B: ``n_per_class`` 250 and 1000 at stage A's best point;
* stage C: 20 and 60 epochs (rounds scaled with them) at the best point so far;
* stage D: ``separation`` +- 0.25, then ``rotation_deg`` +- 2 around the best point so far.

Score of a point (lower is better): ``sqrt(((SO - 52) / 8)^2 + ((R - 8.5) / 4)^2)`` on the
5-seed means, i.e. the distance in units of the accepted band (Source-only 52 +- 8, Random
8.5 +- 4). A point whose seeds-0-2 means (``eada demo``'s default seeds) fall outside that band
ranks after every point whose means do not. The target's Bayes error is
``Phi(-separation / (2 std))``: no classifier, EADA's included, can err less on the target.

Every run uses one torch thread (and one BLAS thread); the machine is recorded. The JSON is
rewritten after every point; a rerun with the same seeds reuses the points it already holds.

    python benchmarks/toy_calibration.py [--seeds 0-4]
        [--out benchmarks/results/toy_calibration.json]
    python benchmarks/toy_calibration.py --table   # the JSON's table in Markdown

The table adds two floors computed from the parameters: the target's Bayes error, and the target
error of the one boundary that serves both domains alike (:func:`shared_boundary_error`).

The chosen point is written into :mod:`eada.hparams` by hand as the ``toy-calibrated`` preset;
what every method gets there (EADA and BADGE included) is ``eada demo --seeds 5``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from eada.data.tasks import load_task
from eada.experiment import final_accuracy, run_once
from eada.hparams import preset_config
from eada.runs import environment_info
from eada.threads import set_threads

#: The paper's toy errors (%) the search aims at, and the accepted band around each.
TARGETS = {"source_only": (52.0, 8.0), "random": (8.5, 4.0)}
PAPER = {"source_only": 52.0, "random": 8.5, "badge": 4.2, "eada": 1.0}
BASE = {"separation": 7.0, "std": 1.0, "rotation_deg": 90.0, "n_per_class": 500, "epochs": 40}
STAGE_A_SEPARATIONS = (3.5, 4.0, 4.5, 5.0, 6.0, 7.0)
STAGE_A_ROTATIONS = (90.0, 95.0)


def parse_seeds(text: str) -> list[int]:
    """``"0-4"`` -> ``[0, 1, 2, 3, 4]``; ``"0,2"`` -> ``[0, 2]``."""
    if "-" in text:
        lo, hi = (int(t) for t in text.split("-", 1))
        return list(range(lo, hi + 1))
    return [int(t) for t in text.split(",")]


def overrides(point: dict[str, float]) -> list[str]:
    """``--set`` overrides of the ``toy`` preset for one point of the search."""
    e = int(point["epochs"])
    rounds = [e // 4, e // 2, 3 * e // 4]
    return [
        f"data.separation={point['separation']}",
        f"data.std={point['std']}",
        f"data.rotation_deg={point['rotation_deg']}",
        f"data.n_per_class={int(point['n_per_class'])}",
        f"train.epochs={e}",
        f"active.rounds_at={rounds}",
    ]


def run_method(preset: str, method: str, seed: int, sets: list[str]) -> dict[str, Any]:
    """Target error (%) of one run, and the error before the first labels (the cold start)."""
    cfg = preset_config(preset, method, seed, sets)
    run = run_once(cfg, load_task(cfg.data, seed), record_stats=False)
    rounds = run["results"]["rounds"]  # round 0: the model before the first labels
    before = None
    if rounds and rounds[0]["round"] == 0 and "after_training" in rounds[0]:
        before = 100.0 - rounds[0]["after_training"]["target"]["accuracy"]
    return {"error": 100.0 - final_accuracy(run), "before_first_labels": before}


def bayes_error(point: dict[str, float]) -> float:
    """The target's Bayes error (%): two equal Gaussians ``separation`` apart, spread ``std``."""
    z = point["separation"] / (2 * point["std"])
    return 100.0 * 0.5 * math.erfc(z / math.sqrt(2))


def shared_boundary_error(point: dict[str, float]) -> float:
    """Target error (%) of the boundary that serves source and target alike.

    The line through the origin halfway between the source's and the target's class axes (they
    are ``rotation_deg`` apart): its margin is ``separation / 2 * cos(rotation / 2)`` on both
    domains. A linear model fitted to the source and a few target labels together ends near it.
    """
    half = math.radians(point["rotation_deg"]) / 2
    z = point["separation"] / 2 * abs(math.cos(half)) / point["std"]
    return 100.0 * 0.5 * math.erfc(z / math.sqrt(2))


def markdown_table(rows: list[dict[str, Any]], chosen: dict[str, Any]) -> str:
    """The search as a Markdown table (the chosen point in bold), for the results page."""
    head = (
        "| stage | separation | rotation | n a class | epochs | Source-only | Random | score "
        "| seeds 0-2 in band | Bayes error | shared boundary |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        pick = point_of(r) == {k: chosen[k] for k in BASE}
        cells = [
            r["stage"],
            f"{r['separation']:g}",
            f"{r['rotation_deg']:g}°",
            f"{int(r['n_per_class'])}",
            f"{int(r['epochs'])}",
            f"{r['source_only']['mean']:.1f} ± {r['source_only']['std']:.1f}",
            f"{r['random']['mean']:.1f} ± {r['random']['std']:.1f}",
            f"{r['score']:.2f}",
            "yes" if r["demo_seeds_in_band"] else "no",
            f"{bayes_error(r):.1f}",
            f"{shared_boundary_error(r):.1f}",
        ]
        if pick:
            cells = [f"**{c}**" for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _std(xs: list[float]) -> float:
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0


def evaluate(point: dict[str, float], seeds: list[int], stage: str) -> dict[str, Any]:
    """Source-only and Random on one point: per-seed errors, means, score."""
    t0 = time.perf_counter()
    row: dict[str, Any] = {"stage": stage, **point, "bayes_error": bayes_error(point)}
    sets = overrides(point)
    for m in ("source_only", "random"):
        errors = [run_method("toy", m, s, sets)["error"] for s in seeds]
        row[m] = {"errors": errors, "mean": _mean(errors), "std": _std(errors)}
    row["score"] = math.hypot(*((row[m]["mean"] - t) / band for m, (t, band) in TARGETS.items()))
    demo = [i for i, s in enumerate(seeds) if s < 3]  # eada demo's default seeds 0-2
    row["demo_seeds_in_band"] = bool(demo) and all(
        abs(_mean([row[m]["errors"][i] for i in demo]) - t) <= band
        for m, (t, band) in TARGETS.items()
    )
    row["seconds"] = time.perf_counter() - t0
    return row


def best(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The best row: in-band on the demo's seeds first, then the lowest score."""
    return min(rows, key=lambda r: (not r["demo_seeds_in_band"], r["score"]))


def point_of(row: dict[str, Any]) -> dict[str, float]:
    """The parameters of a row."""
    return {k: row[k] for k in BASE}


def _key(point: dict[str, Any]) -> tuple[float, ...]:
    return tuple(float(point[k]) for k in BASE)


def search(
    seeds: list[int], log: Any, done: list[dict[str, Any]], save: Any
) -> list[dict[str, Any]]:
    """Stages A-D (module docstring); every evaluated point once, in order.

    ``done``: rows of an earlier run with the same seeds, reused; ``save(rows)`` after each point.
    """
    rows: list[dict[str, Any]] = []
    cache = {_key(r): r for r in done}

    def ev(point: dict[str, float], stage: str) -> None:
        key = _key(point)
        if any(_key(r) == key for r in rows):
            return
        row = cache.get(key) or evaluate(point, seeds, stage)
        rows.append(row)
        save(rows)
        log(
            f"{stage} sep {row['separation']:5.2f} rot {row['rotation_deg']:6.1f} "
            f"n {int(row['n_per_class']):4d} ep {int(row['epochs']):3d}: "
            f"SO {row['source_only']['mean']:5.1f} +- {row['source_only']['std']:4.1f}  "
            f"R {row['random']['mean']:5.1f} +- {row['random']['std']:4.1f}  "
            f"score {row['score']:.2f}{'' if row['demo_seeds_in_band'] else ' (demo seeds out)'}"
            f"  {row['seconds']:.0f} s"
        )

    for sep in STAGE_A_SEPARATIONS:
        for rot in STAGE_A_ROTATIONS:
            ev({**BASE, "separation": sep, "rotation_deg": rot}, "A")
    for n in (250, 1000):
        ev({**point_of(best(rows)), "n_per_class": n}, "B")
    for e in (20, 60):
        ev({**point_of(best(rows)), "epochs": e}, "C")
    centre = point_of(best(rows))
    for ds in (-0.25, 0.25):
        ev({**centre, "separation": centre["separation"] + ds}, "D")
    centre = point_of(best(rows))
    for dr in (-2.0, 2.0):
        ev({**centre, "rotation_deg": centre["rotation_deg"] + dr}, "D")
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the search and write its JSON (every point's per-seed errors, the chosen point)."""
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    p.add_argument("--seeds", default="0-4")
    p.add_argument("--out", default="benchmarks/results/toy_calibration.json")
    p.add_argument("--table", action="store_true", help="print the JSON's table; run nothing")
    args = p.parse_args(argv)
    if args.table:
        rec = json.loads(Path(args.out).read_text())
        print(markdown_table(rec["search"]["rows"], rec["chosen"]))
        return 0
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    set_threads(1)  # torch, and the BLAS/OpenMP pools of the selection code
    torch.set_num_threads(1)
    seeds = parse_seeds(args.seeds)
    out = Path(args.out)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    old: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    earlier = old.get("search", {})
    done = earlier.get("rows", []) if earlier.get("seeds") == seeds else []
    stamp = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "seeds": seeds,
        "threads": 1,
        "machine": {
            "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
            "load_average_start": os.getloadavg(),
        },
        "meta": environment_info(),
        "command": "python benchmarks/toy_calibration.py " + " ".join(argv or sys.argv[1:]),
    }
    out.parent.mkdir(parents=True, exist_ok=True)

    def save(rows: list[dict[str, Any]]) -> None:
        chosen = best(rows)
        data = {
            "search": {**stamp, "targets": TARGETS, "paper": PAPER, "base": BASE, "rows": rows},
            "chosen": {**point_of(chosen), "score": chosen["score"]},
            "load_average_end": os.getloadavg(),
        }
        out.write_text(json.dumps(data, indent=1) + "\n")

    rows = search(seeds, log, done, save)
    chosen = best(rows)
    log(f"chosen: {point_of(chosen)} (score {chosen['score']:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
