"""The three digit domains (MNIST, USPS, MNIST-M), read from their original public formats.

Expected layout under ``root`` (the ``digits`` folder)::

    mnist/t10k-images-idx3-ubyte.gz        IDX, 10,000 x 28 x 28 grey
    mnist/t10k-labels-idx1-ubyte.gz        IDX, 10,000 labels
    usps/zip.train.gz                      ESL format, 7,291 lines: digit, then 256 values
    usps/zip.test.gz                       ESL format, 2,007 lines
    mnist_m/mnist_m_test/*.png             9,001 x 32 x 32 RGB
    mnist_m/mnist_m_test_labels.txt        ``file label`` a line

The raw readers (:func:`read_mnist_idx`, :func:`read_usps`, :func:`read_mnist_m`) return
``uint8`` images and ``int64`` labels as numpy arrays; :func:`load_digits` turns a domain into a
model-ready :class:`~eada.data.base.TensorDomain` (resized, grey/RGB converted, normalised to
``[-1, 1]``). Nothing is cached on disk.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from eada.data.base import TensorDomain
from eada.data.images import check_image_memory

__all__ = [
    "DIGIT_DOMAINS",
    "load_digits",
    "read_mnist_idx",
    "read_mnist_m",
    "read_usps",
]

DIGIT_DOMAINS: tuple[str, ...] = ("mnist", "usps", "mnist_m")
"""Names accepted by :func:`load_digits`."""

_SPLITS: tuple[str, ...] = ("all", "train", "test")
_CLASSES: list[str] = [str(d) for d in range(10)]

# IDX magic numbers: two zero bytes, the type code (0x08 = unsigned byte), the number of dims.
_IDX_UBYTE = 0x08
_MNIST_IMAGES = "t10k-images-idx3-ubyte.gz"
_MNIST_LABELS = "t10k-labels-idx1-ubyte.gz"
_USPS_TRAIN = "zip.train.gz"
_USPS_TEST = "zip.test.gz"
_MNIST_M_FOLDER = "mnist_m_test"
_MNIST_M_LABELS = "mnist_m_test_labels.txt"

# ITU-R BT.601 luma weights (the ones Pillow's ``convert("L")`` uses).
_LUMA = (0.299, 0.587, 0.114)


def _require_file(path: Path) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"digits data file not found: {path}")


def _read_gzip(path: Path) -> bytes:
    """The decompressed content of a gzip file, with corrupt streams reported as ValueError."""
    _require_file(path)
    try:
        with gzip.open(path, "rb") as fh:
            return fh.read()
    except (EOFError, OSError, zlib.error) as err:
        raise ValueError(f"{path}: not a readable gzip file ({err})") from err


def _read_idx(path: Path, ndim: int) -> np.ndarray:
    """Parse one gzipped IDX file of unsigned bytes with ``ndim`` dimensions."""
    raw = _read_gzip(path)
    if len(raw) < 4:
        raise ValueError(f"{path}: truncated IDX file ({len(raw)} bytes, no complete header)")
    zero, dtype_code, file_ndim = struct.unpack(">HBB", raw[:4])
    magic = int.from_bytes(raw[:4], "big")
    expected_magic = (_IDX_UBYTE << 8) | ndim
    if zero != 0 or dtype_code != _IDX_UBYTE or file_ndim != ndim:
        raise ValueError(
            f"{path}: bad IDX magic number 0x{magic:08x}, expected 0x{expected_magic:08x} "
            f"(unsigned bytes, {ndim} dimension{'s' if ndim > 1 else ''})"
        )
    header_len = 4 + 4 * ndim
    if len(raw) < header_len:
        raise ValueError(
            f"{path}: truncated IDX file ({len(raw)} bytes, header needs {header_len})"
        )
    dims = struct.unpack(f">{ndim}I", raw[4:header_len])
    expected = int(np.prod(dims, dtype=np.int64))
    found = len(raw) - header_len
    if found < expected:
        raise ValueError(
            f"{path}: truncated IDX file: dims {tuple(dims)} need {expected} data bytes, "
            f"found {found}"
        )
    if found > expected:
        raise ValueError(
            f"{path}: IDX file has {found - expected} unexpected trailing bytes after "
            f"dims {tuple(dims)}"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header_len).reshape(dims)


def read_mnist_idx(images_gz: Path, labels_gz: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read an MNIST image/label pair of gzipped IDX files.

    Args:
        images_gz: gzipped IDX3 file of ``uint8`` images (magic ``0x00000803``).
        labels_gz: gzipped IDX1 file of ``uint8`` labels (magic ``0x00000801``).

    Returns:
        ``(images, labels)``: ``uint8`` of shape ``(N, H, W)`` (``28 x 28`` for MNIST) and
        ``int64`` of shape ``(N,)``.

    Raises:
        FileNotFoundError: a file is missing.
        ValueError: naming the file, on a bad magic number, a truncated file or a count
            mismatch between images and labels.
    """
    images_gz, labels_gz = Path(images_gz), Path(labels_gz)
    images = _read_idx(images_gz, ndim=3)
    labels = _read_idx(labels_gz, ndim=1)
    if images.shape[0] != labels.shape[0]:
        raise ValueError(
            f"count mismatch: {images_gz} holds {images.shape[0]} images but "
            f"{labels_gz} holds {labels.shape[0]} labels"
        )
    return images.copy(), labels.astype(np.int64)


