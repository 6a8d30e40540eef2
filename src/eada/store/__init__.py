"""A crash-safe project store for real (and simulated) annotation rounds: SQLite (WAL,
transactions) holding samples, classes, labels, rounds and checkpoints; see
``docs/annotation.md``.

The names below are imported from their modules when first used, so that a command reading
one module of the store (``eada status``, ``eada label import``) does not import the others
(and torch with them)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eada.store.config import FolderData
    from eada.store.data import confine
    from eada.store.db import SCHEMA_VERSION, Store, StoreError
    from eada.store.labelfiles import ImportFileError
    from eada.store.project import ImportValidationError, Project, init_project

_HOMES = {
    "SCHEMA_VERSION": "eada.store.db",
    "FolderData": "eada.store.config",
    "ImportFileError": "eada.store.labelfiles",
    "ImportValidationError": "eada.store.project",
    "Project": "eada.store.project",
    "Store": "eada.store.db",
    "StoreError": "eada.store.db",
    "confine": "eada.store.data",
    "init_project": "eada.store.project",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'eada.store' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


__all__ = [
    "SCHEMA_VERSION",
    "FolderData",
    "ImportFileError",
    "ImportValidationError",
    "Project",
    "Store",
    "StoreError",
    "confine",
    "init_project",
]
