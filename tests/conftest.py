"""Shared fixtures: where the real data lives, small configs."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture
def digits_root() -> Path:
    """``../shared/data/digits``; the test is skipped where it is absent."""
    root = SHARED_DATA / "digits"
    if not root.is_dir():
        pytest.skip(f"real data not found at {root}")
    return root
