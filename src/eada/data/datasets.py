"""Image files as torch ``Dataset`` objects: :class:`ImageDomain` (a domain's images read
through its current view's transform) and :class:`DecodeChecked` (the same, reporting the images
that do not decode instead of failing).

They live apart from :mod:`eada.data.images` (list files, folders, class maps, checks), which
imports no torch, so that the commands reading image lists (``eada data index``, ``eada label
import``, ``eada target scan``) start without it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import Dataset

from eada.data import images as image_files
from eada.data.images import ImageDataError, ImageList


class ImageDomain(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """A domain of image files as a torch ``Dataset`` returning ``(image tensor, label)``.

    It carries one transform a view (``train``, ``test``, ``score``, ``unlabeled``); indexing
    uses the current view's, and :meth:`view` returns a shallow copy that uses another.
    ``workers``, ``pin_memory``, ``persistent_workers`` and ``prefetch`` are the ``DataLoader``
    options it is read with (:func:`eada.data.batches.iterate_items`). With a
    ``decode_cache`` (:mod:`eada.data.decoded`; ``kinds`` maps each view to its kind, ``spec``
    and ``norm`` give its sizes and normalisation) batches are read from the cache instead and
    the view's random part is applied per batch on ``device``.
    """

    def __init__(
        self,
        images: ImageList,
        transforms: dict[str, Callable[[Any], torch.Tensor]],
        input_shape: tuple[int, ...],
        workers: int = 0,
        current: str = "train",
        persistent_workers: bool = True,
        prefetch: int = 2,
    ) -> None:
        self.images = images
        self.name = images.name
        self.classes = list(images.classes)
        self.y = torch.tensor(images.labels, dtype=torch.long)
        self.transforms = transforms
        self.input_shape = input_shape
        self.workers = workers
        self.pin_memory = torch.cuda.is_available()
        self.persistent_workers = persistent_workers
        self.prefetch = prefetch
        self.current = current
        self.decode_cache: Any = None  # eada.data.decoded.DecodeCache, set by image_domains
        self.kinds: dict[str, Any] = {}
        self.spec: Any = None
        self.norm: Any = None
        self.device = torch.device("cpu")

    def __len__(self) -> int:
        return len(self.images)

    @property
    def num_classes(self) -> int:
        """Number of classes of the domain's label space."""
        return len(self.classes)

    def view(self, kind: str) -> ImageDomain:
        """The same images read through the ``kind`` transform (``train``/``test``/``score``)."""
        if kind not in self.transforms:
            raise ValueError(f"unknown view {kind!r}; known: {', '.join(self.transforms)}")
        other = copy.copy(self)
        other.current = kind
        return other

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        from PIL import Image

        path = self.images.paths[int(i)]
        try:
            with Image.open(path) as im:
                img = im.convert("RGB")
        except Exception as err:  # a file that changed after the check
            raise ImageDataError(f"cannot read image {path}: {err}") from err
        return self.transforms[self.current](img), self.y[int(i)]


class DecodeChecked(Dataset[tuple[torch.Tensor, str]]):
    """``domain``'s images (its current view) as ``(image tensor, "")``, and a missing or
    undecodable one as ``(zeros, reason)`` (the reason :func:`find_bad_images` gives): the
    decode check done BY a pass that decodes every image anyway (the first feature extraction
    of a frozen backbone), so no image is decoded twice."""

    def __init__(self, domain: ImageDomain) -> None:
        self.domain = domain
        self.workers = domain.workers
        self.pin_memory = domain.pin_memory

    def __len__(self) -> int:
        return len(self.domain)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, str]:
        d = self.domain
        img, reason = image_files.open_image(d.images.paths[int(i)])  # patchable
        if img is None:
            return torch.zeros(d.input_shape), str(reason)
        return d.transforms[d.current](img), ""
