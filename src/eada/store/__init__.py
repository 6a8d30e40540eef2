"""A crash-safe project store for real (and simulated) annotation rounds: SQLite (WAL,
transactions) holding samples, classes, labels, rounds and checkpoints; see
``docs/annotation.md``."""

from eada.store.config import FolderData
from eada.store.data import confine
from eada.store.db import SCHEMA_VERSION, Store, StoreError
from eada.store.labelfiles import ImportFileError
from eada.store.project import ImportValidationError, Project, init_project

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
