"""Decode each image once: a uint8 cache of a domain's images at the sizes its views start from.

Fine-tuning reads every image many times (every epoch, every evaluation, every selection
pass). The old path decoded the JPEG and resized it again on every read. This module decodes
each image ONCE into a memory-mapped uint8 file (``data.decode_cache_dir``, default
``.cache/eada/decoded``), holding, per image, the deterministic start of each view in use
(:mod:`eada.data.transforms`), exactly as the PIL transforms produce it:

* ``square``: ``Resize((resize, resize))`` (the ``train`` view, before its random crop);
* ``shorter``: ``Resize(resize)``, the shorter side (the ``random_crop``/``score`` views);
* ``test``: ``Resize((resize, resize))``, ``Resize((test_resize, test_resize))``,
  ``CenterCrop(crop)`` (the whole ``test`` view, before ``ToTensor``).

The random part of a view (crop, flip, colour jitter) is then applied per BATCH from the cache
(:func:`eada.data.transforms.batch_view`), on the training device. The file is named by the
SHA-256 of the images (paths, sizes, modification times), the sizes and the PIL/torchvision
versions, so a second run, seed or method reads it without decoding; it is written under a
temporary name and renamed when complete. Its size is known before it fills (image headers
give the shorter-side sizes) and is stated; a cache over ``data.decode_cache_mb`` or the free
disk space is not built (a message says so) and the images are decoded per batch as before.

A cache file is checked before a process first uses it: its size, and the SHA-256 of each
:data:`BLOCK` bytes, written into its index when it was filled (:func:`verify_cache`; the
blocks are hashed on several threads). A file that fails the check (truncated, bytes
overwritten, an index of another format) is removed and filled again, with a warning naming
it. The temporary files of fills whose process was killed are removed
(:func:`remove_stale_fills`).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from eada.data.transforms import TransformSpec, View

Base = Literal["square", "shorter", "test"]
BASES: tuple[Base, ...] = ("square", "shorter", "test")
FORMAT = 2  # bump when the file layout or what a base holds changes (2: block digests)
BLOCK = 4 * 2**20  # bytes a digest covers
_VERIFIED: set[tuple[str, int, int]] = set()  # (path, size, mtime_ns) checked by this process


def base_of(kind: View, spec: TransformSpec) -> Base:
    """The cached start of view ``kind`` (``train`` -> ``square``, ``random_crop`` and
    ``score`` -> ``shorter``, ``test`` and ``score`` with ``scoring_view: test`` -> ``test``).

    >>> base_of("score", TransformSpec(scoring_view="test"))
    'test'
    """
    if kind == "train":
        return "square"
    if kind == "test" or (kind == "score" and spec.scoring_view == "test"):
        return "test"
    if kind in ("score", "random_crop"):
        return "shorter"
    raise ValueError(f"unknown view {kind!r}; known: train, test, score, random_crop")


def base_shape(base: Base, spec: TransformSpec, width: int, height: int) -> tuple[int, int]:
    """``(height, width)`` of ``base`` for an image of ``width x height`` (torchvision's
    rule for ``Resize(int)``: the shorter side to ``resize``, the longer truncated).

    >>> base_shape("shorter", TransformSpec(), 640, 480)
    (256, 341)
    """
    if base == "square":
        return spec.resize, spec.resize
    if base == "test":
        return spec.crop, spec.crop
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(spec.resize * long / short)
    return (new_long, spec.resize) if width <= height else (spec.resize, new_long)


def base_image(base: Base, spec: TransformSpec, img: Any) -> Any:
    """``base`` of a PIL RGB image, by the same torchvision transforms as the old path."""
    from torchvision import transforms as T

    if base == "square":
        return T.Resize((spec.resize, spec.resize))(img)
    if base == "shorter":
        return T.Resize(spec.resize)(img)
    sq = T.Resize((spec.resize, spec.resize))(img)
    return T.CenterCrop(spec.crop)(T.Resize((spec.test_resize, spec.test_resize))(sq))


@dataclass
class CachePlan:
    """What a decode cache of one domain will hold, before anything is decoded."""

    name: str
    paths: list[Path]
    spec: TransformSpec
    bases: tuple[Base, ...]
    shapes: dict[str, np.ndarray]  # base -> (N, 2) heights and widths
    key: str

    @property
    def nbytes(self) -> int:
        """Bytes of the cache file (uint8, 3 channels)."""
        return int(sum(int((s[:, 0] * s[:, 1]).sum()) * 3 for s in self.shapes.values()))


def plan_cache(
    name: str, paths: Sequence[Path], spec: TransformSpec, bases: Sequence[Base]
) -> CachePlan:
    """The :class:`CachePlan` of ``paths``: sizes from the image headers only (no decoding).

    Raises:
        OSError: an image that cannot be opened, naming the file.
    """
    import torchvision
    from PIL import Image

    chosen = tuple(b for b in BASES if b in set(bases))
    h = hashlib.sha256()
    sizes_key = [spec.resize, spec.crop, spec.test_resize]
    versions = [Image.__version__, torchvision.__version__]
    h.update(json.dumps([FORMAT, chosen, *sizes_key, *versions]).encode())
    sizes = []
    for p in paths:
        st = p.stat()
        h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        if "shorter" in chosen:
            with Image.open(p) as im:
                sizes.append(im.size)
    shapes: dict[str, np.ndarray] = {}
    for b in chosen:
        if b == "shorter":
            rows = [base_shape(b, spec, w, hh) for w, hh in sizes]
        else:
            rows = [base_shape(b, spec, 1, 1)] * len(paths)
        shapes[b] = np.asarray(rows, dtype=np.int64).reshape(len(paths), 2)
    return CachePlan(name, list(paths), spec, chosen, shapes, h.hexdigest())


class DecodeCache:
    """A filled decode cache (read-only memory map); picklable (reopened by path).

    ``image(base, i)`` is image ``i``'s ``base`` as an ``(H, W, 3)`` uint8 array view.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._open()

    def _open(self) -> None:
        with np.load(self.path.with_suffix(".npz")) as idx:
            self.offsets = {b: idx[f"{b}_offsets"] for b in BASES if f"{b}_offsets" in idx}
            self.shapes = {b: idx[f"{b}_shapes"] for b in BASES if f"{b}_shapes" in idx}
        total = sum(int((s[:, 0] * s[:, 1]).sum()) * 3 for s in self.shapes.values())
        self.data = np.memmap(self.path, dtype=np.uint8, mode="r", shape=(max(total, 1),))
        self.nbytes = total

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = state["path"]
        self._open()

    def __len__(self) -> int:
        return len(next(iter(self.offsets.values())))

    def image(self, base: Base, i: int) -> np.ndarray:
        """Image ``i``'s ``base`` (``(H, W, 3)`` uint8, a view of the file)."""
        o = int(self.offsets[base][i])
        hh, w = (int(v) for v in self.shapes[base][i])
        return self.data[o : o + hh * w * 3].reshape(hh, w, 3)


