"""A run's identity is its resolved config and its data (issue 23, part 1): a stored result is
reused only for the same config and the same data, and keeps its own meta."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from eada import bench
from eada.cli import main
from eada.data.identity import data_inputs, file_digest
from eada.runs import OtherDataError, config_differences, read_jsonl


def _features(folder: Path, seed: int, n: int = 45, d: int = 5, only: str = "") -> None:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for name, shift in (("src", 0.0), ("tgt", 0.5)):
        if only and name != only:
            continue
        y = np.arange(n) % 3
        x = rng.normal(size=(n, d)) + 3.0 * (y[:, None] == np.arange(d)[None, :]) + shift
        np.savez(folder / f"{name}.npz", features=x.astype(np.float32), labels=y)


def _config(path: Path) -> Path:
    """A feature config whose data paths are relative (to the config file's folder)."""
    raw = {
        "name": "feat",
        "data": {"kind": "features", "source": "data/src.npz", "target": "data/tgt.npz"},
        "train": {"epochs": 2, "batch_size": 8},
        "active": {"strategy": "random", "rounds_at": [1], "budget_per_round": 3},
    }
    path.write_text(yaml.safe_dump(raw))
    return path


def _run(cfg: Path, out: Path, *extra: str) -> int:
    return main(["run", str(cfg), "--seeds", "0", "--out", str(out), "--threads", "1", *extra])


def test_changed_data_is_not_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The target .npz overwritten with other data, the same command into the same folder:
    refused (exit 2) naming the target file; the stored record is left as it was."""
    monkeypatch.chdir(tmp_path)
    _features(tmp_path / "data", seed=0)
    cfg, out = _config(tmp_path / "feat.yaml"), tmp_path / "out"
    assert _run(cfg, out) == 0
    rec = read_jsonl(out / "runs.jsonl")[0]
    target = str((tmp_path / "data" / "tgt.npz").resolve())
    assert rec["inputs"]["target"]["path"] == target
    assert rec["inputs"]["target"]["digest"] == file_digest(tmp_path / "data" / "tgt.npz")
    assert rec["meta"]["command"] and rec["meta"]["time_utc"]
    before = {f: (out / f).read_bytes() for f in ("runs.jsonl", "meta.json", "results.json")}
    # the same data: reused, saying so, and nothing rewritten (meta keeps the maker's commit)
    capsys.readouterr()
    assert _run(cfg, out) == 0
    err = capsys.readouterr().err
    assert f"reused 1 run made at {rec['meta']['time_utc']} by commit" in err
    assert {f: (out / f).read_bytes() for f in before} == before
    # other data under the same name
    _features(tmp_path / "data", seed=1, only="tgt")
    assert _run(cfg, out) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "made on other data" in err and target in err
    assert "(content changed)" in err and "src.npz" not in err  # only the target differs
    assert "--out" in err
    assert {f: (out / f).read_bytes() for f in before} == before


def test_same_yaml_from_another_folder_names_other_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same YAML in another folder: its relative paths (read against the config file's
    folder) name other data, so a run into the same output folder is refused; the working
    folder does not matter."""
    _features(tmp_path / "a" / "data", seed=0)
    _features(tmp_path / "b" / "data", seed=1)
    cfg_a = _config(tmp_path / "a" / "feat.yaml")
    cfg_b = tmp_path / "b" / "feat.yaml"
    cfg_b.write_bytes(cfg_a.read_bytes())
    out = tmp_path / "out"
    monkeypatch.chdir(tmp_path / "b")  # the working folder names other data: not used
    assert _run(cfg_a, out) == 0
    rec = read_jsonl(out / "runs.jsonl")[0]
    assert rec["inputs"]["source"]["path"] == str((tmp_path / "a" / "data" / "src.npz").resolve())
    capsys.readouterr()
    assert _run(cfg_a, out) == 0  # the same file from anywhere: the same data, reused
    assert "reused 1 run" in capsys.readouterr().err
    assert _run(cfg_b, out) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "a" / "data" / "src.npz") in err
    assert str(tmp_path / "b" / "data" / "src.npz") in err
    assert len(read_jsonl(out / "runs.jsonl")) == 1
    # the paths are part of the resolved config: even the same bytes there are refused
    _features(tmp_path / "b" / "data", seed=0)
    assert _run(cfg_b, out) == 2
    assert "use another --out" in capsys.readouterr().err
    assert len(read_jsonl(out / "runs.jsonl")) == 1


