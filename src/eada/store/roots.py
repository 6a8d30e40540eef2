"""The data roots of a project store: which files it may register and serve.

A store's data roots are the folders its config names (image folders, the folders of image
lists, ``data.root``) plus the folders the user allows explicitly (``eada init --allow-root
DIR``). The store never adds a root by itself: a file that resolves outside every root (an
absolute path, ``..`` in a list, a symlink pointing out) is refused with an error naming it.

The one place for these checks (callers: ``eada init``, label imports, the Label Studio
exports, and anything else that registers or serves files):

* :func:`confine` -- one path resolved and required inside a root;
* :func:`check_within_roots` -- every file of a project at once (one error listing them all);
* :func:`label_studio_root` -- the folder Label Studio may serve the files from
  (``LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT``), never ``/`` nor a parent of a home folder;
  :func:`unsafe_document_root` says why a folder is refused.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

_SHOWN = 10  # outside files named in one error
NO_DOCUMENT_ROOT = (
    "no Label Studio document root: the folder holding every data root of the target images "
    "is / or a parent of a home folder, which Label Studio must not serve; name the folder "
    "that holds them (Label Studio's LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT) with `eada "
    "labelstudio connect --root DIR` or `eada config set store.label_studio_root=DIR`"
)


class OutsideRootsError(ValueError):
    """Files that resolve outside every registered data root."""


class UnsafeDocumentRootError(ValueError):
    """A Label Studio document root that would serve ``/`` or a parent of a home folder."""


def _inside(path: Path, roots: Iterable[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def confine(path: str | Path, roots: list[Path]) -> Path:
    """Resolve ``path`` (symlinks and ``..`` included) and require it inside a data root.

    A relative path is tried against each root in turn.

    Raises:
        ValueError: the path does not exist or resolves outside every root.

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp()).resolve(); (root / "a.png").write_bytes(b"x")
        1
        >>> confine(root / "a.png", [root]) == root / "a.png"
        True
    """
    p = Path(path)
    resolved_roots = [r.resolve() for r in roots]
    candidates = [p] if p.is_absolute() else [r / p for r in resolved_roots]
    if not resolved_roots:
        raise ValueError(f"path {path!s}: this project registers no data roots (no file paths)")
    not_files: list[Path] = []
    for c in candidates:  # a relative path: the first root that holds the file wins
        r = c.resolve()
        if not _inside(r, resolved_roots):
            continue
        if not r.is_file():
            not_files.append(r)
            continue
        return r
    if not_files:
        tried = ", ".join(str(r) for r in not_files)
        raise ValueError(f"path {path!s} is not a file under any data root (tried {tried})")
    shown = ", ".join(str(r) for r in resolved_roots)
    where = candidates[0].resolve()
    raise OutsideRootsError(
        f"path {path!s} resolves to {where}, outside the registered data roots ({shown})"
    )


def check_within_roots(files: Mapping[str, Iterable[Path] | None], roots: list[Path]) -> None:
    """Require every file (by role: ``{"target": [paths], ...}``) to resolve inside a root.

    Raises:
        OutsideRootsError: naming how many files are outside, the first of them (as given and
            where they resolve), the registered roots, and the ``--allow-root`` that would
            admit them (when that folder is a safe one).

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp()).resolve(); (root / "a.png").write_bytes(b"x")
        1
        >>> check_within_roots({"target": [root / "a.png"]}, [root])
        >>> check_within_roots({"target": [root / "a.png"]}, [root / "sub"])
        Traceback (most recent call last):
        ...
        eada.store.roots.OutsideRootsError: 1 target file(s) resolve outside ...
    """
    resolved_roots = [Path(r).resolve() for r in roots]
    outside: list[tuple[str, Path, Path]] = []
    for role, paths in files.items():
        for p in paths or []:
            r = Path(p).absolute().resolve()
            if not _inside(r, resolved_roots):
                outside.append((role, Path(p), r))
    if not outside:
        return
    roles = sorted({role for role, _, _ in outside})
    lines = [
        f"  {role}: {given}" + (f" -> {real}" if real != Path(given).absolute() else "")
        for role, given, real in outside[:_SHOWN]
    ]
    if len(outside) > _SHOWN:
        lines.append(f"  ... and {len(outside) - _SHOWN} more")
    shown = ", ".join(str(r) for r in resolved_roots) or "none"
    common = Path(os.path.commonpath([str(real.parent) for _, _, real in outside]))
    hint = (
        f"name the folder that holds them if you mean it: --allow-root {common}"
        if unsafe_document_root(common) is None
        else "name the folder(s) that hold them with --allow-root DIR if you mean it"
    )
    raise OutsideRootsError(
        f"{len(outside)} {'/'.join(roles)} file(s) resolve outside the data roots "
        f"({shown}); absolute paths, '..' and symlinks may not lead out of them; {hint}:\n"
        + "\n".join(lines)
    )


def home_folders() -> list[Path]:
    """The home folders of this machine: the user's, ``$HOME``, and every account's home
    that exists (``pwd``), resolved."""
    homes = {Path.home()}
    if os.environ.get("HOME"):
        homes.add(Path(os.environ["HOME"]))
    try:
        import pwd

        homes.update(Path(e.pw_dir) for e in pwd.getpwall() if e.pw_dir)
    except ImportError:  # Windows: no pwd
        pass
    return sorted({h.resolve() for h in homes if h.is_absolute() and h.is_dir()})


def unsafe_document_root(folder: str | Path) -> str | None:
    """Why ``folder`` may not be Label Studio's document root (``None``: it may): it is the
    file system's root, or a parent of a home folder (``/home``, ``/Users`` always count)."""
    f = Path(folder).absolute().resolve()
    if f == Path(f.anchor):
        return f"{f} is the root of the file system"
    for parent in (Path("/home"), Path("/Users")):
        if f == parent:
            return f"{f} holds the home folders"
    for home in home_folders():
        if f in home.parents:
            return f"{f} holds the home folder {home}"
    return None


