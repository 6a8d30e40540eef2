"""The toy's first round, measured: where EADA's picks lie, what they turn, and why.

On the calibrated toy (``toy-calibrated``: a trained source model at the first round), over
seeds 0-9 (one torch thread), this script measures what ``docs/results/toy.md`` states:

* **round-1 geometry** (Random, EADA): the picks' mean distance to the round-1 boundary,
  their mean pairwise distance, the angle the boundary turns between round 1 and round 2 (one
  round of training with those labels), the target error after that round;
* **the common mode**: how far ``(w0 + w1) / 2`` moves between the initialisation and the first
  round (Source-only: NLL alone; EADA: NLL + ``L_fea``), and which share of the first step's
  top-``alpha1`` set lies on the high side of the initial common mode's median (the half-plane
  the initialisation chose), for the free energy ``F`` and the centred ``G = F - mean_y E``;
* **the Random-first-round ablation**: EADA whose first round takes a random draw of the same
  size (the later rounds EADA's own), against EADA and Random (and BADGE of ``--demo``);
* **the rotation sweep**: Random, BADGE and EADA at rotations 45, 60, 75 and 90 degrees (the rest
  the calibrated toy's), over ``--sweep-seeds`` (0-2), a separate run (``--sweep-only``);
* **the centred first step** on the toy (``eada_centered``) beside EADA;
* **the figure**: round-1 picks and boundaries of seed 0 for Random and EADA (a small PNG).

The table of the five demo methods over seeds 0-9 is ``eada demo --seeds 10`` (its
``results.json``); ``--demo`` adds its paired comparisons (EADA against Random and BADGE) to the
summary (BADGE's numbers come from there).

    python benchmarks/investigations/toy_geometry.py [--seeds 0-9]
        [--out benchmarks/results/toy_geometry] [--demo docs/demo/results.json]
        [--figure docs/results/toy_round1.png]
    python benchmarks/investigations/toy_geometry.py --sweep-only [--sweep-seeds 0-2]

Writes ``OUT/summary.json`` (per seed and aggregated; rewritten after each method) or
``OUT/sweep.json``; reruns recompute everything.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eada.data.base import TensorDomain
from eada.data.tasks import load_task
from eada.demo import first_round_recorder
from eada.energy import centered_free_energy, free_energy
from eada.experiment import final_accuracy, run_once
from eada.hparams import preset_config
from eada.reports.figures_runs import ToyPanel, plot_toy_rounds
from eada.runs import environment_info, parse_seeds, write_json
from eada.strategies import PoolOutputs, Selection, get_strategy
from eada.strategies.base import register
from eada.threads import set_threads

PRESET = "toy-calibrated"
ROTATIONS = (45.0, 60.0, 75.0, 90.0)


@register(
    "eada_random_first",
    needs=("free_energy", "mvsm"),
    summary="investigation only: a random draw in the first round, EADA's selection after it",
    reference="benchmarks/investigations/toy_geometry.py",
)
def _random_first(
    pool: PoolOutputs, budget: int, rng: np.random.Generator | None = None, **params: Any
) -> Selection:
    # the first round is the one whose pool is the whole target set
    name = "random" if len(pool) == pool.n_target else "eada"
    return get_strategy(name).fn(pool, budget, rng, **params)


def _head(model: torch.nn.Module) -> tuple[np.ndarray, np.ndarray]:
    head = model.head  # type: ignore[union-attr]
    return head.weight.detach().numpy().astype(float), head.bias.detach().numpy().astype(float)


def _angle(u: np.ndarray, v: np.ndarray) -> float:
    c = float(u @ v / (np.linalg.norm(u) * np.linalg.norm(v)))
    return math.degrees(math.acos(max(-1.0, min(1.0, c))))


def one_run(method: str, seed: int, sets: list[str] | None = None) -> dict[str, Any]:
    """One toy run with the first round's model, picks and the boundary after round 1."""
    cfg = preset_config(PRESET, method, seed, sets or [])
    task = load_task(cfg.data, seed)
    assert isinstance(task.target, TensorDomain)
    xt = task.target.x
    first: dict[str, float] = {}
    heads: dict[str, Any] = {}
    rounds = cfg.active.rounds_at

    class Probe:
        def attach(self, trainer: Any) -> None:
            heads["init"] = _head(trainer.model)

        def __call__(self, event: str, trainer: Any, info: dict[str, Any]) -> None:
            if event == "epoch_end" and info.get("epoch") in rounds[:2]:
                key = "round1" if info["epoch"] == rounds[0] else "round2"
                heads[key] = _head(trainer.model)
                if key == "round1":
                    with torch.no_grad():
                        e = trainer.model(xt)
                    heads["F"] = free_energy(e).numpy()
                    heads["G"] = centered_free_energy(e).numpy()

    probe = first_round_recorder(rounds[0], task, first)
    run = run_once(cfg, task, callbacks=[probe, Probe()], record_stats=False)
    res = run["results"]
    out: dict[str, Any] = {
        "error": 100.0 - final_accuracy(run),
        **first,
    }
    (w_init, b_init), (w1, b1) = heads["init"], heads["round1"]
    out["common_mode_shift"] = float(
        np.abs(
            np.concatenate([(w1.sum(0) - w_init.sum(0)) / 2, [(b1.sum() - b_init.sum()) / 2]])
        ).max()
    )
    x = xt.numpy().astype(float)
    m0 = x @ (w_init.sum(0) / 2) + b_init.sum() / 2  # the initial common mode on the target
    high = m0 > np.median(m0)
    n1 = math.ceil(cfg.active.alpha1 * len(x))
    for name in ("F", "G"):
        top = np.argsort(-heads[name], kind="stable")[:n1]
        out[f"stage1_high_side_{name}"] = float(high[top].mean())
    if len(res["rounds"]) > 1:
        picks = np.asarray(res["rounds"][1]["selected"])
        d1, c1 = w1[0] - w1[1], b1[0] - b1[1]
        p = x[picks]
        out["pick_distance_to_boundary"] = float(np.mean(np.abs(p @ d1 + c1)) / np.linalg.norm(d1))
        diff = p[:, None, :] - p[None, :, :]
        k = len(p)
        out["pick_pairwise_distance"] = float(np.sqrt((diff**2).sum(-1)).sum() / (k * (k - 1)))
        w2, b2 = heads["round2"]
        out["turn_after_round1"] = _angle(d1, w2[0] - w2[1])
        out["error_after_round1"] = 100.0 - res["rounds"][1]["after_training"]["target"]["accuracy"]
        out["_panel"] = ToyPanel(
            title="",
            source_x=task.source.x.numpy(),  # type: ignore[union-attr]
            source_y=task.source.y.numpy(),  # type: ignore[union-attr]
            target_x=x,
            target_y=task.target.y.numpy(),
            selected=[picks],
            boundaries=[(d1, float(c1)), (w2[0] - w2[1], float(b2[0] - b2[1]))],
        )
    return out


