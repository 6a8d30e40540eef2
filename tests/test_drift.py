"""The slow-drift warning (``eada.energy.alignment_drift``): fires on a recorded drift of the
paper's loss, stays silent on the default and on a healthy fall of Delta; recorded in the run
and shown in the report. And ``data.keep_classes`` (two-class tasks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eada.config import ConfigError, load_config
from eada.data.base import TensorDomain
from eada.data.tasks import keep_classes, load_task
from eada.energy import AlignmentDriftWarning, alignment_drift
from eada.hparams import preset_config
from eada.train import ActiveDATrainer
from support import real_data

# Per-epoch means (Delta, source NLL) of committed runs, seed 0, 4 significant digits:
# SURF dslr->amazon with the paper's loss (benchmarks/results/caltech_surf/D-A/eada; target
# accuracy peaks at 47.5 % (epoch 25) and ends at 44.7 %) ...
PAPER_D_A = (
    [
        -2.337,
        -2.593,
        -3.098,
        -3.654,
        -4.12,
        -4.506,
        -4.931,
        -5.34,
        -5.682,
        -6.027,
        -6.201,
        -6.445,
        -6.557,
        -6.784,
        -6.972,
        -7.16,
        -7.407,
        -7.584,
        -7.725,
        -7.921,
        -8.192,
        -8.484,
        -8.747,
        -9.038,
        -9.389,
        -9.67,
        -9.826,
        -10.23,
        -10.47,
        -10.76,
        -11.07,
        -11.37,
        -11.67,
        -12.02,
        -12.3,
        -12.47,
        -12.93,
        -13.14,
        -13.58,
        -13.86,
        -14.29,
        -14.62,
        -14.95,
        -15.25,
        -15.91,
        -16.07,
        -16.48,
        -16.88,
        -17.18,
        -17.64,
    ],
    [
        1.769,
        0.8318,
        0.3571,
        0.163,
        0.08285,
        0.04768,
        0.0297,
        0.01989,
        0.01419,
        0.0107,
        0.00895,
        0.007181,
        0.005843,
        0.004726,
        0.003993,
        0.003497,
        0.002946,
        0.002502,
        0.002192,
        0.001932,
        0.001696,
        0.001407,
        0.001259,
        0.001113,
        0.001003,
        0.0009822,
        0.0009002,
        0.0008275,
        0.0007815,
        0.0007429,
        0.0006799,
        0.000677,
        0.0006482,
        0.0006229,
        0.0006469,
        0.0006413,
        0.0006064,
        0.0006095,
        0.0006019,
        0.0005885,
        0.0006131,
        0.0006146,
        0.0006091,
        0.0005944,
        0.0005778,
        0.0006601,
        0.0005826,
        0.0006228,
        0.0006186,
        0.0006393,
    ],
)
# ... the same task with the default (benchmarks/results/alignment/surf/D-A; ends at 53.0 %) ...
NORMALIZED_D_A = (
    [
        -2.356,
        -2.659,
        -3.224,
        -3.617,
        -3.652,
        -3.675,
        -3.687,
        -3.705,
        -3.716,
        -3.722,
        -3.698,
        -3.703,
        -3.688,
        -3.68,
        -3.681,
        -3.654,
        -3.633,
        -3.635,
        -3.618,
        -3.623,
        -3.638,
        -3.62,
        -3.619,
        -3.618,
        -3.621,
        -3.608,
        -3.608,
        -3.627,
        -3.611,
        -3.619,
        -3.598,
        -3.619,
        -3.603,
        -3.616,
        -3.602,
        -3.592,
        -3.606,
        -3.604,
        -3.59,
        -3.604,
        -3.598,
        -3.609,
        -3.596,
        -3.586,
        -3.59,
        -3.6,
        -3.595,
        -3.585,
        -3.568,
        -3.587,
    ],
    [
        1.769,
        0.8314,
        0.3565,
        0.1625,
        0.08276,
        0.04767,
        0.02973,
        0.01997,
        0.01434,
        0.01095,
        0.009418,
        0.008191,
        0.006926,
        0.005711,
        0.004853,
        0.004191,
        0.003422,
        0.002888,
        0.00254,
        0.002167,
        0.001926,
        0.001731,
        0.001584,
        0.001417,
        0.001307,
        0.00123,
        0.001152,
        0.001087,
        0.001005,
        0.0009506,
        0.0009143,
        0.0008772,
        0.0008233,
        0.000797,
        0.0007701,
        0.0007376,
        0.0007056,
        0.0006854,
        0.0006506,
        0.0006374,
        0.0006055,
        0.0006094,
        0.0005752,
        0.0005689,
        0.000551,
        0.0005279,
        0.0005193,
        0.000507,
        0.0004922,
        0.0004878,
    ],
)
# ... and Caltech10->webcam with the paper's loss, where Delta also falls steadily but with the
# source fit (the NLL falls 2.16 -> 0.0027) and the loss gains 4.0 points (ends at its peak 58.0)
PAPER_C_W = (
    [
        -2.314,
        -2.343,
        -2.439,
        -2.568,
        -2.684,
        -2.836,
        -2.975,
        -3.14,
        -3.304,
        -3.427,
        -3.549,
        -3.715,
        -3.833,
        -3.98,
        -4.14,
        -4.283,
        -4.426,
        -4.644,
        -4.813,
        -5.06,
        -5.234,
        -5.507,
        -5.658,
        -5.899,
        -6.154,
        -6.421,
        -6.71,
        -6.936,
        -7.165,
        -7.511,
        -7.673,
        -7.906,
        -8.172,
        -8.451,
        -8.667,
        -8.862,
        -9.181,
        -9.479,
        -9.575,
        -9.823,
        -10.07,
        -10.31,
        -10.55,
        -10.74,
        -10.91,
        -11.15,
        -11.3,
        -11.56,
        -11.81,
        -11.99,
    ],
    [
        2.162,
        1.736,
        1.414,
        1.161,
        0.9567,
        0.788,
        0.6471,
        0.5313,
        0.4318,
        0.3484,
        0.283,
        0.233,
        0.1879,
        0.1524,
        0.1229,
        0.09993,
        0.08009,
        0.06536,
        0.0537,
        0.04451,
        0.03683,
        0.03073,
        0.02593,
        0.0221,
        0.01906,
        0.01664,
        0.01464,
        0.01288,
        0.01146,
        0.01032,
        0.009234,
        0.008416,
        0.007665,
        0.007037,
        0.00648,
        0.005991,
        0.005572,
        0.005154,
        0.004842,
        0.004548,
        0.00425,
        0.004034,
        0.003811,
        0.003594,
        0.003405,
        0.00325,
        0.00309,
        0.002947,
        0.002807,
        0.002692,
    ],
)


def _first_fire(series: tuple[list[float], list[float]]) -> int | None:
    """The first epoch (1-based) at which the rule fires when fed epoch by epoch."""
    deltas, nlls = series
    assert len(deltas) == len(nlls) == 50
    for k in range(1, len(deltas) + 1):
        if alignment_drift(deltas[:k], nlls[:k]) is not None:
            return k
    return None


def test_drift_of_the_paper_loss_is_found_on_dslr_amazon() -> None:
    assert _first_fire(PAPER_D_A) == 39
    msg = alignment_drift(PAPER_D_A[0][:39], PAPER_D_A[1][:39])
    assert msg is not None
    assert msg.startswith("Delta fell in 10 of the last 10 epochs, -10.5 -> -13.6 (-30%)")
    assert "0.000781 -> 0.000602" in msg


def test_default_and_a_healthy_fall_stay_silent() -> None:
    assert _first_fire(NORMALIZED_D_A) is None  # bounded Delta
    assert _first_fire(PAPER_C_W) is None  # Delta falls with the source fit


def test_each_condition_is_needed() -> None:
    d = [-10.0 - 0.4 * k for k in range(11)]  # falls 4 nats (40 %) in every epoch
    flat = [0.001] * 11
    assert alignment_drift(d, flat) is not None
    assert alignment_drift(d[:10], flat[:10]) is None  # less than a window
    assert alignment_drift(d, [0.001 * 0.9**k for k in range(11)]) is None  # NLL x0.35
    wobbly = [v + (0.9 if k % 2 else 0.0) for k, v in enumerate(d)]  # falls in 5 of 10
    assert alignment_drift(wobbly, flat) is None
    small = [-1.0 - 0.05 * k for k in range(11)]  # 50 % of a two-class Delta, 0.5 nats
    assert alignment_drift(small, flat) is None
    assert alignment_drift(small, flat, min_fall=0.4) is not None
    with pytest.raises(ValueError, match="deltas but"):
        alignment_drift(d, flat[:5])
    with pytest.raises(ValueError, match="min_falls"):
        alignment_drift(d, flat, min_falls=11)


def _fires_from(n: int):
    def fake(deltas, nlls, unit="epochs", remedy=""):
        return f"drift after {len(deltas)} {unit}" if len(deltas) >= n else None

    return fake


def test_drift_is_recorded_once_shown_and_kept_in_the_report(monkeypatch, tmp_path: Path) -> None:
    from eada import energy
    from eada.experiment import run_seeds
    from eada.reports.html import build_report

    monkeypatch.setattr(energy, "alignment_drift", _fires_from(2))
    extra = ["train.epochs=3", "active.rounds_at=[1]", "data.n_per_class=40"]
    lines: list[str] = []
    tr = ActiveDATrainer(
        preset_config("toy", "eada", 0, extra),
        load_task(preset_config("toy", "eada", 0, extra).data, 0),
    )
    res = tr.run(lines.append)
    msg = "drift after 2 epochs"
    assert res.warnings == [{"kind": "alignment_drift", "epoch": 2, "message": msg}]  # once
    assert f"warning (epoch 2): {msg}" in lines
    assert all("loss_source" in h for h in tr.alignment_log)
    # without a progress callback: a Python warning; the run record and the report keep it
    with pytest.warns(AlignmentDriftWarning, match=f"epoch 2: {msg}"):
        summary = run_seeds(lambda s: preset_config("toy", "eada", s, extra), [0], tmp_path / "run")
    assert [w["kind"] for w in summary["warnings"]] == ["alignment_drift"]
    html = build_report(tmp_path / "run", tmp_path / "r.html").read_text()
    assert "Training warnings" in html and f"warning (seed 0, epoch 2): {msg}" in html


def test_old_log_entries_without_the_nll_are_skipped() -> None:
    from eada.train.loop import record_alignment_drift

    d, n = PAPER_D_A[0][:39], PAPER_D_A[1][:39]
    log = [{"delta": a, "loss_align": 1.0, "loss_source": b} for a, b in zip(d, n, strict=True)]
    found: list[dict] = []
    assert record_alignment_drift(log, found, {"epoch": 39}) is not None
    assert record_alignment_drift(log, found, {"epoch": 40}) is None  # once a model
    old = [{"delta": a, "loss_align": 1.0} for a in d]  # a checkpoint from before the NLL
    assert record_alignment_drift(old, [], {"epoch": 39}) is None


# -- data.keep_classes ---------------------------------------------------------------------


def test_keep_classes_relabels_and_drops() -> None:
    d = TensorDomain(
        "d", torch.arange(6.0)[:, None], torch.tensor([0, 3, 8, 3, 1, 8]), list("0123456789")
    )
    two = keep_classes(d, [8, 3])
    assert two.y.tolist() == [1, 0, 1, 0] and two.classes == ["8", "3"]
    assert two.x[:, 0].tolist() == [1.0, 2.0, 3.0, 5.0]
    with pytest.raises(ValueError, match=r"keep_classes \[3, 10\].*10 classes"):
        keep_classes(d, [3, 10])


@pytest.mark.parametrize(
    "value, problem",
    [("[3]", "at least 2"), ("[3, 3]", "repeated"), ("[-1, 2]", ">= 0"), ("three", "list")],
)
def test_keep_classes_is_validated(value: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        load_config("configs/office_caltech10_surf.yaml", [f"data.keep_classes={value}"])


def test_keep_classes_on_surf_features() -> None:
    surf = real_data("office_caltech10_surf")
    cfg = load_config(
        "configs/office_caltech10_surf.yaml",
        [
            f"data.source={surf}/dslr_SURF_L10.mat",
            f"data.target={surf}/amazon_SURF_L10.mat",
            "data.keep_classes=[2, 4]",
        ],
    )
    full = load_task(cfg.data.model_copy(update={"keep_classes": None}))
    task = load_task(cfg.data)
    task.check()
    assert task.source.num_classes == task.target.num_classes == 2
    for dom, whole in ((task.source, full.source), (task.target, full.target)):
        ys = whole.y
        assert len(dom) == int(((ys == 2) | (ys == 4)).sum())
        assert torch.equal(dom.x, whole.x[(ys == 2) | (ys == 4)])
        assert dom.y.tolist() == [0 if v == 2 else 1 for v in ys.tolist() if v in (2, 4)]
    with pytest.raises(ValueError, match="10 classes"):
        load_task(cfg.data.model_copy(update={"keep_classes": [2, 12]}))
    assert json.loads(json.dumps(cfg.resolved()))["data"]["keep_classes"] == [2, 4]


def test_a_class_subset_is_never_taken_for_a_stored_full_run() -> None:
    from eada.runs import config_differences

    stored = {"data": {"kind": "features"}}  # a record from before data.keep_classes
    assert config_differences(stored, {"data": {"kind": "features", "keep_classes": None}}) == []
    assert config_differences(stored, {"data": {"kind": "features", "keep_classes": [2, 4]}}) == [
        "data.keep_classes: None (before the key existed) -> [2, 4]"
    ]
