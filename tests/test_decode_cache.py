"""The decode cache is verified before use (issue 39): a fill killed midway leaves no
temporary file for good, a truncated ``.u8`` or one with bytes overwritten at the same size is
found by its size or block digests, named in a warning and filled again."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from eada.data import decoded
from eada.data.decoded import fill_cache, plan_cache, verify_cache
from eada.data.images import scan_domain_folder
from eada.data.transforms import TransformSpec

sys.path.insert(0, str(Path(__file__).parent))
from test_atomic_exports import small_tmpfs  # noqa: F401  (the fixture, reused)
from test_images import _make_domain

SPEC = TransformSpec(resize=36, crop=32, test_resize=40, jitter=None)


@pytest.fixture
def filled(tmp_path: Path) -> tuple[decoded.CachePlan, Path, np.ndarray]:
    """A filled cache of 12 small images: its plan, folder and bytes."""
    il = scan_domain_folder(_make_domain(tmp_path, "d", n=6))
    plan = plan_cache("d", il.paths, SPEC, ["square", "test"])
    folder = tmp_path / "dec"
    cache = fill_cache(plan, folder)
    assert cache is not None
    return plan, folder, np.array(cache.data)


def _refill(plan: decoded.CachePlan, folder: Path) -> tuple[np.ndarray, list[str]]:
    decoded._VERIFIED.clear()  # as a new process: nothing verified yet
    said: list[str] = []
    cache = fill_cache(plan, folder, say=said.append)
    assert cache is not None
    return np.array(cache.data), said


def test_an_intact_cache_is_read_without_a_warning(filled) -> None:
    plan, folder, before = filled
    after, said = _refill(plan, folder)
    assert said == [] and np.array_equal(after, before)


def test_a_truncated_cache_file_is_named_and_rebuilt(filled) -> None:
    plan, folder, before = filled
    path = folder / f"{plan.key}.u8"
    os.truncate(path, path.stat().st_size // 2)
    assert not decoded.cache_complete(plan, folder)  # the data check decodes again too
    after, said = _refill(plan, folder)
    assert len(said) == 1 and str(path) in said[0] and "bytes where" in said[0]
    assert np.array_equal(after, before)
    assert verify_cache(path) is None


def test_bytes_overwritten_at_the_same_size_are_found_by_the_digests(filled) -> None:
    plan, folder, before = filled
    path = folder / f"{plan.key}.u8"
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.seek(size // 3)
        fh.write(bytes(255 - b for b in before[size // 3 : size // 3 + 64]))
    assert path.stat().st_size == size and decoded.cache_complete(plan, folder)
    decoded._VERIFIED.clear()
    assert "differ from their SHA-256" in (verify_cache(path) or "")
    after, said = _refill(plan, folder)
    assert len(said) == 1 and str(path) in said[0] and "SHA-256" in said[0]
    assert np.array_equal(after, before)


def test_the_temporary_file_of_a_fill_killed_midway_is_removed(tmp_path: Path) -> None:
    il = scan_domain_folder(_make_domain(tmp_path, "d", n=6))
    folder = tmp_path / "dec"
    code = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from eada.data import images
        from eada.data.decoded import fill_cache, plan_cache
        from eada.data.transforms import TransformSpec
        slow = images.open_image
        def one(p):
            time.sleep(0.5)
            return slow(p)
        images.open_image = one
        paths = [Path(p) for p in {[str(p) for p in il.paths]!r}]
        spec = TransformSpec(resize=36, crop=32, test_resize=40, jitter=None)
        fill_cache(plan_cache("d", paths, spec, ["square", "test"]), Path({str(folder)!r}))
    """)
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 60
        while not list(folder.glob(".*.u8.*.tmp")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, "the fill ended before it could be killed"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    (stale,) = list(folder.glob(".*.u8.*.tmp"))
    assert stale.name.endswith(f".{proc.pid}.tmp")
    plan = plan_cache("d", il.paths, SPEC, ["square", "test"])
    assert fill_cache(plan, folder) is not None
    assert not stale.exists()
    assert sorted(f.suffix for f in folder.iterdir()) == [".npz", ".u8"]


def test_a_live_fill_keeps_its_temporary_file(tmp_path: Path) -> None:
    folder = tmp_path / "dec"
    folder.mkdir()
    mine = folder / f".abc.u8.{os.getppid()}.tmp"  # a live process (this test's parent)
    mine.write_bytes(b"x")
    assert decoded.remove_stale_fills(folder) == [] and mine.exists()


def test_a_fill_that_cannot_fit_the_disk_is_enospc_naming_the_file(
    tmp_path: Path,
    small_tmpfs: Path,  # noqa: F811
) -> None:
    """The cache's blocks are reserved before decoding: a full disk is the documented OSError
    naming the file (not a SIGBUS writing into a memory map), and no temporary file stays."""
    il = scan_domain_folder(_make_domain(tmp_path, "d", n=6))
    plan = plan_cache("d", il.paths, TransformSpec(resize=256, crop=224), ["square", "test"])
    assert plan.nbytes > 2 * 2**20
    with pytest.raises(OSError) as got:
        fill_cache(plan, small_tmpfs / "dec")
    assert got.value.errno == errno.ENOSPC and got.value.filename == str(
        small_tmpfs / "dec" / f"{plan.key}.u8"
    )
    assert list((small_tmpfs / "dec").iterdir()) == []
