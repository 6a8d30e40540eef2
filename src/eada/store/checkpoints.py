"""Checkpoint files of a project store: written atomically (temporary file, fsync,
``os.replace``), recorded with their SHA-256 in the transaction of the step that produced them,
checked on load; and the fault injection the crash tests use."""

from __future__ import annotations

import errno
import json
import os
import signal
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from eada.runs import tmp_name, write_through
from eada.store.base import ProjectBase
from eada.store.db import StoreError, now


def crash_point(name: str) -> None:
    """Fault injection for the crash tests: ``EADA_CRASH_AT=name`` SIGKILLs the process here."""
    if os.environ.get("EADA_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file (checkpoints, registered images)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_atomic(obj: Any, path: Path) -> None:
    """``torch.save`` through a temporary file (fsynced, then ``os.replace``): ``path`` is
    whole or absent, and a failed write (disk full) leaves no temporary file behind.

    Raises:
        StoreError: the write failed for lack of space (or quota), naming ``path``.
    """
    import torch

    tmp = tmp_name(path)
    try:
        write_through(tmp, lambda fh: torch.save(obj, fh), 0o600)  # a full disk: its OSError
        crash_point("checkpoint:tmp_written")
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StoreError(
                f"no space left on the device writing {path}: free disk space and retry; "
                "nothing was recorded and no partial file was left"
            ) from None
        raise


class ProjectCheckpoints(ProjectBase):
    """A project store's checkpoints (see :class:`~eada.store.project.Project`)."""

    def _write_checkpoint(self, state: dict[str, Any], kind: str, epoch: int) -> tuple[str, str]:
        name = f"{kind}-e{epoch:04d}-{uuid.uuid4().hex[:10]}.pt"
        path = self.folder / "checkpoints" / name
        save_atomic(state, path)
        return f"checkpoints/{name}", file_sha256(path)

    def _record_checkpoint(
        self,
        c: sqlite3.Connection,
        rel: str,
        sha: str,
        kind: str,
        epoch: int,
        segment: tuple[int, int],
        n_labeled: int,
        metrics: Any,
    ) -> int:
        cur = c.execute(
            "INSERT INTO checkpoints (kind, path, sha256, epoch, segment_start, segment_end, "
            "n_labeled, metrics, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (kind, rel, sha, epoch, *segment, n_labeled, json.dumps(metrics), now()),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid

    @contextmanager
    def _unused_if_failed(self, rel: str) -> Iterator[None]:
        """Delete the checkpoint file ``rel`` when the transaction recording it fails."""
        try:
            yield
        except BaseException:
            (self.folder / rel).unlink(missing_ok=True)
            raise

    def load_checkpoint(self, row: sqlite3.Row) -> dict[str, Any]:
        """A checkpoint's state, after checking its SHA-256 (``torch.load(weights_only=True)``)."""
        import torch

        path = self.folder / row["path"]
        if not path.is_file():
            raise StoreError(f"checkpoint {path} is missing")
        if file_sha256(path) != row["sha256"]:
            raise StoreError(f"checkpoint {path} does not match its recorded SHA-256")
        try:
            state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # pickle payloads (refused by weights_only), truncated files
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise StoreError(
                f"checkpoint {path} cannot be loaded as tensors ({type(err).__name__}: {first}); "
                "it was not written by eada or is damaged, and nothing in it was run"
            ) from None
        mask = state.get("labeled_mask")
        n = len(self.store.samples("target"))
        if isinstance(mask, torch.Tensor) and mask.shape[0] != n and row["kind"] != "epoch":
            # the pool grew or shrank since (`eada target scan`): the labeled set is set
            # again from the store before any use, so only its size matters here
            state["labeled_mask"] = torch.zeros(n, dtype=torch.bool)
            state["target_labels"] = torch.full((n,), -1, dtype=torch.long)
        return state
