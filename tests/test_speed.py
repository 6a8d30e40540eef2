"""Speed on a shared machine: thread counts chosen and recorded, ``eada bench --jobs``, safe
concurrent appends, the cheap domain statistics and BADGE's memory."""

from __future__ import annotations

import json
import multiprocessing
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from eada import bench, threads
from eada.cli import main
from eada.runs import append_jsonl, read_jsonl
from support import real_data

TINY = ["train.epochs=2", "active.rounds_at=[1]", "data.n_per_class=40"]


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    threads.set_threads(None)
    threads._applied = None
    torch.set_num_threads(before)


def test_thread_count_follows_flag_env_and_model_size(restore_threads, monkeypatch) -> None:
    small, large = torch.nn.Linear(2, 2), torch.nn.Linear(2000, 1000)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    assert threads.threads_for_model(small) == (1, "small model")
    assert threads.threads_for_model(large) == (2, "large model")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.threads_for_model(small) == (3, "OMP_NUM_THREADS")
    threads.set_threads(2)
    assert threads.threads_for_model(large) == (2, "--threads")
    assert torch.get_num_threads() == 2
    with pytest.raises(ValueError, match="--threads"):
        threads.set_threads(0)


def test_selection_runs_under_the_chosen_blas_limit(restore_threads) -> None:
    from threadpoolctl import threadpool_info

    from eada.strategies import PoolOutputs, get_strategy
    from eada.strategies.base import STRATEGIES, Selection, register

    seen: list[int] = []

    @register("_probe_threads", needs=(), summary="probe", reference="test")
    def probe(pool: PoolOutputs, budget: int, rng: np.random.Generator, **_: object) -> Selection:
        seen.extend(p["num_threads"] for p in threadpool_info())
        return Selection(indices=np.arange(budget), scores={})

    try:
        threads.set_threads(2)  # not the test's OMP_NUM_THREADS=1: the limit is applied
        get_strategy("_probe_threads").fn(
            PoolOutputs(energies=np.zeros((4, 2))), 1, np.random.default_rng(0)
        )
    finally:
        del STRATEGIES["_probe_threads"]
    assert seen and set(seen) == {2}


