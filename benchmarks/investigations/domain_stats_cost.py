"""Cost of the domain statistics every `eada run` records (``DomainStatsRecorder``): CPU
seconds of one snapshot on MNIST->USPS (LeNet, digits preset), and how much of it the proxy
A-distance and the MMD take (measured on the same features).

A run takes one snapshot before each round and one after the last epoch (6 for the digits
presets). CPU time (``time.process_time``) is used so the number does not depend on what else
the machine runs; one thread (the result names it). Run it once per code version::

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/investigations/domain_stats_cost.py \\
        --label after \\
        --out benchmarks/results/domain_stats_cost.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch


def main() -> None:
    """Measure and append one row to ``--out``."""
    import eada
    from eada.data.tasks import load_task
    from eada.hparams import preset_config
    from eada.train import ActiveDATrainer
    from eada.train.domain_stats import DomainStatsRecorder, mmd2_rbf, proxy_a_distance

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--label", default="current")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    cfg = preset_config("digits/mnist-usps", "eada", 0)
    task = load_task(cfg.data, 0, cfg.model)
    trainer = ActiveDATrainer(cfg, task)
    rec = DomainStatsRecorder()
    rec.snapshot(trainer, "warm-up", 0)  # imports, subsample indices
    t0 = time.process_time()
    for _ in range(a.repeats):
        rec.snapshot(trainer, "timed", 0)
    snapshot = (time.process_time() - t0) / a.repeats
    rng = np.random.default_rng(0)
    with torch.no_grad():
        zs = [
            trainer.model.embed(d.x[torch.from_numpy(rng.permutation(len(d))[:500])]).double()
            for d in (task.source, task.target)
        ]
    s, t = zs[0].numpy(), zs[1].numpy()
    t0 = time.process_time()
    proxy_a_distance(s, t)
    a_dist = time.process_time() - t0
    t0 = time.process_time()
    mmd2_rbf(s, t)
    mmd = time.process_time() - t0
    row = {
        "label": a.label,
        "code": str(Path(eada.__file__).parent),
        "task": "digits/mnist-usps, LeNet (untrained), 1000 free energies + 500 features a domain",
        "torch_threads": torch.get_num_threads(),
        "snapshot_cpu_seconds": snapshot,
        "a_distance_cpu_seconds": a_dist,
        "mmd_cpu_seconds": mmd,
    }
    print(json.dumps(row))
    if a.out:
        path = Path(a.out)
        rows = json.loads(path.read_text()) if path.exists() else []
        path.write_text(json.dumps([*rows, row], indent=1) + "\n")


if __name__ == "__main__":
    main()
