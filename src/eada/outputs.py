"""Where a command may write: the one guard every output path passes before any work.

An output is a regular file, a folder (for the commands that write folders) or a new path. It
is never

* a device node, a FIFO or a socket (an atomic write would rename a file over it: as root,
  ``--out /dev/full`` replaced the machine's ``/dev/full``), nor a symbolic link to a file (the
  rename would replace the link); ``-`` means standard output where a command says so;
* a path the project owns, resolved through symlinks and ``..``: a project store's folder and
  everything already under it (the database, ``checkpoints/``, ``exports/``, the report's own
  files, figures), and nothing new inside its ``checkpoints/`` or ``exports/``; an export
  folder (``model.json`` beside ``model.pt``/``model.onnx``) and its files; the command's own
  inputs (the files it reads in this call, and the files under an input folder; the model it
  loads).

:func:`check_output` applies the rule; the ``eada`` command calls it for every output option
of every command (``eada.cli.check_outputs``, from one table of each command's outputs and
inputs) before any work, and the Python writers (``eada.predict.run_predict``, the reports)
call it again. :func:`check_not_store` is its oldest part, which every low-level writer
(``eada.runs.write_bytes_atomic``, ``staged_folder``, ``append_jsonl``) still applies: a
store's database files are never written by anything but the store.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

STORE_DB_NAME = "eada.sqlite"
"""The database file of a project store (``eada init``); :mod:`eada.store.db` names it so."""
STORE_FILE_NAMES = frozenset(
    STORE_DB_NAME + tail for tail in ("", "-wal", "-shm", "-journal", ".writer")
)
"""The names of a project store's own files: the database, SQLite's write-ahead log, shared
memory index and rollback journal, and the write lock holder's note."""
STORE_FOLDERS = ("checkpoints", "exports")
"""A store's folders into which no command but the store itself writes, new names included."""
EXPORT_FILES = ("model.pt", "model.onnx", "model.pt2")
"""A folder holding ``model.json`` and one of these is an export (``eada export --out``)."""
_SQLITE_MAGIC = b"SQLite format 3\x00"
STDOUT = "-"
"""The output name that means standard output, where a command takes it."""


class OutputError(ValueError):
    """An output path no command may write: a device, FIFO, socket or link, or a path the
    project owns (a store's files, an export's model, the command's own inputs)."""


class StoreFileError(OutputError):
    """An output path that would write over a project store's own files (its database, the
    database's ``-wal``/``-shm``/``-journal``, or a folder holding a store)."""


def _kind(mode: int) -> str | None:
    """What a non-regular, non-folder, non-link file is (``None``: a regular file or folder)."""
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return None


def _real(path: Path) -> Path:
    """``path`` absolute, through every symlink and ``..`` (a dangling link: where it points)."""
    try:
        return Path(os.path.realpath(path.absolute()))
    except (OSError, RuntimeError, ValueError):  # a symlink loop: nothing to write through
        return path.absolute()


def check_not_store(path: str | Path, what: str = "--out") -> None:
    """Refuse an output ``path`` that is a project store's own file or a folder holding one,
    directly or through a symlink: a name in :data:`STORE_FILE_NAMES`, a folder that holds
    ``eada.sqlite``, or an existing SQLite database (a hard link or a copy of a store).
    Every writer of eada's outputs calls it (``eada.runs.write_bytes_atomic``,
    ``staged_folder``, ``append_jsonl``, the feature and list writers); :func:`check_output`
    applies it first.

    Args:
        path: the file or folder a command is about to write.
        what: how the message names it (the option, e.g. ``--out``).

    Raises:
        StoreFileError: ``path`` is (or points at) a store's file or a folder holding a store.

    Example:
        >>> import tempfile
        >>> check_not_store(Path(tempfile.mkdtemp()) / "report.html")
        >>> try:
        ...     check_not_store("p/eada.sqlite-wal")
        ... except StoreFileError as err:
        ...     print(str(err)[:48])
        --out p/eada.sqlite-wal is a project store's own
    """
    given = Path(path)
    seen: list[Path] = [given.absolute()]
    real = _real(given)
    if real != seen[0]:
        seen.append(real)
    keep = "nothing was written; the store's labels, votes and disputes live there"
    for p in seen:
        via = "" if p == seen[0] else f" (through a symlink: {p})"
        if p.name in STORE_FILE_NAMES:
            raise StoreFileError(
                f"{what} {path} is a project store's own file{via}: writing it would destroy "
                f"the store; {keep}. Name another file"
            )
        if (p / STORE_DB_NAME).exists():
            raise StoreFileError(
                f"{what} {path} is a folder holding a project store ({p / STORE_DB_NAME}){via}; "
                f"{keep}. Name another folder (e.g. a new one inside it)"
            )
    if not real.is_file():  # a FIFO or a device (/dev/stdout) is never read: it could block
        return
    try:
        with open(real, "rb") as fh:  # a hard link to, or a renamed copy of, a database
            head = fh.read(len(_SQLITE_MAGIC))
    except OSError:
        return
    if head == _SQLITE_MAGIC:
        raise StoreFileError(
            f"{what} {path} is an SQLite database (a project store's file, or a link to one); "
            f"{keep}. Name another file"
        )


