"""``eada bench`` as a lab runs it, without a cluster: one grid per ``--out`` (an OS file lock,
gone with its process), ``--dry-run`` naming each run's device (a faked GPU count), ``--jobs``
above the GPU count refused, and the data paths a run's worker is given (absolute, mapped by
``--data-map``/``EADA_DATA_MAP``, checked before the run starts)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from eada.cli import main
from eada.config import FeatureData
from eada.data.identity import (
    DataMapError,
    DataNotOnWorkerError,
    input_paths,
    parse_data_map,
    place_data,
)
from eada.runs import LOCK_NAME, read_jsonl

TINY = ["--set", "train.epochs=2", "--set", "active.rounds_at=[1]", "--set", "data.n_per_class=60"]

_HOLD = """
import sys, time
from pathlib import Path
from eada.runs import folder_lock
with folder_lock(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(600)
"""


def _wait_for_lock(out: Path, pid: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if json.loads((out / LOCK_NAME).read_text())["pid"] == pid:
                return
        except (OSError, ValueError, KeyError):
            pass
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.05)
    raise AssertionError("the first grid never took the lock")


def test_a_second_bench_on_the_same_out_is_refused_while_the_first_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two ``eada bench`` on one folder: the second is refused (exit 2) naming the first's host
    and PID, and writes nothing; the first ends with one line a run. A SIGKILLed holder leaves
    the folder free."""
    out = tmp_path / "grid"
    grid = ["bench", "toy", "--methods", "random,eada", "--seeds", "0-1", *TINY, "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen(
        [sys.executable, "-m", "eada.cli", *grid], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        _wait_for_lock(out, first.pid, first)
        assert main(grid) == 2
        err = capsys.readouterr().err
        assert f"host {socket.gethostname()}, PID {first.pid}" in err, err
        assert "one grid at a time" in err and "another --out" in err
        assert first.wait(timeout=600) == 0, first.stderr.read() if first.stderr else ""
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGKILL)
            first.wait()
    assert len(read_jsonl(out / "runs.jsonl", unfinished=True)) == 4  # the first's lines only

    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(out)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert main(grid) == 2 and f"PID {holder.pid}" in capsys.readouterr().err
    finally:
        os.kill(holder.pid, signal.SIGKILL)  # dies holding it: the OS releases the lock
        holder.wait()
    assert main(grid) == 0 and "reused 4 runs" in capsys.readouterr().err


def test_dry_run_names_each_runs_device_and_jobs_above_the_gpus_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # a faked 2-GPU machine
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    grid = ["bench", "toy", "--methods", "random,eada", "--seeds", "0-1", "--out", str(tmp_path)]
    assert main([*grid, "--jobs", "2", "--devices", "0,1", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    todo = [ln for ln in lines if ln.startswith("todo ")]
    assert len(todo) == 4
    assert todo[0].endswith("-> worker 1, cuda:0") and todo[1].endswith("-> worker 2, cuda:1")
    assert all(ln.endswith("-> the first worker free (cuda:0 or cuda:1)") for ln in todo[2:])
    assert main([*grid, "--jobs", "3", "--dry-run"]) == 2  # 3 workers, 2 GPUs, no K given
    err = capsys.readouterr().err
    assert "--jobs 3 is more than the 2 GPU(s) here (0,1)" in err
    assert "--runs-per-device 2" in err
    assert main([*grid, "--jobs", "3", "--runs-per-device", "2", "--dry-run"]) == 0
    assert "-> worker 3, cuda:0" in capsys.readouterr().out
    assert main([*grid, "--dask", "tcp://127.0.0.1:1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("-> any Dask worker with GPU=1") == 4
    assert main([*grid, "--set", "device=cpu", "--dry-run"]) == 0
    assert capsys.readouterr().out.count("-> this process, cpu") == 4


def test_data_paths_travel_absolute_mapped_and_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lab, scratch = tmp_path / "lab" / "data", tmp_path / "scratch"
    lab.mkdir(parents=True)
    scratch.mkdir()
    (lab / "s.npz").write_bytes(b"x")
    (scratch / "s.npz").write_bytes(b"x")
    monkeypatch.chdir(tmp_path / "lab")
    data = FeatureData(source=Path("data/s.npz"), target=Path("data/t.npz"))
    paths = input_paths(data)  # the driver's: absolute against its working folder
    assert paths == {"source": str(lab / "s.npz"), "target": str(lab / "t.npz")}
    with pytest.raises(DataNotOnWorkerError, match=r"data.target: .*lab/data/t.npz") as err:
        place_data(data, paths)  # checked before the run starts, every missing path named
    assert "source" not in str(err.value) and isinstance(err.value, OSError)
    (scratch / "t.npz").write_bytes(b"y")
    rules = parse_data_map([f"{lab}={scratch}"])
    placed_data, placed = place_data(data, paths, rules)
    assert isinstance(placed_data, FeatureData) and placed_data.target == scratch / "t.npz"
    assert placed["target"] == {"driver": str(lab / "t.npz"), "worker": str(scratch / "t.npz")}
    monkeypatch.setenv("EADA_DATA_MAP", f"{lab}={tmp_path / 'nowhere'}")  # the worker's own first
    with pytest.raises(DataNotOnWorkerError, match="mapped from the driver's"):
        place_data(data, paths, rules)
    with pytest.raises(DataMapError, match="two absolute paths"):
        parse_data_map(["data=/x"])


_SBATCH = """#!/usr/bin/env bash
# a fake sbatch: the job script runs here as a local process in its own process group; the
# job id is that process's PID (what scancel stops)
script="${@: -1}"
cp "$script" "$FAKE_SLURM/job-$$.sh"
setsid bash "$FAKE_SLURM/job-$$.sh" > "$FAKE_SLURM/job-$$.log" 2>&1 < /dev/null &
echo "$!" >> "$FAKE_SLURM/jobs"
echo "Submitted batch job $!"
"""
_SCANCEL = """#!/usr/bin/env bash
for id in "$@"; do echo "$id" >> "$FAKE_SLURM/cancelled"; kill -TERM -- "-$id" 2>/dev/null; done
exit 0
"""
_SQUEUE = """#!/usr/bin/env bash
# the jobs still running, one id a line (squeue -h -o %i)
while read -r id; do kill -0 "$id" 2>/dev/null && echo "$id"; done < "$FAKE_SLURM/jobs"
exit 0
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="setsid, process groups")
def test_slurm_grid_on_a_fake_scheduler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``eada bench --slurm`` through dask-jobqueue against fake ``sbatch``/``squeue``/
    ``scancel`` that run each job script as a local process (its PID the job id): the jobs
    start, the grid runs on their workers (bound to 127.0.0.1, no dashboard), the job script
    says what was asked, and every job is cancelled at the end."""
    pytest.importorskip("dask_jobqueue")
    bin_dir, jobs = tmp_path / "bin", tmp_path / "slurm"
    bin_dir.mkdir()
    jobs.mkdir()
    for name, text in (("sbatch", _SBATCH), ("scancel", _SCANCEL), ("squeue", _SQUEUE)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM", str(jobs))
    out = tmp_path / "grid"
    argv = ["bench", "toy", "--methods", "random,eada", "--seeds", "0", *TINY, "--out", str(out),
            "--slurm", "--slurm-partition", "debug", "--slurm-account", "lab", "--slurm-gpus",
            "1", "--slurm-cpus", "2", "--slurm-memory", "2GB", "--slurm-walltime", "00:10:00",
            "--slurm-jobs", "2", "--slurm-interface", "lo", "--slurm-wait", "300"]  # fmt: skip
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 0, err
    assert "Slurm: 2 job(s)" in err and "Slurm: the grid's jobs cancelled" in err
    lines = read_jsonl(out / "runs.jsonl")
    assert len(lines) == 2
    assert all(r["worker"]["address"].startswith("tcp://127.0.0.1:") for r in lines)
    ids = [int(x) for x in (jobs / "jobs").read_text().split()]
    assert len(ids) == 2
    assert sorted(int(x) for x in (jobs / "cancelled").read_text().split()) == sorted(ids)
    deadline = time.time() + 30
    while any(_alive(i) for i in ids) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(_alive(i) for i in ids), "a job's process outlived its scancel"
    assert len(list(jobs.glob("job-*.sh"))) == 2
    script = next(iter(jobs.glob("job-*.sh"))).read_text()
    for line in ("#SBATCH -p debug", "#SBATCH -A lab", "#SBATCH --cpus-per-task=2",
                 "#SBATCH -t 00:10:00", "#SBATCH --gres=gpu:1",
                 "export DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False",
                 "export OMP_NUM_THREADS=2"):  # fmt: skip
        assert line in script, script
    assert "--resources GPU=1" in script and "--no-dashboard" in script
    assert "--interface lo" in script and "--nthreads 1" in script
    marks = ("Listening to:", "Start worker at:", "Start Nanny at:", "dashboard at:")
    for log_file in jobs.glob("job-*.log"):  # every address a job's processes listen on
        log = log_file.read_text()
        listening = [
            ln.split(" at:")[-1].split(" to:")[-1].strip().strip("'").removeprefix("tcp://")
            for ln in log.splitlines()
            if any(m in ln for m in marks)
        ]
        assert len(listening) == 4 and all(a.startswith("127.0.0.1:") for a in listening), log
