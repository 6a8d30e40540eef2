"""Query time and peak memory of every strategy on a VisDA-sized pool (paper Table 4).

Precomputed model outputs stand in for a trained network: ``C = 12`` classes, ``D = 256``-d
embeddings drawn around class centres, energies from a linear head on them (so entropy, margin,
BADGE's gradients and EADA's F/U behave as on real outputs); the training-component scores
(discriminator, committee, critic) are drawn too, and DBAL gets ``M = N`` source embeddings.
The budget is one round of the paper's protocol: 1% of the pool.

Every N runs in its own subprocess with ``--threads`` (default 1) BLAS/OpenMP/torch threads
(the same for every strategy) that builds the pool once
and measures every strategy in a forked child (its own peak RSS): the wall and CPU time
(``time.process_time``, all threads; less sensitive to a shared machine) of the strategy call
(medians of repeats for calls under 1 s), the peak RSS increase over the process's
RSS after building the pool (``resource.getrusage``, includes native allocations of BLAS and
scikit-learn), and, for calls under 5 s, the tracemalloc peak of a second call (numpy/Python
allocations). A call that runs past ``--timeout`` is recorded as such. The machine's load
average is recorded before and after each measurement (the machine may be shared).

    python benchmarks/query_time.py [--sizes 10000,55388,200000] [--timeout 600] [--threads 1]
           [--classes 12] [--out benchmarks/results/query_time.json]

EADA is measured twice: ``eada`` from the stored scores F and U (what the trainer hands it),
and ``eada_from_energies`` computing F and U from the ``(N, C)`` energies inside the timed call;
every other strategy is compared with both. Two baselines that are not strategies:
``one_read``, one pass over the energies (the row minimum), what any strategy that reads them
must pay; ``eada_whole_matrix``, EADA from energies the former way (F and U each computed on
the whole matrix at once, after an ``isfinite`` check of the whole matrix), side by side with
the blockwise single pass of :class:`eada.strategies.PoolOutputs`.

DUC (``duc``) reads the ``(N, C)`` energies (its Dirichlet ``alpha = exp(-E)``); LAS reads the
energies and the embeddings, finds each sample's 10 nearest cosine neighbours, then runs
scikit-learn's k-means on ``budget x 11`` candidates. ``las`` is its default neighbour search
(``knn: auto``: exact below 50,000 samples, faiss HNSW from there on); ``las_exact`` the exact
search (a block of rows against all rows at a time in torch, no ``N x N`` matrix, O(N^2) time)
and ``las_faiss`` faiss's HNSW index (about O(N log N)), whatever N.

The Markdown table goes to stdout (pasted into BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

D = 256
C = int(os.environ.get("EADA_QT_CLASSES", "12"))  # set by --classes for the worker
THREADS = int(os.environ.get("EADA_QT_THREADS", "1"))  # set by --threads for the worker
STRATEGIES = (
    "eada",
    "eada_from_energies",
    "one_read",
    "eada_whole_matrix",
    "random",
    "entropy",
    "margin",
    "aada",
    "tqs",
    "waal",
    "coreset",
    "badge",
    "clue",
    "dbal",
    "duc",
    "las",
    "las_exact",
    "las_faiss",
)
# LAS with its neighbour search named (``active.params.knn``); ``las`` is its default, ``auto``
LAS_SEARCH = {"las_exact": "exact", "las_faiss": "faiss"}


def make_pool(n: int, seed: int = 0) -> Any:
    """The synthetic pool of ``n`` samples (deterministic in ``seed``)."""
    import numpy as np

    from eada.strategies import PoolOutputs

    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=1.0, size=(C, D)).astype(np.float32)
    y = rng.integers(C, size=n)
    z = centres[y] + rng.normal(scale=1.5, size=(n, D)).astype(np.float32)
    w = (centres.T / np.linalg.norm(centres, axis=1)).astype(np.float32)
    energies = -(z @ w)  # lower energy for the own class
    # F = -logsumexp(-E) and U = E_min - E_second (eada.energy), in numpy: the parent of the
    # forked measurements must not start torch's OpenMP pool
    m = (-energies).max(axis=1)
    free = -(m + np.log(np.exp(-energies - m[:, None]).sum(axis=1)))
    two = np.partition(energies, 1, axis=1)[:, :2]
    return PoolOutputs(
        energies=energies,
        free_energy=free,
        mvsm=two[:, 0] - two[:, 1],
        embeddings=z,
        n_target=n,
        labeled_embeddings=np.zeros((0, D), dtype=np.float32),
        source_embeddings=(
            centres[rng.integers(C, size=n)] + rng.normal(scale=1.5, size=(n, D))
        ).astype(np.float32),
        extra={
            "domain_source_prob": rng.uniform(0.05, 0.95, size=n),
            "committee_energies": (energies[:, None, :] + rng.normal(size=(n, 3, C))).astype(
                np.float32
            ),
            "critic_score": rng.normal(size=n),
        },
    )


def _rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _measure_child(strategy: str, pool: Any, n: int, queue: Any) -> None:
    """In a forked child: time the strategy call and measure its peak memory."""
    import tracemalloc

    import numpy as np
    import torch

    from eada import energy
    from eada.strategies import PoolOutputs, get_strategy

    torch.set_num_threads(THREADS)
    budget = math.ceil(0.01 * n)
    name = "eada" if strategy == "eada_from_energies" else strategy
    name = "las" if strategy in LAS_SEARCH else name

    def make_input() -> PoolOutputs:
        if strategy in ("eada_from_energies", "eada_whole_matrix"):  # F, U inside the call
            return PoolOutputs(energies=pool.energies, n_target=n)
        return pool

    if strategy == "eada_whole_matrix":  # the former path: F, U on the whole matrix at once

        def fn(inp: PoolOutputs, budget: int, rng: Any) -> Any:
            e = torch.from_numpy(inp.energies)
            if not np.isfinite(inp.energies).all():
                raise ValueError("non-finite energies")
            f = energy.free_energy(e).numpy()
            u = energy.mvsm(e).numpy()
            scores = PoolOutputs(free_energy=f, mvsm=u, n_target=n)
            return get_strategy("eada").fn(scores, budget, rng)

    elif strategy == "one_read":  # baseline: one pass over the (N, C) energies

        def fn(inp: PoolOutputs, budget: int, rng: Any) -> Any:
            low = inp.energies.min(axis=1)
            return type("Sel", (), {"indices": np.argpartition(low, budget)[:budget]})()

    elif strategy in LAS_SEARCH:
        fn = functools.partial(get_strategy("las").fn, knn=LAS_SEARCH[strategy])
    else:
        fn = get_strategy(name).fn
    base_rss = _rss_mb()
    times, cpu = [], []
    t_start = time.perf_counter()
    while True:
        inp = make_input()
        t0, c0 = time.perf_counter(), time.process_time()
        sel = fn(inp, budget, np.random.default_rng(0))
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        if time.perf_counter() - t_start > 1.0 or len(times) >= 25:
            break
    peak_rss = _rss_mb() - base_rss
    traced = None
    if times[0] < 5.0:
        tracemalloc.start()
        fn(make_input(), budget, np.random.default_rng(0))
        traced = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    if len(np.unique(sel.indices)) != budget:
        raise RuntimeError(f"{strategy} returned duplicates")
    queue.put(
        {
            "strategy": strategy,
            "n": n,
            "budget": budget,
            "seconds": float(np.median(times)),
            "cpu_seconds": float(np.median(cpu)),
            "repeats": len(times),
            "peak_rss_increase_mb": round(peak_rss, 1),
            "tracemalloc_peak_mb": round(traced, 1) if traced is not None else None,
        }
    )


def size_worker(n: int, strategies: list[str], timeout: float) -> list[dict[str, Any]]:
    """Build the pool once, then measure each strategy in a forked child (own peak RSS,
    killed after ``timeout`` seconds). Prints one JSON line per measurement to stderr."""
    import multiprocessing as mp
    import resource

    pool = make_pool(n)
    ctx = mp.get_context("fork")
    out = []
    for s in strategies:
        queue = ctx.Queue()
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_before = ru.ru_utime + ru.ru_stime
        load_before = os.getloadavg()
        t0 = time.perf_counter()
        proc = ctx.Process(target=_measure_child, args=(s, pool, n, queue))
        proc.start()
        proc.join(timeout)
        rec: dict[str, Any]
        if proc.is_alive():
            proc.kill()
            proc.join()
            ru = resource.getrusage(resource.RUSAGE_CHILDREN)  # the killed child, reaped
            rec = {
                "strategy": s,
                "n": n,
                "timeout_s": timeout,
                "cpu_s_until_timeout": round(ru.ru_utime + ru.ru_stime - cpu_before, 2),
            }
        elif proc.exitcode != 0 or queue.empty():
            rec = {"strategy": s, "n": n, "error": f"exit code {proc.exitcode}"}
        else:
            rec = queue.get()
        rec["wall_s_child"] = round(time.perf_counter() - t0, 2)
        rec["loadavg_before"] = [round(x, 2) for x in load_before]
        rec["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
        rec["pool_mb"] = round((pool.energies.nbytes + pool.embeddings.nbytes) / 2**20, 1)
        print(json.dumps(rec), file=sys.stderr, flush=True)
        out.append(rec)
    return out


def measure_size(
    n: int, strategies: list[str], timeout: float, threads: int, classes: int
) -> list[dict[str, Any]]:
    """Run :func:`size_worker` in a fresh subprocess limited to ``threads`` threads."""
    env = {
        **os.environ,
        **{k: str(threads) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")},
        "EADA_QT_THREADS": str(threads),
        "EADA_QT_CLASSES": str(classes),
    }
    cmd = [sys.executable, __file__, "--worker", ",".join(strategies), "--n", str(n)]
    cmd += ["--timeout", str(timeout)]
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def markdown(results: dict[str, Any]) -> str:
    """Time and memory tables: strategies x pool sizes, and the speed-ups of EADA."""
    sizes = results["sizes"]
    by = {(r["strategy"], r["n"]): r for r in results["measurements"]}
    head = ["strategy", *[f"N={n:,} CPU s (wall s)" for n in sizes]]
    head += [f"N={n:,} peak MB" for n in sizes]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in results["strategies"]:
        cells = []
        for n in sizes:
            r = by.get((s, n), {})
            cells.append(
                f"{r['cpu_seconds']:.3g} ({r['seconds']:.3g})"
                if "seconds" in r
                else (
                    f"> {r['timeout_s']:.0f} wall (timeout)"
                    if "timeout_s" in r
                    else ("error" if r else "not measured")
                )
            )
        for n in sizes:
            r = by.get((s, n), {})
            if "peak_rss_increase_mb" in r:
                t = r.get("tracemalloc_peak_mb")
                cells.append(
                    f"{r['peak_rss_increase_mb']:.0f}" + (f" ({t:.0f})" if t is not None else "")
                )
            else:
                cells.append("-")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    lines.append("")
    for n in sizes:
        for base, what in (("eada", "from scores"), ("eada_from_energies", "from energies")):
            e = by.get((base, n), {})
            parts = []
            for other in ("badge", "clue", "coreset", "dbal", "duc", "las", *LAS_SEARCH):
                r = by.get((other, n), {})
                if "seconds" in e and "seconds" in r:
                    parts.append(
                        f"{other} {r['cpu_seconds'] / max(e['cpu_seconds'], 1e-6):,.0f}x CPU "
                        f"({r['seconds'] / e['seconds']:,.0f}x wall)"
                    )
                elif "seconds" in e and "timeout_s" in r:
                    parts.append(f"{other} > {r['timeout_s'] / e['seconds']:,.0f}x wall (timeout)")
            if parts:
                lines.append(
                    f"- N = {n:,}, EADA {what}: the time of " + ", ".join(parts) + " EADA's"
                )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Measure every strategy at every size (one subprocess each) and write the JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="10000,55388,200000")
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per measurement")
    p.add_argument("--threads", type=int, default=1, help="threads of every measurement")
    p.add_argument("--classes", type=int, default=12, help="C, the number of classes")
    p.add_argument("--out", default="benchmarks/results/query_time.json")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--table-only", action="store_true")
    p.add_argument(
        "--append",
        action="store_true",
        help="keep the measurements already in --out and measure only the missing ones",
    )
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(size_worker(args.n, args.worker.split(","), args.timeout)))
        return 0
    out = Path(args.out)
    if args.table_only:
        print(markdown(json.loads(out.read_text())))
        return 0
    from eada.runs import environment_info, write_json

    sizes = [int(s) for s in args.sizes.split(",")]
    strategies = [s for s in args.strategies.split(",") if s]
    results: dict[str, Any] = {
        "benchmark": "query_time",
        "setup": {
            "C": args.classes,
            "D": D,
            "threads": args.threads,
            "budget": "ceil(1% of N)",
            "M": "N",
        },
        "sizes": sizes,
        "strategies": strategies,
        "meta": environment_info(),
        "measurements": [],
    }
    if args.append and out.exists():
        old = json.loads(out.read_text())
        if old["setup"] != results["setup"]:
            raise SystemExit(f"{out} was measured with {old['setup']}; use another --out")
        results["measurements"] = old["measurements"]
        results["sizes"] = sorted(set(old["sizes"]) | set(sizes))
        results["strategies"] = list(dict.fromkeys([*old["strategies"], *strategies]))
        results["earlier_meta"] = old.get("meta")
    have = {(r["strategy"], r["n"]) for r in results["measurements"]}
    for n in sizes:
        todo = [s for s in strategies if (s, n) not in have]
        if todo:
            results["measurements"] += measure_size(
                n, todo, args.timeout, args.threads, args.classes
            )
            write_json(out, results)  # finished sizes survive an interruption
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
