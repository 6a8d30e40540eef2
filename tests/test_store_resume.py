"""Crash safety of the project store: runs killed with SIGKILL (at injected points and at a
random moment) resume with nothing lost, no sample labeled twice, and the same labeled set as
an uninterrupted run with the same seed."""

from __future__ import annotations

import csv
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eada.data.tasks import load_task
from eada.hparams import preset_config
from eada.store import Project, init_project
from eada.train import ActiveDATrainer

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")

TOY = [
    "data.n_per_class=100",
    "train.epochs=5",
    "active.rounds_at=[1,3]",
    "active.budget_per_round=0.05",
]


def _eada(args: list[str], crash: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "EADA_CRASH_AT"}
    if crash:
        env["EADA_CRASH_AT"] = crash
    return subprocess.run(
        [sys.executable, "-m", "eada.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _labels(folder: Path) -> list[tuple[int, int]]:
    with sqlite3.connect(folder / "eada.sqlite") as c:
        return list(c.execute("SELECT sample_id, class_id FROM labels ORDER BY sample_id"))


def test_simulated_run_killed_repeatedly_resumes_to_the_uninterrupted_result(
    tmp_path: Path,
) -> None:
    cfg = preset_config("toy", "eada", 0, TOY)
    reference = ActiveDATrainer(cfg, load_task(cfg.data, 0)).run()
    folder = tmp_path / "proj"
    init_project(folder, cfg).close()
    store = ["--store", str(folder)]

    # 1) kills at injected points, in the order the run reaches them (each must land: a killed
    #    run resumes at its last consistent state, so the next point is still ahead of it)
    for point in ("import:before_commit", "epoch_end:2", "query:before_commit", "epoch_end:4"):
        done = _eada(["train", *store, "--simulate"], crash=point)
        assert done.returncode == -signal.SIGKILL, (point, done.stdout, done.stderr)
        # the store opens and is consistent after every kill
        with sqlite3.connect(folder / "eada.sqlite") as c:
            assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"

    # 2) a kill at a random moment: as soon as one more checkpoint is committed (on a fast
    #    machine the run may finish first; the kills above are the guaranteed ones)
    with sqlite3.connect(folder / "eada.sqlite") as c:
        n_before = c.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0]
    proc = subprocess.Popen(
        [sys.executable, "-m", "eada.cli", "train", *store, "--simulate"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        try:
            with sqlite3.connect(folder / "eada.sqlite", timeout=5) as c:
                if c.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0] > n_before:
                    break
        except sqlite3.OperationalError:
            pass
        time.sleep(0.05)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()

    done = _eada(["train", *store, "--simulate"])
    assert done.returncode == 0, done.stderr
    rows = _labels(folder)
    proj = Project(folder)
    positions = sorted(r["position"] for r in proj.store.current_labels())
    assert positions == reference.labeled_indices  # same labeled set as uninterrupted
    assert len(rows) == len({s for s, _ in rows}) == 20  # no sample labeled twice, none lost
    truth = proj.task.target.y
    assert all(truth[r["position"]] == r["class_id"] for r in proj.store.current_labels())
    st = proj.status()
    assert st["next"] == "done" and st["epoch"] == 5
    assert [r["labeled"] for r in st["rounds"]] == [10, 10]
    # checkpoints left by killed processes were never recorded; recorded ones verify
    for ck in proj.store.checkpoints():
        proj.load_checkpoint(ck)


def test_human_import_killed_before_commit_changes_nothing(tmp_path: Path) -> None:
    cfg = preset_config("toy", "eada", 0, TOY)
    folder = tmp_path / "proj"
    proj = init_project(folder, cfg)
    out = proj.query(budget=6)
    proj.close()
    exported = Path(out["files"]["csv"])
    with open(exported, newline="") as fh:
        rows = list(csv.DictReader(fh))
    target = load_task(cfg.data, 0).target
    for r in rows:  # an annotator writes class names
        r["label"] = target.classes[int(target.y[int(r["index"])])]
    filled = tmp_path / "filled.csv"
    with open(filled, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    args = ["label", "import", str(filled), "--store", str(folder)]
    killed = _eada(args, crash="import:before_commit")
    assert killed.returncode == -signal.SIGKILL
    assert _labels(folder) == []  # the killed import left no trace
    with sqlite3.connect(folder / "eada.sqlite") as c:
        assert c.execute("SELECT COUNT(*) FROM imports").fetchone()[0] == 0
    again = _eada(args)
    assert again.returncode == 0, again.stderr
    assert len(_labels(folder)) == 6
    twice = _eada(args)  # importing the same file again changes nothing
    assert twice.returncode == 0 and "0 new" in twice.stdout
    assert len(_labels(folder)) == 6
