"""Figures, domain statistics, logging callbacks and `eada report` (HTML) on small real runs."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from rich.console import Console

from eada.cli import main
from eada.data.tasks import load_task
from eada.experiment import run_once, run_seeds
from eada.hparams import preset_config
from eada.reports import collect
from eada.reports.domain_stats import DomainStatsRecorder, mmd2_rbf, proxy_a_distance
from eada.reports.figures_runs import (
    Curve,
    FreeEnergyPanel,
    figure_bytes,
    plot_accuracy_curves,
    plot_domain_distances,
    plot_free_energy,
    plot_image_grid,
    plot_selected_error,
    save_figure,
)
from eada.reports.html import build_report
from eada.runs import append_jsonl, read_jsonl, write_json
from eada.train.logging import ProgressBars, TensorBoardLogger

SMALL_TOY = [
    "data.n_per_class=60",
    "train.epochs=3",
    "active.rounds_at=[1,2]",
    "active.budget_per_round=0.05",
]


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bench-style folder ``toy/<method>/`` with short toy runs of three methods."""
    root = tmp_path_factory.mktemp("bench")
    for method, seeds in (("source_only", [0]), ("random", [0, 1]), ("eada", [0, 1])):
        run_seeds(
            lambda s, m=method: preset_config("toy", m, s, SMALL_TOY), seeds, root / "toy" / method
        )
    return root


# -- statistics -------------------------------------------------------------------------------
def test_a_distance_and_mmd_separate_far_from_equal_domains() -> None:
    rng = np.random.default_rng(0)
    a = rng.normal(size=(300, 4))
    same, far = rng.normal(size=(300, 4)), rng.normal(4.0, 1.0, size=(300, 4))
    assert proxy_a_distance(a, far)["a_distance"] > 1.9
    assert abs(proxy_a_distance(a, same)["a_distance"]) < 0.3
    m_same, m_far = mmd2_rbf(a, same)["mmd2"], mmd2_rbf(a, far)["mmd2"]
    assert abs(m_same) < 0.01 < m_far
    with pytest.raises(ValueError, match="equal width"):
        mmd2_rbf(a, far[:, :3])
    with pytest.raises(ValueError, match="equal width"):
        proxy_a_distance(a, far[:, :3])


def test_recorder_does_not_change_the_run_and_stores_consistent_stats() -> None:
    cfg = preset_config("toy", "eada", 0, SMALL_TOY)
    plain = run_once(cfg, record_stats=False)["results"]
    rec = run_once(cfg)["results"]
    assert "domain_stats" not in plain
    assert [r.get("selected") for r in plain["rounds"]] == [
        r.get("selected") for r in rec["rounds"]
    ]
    assert plain["final"] == rec["final"]
    stats = rec["domain_stats"]
    assert [s["stage"] for s in stats["snapshots"]] == ["before round 1", "before round 2", "final"]
    for s in stats["snapshots"]:
        assert len(s["free_energy"]["source"]) == len(s["free_energy"]["target"]) == 120
        assert np.isfinite([s["mmd2"], s["a_distance"]]).all()
        assert s["features_fixed"] is True  # the linear toy model
        assert np.asarray(s["head"]["weight"]).shape == (2, 2)
    # the stored predictions reproduce the trainer's own error rate on the queried samples
    for sel, rnd in zip(stats["selected"], rec["rounds"][1:], strict=True):
        assert len(sel["free_energy"]) == len(sel["mvsm"]) == len(rnd["selected"])
        wrong = np.mean(np.asarray(sel["predicted"]) != np.asarray(rnd["selected_labels"]))
        assert 100 * wrong == pytest.approx(rnd["selected_error_rate"])
        # EADA picks the highest MvSM of its candidates, best first
        assert sel["mvsm"] == sorted(sel["mvsm"], reverse=True)
    assert len(json.dumps(stats)) < 60_000


def test_recorder_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="n_free_energy"):
        DomainStatsRecorder(n_free_energy=1)


