"""Peak memory and time of BADGE's selection (``eada.strategies.diversity.badge_select``) on a
large pool: N = 50,000 samples, C = 345 classes (DomainNet), D = 256 features, budget 500.

Peak = the largest extra memory numpy allocates during the call (``tracemalloc``), beyond the
inputs (energies (N, C) and embeddings (N, D), float32: 69 MB + 51 MB). Run it once per code
version and compare; one thread (the result JSON names it)::

    OMP_NUM_THREADS=1 python benchmarks/investigations/badge_memory.py \\
        --out benchmarks/results/badge_memory.json
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc
from pathlib import Path

import numpy as np


def measure(n: int, c: int, d: int, budget: int, seed: int = 0) -> dict[str, float]:
    """Peak extra MB and seconds of one ``badge`` selection on random float32 inputs."""
    from eada.strategies import PoolOutputs, get_strategy

    rng = np.random.default_rng(seed)
    energies = rng.normal(size=(n, c)).astype(np.float32)
    embeddings = rng.normal(size=(n, d)).astype(np.float32)
    pool = PoolOutputs(energies=energies, embeddings=embeddings)
    fn = get_strategy("badge").fn
    tracemalloc.start()
    t0 = time.perf_counter()
    sel = fn(pool, budget, np.random.default_rng(seed))
    seconds = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "peak_extra_mb": peak / 2**20,
        "seconds": seconds,
        "first_picks": [int(i) for i in sel.indices[:5]],
    }


def main() -> None:
    """Measure and write the JSON (``--label`` names the code version)."""
    import torch

    import eada
    from eada.runs import environment_info

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--n", type=int, default=50_000)
    p.add_argument("--c", type=int, default=345)
    p.add_argument("--d", type=int, default=256)
    p.add_argument("--budget", type=int, default=500)
    p.add_argument("--label", default="current")
    p.add_argument("--out", default=None, help="JSON file to add this measurement to")
    a = p.parse_args()
    res = {
        "label": a.label,
        "n": a.n,
        "c": a.c,
        "d": a.d,
        "budget": a.budget,
        "torch_threads": torch.get_num_threads(),
        **measure(a.n, a.c, a.d, a.budget),
        "code": str(Path(eada.__file__).parent),  # which tree ran (see --label)
        "git_of_cwd": environment_info()["git"],
    }
    print(json.dumps(res))
    if a.out:
        path = Path(a.out)
        rows = json.loads(path.read_text()) if path.exists() else []
        path.write_text(json.dumps([*rows, res], indent=1) + "\n")


if __name__ == "__main__":
    main()
