"""Streaming EADA selection over a very large pool (default N = 10,000,000, C = 345).

Energies are produced chunk by chunk (a seeded stand-in for a model's scoring pass); each chunk is
reduced to its free energy and MvSM (two float32 a sample) and dropped, so the N x C outputs
(13.8 GB in float32 at the default size) never exist. Then EADA's two-step selection runs on the
two score vectors. Reports the wall time and the process CPU time (``time.process_time``: what
the phase itself cost, whatever else the machine runs) of each phase, and the peak resident memory
(``ru_maxrss``) of the WHOLE process, read at its end (after the exactness check, whose
in-memory path holds the prefix's energies once), beside the peak reached by scoring and
selection alone.

    python benchmarks/streaming_selection.py [--n 10000000] [--classes 345] [--chunk 65536]
        [--budget-share 0.01] [--out benchmarks/results/streaming_selection.json]

``--check N`` additionally verifies on an N-sample prefix that the streaming path selects
exactly what the in-memory path (all energies held, ``PoolOutputs(energies=...)``) selects.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from eada.distributed import stream_scores
from eada.runs import environment_info, write_json
from eada.strategies import PoolOutputs, get_strategy, resolve_budget


def energy_chunks(n: int, classes: int, chunk: int, seed: int) -> Iterator[torch.Tensor]:
    """Seeded ``(b, C)`` energy chunks whose rows depend only on (seed, chunk number)."""
    for k, start in enumerate(range(0, n, chunk)):
        g = torch.Generator().manual_seed(seed * 1_000_003 + k)
        b = min(chunk, n - start)
        # logits with a few confident rows and many uncertain ones, like a real scoring pass
        yield -(torch.randn(b, classes, generator=g) * (1 + 3 * torch.rand(b, 1, generator=g)))


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write its JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=10_000_000)
    p.add_argument("--classes", type=int, default=345)
    p.add_argument("--chunk", type=int, default=65_536)
    p.add_argument("--budget-share", type=float, default=0.01)
    p.add_argument("--alpha1", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check", type=int, default=200_000, help="prefix size for the exactness check")
    p.add_argument("--out", default="benchmarks/results/streaming_selection.json")
    args = p.parse_args(argv)

    meta = environment_info()  # the tree as it was when the run started
    load_before = os.getloadavg()
    eada = get_strategy("eada").fn
    budget = resolve_budget(args.budget_share, args.n)
    rss0 = peak_rss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    f, u = stream_scores(energy_chunks(args.n, args.classes, args.chunk, args.seed), n=args.n)
    t1, c1 = time.perf_counter(), time.process_time()
    sel = eada(
        PoolOutputs(free_energy=f, mvsm=u, n_target=args.n), budget, None, alpha1=args.alpha1
    )
    t2, c2 = time.perf_counter(), time.process_time()
    rss1 = peak_rss_mb()

    check = None
    if args.check:
        m = min(args.check, args.n)
        full = torch.cat(list(energy_chunks(m, args.classes, args.chunk, args.seed)))
        chunks = full.split(args.chunk)  # views: the prefix is held once
        b = resolve_budget(args.budget_share, m)
        mem = eada(PoolOutputs(energies=full.numpy(), n_target=m), b, None, alpha1=args.alpha1)
        fs, us = stream_scores(iter(chunks), n=m)
        st = eada(PoolOutputs(free_energy=fs, mvsm=us, n_target=m), b, None, alpha1=args.alpha1)
        check = {"n": m, "budget": b, "identical": bool(np.array_equal(mem.indices, st.indices))}
        if not check["identical"]:
            print("streaming and in-memory selections differ", file=sys.stderr)

    result = {
        "n": args.n,
        "classes": args.classes,
        "chunk": args.chunk,
        "budget": budget,
        "alpha1": args.alpha1,
        "scoring_seconds": t1 - t0,
        "selection_seconds": t2 - t1,
        "scoring_cpu_seconds": c1 - c0,
        "selection_cpu_seconds": c2 - c1,
        "peak_rss_mib": peak_rss_mb(),  # the whole process, check included
        "peak_rss_mib_scoring_and_selection": rss1,
        "rss_before_mib": rss0,
        "dense_outputs_would_need_mib": args.n * args.classes * 4 / 2**20,
        "selected": len(sel.indices),
        "stage1": sel.info["n_stage1"],
        "exactness_check": check,
        "loadavg_before": load_before,
        "loadavg": os.getloadavg(),
        "torch_threads": torch.get_num_threads(),
        "meta": meta,
    }
    write_json(Path(args.out), result)
    print(
        f"N={args.n:,} C={args.classes}: scoring {t1 - t0:.1f} s ({c1 - c0:.1f} s CPU), "
        f"selection {t2 - t1:.2f} s ({c2 - c1:.2f} s CPU), "
        f"peak RSS {result['peak_rss_mib']:.0f} MiB whole process, {rss1:.0f} MiB before the "
        f"check (dense outputs would be "
        f"{result['dense_outputs_would_need_mib']:.0f} MiB); exact: {check}"
    )
    return 0 if check is None or check["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
