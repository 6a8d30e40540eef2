"""One grid, timed side by side on three executors, and one torchrun run against one process.

The grid: Office-Caltech10 SURF pairs x methods x seeds (``configs/office_caltech10_surf.yaml``
with a few epochs), run in ONE invocation of this script, each mode into its own folder:

* ``--jobs 1``: in this process (:class:`eada.executors.InProcessExecutor`);
* ``--jobs 2``: two local worker processes (:class:`eada.executors.LocalProcessExecutor`);
* Dask: a 2-worker Dask cluster on 127.0.0.1 (:class:`eada.executors.LoopbackCluster`,
  ``dask scheduler`` + 2 ``dask worker --no-nanny`` processes; its start-up is timed apart).

Every run uses one thread. Reported: each mode's wall time and its ratio to ``--jobs 1``, the
mean time a run takes on its worker (``run_s_mean``) and Dask's against ``--jobs 2``'s
(``dask_run_s_over_jobs2``: the per-run cost of Dask, measured side by side in one
invocation; the Dask workers run without Dask's sampling profiler, as
:class:`eada.executors.LoopbackCluster` starts them), the median submit-to-start time of a
run (how long a submitted run waits before its worker starts it: the executor's own overhead,
runs never queue because at most one run a worker is in flight), whether the three grids
recorded the same accuracies run for run, and the machine's load average before and after.
Then one ``eada run`` of one pair, 1 process against a 2-process ``torchrun`` (gloo;
``train.batch_size`` 16 a process, so the global batch stays 32).

Usage (repository root, ../shared/data beside it):

    python benchmarks/grid_scaling.py [--pairs C-A,A-W,...|all]
        [--methods source_only,random,eada]
        [--seeds 0-1] [--epochs 4] [--no-torchrun] [--out benchmarks/results/grid_scaling.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from eada import bench
from eada.executors import (
    DaskExecutor,
    Executor,
    InProcessExecutor,
    LocalProcessExecutor,
    LoopbackCluster,
)
from eada.runs import environment_info, parse_seeds, write_json
from eada.threads import set_threads

DOMAINS = {"C": "Caltech10", "A": "amazon", "W": "webcam", "D": "dslr"}
ALL_PAIRS = [f"{s}-{t}" for s in DOMAINS for t in DOMAINS if s != t]


def task_files(folder: Path, data: Path, pairs: list[str], epochs: int) -> list[str]:
    """One YAML task a pair: the SURF config with ``epochs`` epochs and a round after each of
    the first ones."""
    base = Path("configs/office_caltech10_surf.yaml").read_text()
    rounds = list(range(1, epochs))[:3]
    out = []
    for pair in pairs:
        s, t = pair.split("-")
        text = base.replace("Caltech10-amazon", f"{DOMAINS[s]}-{DOMAINS[t]}")
        text = text.replace(
            "../../shared/data/office_caltech10_surf/Caltech10_SURF_L10.mat",
            str(data / f"{DOMAINS[s]}_SURF_L10.mat"),
        ).replace(
            "../../shared/data/office_caltech10_surf/amazon_SURF_L10.mat",
            str(data / f"{DOMAINS[t]}_SURF_L10.mat"),
        )
        text = text.replace("epochs: 50", f"epochs: {epochs}")
        text = text.replace("rounds_at: [10, 12, 14, 16, 18]", f"rounds_at: {rounds}")
        path = folder / f"surf_{s}{t}.yaml"
        path.write_text(text)
        out.append(str(path))
    return out


def time_grid(name: str, runs: list[bench.GridRun], out: Path, ex: Executor) -> dict[str, Any]:
    """Run the grid on ``ex`` into ``out``; wall time, failures, submit-to-start times."""
    failed: list[dict[str, Any]] = []
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    recs = bench.run_grid(runs, out, executor=ex, failed=failed)
    wall = time.perf_counter() - t0
    s2s = [r["timing"]["submit_to_start_s"] for r in recs if r["timing"]["submit_to_start_s"]]
    runs_s = [r["timing"]["run_s"] for r in recs]
    print(f"{name}: {len(recs)} runs, {len(failed)} failed, {wall:.1f} s", file=sys.stderr)
    return {
        "mode": name,
        "wall_s": round(wall, 2),
        "runs": len(recs),
        "failed": len(failed),
        "workers": sorted({r["worker"]["address"] for r in recs}),
        "run_s_sum": round(sum(runs_s), 2),
        "run_s_mean": round(statistics.mean(runs_s), 3) if runs_s else None,
        "submit_to_start_median_s": round(statistics.median(s2s), 4) if s2s else None,
        "submit_to_start_max_s": round(max(s2s), 4) if s2s else None,
        "loadavg_before": [round(x, 2) for x in load0],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "accuracy": {r["key"]: r["final"]["target/accuracy"] for r in recs},
    }


def time_torchrun(task: str, folder: Path) -> dict[str, Any]:
    """``eada run TASK --seeds 0`` in 1 process and under a 2-process gloo torchrun."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    one = [sys.executable, "-m", "eada.cli", "run", task, "--seeds", "0", "--threads", "1"]
    two = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--standalone", "-m", "eada.cli", "run", task,
        "--seeds", "0", "--threads", "1", "--set", "train.batch_size=16",
    ]  # fmt: skip
    out: dict[str, Any] = {"task": Path(task).name}
    for name, cmd in (("1 process", one), ("torchrun 2 processes (gloo)", two)):
        folder_run = folder / name.split()[0]
        t0 = time.perf_counter()
        proc = subprocess.run(
            [*cmd, "--out", str(folder_run)], env=env, capture_output=True, text=True
        )
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"{name} failed:\n{proc.stderr[-2000:]}")
        rec = json.loads((folder_run / "runs.jsonl").read_text().splitlines()[-1])
        out[name] = {
            "wall_s": round(wall, 2),
            "run_seconds": round(rec["results"]["seconds"], 2),
            "target_accuracy": rec["results"]["final"]["last_epoch"]["target"]["accuracy"],
        }
        print(f"{name}: {wall:.1f} s", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    """Time the grid on the three executors and the torchrun pair; write the JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--pairs", default="all", help="e.g. C-A,A-W (default: the 12 pairs)")
    p.add_argument("--methods", default="source_only,random,eada")
    p.add_argument("--seeds", default="0-1")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--data", default="../shared/data/office_caltech10_surf")
    p.add_argument("--out", default="benchmarks/results/grid_scaling.json")
    p.add_argument("--no-torchrun", action="store_true", help="skip the torchrun pair")
    args = p.parse_args(argv)
    set_threads(1)
    torch.set_num_threads(1)
    pairs = ALL_PAIRS if args.pairs == "all" else args.pairs.split(",")
    data = Path(args.data).resolve()
    work = Path(tempfile.mkdtemp(prefix="grid-scaling-"))
    tasks = task_files(work, data, pairs, args.epochs)
    runs = bench.build_grid(tasks, args.methods.split(","), parse_seeds(args.seeds))
    env = environment_info()
    print(f"{len(runs)} runs; warm-up run in this process", file=sys.stderr)
    bench.run_grid(runs[:1], work / "warmup")  # imports and caches, outside every timing

    modes = [time_grid("--jobs 1", runs, work / "jobs1", InProcessExecutor())]
    local = LocalProcessExecutor(2, 1, preload=bench.RUN_MODULES)
    modes.append(time_grid("--jobs 2", runs, work / "jobs2", local))
    modes[-1]["start_method"] = local.method
    t0 = time.perf_counter()
    with LoopbackCluster(
        2, folder=str(work / "dask"), preload=("eada.bench", *bench.RUN_MODULES)
    ) as cluster:
        started = time.perf_counter() - t0
        modes.append(time_grid("dask, 2 workers", runs, work / "daskgrid",
                               DaskExecutor(cluster.address)))  # fmt: skip
    modes[-1]["cluster_start_s"] = round(started, 2)
    base = modes[0]["wall_s"]
    for m in modes:
        m["wall_ratio_to_jobs1"] = round(m["wall_s"] / base, 3)
    same = all(m["accuracy"] == modes[0]["accuracy"] for m in modes[1:])
    per_run = {m["mode"]: m["run_s_mean"] for m in modes}
    for m in modes:
        del m["accuracy"]
    result = {
        "grid": {
            "pairs": pairs,
            "methods": args.methods.split(","),
            "seeds": parse_seeds(args.seeds),
            "epochs": args.epochs,
            "runs": len(runs),
            "config": "configs/office_caltech10_surf.yaml (epochs and rounds_at shortened)",
        },
        "threads_per_run": 1,
        "modes": modes,
        "identical_accuracies": same,
        "dask_run_s_over_jobs2": round(per_run["dask, 2 workers"] / per_run["--jobs 2"], 3),
        "torchrun": None if args.no_torchrun else time_torchrun(tasks[0], work / "torchrun"),
        "machine": {k: env[k] for k in ("platform", "cpu_count", "torch", "eada", "git")},
        "time_utc": env["time_utc"],
        "command": " ".join(["python", "benchmarks/grid_scaling.py", *(argv or sys.argv[1:])]),
    }
    write_json(Path(args.out), result)
    keys = ("modes", "identical_accuracies", "dask_run_s_over_jobs2", "torchrun")
    print(json.dumps({k: result[k] for k in keys}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
