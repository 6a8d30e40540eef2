"""``eada bench``: grid validation, tables, and resumption after a SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from eada import bench
from eada.config import ConfigError
from eada.runs import read_jsonl

TINY = ["train.epochs=2", "active.rounds_at=[1]", "data.n_per_class=60"]
GRID_ARGS = ["toy", "--methods", "random,eada,entropy", "--seeds", "0-1"]


def _bench_cmd(out: Path) -> list[str]:
    sets = [a for s in TINY for a in ("--set", s)]
    return [sys.executable, "-m", "eada.cli", "bench", *GRID_ARGS, *sets, "--out", str(out)]


def test_sweeps_and_labels() -> None:
    assert bench.parse_sweeps([]) == [[]]
    grid = bench.parse_sweeps(["active.alpha1=0.1,0.5", "train.gamma=0,0.01"])
    assert len(grid) == 4 and grid[0] == ["active.alpha1=0.1", "train.gamma=0"]
    assert bench.variant_label(grid[-1]) == "alpha1=0.5, gamma=0.01"
    with pytest.raises(ConfigError, match=r"section\.key=v1"):
        bench.parse_sweeps(["alpha1"])


def test_grid_is_validated_before_any_run() -> None:
    with pytest.raises(ConfigError, match="unknown method"):
        bench.build_grid(["toy"], ["eada", "nope"], [0])
    with pytest.raises(ConfigError):
        bench.build_grid(["toy"], ["eada"], [0], ["train.epochs=-1"])
    runs = bench.build_grid(
        ["toy"], ["eada", "target_supervised"], [0, 1], TINY, ["active.alpha1=0.5,1.0"]
    )
    assert len(runs) == 8 and len({r.key for r in runs}) == 8
    sup = next(r for r in runs if r.method == "target_supervised")
    assert not sup.config.active.enabled  # all labels come from the callback, not rounds


def _record(
    task: str, method: str, seed: int, acc: float, variant: list[str] | None = None
) -> dict:
    return {
        "key": json.dumps([task, method, variant or [], seed]),
        "task": task,
        "method": method,
        "variant": variant or [],
        "seed": seed,
        "strategy": None if method == "source_only" else method,
        "final": {"target/accuracy": acc},
        "rounds": [
            {"round": 0, "n_labeled": 0},
            {"round": 1, "n_labeled": 5, "selection_seconds": 0.5, "scoring_seconds": 1.5},
        ],
    }


def test_tables_have_the_papers_shape() -> None:
    recs = [
        _record("A", "source_only", 0, 50.0),
        _record("A", "source_only", 1, 52.0),
        _record("B", "source_only", 0, 60.0),
        _record("B", "source_only", 1, 60.0),
        _record("A", "eada", 0, 70.0),
        _record("A", "eada", 1, 74.0),
        _record("B", "eada", 0, 80.0),
        _record("A", "eada", 0, 65.0, ["active.alpha1=0.25"]),
    ]
    md = bench.accuracy_table([r for r in recs if not r["variant"]])
    lines = md.splitlines()
    assert lines[0] == "| Method | A | B | Mean |"
    assert lines[2] == "| Source-only | 51.0 ± 1.4 | 60.0 ± 0.0 | 55.5 |"
    assert lines[3] == "| EADA | **72.0 ± 2.8** | **80.0 ± 0.0 (n=1)** | **76.0** |"
    tex = bench.accuracy_table([r for r in recs if not r["variant"]], fmt="latex")
    assert "\\begin{tabular}{l|ccc}" in tex and "72.0 $\\pm$ 2.8" in tex
    assert "\\textbf{76.0}" in tex
    sweep = bench.sweep_table(recs, "eada")
    assert sweep.splitlines()[2] == "| A | 65.0 ± 0.0 |"
    assert bench.task_label("configs/office31_x.yaml") == "office31_x"
    assert bench.task_label("digits/mnist-usps") == "digits/mnist-usps"
    q = bench.query_table(recs)
    assert "| eada | O(N log N) | O(N + B log B) | 0.5000 / 2.000 | 0.5000 / 2.000 |" in q
    assert "source_only" not in q
    everything = bench.render_tables(recs)
    assert everything.count("| Method |") == 1 and "alpha1=0.25" in everything
    with pytest.raises(ValueError, match="format"):
        bench.accuracy_table(recs, fmt="html")
    # rows follow the paper's order, not the order the lines were written (a re-run method)
    plain = [r for r in recs if not r["variant"]]
    rerun = [*plain[4:], _record("A", "waal", 0, 60.0), *plain[:4]]
    rows = [ln.split(" | ")[0] for ln in bench.accuracy_table(rerun).splitlines()[2:]]
    assert rows == ["| Source-only", "| WAAL", "| EADA"]


def test_changed_config_for_a_stored_run_is_an_error(tmp_path: Path) -> None:
    runs = bench.build_grid(["toy"], ["random"], [0], TINY)
    bench.run_grid(runs, tmp_path)
    same = bench.run_grid(bench.build_grid(["toy"], ["random"], [0], TINY), tmp_path)
    assert len(same) == 1 and len(read_jsonl(tmp_path / "runs.jsonl")) == 1  # nothing re-run
    changed = bench.build_grid(["toy"], ["random"], [0], [*TINY, "train.gamma=0.5"])
    with pytest.raises(ValueError, match=r"train\.gamma"):
        bench.run_grid(changed, tmp_path)


def test_a_diverging_cell_is_recorded_as_failed_and_the_grid_goes_on(
    tmp_path: Path, capsys
) -> None:
    """A run whose training stops being finite is recorded as failed (its error, the tail of
    its traceback, where it ran), the cells after it still run, a summary names it and the exit
    status is 1; not an 'unexpected ... bug' report. The same command again retries it only."""
    from eada.cli import main

    tiny = [a for o in TINY for a in ("--set", o)]
    args = ["bench", "toy", "--methods", "random", "--seeds", "0", "--out", str(tmp_path),
            "--jobs", "1", *tiny, "--set", "optim.name=sgd",
            "--sweep", "optim.lr=1e38,0.1"]  # fmt: skip
    code = main(args)
    err = capsys.readouterr().err
    assert code == 1, err
    assert "1 of 2 runs failed" in err, err
    assert "toy / random [lr=1e38] / seed 0: failed: FloatingPointError: " in err, err
    assert "bug in eada" not in err
    assert len(read_jsonl(tmp_path / "runs.jsonl")) == 1  # the lr=0.1 cell, after it
    bad = read_jsonl(tmp_path / "runs.jsonl", unfinished=True)[0]
    assert bad["status"] == "failed" and bad["error_type"] == "FloatingPointError"
    assert "non-finite" in bad["error"] and "FloatingPointError" in bad["traceback"]
    assert bad["worker"]["address"] == f"local:{os.getpid()}" and bad["worker"]["host"]
    assert main(args) == 1  # retried (and fails again); the finished cell is reused
    err = capsys.readouterr().err
    assert "reused 1 run " in err and err.count("seed 0") == 2  # its progress line + summary
    assert len(read_jsonl(tmp_path / "runs.jsonl", unfinished=True)) == 3


def test_target_supervised_trains_on_every_target_label(tmp_path: Path) -> None:
    runs = bench.build_grid(["toy"], ["target_supervised"], [0], TINY)
    (rec,) = bench.run_grid(runs, tmp_path)
    assert rec["n_labeled"] == 120 and rec["strategy"] is None
    # every line names the code and command that produced it (a resumed grid may span commits)
    assert set(rec["code"]) == {"git", "eada", "torch", "numpy", "command"}
    assert rec["code"]["torch"] == torch.__version__
    assert rec["warnings"] == []
    assert [e["epoch"] for e in rec["epochs"]] == [1, 2]  # TINY: train.epochs=2
    assert all("loss_source" in e and "target_accuracy" in e for e in rec["epochs"])


def test_killed_bench_resumes_and_gives_the_same_table(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    full, killed = tmp_path / "full", tmp_path / "killed"
    proc = subprocess.Popen(
        _bench_cmd(killed), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 900  # generous: a shared CI machine can be very slow
    while time.time() < deadline and len(read_jsonl(killed / "runs.jsonl")) < 2:
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    n_done = len(read_jsonl(killed / "runs.jsonl"))
    assert 2 <= n_done < 6, f"kill landed after {n_done} of 6 runs"
    # the interrupted grid resumes: only the missing runs are trained
    resumed = subprocess.run(
        _bench_cmd(killed), env=env, capture_output=True, text=True, check=True
    )
    assert resumed.stderr.count("seed") == 6 - n_done
    # the same grid, uninterrupted (in-process)
    grid = bench.build_grid(["toy"], ["random", "eada", "entropy"], [0, 1], TINY)
    bench.run_grid(grid, full)
    recs_killed = {r["key"]: r for r in read_jsonl(killed / "runs.jsonl")}
    recs_full = {r["key"]: r for r in read_jsonl(full / "runs.jsonl")}
    assert recs_killed.keys() == recs_full.keys() and len(recs_full) == 6
    for key, rec in recs_full.items():
        assert recs_killed[key]["final"] == rec["final"]
        assert [r["n_labeled"] for r in recs_killed[key]["rounds"]] == [
            r["n_labeled"] for r in rec["rounds"]
        ]
    table = bench.accuracy_table(list(recs_full.values()))
    assert table == bench.accuracy_table(list(recs_killed.values()))
    assert table in resumed.stdout


def _children(pid: int) -> set[int]:
    """The process ids whose parent is ``pid`` (Linux ``/proc``)."""
    kids = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.add(int(stat.parent.name))
    return kids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: /proc, fork, prctl")
def test_killed_parallel_bench_leaves_no_worker_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "killed"
    proc = subprocess.Popen(
        [*_bench_cmd(out), "--jobs", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 900
    while time.time() < deadline and len(read_jsonl(out / "runs.jsonl")) < 2:
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    workers = _children(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert workers, "the grid ended before the kill"

    def running(pid: int) -> bool:  # a zombie left for init to reap has ended
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
        except OSError:
            return False

    deadline = time.time() + 30
    while time.time() < deadline and any(running(w) for w in workers):
        time.sleep(0.05)
    assert not [w for w in workers if running(w)], "workers outlived the killed eada bench"
    n_done = len(read_jsonl(out / "runs.jsonl"))
    resumed = subprocess.run(
        [*_bench_cmd(out), "--jobs", "2"], capture_output=True, text=True, check=True
    )
    assert resumed.stderr.count("seed") == 6 - n_done
    keys = [r["key"] for r in read_jsonl(out / "runs.jsonl")]
    assert len(keys) == len(set(keys)) == 6


def test_training_warnings_travel_in_the_bench_line(tmp_path: Path, monkeypatch) -> None:
    from eada import energy

    def fires_at_two(deltas, aligns, unit="epochs"):
        return "Delta ran away" if len(deltas) == 2 else None

    monkeypatch.setattr(energy, "alignment_runaway", fires_at_two)
    runs = bench.build_grid(["toy"], ["eada", "random"], [0], TINY)
    with pytest.warns(energy.AlignmentRunawayWarning):
        eada_rec, random_rec = bench.run_grid(runs, tmp_path)
    assert eada_rec["warnings"] == ["Delta ran away"]
    assert random_rec["warnings"] == []  # no L_fea (gamma = 0), nothing to watch
