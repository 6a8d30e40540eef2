"""Wall times of `eada demo` and two small grids on a BUSY machine, before/after a code change.

Runs each command as a user would type it (the `eada` CLI, default thread settings: NO
OMP_NUM_THREADS / MKL_NUM_THREADS / OPENBLAS_NUM_THREADS in its environment) while a busy
neighbour (a pure-Python loop, one process) occupies a core. Each code version is a source tree
given with ``--code LABEL=SRC_DIR`` (its ``src`` folder goes first on ``PYTHONPATH``); the
versions are measured side by side, alternating, ``--repeats`` times each, and the JSON holds
every wall time, the load average before each command and the commands themselves.

Cases (small on purpose; the names are the table's):

* ``demo``: ``eada demo --out TMP`` (toy, 3 seeds x 4 methods), and ``demo --seeds 1``;
* ``office31-frozen``: ``eada bench configs/office31_amazon_subset_webcam_lite0_frozen.yaml
  --methods random,eada --seeds 0 --set train.epochs=20`` on cached EfficientNet-Lite0 features
  (``--cache-dir``; extract them first, e.g. with ``eada data features``);
* ``digits``: ``eada bench digits/mnist-usps --methods random,eada --seeds 0 --set
  train.epochs=2 --set active.rounds_at=[1]``;
* ``toy-grid``: ``eada bench toy --methods random,entropy,margin,eada --seeds 0-3`` (16 small
  runs: the throughput of ``--jobs 2`` against one process);
* with ``--jobs`` also the grids with ``--jobs 2`` for versions that have it, and
  ``toy-grid-48`` (the toy grid on seeds 0-11, 48 runs) and ``toy-grid-144`` (seeds 0-35, 144
  runs) in one process and with ``--jobs 2``;
* ``--no-neighbour``: no busy neighbour (the throughput of ``--jobs`` on an idle machine).

    python benchmarks/investigations/busy_machine.py --code before=/tmp/old_tree --code after=. \\
        --cache-dir /tmp/cache --out benchmarks/results/busy_machine.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

OFFICE = "configs/office31_amazon_subset_webcam_lite0_frozen.yaml"


def cases(cache_dir: str, jobs: bool) -> dict[str, list[str]]:
    """``{name: eada arguments}`` (``{out}`` is replaced by a fresh folder)."""
    office = ["bench", OFFICE, "--methods", "random,eada", "--seeds", "0"]
    office += ["--set", "train.epochs=20", "--set", f"data.cache_dir={cache_dir}"]
    digits = ["bench", "digits/mnist-usps", "--methods", "random,eada", "--seeds", "0"]
    digits += ["--set", "train.epochs=2", "--set", "active.rounds_at=[1]"]
    toy = ["bench", "toy", "--methods", "random,entropy,margin,eada", "--seeds", "0-3"]
    toy48 = ["bench", "toy", "--methods", "random,entropy,margin,eada", "--seeds", "0-11"]
    toy144 = ["bench", "toy", "--methods", "random,entropy,margin,eada", "--seeds", "0-35"]
    out = {
        "demo": ["demo", "--out", "{out}"],
        "demo --seeds 1": ["demo", "--seeds", "1", "--out", "{out}"],
        "toy-grid": [*toy, "--out", "{out}"],
        "office31-frozen": [*office, "--out", "{out}"],
        "digits": [*digits, "--out", "{out}"],
    }
    if jobs:
        out["toy-grid --jobs 2"] = [*toy, "--out", "{out}", "--jobs", "2"]
        out["toy-grid-48"] = [*toy48, "--out", "{out}"]
        out["toy-grid-48 --jobs 2"] = [*toy48, "--out", "{out}", "--jobs", "2"]
        out["toy-grid-144"] = [*toy144, "--out", "{out}"]
        out["toy-grid-144 --jobs 2"] = [*toy144, "--out", "{out}", "--jobs", "2"]
        out["office31-frozen --jobs 2"] = [*office, "--out", "{out}", "--jobs", "2"]
        out["digits --jobs 2"] = [*digits, "--out", "{out}", "--jobs", "2"]
    return out


def run_case(src: Path, args: list[str]) -> dict[str, Any]:
    """Wall time of ``python -m eada.cli ARGS`` with ``src`` first on the path."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
    }
    env["PYTHONPATH"] = str(src)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "eada.cli", *[a.replace("{out}", tmp + "/o") for a in args]]
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    return {"seconds": wall, "loadavg_1min_before": load}


def main() -> None:
    """Measure every case for every code version, alternating, and write the JSON."""
    from eada.runs import environment_info

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--code", action="append", required=True, metavar="LABEL=TREE")
    p.add_argument("--cache-dir", required=True, help="feature cache with the Office-31 features")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--jobs", action="store_true", help="also the grids with --jobs 2 (after)")
    p.add_argument("--only", default=None, help="case names, separated by ';'")
    p.add_argument(
        "--no-neighbour", action="store_true", help="no busy neighbour (an idle machine)"
    )
    p.add_argument("--out", required=True)
    a = p.parse_args()
    trees = {}
    for item in a.code:
        label, _, tree = item.partition("=")
        trees[label] = (Path(tree).resolve() / "src").resolve()
    busy = ["-c", "while True: pass"]
    neighbour = subprocess.Popen([sys.executable, *(["-c", "pass"] if a.no_neighbour else busy)])
    results: list[dict[str, Any]] = []

    def save() -> None:  # after every command: a run cut short keeps what it measured
        out = {
            "what": "wall time (s) of each command, default thread settings, "
            + (
                "no busy neighbour"
                if a.no_neighbour
                else "a busy neighbour (one pure-Python loop process) running"
            ),
            "cases": {k: " ".join(["eada", *v]) for k, v in cases(a.cache_dir, a.jobs).items()},
            "code": {k: str(v) for k, v in trees.items()},
            "results": results,
            "meta": environment_info(),
        }
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")

    try:
        time.sleep(2)
        for name, args in cases(a.cache_dir, a.jobs).items():
            if a.only and name not in a.only.split(";"):
                continue
            for rep in range(a.repeats):
                for label, src in trees.items():
                    if "--jobs" in args and not (src / "eada" / "threads.py").exists():
                        continue  # that version has no --jobs
                    r = run_case(src, args)
                    row = {"case": name, "code": label, "repeat": rep, **r}
                    print(json.dumps(row), flush=True)
                    results.append(row)
                    save()
    finally:
        neighbour.kill()
        neighbour.wait()


if __name__ == "__main__":
    main()
