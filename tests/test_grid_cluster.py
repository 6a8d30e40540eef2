"""``eada bench --dask``: grids on a real Dask cluster (a scheduler and 2 ``--no-nanny``
workers as separate processes, every port on 127.0.0.1, stopped by their process ids), one
cluster for the module, its workers started in folders of their own (as on other machines);
tiny SURF tasks (2 epochs, an MLP of 32 units). Workers join it later in some tests (one
without the data, one mid-grid)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("distributed")

from eada import bench
from eada.cli import main
from eada.executors import DaskExecutor, LoopbackCluster
from eada.runs import read_jsonl
from support import kept_registries, surf_task, write_plugin


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackCluster]:
    """The module's cluster; its workers import eada.bench, torch and what a run imports on
    first use (:data:`eada.bench.RUN_MODULES`) before they join."""
    folder = tmp_path_factory.mktemp("dask")
    nodes = [folder / "nodeA", folder / "nodeB"]  # each worker's working folder: not ours
    for node in nodes:
        node.mkdir()
    c = LoopbackCluster(
        2,
        folder=str(folder),
        preload=("eada.bench", *bench.RUN_MODULES),
        worker_folders=[str(n) for n in nodes],
        timeout=300,  # a busy machine: the preloads alone once took 100 s
    )
    c.start()
    try:
        yield c
    finally:
        c.stop()  # by PID: the workers SIGKILL, the scheduler SIGTERM (SIGKILL after 5 s)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A SURF task that trains, and the same task with ``optim.lr: 1e30`` (diverges)."""
    folder = tmp_path_factory.mktemp("tasks")
    return surf_task(folder, "surf_ok"), surf_task(folder, "surf_diverges", lr=1e30)


def test_diverging_grid_on_dask_is_two_ok_two_failed_and_equals_jobs_1(
    cluster: LoopbackCluster, tasks: tuple[str, str], tmp_path: Path, capsys
) -> None:
    """The command of the issue on the cluster: the two runs of the diverging task are recorded
    as failed (exit 1, a summary naming them); the two others equal a ``--jobs 1`` grid's run
    for run; the records name both workers."""
    ok, bad = tasks
    grid = [f"{ok},{bad}", "--methods", "random,eada", "--seeds", "0"]
    code = main(["bench", *grid, "--out", str(tmp_path / "dask"), "--dask", cluster.address])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "2 of 4 runs failed" in err and "surf_diverges.yaml / eada / seed 0: failed" in err
    lines = read_jsonl(tmp_path / "dask" / "runs.jsonl", unfinished=True)
    assert Counter(r.get("status", "ok") for r in lines) == {"ok": 2, "failed": 2}
    assert {r["worker"]["address"] for r in lines} == set(cluster.workers)  # both workers
    for r in lines:
        assert r["worker"]["host"] and r["worker"]["device"] == "cpu"
        if r.get("status") == "failed":
            assert "surf_diverges" in r["key"] and "NaN or infinite" in r["error"]
            assert "Traceback" in r["traceback"] or "Error" in r["traceback"]
    assert len(read_jsonl(tmp_path / "dask" / "runs.jsonl")) == 2  # readers: finished only

    one = bench.run_grid(bench.build_grid([ok], ["random", "eada"], [0]), tmp_path / "one")
    on_dask = {r["key"]: r for r in read_jsonl(tmp_path / "dask" / "runs.jsonl")}
    assert {r["key"] for r in one} == set(on_dask)
    for rec in one:
        other = on_dask[rec["key"]]
        assert other["final"] == rec["final"] and other["epochs"] == rec["epochs"]
        assert [x.get("selected") for x in other["rounds"]] == [
            x.get("selected") for x in rec["rounds"]
        ]

    # the same command again: the finished runs are kept, the failed ones tried again
    code = main(["bench", *grid, "--out", str(tmp_path / "dask"), "--dask", cluster.address])
    err = capsys.readouterr().err
    assert code == 1 and "reused 2 runs " in err and "2 of 4 runs failed" in err
    assert len(read_jsonl(tmp_path / "dask" / "runs.jsonl", unfinished=True)) == 6


