"""Turn a data config into domains: source, target (the active pool) and an optional held-out
target split for evaluation."""

from __future__ import annotations

from eada.config import DataConfig, DigitsData, FeatureData, ImageListData, ModelConfig, ToyData
from eada.data.base import Domain, Task, TensorDomain

__all__ = ["Domain", "Task", "TensorDomain", "load_task"]


def load_task(
    cfg: DataConfig, seed: int = 0, model: ModelConfig | None = None, device: str = "cpu"
) -> Task:
    """Build the domains a data config names (the toy data depend on ``seed``).

    Image data with ``model.freeze_backbone`` become in-memory feature domains (extracted once
    on ``device``, cached); without, :class:`~eada.data.images.ImageDomain` datasets."""
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