def check_not_special(path: str | Path, what: str = "the output") -> None:
    """Refuse a ``path`` that is a device node, a FIFO or a socket (never renamed over, never
    written through). A missing path, a regular file or a folder passes.

    Raises:
        OutputError: naming the path and what it is.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); os.mkfifo(d / "pipe")
        >>> check_not_special(d / "new.csv")
        >>> check_not_special(d / "pipe")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        eada.outputs.OutputError: the output .../pipe is a FIFO (named pipe), not a regular file...
    """
    try:
        st = os.stat(path)  # through links: a link to a device is a device
    except (OSError, ValueError):
        return
    kind = _kind(st.st_mode)
    if kind is not None:
        raise OutputError(
            f"{what} {path} is {kind}, not a regular file: eada writes outputs through a "
            "temporary file renamed over the target, which would replace it; nothing was "
            "written. Name a regular file or a new path"
            + ("" if what == "the output" else " (or - for standard output, where offered)")
        )


def _owner(real: Path) -> tuple[Path, str] | None:
    """The nearest store or export folder at or above ``real``: ``(folder, "store"|"export")``."""
    for folder in (real, *real.parents):
        try:
            if (folder / STORE_DB_NAME).is_file():
                return folder, "store"
            if (folder / "model.json").is_file() and any(
                (folder / name).is_file() for name in EXPORT_FILES
            ):
                return folder, "export"
        except OSError:
            continue
    return None


def _under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def check_output(
    path: str | Path,
    what: str = "--out",
    *,
    kind: Literal["file", "folder", "export"] = "file",
    inputs: Iterable[str | Path] = (),
    allow: Sequence[str | Path] = (),
    stdout: bool = False,
) -> None:
    """Refuse, before any work, an output ``path`` that no command may write (the module's
    rule), naming the path and what owns it.

    Args:
        path: the output as the user gave it.
        what: how the message names it (``--out``, ``--figures``).
        kind: ``file`` (a file written whole: a symlink is refused too), ``folder`` (a folder
            the command creates or fills; a symlink to a folder is followed), ``export`` (a
            folder ``eada export`` writes: an existing export there is its own, which
            ``--force`` may replace).
        inputs: the files and folders the command reads in this call (a model folder
            included): the output may be none of them, nor an existing file under a folder
            among them.
        allow: paths the command itself owns and rewrites (``eada report P`` writes
            ``P/report.html``).
        stdout: ``-`` means standard output for this command (else it is refused).

    Raises:
        OutputError: a device, FIFO, socket or link; ``-`` where standard output is not
            offered; a path the project owns (:class:`StoreFileError` for a store's own file).

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); (d / "x.npy").write_bytes(b"x")
        1
        >>> check_output(d / "preds.csv", inputs=[d / "x.npy"])
        >>> check_output(d / "x.npy", inputs=[d / "x.npy"])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        eada.outputs.OutputError: --out .../x.npy is an input of this command...
    """
    text = str(path)
    if text == STDOUT:
        if stdout:
            return
        raise OutputError(f"{what} -: this command cannot write to standard output; name a file")
    if not text:
        raise OutputError(f"{what}: an empty path; name a file")
    given = Path(path)
    check_not_store(given, what)
    check_not_special(given, what)
    if kind == "file" and given.is_symlink():
        raise OutputError(
            f"{what} {path} is a symbolic link (to {os.readlink(given)}): the write would "
            "replace the link, not the file it names; nothing was written. Name the file "
            "itself or a new path"
        )
    real = _real(given)
    exists = os.path.lexists(real)
    if any(_real(Path(a)) == real for a in allow):
        return
    owner = _owner(real)
    if owner is not None:
        _check_owned(path, what, kind, real, given, exists, owner)
    nothing = "nothing was written; name another path"
    for inp in inputs:
        src = _real(Path(inp))
        if real == src or (exists and not real.is_dir() and _under(real, src)):
            shown = "" if real == given.absolute() else f" (resolves to {real})"
            role = "an input" if real == src else f"a file under the input folder {inp}"
            raise OutputError(
                f"{what} {path}{shown} is {role} of this command: writing it would destroy "
                f"what the command reads; {nothing}"
            )
        if kind != "file" and _under(src, real) and src != real:
            raise OutputError(
                f"{what} {path} holds the input {inp} of this command: writing into it could "
                f"replace what the command reads; {nothing}"
            )


def _check_owned(
    path: str | Path,
    what: str,
    kind: str,
    real: Path,
    given: Path,
    exists: bool,
    owner: tuple[Path, str],
) -> None:
    """Refuse ``real`` under a store or export folder ``owner`` (:func:`check_output`)."""
    nothing = "nothing was written; name another path"
    folder, what_kind = owner
    shown = "" if real == given.absolute() else f" (resolves to {real})"
    if what_kind == "store":
        rel = real.relative_to(folder).parts
        sub = rel[0] if rel else ""
        if sub in STORE_FOLDERS or exists:
            place = f"its {sub}/ folder" if sub in STORE_FOLDERS else "its folder"
            raise StoreFileError(
                f"{what} {path}{shown} is inside the project store {folder} ({place}, which "
                f"the store owns: checkpoints, round exports, the report); writing it would "
                f"break the store; {nothing} (a new path outside its checkpoints/ and exports/)"
            )
        return
    # an export folder: its model files and metadata are the model's; eada export --force
    # may replace its own previous export as a whole
    if kind == "export" and real == folder:
        return
    if exists or real == folder:
        raise OutputError(
            f"{what} {path}{shown} is inside the exported model {folder} (its model files and "
            f"metadata); writing it would destroy the model; {nothing}"
        )


__all__ = [
    "EXPORT_FILES",
    "STDOUT",
    "STORE_DB_NAME",
    "STORE_FILE_NAMES",
    "STORE_FOLDERS",
    "OutputError",
    "StoreFileError",
    "check_not_special",
    "check_not_store",
    "check_output",
]
