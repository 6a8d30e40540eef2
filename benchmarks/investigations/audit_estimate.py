"""How good is an audit round's estimate? ``eada query --audit N`` on a real unlabeled target,
against the true accuracy of the same model on the same pool.

Office-Caltech10 SURF amazon -> webcam as a project store whose target is UNLABELED (the webcam
rows saved without labels), MLP energy network, ``configs/office_caltech10_surf.yaml``'s
optimiser; per seed: train 5 epochs, then draw several audit rounds of N samples each in turn
(every audit leaves the pool smaller; each is scored by the same model) and label them from the
ground truth the project never saw. For every audit: the estimate, its 95 % Wilson interval,
and the true accuracy of that model on the pool the audit was drawn from (all its samples'
stored predictions are compared with the truth); the table gives the mean absolute error and
how often the interval holds the truth.

Usage (repository root, ../shared/data beside it):

    python benchmarks/investigations/audit_estimate.py [--seeds 0-9] [--n 20] [--draws 3]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from scipy.io import loadmat

from eada.runs import environment_info, parse_seeds, write_json
from eada.store import Project
from eada.store.config import load_project_config
from eada.store.project import init_project
from eada.threads import set_threads
from eada.train import ActiveDATrainer
from eada.train.evaluate import predict_energies


def run_seed(data: Path, seed: int, n: int, draws: int, work: Path) -> list[dict[str, float]]:
    """One project: train 5 epochs, ``draws`` audit rounds of ``n``; per audit the estimate,
    its interval and the truth on its pool."""
    w = loadmat(data / "webcam_SURF_L10.mat")
    truth = w["labels"].ravel().astype(int)  # class names are "1".."10"
    np.save(work / "w.npy", w["fts"])
    raw = {
        "seed": seed,
        "data": {
            "kind": "features",
            "source": str(data / "amazon_SURF_L10.mat"),
            "target": str(work / "w.npy"),
            "normalize": "l1_zscore",
        },
        "model": {"name": "mlp", "hidden": [256]},
        "optim": {"name": "adadelta", "lr": 0.1},
        "train": {"epochs": 10, "batch_size": 32},
        "active": {"rounds_at": [5], "budget_per_round": 3},
    }
    (work / "c.yaml").write_text(yaml.safe_dump(raw))
    cfg, options = load_project_config(work / "c.yaml", [])
    proj: Project = init_project(work / "P", cfg, options=options)
    proj.train()
    out = []
    for _ in range(draws):
        res = proj.audit(n)
        ck = proj.store.checkpoints()[-1]
        state = proj.load_checkpoint(ck)
        tr = ActiveDATrainer(proj.cfg, proj.task)
        tr.model.load_state_dict(state["model"])
        pred = predict_energies(tr.model, proj.task.target, None, 512, "cpu").argmin(1).numpy()
        # the pool of this draw: every target sample not drawn by an earlier audit
        rnd = proj.store.rounds()[-1]
        earlier = {
            r[0]
            for r in proj.store.conn.execute(
                "SELECT sample_id FROM round_samples WHERE round_id != ? AND rank IS NOT NULL",
                (rnd["id"],),
            )
        }
        ids = [r["id"] for r in proj.store.samples("target")]
        pool = [i for i, sid in enumerate(ids) if sid not in earlier]
        true_acc = 100.0 * float(np.mean(pred[pool] + 1 == truth[pool]))
        with open(res["files"]["csv"], newline="") as fh:
            rows = list(csv.DictReader(fh))
        for r in rows:
            r["label"] = str(truth[int(r["index"])])
        filled = work / "filled.csv"
        with open(filled, "w", newline="") as fh:
            wr = csv.DictWriter(fh, fieldnames=list(rows[0]))
            wr.writeheader()
            wr.writerows(rows)
        proj.import_labels(filled, "truth")
        est = proj.status()["audit"]["latest"]
        lo, hi = est["ci95"]
        out.append(
            {
                "seed": seed,
                "pool": len(pool),
                "estimate": est["accuracy"],
                "low": lo,
                "high": hi,
                "true": true_acc,
            }
        )
    proj.close()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", default="0-9")
    p.add_argument("--n", type=int, default=20)
    p.add_argument("--draws", type=int, default=3)
    p.add_argument("--data", default="../shared/data/office_caltech10_surf")
    p.add_argument("--out", default="benchmarks/results/audit_estimate.json")
    args = p.parse_args()
    set_threads(1)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    audits = []
    for seed in parse_seeds(args.seeds):
        with tempfile.TemporaryDirectory() as tmp:
            audits += run_seed(Path(args.data).resolve(), seed, args.n, args.draws, Path(tmp))
        a = audits[-1]
        print(
            f"seed {seed}: estimate {a['estimate']:.1f} [{a['low']:.1f}, {a['high']:.1f}] "
            f"true {a['true']:.1f}",
            file=sys.stderr,
            flush=True,
        )
    err = [abs(a["estimate"] - a["true"]) for a in audits]
    held = [a["low"] <= a["true"] <= a["high"] for a in audits]
    summary = {
        "audits": len(audits),
        "n": args.n,
        "mean_abs_error": float(np.mean(err)),
        "mean_signed_error": float(np.mean([a["estimate"] - a["true"] for a in audits])),
        "interval_holds_truth": float(np.mean(held)),
        "mean_interval_width": float(np.mean([a["high"] - a["low"] for a in audits])),
        "mean_true_accuracy": float(np.mean([a["true"] for a in audits])),
        "seconds": time.perf_counter() - t0,
    }
    write_json(
        Path(args.out),
        {"summary": summary, "audits": audits, "args": vars(args), "env": environment_info()},
    )
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