def read_usps(path_gz: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read a gzipped USPS file in the ESL format (``zip.train.gz`` / ``zip.test.gz``).

    Each line holds the digit (written as a float, e.g. ``6.0000``) followed by 256 grey
    values in ``[-1, 1]`` (a 16 x 16 image in row-major order).

    Args:
        path_gz: the gzipped file.

    Returns:
        ``(images, labels)``: ``uint8`` of shape ``(N, 16, 16)``, grey values mapped linearly
        from ``[-1, 1]`` to ``[0, 255]``, and ``int64`` labels of shape ``(N,)`` in ``0..9``.

    Raises:
        FileNotFoundError: the file is missing.
        ValueError: naming the file and the line, on a malformed line (wrong number of
            values, non-numeric value, label not a digit 0..9).
    """
    path_gz = Path(path_gz)
    text = _read_gzip(path_gz).decode("ascii", errors="replace")
    lines = [(no, line) for no, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if not lines:
        raise ValueError(f"{path_gz}: no samples found")
    try:  # fast path: numpy's C parser
        values = np.loadtxt([line for _, line in lines], dtype=np.float64, comments=None, ndmin=2)
    except ValueError:
        values = np.empty((0, 0))
    if values.shape != (len(lines), 257):
        _diagnose_usps(path_gz, lines)
        raise ValueError(f"{path_gz}: malformed USPS file (could not parse it as numbers)")
    finite = np.isfinite(values).all(axis=1)
    if not finite.all():
        row = int(np.flatnonzero(~finite)[0])
        raise ValueError(f"{path_gz}, line {lines[row][0]}: non-finite value")
    raw_labels = values[:, 0]
    labels = np.rint(raw_labels).astype(np.int64)
    bad = np.flatnonzero((np.abs(raw_labels - labels) > 1e-6) | (labels < 0) | (labels > 9))
    if bad.size:
        row = int(bad[0])
        raise ValueError(
            f"{path_gz}, line {lines[row][0]}: label {float(raw_labels[row])!r} is not a digit 0..9"
        )
    pixels = values[:, 1:]
    grey = np.rint((np.clip(pixels, -1.0, 1.0) + 1.0) * 127.5).astype(np.uint8)
    return grey.reshape(-1, 16, 16), labels


def _diagnose_usps(path: Path, lines: list[tuple[int, str]]) -> None:
    """Raise a ValueError naming the first malformed line of a USPS file."""
    for lineno, line in lines:
        tokens = line.split()
        if len(tokens) != 257:
            raise ValueError(
                f"{path}, line {lineno}: expected 257 values (digit + 256 pixels), "
                f"found {len(tokens)}"
            )
        for token in tokens:
            try:
                float(token)
            except ValueError:
                raise ValueError(f"{path}, line {lineno}: non-numeric value {token!r}") from None


def read_mnist_m(folder: Path, labels_file: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read MNIST-M: PNG images in ``folder`` listed with their labels in ``labels_file``.

    Args:
        folder: the folder holding the PNG files (e.g. ``mnist_m/mnist_m_test``).
        labels_file: text file with one ``file label`` pair a line (e.g.
            ``00000000.png 7``); the images are returned in this file's order.

    Returns:
        ``(images, labels)``: ``uint8`` of shape ``(N, H, W, 3)`` (``32 x 32`` for MNIST-M)
        and ``int64`` of shape ``(N,)``.

    Raises:
        FileNotFoundError: the folder, the labels file, or an image named in it is missing.
        ValueError: naming file and line, on a malformed labels line or a label outside
            ``0..9``; or when the images do not all share one size.
    """
    folder, labels_file = Path(folder), Path(labels_file)
    if not folder.is_dir():
        raise FileNotFoundError(f"MNIST-M image folder not found: {folder}")
    _require_file(labels_file)
    names: list[str] = []
    labels_list: list[int] = []
    linenos: list[int] = []
    with open(labels_file, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            tokens = line.split()
            if not tokens:
                continue
            if len(tokens) != 2:
                raise ValueError(
                    f"{labels_file}, line {lineno}: expected 'file label', got {line.strip()!r}"
                )
            name, label_str = tokens
            try:
                label = int(label_str)
            except ValueError:
                raise ValueError(
                    f"{labels_file}, line {lineno}: label {label_str!r} is not an integer"
                ) from None
            if not 0 <= label <= 9:
                raise ValueError(f"{labels_file}, line {lineno}: label {label} not in 0..9")
            names.append(name)
            labels_list.append(label)
            linenos.append(lineno)
    if not names:
        raise ValueError(f"{labels_file}: no samples listed")
    # Sequential decoding: the images are tiny, so a thread pool only adds GIL contention.
    arrays: list[np.ndarray] = []
    for name, lineno in zip(names, linenos, strict=True):
        path = folder / name
        try:
            with Image.open(path) as im:
                arr = np.asarray(im.convert("RGB"), dtype=np.uint8)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"MNIST-M image {path} listed in {labels_file} (line {lineno}) does not exist"
            ) from None
        except OSError as err:
            raise ValueError(
                f"MNIST-M image {path} (listed in {labels_file}, line {lineno}) is not a "
                f"readable image: {err}"
            ) from err
        if arrays and arr.shape != arrays[0].shape:
            raise ValueError(
                f"MNIST-M image {path} has shape {arr.shape}, expected {arrays[0].shape} "
                f"like {folder / names[0]}"
            )
        arrays.append(arr)
    return np.stack(arrays), np.asarray(labels_list, dtype=np.int64)


def _to_tensor(images: np.ndarray, image_size: int, channels: int) -> torch.Tensor:
    """``uint8`` ``(N, H, W)`` or ``(N, H, W, 3)`` -> normalised ``float32`` ``(N, C, S, S)``."""
    x = torch.from_numpy(np.ascontiguousarray(images))
    x = x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2)
    x = x.float().div_(255.0)
    if x.shape[1] == 3 and channels == 1:  # convert before resizing: 3x less work
        weights = torch.tensor(_LUMA, dtype=x.dtype).view(1, 3, 1, 1)
        x = (x * weights).sum(dim=1, keepdim=True)
    if x.shape[-2:] != (image_size, image_size):
        x = F.interpolate(
            x, size=(image_size, image_size), mode="bilinear", align_corners=False, antialias=True
        )
        x = x.clamp_(0.0, 1.0)
    if x.shape[1] == 1 and channels == 3:  # replicate after resizing
        x = x.expand(-1, 3, -1, -1)
    return ((x - 0.5) / 0.5).contiguous()


