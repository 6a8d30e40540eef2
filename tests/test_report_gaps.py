"""Report gaps: `eada bench` folders carry domain statistics and best-epoch accuracies, bands
stay within 0-100 %, the demo page shows the toy figure once, image runs without data.root."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from matplotlib.collections import PolyCollection

from eada import bench
from eada.cli import main
from eada.reports.figures_runs import Curve, plot_accuracy_curves
from eada.reports.html import build_report
from eada.runs import read_jsonl

TINY = ["train.epochs=2", "active.rounds_at=[1]", "data.n_per_class=40"]


def test_bench_lines_carry_stats_and_best_epoch_for_the_report(tmp_path: Path) -> None:
    runs = bench.build_grid(["toy"], ["source_only", "eada"], [0, 1], TINY)
    bench.run_grid(runs, tmp_path)
    lines = read_jsonl(tmp_path / "runs.jsonl")
    for rec in lines:
        assert rec["best_epoch"]["target"]["accuracy"] >= rec["final"]["target/accuracy"] - 1e-9
        snaps = rec["domain_stats"]["snapshots"]
        assert snaps[-1]["stage"] == "final" and "head" in snaps[-1]  # toy boundaries
        assert len(snaps[-1]["free_energy"]["target"]) == min(bench.BENCH_FREE_ENERGIES, 80)
    assert max(len(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()) < 60_000
    html = build_report(tmp_path, tmp_path / "r.html").read_text()
    for text in ("Free-energy distributions", "Decision boundaries", "carry no domain"):
        assert (text in html) == (text != "carry no domain"), text
    summary = html[html.index('class="summary"') :].split("</table>")[0]
    best_cells = [row.split("<td>")[5] for row in summary.split("<tr>")[2:]]
    assert best_cells and all(not c.startswith("-") for c in best_cells)  # best epoch filled


def test_accuracy_bands_stay_within_0_and_100() -> None:
    fig = plot_accuracy_curves(
        [Curve("a", [0.0, 1.0], [99.0, 99.5], [3.0, 2.0]), Curve("b", [0], [2.0], [5.0], True)]
    )
    ax = fig.axes[0]
    band = next(c for c in ax.collections if isinstance(c, PolyCollection))
    ys = np.concatenate([p.vertices[:, 1] for p in band.get_paths()])
    assert ys.max() <= 100.0 and ys.min() >= 96.0
    span = [p for p in ax.patches if p.get_height() > 0]  # the flat method's axhspan
    for p in span:
        y0, h = p.get_y(), p.get_height()
        assert 0.0 <= y0 and y0 + h <= 100.0


def test_demo_page_shows_the_toy_figure_once(tmp_path: Path, monkeypatch) -> None:
    from eada import demo

    monkeypatch.setattr(demo, "DEMO_METHODS", ("random", "eada"))
    out = tmp_path / "demo"
    demo.run_demo(seeds=1, out=out, methods=("random", "eada"))
    html = build_report(out, tmp_path / "d.html").read_text()
    assert html.count('="toy decision boundaries"') == 1 and 'alt="toy figure"' not in html


def test_report_on_an_image_run_without_data_root(tmp_path: Path, monkeypatch) -> None:
    tests = Path(__file__).parent
    monkeypatch.syspath_prepend(str(tests))
    sys.modules.pop("test_images", None)
    from test_images import _cfg, _make_domain

    src, tgt = _make_domain(tmp_path, "src"), _make_domain(tmp_path, "tgt", shift=20)
    raw = _cfg(src, tgt, "test_images:tiny_backbone", tmp_path)  # no data.root
    raw["train"] |= {"epochs": 2, "eval_batch_size": 8}
    raw["active"]["rounds_at"] = [1]
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    run = tmp_path / "run"
    assert main(["run", str(cfg), "--out", str(run)]) == 0
    assert json.loads((run / "config.json").read_text())["data"]["root"] is None
    html = build_report(run, tmp_path / "i.html").read_text()
    assert "Queried samples" in html


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))
