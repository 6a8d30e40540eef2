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
    assert lines[first_table].startswith("| task | EADA (default) |")  # EADA in view first
    # each topic links to its page, and every page under docs/results/ is linked
    linked = set(re.findall(r"\]\(docs/results/([\w-]+\.md)\)", "\n".join(lines)))
    pages = {p.name for p in (REPO / "docs/results").glob("*.md")}
    assert pages and pages == linked


@pytest.fixture
def site(docs_site: Path) -> Path:
    """The site as ``make docs`` builds it, once per test session (``docs_site``, conftest.py)."""
    return docs_site


def _text(page: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


def _section(page: str, name: str, next_name: str) -> str:
    """The HTML of one object's section of an API page (up to the next object)."""
    start = page.index(f'id="eada.energy.{name}"')
    return page[start : page.index(f'id="eada.energy.{next_name}"')]


def test_api_page_of_free_energy_shows_its_formula_and_example(site: Path) -> None:
    page = (site / "api/energy.html").read_text()
    section = _section(page, "free_energy", "centered_free_energy")
    # the formula is math: arithmatex's span, rendered in the browser by the vendored KaTeX
    math = re.findall(r'<span class="arithmatex">(.*?)</span>', section, flags=re.DOTALL)
    assert r"\(F(x) = -\frac{1}{\tau} \log \sum_y \exp(-\tau E(x, y))\)" in math, math
    # the example is one highlighted code block with its prompts, input and output together
    blocks = [_text_of(b) for b in re.findall(r"<pre>(.*?)</pre>", section, flags=re.DOTALL)]
    example = [b for b in blocks if "free_energy(E)" in b]
    assert len(example) == 1, blocks
    assert ">>> E = torch.tensor(" in example[0]
    assert ">>> free_energy(E)  # -log(e^0 + e^-1 + e^-3)" in example[0]
    assert "tensor([-0.3490,  0.1310])" in example[0]
    assert '<span class="gp">&gt;&gt;&gt; </span>' in section  # pycon highlighting: prompts
    assert "<blockquote>" not in section


def _scripts_and_styles(page: Path) -> list[str]:
    html_text = page.read_text()
    return re.findall(r'<script[^>]* src="([^"]+)"', html_text) + re.findall(
        r'<link[^>]* href="([^"]+\.css)"', html_text
    )


def test_site_works_offline_and_opened_as_files(site: Path) -> None:
    """KaTeX and the search worker's shim come from the site itself, the search index is a
    script (search without a server), links point at files (``.html``, not folders), and no
    page asks another host for anything (no CDN, no Google Fonts)."""
    index = (site / "search/search_index.js").read_text()
    assert index.startswith("var __index = ") and '"location":"api/energy.html' in index
    for page in site.rglob("*.html"):
        for url in _scripts_and_styles(page):
            assert not re.match(r"(https?:)?//", url), f"{page} loads {url}"
            base = site if url.startswith("/") else page.parent  # 404.html: from the root
            assert (base / url.split("?")[0].lstrip("/")).is_file(), f"{page}: {url} missing"
        assert "fonts.googleapis" not in page.read_text(), page
    energy = _scripts_and_styles(site / "api/energy.html")
    for local in (
        "../assets/vendor/katex/katex.min.js",
        "../assets/vendor/katex/katex.min.css",
        "../assets/katex-init.js",
        "../assets/vendor/iframe-worker/shim.js",
    ):
        assert local in energy, energy
    css = (site / "assets/vendor/katex/katex.min.css").read_text()
    fonts = re.findall(r"url\((fonts/[^)]+)\)", css)
    assert fonts and all((site / "assets/vendor/katex" / f).is_file() for f in fonts)
    vendored = sum(f.stat().st_size for f in (REPO / "docs/assets/vendor").rglob("*"))
    assert vendored < 1_000_000
    home = (site / "index.html").read_text()
    assert 'href="concepts.html"' in home and 'href="concepts/"' not in home


#: a Sphinx role left as text (``:func:`x``` renders as ``:func:<code>x</code>``)
LITERAL_ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|exc|obj|const):")


