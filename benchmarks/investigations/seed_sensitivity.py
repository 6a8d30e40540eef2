"""How much do LAS's and CLUE's picks depend on the k-means seed? Measured on real pools.

For each task, one run of the method ``las`` (``eada.experiment``, the task's preset, seed 0)
with a callback that, at every selection round, takes the pool outputs the round used
(energies, embeddings) and selects again from THAT state with ``--restarts`` k-means seeds:

* LAS (``eada.strategies.lada``, its defaults: the authors' ranking, k-means on float64)
  with ``n_init`` 10 (the default, the authors' scikit-learn) and 1;
* CLUE (``eada.strategies.clue``) with ``n_init`` 10 (the default, the authors') and 1.

Only the seed of the k-means changes between the picks of one setting; the pool and the model
are the same. Reported per setting: the mean and minimum over all seed pairs of the overlap
``|A & B| / k`` of the picked sets (1 = the same samples whatever the seed), averaged over the
rounds; per round in the JSON.

Usage (repository root; one thread)::

    OMP_NUM_THREADS=1 python benchmarks/investigations/seed_sensitivity.py --threads 1 \\
        --out benchmarks/results/seed_sensitivity.json

The Markdown table goes to stdout (docs/duc-lada-fidelity.md).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import eada.train.aux  # noqa: F401  (registers the training components with the trainer)
from eada.bench import make_config, task_id
from eada.experiment import run_once
from eada.runs import environment_info, write_json
from eada.strategies import PoolOutputs, get_strategy
from eada.threads import set_threads

SURF = "../shared/data/office_caltech10_surf"
TASKS: dict[str, tuple[str, list[str]]] = {
    "SURF C->A": (
        "configs/office_caltech10_surf.yaml",
        [
            f"data.source={SURF}/Caltech10_SURF_L10.mat",
            f"data.target={SURF}/amazon_SURF_L10.mat",
            "name=surf/C->A",
        ],
    ),
    "SURF A->W": (
        "configs/office_caltech10_surf.yaml",
        [
            f"data.source={SURF}/amazon_SURF_L10.mat",
            f"data.target={SURF}/webcam_SURF_L10.mat",
            "name=surf/A->W",
        ],
    ),
    "Office-31 A(sub)->W": ("configs/office31_amazon_subset_webcam_lite0_frozen.yaml", []),
    "MNIST->USPS": ("digits/mnist-usps", ["train.forward=fused", "train.channels_last=true"]),
}
SETTINGS: list[tuple[str, str, dict[str, Any]]] = [
    ("LAS, n_init 10 (default)", "las", {"n_init": 10}),
    ("LAS, n_init 1", "las", {"n_init": 1}),
    ("CLUE, n_init 10 (default)", "clue", {"n_init": 10}),
    ("CLUE, n_init 1", "clue", {"n_init": 1}),
]


def overlaps(sets: list[set[int]], k: int) -> list[float]:
    """``|A & B| / k`` over every pair of ``sets``.

    >>> overlaps([{1, 2}, {2, 3}, {1, 2}], 2)
    [0.5, 1.0, 0.5]
    """
    return [len(a & b) / k for a, b in itertools.combinations(sets, 2)]


class Probe:
    """Trainer callback: at every round, the picks of each setting under ``restarts`` seeds."""

    def __init__(self, restarts: int) -> None:
        self.restarts = restarts
        self.rounds: list[dict[str, Any]] = []

    def __call__(self, event: str, trainer: Any, info: dict[str, Any]) -> None:
        """On ``after_round``: select again from the proposal the round used."""
        if event != "after_round" or trainer.last_proposal is None:
            return
        prop = trainer.last_proposal
        pool = PoolOutputs(
            energies=prop.outputs.require_energies("las"),
            embeddings=prop.outputs.require_embeddings("las"),
        )
        k = len(prop.chosen)
        params = dict(trainer.cfg.active.params)
        las_params = {p: params[p] for p in ("neighbours", "oversample") if p in params}
        row: dict[str, Any] = {"round": info.get("round"), "pool": len(pool), "k": k}
        for label, name, extra in SETTINGS:
            kw = {**(las_params if name == "las" else {}), **extra}
            sets = [
                set(get_strategy(name).fn(pool, k, np.random.default_rng(s), **kw).indices.tolist())
                for s in range(self.restarts)
            ]
            ov = overlaps(sets, k)
            row[label] = {"mean": float(np.mean(ov)), "min": float(np.min(ov))}
        self.rounds.append(row)


def main(argv: list[str] | None = None) -> int:
    """Measure every task and write the JSON; print the Markdown table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default=",".join(TASKS), help="comma-separated task labels")
    ap.add_argument("--restarts", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0, help="the training run's seed")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    set_threads(args.threads)
    out: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]),
        "threads": args.threads,
        "restarts": args.restarts,
        "environment": environment_info(),
        "tasks": {},
    }
    for label in args.tasks.split(","):
        spec, overrides = TASKS[label]
        cfg = make_config(task_id(spec), "las", args.seed, overrides)
        probe = Probe(args.restarts)
        t0 = time.perf_counter()
        run_once(cfg, callbacks=[probe], record_stats=False)
        summary = {
            s: {
                "mean": float(np.mean([r[s]["mean"] for r in probe.rounds])),
                "min": float(np.min([r[s]["min"] for r in probe.rounds])),
            }
            for s, _, _ in SETTINGS
        }
        out["tasks"][label] = {
            "spec": spec,
            "overrides": overrides,
            "seconds": time.perf_counter() - t0,
            "rounds": probe.rounds,
            "summary": summary,
        }
        write_json(args.out, out)
        print(f"{label}: done", file=sys.stderr, flush=True)
    head = "| task (pool, k) | " + " | ".join(s for s, _, _ in SETTINGS) + " |"
    lines = [head, "|" + "---|" * (len(SETTINGS) + 1)]
    for label, t in out["tasks"].items():
        r0 = t["rounds"][0]
        cells = [
            f"{t['summary'][s]['mean']:.2f} (min {t['summary'][s]['min']:.2f})"
            for s, _, _ in SETTINGS
        ]
        lines.append(f"| {label} ({r0['pool']}, {r0['k']}) | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
