"""Turn a data config into domains: source, target (the active pool) and an optional held-out
target split for evaluation."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from eada.config import DataConfig, DigitsData, FeatureData, ImageListData, ModelConfig, ToyData
from eada.data.base import Domain, Task, TensorDomain
from eada.data.datasets import ImageDomain
from eada.data.images import ImageList

__all__ = ["Domain", "Task", "TensorDomain", "keep_classes", "load_task"]


def keep_classes(domain: Domain, ids: Sequence[int]) -> Domain:
    """The samples of ``domain`` whose class id is in ``ids``, relabelled ``0..k-1`` in the
    order of ``ids`` (class names follow); the others are dropped. ``data.keep_classes``.

    Raises:
        ValueError: an id outside the domain's classes, or repeated ids.

    Example:
        >>> import torch
        >>> d = TensorDomain("d", torch.zeros(4, 1), torch.tensor([0, 3, 8, 3]), list("0123456789"))
        >>> two = keep_classes(d, [3, 8])
        >>> two.y.tolist(), two.classes
        ([0, 1, 0], ['3', '8'])
    """
    ids = [int(i) for i in ids]
    n = domain.num_classes
    if len(set(ids)) != len(ids) or any(not 0 <= i < n for i in ids):
        raise ValueError(
            f"data.keep_classes {ids}: domain {domain.name!r} has {n} classes (ids 0..{n - 1}); "
            "the ids must be distinct and lie in that range"
        )
    remap = torch.full((n,), -1, dtype=torch.long)
    remap[torch.tensor(ids)] = torch.arange(len(ids))
    y = torch.as_tensor(domain.y).long()
    keep = torch.nonzero(remap[y] >= 0).squeeze(1)
    names = [domain.classes[i] for i in ids]
    if isinstance(domain, TensorDomain):
        return TensorDomain(domain.name, domain.x[keep], remap[y[keep]], names)
    il = domain.images
    images = ImageList(
        il.name,
        [il.paths[i] for i in keep.tolist()],
        remap[y[keep]].tolist(),
        names,
    )
    return ImageDomain(
        images, domain.transforms, domain.input_shape, domain.workers, domain.current
    )


def load_task(
    cfg: DataConfig, seed: int = 0, model: ModelConfig | None = None, device: str = "cpu"
) -> Task:
    """Build the domains a data config names (the toy data depend on ``seed``), keeping only
    the classes of ``data.keep_classes`` where it is set (:func:`keep_classes`, after loading:
    a feature normalisation and a frozen backbone's feature cache see the whole domain).

    Image data with ``model.freeze_backbone`` become in-memory feature domains (extracted once
    on ``device``, cached); without, :class:`~eada.data.datasets.ImageDomain` datasets."""
    task = _load_task(cfg, seed, model, device)
    ids = getattr(cfg, "keep_classes", None)
    if ids is None:
        return task
    held = task.heldout
    task.source = keep_classes(task.source, ids)
    task.target = keep_classes(task.target, ids)
    task.heldout = keep_classes(held, ids) if held is not None else None
    return task


def _load_task(
    cfg: DataConfig, seed: int = 0, model: ModelConfig | None = None, device: str = "cpu"
) -> Task:
    if isinstance(cfg, ToyData):
        from eada.data.toy import make_toy

        src, tgt = make_toy(cfg.n_per_class, cfg.separation, cfg.std, cfg.rotation_deg, seed)
        return Task(src, tgt)
    if isinstance(cfg, DigitsData):
        from eada.data.digits import load_digits

        kw = {"image_size": cfg.image_size, "channels": cfg.channels}
        source = load_digits(cfg.source, cfg.root, split=cfg.source_split, **kw)
        target = load_digits(cfg.target, cfg.root, split=cfg.target_split, **kw)
        heldout = (
            load_digits(cfg.target, cfg.root, split=cfg.heldout_split, **kw)
            if cfg.heldout_split
            else None
        )
        return Task(source, target, heldout)
    if isinstance(cfg, ImageListData):
        from eada.data.image_tasks import load_image_task

        return load_image_task(cfg, model, device)
    if isinstance(cfg, FeatureData):
        from eada.data.image_tasks import load_feature_task

        return load_feature_task(cfg)
    raise TypeError(f"unsupported data config {type(cfg).__name__}")