def label_studio_root(roots: list[Path], option: Path | None) -> Path | None:
    """The folder Label Studio may serve a project's files from: ``option``
    (``store.label_studio_root``), else the deepest folder holding every data root; ``None``
    when that folder is ``/`` or a parent of a home folder (no safe single root: set
    ``store.label_studio_root``, or keep the data under one folder).

    Raises:
        UnsafeDocumentRootError: ``option`` is ``/`` or a parent of a home folder.
    """
    if option is not None:
        why = unsafe_document_root(option)
        if why is not None:
            raise UnsafeDocumentRootError(
                f"store.label_studio_root {option}: {why}; Label Studio would serve every file "
                "under it: name the folder that holds the project's images"
            )
        return Path(option).resolve()
    if not roots:
        return None
    common = Path(os.path.commonpath([str(Path(r).resolve()) for r in roots]))
    return None if unsafe_document_root(common) is not None else common


def shown_name(path: str | Path) -> str:
    r"""``path`` as readable text: bytes that are not UTF-8 as ``\xNN`` escapes, control
    characters (a newline) as Python escapes.

    >>> shown_name(os.fsdecode(b"caf\xe9.csv")), shown_name("a\nb.png")
    ('caf\\xe9.csv', 'a\\nb.png')
    """
    text = os.fsencode(path).decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def name_problem(path: str | Path) -> str | None:
    r"""Why the store cannot record ``path`` as text (not UTF-8, or a control character such
    as a newline that would break the CSV and list files it is written to); ``None`` if it can.

    >>> name_problem("a b.png") is None, name_problem("a\nb.png")
    (True, 'holds a control character such as a newline')
    """
    text = str(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "is not UTF-8"
    if any(not c.isprintable() and c != " " for c in text):
        return "holds a control character such as a newline"
    return None


def check_file_names(paths: Sequence[Path], what: str) -> None:
    """Refuse image files whose names are not UTF-8 (the store records names as text) or hold
    a control character such as a newline (it would break the CSV and list files a name is
    written to), every one named readably (:func:`shown_name`), before anything is written.

    Raises:
        ValueError: naming ``what`` and the files.
    """
    bad = [
        f"{shown_name(p)} (its name {why})" for p in paths if (why := name_problem(p)) is not None
    ]
    if bad:
        shown = "; ".join(bad[:10]) + (f"; and {len(bad) - 10} more" if len(bad) > 10 else "")
        raise ValueError(
            f"{what}: {len(bad)} file name(s) the store cannot record: {shown}. Rename them "
            "(UTF-8, one line) and retry; nothing was written"
        )
