"""The calibrated toy: its training is chosen by the first round's evidence (paper Fig. 5(a)),
the search's committed choice is the ``toy-calibrated`` preset, the demo runs it by default and
reproduces the search seed by seed, the old toy stays reachable."""

from __future__ import annotations

import importlib.util
import json
import math
import statistics
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from eada.demo import TRAINED_MAX_ANGLE, run_demo, source_trained
from eada.hparams import PRESETS, TOY_PRESETS, preset_config

REPO = Path(__file__).resolve().parents[1]
RECORD = REPO / "benchmarks" / "results" / "toy_calibration.json"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "toy_calibration", REPO / "benchmarks" / "toy_calibration.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _record() -> dict[str, Any]:
    return json.loads(RECORD.read_text())


def test_the_search_ran_the_two_baselines_only_and_its_choice_is_the_preset() -> None:
    cal = _script()
    rec = _record()
    search = rec["search"]
    assert search["seeds"] == list(range(10)) and search["threads"] == 1
    # stage T: the training, chosen by the first round's evidence on Source-only alone
    training = search["training"]
    assert [r["lr"] for r in training] == list(cal.LEARNING_RATES)
    for r in training:
        assert r["trained"] == source_trained(r["free_energy_gap"], r["boundary_angle"])
        assert {k for k, v in r.items() if isinstance(v, dict)} == {"source_only"}
    lr = cal.choose_lr(training)
    assert lr == min(r["lr"] for r in training if r["trained"])
    assert not next(r for r in training if r["lr"] == 0.1)["trained"]  # the images' rate
    # stages A and D: Source-only and Random only, at that rate
    rows = search["rows"]
    assert len(rows) >= 9 and all(r["lr"] == lr for r in rows)
    methods = {"source_only", "random", "first_round"}
    for row in rows:
        # no other method's numbers were measured, so none could enter the choice
        assert {k for k, v in row.items() if isinstance(v, dict)} == methods
        for m in ("source_only", "random"):
            assert row[m]["mean"] == pytest.approx(statistics.mean(row[m]["errors"]))
        want = math.hypot((row["source_only"]["mean"] - 52) / 6, (row["random"]["mean"] - 8.5) / 3)
        assert row["score"] == pytest.approx(want)
    chosen = cal.best(rows)
    assert cal.point_of(chosen) == {k: rec["chosen"][k] for k in cal.BASE}
    # the paper's two baselines in the band over the ten seeds, the source trained on each
    assert chosen["in_band"] and chosen["first_round"]["trained"]
    assert abs(chosen["source_only"]["mean"] - 52.0) <= 6.0 and chosen["source_only"]["std"] <= 8
    assert abs(chosen["random"]["mean"] - 8.5) <= 3.0
    # the preset is that point, the rest of the protocol the toy's
    cfg = preset_config("toy-calibrated", "eada", 0)
    base = preset_config("toy", "eada", 0, cal.overrides(cal.point_of(chosen)))
    assert cfg.data == base.data and cfg.train == base.train and cfg.active == base.active
    assert cfg.optim == base.optim and cfg.model == base.model
    assert PRESETS["toy-calibrated"]["name"] == "toy-calibrated" and TOY_PRESETS[0] == cfg.name


def test_the_search_helpers() -> None:
    cal = _script()
    # the target's Bayes error: Phi(-separation / (2 std))
    assert cal.bayes_error({"separation": 4.0, "std": 1.0}) == pytest.approx(2.275, abs=1e-3)
    assert cal.bayes_error({"separation": 8.0, "std": 2.0}) == pytest.approx(2.275, abs=1e-3)
    # the boundary shared by both domains: half the rotation off each domain's axis
    shared = cal.shared_boundary_error({"separation": 4.0, "std": 1.0, "rotation_deg": 90.0})
    assert shared == pytest.approx(7.865, abs=1e-3)  # Phi(-2 cos 45°)
    no_shift = {"separation": 4.0, "std": 1.0, "rotation_deg": 0.0}
    assert cal.shared_boundary_error(no_shift) == pytest.approx(cal.bayes_error(no_shift))
    assert cal.overrides({**cal.BASE, "epochs": 20, "lr": 1.0})[-3:] == [
        "optim.lr=1.0",
        "train.epochs=20",
        "active.rounds_at=[5, 10, 15]",
    ]
    assert cal.parse_seeds("0-4") == [0, 1, 2, 3, 4] and cal.parse_seeds("1,3") == [1, 3]
    trained = {"trained": True}
    far = {"in_band": True, "demo_seeds_in_band": True, "score": 0.9, "first_round": trained}
    near_but_out = {**far, "in_band": False, "score": 0.1}
    untrained = {**far, "score": 0.05, "first_round": {"trained": False}}
    assert cal.best([near_but_out, far, untrained]) is far  # trained and in band first
    with pytest.raises(SystemExit, match="no learning rate"):
        cal.choose_lr([{"lr": 0.1, "trained": False}])
    # the training criterion: every gap positive and every angle within the limit
    assert source_trained([0.5, 0.1], [1.0, TRAINED_MAX_ANGLE])
    assert not source_trained([0.5, -0.1], [1.0, 1.0])
    assert not source_trained([0.5, 0.1], [1.0, TRAINED_MAX_ANGLE + 0.1])
    assert not source_trained([], [])


def test_eada_demo_lands_on_the_papers_baselines(tmp_path: Path) -> None:
    # the demo's first three seeds reproduce the search's numbers seed by seed
    res = run_demo(seeds=3, out=tmp_path / "demo", methods=("source_only", "random"))
    assert res["preset"] == "toy-calibrated"
    so, rnd = res["strategies"]["source_only"], res["strategies"]["random"]
    rec = _record()
    chosen = next(
        r
        for r in rec["search"]["rows"]
        if all(r[k] == v for k, v in rec["chosen"].items() if k != "score")
    )
    for m, s in (("source_only", so), ("random", rnd)):
        assert s["errors"] == pytest.approx(chosen[m]["errors"][:3], abs=1e-6)
    # the first round's evidence, one value a seed, as the search measured it
    first = chosen["first_round"]
    assert so["free_energy_gap"] == pytest.approx(first["free_energy_gap"][:3], abs=1e-5)
    assert so["boundary_angle"] == pytest.approx(first["boundary_angle"][:3], abs=1e-4)
    assert all(g > 0 for g in so["free_energy_gap"])
    assert all(a <= TRAINED_MAX_ANGLE for a in so["boundary_angle"])
    # Random's model before its first round is Source-only's (no L_fea, the same batches)
    assert rnd["free_energy_gap"] == pytest.approx(so["free_energy_gap"])


def test_the_original_toy_stays_reachable(tmp_path: Path) -> None:
    res = run_demo(seeds=1, out=tmp_path / "old", methods=("random",), preset="toy")
    assert res["preset"] == "toy"
    assert res["protocol"]["data"]["separation"] == 7.0
    assert res["protocol"]["data"]["rotation_deg"] == 90.0
    with pytest.raises(ValueError, match="--preset must be one of toy-calibrated, toy"):
        run_demo(seeds=1, out=tmp_path / "x", preset="digits/mnist-usps")
