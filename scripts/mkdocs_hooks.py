"""MkDocs hooks of the documentation site (``mkdocs.yml``; ``make docs``).

* ``docs/index.md``, ``docs/results.md`` and ``docs/contributing.md`` are placeholders: the
  site renders ``README.md``, ``BENCHMARKS.md`` and ``CONTRIBUTING.md`` there, so each text has
  one source and reads right both on GitHub and on the site.
* Every page's links are written for the repository (a link from ``docs/running.md`` to
  ``../BENCHMARKS.md``, from the README to ``docs/annotation.md``). They are resolved against
  the page's place in the repository and rewritten for the site: a file under ``docs/`` becomes
  a link to its page, ``README.md`` / ``BENCHMARKS.md`` / ``CONTRIBUTING.md`` their pages, and a
  link to any other file of the repository (source, configs) becomes its path in code, since the
  site does not carry it. A link to a file that does not exist is left as it is, so
  ``mkdocs build --strict`` fails on it.
* Every rendered page is checked (:func:`page_problems`, warnings that fail ``--strict``): no
  paragraph holding list-like ``- `` lines (a Markdown list needs a blank line before it), no
  ``issue N`` but on the contributing page, test-file paths only on the results, contributing
  and reliability pages, and the install page names the extras the Makefile installs.
"""

from __future__ import annotations

import html
import logging
import posixpath
import re
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: site page -> the repository file rendered there
INCLUDED = {
    "index.md": "README.md",
    "results.md": "BENCHMARKS.md",
    "contributing.md": "CONTRIBUTING.md",
}
#: repository file -> its site page
PAGE_OF = {v: k for k, v in INCLUDED.items()}
LINK = re.compile(r"(!?\[[^\]]*\])\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```")
LOG = logging.getLogger("mkdocs.plugins.eada_checks")  # a warning fails `mkdocs build --strict`
PARAGRAPH = re.compile(r"<p\b[^>]*>(.*?)</p>", re.DOTALL)
LIST_LINE = re.compile(r"(?:^|\n)[ \t]*- \S")
ISSUE = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
TEST_PATH = re.compile(r"\btests/test_\w*")
#: pages that may name test files: where a claim is backed (results, contributing, reliability)
TEST_PATH_PAGES = ("results/", "contributing.md", "reliability.md", "results.md")
MAKE_EXTRAS = re.compile(r"^EXTRAS \?= *(\S+)", re.MULTILINE)


def _rewrite(target: str, repo_dir: str, page_dir: str) -> str | None:
    """The site link for ``target`` written in a file of ``repo_dir``, seen from a page in
    ``page_dir`` (a folder under ``docs/``); None: make it code."""
    path, sep, frag = target.partition("#")
    resolved = posixpath.normpath(posixpath.join(repo_dir, path))
    if resolved in PAGE_OF:
        site = PAGE_OF[resolved]
    elif resolved.startswith("docs/"):
        site = resolved[len("docs/") :]
    elif (REPO / resolved).exists():
        return None
    else:
        return target  # a broken link: left for --strict to report
    rel = posixpath.relpath(site, page_dir or ".")
    return rel + (sep + frag if sep else "")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Swap in the repository file a placeholder stands for, and rewrite the links."""
    src = page.file.src_uri
    if src in INCLUDED:
        markdown = (REPO / INCLUDED[src]).read_text()
        repo_dir = ""
    else:
        repo_dir = posixpath.dirname(posixpath.join("docs", src))
    page_dir = posixpath.dirname(src)
    out, fence = [], False
    for line in markdown.splitlines():
        if FENCE.match(line):
            fence = not fence
        elif not fence:

            def sub(m: re.Match[str]) -> str:
                target = m.group(2)
                if re.match(r"[a-z]+:", target) or target.startswith("#"):
                    return m.group(0)
                new = _rewrite(target, repo_dir, page_dir)
                if new is None:  # a file of the repository the site does not carry: its path
                    text = m.group(1).lstrip("!")[1:-1]
                    path = posixpath.normpath(posixpath.join(repo_dir, target.partition("#")[0]))
                    return text if path in text else f"{text} (`{path}`)"
                return f"{m.group(1)}({new})"

            line = LINK.sub(sub, line)
        out.append(line)
    return "\n".join(out) + "\n"


def makefile_extras() -> str:
    """The extras ``make`` installs: ``EXTRAS`` of the Makefile (``dev,images,...``)."""
    m = MAKE_EXTRAS.search((REPO / "Makefile").read_text())
    if m is None:
        raise ValueError("Makefile: no `EXTRAS ?= ...` line")
    return m.group(1)


def _text(fragment: str) -> str:
    """The text of an HTML fragment (tags dropped, entities decoded)."""
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def page_problems(page: str, content: str, source: str = "") -> list[str]:
    """What is wrong with the rendered ``content`` (HTML) of the site page ``page``
    (``docs``-relative, e.g. ``install.md``); ``source`` is its Markdown (for the install page's
    extras). Empty when nothing is."""
    problems = []
    for m in PARAGRAPH.finditer(content):
        text = _text(m.group(1))
        if LIST_LINE.search(text):
            first = text.strip().splitlines()[0][:60]
            problems.append(
                f"a paragraph holds list-like '- ' lines (a list needs a blank line before it): "
                f"{first!r}"
            )
    text = _text(content)
    if page != "contributing.md":
        problems += [
            f"names {m.group(0)!r} (only the contributing page may)" for m in ISSUE.finditer(text)
        ]
    if not page.startswith(TEST_PATH_PAGES):
        problems += [
            f"names the test file {m.group(0)!r} (only results, contributing and reliability pages "
            "may)"
            for m in TEST_PATH.finditer(text)
        ]
    if page == "install.md":
        extras = makefile_extras()
        said = set(re.findall(r"extras `([a-z,]+)`", source))
        said |= set(re.findall(r"`make` installs `\.\[([a-z,]+)\]`", source))
        if said != {extras}:
            problems.append(
                f"says `make` installs the extras {sorted(said) or 'nothing'}; the Makefile's "
                f"EXTRAS is `{extras}` (write: extras `{extras}`)"
            )
    return problems


def on_page_content(content: str, page: Any, config: Any, files: Any) -> str:
    """Warn (an error under ``--strict``) on each problem :func:`page_problems` finds."""
    for problem in page_problems(page.file.src_uri, content, page.markdown or ""):
        LOG.warning("%s: %s", page.file.src_uri, problem)
    return content