def test_a_data_file_missing_on_a_worker_fails_that_run_naming_worker_and_path(
    cluster: LoopbackCluster, tasks: tuple[str, str], tmp_path: Path
) -> None:
    ok, _ = tasks
    missing = tmp_path / "not_on_the_workers.mat"
    runs = bench.build_grid([ok], ["random"], [0], [f"data.target={missing}"])
    failed: list[dict] = []
    assert bench.run_grid(runs, tmp_path / "o", executor=DaskExecutor(cluster.address),
                          failed=failed) == []  # fmt: skip
    (rec,) = failed
    assert rec["status"] == "failed" and str(missing) in rec["error"]
    assert rec["worker"]["address"] in rec["error"] and rec["worker"]["address"] in cluster.workers


def test_a_plugin_missing_on_a_worker_fails_its_runs_until_uploaded(
    cluster: LoopbackCluster, tasks: tuple[str, str], tmp_path: Path
) -> None:
    """A single-file plugin that the workers cannot import (its file is not where it was
    given): its runs fail naming the module and the worker, the built-in's run is unaffected;
    shipped with ``Client.upload_file``, the same grid finishes and its records name the
    plugin with the file's SHA-256."""
    from distributed import Client

    from eada import plugins

    ok, _ = tasks
    with kept_registries():
        plug = write_plugin(tmp_path, "dask_plug")
        sha = plugins.sha256_of(plug)
        plugins.load_plugin(plug)
        runs = bench.build_grid([ok], ["my_margin", "random"], [0])
        kept = tmp_path / "kept"
        kept.mkdir()
        plug.rename(kept / plug.name)  # the file is gone from where it was given
        failed: list[dict] = []
        out = tmp_path / "o"
        done = bench.run_grid(runs, out, executor=DaskExecutor(cluster.address), failed=failed)
        assert [r["method"] for r in done] == ["random"] and done[0]["plugins"] == []
        (rec,) = failed
        assert rec["method"] == "my_margin" and rec["error_type"] == "PluginError"
        assert "'dask_plug'" in rec["error"] and rec["worker"]["address"] in rec["error"]
        assert "upload_file('dask_plug.py')" in rec["error"]
        with Client(cluster.address, set_as_default=False) as client:
            client.upload_file(str(kept / plug.name))
        done = bench.run_grid(runs, out, executor=DaskExecutor(cluster.address))
        (mine,) = [r for r in done if r["method"] == "my_margin"]
        assert mine["plugins"][0]["module"] == "dask_plug"
        assert mine["plugins"][0]["sha256"] == sha and mine["plugins"][0]["kind"] == "file"


def test_the_tutorials_first_grid_on_the_cluster(
    cluster: LoopbackCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/tutorial-your-method.md's first grid as written, with ``--dask ADDRESS`` for
    ``--jobs 2``: its plugin file reaches the workers (same machine: its path), 12 records,
    the 4 of the plugin's strategy naming it."""
    import shlex

    from test_docs_commands import REPO, SHARED, doc_files

    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "shared").symlink_to(SHARED)  # the presets read ../shared/data
    monkeypatch.chdir(work)
    for name, text in doc_files("tutorial-your-method.md").items():
        Path(name).write_text(text)
    page = (REPO / "docs" / "tutorial-your-method.md").read_text()
    line = next(x for x in page.splitlines() if x.startswith("eada bench surf/C-A,surf/A-W "))
    words = shlex.split(line)[1:]
    at = words.index("--jobs")
    words[at : at + 2] = ["--dask", cluster.address]
    with kept_registries():
        assert main(words) == 0
    recs = read_jsonl(work / "runs" / "quick" / "runs.jsonl")
    assert len(recs) == 12 and {r["worker"]["address"] for r in recs} <= set(cluster.workers)
    named = [r for r in recs if r["plugins"]]
    assert sorted(r["method"] for r in named) == ["density_margin"] * 4
    assert named[0]["plugins"][0]["sha256"] == plugins_sha(work / "my_method.py")


def plugins_sha(path: Path) -> str:
    from eada.plugins import sha256_of

    return sha256_of(path)


def _surf_lab(folder: Path) -> Path:
    """A lab's layout: ``data/`` (the two SURF files) and ``configs/surf.yaml`` naming them
    relative to the config file (``../data/...``); the config's path."""
    task = Path(surf_task(folder, "surf"))
    data = folder / "data"
    data.mkdir()
    text = task.read_text()
    for line in text.splitlines():
        if line.strip().startswith(("source:", "target:")):
            src = Path(line.split(":", 1)[1].strip())
            shutil.copy(src, data / src.name)
            text = text.replace(str(src), f"../data/{src.name}")
    (folder / "configs").mkdir()
    config = folder / "configs" / "surf.yaml"
    config.write_text(text)
    task.unlink()
    return config


