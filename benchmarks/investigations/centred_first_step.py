"""EADA's first step on the centred free energy (``eada_centered``) beside the default ``eada``.

In a linear head the NLL gives the energies' common mode ``mean_y E(x, y)`` no gradient, so the
free energy ``F`` that EADA's first step ranks carries a term the initialisation fixed; the
centred ``G = F - mean_y E`` (:func:`eada.energy.centered_free_energy`) drops it. This script
runs both selections, everything else equal (EADA as it ships: the task's config, the default
alignment and gate), seed by seed, on:

* the toy (``toy-calibrated``, the preset's own protocol), seeds 0-9;
* the 12 two-class SURF tasks of ``benchmarks/investigations/two_class.py`` (each pair's most
  confused class pair, read from ``benchmarks/results/two_class/summary.json``);
* the 12 ten-class Office-Caltech10 SURF tasks (``configs/office_caltech10_surf.yaml``);
* with ``--digits``, MNIST->USPS (``digits/mnist-usps``).

The rule for a default change, stated before the runs (the alignment gate's rule): the centred
step becomes the default only if, on every task, its mean last-epoch target accuracy is at most
:data:`MARGIN` points below the default's.

    python benchmarks/investigations/centred_first_step.py [--seeds 0-2] [--digits]
        [--out benchmarks/results/centred_first_step]
    python benchmarks/investigations/centred_first_step.py --table-only

One ``runs.jsonl`` a task and variant under ``--out`` (resumable), the summary in
``OUT/summary.json``; one torch thread.
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

from eada.config import ExperimentConfig, load_config
from eada.experiment import run_seeds
from eada.hparams import METHODS, preset_config
from eada.runs import environment_info, jsonl_exists, parse_seeds, read_jsonl, write_json

CONFIG = "configs/office_caltech10_surf.yaml"
DOMAINS = {"C": "Caltech10", "A": "amazon", "W": "webcam", "D": "dslr"}
TWO_CLASS = Path("benchmarks/results/two_class/summary.json")
VARIANTS = ("eada", "eada_centered")
#: The centred step may become the default only if it is never more than this many points of
#: mean target accuracy below the default on any task.
MARGIN = 1.0


def _sets(method: str) -> list[str]:
    return [f"{a}.{k}={v}" for a, d in METHODS[method].items() for k, v in d.items()]


def tasks(data: Path, digits: bool) -> dict[str, dict[str, Any]]:
    """Every task: its folder and ``(variant, seed) -> config``."""
    out: dict[str, dict[str, Any]] = {}

    def toy(method: str, seed: int) -> ExperimentConfig:
        return preset_config("toy-calibrated", method, seed)

    out["toy"] = {"folder": "toy", "group": "toy", "make": toy, "all_seeds": True}
    pairs = json.loads(TWO_CLASS.read_text())["tasks"]
    for group in ("SURF two-class", "SURF 10-class"):  # every two-class task first
        for s, sname in DOMAINS.items():
            for t, tname in DOMAINS.items():
                if s == t:
                    continue
                src, tgt = data / f"{sname}_SURF_L10.mat", data / f"{tname}_SURF_L10.mat"
                keep = pairs[f"SURF {s}->{t}"]["keep_classes"]
                two = group == "SURF two-class"
                extra = [f"data.keep_classes=[{keep[0]}, {keep[1]}]"] if two else []
                folder = f"surf2/{s}-{t}" if two else f"surf10/{s}-{t}"

                def make(
                    method: str, seed: int, src: Path = src, tgt: Path = tgt, extra: Any = extra
                ) -> ExperimentConfig:
                    sets = [*_sets(method), f"data.source={src}", f"data.target={tgt}", *extra]
                    return load_config(CONFIG, [*sets, f"seed={seed}"])

                name = f"{group} {s}->{t}"
                out[name] = {"folder": folder, "group": group, "make": make, "all_seeds": False}
    if digits:

        def mnist_usps(method: str, seed: int) -> ExperimentConfig:
            return preset_config("digits/mnist-usps", method, seed)

        out["MNIST->USPS"] = {
            "folder": "digits/mnist-usps",
            "group": "digits",
            "make": mnist_usps,
            "all_seeds": False,
        }
    return out


def _finished(folder: Path) -> bool:
    """Both variants ran, on the same seeds (at least two): a task an interrupted run left
    half done stays out of the summary."""
    logs = [folder / v / "runs.jsonl" for v in VARIANTS]
    if not all(jsonl_exists(f) for f in logs):
        return False
    seeds = [sorted(r["seed"] for r in read_jsonl(f)) for f in logs]
    return len(seeds[0]) >= 2 and seeds[0] == seeds[1]


def last_acc(rec: dict[str, Any]) -> float:
    """A run record's last-epoch target accuracy (%)."""
    return float(rec["results"]["final"]["last_epoch"]["target"]["accuracy"])