def load_digits(
    name: str,
    root: str | Path,
    split: str = "all",
    image_size: int = 28,
    channels: int = 1,
) -> TensorDomain:
    """Load one digit domain as a model-ready :class:`TensorDomain`.

    Images are resized to ``image_size x image_size`` (bilinear, antialiased), converted to
    ``channels`` (grey -> RGB replicates the channel, RGB -> grey uses the BT.601 luma weights
    0.299/0.587/0.114), scaled to ``[0, 1]`` and normalised with mean 0.5 and std 0.5 per
    channel, so values lie in ``[-1, 1]``.

    Args:
        name: one of :data:`DIGIT_DOMAINS` (``"mnist"``, ``"usps"``, ``"mnist_m"``).
        root: the ``digits`` folder (holding ``mnist/``, ``usps/``, ``mnist_m/``).
        split: ``"all"``, ``"train"`` or ``"test"``. USPS has a train (7,291) and a test
            (2,007) file, ``"all"`` concatenates them (train first). MNIST and MNIST-M are
            shipped as their test sets only: ``"all"`` and ``"test"`` return them, ``"train"``
            raises.
        image_size: output side length in pixels (>= 1).
        channels: 1 (grey) or 3 (RGB).

    Returns:
        ``TensorDomain(name, x, y, classes=["0", ..., "9"])`` with ``x`` ``float32`` of shape
        ``(N, channels, image_size, image_size)`` and ``y`` ``int64`` of shape ``(N,)``.

    Raises:
        ValueError: unknown ``name``, ``split`` or ``channels``, bad ``image_size``, a split
            not available for the domain, or malformed data.
        FileNotFoundError: ``root`` or a data file is missing (the message names the path).
    """
    if name not in DIGIT_DOMAINS:
        raise ValueError(f"unknown digit domain {name!r}; valid names: {', '.join(DIGIT_DOMAINS)}")
    if split not in _SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(_SPLITS)}")
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels!r}")
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1:
        raise ValueError(f"image_size must be a positive integer, got {image_size!r}")
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"digits root folder not found: {root}")

    images: np.ndarray
    labels: np.ndarray
    if name == "usps":
        files = {"train": [_USPS_TRAIN], "test": [_USPS_TEST], "all": [_USPS_TRAIN, _USPS_TEST]}
        parts = [read_usps(root / "usps" / f) for f in files[split]]
        images = np.concatenate([p[0] for p in parts])
        labels = np.concatenate([p[1] for p in parts])
    else:
        if split == "train":
            raise ValueError(
                f"split 'train' is not available for {name!r}: only its test set is shipped; "
                "use split='test' or 'all'"
            )
        if name == "mnist":
            images, labels = read_mnist_idx(
                root / "mnist" / _MNIST_IMAGES, root / "mnist" / _MNIST_LABELS
            )
        else:
            images, labels = read_mnist_m(
                root / "mnist_m" / _MNIST_M_FOLDER, root / "mnist_m" / _MNIST_M_LABELS
            )
    check_image_memory(image_size, len(images), channels, 0, f"data.image_size of {name}")
    x = _to_tensor(images, image_size, channels)
    y = torch.from_numpy(labels.astype(np.int64))
    return TensorDomain(name, x, y, classes=list(_CLASSES))