def paired(a: list[float], b: list[float]) -> dict[str, Any]:
    """``a - b`` seed by seed: mean, its 95 % t interval, and how many seeds each is lower on
    (errors: lower is better)."""
    from scipy import stats

    d = np.asarray(a) - np.asarray(b)
    n = len(d)
    se = float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0
    half = float(stats.t.ppf(0.975, n - 1)) * se if n > 1 else 0.0
    return {
        "mean_diff": float(d.mean()),
        "ci95": [float(d.mean()) - half, float(d.mean()) + half],
        "a_better": int((np.round(d, 1) < 0).sum()),
        "b_better": int((np.round(d, 1) > 0).sum()),
        "p_sign_flip": _sign_flip_p(d),
    }


def _sign_flip_p(d: np.ndarray) -> float:
    """Two-sided exact permutation p-value of the mean paired difference (all 2^n sign flips)."""
    n = len(d)
    obs = abs(d.sum())
    signs = np.array(np.meshgrid(*[[-1.0, 1.0]] * n)).reshape(n, -1)
    return float((np.abs(d @ signs) >= obs - 1e-9).mean())


def _agg(rows: list[dict[str, Any]]) -> dict[str, Any]:
    keys = [k for k in rows[0] if not k.startswith("_")]
    out: dict[str, Any] = {}
    for k in keys:
        v = [r[k] for r in rows]
        out[k] = {"per_seed": v, "mean": float(np.mean(v)), "std": float(np.std(v, ddof=1))}
    return out