def test_no_literal_sphinx_role_in_the_site(site: Path) -> None:
    """Every ``:func:``/``:class:``/... of the docstrings became a link (or inline code where
    its target is not on the site): none is left in any page or in the search index."""
    left = {
        str(p.relative_to(site)): len(LITERAL_ROLE.findall(p.read_text()))
        for p in [*site.rglob("*.html"), site / "search/search_index.json"]
    }
    assert {p: n for p, n in left.items() if n} == {}
    assert LITERAL_ROLE.search(":func:<code>free_energy</code>")  # what one left looks like
    # ... and they are links where the target is on the site: the module docstring's
    # :func:`energy_from_logits`, a method's :meth:`update`, another page's class
    page = (site / "api/energy.html").read_text()
    assert re.search(r'<a [^>]*href="#eada\.energy\.energy_from_logits"', page)
    assert re.search(r'<a [^>]*href="#eada\.energy\.DeltaEstimator\.update"', page)
    config = (site / "api/config.html").read_text()
    assert re.search(r'<a [^>]*href="(?:[\w./]*)#eada\.config\.\w+"', config)
    # a target that is not on the site is inline code, titled with its full path
    assert '<span title="eada.train.ActiveDATrainer.selection_tau"><code>' in page


def test_the_docstring_extension_converts_roles_examples_and_literal_blocks() -> None:
    """``scripts/griffe_docstrings.py`` on a small package: a role to a documented object
    becomes an autoref, one to an unknown or external name inline code; an ``Example:``
    section becomes an examples section; an rst literal block a fenced block."""
    import griffe

    ext = _module("scripts/griffe_docstrings.py")
    pkg = griffe.load(
        "eada", search_paths=[REPO / "src"], extensions=griffe.load_extensions(ext.SiteDocstrings)
    )
    free = pkg["energy.free_energy"]
    out = ext.convert(
        ":func:`~eada.energy.mvsm` :class:`DeltaEstimator` :func:`torch.exp`"
        " :meth:`title <DeltaEstimator.update>` :func:`no_such_thing`",
        free,
        pkg.modules_collection,
    )
    assert out == (
        '<autoref identifier="eada.energy.mvsm" optional><code>mvsm</code></autoref> '
        '<autoref identifier="eada.energy.DeltaEstimator" optional>'
        "<code>DeltaEstimator</code></autoref> <code>torch.exp</code> "
        '<autoref identifier="eada.energy.DeltaEstimator.update" optional>'
        "<code>title</code></autoref> <code>no_such_thing</code>"
    )
    # the loaded package was converted: roles gone, the example parsed as an examples section
    assert ":func:" not in pkg["energy"].docstring.value
    sections = free.docstring.parse("google")
    kinds = [s.kind.value for s in sections]
    assert kinds[-1] == "examples" and sections[-1].title == "Example:"
    code = [v for k, v in sections[-1].value if k.value == "examples"]
    assert code and code[0].startswith(">>> import torch")
    assert ext.convert_literal_blocks("Run::\n\n    eada run toy\n\nThen.") == (
        "Run:\n\n```text\neada run toy\n```\n\nThen."
    )
    assert "```python" in ext.convert_literal_blocks("Ex::\n\n    import eada\n")


