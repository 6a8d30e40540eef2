"""Office-Caltech10 SURF: the 12 domain pairs through the feature-matrix input.

Source-only, Random and EADA on fixed 800-d SURF bag-of-words features (rows L1-normalised,
each domain z-scored: the JDA code's preprocessing), an MLP energy network (one hidden layer of
256), the Office-31 protocol otherwise (``configs/office_caltech10_surf.yaml``: Adadelta lr 0.1,
batch 32, gamma 0.01, 50 epochs, rounds of 1% at the end of epochs 10-18). Also a 1-nearest-
neighbour classifier on the same features (scikit-learn), to compare with the published 1-NN
reference points (JDA, Long et al. 2013: C->A 23.7, A->W 29.8, W->D 59.2), which checks that
the data, labels and preprocessing are read correctly. EADA here runs the paper's L_fea
(``train.alignment: paper``), as the committed runs did; the default variant is compared in
BENCHMARKS.md ("Alignment variants").

Usage (repository root, ../shared/data beside it):

    python benchmarks/caltech_surf.py [--seeds 0-2] [--out benchmarks/results/caltech_surf]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from eada.config import load_config
from eada.data.features import normalize_features, read_feature_file
from eada.experiment import run_seeds
from eada.hparams import METHOD_LABELS, METHODS
from eada.reports.tables import markdown_table, mean_std
from eada.runs import environment_info, parse_seeds, write_json

CONFIG = "configs/office_caltech10_surf.yaml"
DOMAINS = {"C": "Caltech10", "A": "amazon", "W": "webcam", "D": "dslr"}
PUBLISHED_1NN = {"C->A": 23.7, "A->W": 29.8, "W->D": 59.2}


def one_nn(src: Path, tgt: Path) -> float:
    """Target accuracy (%) of 1-NN (Euclidean) on the features preprocessed as in the JDA code
    (rows L1-normalised, each domain z-scored)."""
    from sklearn.neighbors import KNeighborsClassifier

    xs, ys = read_feature_file(src)
    xt, yt = read_feature_file(tgt)
    xs, xt = normalize_features(xs, "l1_zscore"), normalize_features(xt, "l1_zscore")
    pred = KNeighborsClassifier(n_neighbors=1).fit(xs, ys).predict(xt)
    return float(100 * np.mean(pred == yt))


def markdown(summary: dict[str, Any]) -> str:
    """One row a task: 1-NN, published 1-NN, and each method's last-epoch accuracy."""
    methods = summary["methods"]
    head = ["task", "1-NN (ours)", "1-NN (JDA paper)"] + [METHOD_LABELS[m] for m in methods]
    body = []
    means: dict[str, list[float]] = {m: [] for m in methods}
    for task, res in summary["tasks"].items():
        cells = [task, f"{res['1nn']:.1f}", str(PUBLISHED_1NN.get(task, "–"))]
        for m in methods:
            st = res[m]["final"]["last_epoch/target/accuracy"]
            means[m].append(st["mean"])
            cells.append(mean_std(st))
        body.append(cells)
    avg_nn = np.mean([r["1nn"] for r in summary["tasks"].values()])
    body.append(["average", f"{avg_nn:.1f}", "–", *(f"{np.mean(v):.1f}" for v in means.values())])
    return markdown_table(head, body)


def main(argv: list[str] | None = None) -> int:
    """Run the 12 tasks x methods x seeds; write ``OUT.json``; print the Markdown table."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", default="0-2")
    p.add_argument("--methods", default="source_only,random,eada")
    p.add_argument("--data", default="../shared/data/office_caltech10_surf")
    p.add_argument("--out", default="benchmarks/results/caltech_surf")
    p.add_argument("--table-only", action="store_true")
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.table_only:
        print(markdown(json.loads(out.with_suffix(".json").read_text())))
        return 0
    seeds = parse_seeds(args.seeds)
    methods = args.methods.split(",")
    summary: dict[str, Any] = {"benchmark": "office_caltech10_surf", "seeds": seeds}
    summary |= {"methods": methods, "tasks": {}, "meta": environment_info()}
    t_start, c_start = time.perf_counter(), time.process_time()
    data = Path(args.data)
    for s, sname in DOMAINS.items():
        for t, tname in DOMAINS.items():
            if s == t:
                continue
            task = f"{s}->{t}"
            src, tgt = data / f"{sname}_SURF_L10.mat", data / f"{tname}_SURF_L10.mat"
            res: dict[str, Any] = {"1nn": one_nn(src, tgt)}
            for m in methods:
                sets = [f"{a}.{k}={v}" for a, d in METHODS[m].items() for k, v in d.items()]
                sets += [f"data.source={src}", f"data.target={tgt}", f"name=surf/{task}"]
                # the committed runs predate train.alignment: they ran the paper's L_fea
                sets.append("train.alignment=paper")

                def make(seed: int, sets: list[str] = sets) -> Any:
                    return load_config(CONFIG, [*sets, f"seed={seed}"])

                res[m] = run_seeds(make, seeds, out / f"{s}-{t}" / m)
            summary["tasks"][task] = res
            print(
                f"{task}: 1-NN {res['1nn']:.1f} "
                + " ".join(
                    f"{m} {res[m]['final']['last_epoch/target/accuracy']['mean']:.1f}"
                    for m in methods
                ),
                file=sys.stderr,
            )
    summary["seconds"] = time.perf_counter() - t_start
    summary["cpu_seconds"] = time.process_time() - c_start
    summary["loadavg_end"] = os.getloadavg()
    write_json(out.with_suffix(".json"), summary)
    print(markdown(summary))
    print(f"\ntotal {summary['seconds']:.0f} s wall, {summary['cpu_seconds']:.0f} s CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