def test_workers_in_other_folders_read_data_named_relative_to_the_config(
    cluster: LoopbackCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The workers run in folders of their own; the config names its data ``../data/x.mat``
    relative to itself and is given by a relative path from the lab's folder: every run finds
    its data, and its record keeps the driver's and the worker's path and the digest. With
    ``--data-map`` the workers read a copy elsewhere."""
    lab = tmp_path / "lab"
    lab.mkdir()
    _surf_lab(lab)
    monkeypatch.chdir(lab)
    grid = ["bench", "configs/surf.yaml", "--methods", "random", "--seeds", "0-1"]
    assert main([*grid, "--out", "out", "--dask", cluster.address]) == 0, capsys.readouterr().err
    lines = read_jsonl(lab / "out" / "runs.jsonl", unfinished=True)
    assert len(lines) == 2 and all(r.get("status", "ok") == "ok" for r in lines)
    for r in lines:
        assert r["worker"]["address"] in cluster.workers
        assert r["config"]["data"]["source"] == "data/Caltech10_SURF_L10.mat"  # as resolved
        src = r["data_paths"]["source"]
        assert src == {"driver": str(lab / "data" / "Caltech10_SURF_L10.mat"),
                       "worker": str(lab / "data" / "Caltech10_SURF_L10.mat")}  # fmt: skip
        assert r["inputs"]["source"]["digest"].startswith("sha256:")
        assert r["attempts"] == 1 and r["workers"] == [r["worker"]["address"]]
        assert r["worker"]["code"]["commit"] == r["code"]["git"]["commit"] or not r["code"]["git"]

    mirror = tmp_path / "scratch"
    shutil.copytree(lab / "data", mirror)
    grid = [*grid[:-2], "--seeds", "2"]
    argv = [
        *grid,
        "--out",
        "mapped",
        "--dask",
        cluster.address,
        "--data-map",
        f"{lab / 'data'}={mirror}",
    ]
    assert main(argv) == 0, capsys.readouterr().err
    (rec,) = read_jsonl(lab / "mapped" / "runs.jsonl")
    assert rec["data_paths"]["target"]["worker"] == str(mirror / "amazon_SURF_L10.mat")
    assert rec["inputs"]["target"]["path"] == str(mirror / "amazon_SURF_L10.mat")


def test_a_worker_without_the_data_is_avoided_and_a_late_worker_gets_runs(
    cluster: LoopbackCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A third worker whose data are elsewhere (its ``EADA_DATA_MAP`` points at an empty
    folder) fails the run it gets at the start as an environment error: the run goes to another
    worker and that worker gets no more runs of that data set; the summary names it. A fourth
    worker, started in its own folder after the grid's first run ended, runs at least one run."""
    lab = tmp_path / "lab"
    lab.mkdir()
    config = _surf_lab(lab)
    (tmp_path / "empty").mkdir()
    (tmp_path / "nodeC").mkdir()
    elsewhere = {"EADA_DATA_MAP": f"{lab / 'data'}={tmp_path / 'empty'}"}
    bad = cluster.add_worker(str(tmp_path / "nodeC"), env=elsewhere)
    late: list[str] = []

    def progress(line: str) -> None:
        lines.append(line)
        if line.startswith("[1/") and not late:  # the first run ended: a worker joins now
            (tmp_path / "nodeD").mkdir()
            late.append(cluster.add_worker(str(tmp_path / "nodeD")))

    lines: list[str] = []
    runs = bench.build_grid([str(config)], ["random", "eada", "source_only"], [0, 1, 2])
    failed: list[dict] = []
    ex = DaskExecutor(cluster.address)
    try:
        records = bench.run_grid(runs, tmp_path / "o", progress=progress, executor=ex,
                                 failed=failed)  # fmt: skip
    finally:
        cluster.kill_worker(bad)
    assert not failed and len(records) == 9
    assert bad not in {r["worker"]["address"] for r in records}
    # 3 runs in flight at the start on 3 idle workers: one on it, then no more of that data
    (tried_bad,) = [r for r in records if bad in r["workers"]]
    assert tried_bad["attempts"] == 2 and tried_bad["workers"][0] == bad
    notes = bench.cluster_notes(ex)
    assert any(bad in n and "runs of that data set" in n and "data not on this worker" in n
               for n in notes), notes  # fmt: skip
    assert any(bad in ln and "gets no more runs" in ln for ln in lines), lines
    assert late and any(r["worker"]["address"] == late[0] for r in records), lines
    assert any(late[0] in ln and "joined" in ln for ln in lines), lines


def test_a_second_ctrl_c_cancels_the_runs_on_the_workers(
    cluster: LoopbackCluster, tmp_path: Path
) -> None:
    """Ctrl-C twice while runs of 400 epochs compute on the workers: ``KeyboardInterrupt``,
    no line, and within seconds no worker computes anything (each run stops at its next
    epoch instead of training on for minutes)."""
    from distributed import Client

    long = surf_task(tmp_path, "surf_long", epochs=400)
    runs = bench.build_grid([long], ["random"], [0, 1])
    lines: list[str] = []

    def executing(client: Client) -> int:
        counts = client.run(lambda dask_worker: len(dask_worker.state.executing))
        return sum(counts.values())

    def interrupt_twice() -> None:
        with Client(cluster.address, set_as_default=False) as client:
            deadline = time.time() + 300
            while time.time() < deadline and executing(client) < 2:
                time.sleep(0.1)
        time.sleep(1.0)  # both runs are training
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGINT)

    t = threading.Thread(target=interrupt_twice)
    t.start()
    with pytest.raises(KeyboardInterrupt):
        bench.run_grid(runs, tmp_path / "o", progress=lines.append,
                       executor=DaskExecutor(cluster.address))  # fmt: skip
    t.join()
    stopped = time.time()
    assert any(ln.startswith("interrupted: no new runs") for ln in lines), lines
    with Client(cluster.address, set_as_default=False) as client:
        while executing(client) and time.time() < stopped + 30:
            time.sleep(0.2)
        assert executing(client) == 0, "runs still computing 30 s after the second Ctrl-C"
    idle = time.time() - stopped
    assert idle < 20, f"the workers took {idle:.1f} s to stop"
    assert not (tmp_path / "o" / "runs.jsonl").exists() or not read_jsonl(
        tmp_path / "o" / "runs.jsonl", unfinished=True
    )


