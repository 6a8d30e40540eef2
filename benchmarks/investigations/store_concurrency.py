"""Concurrent commands on one project store, unforced: real ``eada`` processes started together
(the tests force the overlaps with a barrier; this counts what happens without one).

Scenarios, each ``--trials`` times on a fresh toy project:

* ``imports``: two ``eada label import`` of conflicting files (10 samples) started at once;
* ``imports_locked``: the same while a third connection holds the write lock for ``--hold``
  seconds, so both are queued at ``BEGIN IMMEDIATE`` when it is released;
* ``queries``: two ``eada query --budget 5`` started at once.

Counted: trials with two labels in force for a sample, with two rounds, with a checkpoint file
no row records, and the exit codes / outcomes.

    OMP_NUM_THREADS=1 python benchmarks/investigations/store_concurrency.py --trials 10 \\
        --out benchmarks/results/store_concurrency.json
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from eada.hparams import preset_config
from eada.store import init_project

TOY = ["data.n_per_class=60", "train.epochs=3", "active.rounds_at=[1,2]"]


def _start(args: list[str]) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "eada.cli", *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(procs: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    out = []
    for p in procs:
        so, se = p.communicate(timeout=600)
        out.append({"rc": p.returncode, "stdout": so.strip()[-300:], "stderr": se.strip()[-300:]})
    return out


def _state(folder: Path) -> dict[str, Any]:
    with sqlite3.connect(folder / "eada.sqlite") as c:
        in_force = c.execute(
            "SELECT MAX(n) FROM (SELECT COUNT(*) AS n FROM labels l WHERE NOT EXISTS "
            "(SELECT 1 FROM labels m WHERE m.supersedes = l.id) GROUP BY l.sample_id)"
        ).fetchone()[0]
        rounds = c.execute("SELECT COUNT(*) FROM rounds").fetchone()[0]
        recorded = {r[0] for r in c.execute("SELECT path FROM checkpoints")}
        imports = c.execute("SELECT COUNT(*) FROM imports").fetchone()[0]
    files = {f"checkpoints/{f.name}" for f in (folder / "checkpoints").iterdir()}
    return {
        "max_labels_in_force": in_force or 0,
        "rounds": rounds,
        "imports": imports,
        "unrecorded_checkpoints": len(files - recorded),
    }


def _project(tmp: Path, query: bool) -> tuple[Path, list[Path]]:
    proj = init_project(tmp / "p", preset_config("toy", "eada", 0, TOY))
    if not query:
        proj.close()
        return tmp / "p", []
    out = proj.query(budget=10)
    with open(out["files"]["csv"], newline="") as fh:
        rows = list(csv.DictReader(fh))
    files = []
    for k in range(2):  # conflicting: every sample gets class k in file k
        f = tmp / f"labels{k}.csv"
        with open(f, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows([{**r, "label": proj.classes[k]} for r in rows])
        files.append(f)
    proj.close()
    return tmp / "p", files


def trial(scenario: str, hold: float) -> dict[str, Any]:
    """One trial of ``scenario``; returns the processes' outcomes and the store's state."""
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        folder, files = _project(tmp, query=scenario != "queries")
        store = ["--store", str(folder)]
        blocker = None
        if scenario == "imports_locked":
            blocker = sqlite3.connect(folder / "eada.sqlite", isolation_level=None)
            blocker.execute("BEGIN IMMEDIATE")
        if scenario == "queries":
            procs = [_start(["query", *store, "--budget", "5"]) for _ in range(2)]
        else:
            procs = [_start(["label", "import", str(f), *store]) for f in files]
        if blocker is not None:
            time.sleep(hold)
            blocker.execute("ROLLBACK")
            blocker.close()
        runs = _finish(procs)
        return {"runs": runs, **_state(folder)}


def main() -> None:
    """Run the scenarios and write the counts as JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--hold", type=float, default=6.0, help="seconds the lock is held")
    ap.add_argument("--out", default="benchmarks/results/store_concurrency.json")
    args = ap.parse_args()
    t0 = time.time()
    results: dict[str, Any] = {}
    for scenario in ("imports", "imports_locked", "queries"):
        trials = [trial(scenario, args.hold) for _ in range(args.trials)]
        rcs = sorted(tuple(sorted(r["rc"] for r in t["runs"])) for t in trials)
        results[scenario] = {
            "trials": len(trials),
            "two_labels_in_force": sum(t["max_labels_in_force"] > 1 for t in trials),
            "more_than_one_round": sum(t["rounds"] > 1 for t in trials),
            "unrecorded_checkpoints": sum(t["unrecorded_checkpoints"] for t in trials),
            "exit_codes": [list(r) for r in rcs],
            "outcomes": [[r["stdout"] or r["stderr"] for r in t["runs"]] for t in trials[:3]],
            "details": trials,
        }
        summary = {k: v for k, v in results[scenario].items() if k not in ("details", "outcomes")}
        print(scenario, json.dumps(summary), flush=True)
    doc = {
        "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "hold_seconds": args.hold,
        "seconds": round(time.time() - t0, 1),
        "scenarios": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