def test_a_record_lacking_a_key_is_compared_with_what_the_old_code_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``train.forward`` removed from a record: the record ran ``separate`` (the only forward
    pass before the key existed), so ``--set train.forward=fused`` is refused; a key with no
    known old value is refused whatever is asked."""
    monkeypatch.chdir(tmp_path)
    _features(tmp_path / "data", seed=0)
    cfg, out = _config(tmp_path / "feat.yaml"), tmp_path / "out"
    assert _run(cfg, out) == 0
    rec = read_jsonl(out / "runs.jsonl")[0]
    del rec["config"]["train"]["forward"]
    (out / "runs.jsonl").write_text(json.dumps(rec) + "\n")
    capsys.readouterr()
    assert _run(cfg, out, "--set", "train.forward=fused") == 2
    err = capsys.readouterr().err
    assert "train.forward: 'separate' (before the key existed) -> 'fused'" in err
    assert _run(cfg, out) == 0  # what the record ran: reused
    assert "reused 1 run" in capsys.readouterr().err
    del rec["config"]["train"]["eval_every"]  # no known old value: refused
    (out / "runs.jsonl").write_text(json.dumps(rec) + "\n")
    assert _run(cfg, out) == 2
    assert "train.eval_every: not in the stored record" in capsys.readouterr().err


def test_config_differences_of_missing_keys() -> None:
    assert config_differences({"model": {}}, {"model": {"bottleneck_dim": None}}) == []
    assert config_differences({"active": {}}, {"active": {"params": {}}}) == []
    assert config_differences({"active": {}}, {"active": {"params": {"k": 2}}}) == [
        "active.params.k: not in the stored record (made before the key existed?) -> 2"
    ]


def test_bench_refuses_other_data_and_records_without_a_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`eada bench` shares the rule: changed data and old lines (no ``inputs``) of file data
    are refused, naming the way to start afresh; toy lines (no files) are still resumed."""
    monkeypatch.chdir(tmp_path)
    _features(tmp_path / "data", seed=0)
    _config(tmp_path / "feat.yaml")
    out = tmp_path / "bench"
    grid = bench.build_grid(["feat.yaml"], ["random"], [0], ["train.epochs=2"])
    first = bench.run_grid(grid, out)
    assert first[0]["inputs"] == data_inputs(grid[0].config.data)
    assert first[0]["code"]["command"]
    said: list[str] = []
    assert bench.run_grid(grid, out, progress=said.append) == first
    assert any(s.startswith("reused 1 run made at") for s in said)
    old = {k: v for k, v in first[0].items() if k != "inputs"}  # a line of the old code
    (out / "runs.jsonl").write_text(json.dumps(old) + "\n")
    with pytest.raises(OtherDataError, match=r"not recorded .*use another --out"):
        bench.run_grid(grid, out)
    (out / "runs.jsonl").write_text(json.dumps(first[0]) + "\n")
    _features(tmp_path / "data", seed=2)
    with pytest.raises(OtherDataError, match=r"tgt\.npz"):
        bench.run_grid(grid, out)
    # toy data: nothing in files, an old line resumes
    toy = bench.build_grid(
        ["toy"], ["random"], [0], ["train.epochs=2", "active.rounds_at=[1]", "data.n_per_class=60"]
    )
    toy_out = tmp_path / "toy"
    rec = bench.run_grid(toy, toy_out)[0]
    assert rec["inputs"] == {}
    (toy_out / "runs.jsonl").write_text(json.dumps({**rec, "inputs": None}) + "\n")
    assert len(bench.run_grid(toy, toy_out)) == 1
    assert len(read_jsonl(toy_out / "runs.jsonl")) == 1  # nothing trained again


def test_digests_are_cached_by_path_size_and_mtime(tmp_path: Path) -> None:
    import os

    f = tmp_path / "x.npz"
    f.write_bytes(b"a" * 10)
    d1 = file_digest(f)
    f.write_bytes(b"b" * 10)  # same size; a new mtime
    os.utime(f, ns=(1, 1))
    d2 = file_digest(f)
    assert d1 != d2