def test_a_worker_killed_mid_grid_leaves_one_record_per_run(
    cluster: LoopbackCluster, tasks: tuple[str, str], tmp_path: Path
) -> None:
    """SIGKILL one of the two workers while it runs a task: Dask runs that task again on the
    other worker; every run of the grid ends with exactly one record. (Last in the module: the
    cluster has one worker after it.)"""
    from distributed import Client

    folder = tmp_path / "t"
    folder.mkdir()
    longer = surf_task(folder, "surf_longer", epochs=6)
    runs = bench.build_grid([longer], ["random", "eada"], [0, 1])
    killed: list[str] = []

    def kill_a_busy_worker() -> None:
        with Client(cluster.address, set_as_default=False) as client:
            deadline = time.time() + 300
            while time.time() < deadline:
                busy = [a for a, keys in client.processing().items() if keys]
                if busy and busy[0] in cluster.workers:
                    time.sleep(0.3)  # mid-run: the worker has started it
                    cluster.kill_worker(busy[0])
                    killed.append(busy[0])
                    return
                time.sleep(0.05)

    killer = threading.Thread(target=kill_a_busy_worker)
    killer.start()
    failed: list[dict] = []
    progress: list[str] = []
    records = bench.run_grid(
        runs,
        tmp_path / "o",
        progress=progress.append,
        executor=DaskExecutor(cluster.address),
        failed=failed,
    )
    killer.join()
    assert killed, "no worker was killed"
    assert any(f"worker {killed[0]}" in ln and " lost" in ln for ln in progress), progress
    # the run it was running (where its start reached the driver before the kill): run again
    rerun = [r for r in records if killed[0] in r["workers"]]
    assert all(r["attempts"] >= 2 and r["workers"][-1] != killed[0] for r in rerun), rerun
    lines = read_jsonl(tmp_path / "o" / "runs.jsonl", unfinished=True)
    assert sorted(json.loads(r["key"])[1:] for r in lines) == sorted(
        json.loads(r.key)[1:] for r in runs
    )  # every run exactly once
    assert not failed and len(records) == 4
