"""A feature-row target grows: `eada target scan` registers the rows of a features file that
carry new ids (or, without ids, rows appended at its end), leaves out the rows whose id
vanished, refuses a changed row or a repeated id naming it, and never changes a registered
row: the target's z-score statistics are frozen at `eada init`."""

from __future__ import annotations

import csv
import json
import sqlite3
from pathlib import Path

import numpy as np
import torch
import yaml

from eada.cli import main
from eada.data.features import domain_statistics
from eada.store import Project
from support import real_data

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
SURF = SHARED_DATA / "office_caltech10_surf"


def _config(tmp_path: Path, source: Path, target: Path, normalize: str, **active: object) -> Path:
    raw = {
        "data": {
            "kind": "features",
            "source": str(source),
            "target": str(target),
            "normalize": normalize,
        },
        "model": {"name": "mlp", "hidden": [16]},
        "train": {"epochs": 3, "batch_size": 32},
        "active": {"rounds_at": [1, 2], "budget_per_round": 4, **active},
    }
    (tmp_path / "F.yaml").write_text(yaml.safe_dump(raw))
    return tmp_path / "F.yaml"


def _synthetic(tmp_path: Path, n: int = 40, ids: bool = True) -> dict[str, object]:
    """Three Gaussian classes in 32-d (float rows: the z-score sums are not exact), a source
    with labels and an unlabeled target of ``n`` rows (ids ``t0``..)."""
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 3, (3, 32))
    ys = np.repeat(np.arange(3), 20)
    xs = centres[ys] + rng.normal(0, 1, (60, 32))
    yt = rng.integers(0, 3, 60)
    xt = (centres[yt] + rng.normal(0, 1, (60, 32)) + 0.5).astype(np.float32)
    np.savez(tmp_path / "src.npz", fts=xs, labels=ys)
    target = tmp_path / "tgt.npz"
    _write(target, xt[:n], [f"t{i}" for i in range(n)] if ids else None)
    return {"source": tmp_path / "src.npz", "target": target, "x": xt, "y": yt}


def _write(path: Path, x: np.ndarray, ids: list[str] | None) -> None:
    if ids is None:
        np.savez(path, fts=x)
    else:
        np.savez(path, fts=x, ids=np.array(ids))


def _target_rows(store: str) -> dict[str, torch.Tensor]:
    """The model-ready target rows by external id."""
    proj = Project(store)
    x = proj.task.target.x.clone()
    ext = dict(
        proj.store.conn.execute(
            "SELECT s.position, i.external_id FROM samples s JOIN sample_info i "
            "ON i.sample_id = s.id WHERE s.role = 'target' AND s.position >= 0"
        ).fetchall()
    )
    proj.close()
    return {ext[p]: x[p] for p in range(len(x))}


def _ids(store: str) -> dict[str, int]:
    """``{external id: sample id}`` of every registered target row (left out ones too)."""
    with sqlite3.connect(Path(store) / "eada.sqlite") as c:
        return dict(c.execute("SELECT external_id, sample_id FROM sample_info").fetchall())


def _dump(store: str) -> list[str]:
    with sqlite3.connect(Path(store) / "eada.sqlite") as c:
        return list(c.iterdump())


