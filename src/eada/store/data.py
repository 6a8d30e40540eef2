"""What a project's samples are: the domains of a config (toy, digits: feature rows) or image
folders on disk (``DOMAIN/[images/]CLASS/*.jpg``, e.g. Office-31: file paths), their content
hashes, and the confinement of file paths to the registered data roots."""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eada.config import ExperimentConfig, path_origin
from eada.data.images import (
    ImageDataError,
    ImageList,
    check_image_memory,
    open_image,
    scan_domain_folder,
)
from eada.store.config import (  # noqa: F401  (build_config, resolved_config: moved there)
    FolderData,
    build_config,
    resolved_config,
)
from eada.store.roots import (  # noqa: F401  (their home is eada.store.roots)
    check_file_names,
    confine,
    shown_name,
)

if TYPE_CHECKING:
    import torch

    from eada.data.base import TensorDomain
    from eada.data.tasks import Task

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")
"""The suffixes a folder project registers (fewer than :data:`~eada.data.images.IMAGE_EXTENSIONS`:
projects made by earlier versions must find the same files)."""


def content_hash(data: bytes) -> str:
    """SHA-256 hex digest."""
    return hashlib.sha256(data).hexdigest()


def row_hashes(domain: Any) -> list[str]:
    """SHA-256 of each sample's model-ready input (float32 bytes) -- a feature row's identity."""
    from eada.data.base import TensorDomain

    if not isinstance(domain, TensorDomain):
        raise TypeError(f"row hashes need an in-memory domain, got {type(domain).__name__}")
    x = domain.x.detach().cpu().contiguous()
    return [content_hash(x[i].numpy().tobytes()) for i in range(len(domain))]


def list_images(folder: Path) -> tuple[list[str], list[tuple[Path, int]]]:
    """Class names (sorted folder names) and ``(path, class id)`` of every image in ``folder``
    (:func:`eada.data.images.scan_domain_folder` with the store's :data:`IMAGE_SUFFIXES`).

    Raises:
        FileNotFoundError: ``folder`` missing.
        ValueError: no class folders or no images.
    """
    if not folder.is_dir():
        raise FileNotFoundError(f"image folder not found: {folder}{path_origin(folder)}")
    root = folder / "images" if (folder / "images").is_dir() else folder
    try:
        found = scan_domain_folder(folder, extensions=IMAGE_SUFFIXES)
    except ImageDataError:  # no class folders (the only error without a class map)
        raise ValueError(f"{root} holds no class folders (expected {root}/CLASS/*.jpg)") from None
    if not found.paths:
        raise ValueError(f"{root} holds no images ({', '.join(IMAGE_SUFFIXES)})")
    return found.classes, list(zip(found.paths, found.labels, strict=True))


def check_folders(data: FolderData, classes: list[str], items: list[tuple[Path, int]]) -> None:
    """The source and target folders of ``data`` are two folders, and no source class folder
    is empty (its class would have nothing to train on); ``items``: the source's images.

    Raises:
        ValueError: the same folder twice, or the empty class folders named.
    """
    if data.source.resolve() == data.target.resolve():
        raise ValueError(
            f"the source and target folders are the same folder ({data.source}): domain "
            "adaptation needs a labeled source and a different target"
        )
    counts = [0] * len(classes)
    for _, k in items:
        counts[k] += 1
    empty = [c for c, n in zip(classes, counts, strict=True) if n == 0]
    if empty:
        raise ValueError(
            f"{data.source}: class folder(s) {', '.join(empty)} hold no images: add images or "
            "remove the folder (each source class needs samples to train on)"
        )


def check_image(path: Path) -> Any:
    """``path`` decoded as every image of eada is (:func:`eada.data.images.open_image`): the
    RGB PIL image. The check ``eada label import`` and ``eada target scan`` make before they
    accept a file, without the model's transform (and torch).

    Raises:
        ValueError: naming the file when it is not a readable image (missing, corrupt or
            truncated).
    """
    im, reason = open_image(Path(path))
    if im is None:
        raise ValueError(f"corrupt or unreadable image {path}: {reason}")
    return im


def decode_image(path: Path, image_size: int, channels: int) -> torch.Tensor:
    """Decode one image to a model-ready ``(channels, S, S)`` tensor: opened as every image
    of eada is (:func:`eada.data.images.open_image`), then the torchvision view
    :func:`eada.data.transforms.fixed_size_transform` (resize to ``S x S``, ``[0, 1]``,
    ``(x - 0.5) / 0.5``).

    Raises:
        ValueError: naming the file when it is not a readable image (missing, corrupt or
            truncated).
    """
    from eada.data.transforms import fixed_size_transform

    im = check_image(path)
    if channels == 1:
        im = im.convert("L")
    return fixed_size_transform(image_size, channels)(im)


def load_folder(folder: Path, image_size: int, channels: int) -> tuple[TensorDomain, list[Path]]:
    """An image folder as a :class:`TensorDomain` plus the file path of every sample."""
    classes, items = list_images(folder)
    paths = [p for p, _ in items]
    return _decode_domain(folder.name, paths, [k for _, k in items], classes, image_size, channels)


