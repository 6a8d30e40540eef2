"""Which kNN search LAS uses on large pools: faiss HNSW against IVF-Flat, by recall and time.

On the synthetic pool of ``benchmarks/query_time.py`` (``C = 12`` classes, ``D = 256``-d
embeddings around class centres, the same seed), every sample's ``K = 10`` cosine neighbours
(itself excluded) are searched with faiss indexes on the L2-normalised embeddings (inner
product) at one thread, and compared with the exact search (:func:`eada.strategies.lada.
cosine_neighbours`'s result) on ``--queries`` sampled rows (the exact search of every row is
what LAS's ``knn: exact`` costs; its time is in ``benchmarks/query_time.py``'s ``las_exact``).
For each index: build time (train + add), search time for all ``N`` rows (CPU seconds,
``time.process_time``; wall in the JSON), and recall@10 = the share of the exact neighbours found.

    python benchmarks/investigations/knn_choice.py [--sizes 10000,55388,110776] [--queries 2000]
           [--pool synthetic|mnist] [--out benchmarks/results/knn_choice.json]

``--pool mnist``: real images instead, the 10,000 MNIST test digits (784 raw pixels each, from
``../shared/data/digits/mnist``; ``--sizes`` at most 10,000), a pool of low intrinsic dimension
where the synthetic one (isotropic noise in 256 dimensions around 12 centres) is the hard case
for any approximate index: there every sample's neighbours are nearly as far as the rest.

The Markdown table goes to stdout (pasted into BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

K = 10
# (name, kind, settings): HNSW (M links, efConstruction, efSearch) or IVF-Flat
# (nlist = f sqrt N, nprobe)
CANDIDATES: list[tuple[str, str, tuple[int, ...]]] = [
    ("hnsw M=16 efC=40 efS=32", "hnsw", (16, 40, 32)),
    ("hnsw M=32 efC=40 efS=64 (used)", "hnsw", (32, 40, 64)),
    ("ivf-flat nlist=4sqrtN nprobe=32", "ivf", (4, 32)),
]


def build(kind: str, settings: tuple[int, ...], z: np.ndarray) -> Any:
    """A faiss index of the normalised rows ``z`` (one thread, set by the caller)."""
    import faiss

    d = z.shape[1]
    if kind == "hnsw":
        m, efc, efs = settings
        index = faiss.IndexHNSWFlat(d, m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = efc
        index.add(z)
        index.hnsw.efSearch = efs
        return index
    factor, nprobe = settings
    nlist = int(factor * math.sqrt(len(z)))
    ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
    ivf.cp.max_points_per_centroid = 10**6  # train on every row (no subsampling warning)
    ivf.train(z)
    ivf.add(z)
    ivf.nprobe = nprobe
    return ivf


def embeddings(pool: str, n: int) -> np.ndarray:
    """``n`` rows of the synthetic pool or of MNIST's test digits."""
    if pool == "mnist":
        from eada.data.digits import read_mnist_idx

        folder = Path("../shared/data/digits/mnist")  # run from the repository root
        x, _ = read_mnist_idx(
            folder / "t10k-images-idx3-ubyte.gz", folder / "t10k-labels-idx1-ubyte.gz"
        )
        if n > len(x):
            raise ValueError(f"--pool mnist has {len(x)} samples, not {n}")
        return x[:n].reshape(n, -1).astype(np.float32)
    from query_time import make_pool  # type: ignore[import-not-found]

    return np.asarray(make_pool(n).embeddings, np.float32)


def measure(n: int, queries: int, pool: str = "synthetic") -> list[dict[str, Any]]:
    """Every candidate at pool size ``n``."""
    import faiss
    import torch

    faiss.omp_set_num_threads(1)
    torch.set_num_threads(1)
    z = embeddings(pool, n)
    zn = np.ascontiguousarray(z / np.linalg.norm(z, axis=1, keepdims=True))
    rows = np.sort(np.random.default_rng(1).choice(n, size=min(queries, n), replace=False))
    sims = torch.from_numpy(zn[rows]) @ torch.from_numpy(zn).T
    exact = torch.topk(sims, K + 1, dim=1).indices[:, 1:].numpy()
    out = []
    for name, kind, settings in CANDIDATES:
        c0, w0 = time.process_time(), time.perf_counter()
        index = build(kind, settings, zn)
        c1, w1 = time.process_time(), time.perf_counter()
        _, found = index.search(zn, K + 1)
        c2, w2 = time.process_time(), time.perf_counter()
        got = found[rows]
        recall = float(
            np.mean(
                [
                    len(set(e.tolist()) & (set(g.tolist()) - {r})) / K
                    for e, g, r in zip(exact, got, rows.tolist(), strict=True)
                ]
            )
        )
        rec = {
            "pool": pool,
            "n": n,
            "index": name,
            "build_cpu_s": c1 - c0,
            "search_cpu_s": c2 - c1,
            "total_cpu_s": c2 - c0,
            "build_wall_s": w1 - w0,
            "search_wall_s": w2 - w1,
            "recall_at_10": recall,
            "queries": len(rows),
            "load_after": os.getloadavg()[0],
        }
        print(json.dumps(rec), flush=True)
        out.append(rec)
    return out


def main() -> None:
    """Measure, write the JSON, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,55388,110776")
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--pool", choices=("synthetic", "mnist"), default="synthetic")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/knn_choice.json"))
    args = ap.parse_args()
    results = []
    for n in (int(s) for s in args.sizes.split(",")):
        results += measure(n, args.queries, args.pool)
    args.out.write_text(json.dumps({"k": K, "threads": 1, "results": results}, indent=1) + "\n")
    sizes = sorted({r["n"] for r in results})
    print("\n| index | " + " | ".join(f"N={n:,} CPU s (recall@10)" for n in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for name, _, _ in CANDIDATES:
        cells = []
        for n in sizes:
            r = next(r for r in results if r["n"] == n and r["index"] == name)
            cells.append(f"{r['total_cpu_s']:.2f} ({r['recall_at_10']:.4f})")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