def _offsets(plan: CachePlan) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    start = 0
    for b in plan.bases:
        n = plan.shapes[b][:, 0] * plan.shapes[b][:, 1] * 3
        out[b] = start + np.concatenate([[0], np.cumsum(n)[:-1]]).astype(np.int64)
        start += int(n.sum())
    return out


def cache_complete(plan: CachePlan, folder: Path) -> bool:
    """Whether ``folder`` holds the complete cache of ``plan``: its index (written last) and
    a data file of the planned size (the digests are checked by :func:`fill_cache`)."""
    path = folder / f"{plan.key}.u8"
    try:
        return path.with_suffix(".npz").is_file() and path.stat().st_size == max(plan.nbytes, 1)
    except OSError:
        return False


def block_digests(data: np.ndarray, threads: int = 1) -> np.ndarray:
    """``(ceil(len / BLOCK), 32)`` uint8: the SHA-256 of each :data:`BLOCK` bytes of ``data``
    (a flat uint8 array or memory map), hashed on ``threads`` threads (hashlib releases the
    GIL on large buffers).

    >>> block_digests(np.zeros(10, dtype=np.uint8)).shape
    (1, 32)
    """
    n = max(1, -(-len(data) // BLOCK))

    def one(k: int) -> bytes:
        return hashlib.sha256(np.ascontiguousarray(data[k * BLOCK : (k + 1) * BLOCK]).data).digest()

    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="eada-digest") as pool:
        rows = list(pool.map(one, range(n)))
    return np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(n, 32)


def verify_cache(path: Path, threads: int = 1) -> str | None:
    """What is wrong with the cache file ``path`` (its size or a block's SHA-256 differs from
    what its index recorded at fill time, or the index is unreadable); ``None`` when it is
    intact. A file already verified by this process (same size and modification time) is not
    read again."""
    if not path.is_file():
        return "its data file is missing (its index is there)"
    try:
        st = path.stat()
        with np.load(path.with_suffix(".npz")) as idx:
            if "digests" not in idx or "nbytes" not in idx:
                return "its index holds no digests (an older cache format)"
            digests, nbytes = idx["digests"], int(idx["nbytes"])
    except (OSError, ValueError, KeyError) as err:
        return f"its index cannot be read ({err})"
    stamp = (str(path), st.st_size, st.st_mtime_ns)
    if stamp in _VERIFIED:
        return None
    if st.st_size != max(nbytes, 1):
        return f"{st.st_size:,} bytes where {max(nbytes, 1):,} were written"
    data = np.memmap(path, dtype=np.uint8, mode="r", shape=(st.st_size,))
    try:
        got = block_digests(data, threads)
    finally:
        del data
    if got.shape != digests.shape:
        return "its index records another number of blocks"
    bad = np.flatnonzero((got != digests).any(axis=1))
    if len(bad):
        return (
            f"{len(bad)} of {len(got)} blocks differ from their SHA-256 at fill time "
            f"(first at byte {int(bad[0]) * BLOCK:,})"
        )
    _VERIFIED.add(stamp)
    return None


def remove_stale_fills(folder: Path) -> list[Path]:
    """Delete the temporary files (``.KEY.u8.PID.tmp`` and its ``.npz``) that fills killed
    before they finished left in ``folder``; those of a live process stay. Returns them."""
    from eada.runs import _alive

    removed: list[Path] = []
    if not folder.is_dir():
        return removed
    for f in folder.glob(".*.u8.*.tmp*"):
        head, sep, tail = f.name.rpartition(".tmp")
        pid = head.rsplit(".", 1)[-1]
        if not sep or tail not in ("", ".npz") or not pid.isdigit():
            continue
        if int(pid) == os.getpid() or _alive(int(pid)):
            continue
        f.unlink(missing_ok=True)
        removed.append(f)
    return removed


def _warn(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def fill_cache(
    plan: CachePlan,
    folder: Path,
    threads: int = 1,
    progress: Callable[[str], None] | None = None,
    bad: dict[Path, str] | None = None,
    say: Callable[[str], None] | None = None,
) -> DecodeCache | None:
    """The cache of ``plan`` in ``folder``: read when complete there, else every image decoded
    once (``threads`` threads: PIL releases the GIL while it decodes and resizes), written
    under a temporary name and renamed when complete.

    A cache file already there is checked first (:func:`verify_cache`); a damaged one is
    removed and filled again, ``say`` (default: a ``RuntimeWarning``) naming it. Temporary
    files of killed fills in ``folder`` are removed (:func:`remove_stale_fills`).

    ``bad``: the data check's mode: a missing or undecodable image is recorded there (path ->
    the reason :func:`eada.data.images.find_bad_images` gives) instead of raising, every image
    is still tried, and with any recorded the file is not kept (``None`` returned).

    Raises:
        eada.data.images.ImageDataError: an image that no longer decodes, naming it.
        OSError: the folder cannot be written, naming it.
    """
    from eada.data.images import ImageDataError, open_image
    from eada.runs import named, tmp_name

    path = folder / f"{plan.key}.u8"
    say = say or _warn
    remove_stale_fills(folder)
    if path.with_suffix(".npz").is_file() or path.is_file():
        problem = verify_cache(path, threads)
        if problem is None:
            return DecodeCache(path)
        say(f"decode cache {path} is damaged ({problem}); removing it and decoding again")
        for f in (path.with_suffix(".npz"), path):
            f.unlink(missing_ok=True)
    folder.mkdir(parents=True, exist_ok=True)
    offsets = _offsets(plan)
    tmp = tmp_name(path)
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    mode: Literal["r+", "w+"] = "r+"
    try:  # the blocks reserved now: a full disk is an OSError here, not a SIGBUS mid-fill
        os.posix_fallocate(fd, 0, max(plan.nbytes, 1))
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without it
            raise named(err, path) from None
        mode = "w+"
    finally:
        os.close(fd)
    mm = np.memmap(tmp, dtype=np.uint8, mode=mode, shape=(max(plan.nbytes, 1),))

    def one(i: int) -> None:
        img, reason = open_image(plan.paths[i])
        if img is None:
            if bad is not None:
                bad[plan.paths[i]] = str(reason)
                return
            raise ImageDataError(f"cannot read image {plan.paths[i]}: {reason}")
        for b in plan.bases:
            arr = np.asarray(base_image(b, plan.spec, img), dtype=np.uint8)
            want = tuple(int(v) for v in plan.shapes[b][i])
            if arr.shape != (*want, 3):  # the header's size was not the decoded size
                raise ImageDataError(
                    f"{plan.paths[i]}: decoded {arr.shape[:2]} where its header promised {want}"
                )
            o = int(offsets[b][i])
            mm[o : o + arr.size] = arr.reshape(-1)

    try:
        with ThreadPoolExecutor(max(1, threads), thread_name_prefix="eada-cache") as pool:
            list(pool.map(one, range(len(plan.paths))))
        mm.flush()
        if bad:  # the check found bad images: no cache of this list
            tmp.unlink(missing_ok=True)
            return None
        arrays = {f"{b}_offsets": offsets[b] for b in plan.bases}
        arrays.update({f"{b}_shapes": plan.shapes[b] for b in plan.bases})
        arrays["digests"] = block_digests(mm, threads)
        arrays["nbytes"] = np.asarray(plan.nbytes, dtype=np.int64)
        idx_tmp = tmp.with_name(tmp.name + ".npz")
        with open(idx_tmp, "wb") as fh:
            np.savez(fh, **arrays)  # type: ignore[arg-type]
        os.replace(tmp, path)
        os.replace(idx_tmp, path.with_suffix(".npz"))  # last: its presence = complete
        st = path.stat()
        _VERIFIED.add((str(path), st.st_size, st.st_mtime_ns))  # digests are of these bytes
    except BaseException:
        for f in (tmp, tmp.with_name(tmp.name + ".npz")):
            f.unlink(missing_ok=True)
        raise
    if progress is not None:
        progress(f"decode cache of {plan.name!r}: {len(plan.paths)} images decoded once")
    return DecodeCache(path)


def mib(n: int) -> str:
    """``n`` bytes in MiB, for messages (``'12.3 MiB'``)."""
    return f"{n / 2**20:,.1f} MiB"


def decode_caches(
    plans: Sequence[CachePlan],
    folder: Path,
    limit_mb: int,
    threads: int = 1,
    say: Callable[[str], None] | None = None,
) -> list[DecodeCache] | None:
    """Fill (or read) the caches of ``plans`` in ``folder`` when together they fit
    ``limit_mb`` MiB and the free disk space; ``say`` gets their size BEFORE they fill, or
    why they are not used. ``None`` (no cache: images decoded per batch) when
    ``limit_mb`` is 0 or they do not fit."""
    if limit_mb <= 0 or not plans:
        return None
    total = sum(p.nbytes for p in plans)
    parts = ", ".join(f"{p.name} {len(p.paths)} images {mib(p.nbytes)}" for p in plans)
    need = sum(p.nbytes for p in plans if not cache_complete(p, folder))
    why = not_fitting(total, need, folder, limit_mb)
    if why is not None:
        if say is not None:
            say(
                f"decode cache: {mib(total)} ({parts}) would be {why}; decoding every batch "
                "from the image files instead (slower: raise data.decode_cache_mb or free space)"
            )
        return None
    if say is not None:
        state = "read from" if need == 0 else f"{mib(need)} to decode into"
        say(f"decode cache: {mib(total)} ({parts}), {state} {folder}")
    caches = [fill_cache(p, folder, threads, say=say) for p in plans]
    return [c for c in caches if c is not None]


def not_fitting(total: int, need: int, folder: Path, limit_mb: int) -> str | None:
    """Why caches of ``total`` bytes (``need`` of them still to write) do not fit
    ``limit_mb`` MiB or the free disk under ``folder``; ``None`` when they fit."""
    if total > limit_mb * 2**20:
        return f"over data.decode_cache_mb: {limit_mb:,} MiB"
    probe = folder if folder.exists() else next((q for q in folder.parents if q.exists()), None)
    free = shutil.disk_usage(probe).free if probe is not None else 0
    if need > free:
        return f"more than the {mib(free)} free in {probe}"
    return None


def gather_crops(
    cache: DecodeCache,
    base: Base,
    indices: Sequence[int],
    top: Sequence[int],
    left: Sequence[int],
    size: int,
) -> np.ndarray:
    """``(B, size, size, 3)`` uint8: the ``size x size`` window at ``(top, left)`` of each
    image's ``base`` (a ``test`` base is the whole image)."""
    out = np.empty((len(indices), size, size, 3), dtype=np.uint8)
    for k, i in enumerate(indices):
        img = cache.image(base, int(i))
        t, le = int(top[k]), int(left[k])
        out[k] = img[t : t + size, le : le + size]
    return out