def _text_of(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def test_site_pages_render_the_repository_files(site: Path) -> None:
    home = _text(site / "index.html")
    assert "A five-minute tour" in home and "Average rank" in home
    results = _text(site / "results.html")
    assert "Which method wins where" in results and "SURF D->W" in results
    # links were rewritten for the site: the README's docs/ links point at pages
    assert 'href="concepts.html"' in (site / "index.html").read_text()


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


#: provenance that belongs in CONTRIBUTING.md or docs/reliability.md, not on a user page
PROVENANCE = re.compile(r"\bissues? #?\d+|tests/test_\w*", re.IGNORECASE)
#: the pages that may carry it: the developers' pages (docs/contributing.md shows
#: CONTRIBUTING.md on the site); the results pages (BENCHMARKS.md, docs/results/) keep theirs
NOT_USER_PAGES = {"contributing.md", "reliability.md"}


def user_pages() -> list[Path]:
    """The user guide: ``docs/*.md`` but the developers' pages, and the README (the home)."""
    pages = sorted(p for p in (REPO / "docs").glob("*.md") if p.name not in NOT_USER_PAGES)
    return [REPO / "README.md", *pages]


def test_user_pages_carry_no_provenance() -> None:
    """No issue numbers and no test files on the user pages: which test backs which claim is in
    CONTRIBUTING.md ("Where the user guide's claims are tested")."""
    found = {
        f"{p.relative_to(REPO)}:{i}": m.group(0)
        for p in user_pages()
        for i, line in enumerate(p.read_text().splitlines(), 1)
        for m in PROVENANCE.finditer(line)
    }
    assert found == {}, f"move these to CONTRIBUTING.md or docs/reliability.md: {found}"
    assert len(user_pages()) >= 15
    # the check can fail: a page citing an issue or a test file is found
    assert PROVENANCE.search("(Moved from the README, issue 31.)")
    assert PROVENANCE.search("`tests/test_store.py` kills it")
    assert PROVENANCE.search("before Issue #32") and not PROVENANCE.search("tissue 3D")
    assert "where-the-user-guides-claims-are-tested" in _slugs(REPO / "CONTRIBUTING.md")


def test_api_pages_carry_no_provenance(site: Path) -> None:
    """The API reference is read by users too: its docstrings cite no issue or test file."""
    found = {
        str(p.relative_to(site)): PROVENANCE.findall(_text(p))
        for p in sorted((site / "api").glob("*.html"))
    }
    assert found and {p: f for p, f in found.items() if f} == {}


def _slugs(page: Path) -> set[str]:
    heads = re.findall(r"^#+ (.+)$", page.read_text(), flags=re.MULTILINE)
    return {re.sub(r"[^\w\s-]", "", h.lower()).strip().replace(" ", "-") for h in heads}


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", REPO / "scripts/mkdocs_hooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_build_checks_catch_lists_issues_test_paths_and_extras() -> None:
    """The docs build's page checks (warnings that fail `mkdocs build --strict`): a paragraph
    holding list-like lines, an issue number outside the contributing page, a test file on a
    user page, an install page whose extras are not the Makefile's; a good page passes."""
    hooks = _hooks()
    bad_list = "<p>Optional extras:\n- images: torchvision\n- fast: ONNX Runtime</p>"
    assert "list-like" in " ".join(hooks.page_problems("install.md", bad_list))
    good_list = "<p>Optional extras:</p>\n<ul>\n<li>images</li>\n</ul>"
    assert hooks.page_problems("concepts.md", good_list) == []
    assert hooks.page_problems("concepts.md", "<p>a dash - in a sentence</p>") == []
    assert hooks.page_problems("results/toy.md", "<p>moved by issue 31</p>")
    assert hooks.page_problems("contributing.md", "<p>moved by issue 31</p>") == []
    assert hooks.page_problems("running.md", "<p>see <code>tests/test_bench.py</code></p>")
    assert hooks.page_problems("results/toy.md", "<p><code>tests/test_bench.py</code></p>") == []
    extras = hooks.makefile_extras()
    assert extras == re.search(r"^EXTRAS \?= *(\S+)", (REPO / "Makefile").read_text(), re.M)[1]
    assert hooks.page_problems("install.md", "", "the extras `dev,images`")
    assert hooks.page_problems("install.md", "", f"the extras `{extras}`") == []
    assert f"extras `{extras}`" in (REPO / "docs" / "install.md").read_text()


def test_built_site_has_no_paragraph_list_and_no_issue_numbers(site: Path) -> None:
    """On the built site: no paragraph holding list-like "- " lines on any page, no "issue N"
    but on the contributing page (what the build's checks keep true)."""
    found = {}
    for page in sorted(site.rglob("*.html")):
        rel = page.relative_to(site).as_posix()
        if rel.startswith(("assets/", "search/")) or rel == "404.html":
            continue
        body = page.read_text()
        for m in re.finditer(r"<p\b[^>]*>(.*?)</p>", body, re.DOTALL):
            if re.search(r"(?:^|\n)[ \t]*- \S", html.unescape(re.sub(r"<[^>]+>", "", m[1]))):
                found[rel] = m[1][:80]
        if not rel.startswith("contributing"):
            text = html.unescape(re.sub(r"<[^>]+>", "", body))
            for m in re.finditer(r"\bissues? #?\d+", text, re.IGNORECASE):
                found[rel] = m[0]
    assert found == {}
