"""Private by default and exports through a symlink (issue 39, part B): under a umask of 022
a project store's folders are 0700 and its files 0600 (annotator identities), exports too; an
``export --force`` into a symlinked ``--out`` replaces the linked folder's content and keeps
the link, leaving no temporary file or link."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from eada.cli import main

sys.path.insert(0, str(Path(__file__).parent))
from test_store_reliability import _write_csv, queried  # noqa: F401  (the fixture, reused)


@pytest.fixture
def umask022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.lstat().st_mode)


def test_store_and_exports_are_private_under_umask_022(umask022, queried, tmp_path) -> None:  # noqa: F811
    folder, rows, _ = queried
    _write_csv(tmp_path / "l.csv", rows)
    assert main(["label", "import", str(tmp_path / "l.csv"), "--store", str(folder)]) == 0
    assert main(["train", "--store", str(folder)]) == 0
    wal = folder / "eada.sqlite-wal"
    assert wal.exists()
    assert _mode(folder) == 0o700
    for d in (folder / "checkpoints", folder / "exports"):
        assert _mode(d) == 0o700, d
    assert {_mode(f) for f in (folder / "checkpoints").iterdir()} == {0o600}
    assert _mode(folder / "eada.sqlite") == 0o600 and _mode(wal) == 0o600
    out = tmp_path / "final"
    assert main(["export", "--store", str(folder), "--out", str(out)]) == 0
    assert _mode(out) == 0o700 and {_mode(f) for f in out.iterdir()} == {0o600}


def test_export_force_into_a_symlinked_out_follows_the_link(queried, tmp_path) -> None:  # noqa: F811
    folder, rows, _ = queried
    real, link = tmp_path / "real" / "export", tmp_path / "links" / "export"
    real.parent.mkdir()
    link.parent.mkdir()
    assert main(["export", "--store", str(folder), "--out", str(real)]) == 0
    before = (real / "labels.csv").read_bytes()
    link.symlink_to(real, target_is_directory=True)
    _write_csv(tmp_path / "l.csv", rows)
    assert main(["label", "import", str(tmp_path / "l.csv"), "--store", str(folder)]) == 0
    assert main(["export", "--store", str(folder), "--out", str(link)]) == 2  # not --force
    assert main(["export", "--store", str(folder), "--out", str(link), "--force"]) == 0
    assert link.is_symlink() and link.resolve() == real.resolve()
    assert (real / "labels.csv").read_bytes() != before  # the linked folder's content replaced
    assert sorted(f.name for f in link.parent.iterdir()) == ["export"]  # no stray temp link
    assert sorted(f.name for f in real.parent.iterdir()) == ["export"]