def main(argv: list[str] | None = None) -> int:
    """Run every measurement and write ``OUT/summary.json`` (and the figure)."""
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    p.add_argument("--seeds", default="0-9")
    p.add_argument("--out", default="benchmarks/results/toy_geometry")
    p.add_argument("--demo", default=None, help="an eada demo results.json to compare paired")
    p.add_argument("--figure", default="docs/results/toy_round1.png")
    p.add_argument("--sweep-seeds", default="0-2", help="the rotation sweep's seeds")
    p.add_argument(
        "--sweep-only", action="store_true", help="only the rotation sweep, into OUT/sweep.json"
    )
    args = p.parse_args(argv)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    set_threads(1)
    torch.set_num_threads(1)
    seeds = parse_seeds(args.seeds)
    t0 = time.perf_counter()
    load_start = os.getloadavg()

    def log(line: str) -> None:
        print(f"[{time.perf_counter() - t0:6.0f} s] {line}", file=sys.stderr, flush=True)

    summary: dict[str, Any] = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "preset": PRESET,
        "seeds": seeds,
        "threads": 1,
        "command": "python benchmarks/investigations/toy_geometry.py "
        + " ".join(argv or sys.argv[1:]),
        "meta": environment_info(),
    }
    out = Path(args.out) / ("sweep.json" if args.sweep_only else "summary.json")

    def save() -> None:
        summary["seconds"] = time.perf_counter() - t0
        summary["load_average"] = {"start": load_start, "end": os.getloadavg()}
        write_json(out, summary)

    if args.sweep_only:
        sweep: dict[str, Any] = {}
        summary["sweep_seeds"] = parse_seeds(args.sweep_seeds)
        for rot in ROTATIONS:
            row: dict[str, Any] = {}
            for m in ("random", "badge", "eada"):
                errors = [
                    one_run(m, s, [f"data.rotation_deg={rot}"])["error"]
                    for s in summary["sweep_seeds"]
                ]
                row[m] = {
                    "errors": errors,
                    "mean": float(np.mean(errors)),
                    "std": float(np.std(errors, ddof=1)),
                }
            row["eada - badge"] = paired(row["eada"]["errors"], row["badge"]["errors"])
            row["eada - random"] = paired(row["eada"]["errors"], row["random"]["errors"])
            sweep[f"{rot:g}"] = row
            summary["rotation_sweep"] = sweep
            save()
            log(
                f"rotation {rot:g}: "
                + ", ".join(f"{m} {row[m]['mean']:.1f}" for m in ("random", "badge", "eada"))
            )
        return 0
    runs: dict[str, list[dict[str, Any]]] = {}
    for m in ("random", "eada", "eada_random_first", "source_only", "eada_centered"):
        sets = ["active.strategy=eada_random_first"] if m == "eada_random_first" else []
        runs[m] = [one_run("eada" if sets else m, s, sets) for s in seeds]
        summary["methods"] = {k: _agg(rs) for k, rs in runs.items()}
        save()
        log(f"{m}: {np.mean([r['error'] for r in runs[m]]):.1f}")
        if m == "eada":  # the figure as soon as its two runs exist
            panels = []
            for k, label in (("random", "Random"), ("eada", "EADA")):
                r = runs[k][0]
                panel = r["_panel"]
                panel.title = (
                    f"{label}, seed {seeds[0]}: {r['error_after_round1']:.1f} % after round 1"
                )
                panels.append(panel)
            fig = plot_toy_rounds(panels, max_cols=2)
            fig.set_size_inches(7.6, 4.2)
            Path(args.figure).parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(args.figure, dpi=72)
            summary["figure"] = args.figure
    err = {m: [r["error"] for r in rs] for m, rs in runs.items()}
    summary["paired"] = {
        "eada - random": paired(err["eada"], err["random"]),
        "eada_random_first - eada": paired(err["eada_random_first"], err["eada"]),
        "eada_random_first - random": paired(err["eada_random_first"], err["random"]),
        "eada_centered - eada": paired(err["eada_centered"], err["eada"]),
    }
    if args.demo:
        demo = json.loads(Path(args.demo).read_text())
        de = {m: s["errors"] for m, s in demo["strategies"].items()}
        summary["demo"] = {
            "file": args.demo,
            "seeds": demo["seeds"],
            "paired": {
                "eada - random": paired(de["eada"], de["random"]),
                "eada - badge": paired(de["eada"], de["badge"]),
                "eada_no_fea - eada": paired(de["eada_no_fea"], de["eada"]),
                "eada_random_first - badge": paired(err["eada_random_first"], de["badge"]),
            },
        }
    save()
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
