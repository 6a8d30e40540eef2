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
"""

from __future__ import annotations

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
                if new is None:
                    return f"{m.group(1)[m.group(1).startswith('!') :]} (`{target}`)"
                return f"{m.group(1)}({new})"

            line = LINK.sub(sub, line)
        out.append(line)
    return "\n".join(out) + "\n"
