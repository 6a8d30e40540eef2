"""The Python API for experiments: ``eada.run``, ``eada.bench`` (the code of the commands) and
``eada.results`` (a DataFrame of a runs.jsonl)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import eada
from eada.cli import main
from eada.runs import read_jsonl
from support import kept_registries, surf_task, toy_overrides, write_plugin


def test_run_returns_the_records_of_eada_run_and_resumes(tmp_path: Path) -> None:
    """``eada.run`` writes what ``eada run`` writes (the same folder resumes under the
    command: nothing trained again) and returns one record a seed."""
    recs = eada.run("toy", method="random", seeds="0-1", overrides=toy_overrides(), out=tmp_path)
    assert [r["seed"] for r in recs] == [0, 1]
    assert all(r["config"]["active"]["strategy"] == "random" for r in recs)
    argv = ["run", "toy", "--method", "random", "--seeds", "0-1", "--out", str(tmp_path)]
    assert main([*argv, *(a for o in toy_overrides() for a in ("--set", o))]) == 0
    assert len(read_jsonl(tmp_path / "runs.jsonl")) == 2  # reused, not run again
    as_dict = {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in toy_overrides())}
    again = eada.run("toy", "random", [0, 1], as_dict, tmp_path)  # a dict of overrides
    assert [r["results"]["seconds"] for r in again] == [r["results"]["seconds"] for r in recs]
    df = eada.results(tmp_path)
    assert list(df["seed"]) == [0, 1] and set(df["strategy"]) == {"random"}
    assert df["target/accuracy"].between(0, 100).all() and (df["n_labeled"] == 10).all()


def test_bench_returns_the_grid_records_with_a_plugin(tmp_path: Path) -> None:
    """``eada.bench`` runs the grid of ``eada bench`` (its tables read the same folder), a
    plugin's strategy included; ``eada.results`` names the plugin."""
    with kept_registries():
        plug = write_plugin(tmp_path, "api_plug")
        task = surf_task(tmp_path, "t1")
        recs = eada.bench([task], "my_margin,random", 0, out=tmp_path / "g", plugins=[plug])
        assert [r["method"] for r in recs] == ["my_margin", "random"]
        assert main(["bench", task, "--out", str(tmp_path / "g"), "--table-only"]) == 0
        df = eada.results(tmp_path / "g" / "runs.jsonl")
        mine = df[df["method"] == "my_margin"].iloc[0]
        assert mine["plugins"].startswith("api_plug sha256:") and mine["status"] == "ok"
        assert df[df["method"] == "random"].iloc[0]["plugins"] == ""
        assert {"task", "seed", "target/accuracy", "worker", "config_sha"} <= set(df.columns)
    with pytest.raises(eada.bench.BenchError, match="1 of 1 runs failed") as info:
        eada.bench([surf_task(tmp_path, "bad", lr=1e30)], ["random"], 0, out=tmp_path / "b")
    assert info.value.failed[0]["status"] == "failed" and info.value.records == []


def test_results_without_pandas_says_which_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "runs.jsonl").write_text("")
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match=r"pip install 'eada\[dataframe\]'"):
        eada.results(tmp_path)
    monkeypatch.undo()
    with pytest.raises(FileNotFoundError, match=r"no runs\.jsonl"):
        eada.results(tmp_path / "nothing")


def test_import_eada_stays_light() -> None:
    """``import eada`` and naming ``eada.run``/``eada.results`` import no torch until used."""
    code = "import sys, eada; eada.__version__; assert 'torch' not in sys.modules, 'torch'"
    subprocess.run([sys.executable, "-c", code], check=True)
