"""``eada.executors`` on this machine: each local worker's own ``CUDA_VISIBLE_DEVICES`` (a
faked GPU count), retries of a run lost with its worker (never of a run that raised), Ctrl-C,
progress lines, the fork probe after ``torch.export``, and no Dask import by ``import eada``."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from eada import bench
from eada.executors import ExecutorError, Job, LocalProcessExecutor, Outcome, assign_devices
from eada.runs import read_jsonl

TINY = ["train.epochs=2", "active.rounds_at=[1]", "data.n_per_class=60"]
LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: fork, /proc")


def _visible(_: int = 0) -> dict[str, str | None]:
    time.sleep(0.2)  # long enough that every worker takes one
    return {"cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "pid": str(os.getpid())}


def test_devices_round_robin_through_the_parents_visible_gpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert assign_devices(6, runs_per_device=2) == ["0", "1", "2", "3", "0", "1"]
    with pytest.raises(
        ExecutorError,
        match=r"--jobs 6 is more than the 4 GPU\(s\) here "
        r"\(0,1,2,3\): 2 workers would share a GPU; give --runs-per-device 2",
    ):
        assign_devices(6)  # two workers on a GPU only when asked for
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")  # a parent given 4 of 8 GPUs
    assert assign_devices(3, devices=[0, 2], runs_per_device=2) == ["4", "6", "4"]
    with pytest.raises(ExecutorError, match=r"--jobs 3 is more than the 2 GPU\(s\) of --devices"):
        assign_devices(3, devices=[0, 2])
    assert assign_devices(4, devices=[1, 3], runs_per_device=2) == ["5", "7", "5", "7"]
    with pytest.raises(ExecutorError, match=r"more than 2 run\(s\) a device on 2 GPU"):
        assign_devices(5, devices=[1, 3], runs_per_device=2)
    with pytest.raises(ExecutorError, match=r"--devices 0,4: no GPU 4 here \(4 visible: 4,5,6,7"):
        assign_devices(2, devices=[0, 4])
    import argparse

    def jobs(**kw: object) -> int:
        opts = {"jobs": None, "runs_per_device": None, "devices": None, "dask": None, **kw}
        return bench._jobs(argparse.Namespace(**opts))

    assert jobs() == 1 and jobs(jobs=3) == 3
    assert jobs(runs_per_device=2) == 8 and jobs(runs_per_device=2, devices="0,3") == 4
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert assign_devices(2) == [None, None]  # no GPU: the workers' environment is left alone
    assert jobs(runs_per_device=2) == 1


@LINUX
def test_each_worker_sees_its_own_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The workers of ``eada bench --jobs 2 --devices 1,2`` on a (faked) 3-GPU machine each see
    one GPU, recorded in every line."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    ex = LocalProcessExecutor(2, devices=assign_devices(2, [1, 2]), start_method="fork")
    seen = [o.value for o in ex.run([Job(str(i), _visible, (i,)) for i in range(4)])]
    assert {v["cvd"] for v in seen if v} == {"1", "2"}
    by_pid: dict[str, set[str | None]] = {}
    for v in seen:
        assert v is not None
        by_pid.setdefault(v["pid"], set()).add(v["cvd"])
    assert all(len(c) == 1 for c in by_pid.values())  # a worker keeps its GPU
    from eada.cli import main

    sets = [a for s in TINY for a in ("--set", s)]
    out = tmp_path / "b"
    args = ["bench", "toy", "--methods", "random", "--seeds", "0-1", *sets, "--out", str(out)]
    assert main([*args, "--jobs", "2", "--devices", "1,2"]) == 0
    lines = read_jsonl(out / "runs.jsonl")
    assert sorted(r["worker"]["cuda_visible_devices"] for r in lines) == ["1", "2"]
    assert all(r["worker"]["device"] == "cpu" for r in lines)  # no real GPU: they ran on CPU
    assert main([*args, "--out", str(tmp_path / "c"), "--devices", "3"]) == 2  # not there


_MARK = "EADA_TEST_MARK"


def _dies_once(folder: str) -> dict[str, int]:
    """Kills its own worker (SIGKILL) the first time, succeeds the second."""
    mark = Path(folder) / "started"
    if not mark.exists():
        mark.write_text("1")
        os.kill(os.getpid(), signal.SIGKILL)
    return {"pid": os.getpid()}


def _raises(folder: str) -> dict[str, int]:
    with open(Path(folder) / "tries", "a") as f:
        f.write("x")
    raise RuntimeError("a bug in the run")


@LINUX
def test_a_run_lost_with_its_worker_is_retried_an_error_never(tmp_path: Path) -> None:
    jobs = [
        Job("dies", _dies_once, (str(tmp_path / "a"),)),
        Job("raises", _raises, (str(tmp_path),)),
    ]
    (tmp_path / "a").mkdir()
    out = {o.job.key: o for o in LocalProcessExecutor(2, retries=1, start_method="fork").run(jobs)}
    assert out["dies"].status == "ok" and out["dies"].attempts == 2  # on a fresh worker
    assert out["raises"].status == "failed" and out["raises"].attempts == 1
    assert out["raises"].error == "a bug in the run" and out["raises"].error_type == "RuntimeError"
    assert "RuntimeError: a bug in the run" in (out["raises"].traceback or "")
    assert (tmp_path / "tries").read_text() == "x"  # not retried
    (tmp_path / "b").mkdir()
    (lost,) = LocalProcessExecutor(1, start_method="fork").run(
        [Job("dies", _dies_once, (str(tmp_path / "b"),))]
    )  # no retries: lost, saying so
    assert lost.status == "lost" and "died (exit code -9)" in (lost.error or "")


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return kids


@LINUX
def test_ctrl_c_stops_submitting_lets_running_runs_end_and_leaves_whole_lines(
    tmp_path: Path,
) -> None:
    """SIGINT to the grid and its workers (what a terminal's Ctrl-C does) once the first run
    is recorded: no run starts after it, the running ones end and are recorded,
    ``KeyboardInterrupt`` follows; every line of runs.jsonl is whole."""
    runs = bench.build_grid(["toy"], ["random", "eada", "entropy"], [0, 1, 2], TINY)
    log = tmp_path / "runs.jsonl"
    lines: list[str] = []
    recorded_at_interrupt: list[int] = []

    def interrupt() -> None:
        deadline = time.time() + 300
        while time.time() < deadline and not log.exists():
            time.sleep(0.01)
        # on a loaded machine more runs may have finished between the first line and the
        # signal: what counts is how many were recorded when it was sent
        recorded_at_interrupt.append(len(log.read_text().splitlines()))
        for pid in [os.getpid(), *_children(os.getpid())]:
            os.kill(pid, signal.SIGINT)

    t = threading.Thread(target=interrupt)
    t.start()
    with pytest.raises(KeyboardInterrupt):
        bench.run_grid(runs, tmp_path, progress=lines.append, jobs=2)
    t.join()
    assert any(ln.startswith("interrupted: no new runs") for ln in lines), lines
    written = log.read_text().splitlines()
    assert all(json.loads(ln)["final"] for ln in written)  # whole lines, finished runs
    started = len(written)
    # the runs recorded when Ctrl-C came + the one or two running then, no more
    assert 1 <= started <= recorded_at_interrupt[0] + 2 < len(runs), (
        started,
        recorded_at_interrupt,
    )
    assert sum(ln.startswith("[") for ln in lines) == started


def test_progress_is_one_plain_line_per_finished_run_or_a_bar() -> None:
    run = bench.build_grid(["toy"], ["random"], [0], TINY)[0]
    ok = Outcome(Job(run.key, _visible), "ok", value={}, submitted=1.0, started=1.5, finished=3.0)
    ok.worker = {"address": "tcp://127.0.0.1:4000", "device": "cuda:3"}
    bad = Outcome(Job(run.key, _visible), "failed", error="boom", error_type="ValueError")
    bad.worker = {"address": "local:12"}
    lines: list[str] = []
    p = bench._Progress(2, lines.append, bar=False)
    with p:
        p.update(run, ok, 0)
        p.update(run, bad, 1)
    assert lines == [
        "[1/2] ok 1.5 s: toy / random / seed 0 (tcp://127.0.0.1:4000 cuda:3)",
        "[2/2] failed: toy / random / seed 0: ValueError: boom",
    ]
    from rich.console import Console

    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=200)
    bar = bench._Progress(2, lines.append, bar=True, console=console)
    with bar:
        bar.update(run, ok, 0)
        bar.update(run, bad, 1)
    text = screen.getvalue()
    assert "2/2" in text and "failed 1" in text and "ETA" in text and "failed: toy" in text
    assert len(lines) == 2  # the bar replaces the lines


_EXPORT_THEN_GRID = """
import json, sys, tempfile
from pathlib import Path
import torch
from eada.executors import fork_is_safe
before = fork_is_safe()
m = torch.nn.Linear(2, 1)
torch.export.export(m, (torch.ones(1, 2),))
m(torch.ones(1, 2)).sum().backward()  # autograd's threads now run in this process
from eada import bench
from eada.executors import LocalProcessExecutor
runs = bench.build_grid(["toy"], ["random"], [0, 1], json.loads(sys.argv[1]))
failed = []
ex = LocalProcessExecutor(2, preload=bench.RUN_MODULES)
recs = bench.run_grid(runs, Path(tempfile.mkdtemp()), executor=ex, failed=failed)
print(json.dumps({"ok": len(recs), "failed": [f["error"] for f in failed], "method": ex.method,
                  "probe": [before, fork_is_safe()]}))
"""


@LINUX
def test_jobs_2_after_torch_export_and_a_backward_runs_every_run(tmp_path: Path) -> None:
    """After ``torch.export`` and a backward in the parent, a forked child cannot run a
    backward; the local executor's probe sees it and spawns the workers instead."""
    proc = subprocess.run(
        [sys.executable, "-c", _EXPORT_THEN_GRID, json.dumps(TINY)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"ok": 2, "failed": [], "method": "spawn", "probe": [True, False]}, got


def test_import_eada_loads_no_dask() -> None:
    code = (
        "import sys, eada, eada.bench, eada.executors, eada.cli\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'dask', 'distributed'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