def _decode_domain(
    name: str, paths: list[Path], labels: list[int], classes: list[str], *size: Any
) -> tuple[TensorDomain, list[Path]]:
    """Decoded images (``size``: a :class:`FolderData` or ``image_size, channels``)."""
    import torch

    from eada.data.base import TensorDomain

    image_size, channels = (size[0].image_size, size[0].channels) if len(size) == 1 else size
    decoded, bad = [], []
    for p in paths:  # every unreadable file is named, not only the first
        try:
            decoded.append(decode_image(p, image_size, channels))
        except ValueError as err:
            bad.append(str(err))
    if bad:
        shown = "\n".join(f"  {b}" for b in bad[:20])
        more = f"\n  ... and {len(bad) - 20} more" if len(bad) > 20 else ""
        raise ValueError(
            f"{len(bad)} corrupt or unreadable image(s) in {name}; remove or replace them:\n"
            + shown
            + more
        )
    x = torch.stack(decoded).contiguous()
    y = torch.tensor(labels, dtype=torch.long)
    return TensorDomain(name, x, y, classes), paths


def load_project_task(
    cfg: ExperimentConfig,
) -> tuple[Task, dict[str, list[Path] | None]]:
    """The project's domains and, for image folders, every sample's file path by role."""
    task, paths, _ = load_project_data(cfg)
    return task, paths


def load_project_data(
    cfg: ExperimentConfig,
    labeled: bool = True,
    progress: Any = None,
    target_files: list[Path] | None = None,
    target_rows: Any = None,
) -> tuple[Task, dict[str, list[Path] | None], Any]:
    """The project's domains, every sample's file by role (image data) and the target's
    user ids/paths (:class:`~eada.store.targets.SampleInfo`). ``labeled=False``: the target
    carries no labels (see :mod:`eada.store.targets`). ``target_files``: an unlabeled image
    target's files in this order (a store's registered pool) instead of its folder or list;
    ``target_rows``: an unlabeled feature-row target's registered rows with their frozen
    statistics (:class:`~eada.store.targets.TargetRows`) instead of the whole file."""
    task, paths, info = _load_project_data(cfg, labeled, progress, target_files, target_rows)
    if not labeled:  # placeholder labels: no class is known to be missing
        task.notes["target_missing_classes"] = "unknown: the target is unlabeled"
    return task, paths, info


def _load_project_data(
    cfg: ExperimentConfig,
    labeled: bool,
    progress: Any,
    target_files: list[Path] | None,
    target_rows: Any = None,
) -> tuple[Task, dict[str, list[Path] | None], Any]:
    from eada.config import FeatureData, ImageListData
    from eada.data.base import TensorDomain
    from eada.data.tasks import Task, load_task
    from eada.store.targets import (
        SampleInfo,
        load_store_features,
        load_store_images,
        unlabeled_images,
    )

    data: Any = cfg.data
    if isinstance(data, FolderData):  # every file listed, the memory checked, then decoded
        classes, items = list_images(data.source)
        check_folders(data, classes, items)
        if labeled:
            tclasses, titems = list_images(data.target)
            tcounts = {k for _, k in titems}
            empty = [c for k, c in enumerate(tclasses) if k not in tcounts]
            if empty:
                warnings.warn(
                    f"{data.target}: class folder(s) {', '.join(empty)} hold no images",
                    UserWarning,
                    stacklevel=2,
                )
            il = ImageList(data.target.name, [p for p, _ in titems], [k for _, k in titems],
                           tclasses)  # fmt: skip
            info = SampleInfo()
        else:
            il, info = unlabeled_images(data.target, classes, files=target_files)
        check_file_names([p for p, _ in items], f"source {data.source}")
        check_file_names(il.paths, f"target {data.target}")
        check_image_memory(
            data.image_size, len(items) + len(il.paths), data.channels,
            cfg.train.batch_size, "data.image_size (--image-size)",
        )  # fmt: skip
        src, src_paths = _decode_domain(
            data.source.name, [p for p, _ in items], [k for _, k in items], classes, data
        )
        tgt, tgt_paths = _decode_domain(il.name, il.paths, il.labels, il.classes, data)
        return Task(src, tgt), {"source": src_paths, "target": tgt_paths, "heldout": None}, info
    if isinstance(data, ImageListData):
        return load_store_images(data, cfg.model, labeled, cfg.device, progress, target_files)
    if isinstance(data, FeatureData):
        task, info = load_store_features(data, labeled, target_rows)
        return task, {"source": None, "target": None, "heldout": None}, info
    if not labeled:
        raise ValueError(f"data.kind {cfg.data.kind!r} has no unlabeled-target form")
    task = load_task(cfg.data, cfg.seed)
    for dom in (task.source, task.target, task.heldout):
        if dom is not None and not isinstance(dom, TensorDomain):
            raise ValueError(
                f"the project store registers in-memory domains (toy, digits, features) and "
                f"image folders (--source-dir/--target-dir); data.kind {cfg.data.kind!r} is not "
                "supported yet"
            )
    return task, {"source": None, "target": None, "heldout": None}, SampleInfo()


def default_roots(cfg: ExperimentConfig) -> list[Path]:
    """Data roots a config implies: the image folders, or the digits root (toy: none)."""
    data: Any = cfg.data
    if isinstance(data, FolderData):
        return [data.target, data.source]  # relative import paths try the target first
    if getattr(data, "kind", None) == "images":  # folders, or the folders of list files
        specs = [data.target, data.source, data.heldout]
        found = [Path(p) if Path(p).is_dir() else Path(p).parent for p in specs if p]
        return found + ([Path(data.root)] if data.root is not None else [])
    root = getattr(data, "root", None)
    return [Path(root)] if root is not None else []
