"""Segmentation data: GTAV and Cityscapes layouts, the 19-class mapping, the synthetic pair.

Label conventions: train ids ``0..18`` for the 19 Cityscapes evaluation classes
(:data:`CITYSCAPES_CLASSES`), ``255`` (:data:`IGNORE_INDEX`) for everything else. GTAV and
Cityscapes both store Cityscapes *label ids* (0..33) in their label PNGs; :data:`ID_TO_TRAIN_ID`
maps them (the table used by AdaptSegNet and the Cityscapes scripts).

Layouts (the public downloads, unchanged):

* GTAV: ``ROOT/images/00001.png`` and ``ROOT/labels/00001.png`` (24,966 pairs).
* Cityscapes: ``ROOT/leftImg8bit/{train,val}/CITY/CITY_xxx_yyy_leftImg8bit.png`` and
  ``ROOT/gtFine/{train,val}/CITY/CITY_xxx_yyy_gtFine_labelIds.png`` (2,975 train, 500 val).

Every dataset returns ``(image, label, index)``: ``(3, H, W)`` float ImageNet-normalised image,
``(H, W)`` int64 train-id label, and the item's position.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import Dataset

from eada.data.identity import file_entry, files_identity
from eada.segmentation.config import GtavCityscapesData, SegModelConfig, SyntheticSegData

IGNORE_INDEX = 255

CITYSCAPES_CLASSES: tuple[str, ...] = (
    "road", "sidewalk", "building", "wall", "fence", "pole", "traffic light", "traffic sign",
    "vegetation", "terrain", "sky", "person", "rider", "car", "truck", "bus", "train",
    "motorcycle", "bicycle",
)  # fmt: skip

#: Cityscapes label id -> train id (19 classes); every other id -> 255.
_ID_PAIRS = {7: 0, 8: 1, 11: 2, 12: 3, 13: 4, 17: 5, 19: 6, 20: 7, 21: 8, 22: 9, 23: 10,
             24: 11, 25: 12, 26: 13, 27: 14, 28: 15, 31: 16, 32: 17, 33: 18}  # fmt: skip
ID_TO_TRAIN_ID = np.full(256, IGNORE_INDEX, dtype=np.uint8)
for _id, _train in _ID_PAIRS.items():
    ID_TO_TRAIN_ID[_id] = _train

#: split sizes of the public releases (the dry run plans with these)
GTAV_SIZE = 24_966
CITYSCAPES_SIZES = {"train": 2_975, "val": 500}

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def map_label_ids(label_ids: np.ndarray) -> np.ndarray:
    """Map Cityscapes label ids (``uint8`` array) to train ids 0..18 / 255.

    Example:
        >>> map_label_ids(np.array([[7, 26], [0, 33]], dtype=np.uint8)).tolist()
        [[0, 13], [255, 18]]
    """
    if label_ids.dtype != np.uint8:
        if label_ids.min() < 0 or label_ids.max() > 255:
            raise ValueError("label ids must lie in 0..255")
        label_ids = label_ids.astype(np.uint8)
    return ID_TO_TRAIN_ID[label_ids]


def normalize_image(rgb: np.ndarray) -> torch.Tensor:
    """``(H, W, 3)`` uint8 RGB -> ``(3, H, W)`` float, ImageNet mean/std normalised."""
    if not rgb.flags.writeable or not rgb.flags.c_contiguous:
        rgb = np.array(rgb, copy=True, order="C")
    x = torch.from_numpy(rgb).permute(2, 0, 1).float().div_(255.0)
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return (x - mean) / std


def random_crop(
    image: torch.Tensor,
    label: torch.Tensor,
    size: tuple[int, int],
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same random ``(width, height)`` crop of a ``(3, H, W)`` image and its ``(H, W)`` label.

    Without ``generator`` torch's global generator is used, which ``DataLoader`` seeds per worker
    (so crops differ across workers and a seeded run repeats)."""
    w, h = size
    H, W = label.shape
    if w > W or h > H:
        raise ValueError(f"crop {size} is larger than the image ({W}x{H})")
    top = int(torch.randint(0, H - h + 1, (1,), generator=generator))
    left = int(torch.randint(0, W - w + 1, (1,), generator=generator))
    return image[:, top : top + h, left : left + w], label[top : top + h, left : left + w]


