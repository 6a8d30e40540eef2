"""Active DA for semantic segmentation (the paper's GTAV -> Cityscapes experiment).

* :mod:`~eada.segmentation.config` -- typed configs (``task: segmentation``);
* :mod:`~eada.segmentation.model` -- DeepLab-v2 / v3+ energy networks from torchvision parts;
* :mod:`~eada.segmentation.scoring` -- per-pixel free energy / MvSM and image aggregation;
* :mod:`~eada.segmentation.data` -- GTAV, Cityscapes (19 classes, ignore 255), synthetic pair;
* :mod:`~eada.segmentation.metrics` -- confusion matrix, per-class IoU, mIoU;
* :mod:`~eada.segmentation.train` -- the round-based trainer and the multi-seed runner.
"""

from eada.segmentation.config import (
    SegExperimentConfig,
    is_segmentation_config,
    load_seg_config,
    parse_seg_config,
)

__all__ = [
    "SegExperimentConfig",
    "is_segmentation_config",
    "load_seg_config",
    "parse_seg_config",
]