def summarize(out: Path, names: list[str]) -> dict[str, Any]:
    """Per task the per-seed accuracies of both variants and the paired difference."""
    res: dict[str, Any] = {}
    for name in names:
        folder = out / name
        row: dict[str, Any] = {}
        for v in VARIANTS:
            recs = sorted(read_jsonl(folder / v / "runs.jsonl"), key=lambda r: r["seed"])
            row[v] = {"seeds": [r["seed"] for r in recs], "accuracy": [last_acc(r) for r in recs]}
        a, b = row["eada_centered"]["accuracy"], row["eada"]["accuracy"]
        n = min(len(a), len(b))
        d = np.asarray(a[:n]) - np.asarray(b[:n])
        row["diff"] = {
            "mean": float(d.mean()) if n else None,
            "per_seed": d.tolist(),
            "centred_better": int((d > 0.05).sum()),
            "default_better": int((d < -0.05).sum()),
            "same_accuracy_seeds": int((np.abs(d) < 1e-9).sum()),
        }
        res[name] = row
    return res


def markdown(summary: dict[str, Any]) -> str:
    """The summary as a Markdown table, then the rule's verdict."""
    lines = [
        "| task | EADA (default) | EADA (centred F) | centred - default | seeds better "
        "(centred / default / same) |",
        "|---|---|---|---|---|",
    ]
    worst = None
    for name, info in summary["tasks"].items():
        row = summary["results"][info["folder"]]
        a, b = row["eada"]["accuracy"], row["eada_centered"]["accuracy"]
        d = row["diff"]
        worst = d["mean"] if worst is None else min(worst, d["mean"])
        lines.append(
            f"| {name} | {np.mean(a):.1f} ± {np.std(a, ddof=1):.1f} | "
            f"{np.mean(b):.1f} ± {np.std(b, ddof=1):.1f} | {d['mean']:+.1f} | "
            f"{d['centred_better']} / {d['default_better']} / {d['same_accuracy_seeds']} |"
        )
    verdict = "meets" if worst is not None and worst >= -MARGIN else "does not meet"
    lines.append("")
    lines.append(
        f"Worst task: {worst:+.1f} points; the centred step {verdict} the rule (never more than "
        f"{MARGIN:g} point below the default on any task)."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run (or resume) every task and variant, then write ``OUT/summary.json``."""
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    p.add_argument("--seeds", default="0-2")
    p.add_argument("--toy-seeds", default="0-9")
    p.add_argument("--data", default="../shared/data/office_caltech10_surf")
    p.add_argument("--out", default="benchmarks/results/centred_first_step")
    p.add_argument("--digits", action="store_true", help="also MNIST->USPS")
    p.add_argument("--only", default="", help="comma-separated groups, e.g. toy,SURF two-class")
    p.add_argument("--table-only", action="store_true")
    p.add_argument(
        "--summary-only", action="store_true", help="rewrite OUT/summary.json from the logs"
    )
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.table_only:
        print(markdown(json.loads((out / "summary.json").read_text())))
        return 0
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    import torch

    from eada.threads import set_threads

    set_threads(1)
    torch.set_num_threads(1)
    t0, load0 = time.perf_counter(), os.getloadavg()
    all_tasks = tasks(Path(args.data), args.digits)
    only = {g.strip() for g in args.only.split(",") if g.strip()}
    chosen = {n: t for n, t in all_tasks.items() if not only or t["group"] in only}
    if args.summary_only:
        chosen = {}
    for name, info in chosen.items():
        seeds = parse_seeds(args.toy_seeds if info["all_seeds"] else args.seeds)
        for v in VARIANTS:

            def make(seed: int, v: str = v, info: dict[str, Any] = info) -> ExperimentConfig:
                return info["make"](v, seed)  # type: ignore[no-any-return]

            run_seeds(make, seeds, out / info["folder"] / v)
        print(f"[{time.perf_counter() - t0:6.0f} s] {name} done", file=sys.stderr, flush=True)
    done = {n: t for n, t in all_tasks.items() if _finished(out / t["folder"])}
    summary = {
        "seeds": args.seeds,
        "toy_seeds": args.toy_seeds,
        "margin": MARGIN,
        "tasks": {n: {"folder": t["folder"], "group": t["group"]} for n, t in done.items()},
        "results": summarize(out, [t["folder"] for t in done.values()]),
        "seconds": time.perf_counter() - t0,
        "load_average": {"start": load0, "end": os.getloadavg()},
        "meta": environment_info(),
    }
    write_json(out / "summary.json", summary)
    print(markdown(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
