"""``eada bench --dask``: grids on a real Dask cluster (a scheduler and 2 ``--no-nanny``
workers as separate processes, every port on 127.0.0.1, stopped by their process ids), one
cluster for the module; tiny SURF tasks (2 epochs, an MLP of 32 units)."""

from __future__ import annotations

import json
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
    c = LoopbackCluster(2, folder=str(folder), preload=("eada.bench", *bench.RUN_MODULES))
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
    records = bench.run_grid(
        runs, tmp_path / "o", executor=DaskExecutor(cluster.address), failed=failed
    )
    killer.join()
    assert killed, "no worker was killed"
    lines = read_jsonl(tmp_path / "o" / "runs.jsonl", unfinished=True)
    assert sorted(json.loads(r["key"])[1:] for r in lines) == sorted(
        json.loads(r.key)[1:] for r in runs
    )  # every run exactly once
    assert not failed and len(records) == 4
