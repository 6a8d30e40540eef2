"""What the ``eada`` command says when something goes wrong: one place maps every error a user
can cause (bad config, bad input file, a locked, read-only, damaged or full store, missing
files, a training run that diverged) to one clear message and exit status 2; anything else is
a bug, whose traceback goes to a log file that the message names (exit status 1).

Example:
    >>> user_message(FileExistsError(17, "File exists", "out.csv"))
    'file exists: out.csv'
    >>> user_message(FloatingPointError("loss became nan; lower the learning rate"))
    'training diverged: loss became nan; lower the learning rate'
    >>> user_message(KeyError("x")) is None
    True
"""

from __future__ import annotations

import datetime as _dt
import errno
import os
import pickle
import sqlite3
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

LOG_DIR_ENV = "EADA_LOG_DIR"
USER_ERROR = 2  # the exit status of an error the user can fix
INTERNAL_ERROR = 1

_OS_HINTS = {
    errno.ENOSPC: "free disk space and retry; nothing was half-written",
    errno.EDQUOT: "free space within your disk quota and retry",
    errno.EROFS: "the file system is read-only; write somewhere else",
    errno.EACCES: "check the permissions",
    errno.EPERM: "check the permissions",
}


def user_message(err: BaseException, store: str | Path | None = None) -> str | None:
    """The one-line message for an error a user can cause, or ``None`` for an unexpected one.

    Args:
        err: the exception.
        store: the project store the command worked on, named in messages whose error does
            not name a file.
    """
    from eada.store.db import translate_sqlite_error

    where = f"project store {store}" if store else None
    at = f" ({where})" if where else ""
    if isinstance(err, RecursionError):
        return f"input nested too deeply to read{at}: {err}"
    if isinstance(err, pickle.UnpicklingError):
        return (
            f"refused to load a file holding Python objects other than tensors{at} ({err}); "
            "only load files you trust"
        )
    if isinstance(err, sqlite3.Error):
        mapped = translate_sqlite_error(err, Path(store) if store else Path("."))
        return str(mapped) if mapped is not None else None
    if isinstance(err, OSError):
        if isinstance(err, FileNotFoundError | FileExistsError) and err.errno is None:
            return str(err)  # our own message, naming the file
        if err.errno in (
            errno.ENOENT,
            errno.EEXIST,
            errno.EISDIR,
            errno.ENOTDIR,
            errno.ENOTEMPTY,
            *_OS_HINTS,
        ):
            what = (err.strerror or str(err)).lower()
            name = err.filename if err.filename is not None else (where or "")
            hint = _OS_HINTS.get(err.errno or 0)
            return f"{what}: {name}" + (f" ({hint})" if hint else "")
        return None
    if isinstance(err, FloatingPointError):  # a run whose loss or energies stopped being finite
        return f"training diverged{at}: {err}"
    if isinstance(err, ValueError | OverflowError | MemoryError):
        text = str(err) or type(err).__name__
        return text if isinstance(err, ValueError) else f"{type(err).__name__}{at}: {text}"
    return None


def log_dir() -> Path:
    """Where tracebacks of unexpected errors go: ``$EADA_LOG_DIR``, else
    ``~/.cache/eada/logs``, else the system's temporary folder."""
    env = os.environ.get(LOG_DIR_ENV)
    if env:
        return Path(env)
    return Path.home() / ".cache" / "eada" / "logs"


def write_traceback(err: BaseException, argv: list[str] | None = None) -> Path:
    """Write ``err``'s traceback (and the command line) to a new log file; returns its path."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    from eada.store.labelstudio import scrub

    text = f"eada {' '.join(argv if argv is not None else sys.argv[1:])}\n" + "".join(
        traceback.format_exception(type(err), err, err.__traceback__)
    )
    text = scrub(text)  # no token, no URL password in a log one is asked to share
    for folder in (log_dir(), Path(tempfile.gettempdir())):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"eada-error-{stamp}-{os.getpid()}.log"
            path.write_text(text, encoding="utf-8")
            return path
        except OSError:
            continue
    raise err


def report_error(
    err: BaseException,
    say: Callable[[str], None],
    argv: list[str] | None = None,
    store: str | Path | None = None,
) -> int:
    """Say what went wrong and return the exit status: :data:`USER_ERROR` with the one-line
    message of :func:`user_message`; for anything else :data:`INTERNAL_ERROR`, with the
    traceback written to a log file that the message names. Neither holds a secret: the
    Label Studio token and URL passwords are hidden (:func:`eada.store.labelstudio.scrub`)."""
    from eada.store.labelstudio import scrub

    msg = user_message(err, store)
    if msg is not None:
        say(scrub(f"error: {msg}"))
        return USER_ERROR
    log = write_traceback(err, argv)
    say(
        f"error: unexpected {type(err).__name__}: {scrub(str(err))}. This is a bug in eada (or "
        f"an input it does not check yet); the traceback is in {log}. Please report it with "
        "that file."
    )
    return INTERNAL_ERROR
