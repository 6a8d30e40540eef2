"""A griffe extension for the API pages (``mkdocs.yml``: mkdocstrings' ``extensions``).

The docstrings are written for ``help()`` and Sphinx-style readers; this rewrites a copy of each
one (``Docstring.value``) when mkdocstrings loads the package, before it is parsed, so the site
renders them. The source files are not changed.

* A Sphinx role (``:func:`name```, ``:class:`~a.b.C```, ``:meth:`title <a.b>```, any role with
  or without the ``py:`` domain) becomes a cross-reference: the name is resolved as Python
  resolves it from the documented object (its members, its parents', the module's imports, then
  as an absolute path). A name that resolves inside the loaded package becomes an optional
  autoref (mkdocs-autorefs), a link where its object is on the site and inline code where it is
  not; any other name (``torch.Tensor``) becomes inline code. ``~`` keeps the last component.
* A Google ``Example:`` section becomes an examples section (title ``Example:``), so its
  doctest renders as a highlighted ``pycon`` block with its ``>>>`` prompts (mkdocstrings would
  otherwise read it as an admonition and the prompts as nested quotes). The doctests themselves
  are unchanged: ``pytest --doctest-modules`` runs them from the source.
* A reStructuredText literal block (a paragraph ending ``::`` and an indented block) becomes a
  fenced code block, ``python`` where the block parses as Python.
"""

from __future__ import annotations

import ast
import html
import re
import textwrap
from typing import Any

import griffe

#: ``:role:`body``` with an optional ``py:`` domain
ROLE = re.compile(r":(?:py:)?(?P<role>[a-z]+):`(?P<body>[^`]+)`")
#: ``title <target>`` inside a role
TITLED = re.compile(r"^(?P<title>.*?)\s*<(?P<target>[^<>]+)>$")
EXAMPLE = re.compile(r"^Example:\s*$")


def _lookup(collection: Any, path: str) -> bool:
    """Whether ``path`` names an object of the loaded packages (following aliases)."""
    try:
        obj = collection[path]
        if obj.is_alias:
            obj.final_target  # noqa: B018 (raises where the alias cannot be resolved)
    except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return False
    return True


def resolve(obj: griffe.Object, name: str, collection: Any) -> str | None:
    """The full path ``name`` stands for, seen from ``obj``; None where it is not in the
    loaded packages (an external name, a typo).

    Args:
        obj: the documented object whose docstring holds the name.
        name: a dotted name as written in the role (``Foo.bar``, ``eada.energy.mvsm``).
        collection: the loader's modules collection.

    Returns:
        the resolved full path, or None.
    """
    name = name.strip().lstrip(".").removesuffix("()")
    first, _, rest = name.partition(".")
    try:
        base = obj.resolve(first)
    except (griffe.NameResolutionError, griffe.AliasResolutionError):
        base = None
    if base is not None:
        full = f"{base}.{rest}" if rest else base
        if _lookup(collection, full):
            return full
    return name if _lookup(collection, name) else None


def convert_roles(text: str, obj: griffe.Object, collection: Any) -> str:
    """``text`` with every Sphinx role replaced by an autoref or inline code.

    Args:
        text: a docstring.
        obj: the object it documents.
        collection: the loader's modules collection.

    Returns:
        the Markdown.
    """

    def sub(m: re.Match[str]) -> str:
        body = m.group("body").strip()
        titled = TITLED.match(body)
        if titled:
            title, target = titled.group("title"), titled.group("target")
        else:
            target = body.lstrip("!")
            title = target.lstrip("~").rsplit(".", 1)[-1] if target.startswith("~") else target
        target = target.lstrip("~!")
        code = f"<code>{html.escape(title)}</code>"
        full = resolve(obj, target, collection)
        if full is None:
            return code
        return f'<autoref identifier="{html.escape(full)}" optional>{code}</autoref>'

    return ROLE.sub(sub, text)


def convert_literal_blocks(text: str) -> str:
    """``text`` with each reStructuredText literal block (``...::`` then an indented block)
    as a fenced code block."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.rstrip().endswith("::") and i + 1 < len(lines) and not lines[i + 1].strip():
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            indent = len(line) - len(line.lstrip())
            k = j
            while k < len(lines) and (
                not lines[k].strip() or len(lines[k]) - len(lines[k].lstrip()) > indent
            ):
                k += 1
            block = lines[j:k]
            while block and not block[-1].strip():
                block.pop()
            if block:
                code = textwrap.dedent("\n".join(block))
                try:
                    ast.parse(code)
                    lang = "python"
                except SyntaxError:
                    lang = "text"
                head = line.rstrip()[:-1]  # "Example::" -> "Example:"
                pad = " " * indent
                out += [head, "", f"{pad}```{lang}"]
                out += [pad + c if c else c for c in code.split("\n")]
                out += [f"{pad}```", ""]
                i = k
                continue
        out.append(line)
        i += 1
    return "\n".join(out)


def convert_examples(text: str) -> str:
    """``text`` with each top-level ``Example:`` section header read as an examples section
    titled ``Example:`` (Google's parser knows only ``Examples:``)."""
    lines = text.split("\n")
    return "\n".join("Examples: Example:" if EXAMPLE.match(line) else line for line in lines)


def convert(text: str, obj: griffe.Object, collection: Any) -> str:
    """All three conversions of one docstring (see the module's docstring)."""
    return convert_examples(convert_roles(convert_literal_blocks(text), obj, collection))


class SiteDocstrings(griffe.Extension):
    """Rewrites the docstrings of a loaded package for the site (see the module's docstring)."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        """Convert every docstring of the package once it is loaded."""
        seen: set[int] = set()
        stack: list[griffe.Object] = [pkg]
        while stack:
            obj = stack.pop()
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if obj.docstring is not None:
                obj.docstring.value = convert(obj.docstring.value, obj, loader.modules_collection)
            stack.extend(m for m in obj.members.values() if not m.is_alias)
