"""Is our CLUE's seed spread ours? Its training term and its clustering, measured per round.

For each task and seed, one CLUE run (``eada.experiment``) with a callback that, at every
selection round, takes the pool outputs the round used (energies, embeddings) and measures:

* the entropy weights: mean entropy of the pool, and the weights' effective sample size
  ``(sum w)^2 / sum w^2`` against ``K`` (the budget, = the number of clusters): far below ``K``,
  a few confident-less samples carry the whole weight and k-means puts several centroids on them;
* the clustering's own seed dependence on THAT state: our selection (``n_init=1``) and the
  authors' k-means setting (scikit-learn 0.22's ``KMeans(n)``: ``n_init=10``) each run with
  ``--restarts`` k-means seeds; reported: the mean pairwise overlap (Jaccard) of the picked sets
  and the spread of the weighted inertia.

With ``--variant no_entropy_term`` the runs train WITHOUT CLUE's adversarial entropy term
(``active.params.aux_components=[]``: selection unchanged), which separates the training term's
share of the seed spread from the selection's.

``--pre-round`` trains nothing: from the committed run records (``runs.jsonl`` under
``benchmarks/results``, method ``clue`` and ``entropy``, no sweep variant) it compares, per
task and seed, the target accuracy right before the first round: the two runs are the same
trainer, seed and data up to there except for CLUE's entropy term, so the difference is the
term's effect on the model CLUE selects with.

Usage (repository root; one torch thread)::

    python benchmarks/investigations/clue_diagnosis.py configs/office_caltech10_surf.yaml \\
        --set data.source=... --set data.target=... --set name=surf/C->D --seeds 0-4 \\
        --out benchmarks/results/clue_diagnosis/surf_c-d.json
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.cluster import KMeans

import eada.train.aux  # noqa: F401  (registers CLUE's training component with the trainer)
from eada.bench import make_config, task_id
from eada.experiment import run_once
from eada.runs import environment_info, find_jsonl, read_jsonl, write_json
from eada.strategies.clue import entropy_from_energies, nearest_unique

VARIANTS = {"clue": [], "no_entropy_term": ["active.params.aux_components=[]"]}


def jaccard_mean(sets: list[set[int]]) -> float:
    """Mean pairwise Jaccard overlap of picked sets (1 = always the same picks)."""
    pairs = list(itertools.combinations(sets, 2))
    return float(np.mean([len(a & b) / len(a | b) for a, b in pairs])) if pairs else 1.0


def clustering_spread(
    z: np.ndarray, w: np.ndarray, k: int, n_init: int, restarts: int
) -> dict[str, float]:
    """Picks and weighted inertia of ``restarts`` weighted k-means runs (seeds 0..restarts-1)."""
    picks, inertia = [], []
    for s in range(restarts):
        km = KMeans(n_clusters=k, n_init=n_init, random_state=s).fit(z, sample_weight=w)
        picks.append(set(nearest_unique(z, km.cluster_centers_).tolist()))
        inertia.append(float(km.inertia_))
    arr = np.array(inertia)
    return {
        "jaccard": jaccard_mean(picks),
        "inertia_min": float(arr.min()),
        "inertia_max": float(arr.max()),
        "inertia_cv": float(arr.std() / arr.mean()),
    }


class RoundProbe:
    """Trainer callback: measures every round's CLUE state (see the module docstring)."""

    def __init__(self, restarts: int) -> None:
        self.restarts = restarts
        self.rounds: list[dict[str, Any]] = []

    def __call__(self, event: str, trainer: Any, info: dict[str, Any]) -> None:
        """On ``after_round``: the proposal the round used."""
        if event != "after_round" or trainer.last_proposal is None:
            return
        prop = trainer.last_proposal
        z = np.ascontiguousarray(prop.outputs.require_embeddings("clue"), dtype=np.float32)
        h = entropy_from_energies(prop.outputs.require_energies("clue"))
        w = h + 1e-8
        k = len(prop.chosen)
        ess = float(w.sum() ** 2 / (w**2).sum())
        self.rounds.append(
            {
                "round": info.get("round"),
                "pool": len(z),
                "k": k,
                "mean_entropy": float(h.mean()),
                "weight_ess": ess,
                "ess_over_k": ess / k,
                "ours_n_init_1": clustering_spread(z, w, k, 1, self.restarts),
                "authors_n_init_10": clustering_spread(z, w, k, 10, self.restarts),
            }
        )


def pre_round(root: Path = Path("benchmarks/results")) -> dict[str, Any]:
    """Per task: accuracy before round 1 of CLUE and of Entropy (same seeds), and the difference."""

    acc: dict[str, dict[str, dict[int, float]]] = {}
    for path in find_jsonl(root):
        if any(k in path.as_posix() for k in ("sweep", "lfea", "waal_critic", "leaderboard")):
            continue
        for rec in read_jsonl(path):
            if "task" not in rec or rec["method"] not in ("clue", "entropy") or rec["variant"]:
                continue
            name = rec["config"].get("name") or rec["task"]
            first = rec["rounds"][0]["target_accuracy"]
            acc.setdefault(name, {}).setdefault(rec["method"], {})[rec["seed"]] = first
    out = {}
    for name, by in sorted(acc.items()):
        seeds = sorted(set(by.get("clue", {})) & set(by.get("entropy", {})))
        if not seeds:
            continue
        diff = [by["clue"][s] - by["entropy"][s] for s in seeds]
        out[name] = {
            "seeds": seeds,
            "clue": [by["clue"][s] for s in seeds],
            "entropy": [by["entropy"][s] for s in seeds],
            "difference": diff,
            "mean_difference": float(np.mean(diff)),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the CLUE diagnosis of one task and write its JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("task", nargs="?")
    ap.add_argument("--pre-round", action="store_true", help="from the records; trains nothing")
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    ap.add_argument("--seeds", default="0-4")
    ap.add_argument("--variant", choices=sorted(VARIANTS), action="append")
    ap.add_argument("--restarts", type=int, default=5)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.pre_round:
        write_json(args.out, {"command": " ".join(["python", *sys.argv]), "tasks": pre_round()})
        return 0
    if args.task is None:
        ap.error("a task is needed (or --pre-round)")
    a, _, b = args.seeds.partition("-")
    seeds = list(range(int(a), int(b or a) + 1))
    out: dict[str, Any] = {
        "task": args.task,
        "overrides": args.overrides,
        "command": " ".join(["python", *sys.argv]),
        "environment": environment_info(),
        "runs": [],
    }
    for variant in args.variant or ["clue", "no_entropy_term"]:
        for seed in seeds:
            cfg = make_config(
                task_id(args.task), "clue", seed, [*args.overrides, *VARIANTS[variant]]
            )
            probe = RoundProbe(args.restarts)
            t0 = time.perf_counter()
            res = run_once(cfg, callbacks=[probe], record_stats=False)
            last = res["results"]["final"]["last_epoch"]["target"]["accuracy"]
            first = res["results"]["rounds"][0]["after_training"]["target"]["accuracy"]
            out["runs"].append(
                {
                    "variant": variant,
                    "seed": seed,
                    "final_accuracy": last,
                    "accuracy_before_round_1": first,
                    "seconds": time.perf_counter() - t0,
                    "rounds": probe.rounds,
                }
            )
            print(f"{variant} seed {seed}: {last:.1f} (before round 1: {first:.1f})", flush=True)
            write_json(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
