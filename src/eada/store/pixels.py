"""The pixels an exported image model takes: a PIL image decoded, converted, resized and
cropped as the project's test view does, as the uint8 ``(H, W, C)`` array ``model.onnx`` reads.

Written with PIL alone, operation for operation what torchvision's ``Resize`` (bilinear, on a
PIL image: PIL's own resize) and ``CenterCrop`` (its rounding of the corner) do, so that
``eada predict`` on ONNX Runtime starts without importing torch; a test checks the arrays
equal torchvision's on real images.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


def resize(im: Any, size: int) -> Any:
    """``im`` resized to ``size x size``, bilinear (torchvision's ``Resize((size, size))``)."""
    from PIL import Image

    return im.resize((size, size), Image.Resampling.BILINEAR)


def center_crop(im: Any, size: int) -> Any:
    """The centred ``size x size`` part of ``im`` (torchvision's ``CenterCrop(size)`` for an
    image at least that large: the corner rounded as ``int(round((side - size) / 2))``)."""
    w, h = im.size
    top = round((h - size) / 2.0)
    left = round((w - size) / 2.0)
    return im.crop((left, top, left + size, top + size))


def pixel_reader(cfg: Any) -> Callable[[Any], np.ndarray] | None:
    """Image projects: PIL image -> the uint8 ``(H, W, C)`` pixels ``model.onnx`` takes
    (decoded, converted, resized and cropped as the test view does); ``None`` for other
    projects.

    >>> from PIL import Image
    >>> from eada.store.config import FolderData
    >>> from types import SimpleNamespace
    >>> cfg = SimpleNamespace(data=FolderData(source="s", target="t", image_size=16))
    >>> pixel_reader(cfg)(Image.new("RGB", (40, 30))).shape
    (16, 16, 3)
    """
    from eada.store.config import FolderData

    data = cfg.data
    ops: list[Callable[[Any], Any]]
    if isinstance(data, FolderData):
        s = data.image_size
        return _pixel_reader([lambda im: resize(im, s)], "L" if data.channels == 1 else "RGB")
    if data.kind != "images":
        return None
    t = data.transforms
    ops = [
        lambda im: resize(im, t.resize),
        lambda im: resize(im, t.test_resize),
        lambda im: center_crop(im, t.crop),
    ]
    return _pixel_reader(ops, "RGB")


def _pixel_reader(ops: list[Callable[[Any], Any]], mode: str) -> Callable[[Any], np.ndarray]:
    def read(im: Any) -> np.ndarray:
        im = im.convert(mode)
        for op in ops:
            im = op(im)
        a = np.asarray(im, dtype=np.uint8)
        return a[:, :, None] if a.ndim == 2 else a

    return read