def test_run_applies_and_records_threads(tmp_path: Path, restore_threads) -> None:
    out = tmp_path / "run"
    sets = [a for s in TINY for a in ("--set", s)]
    assert main(["run", "toy", "--method", "eada", "--threads", "2", *sets, "--out", str(out)]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["threads"]["torch"] == 2 and meta["threads"]["selection"] == 2
    assert meta["threads"]["source"] == "--threads"
    assert read_jsonl(out / "runs.jsonl")[0]["results"]["threads"] == 2


def _append_many(path: str, worker: int) -> None:
    for i in range(40):
        append_jsonl(Path(path), {"worker": worker, "i": i, "pad": "x" * 5000})


def test_concurrent_appends_never_interleave(tmp_path: Path) -> None:
    log = tmp_path / "runs.jsonl"
    ctx = multiprocessing.get_context("fork")  # the children only append (no torch threads)
    procs = [ctx.Process(target=_append_many, args=(str(log), w)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    recs = read_jsonl(log)
    assert len(recs) == 120 and {(r["worker"], r["i"]) for r in recs} == {
        (w, i) for w in range(3) for i in range(40)
    }


def test_append_cuts_a_torn_last_line(tmp_path: Path) -> None:
    log = tmp_path / "runs.jsonl"
    append_jsonl(log, {"a": 1})
    with log.open("a") as fh:
        fh.write('{"a": 2, "b"')  # a writer killed mid-line
    append_jsonl(log, {"a": 3})
    assert [r["a"] for r in read_jsonl(log)] == [1, 3]


def test_bench_jobs_matches_one_process_and_resumes(tmp_path: Path, capsys) -> None:
    runs = bench.build_grid(["toy"], ["random", "eada"], [0, 1], TINY)
    one = bench.run_grid(runs, tmp_path / "one")
    two = tmp_path / "two"
    two.mkdir()
    first = (tmp_path / "one" / "runs.jsonl").read_text().splitlines()[0]
    (two / "runs.jsonl").write_text(first + "\n")  # a grid interrupted after one run
    sets = [a for s in TINY for a in ("--set", s)]
    args = ["bench", "toy", "--methods", "random,eada", "--seeds", "0-1", *sets, "--out", str(two)]
    assert main([*args, "--jobs", "2"]) == 0
    assert "EADA" in capsys.readouterr().out
    lines = read_jsonl(two / "runs.jsonl")
    assert len(lines) == 4 and len({r["key"] for r in lines}) == 4  # the first one not re-run
    assert {r["torch_threads"] for r in lines[1:]} == {1}
    assert {r["key"]: r["final"] for r in lines} == {r["key"]: r["final"] for r in one}

    def same(r: dict) -> list:  # what does not depend on timing: the losses, queries, energies
        snaps = [{**s, "seconds": None} for s in r["domain_stats"]["snapshots"]]
        stats = {**r["domain_stats"], "seconds": None, "snapshots": snaps}
        return [r["epochs"], [x.get("selected") for x in r["rounds"]], stats, r["best_epoch"]]

    assert {r["key"]: same(r) for r in lines} == {r["key"]: same(r) for r in one}
    assert main([*args, "--jobs", "0"]) == 2


def test_bench_workers_fork_and_keep_a_task_over_seeds(tmp_path: Path) -> None:
    """One thread a worker on Linux: forked workers (no imports again); a worker keeps its
    loaded task over seeds unless the data depend on the seed (toy)."""
    from eada.config import parse_config

    with pytest.MonkeyPatch.context() as mp:  # as documented, on a machine without CUDA
        mp.setattr(torch.cuda, "is_available", lambda: False)
        if sys.platform.startswith("linux"):
            assert bench.worker_start_method(1) == "fork"
        assert bench.worker_start_method(2) == "spawn"  # OpenMP pools do not survive a fork
    with pytest.MonkeyPatch.context() as mp:  # nor does a CUDA context
        mp.setattr(torch.cuda, "is_available", lambda: True)
        assert bench.worker_start_method(1) == "spawn"
    cache = bench._TaskCache()
    toy = [cache.get(r.config) for r in bench.build_grid(["toy"], ["random"], [0, 1], TINY)]
    assert toy[0] is not toy[1]  # the toy data depend on the seed
    for role in ("s", "t"):
        x = np.eye(4, dtype=np.float32)
        np.savez(tmp_path / f"{role}.npz", features=x, labels=np.array([0, 1, 0, 1]))
    data = {"kind": "features", "source": str(tmp_path / "s.npz")}
    data["target"] = str(tmp_path / "t.npz")
    feats = [cache.get(parse_config({"data": data, "seed": seed})) for seed in (0, 1)]
    assert feats[0] is feats[1]  # read once for both seeds


def _same_task(a, b) -> None:  # type: ignore[no-untyped-def]
    """``a`` and ``b`` hold the same domains (names, classes, inputs, labels) and notes."""
    assert a.notes == b.notes
    for role in ("source", "target", "heldout"):
        da, db = getattr(a, role), getattr(b, role)
        assert (da is None) == (db is None), role
        if da is None:
            continue
        assert (da.name, da.classes, da.input_shape) == (db.name, db.classes, db.input_shape)
        assert torch.equal(da.x, db.x) and torch.equal(da.y, db.y), role


@pytest.mark.parametrize(
    ("task", "sets"),
    [
        ("digits/mnist-usps", []),  # a held-out split too
        ("configs/office_caltech10_surf.yaml", ["train.epochs=2", "active.rounds_at=[1]"]),
    ],
)
def test_a_task_kept_over_seeds_is_the_one_a_fresh_load_gives(task: str, sets: list[str]) -> None:
    """A worker's task reused for another seed, after a run on it, is exactly what loading the
    task for that seed gives (only the toy data depend on the seed), on real data."""
    from eada.data.tasks import load_task
    from eada.experiment import run_once

    root = Path(__file__).resolve().parents[1]
    real_data("digits" if task.startswith("digits") else "office_caltech10_surf")
    if task.endswith(".yaml"):
        task = str(root / task)
    runs = bench.build_grid([task], ["eada"], [0, 3], sets)
    cache = bench._TaskCache()
    kept = cache.get(runs[0].config)
    if not task.startswith("digits"):  # a run on it (cheap here) must not change it
        run_once(runs[0].config, kept, record_stats=False)
    assert cache.get(runs[1].config) is kept
    cfg = runs[1].config
    fresh = load_task(cfg.data, cfg.seed, cfg.model)
    if "target_missing_classes" in kept.notes:
        fresh.check()  # what the run did to the notes (no class missing: no warning)
    _same_task(kept, fresh)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))
