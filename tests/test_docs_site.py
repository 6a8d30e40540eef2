"""The front door: a short README whose results summary is the leaderboard's, BENCHMARKS.md
opening with the leaderboard, and a documentation site that builds with warnings as errors and
shows the API's formulas and examples."""

from __future__ import annotations

import html
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]


def _module(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(Path(path).stem, REPO / path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_is_a_front_page() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert "make demo" in text and "make test" in text and "TORCH_INDEX=" in text
    assert "docs/figures/leaderboard-ranks.png" in text
    assert (REPO / "docs/figures/leaderboard-ranks.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_readme_results_summary_is_the_leaderboards(tmp_path: Path) -> None:
    """The block is what ``benchmarks/leaderboard_figure.py`` writes from ``summary.json``: a
    re-run of the leaderboard that changes a number makes this fail until it is regenerated."""
    fig = _module("benchmarks/leaderboard_figure.py")
    summary = json.loads((REPO / fig.SUMMARY).read_text())
    text = fig.summary_text(summary)
    assert fig.replace_block(REPO / "README.md", text, check=True), (
        "README.md's results summary is stale: run python benchmarks/leaderboard_figure.py"
    )
    # it is computed, not fixed: another leaderboard gives another paragraph
    other = json.loads(json.dumps(summary))
    cell = other["tasks"]["toy"]["cells"]
    wins = sum(  # EADA's default's wins in the committed summary, toy aside
        1
        for task, t in summary["tasks"].items()
        if task != "toy"
        and (r := t["cells"].get("EADA (default)", {}).get("rank")) is not None
        and r == min(c["rank"] for c in t["cells"].values() if c.get("rank") is not None)
    )
    cell["EADA (default)"]["rank"], cell["TQS"]["rank"] = 1.0, 10.5
    assert fig.summary_text(other) != text
    assert f"EADA (default) {wins + 1} (" in fig.summary_text(other)
    # the heat map was drawn from this summary.json (its digest is in the PNG's metadata)
    from PIL import Image

    with Image.open(REPO / fig.FIGURE) as png:
        source = png.text.get("Source", "")
    assert source == f"{fig.SUMMARY.as_posix()} sha256 {fig.digest(REPO / fig.SUMMARY)}", (
        "docs/figures/leaderboard-ranks.png is stale: run python benchmarks/leaderboard_figure.py"
    )
    # and --check says so about a README that differs
    readme = tmp_path / "README.md"
    readme.write_text(f"x\n{fig.BEGIN}\nold\n{fig.END}\n")
    assert fig.main(["--readme", str(readme), "--check"]) == 1


def test_benchmarks_md_opens_with_the_leaderboard_table() -> None:
    lines = (REPO / "BENCHMARKS.md").read_text().splitlines()
    first_table = next(i for i, line in enumerate(lines) if line.startswith("|"))
    assert first_table < 15
    assert lines[first_table - 1] == "<!-- leaderboard:begin -->"
    assert lines[first_table].startswith("| task | Random |")
    # each topic links to its page, and every page under docs/results/ is linked
    linked = set(re.findall(r"\]\(docs/results/([\w-]+\.md)\)", "\n".join(lines)))
    pages = {p.name for p in (REPO / "docs/results").glob("*.md")}
    assert pages and pages == linked


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as ``make docs`` builds it (``mkdocs build --strict``)."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("the docs extra is not installed (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def _text(page: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


def test_api_page_of_free_energy_shows_its_formula_and_example(site: Path) -> None:
    page = (site / "api/energy/index.html").read_text()
    start = page.index('id="eada.energy.free_energy"')
    body = _text_of(page[start : page.index('id="eada.energy.centered_free_energy"')])
    assert "F(x) = -(1/tau) * log sum_y exp(-tau * E(x, y))" in body
    example = body[body.index("Example") :]  # the doctest, as a highlighted block
    assert "free_energy(E)" in example and "tensor([-0.3490,  0.1310])" in example


def _text_of(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def test_site_pages_render_the_repository_files(site: Path) -> None:
    home = _text(site / "index.html")
    assert "A five-minute tour" in home and "Average rank" in home
    results = _text(site / "results/index.html")
    assert "Which method wins where" in results and "SURF D->W" in results
    # links were rewritten for the site: the README's docs/ links point at pages
    assert 'href="concepts/"' in (site / "index.html").read_text()


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("the docs extra is not installed")
    copy = tmp_path / "repo"
    for name in ("mkdocs.yml", "README.md", "BENCHMARKS.md", "CONTRIBUTING.md"):
        shutil.copy(REPO / name, copy / name if copy.exists() else _mk(copy) / name)
    shutil.copytree(REPO / "docs", copy / "docs")
    shutil.copytree(REPO / "scripts", copy / "scripts")
    (copy / "src").symlink_to(REPO / "src")
    page = copy / "docs/concepts.md"
    page.write_text(page.read_text() + "\n[gone](no-such-page.md)\n")
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", "out"]
    proc = subprocess.run(cmd, cwd=copy, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "no-such-page.md" in proc.stdout + proc.stderr


def _mk(path: Path) -> Path:
    path.mkdir(parents=True)
    return path