class SegDataset(Dataset[tuple[torch.Tensor, torch.Tensor, int]]):
    """Base class: ``name``, ``num_classes``, ``ids`` (one printable id per item) and
    ``(image, label, index)`` items; ``crop`` (``(w, h)``) turns on random training crops
    (drawn from torch's global generator; see :func:`random_crop`).

    Subclasses implement :meth:`get`; ``get(i, with_label=False)`` must not read the label (the
    unlabeled target pool is read through :class:`ImagesOnly`, so a label is opened only once
    its image was selected)."""

    name: str
    num_classes: int
    ids: list[str]
    crop: tuple[int, int] | None

    def __init__(self) -> None:
        self.crop = None

    def with_crop(self, crop: tuple[int, int] | None) -> SegDataset:
        """Turn random training crops of size ``(w, h)`` on (``None``: off); returns ``self``."""
        self.crop = crop
        return self

    def __len__(self) -> int:
        return len(self.ids)

    def get(self, i: int, with_label: bool = True) -> tuple[torch.Tensor, torch.Tensor, int]:
        """``(image, label, i)``; without ``with_label`` the label is all 255 (never read)."""
        raise NotImplementedError

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.get(i, True)

    def _maybe_crop(
        self, image: torch.Tensor, label: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.crop is None:
            return image, label
        return random_crop(image, label, self.crop)


class TensorSegDataset(SegDataset):
    """In-memory images ``x`` ``(N, 3, H, W)`` and labels ``y`` ``(N, H, W)`` (train ids / 255)."""

    def __init__(self, name: str, x: torch.Tensor, y: torch.Tensor, num_classes: int) -> None:
        super().__init__()
        if x.ndim != 4 or y.ndim != 3 or x.shape[0] != y.shape[0] or x.shape[2:] != y.shape[1:]:
            raise ValueError(
                f"{name}: images must be (N, 3, H, W) and labels (N, H, W) of the same N, H, W; "
                f"got {tuple(x.shape)} and {tuple(y.shape)}"
            )
        bad = (y != IGNORE_INDEX) & ((y < 0) | (y >= num_classes))
        if bad.any():
            raise ValueError(f"{name}: labels outside 0..{num_classes - 1} and {IGNORE_INDEX}")
        self.name, self.x, self.y, self.num_classes = name, x, y.long(), num_classes
        self.ids = [f"{name}/{i}" for i in range(len(x))]

    def get(self, i: int, with_label: bool = True) -> tuple[torch.Tensor, torch.Tensor, int]:
        """``(image, label, i)``; without ``with_label`` the label is all 255."""
        label = self.y[i] if with_label else torch.full_like(self.y[i], IGNORE_INDEX)
        image, label = self._maybe_crop(self.x[i], label)
        return image, label, i


class FolderSegDataset(SegDataset):
    """Image/label PNG pairs on disk, Cityscapes label ids mapped to the 19 train ids.

    Args:
        name: a printable name.
        pairs: ``(image_path, label_path)`` per item.
        size: ``(width, height)`` the image is resized to (bilinear).
        label_full_res: keep the label at its original resolution (evaluation) instead of
            resizing it to ``size`` (nearest, training).
    """

    def __init__(
        self,
        name: str,
        pairs: Sequence[tuple[Path, Path]],
        size: tuple[int, int],
        label_full_res: bool = False,
    ) -> None:
        super().__init__()
        if not pairs:
            raise ValueError(f"{name}: no image/label pairs")
        self.name, self.pairs, self.size = name, list(pairs), size
        self.label_full_res = label_full_res
        self.num_classes = len(CITYSCAPES_CLASSES)
        self.ids = [p[0].name for p in self.pairs]

    def get(self, i: int, with_label: bool = True) -> tuple[torch.Tensor, torch.Tensor, int]:
        """``(image, label, i)``; without ``with_label`` the label file is not opened and the
        label is all 255 at the resized image's size."""
        img_path, lbl_path = self.pairs[i]
        with Image.open(img_path) as im:
            rgb = np.asarray(im.convert("RGB").resize(self.size, Image.Resampling.BILINEAR))
        if not with_label:
            image = normalize_image(rgb)
            blank = torch.full(image.shape[1:], IGNORE_INDEX, dtype=torch.int64)
            image, blank = self._maybe_crop(image, blank)
            return image, blank, i
        with Image.open(lbl_path) as lb:
            if lb.mode not in ("L", "P"):
                raise ValueError(f"{lbl_path}: label must be an 8-bit id image, got {lb.mode}")
            resized = lb if self.label_full_res else lb.resize(self.size, Image.Resampling.NEAREST)
            ids = np.asarray(resized, dtype=np.uint8)
        image = normalize_image(rgb)
        label = torch.from_numpy(map_label_ids(ids).astype(np.int64))
        image, label = self._maybe_crop(image, label)
        return image, label, i


class ImagesOnly(Dataset[tuple[torch.Tensor, torch.Tensor, int]]):
    """A view of a :class:`SegDataset` that never reads labels (``get(i, with_label=False)``);
    the unlabeled target pool is read through it."""

    def __init__(self, base: SegDataset) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.base.get(i, with_label=False)


def gtav_pairs(root: Path) -> list[tuple[Path, Path]]:
    """All ``images/X.png`` with a matching ``labels/X.png`` under a GTAV root, sorted."""
    img_dir, lbl_dir = root / "images", root / "labels"
    for d in (img_dir, lbl_dir):
        if not d.is_dir():
            raise FileNotFoundError(f"GTAV layout expects {d} (ROOT/images, ROOT/labels)")
    images = sorted(img_dir.glob("*.png"))
    missing = [p.name for p in images if not (lbl_dir / p.name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"GTAV: {len(missing)} images have no label in {lbl_dir} (first: {missing[0]})"
        )
    if not images:
        raise FileNotFoundError(f"GTAV: no PNG images in {img_dir}")
    return [(p, lbl_dir / p.name) for p in images]


def cityscapes_pairs(root: Path, split: str) -> list[tuple[Path, Path]]:
    """All ``leftImg8bit/SPLIT/*/*_leftImg8bit.png`` with their ``gtFine`` label-id PNG, sorted."""
    img_dir = root / "leftImg8bit" / split
    if not img_dir.is_dir():
        raise FileNotFoundError(
            f"Cityscapes layout expects {img_dir} (ROOT/leftImg8bit/{split}/CITY/...)"
        )
    pairs = []
    for p in sorted(img_dir.glob("*/*_leftImg8bit.png")):
        stem = p.name[: -len("_leftImg8bit.png")]
        lbl = root / "gtFine" / split / p.parent.name / f"{stem}_gtFine_labelIds.png"
        if not lbl.is_file():
            raise FileNotFoundError(f"Cityscapes: no label {lbl} for {p}")
        pairs.append((p, lbl))
    if not pairs:
        raise FileNotFoundError(f"Cityscapes: no *_leftImg8bit.png images under {img_dir}")
    return pairs


@dataclass
class SegTask:
    """A segmentation Active DA task: labeled ``source``, the ``target`` pool (its labels are
    revealed only for selected images) and the ``val`` split that mIoU is reported on."""

    source: SegDataset
    target: SegDataset
    val: SegDataset
    class_names: tuple[str, ...]

    def check(self) -> None:
        """Raise a clear error for empty domains or mismatched class counts."""
        for name, d in (("source", self.source), ("target", self.target), ("val", self.val)):
            if len(d) == 0:
                raise ValueError(f"the {name} domain is empty")
        n = {self.source.num_classes, self.target.num_classes, self.val.num_classes}
        if len(n) != 1 or len(self.class_names) not in n:
            raise ValueError(
                f"class counts disagree: source {self.source.num_classes}, target "
                f"{self.target.num_classes}, val {self.val.num_classes}, names "
                f"{len(self.class_names)}"
            )

    @property
    def num_classes(self) -> int:
        """Number of evaluated classes."""
        return self.source.num_classes


# -- the synthetic pair ------------------------------------------------------------------------

SYNTHETIC_CLASSES = ("background", "square", "disc", "triangle")
_SOURCE_PALETTE = np.array([[0.9, 0.15, 0.15], [0.15, 0.8, 0.2], [0.2, 0.3, 0.95]])
_TARGET_PALETTE = np.array([[0.95, 0.55, 0.1], [0.1, 0.85, 0.85], [0.85, 0.2, 0.85]])


def _shape_mask(
    kind: int, yy: np.ndarray, xx: np.ndarray, cy: float, cx: float, r: float
) -> np.ndarray:
    if kind == 1:  # square
        return (np.abs(yy - cy) <= r) & (np.abs(xx - cx) <= r)
    if kind == 2:  # disc
        return (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
    # upward triangle inscribed in the circle of radius r
    top, base = cy - r, cy + r / 2
    half = (yy - top) * math.tan(math.radians(30))
    return (yy >= top) & (yy <= base) & (np.abs(xx - cx) <= half)


def _render(
    n: int, size: int, max_shapes: int, target: bool, rng: np.random.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    images = np.empty((n, size, size, 3))
    labels = np.zeros((n, size, size), dtype=np.int64)
    palette = _TARGET_PALETTE if target else _SOURCE_PALETTE
    for i in range(n):
        if target:  # noisy checkerboard, darker
            cell = int(rng.integers(3, 7))
            tex = (((yy // cell) + (xx // cell)) % 2) * 0.3 + 0.2
            noise = 0.12
        else:  # soft stripes
            period = rng.uniform(5, 9)
            tex = 0.45 + 0.15 * np.sin(2 * np.pi * (yy + rng.uniform(0, period)) / period)
            noise = 0.04
        img = np.repeat(tex[..., None], 3, axis=2)
        for _ in range(int(rng.integers(1, max_shapes + 1))):
            kind = int(rng.integers(1, 4))
            r = rng.uniform(size * 0.1, size * 0.22)
            cy, cx = rng.uniform(r, size - r, size=2)
            inner = _shape_mask(kind, yy, xx, cy, cx, r - 0.5)
            outer = _shape_mask(kind, yy, xx, cy, cx, r + 0.5)
            colour = palette[kind - 1] * (0.75 + 0.5 * tex[..., None])
            img = np.where(inner[..., None], colour, img)
            labels[i][outer] = IGNORE_INDEX  # the ambiguous 1-px rim, like Cityscapes' void
            labels[i][inner] = kind
        images[i] = np.clip(img + rng.normal(0, noise, img.shape), 0, 1)
    x = torch.from_numpy((images * 255).round().astype(np.uint8))
    xn = torch.stack([normalize_image(im.numpy()) for im in x])
    return xn, torch.from_numpy(labels)


def make_synthetic_pair(
    n_source: int = 64,
    n_target: int = 64,
    n_val: int = 32,
    image_size: int = 48,
    max_shapes: int = 3,
    seed: int = 0,
) -> SegTask:
    """A tiny segmentation domain pair that runs on a CPU in seconds.

    Classes: background, square, disc, triangle (:data:`SYNTHETIC_CLASSES`). Source: shapes in
    red/green/blue on soft grey stripes, little noise. Target (pool and val): the same shapes in
    orange/cyan/magenta on a dark noisy checkerboard -- colour, texture and noise all shift, so a
    source-only model transfers only in part and labeled target images help. The 1-pixel rim of
    every shape is labeled 255 (ignored). Deterministic given ``seed``.
    """
    rng = np.random.default_rng(seed)
    xs, ys = _render(n_source, image_size, max_shapes, False, rng)
    xt, yt = _render(n_target + n_val, image_size, max_shapes, True, rng)
    k = len(SYNTHETIC_CLASSES)
    return SegTask(
        source=TensorSegDataset("synthetic_source", xs, ys, k),
        target=TensorSegDataset("synthetic_target", xt[:n_target], yt[:n_target], k),
        val=TensorSegDataset("synthetic_val", xt[n_target:], yt[n_target:], k),
        class_names=SYNTHETIC_CLASSES,
    )


def resize_energies(energies: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Bilinearly resize ``(N, C, h, w)`` energies to ``(height, width) = size``."""
    if tuple(energies.shape[2:]) == tuple(size):
        return energies
    return F.interpolate(energies, size=size, mode="bilinear", align_corners=False)


def load_seg_task(data: GtavCityscapesData | SyntheticSegData) -> SegTask:
    """Build the task a data config describes (lists the folders; the synthetic pair is drawn
    from ``data.seed``). Training crops are switched on for source and target pool."""
    if isinstance(data, SyntheticSegData):
        task = make_synthetic_pair(
            data.n_source, data.n_target, data.n_val, data.image_size, data.max_shapes, data.seed
        )
        crop = None if data.crop is None else (data.crop, data.crop)
        task.source.with_crop(crop)
        task.target.with_crop(crop)
        return task
    source = FolderSegDataset("gtav", gtav_pairs(data.gtav_root), data.source_size)
    target = FolderSegDataset(
        "cityscapes_train", cityscapes_pairs(data.cityscapes_root, "train"), data.target_size
    )
    val = FolderSegDataset(
        "cityscapes_val",
        cityscapes_pairs(data.cityscapes_root, "val"),
        data.target_size,
        label_full_res=True,
    )
    source.with_crop(data.source_crop)
    target.with_crop(data.target_crop)
    return SegTask(source=source, target=target, val=val, class_names=CITYSCAPES_CLASSES)


def seg_data_inputs(
    data: GtavCityscapesData | SyntheticSegData, model: SegModelConfig | None = None
) -> dict[str, Any]:
    """Every input file of a segmentation run (:mod:`eada.data.identity`, recorded in each run
    record as ``inputs``): for GTAV -> Cityscapes, one entry a domain -- ``source`` (the GTAV
    root), ``target`` (Cityscapes ``train``) and ``val`` (Cityscapes ``val``) -- with its
    absolute root, its number of image/label pairs and a digest of every image's and label's
    absolute path, size and modification time (:func:`eada.data.identity.files_identity`: a
    file added, removed, rewritten or touched changes it); a local backbone weights file
    (``model.weights``): SHA-256 of its bytes. The synthetic pair is drawn from its config and
    has none.

    Raises:
        FileNotFoundError: a layout that is not there (naming the folder or the file).
    """
    out: dict[str, Any] = {}
    if isinstance(data, GtavCityscapesData):
        gtav, cs = Path(data.gtav_root).resolve(), Path(data.cityscapes_root).resolve()
        domains = (
            ("source", gtav, gtav_pairs(gtav)),
            ("target", cs, cityscapes_pairs(cs, "train")),
            ("val", cs, cityscapes_pairs(cs, "val")),
        )
        for role, root, pairs in domains:
            files = [f for pair in pairs for f in pair]
            out[role] = files_identity(root, files, pairs=len(pairs))
    if model is not None and model.weights not in (None, "imagenet"):
        weights = Path(str(model.weights))
        if weights.is_file():  # a missing file is the model builder's error
            out["model.weights"] = file_entry(weights)
    return out