# -- figures ----------------------------------------------------------------------------------
def test_figures_render_png_and_svg(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    figs = {
        "fe": plot_free_energy(
            [
                FreeEnergyPanel(f"p{i}", rng.normal(-8, 1, 200), rng.normal(-5, 1, 200))
                for i in range(5)
            ],
            "title",
        ),
        "acc": plot_accuracy_curves(
            [
                Curve("EADA", [0, 1, 2], [80, 85, 88], [1, 1, 0.5]),
                Curve("SO", [0], [70], [2], flat=True),
            ]
        ),
        "err": plot_selected_error(
            {
                "EADA": ([1, 2], [40.0, 30.0], [2.0, 1.0]),
                "Random": ([1, 2], [10.0, 8.0], [1.0, 1.0]),
            }
        ),
        "dist": plot_domain_distances(
            {
                "EADA": (
                    ["before round 1", "final"],
                    [1.5, 1.0],
                    [0.1, 0.1],
                    [0.2, 0.1],
                    [0.01, 0.01],
                )
            }
        ),
        "grid": plot_image_grid(
            [
                ("round 1", rng.random((5, 1, 28, 28)), ["y=1 p=2"] * 5),
                ("round 2", rng.random((3, 3, 28, 28)), []),
            ]
        ),
    }
    for name, fig in figs.items():
        png, svg = save_figure(fig, tmp_path / f"{name}.png", tmp_path / f"{name}.svg")
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "<svg" in svg.read_text()[:2000]
    assert len(figs["fe"].axes) == 8 and sum(a.get_visible() for a in figs["fe"].axes) == 5
    assert figure_bytes(figs["acc"], "svg").lstrip().startswith(b"<?xml")
    with pytest.raises(ValueError, match="format"):
        figure_bytes(figs["acc"], "gif")
    with pytest.raises(ValueError, match="at least one"):
        plot_accuracy_curves([])


# -- collecting runs --------------------------------------------------------------------------
def test_collect_reads_all_layouts(bench: Path, tmp_path: Path) -> None:
    inp = collect.load_report_input(bench)
    assert inp.kind == "bench" and inp.tasks == ["toy"]
    groups = {g.method: g for g in inp.groups}
    assert set(groups) == {"source_only", "random", "eada"}
    assert groups["eada"].seeds == [0, 1]
    x, m, s = collect.accuracy_curve(groups["eada"])
    assert x == pytest.approx([0.0, 5.0, 10.0]) and len(m) == len(s) == 3
    assert collect.accuracy_curve(groups["source_only"])[0] == [0.0]
    run = collect.load_report_input(bench / "toy" / "eada")
    assert run.kind == "run" and run.groups[0].method == "eada"
    # the `eada demo` layout: records carry the method
    demo = tmp_path / "demo"
    for m in ("random", "eada"):
        for rec in read_jsonl(bench / "toy" / m / "runs.jsonl")[:1]:
            append_jsonl(demo / "runs.jsonl", {"method": m, **rec})
    d = collect.load_report_input(demo)
    assert d.kind == "demo" and [g.label for g in d.groups] == ["Random", "EADA"]
    demo_html = build_report(demo).read_text()
    assert "<td>Random</td>" in demo_html and "<td>EADA</td>" in demo_html
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no runs"):
        collect.load_report_input(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="not a folder"):
        collect.load_report_input(tmp_path / "absent")


# -- the HTML report ----------------------------------------------------------------------------
def _self_contained(html: str) -> None:
    assert not re.search(r"""(src|href)=["'](https?:|//)""", html)
    assert "<script" not in html and "<link" not in html and "@import" not in html


def test_toy_run_report(bench: Path, tmp_path: Path) -> None:
    figs = tmp_path / "figs"
    out = build_report(bench / "toy" / "eada", tmp_path / "r.html", figures_dir=figs)
    html = out.read_text()
    _self_contained(html)
    for text in (
        "Per-round results",
        "Free-energy distributions",
        "Decision boundaries",
        "queried samples with their scores",
        "Error rate on the queried samples",
        "linear model",  # A-distance/MMD left out with a note for fixed features
        "<summary>EADA</summary>",  # the config
    ):
        assert text in html, text
    assert html.count("data:image/png;base64,") >= 2 and "<svg" in html
    assert len(list(figs.glob("*.png"))) == len(list(figs.glob("*.svg"))) >= 4


def test_bench_report_compares_strategies(bench: Path, tmp_path: Path) -> None:
    html = build_report(bench, tmp_path / "b.html").read_text()
    _self_contained(html)
    for label in ("Source-only", "Random", "EADA"):
        assert f"<td>{label}</td>" in html
    for name in ("accuracy curves toy", "selected error toy", "free energy final toy"):
        assert f'="{name}"' in html, name  # the figure's alt text / aria-label
    assert html.count('class="rounds"') == 3


def test_report_cli(bench: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.html"
    assert main(["report", str(bench / "toy" / "random"), "--out", str(out)]) == 0
    assert out.exists() and "report:" in capsys.readouterr().out
    # the error is one line whatever the path length (a fresh clone in a deep folder)
    missing = tmp_path.joinpath(*(["a-long-folder-name-" + "x" * 50] * 5), "nothing")
    assert main(["report", str(missing)]) == 2
    err = capsys.readouterr().err
    assert "not a folder" in err and str(missing) in err and err.count("\n") == 1


def test_digits_run_report(digits_root: Path, tmp_path: Path) -> None:
    """One short digits run (USPS test split as the target, 2,000 MNIST images as the source,
    two epochs and one round) to keep the test quick; the report reloads the target images."""
    over = [
        f"data.root={digits_root}",
        "data.target_split=test",
        "data.heldout_split=null",
        "train.epochs=2",
        "active.rounds_at=[1]",
        "active.budget_per_round=0.01",
    ]
    cfg = preset_config("digits/mnist-usps", "eada", 0, over)
    task = load_task(cfg.data, 0)
    task.source = task.source.subset(torch.arange(2000))
    run_dir = tmp_path / "digits"
    write_json(run_dir / "config.json", cfg.resolved())
    append_jsonl(run_dir / "runs.jsonl", run_once(cfg, task))
    html = build_report(run_dir, tmp_path / "d.html").read_text()
    _self_contained(html)
    assert "queried images" in html and "Domain discrepancy" in html
    assert 'alt="queried images digits/mnist-usps eada"' in html
    stats = read_jsonl(run_dir / "runs.jsonl")[0]["results"]["domain_stats"]
    assert stats["snapshots"][0]["features_fixed"] is False
    assert 0.0 <= stats["snapshots"][-1]["a_distance"] <= 2.0
    # without the data: the report still renders and says why the images are missing
    moved = tmp_path / "moved"
    moved.mkdir()
    recs = read_jsonl(run_dir / "runs.jsonl")
    for rec in recs:
        rec["config"]["data"]["root"] = str(tmp_path / "no-such-data")
        append_jsonl(moved / "runs.jsonl", rec)
    html2 = build_report(moved, tmp_path / "d2.html").read_text()
    assert "data set not found" in html2 and "queried samples with their scores" in html2


# -- logging ----------------------------------------------------------------------------------
def test_progress_bars_count_steps_only_on_a_terminal() -> None:
    cfg = preset_config("toy", "eada", 0, SMALL_TOY)
    buf = io.StringIO()
    bars = ProgressBars(Console(file=buf, force_terminal=True, width=120), "seed 0")
    run_once(cfg, callbacks=[bars], record_stats=False)
    text = buf.getvalue()
    assert "seed 0" in text and "left" in text
    assert bars.progress is None  # stopped after the last epoch
    quiet = io.StringIO()
    off = ProgressBars(Console(file=quiet), "seed 0")  # a StringIO is not a terminal
    assert off.enabled is False
    run_once(cfg, callbacks=[off], record_stats=False)
    assert quiet.getvalue() == ""


def test_tensorboard_logger_writes_scalars_and_histograms(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = preset_config("toy", "eada", 0, SMALL_TOY)
    run = run_once(cfg, callbacks=[TensorBoardLogger(tmp_path / "tb")], record_stats=False)
    ea = EventAccumulator(str(tmp_path / "tb"), size_guidance={"histograms": 0, "scalars": 0})
    ea.Reload()
    tags = ea.Tags()
    for tag in ("train/loss", "train/delta", "target/accuracy", "round/selected_error_rate"):
        assert tag in tags["scalars"], tag
    assert {"free_energy/source", "free_energy/target"} <= set(tags["histograms"])
    acc = [e.value for e in ea.Scalars("target/accuracy")]
    hist = [h["metrics"]["target"]["accuracy"] for h in run["results"]["history"]]
    assert acc == pytest.approx(hist, abs=1e-4)
    per_round = [e.value for e in ea.Scalars("round/target_accuracy")]
    assert len(per_round) == 3  # with the labels of 0, 1 and 2 rounds


def test_cli_run_tensorboard_flag(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    args = ["run", "toy", "--out", str(tmp_path / "run"), "--tensorboard", str(tmp_path / "tb")]
    assert main(args + [x for o in SMALL_TOY for x in ("--set", o)]) == 0
    assert list((tmp_path / "tb" / "seed0").glob("events.out.tfevents.*"))
    rec = read_jsonl(tmp_path / "run" / "runs.jsonl")[0]
    assert "domain_stats" in rec["results"]