def _label(csv_file: Path, truth: dict[str, str], out: Path) -> Path:
    """The round's CSV with its label column filled from ``truth`` (by external id)."""
    with open(csv_file, newline="") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        r["label"] = truth[r["external_id"]]
    with open(out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return out


def _selected(store: str, number: int) -> list[int]:
    proj = Project(store)
    rnd = next(r for r in proj.store.rounds() if r["number"] == number)
    out = [r["sample_id"] for r in proj.store.selected(rnd["id"])]
    proj.close()
    return out


def test_scan_registers_rows_with_new_ids_and_never_changes_a_registered_row(
    tmp_path: Path, capsys
) -> None:
    d = _synthetic(tmp_path)
    x: np.ndarray = d["x"]  # type: ignore[assignment]
    target: Path = d["target"]  # type: ignore[assignment]
    truth = {f"t{i}": str(int(v)) for i, v in enumerate(d["y"])}  # type: ignore[arg-type]
    truth.update({f"n{i}": str(int(v)) for i, v in enumerate(d["y"])})  # type: ignore[arg-type]
    store = str(tmp_path / "P")
    s = ["--store", store]
    cfg = _config(tmp_path, d["source"], target, "zscore", alpha1=1.0)  # type: ignore[arg-type]
    assert main(["init", *s, "--config", str(cfg)]) == 0
    stats = Project(store).store.get_json("target_statistics")
    assert stats == domain_statistics(x[:40], "zscore")  # frozen at init, recorded
    assert main(["train", *s]) == 0 and main(["query", *s]) == 0
    round1 = tmp_path / "P" / "exports" / "round-001.csv"
    assert main(["label", "import", str(_label(round1, truth, tmp_path / "l1.csv")), *s]) == 0
    before, ids_before = _target_rows(store), _ids(store)
    # the file gains 10 rows with new ids, interleaved, shifted far: the whole file's own
    # mean/std would move every registered row
    order = [*(f"t{i}" for i in range(20)), *(f"n{i}" for i in range(5))]
    order += [*(f"t{i}" for i in range(20, 40)), *(f"n{i}" for i in range(5, 10))]
    rows = {**{f"t{i}": x[i] for i in range(40)}, **{f"n{i}": x[40 + i] + 4 for i in range(10)}}
    # (column-major now: the frozen statistics do not depend on the file's memory layout)
    _write(target, np.asfortranarray(np.stack([rows[k] for k in order])), order)
    capsys.readouterr()
    assert main(["train", *s]) == 0  # trains on the registered rows, names the command
    err = " ".join(capsys.readouterr().err.split())
    assert f"10 new target row(s) in {target} not registered (first id: n0)" in err
    assert f"run `eada target scan --store {store}`" in err
    assert Project(store).status()["n_target"] == 40
    assert main(["target", "scan", *s]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "10 new row(s) registered, 0 returned, 0 vanished" in out
    assert "the pool holds 50 samples" in out
    ids_after = _ids(store)
    assert {k: ids_after[k] for k in ids_before} == ids_before  # ids stay stable
    assert sorted(set(ids_after) - set(ids_before)) == sorted(f"n{i}" for i in range(10))
    assert min(ids_after[f"n{i}"] for i in range(10)) > max(ids_before.values())
    after = _target_rows(store)
    assert all(torch.equal(after[k], before[k]) for k in before)  # bit-identical
    mean, std = np.array(stats["mean"], np.float32), np.array(stats["std"], np.float32)
    assert torch.equal(after["n3"], torch.from_numpy((x[43] + 4 - mean) / (std + 1e-8)))
    proj = Project(store)
    assert proj.pool_note() is None and proj.status()["pool"]["scans"][-1]["new"] == 10
    proj.close()
    # a query after the scan picks new rows: 46 unlabeled, 36 of them old, a budget of 40
    assert main(["query", *s, "--budget", "40"]) == 0
    new_ids = {ids_after[f"n{i}"] for i in range(10)}
    assert len(new_ids & set(_selected(store, 2))) >= 4
    round2 = tmp_path / "P" / "exports" / "round-002.csv"
    with open(round2, newline="") as fh:
        assert {r["external_id"] for r in csv.DictReader(fh)} & {f"n{i}" for i in range(10)}
    # vanished ids: refused by train and query until the scan leaves them out
    assert main(["label", "import", str(_label(round2, truth, tmp_path / "l2.csv")), *s]) == 0
    picked = set(_selected(store, 1)) | set(_selected(store, 2))
    gone = [k for k in order if ids_after[k] not in picked][:2]
    kept = [k for k in order if k not in gone]
    _write(target, np.stack([rows[k] for k in kept]), kept)
    capsys.readouterr()
    assert main(["train", *s]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"2 registered target row(s) vanished from {target} (first id: {gone[0]})" in err
    assert f"`eada target scan --store {store}`" in err
    assert main(["target", "scan", *s]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "0 new row(s) registered, 0 returned, 2 vanished (left out of the pool)" in out
    assert f"vanished: {gone[0]}" in out
    proj = Project(store)
    assert proj.status()["pool"]["left_out"] == 2 and proj.status()["n_target"] == 48
    proj.close()
    assert all(torch.equal(v, after[k]) for k, v in _target_rows(store).items())
    assert main(["train", *s]) == 0
    # a vanished id that comes back gets its old sample id again
    _write(target, np.stack([rows[k] for k in [*kept, gone[1]]]), [*kept, gone[1]])
    assert main(["target", "scan", *s]) == 0
    assert "0 new row(s) registered, 1 returned" in capsys.readouterr().out
    assert _ids(store) == ids_after
    assert torch.equal(_target_rows(store)[gone[1]], after[gone[1]])


def test_bad_row_files_exit_2_and_change_nothing(tmp_path: Path, capsys) -> None:
    d = _synthetic(tmp_path)
    x: np.ndarray = d["x"]  # type: ignore[assignment]
    target: Path = d["target"]  # type: ignore[assignment]
    store = str(tmp_path / "P")
    s = ["--store", store]
    cfg = _config(tmp_path, d["source"], target, "l1_zscore")  # type: ignore[arg-type]
    assert main(["init", *s, "--config", str(cfg)]) == 0
    ids = [f"t{i}" for i in range(40)]
    snapshot = _dump(store)
    cases = {
        # a registered id whose row changed, next to a new one
        "changed (first id: 't7')": (
            np.concatenate([x[:7], x[7:8] * 1.001, x[8:41]]),
            [*ids, "n0"],
        ),
        # two rows under one id
        "ids are not unique (1 repeated, first: 'n0')": (x[:42], [*ids, "n0", "n0"]),
        # the ids array is gone
        "has no ids now": (x[:41], None),
    }
    for message, (rows, row_ids) in cases.items():
        _write(target, rows, row_ids)
        capsys.readouterr()
        assert main(["target", "scan", *s]) == 2, message
        err = " ".join(capsys.readouterr().err.split())
        assert err.startswith("error:") and message in err and str(target) in err, err
        assert _dump(store) == snapshot  # nothing changed
        if "changed" in message:  # train refuses the changed row too, naming its id
            assert main(["train", *s]) == 2
            assert "differ from what was registered (first: sample 68 (id 't7'))" in (
                capsys.readouterr().err
            )
            assert _dump(store) == snapshot
    _write(target, x[:40], ids)
    assert main(["train", *s]) == 0  # the project goes on with the registered rows


def test_a_file_without_ids_grows_by_appended_rows_only(tmp_path: Path, capsys) -> None:
    d = _synthetic(tmp_path, n=30, ids=False)
    x: np.ndarray = np.abs(d["x"])  # type: ignore[call-overload]
    target: Path = d["target"]  # type: ignore[assignment]
    _write(target, np.asfortranarray(x[:30]), None)  # column-major, as MATLAB writes
    store = str(tmp_path / "P")
    s = ["--store", store]
    cfg = _config(tmp_path, d["source"], target, "l1_zscore")  # type: ignore[arg-type]
    assert main(["init", *s, "--config", str(cfg)]) == 0
    proj = Project(store)
    before = proj.task.target.x.clone()
    with proj.store.transaction() as c:  # as a store made before statistics were recorded
        c.execute("DELETE FROM meta WHERE key = 'target_statistics'")
    proj.close()
    _write(target, x[:35], None)
    capsys.readouterr()
    assert main(["train", *s]) == 0
    assert "5 new target row(s)" in capsys.readouterr().err
    assert main(["target", "scan", *s]) == 0
    assert "5 new row(s) registered" in capsys.readouterr().out
    proj = Project(store)
    assert torch.equal(proj.task.target.x[:30], before) and len(proj.task.target) == 35
    # the first scan recorded the registered rows' statistics (those of init)
    stats = domain_statistics(np.asfortranarray(x[:30]), "l1_zscore")
    assert proj.store.get_json("target_statistics") == stats
    assert stats != domain_statistics(np.ascontiguousarray(x[:30]), "l1_zscore")
    proj.close()
    snapshot = _dump(store)
    for rows, message in (
        (x[:34], f"{target} has 34 rows but 35 were registered"),
        (np.concatenate([x[:3] + 1, x[3:36]]), "3 registered row(s) of"),
    ):
        _write(target, rows, None)
        capsys.readouterr()
        assert main(["target", "scan", *s]) == 2
        assert message in " ".join(capsys.readouterr().err.split())
        assert _dump(store) == snapshot


def test_surf_rows_grow_with_frozen_statistics(tmp_path: Path, capsys) -> None:
    """Office-Caltech10 SURF webcam (295 rows) split into an initial file of 200 rows and the
    extended file of all 295; amazon as the source; ``l1_zscore``."""
    real_data("office_caltech10_surf")
    from scipy.io import loadmat

    w = loadmat(SURF / "webcam_SURF_L10.mat")
    x, y = w["fts"], w["labels"].ravel()
    ids = [f"w{i}" for i in range(len(x))]
    truth = {k: str(int(v)) for k, v in zip(ids, y, strict=True)}
    target = tmp_path / "webcam.npz"
    _write(target, x[:200], ids[:200])
    store = str(tmp_path / "P")
    s = ["--store", store]
    cfg = _config(tmp_path, SURF / "amazon_SURF_L10.mat", target, "l1_zscore", alpha1=1.0)
    assert main(["init", *s, "--config", str(cfg)]) == 0
    assert main(["train", *s]) == 0 and main(["query", *s]) == 0
    round1 = tmp_path / "P" / "exports" / "round-001.csv"
    assert main(["label", "import", str(_label(round1, truth, tmp_path / "l1.csv")), *s]) == 0
    before, ids_before = _target_rows(store), _ids(store)
    snapshot = _dump(store)
    changed = x.astype(np.float32)
    changed[5, 0] += 1  # one more visual word in w5: a changed registered row
    for rows, message in (
        (changed, "changed (first id: 'w5')"),
        (np.hstack([x, x[:, :1]]), "has 801 feature columns but its rows were registered"),
    ):
        _write(target, rows, ids)
        capsys.readouterr()
        assert main(["target", "scan", *s]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert message in err and str(target) in err, err
        assert _dump(store) == snapshot
    _write(target, x, ids)
    capsys.readouterr()
    assert main(["target", "scan", *s]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "95 new row(s) registered" in out and "the pool holds 295 samples" in out
    ids_after = _ids(store)
    assert sorted(set(ids_after) - set(ids_before)) == sorted(ids[200:])
    assert {k: ids_after[k] for k in ids_before} == ids_before
    after = _target_rows(store)
    assert all(torch.equal(after[k], before[k]) for k in before)  # bit-identical
    # the whole file's own statistics differ: without freezing, the old rows would move
    moved = Project(store).store.get_json("target_statistics") != domain_statistics(x, "l1_zscore")
    assert moved
    # the next round scores the grown pool (291 unlabeled, 196 old) and picks new rows
    assert main(["train", *s]) == 0 and main(["query", *s, "--budget", "200"]) == 0
    proj = Project(store)
    rnd = proj.store.rounds()[-1]
    scored = {
        r[0]
        for r in proj.store.conn.execute(
            "SELECT sample_id FROM round_samples WHERE round_id = ?", (rnd["id"],)
        )
    }
    proj.close()
    new = {ids_after[k] for k in ids[200:]}
    assert new <= scored and len(new & set(_selected(store, 2))) >= 4
    # a vanished row (never queried) is left out of the pool
    picked = set(_selected(store, 1)) | set(_selected(store, 2))
    gone = next(k for k in ids if ids_after[k] not in picked)
    keep = [i for i, k in enumerate(ids) if k != gone]
    _write(target, x[keep], [ids[i] for i in keep])
    assert main(["target", "scan", *s]) == 0
    assert "1 vanished (left out of the pool)" in capsys.readouterr().out
    st = Project(store).status()
    assert st["n_target"] == 294 and st["pool"]["left_out"] == 1
    assert json.dumps(st)  # status stays JSON-ready
