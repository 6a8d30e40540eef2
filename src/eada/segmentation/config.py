"""Typed, validated configs for segmentation Active DA runs (pydantic v2, ``extra="forbid"``).

A segmentation config is a YAML mapping with ``task: segmentation`` at the top level and the
sections ``data``, ``model``, ``optim``, ``train`` and ``active``. Every key is declared here with
its type and default; an unknown key, a wrong type or an impossible plan is an error raised before
any data is read (see :func:`load_seg_config`).

The defaults are the paper's GTAV -> Cityscapes protocol (Appendix, "Semantic segmentation"):
DeepLab-v2, ResNet-101, ASPP rates {6, 12, 18, 24}; SGD momentum 0.9, weight decay 1e-4,
lr 2.5e-4 with poly decay (power 0.9); gamma = 0.001; alpha1 = 50%; source images resized to
1280x720, target images to 1024x512; whole target images labeled.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from eada.config import (
    ConfigError,
    RoundSchedule,
    apply_overrides,
    check_rounds,
    read_yaml_mapping,
    resolve_config_paths,
    safe_load_unique,
    validation_message,
)
from eada.strategies import STRATEGIES, check_params

#: image-level scores a segmentation strategy may ask for (no per-image ``(C,)`` energies exist)
IMAGE_SCORES = ("free_energy", "mvsm")


class _Strict(BaseModel):
    # no NaN or infinite number in a config (optim.lr=inf would train to NaN, not fail)
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


Size = tuple[Annotated[int, Field(ge=8)], Annotated[int, Field(ge=8)]]


class GtavCityscapesData(_Strict):
    """GTAV (source, all images) -> Cityscapes (target pool: ``train``; evaluation: ``val``).

    Sizes are ``(width, height)``. ``source_size``/``target_size`` are the sizes images are
    resized to (the paper: 1280x720 and 1024x512); ``*_crop`` optionally takes a random crop of
    that size from the resized image for training (``null`` = the whole resized image, as
    AdaptSegNet, whose setting the paper follows). Evaluation predicts on the ``target_size``
    image and upsamples the energies to the label's full resolution.
    """

    kind: Literal["gtav_cityscapes"] = "gtav_cityscapes"
    gtav_root: Path = Path("../shared/data/gtav")
    cityscapes_root: Path = Path("../shared/data/cityscapes")
    source_size: Size = (1280, 720)
    target_size: Size = (1024, 512)
    source_crop: Size | None = None
    target_crop: Size | None = None
    num_workers: int = Field(4, ge=0)

    @model_validator(mode="after")
    def _crops_fit(self) -> GtavCityscapesData:
        for crop, size, name in (
            (self.source_crop, self.source_size, "source"),
            (self.target_crop, self.target_size, "target"),
        ):
            if crop is not None and (crop[0] > size[0] or crop[1] > size[1]):
                raise ValueError(f"{name}_crop {crop} is larger than {name}_size {size}")
        return self


class SyntheticSegData(_Strict):
    """The tiny synthetic domain pair of :func:`eada.segmentation.data.make_synthetic_pair`:
    squares, discs and triangles (3 classes + background) on a striped source texture and a noisy
    checkerboard target texture with a shifted palette. ``crop`` is a random training crop;
    ``seed`` draws the images (fixed across run seeds, so seeds vary only the training)."""

    kind: Literal["synthetic"] = "synthetic"
    n_source: int = Field(64, ge=2)
    n_target: int = Field(64, ge=2)
    n_val: int = Field(32, ge=1)
    image_size: int = Field(48, ge=16)
    crop: int | None = Field(32, ge=8)
    max_shapes: int = Field(3, ge=1)
    seed: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _crop_fits(self) -> SyntheticSegData:
        if self.crop is not None and self.crop > self.image_size:
            raise ValueError(f"crop {self.crop} is larger than image_size {self.image_size}")
        return self


SegDataConfig = Annotated[GtavCityscapesData | SyntheticSegData, Field(discriminator="kind")]


class SegModelConfig(_Strict):
    """The segmentation energy network (its per-pixel output IS the energy ``E(x, p, y)``).

    ``head``: ``deeplabv2`` (sum of 3x3 atrous convs at ``aspp_rates``, the paper's) or
    ``deeplabv3plus`` (torchvision's ASPP + a low-level decoder). ``backbone``: ``resnet101``
    (the paper's), ``resnet50``, or ``tiny`` (a small dilated conv net for CPU tests).
    ``weights``: ``null`` (random init, the default: nothing is downloaded), ``imagenet``
    (torchvision's ImageNet weights, downloaded by torchvision; the paper's setting) or a path to
    a backbone ``state_dict`` file. ``freeze_bn``: keep the backbone's batch norm in eval mode
    with frozen affine parameters (DeepLab-v2 practice for batch size 1).
    """

    head: Literal["deeplabv2", "deeplabv3plus"] = "deeplabv2"
    backbone: Literal["resnet101", "resnet50", "tiny"] = "resnet101"
    weights: str | None = None
    output_stride: Literal[8, 16] = 8
    aspp_rates: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [6, 12, 18, 24])
    freeze_bn: bool = True
    tiny_width: int = Field(32, ge=4)

    @model_validator(mode="after")
    def _check(self) -> SegModelConfig:
        if not self.aspp_rates:
            raise ValueError("aspp_rates must list at least one rate")
        if self.head == "deeplabv3plus" and len(self.aspp_rates) != 3:
            raise ValueError(
                f"deeplabv3plus takes 3 atrous rates (e.g. [12, 24, 36] at output stride 8), "
                f"got {self.aspp_rates}"
            )
        if self.backbone == "tiny" and self.weights is not None:
            raise ValueError("the tiny backbone has no pretrained weights; set weights: null")
        return self


class SegOptimConfig(_Strict):
    """SGD with poly decay: ``lr_i = lr * (1 - i / iterations) ** poly_power``.

    ``head_lr_mult`` scales the head's learning rate (AdaptSegNet, whose DeepLab-v2 setting the
    paper adopts, trains the classifier at 10x the backbone's rate).
    """

    name: Literal["sgd"] = "sgd"
    lr: float = Field(2.5e-4, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(1e-4, ge=0)
    poly_power: float = Field(0.9, ge=0)
    head_lr_mult: float = Field(10.0, gt=0)


class SegTrainConfig(_Strict):
    """Iteration-based training; each iteration draws a source, an unlabeled-target and (once
    labels exist) a labeled-target batch:
    ``loss = delta_s*NLL(S) + delta_t*NLL(T_l) + gamma*mean_pixels(max(0, F - Delta))``.

    ``eval_every``: also evaluate every that many iterations (0 = only at rounds and the end).
    """

    iterations: int = Field(150_000, ge=1)
    batch_size: int = Field(1, ge=1)
    gamma: float = Field(0.001, ge=0)
    delta_s: float = Field(1.0, ge=0)
    delta_t: float = Field(1.0, ge=0)
    tau: float = Field(1.0, gt=0)
    delta_mode: Literal["uniform", "momentum"] = "uniform"
    delta_momentum: float = Field(0.9, ge=0, lt=1)
    eval_every: int = Field(0, ge=0)
    eval_batch_size: int = Field(1, ge=1)
    log_every: int = Field(100, ge=1)
    # the free energy of L_fea and Delta per pixel (eada.energy.ALIGNMENTS): the paper's F here,
    # since the other variants are not measured on segmentation (docs/segmentation.md)
    alignment: Literal["paper", "centered", "balanced"] = "paper"


Aggregation = Literal["mean", "top_k", "class_balanced"]


class SegActiveConfig(_Strict, RoundSchedule):
    """Active rounds over whole target images.

    ``rounds_at``: the iterations after which a round selects. ``budget_total``: the total share
    of the target training images labeled over all rounds (the paper: 0.01, 0.025, 0.05), split
    evenly: after round ``r`` of ``R``, ``ceil(budget_total * N * r / R)`` images are labeled.
    ``free_energy_aggregation``/``mvsm_aggregation``: how per-pixel scores become one image score
    (see :mod:`eada.segmentation.scoring` for the reasoning behind the defaults); ``top_k_share``:
    the share of an image's pixels the ``top_k`` mean keeps. ``strategy``: ``none`` or a
    registered strategy that needs only image-level free energy / MvSM (``eada``,
    ``free_energy``, ``mvsm``, ``random``).
    """

    strategy: str = "eada"
    rounds_at: list[int] = Field(default_factory=lambda: [10_000, 20_000, 30_000, 40_000, 50_000])
    budget_total: float = Field(0.05, gt=0, le=1)
    alpha1: float = Field(0.5, gt=0, le=1)
    selection_rule: Literal["paper"] = "paper"
    free_energy_aggregation: Aggregation = "mean"
    mvsm_aggregation: Aggregation = "top_k"
    top_k_share: float = Field(0.01, gt=0, le=1)
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("strategy")
    @classmethod
    def _image_strategy(cls, v: str) -> str:
        if v == "none":
            return v
        usable = sorted(n for n, s in STRATEGIES.items() if set(s.needs) <= set(IMAGE_SCORES))
        if v not in STRATEGIES:
            raise ValueError(f"unknown strategy {v!r}; usable for segmentation: none, {usable}")
        if v not in usable:
            raise ValueError(
                f"strategy {v!r} needs {STRATEGIES[v].needs}, which whole images do not have; "
                f"usable for segmentation: none, {', '.join(usable)}"
            )
        return v

    @field_validator("rounds_at")
    @classmethod
    def _rounds(cls, v: list[int]) -> list[int]:
        return check_rounds(v, "iterations", "iteration counts >= 1")

    @model_validator(mode="after")
    def _known_params(self) -> SegActiveConfig:
        check_params(
            self.strategy,
            self.params,
            owned={"alpha1": "active.alpha1", "rule": "active.selection_rule"},
        )
        return self


class SegExperimentConfig(_Strict):
    """One segmentation run: data, model, optimiser, training, active rounds, seed.

    ``threads``: CPU threads for torch during the run (``null`` = torch's default). Tiny nets
    gain nothing from several threads and lose much on a busy machine, so the synthetic preset
    uses 1.
    """

    task: Literal["segmentation"] = "segmentation"
    name: str = "segmentation"
    seed: int = Field(0, ge=0)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int | None = Field(None, ge=1)
    data: SegDataConfig
    model: SegModelConfig = Field(default_factory=SegModelConfig)
    optim: SegOptimConfig = Field(default_factory=SegOptimConfig)
    train: SegTrainConfig = Field(default_factory=SegTrainConfig)
    active: SegActiveConfig = Field(default_factory=SegActiveConfig)

    @model_validator(mode="after")
    def _consistent(self) -> SegExperimentConfig:
        if self.active.rounds_at and self.active.rounds_at[-1] >= self.train.iterations:
            raise ValueError(
                f"active.rounds_at {self.active.rounds_at} must end before "
                f"train.iterations={self.train.iterations} (the last round's labels need training)"
            )
        if self.model.head == "deeplabv3plus" and self.train.batch_size < 2:
            raise ValueError(
                "deeplabv3plus has batch norm after global pooling in its ASPP, which needs "
                "train.batch_size >= 2"
            )
        if not self.model.freeze_bn and self.train.batch_size < 2:
            raise ValueError("model.freeze_bn=false trains batch norm, which needs batch_size >= 2")
        return self

    def resolved(self) -> dict[str, Any]:
        """Every key with its value (defaults filled in), JSON-ready."""
        return self.model_dump(mode="json")


def parse_seg_config(raw: dict[str, Any], source: str = "config") -> SegExperimentConfig:
    """Validate a mapping into a :class:`SegExperimentConfig`, or raise
    :class:`eada.config.ConfigError` listing every problem."""
    try:
        return SegExperimentConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(validation_message(source, err)) from None


def is_segmentation_config(path: str | Path) -> bool:
    """Whether ``path`` is a YAML file whose top level says ``task: segmentation``."""
    p = Path(path)
    if p.suffix not in (".yaml", ".yml", ".json") or not p.is_file():
        return False
    try:
        raw = safe_load_unique(p.read_text(encoding="utf-8"))
    except (yaml.YAMLError, ValueError):  # the config's reader names the problem
        return False
    return isinstance(raw, dict) and raw.get("task") == "segmentation"


def load_seg_config(path: str | Path, overrides: list[str] | None = None) -> SegExperimentConfig:
    """Read a segmentation YAML config, apply ``key.sub=value`` overrides, validate.

    Example:
        >>> cfg = load_seg_config("configs/seg_synthetic.yaml", ["seed=3"])  # doctest: +SKIP
    """
    raw = resolve_config_paths(read_yaml_mapping(path), path)  # against the file's folder
    apply_overrides(raw, overrides or [])
    return parse_seg_config(raw, str(path))
