"""Typed, validated experiment configs (pydantic v2).

Every key is declared here with its type and default; an unknown key or a wrong type is an error
raised before any data is read. A config is a YAML/JSON mapping with the sections ``data``,
``model``, ``optim``, ``train`` and ``active``; :func:`load_config` reads one and
:meth:`ExperimentConfig.resolved` gives the fully expanded dict written beside every run.

Defaults for named benchmarks live in :mod:`eada.hparams` (one registry), not here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from eada.strategies import STRATEGIES, check_params, get_strategy, is_strategy
from eada.strategies.lada import KNN_METHODS

MAX_BATCH = 65_536
"""The largest training or extraction batch a config may ask for (``train.batch_size=1e8``
would reach the allocator unchecked)."""
MAX_EVAL_BATCH = 1_048_576
"""The largest evaluation batch (rows of one forward pass without gradients)."""
MAX_LOSS_WEIGHT = 1000.0
"""The largest loss weight or temperature (``train.gamma``, ``delta_s``, ``delta_t``,
``tau``): published settings stay within 0.001-10."""


class _Strict(BaseModel):
    # no NaN or infinite number in a config (optim.lr=inf would train to NaN, not fail)
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class RoundSchedule:
    """What every active section shares (:class:`ActiveConfig`, the segmentation one): a
    ``strategy`` and the ``rounds_at`` at which it selects."""

    strategy: str
    rounds_at: list[int]

    @property
    def enabled(self) -> bool:
        """Whether any round selects target samples (images, in segmentation)."""
        return self.strategy != "none" and bool(self.rounds_at)


def check_rounds(v: list[int], unit: str, lower: str, first: int = 1) -> list[int]:
    """Validate a round schedule: strictly increasing ``unit`` counts, the first >= ``first``
    (``lower`` names that bound in the error)."""
    if sorted(set(v)) != v:
        raise ValueError(f"rounds_at must be strictly increasing {unit}, got {v}")
    if v and v[0] < first:
        raise ValueError(f"rounds_at are {lower}, got {v}")
    return v


class ToyData(_Strict):
    """The paper's toy example (Fig. 5): two 2-D Gaussian classes, the target a rotation.

    Source class ``k`` is ``N(mu_k, std^2 I)`` with ``mu_0 = (-separation/2, 0)`` and
    ``mu_1 = (+separation/2, 0)``; the target is the source points rotated by ``rotation_deg``
    about the origin (same labels).
    """

    kind: Literal["toy"] = "toy"
    n_per_class: int = Field(500, ge=2)
    separation: float = Field(7.0, gt=0)
    std: float = Field(1.0, gt=0)
    rotation_deg: float = 90.0


class _ClassSubset(_Strict):
    """``keep_classes``: class ids (of the data's own label space) to keep in every domain, in
    the order given; they are relabelled ``0..k-1`` and the other samples dropped (see
    :func:`eada.data.tasks.keep_classes`), e.g. ``[3, 8]`` for a two-class digits task. At
    least two distinct ids; ids beyond the data's classes are an error when the data is read."""

    keep_classes: list[int] | None = None

    @field_validator("keep_classes")
    @classmethod
    def _subset(cls, v: list[int] | None) -> list[int] | None:
        if v is None:
            return v
        if len(v) < 2:
            raise ValueError(f"keep_classes needs at least 2 class ids, got {v}")
        if len(set(v)) != len(v):
            raise ValueError(f"keep_classes has repeated class ids: {v}")
        if min(v) < 0:
            raise ValueError(f"keep_classes ids must be >= 0, got {v}")
        return v


class DigitsData(_ClassSubset):
    """A digits task read from the original files (see :mod:`eada.data.digits`)."""

    kind: Literal["digits"] = "digits"
    root: Path = Path("../shared/data/digits")
    source: Literal["mnist", "usps", "mnist_m"]
    target: Literal["mnist", "usps", "mnist_m"]
    source_split: Literal["all", "train", "test"] = "all"
    target_split: Literal["all", "train", "test"] = "all"
    heldout_split: Literal["train", "test"] | None = None
    image_size: int = Field(28, ge=20)
    channels: Literal[1, 3] = 1

    @model_validator(mode="after")
    def _distinct(self) -> DigitsData:
        if self.source == self.target and self.source_split == self.target_split:
            raise ValueError("source and target are the same domain and split")
        if self.heldout_split is not None and self.heldout_split == self.target_split:
            raise ValueError("heldout_split must differ from target_split")
        return self


class ImageTransforms(_Strict):
    """Image views (see :mod:`eada.data.transforms`); defaults = the authors' views, except
    ``unlabeled_view`` (the authors': ``random_crop``, used by the paper configs)."""

    resize: int = Field(256, ge=8)
    crop: int = Field(224, ge=8)
    test_resize: int = Field(288, ge=8)
    jitter: tuple[float, float, float, float] | None = (0.4, 0.4, 0.4, 0.1)
    hflip: bool = False
    # the train view's crop after resizing to resize x resize: random (default), center (DUC's
    # VisDA-2017 runs), random_resized (torchvision's RandomResizedCrop: DUC's Office-Home)
    train_crop: Literal["random", "center", "random_resized"] = "random"
    # train_plain (scoring and unlabeled): the train view without colour jitter (DUC's target view)
    scoring_view: Literal["random_crop", "test", "train_plain"] = "random_crop"
    # the unlabeled-target training stream: ``train`` (the train view above) or ``random_crop``
    # (shorter side to ``resize``, random crop, no jitter: the authors' code; paper configs)
    unlabeled_view: Literal["train", "random_crop", "train_plain"] = "train"
    normalization: Literal["auto", "imagenet", "efficientnet_lite", "inception", "none"] = "auto"

    @model_validator(mode="after")
    def _sizes(self) -> ImageTransforms:
        if self.crop > min(self.resize, self.test_resize):
            raise ValueError(f"crop {self.crop} exceeds resize/test_resize")
        return self


class ImageListData(_ClassSubset):
    """Image domains (see :mod:`eada.data.images`): each of ``source``/``target``/``heldout`` is
    a list file (``path label`` a line) or a domain folder ``DOMAIN/[images/]CLASS/*.jpg``.
    ``root``: where relative list paths start (default: the list file's folder).
    ``skip_bad_images``: drop unreadable/missing images (recorded in the run) instead of failing.
    ``allow_outside_root``: accept list paths that resolve outside ``root`` (default: error).
    ``cache_dir``: frozen-backbone feature cache.
    ``decode_cache_mb``: fine-tuning decodes each image once into a uint8 cache under
    ``decode_cache_dir`` (:mod:`eada.data.decoded`) when the source, target and held-out caches
    together fit this many MiB and the free disk space (0: off; images decoded every read).
    ``persistent_workers``: the ``workers`` processes of a view live as long as the run (one
    pool a stream), else a new pool every pass. ``prefetch``: batches read ahead."""

    kind: Literal["images"] = "images"
    source: Path
    target: Path
    heldout: Path | None = None
    root: Path | None = None
    transforms: ImageTransforms = Field(default_factory=ImageTransforms)
    skip_bad_images: bool = False
    allow_outside_root: bool = False
    workers: int = Field(2, ge=0)
    cache_dir: Path = Path(".cache/eada/features")
    extract_batch_size: int = Field(64, ge=1, le=MAX_BATCH)
    decode_cache_mb: int = Field(8192, ge=0)
    decode_cache_dir: Path = Path(".cache/eada/decoded")
    persistent_workers: bool = True
    prefetch: int = Field(2, ge=1)


class FeatureData(_ClassSubset):
    """Feature matrices (see :mod:`eada.data.features`): ``.npy``/``.npz``/``.mat``/``.parquet``
    a domain; ``*_labels`` separate label files (needed for ``.npy``)."""

    kind: Literal["features"] = "features"
    source: Path
    target: Path
    heldout: Path | None = None
    source_labels: Path | None = None
    target_labels: Path | None = None
    heldout_labels: Path | None = None
    features_key: str | None = None
    labels_key: str | None = None
    classes: list[str] | None = None
    normalize: Literal["none", "l2", "zscore", "l1_zscore"] = "none"


DataConfig = Annotated[
    ToyData | DigitsData | ImageListData | FeatureData, Field(discriminator="kind")
]


class ModelConfig(_Strict):
    """The energy network. ``linear``: one fully-connected layer (toy); ``lenet``: digits CNN;
    ``mlp``: hidden layers on flat inputs; ``backbone``: an image backbone (``backbone`` name,
    ``weights``, or a user ``factory``) + bottleneck + head; with ``freeze_backbone`` the
    backbone only extracts features once and the head is trained on them.
    ``freeze_bottleneck_bn_affine``: the bottleneck batch norm's affine parameters stay at
    their initial values (the authors' code; on in the paper configs, off by default)."""

    name: Literal["linear", "lenet", "mlp", "backbone"] = "lenet"
    hidden: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [256])
    # image backbones (name: backbone; see eada.models.backbones)
    backbone: str = "resnet50"
    # pretrained (the library's default) | pretrained:NAME (a torchvision weights name, e.g.
    # pretrained:IMAGENET1K_V1, the authors' ResNet-50) | none | PATH to a local checkpoint
    weights: str | None = "pretrained"
    factory: str | None = Field(None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    bottleneck_dim: int | None = Field(None, ge=1)  # Linear -> BatchNorm1d before the head
    # a ReLU after the bottleneck's BatchNorm1d (DUC's ResNetFc; EADA's and LADA's have none)
    bottleneck_relu: bool = False
    freeze_backbone: bool = False  # extract features once (cached), train the head only
    # keep the bottleneck BatchNorm's scale/shift at 1/0 (never trained), as the authors' code
    # does (its optimiser never receives them); the paper configs set it, off elsewhere
    freeze_bottleneck_bn_affine: bool = False
    # LADA's cosine classifier (MODEL.NORMALIZE, MODEL.TEMP 0.05; off in all their configs): the
    # head sees the L2-normalised embeddings divided by this temperature; None: plain embeddings
    cosine_temperature: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _bn_needs_bottleneck(self) -> ModelConfig:
        if self.bottleneck_relu and not self.bottleneck_dim:
            raise ValueError("model.bottleneck_relu needs a bottleneck: set model.bottleneck_dim")
        if self.freeze_bottleneck_bn_affine and not self.bottleneck_dim:
            raise ValueError(
                "model.freeze_bottleneck_bn_affine needs a bottleneck: set model.bottleneck_dim"
            )
        if self.freeze_bottleneck_bn_affine and self.name == "lenet":
            raise ValueError("model.freeze_bottleneck_bn_affine: lenet has no bottleneck")
        return self


class OptimConfig(_Strict):
    """Optimiser. ``backbone_lr_mult`` scales the learning rate of ``model.backbone``.

    ``nesterov``: Nesterov momentum (SGD with ``momentum > 0`` only; DUC's authors use it).
    ``schedule``: ``constant`` (default) or ``inv``, the learning rate of step ``i`` (0-based,
    counted over the whole run) ``lr (1 + schedule_gamma i) ^ -schedule_power`` in every
    parameter group (Caffe's ``inv`` policy: DUC's ``LrScheduler``, gamma 0.001, power 0.75,
    ``core/utils/utils.py``; also DANN's and CDAN's schedule).
    """

    name: Literal["sgd", "adam", "adadelta"] = "adadelta"
    lr: float = Field(0.1, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    backbone_lr_mult: float = Field(1.0, gt=0)
    nesterov: bool = False
    schedule: Literal["constant", "inv"] = "constant"
    schedule_gamma: float = Field(0.001, gt=0)
    schedule_power: float = Field(0.75, gt=0)

    @model_validator(mode="after")
    def _nesterov_needs_sgd_momentum(self) -> OptimConfig:
        if self.nesterov and (self.name != "sgd" or self.momentum <= 0):
            raise ValueError(
                f"optim.nesterov needs optim.name sgd with momentum > 0 (got {self.name}, "
                f"momentum {self.momentum})"
            )
        return self


class TrainConfig(_Strict):
    """Training: ``loss = delta_s*NLL(S) + delta_t*NLL(T_l) + gamma*mean(max(0, F(x_t)-Delta))``.

    One epoch = ``max(#source batches, #unlabeled-target batches)`` steps (the reference code's
    definition); the shorter stream restarts with a new shuffle. ``batch_size`` is per process:
    under ``torchrun`` with ``W`` processes a step sees ``W x batch_size`` samples a stream.

    ``alignment``: ``normalized`` (default) compares the shift-invariant free energy
    ``G = F - mean_y E`` of the target energies, taken relative to the batch's class means and
    divided by the joint energy scale of the source and target batches (scale-free), with the
    source's running mean of the same quantity; ``balanced`` skips the division; ``centered``
    uses ``G`` per sample; ``paper`` the free energy ``F`` itself (paper Eq. 5). See
    :func:`eada.energy.normalized_free_energy`, :func:`eada.energy.balanced_free_energy` and
    :func:`eada.energy.centered_free_energy`.

    ``fea_gate``: the weight ``w`` in ``gamma * w * L_fea`` (:data:`eada.energy.FEA_GATES`):
    ``labels`` (the default: the share of the planned target labels given, so no ``L_fea``
    before the first round and all of it after the last), ``none`` (``w = 1``, the paper; the
    default before, and what configs that follow the authors pin), ``dann``
    (``2 / (1 + exp(-10 p)) - 1`` over the share ``p`` of the run's training steps),
    ``confidence`` (per sample ``(p_max - 1/C) / (1 - 1/C)``) or
    ``zero`` (``w = 0``: the unlabeled batches are drawn and passed through the model as in EADA,
    but ``L_fea`` adds nothing to the loss; the paired ablation ``eada_no_fea``).
    ``dann`` and ``labels`` count over the config's whole schedule: its epochs and the target
    labels its rounds plan (one seed of ``eada run``; a project store's ``eada train`` calls
    are segments of it, :class:`eada.train.GateSchedule`); with no rounds planned ``labels``
    gives ``w = 1``.

    ``forward``: ``separate`` runs one forward pass per stream (the reference code), ``fused``
    one pass over the concatenated batches with per-stream batch norm (same maths, see
    :mod:`eada.train.forward`). ``amp``: bfloat16 autocast on CUDA (the authors train in fp32:
    paper configs set ``amp: false``). ``channels_last``: the channels-last memory format for
    convolutional models.

    ``compile``: ``torch.compile`` of the step's forward passes; ``compile_mode`` (setting it
    turns ``compile`` on): the mode it compiles with, ``default``, ``reduce-overhead`` (the
    compiled passes replayed as CUDA graphs, one launch each: for small batches whose kernels
    are short; on the CPU it compiles as ``default``), ``max-autotune`` or
    ``max-autotune-no-cudagraphs``. ``cudnn_benchmark``: ``torch.backends.cudnn.benchmark``
    for the run on CUDA (cuDNN tries its convolution algorithms on each new input shape and
    keeps the fastest; not bit-reproducible from run to run); no effect on the CPU.

    ``loaders``: ``continuous`` (steps per epoch fixed from the initial pool; the streams run
    on across epochs; every stream drops its last partial batch) or ``per_epoch`` (the authors'
    code; paper configs): steps per epoch recomputed every epoch over the CURRENT unlabeled
    pool, all three streams restart (new shuffle) at every epoch, and the labeled-target stream
    keeps its last partial batch.
    """

    epochs: int = Field(10, ge=1)
    # sizes that size an allocation are bounded; loss weights far outside every published
    # setting (the paper's gamma 0.01-0.1, delta 0.1-1, tau 1) are refused: gamma=1e30 trained
    # without a word to 41.3 % where 55.1 % was expected
    batch_size: int = Field(32, ge=2, le=MAX_BATCH)
    gamma: float = Field(0.01, ge=0, le=MAX_LOSS_WEIGHT)
    delta_s: float = Field(1.0, ge=0, le=MAX_LOSS_WEIGHT)
    delta_t: float = Field(1.0, ge=0, le=MAX_LOSS_WEIGHT)
    tau: float = Field(1.0, gt=0, le=MAX_LOSS_WEIGHT)
    delta_mode: Literal["uniform", "momentum"] = "uniform"
    delta_momentum: float = Field(0.9, ge=0, lt=1)
    eval_every: int = Field(1, ge=1)
    eval_batch_size: int = Field(512, ge=1, le=MAX_EVAL_BATCH)
    amp: bool = True  # bfloat16 autocast of the forward passes, on CUDA only
    # how often a step's losses are read back from the device: every step (1, the CPU's
    # default: reading costs nothing there) or every N steps (0 = auto: 25 on CUDA), the
    # losses summed on the device meanwhile and the non-finite check done at that cadence
    sync_every: int = Field(0, ge=0)
    # torch.compile the step's forward passes (eada.train.forward.StepForward): an option for
    # GPUs, where benchmarks/gpu_check.py measures whether it is faster; off by default
    compile: bool = False
    # torch.compile's mode for the step (set, it turns train.compile on): default,
    # reduce-overhead (CUDA graphs of the compiled passes: fewer kernel launches; on the CPU
    # the same as default), max-autotune, max-autotune-no-cudagraphs; see the class docstring
    compile_mode: (
        Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] | None
    ) = None
    # torch.backends.cudnn.benchmark on CUDA: cuDNN times its convolution algorithms for each
    # new input shape and keeps the fastest (nothing on the CPU); recorded in the run's meta
    cudnn_benchmark: bool = False
    forward: Literal["separate", "fused"] = "separate"  # see eada.train.forward
    channels_last: bool = False  # channels-last memory format for 4-d inputs and the model
    loaders: Literal["continuous", "per_epoch"] = "continuous"  # see the class docstring
    # which free energy L_fea and Delta use (eada.energy.ALIGNMENTS): by default G = F - mean_y E
    # of the energies relative to the batch's class means, divided by the joint energy scale of
    # the source and target batches ("normalized"); without the division ("balanced"); the
    # per-sample G ("centered"); or the paper's F (configs that reproduce the paper pin it);
    # BENCHMARKS.md "Alignment variants"
    alignment: Literal["paper", "centered", "balanced", "normalized"] = "normalized"
    # the weight w in gamma * w * L_fea (eada.energy.FEA_GATES): labels (the default since
    # issue 23: BENCHMARKS.md "A paired ablation of L_fea"), none (w = 1, the paper), dann
    # (w = 2 / (1 + exp(-10 p)) - 1 over the share p of training steps done), confidence
    # (per sample, the model's own
    # confidence above chance, 0..1) or zero (w = 0: EADA w/o L_fea on EADA's own batches, the
    # paired ablation eada_no_fea); BENCHMARKS.md "Two-class tasks"
    fea_gate: Literal["none", "dann", "labels", "confidence", "zero"] = "labels"
    # steps an epoch: max(#source, #unlabeled-target batches) (default, EADA's and DUC's code),
    # #source batches (LADA's ft, RAA, LAA solvers), min(...) (LADA's MME, DANN: a zip of the
    # two) or #labeled-target batches (LADA's ft_tgt, with delta_s 0; 1 step before any label)
    epoch_length: Literal["max", "source", "min", "labeled"] = "max"
    # epochs of source-only NLL training before the schedule (LADA's source stage,
    # TRAINER.MAX_SOURCE_EPOCHS: 1 in their VisDA-2017 config), with an optimiser of its own
    source_epochs: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _compile_mode_needs_compile(self) -> TrainConfig:
        if self.compile_mode is not None and not self.compile:
            if "compile" in self.model_fields_set:
                raise ValueError(
                    f"compile_mode: {self.compile_mode} compiles the step, but compile is "
                    "false; drop one of the two"
                )
            object.__setattr__(self, "compile", True)  # compile_mode turns compile on
        return self

    @property
    def effective_compile_mode(self) -> str | None:
        """The mode ``torch.compile`` runs with (``None``: not compiled)."""
        return (self.compile_mode or "default") if self.compile else None


class ActiveConfig(_Strict, RoundSchedule):
    """Active rounds. ``rounds_at``: the epochs (1-based) at whose END a round selects.

    ``budget_per_round``: an ``int`` is a count; a ``float`` in ``(0, 1]`` a share of the WHOLE
    target set. ``strategy: none`` (or empty ``rounds_at``) trains without target labels.
    ``selection_rule``: ``paper`` or ``reference`` (see :mod:`eada.strategies.eada`).
    ``rounds_at``: 0 selects before the first epoch (after ``train.source_epochs``: LADA's
    VisDA-2017 runs query at their epoch 0 after one source epoch).

    ``budget_total`` (set, it replaces ``budget_per_round``): LADA's budget rule
    (``active/budget.py``): the whole budget, a count or a share of the target set rounded
    half to even (``np.round(N x share)``), ``total // R`` labels each of the ``R`` rounds and
    the remainder in the last (Office-Home Art at 5%: 121 = 24 x 4 + 25).
    """

    strategy: str = "eada"
    # five rounds, each followed by training (train.epochs defaults to 10)
    rounds_at: list[int] = Field(default_factory=lambda: [1, 3, 5, 7, 9])
    budget_per_round: int | float = 0.01
    budget_total: int | float | None = None
    alpha1: float = Field(0.5, gt=0, le=1)
    selection_rule: Literal["paper", "reference"] = "paper"
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, v: str) -> str:
        if v != "none" and not is_strategy(v):  # a plugin's too, once its plugin is loaded
            raise ValueError(
                f"unknown strategy {v!r}; known: none, {', '.join(sorted(STRATEGIES))} (a "
                "plugin's strategy is known once its plugin is loaded: --plugin FILE_OR_MODULE, "
                "a config's plugins: list, or an installed package's entry point)"
            )
        return v

    @field_validator("budget_per_round", "budget_total", mode="before")
    @classmethod
    def _budget_not_bool(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("budget_per_round must be an int count or a float share, not a bool")
        return v

    @field_validator("budget_per_round", "budget_total")
    @classmethod
    def _budget(cls, v: int | float | None) -> int | float | None:
        if v is None:
            return v
        if isinstance(v, int) and v < 1:
            raise ValueError(f"a budget count must be >= 1, got {v}")
        if isinstance(v, float) and not 0.0 < v <= 1.0:
            raise ValueError(f"a budget share must lie in (0, 1], got {v}")
        return v

    @field_validator("rounds_at")
    @classmethod
    def _rounds(cls, v: list[int]) -> list[int]:
        return check_rounds(v, "epochs", "epochs >= 0 (0: before the first epoch)", first=0)

    @model_validator(mode="after")
    def _known_params(self) -> ActiveConfig:
        own = get_strategy(self.strategy).options if self.strategy != "none" else ()
        component_settings: tuple[str, ...] = ()
        if any(k not in own for k in self.params):  # a training component's setting
            # the components are torch modules: imported only for a config that sets one, so
            # a plain config validates without torch (`eada status`, `eada config set`)
            from eada.strategies.components import component_params

            component_settings = component_params()
        check_params(
            self.strategy,
            self.params,
            also=component_settings,  # the plugins' components' settings too
            owned={
                "alpha1": "active.alpha1",
                "rule": "active.selection_rule",
                "budget_share": "active.budget_per_round",
            },
        )
        knn = self.params.get("knn", "auto")
        if knn not in KNN_METHODS:  # LAS's neighbour search
            raise ValueError(
                f"active.params.knn must be one of {', '.join(KNN_METHODS)}; got {knn!r}"
            )
        names = self.params.get("aux_components", [])
        if not isinstance(names, list) or any(not _is_component(n) for n in names):
            from eada.strategies.components import COMPONENT_CLASSES

            raise ValueError(
                f"active.params.aux_components must be a list of "
                f"{', '.join(COMPONENT_CLASSES)}; got {names!r}"
            )
        return self


def _is_component(name: Any) -> bool:
    """Whether ``name`` is a registered training component (a plugin's included)."""
    from eada.strategies.components import get_component

    if not isinstance(name, str):
        return False
    try:
        get_component(name)
    except ValueError as err:
        if "unknown training component" in str(err):
            return False
        raise
    return True


class ExperimentConfig(_Strict):
    """One run: data, model, optimiser, training, active rounds, seed.

    ``plugins``: modules or ``.py`` files imported before the rest of the config is validated
    (their strategies, components, backbones; see :mod:`eada.extend`), e.g.
    ``plugins: [my_plugin.py]`` (a relative file path resolves against the config's folder).
    """

    name: str = "run"
    seed: int = Field(0, ge=0)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    data: DataConfig
    model: ModelConfig = Field(default_factory=ModelConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    active: ActiveConfig = Field(default_factory=ActiveConfig)
    plugins: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _load_plugins(cls, raw: Any) -> Any:
        """Import the config's ``plugins`` before its strategy and components are checked."""
        if isinstance(raw, dict) and raw.get("plugins"):
            names = raw["plugins"]
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise ValueError(f"plugins must be a list of modules or .py files, got {names!r}")
            from eada.plugins import load_plugins

            load_plugins(names)
        return raw

    @model_validator(mode="before")
    @classmethod
    def _features_default_model(cls, raw: Any) -> Any:
        """A feature-matrix config without a ``model`` section trains the frozen-backbone
        configs' head (``linear`` + ``bottleneck_dim: 256``, see :mod:`eada.data.export`)."""
        if isinstance(raw, dict) and "model" not in raw:
            data = raw.get("data")
            if isinstance(data, dict) and data.get("kind") == "features":
                return {**raw, "model": {"name": "linear", "bottleneck_dim": 256}}
        return raw

    @model_validator(mode="after")
    def _images_need_backbone(self) -> ExperimentConfig:
        if (self.data.kind == "images") != (self.model.name == "backbone"):
            raise ValueError("data.kind images and model.name backbone go together")
        return self

    @model_validator(mode="after")
    def _rounds_within_epochs(self) -> ExperimentConfig:
        rounds, epochs = self.active.rounds_at, self.train.epochs
        if self.active.enabled and rounds[-1] >= epochs:
            # a round selects at the END of its epoch: at (or after) the last epoch its labels
            # would never be trained on
            early = ",".join(str(r) for r in rounds if r < epochs)
            fix = f"raise train.epochs (--set train.epochs={rounds[-1] + 1})"
            if early:
                fix += f" or drop the late rounds (--set active.rounds_at=[{early}])"
            raise ValueError(
                f"active.rounds_at {rounds} has a round at or after the last epoch "
                f"(train.epochs={epochs}), whose labels would never be trained on: {fix}"
            )
        return self

    def resolved(self) -> dict[str, Any]:
        """Every key with its value (defaults filled in), JSON-ready; ``plugins`` only when
        the config names some (so a config without plugins resolves as before the key)."""
        out = self.model_dump(mode="json")
        if not out.get("plugins"):
            out.pop("plugins", None)
        return out


class ConfigError(ValueError):
    """A config file or override that does not validate; the message lists every problem."""


def parse_config(raw: dict[str, Any], source: str = "config") -> ExperimentConfig:
    """Validate a mapping into an :class:`ExperimentConfig`, or raise :class:`ConfigError`."""
    try:
        return ExperimentConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(validation_message(source, err)) from None


def validation_message(source: str, err: ValidationError) -> str:
    """Every problem of a failed validation on one line, each with its key path:
    ``SOURCE is invalid: train.lr: Input should be a finite number; ...``."""
    parts = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"])
        msg = str(e["msg"]).removeprefix("Value error, ")
        parts.append(f"{where}: {msg}" if where else msg)
    return " ".join(f"{source} is invalid: {'; '.join(parts)}".split())


def load_config(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Read a YAML/JSON config, apply ``key.sub=value`` overrides, validate.

    Relative data paths written in the file resolve against the file's folder
    (:func:`resolve_config_paths`); paths given in ``overrides`` against the working folder.

    Args:
        path: the config file.
        overrides: e.g. ``["train.epochs=3", "active.strategy=random"]``; values are parsed as YAML.
    """
    raw = resolve_config_paths(read_yaml_mapping(path), path)
    raw.pop("store", None)  # a project config's store section: read by the store only
    apply_overrides(raw, overrides or [])
    return parse_config(raw, str(path))


DATA_PATH_KEYS = (
    "source",
    "target",
    "heldout",
    "root",
    "cache_dir",
    "decode_cache_dir",
    "source_labels",
    "target_labels",
    "heldout_labels",
    "gtav_root",
    "cityscapes_root",
)
"""The ``data`` keys that hold file paths (``source``/``target`` only where the kind reads
files: not ``toy``, and not ``digits``, whose source and target are dataset names)."""

_EXPECTED = {
    "images": "an image folder (DOMAIN/[images/]CLASS/*.jpg, or a flat folder for an "
    "unlabeled target) or a list file (.txt 'path label' lines, or .csv)",
    "folders": "an image folder (DOMAIN/[images/]CLASS/*.jpg, or a flat folder for an "
    "unlabeled target)",
    "features": "a feature file (.npy, .npz, .mat, .parquet)",
}


def _path_keys(data: dict[str, Any]) -> list[str]:
    kind = data.get("kind")
    if kind == "toy":
        return []
    if kind == "digits":
        return [k for k in ("root",) if data.get(k) is not None]
    return [k for k in DATA_PATH_KEYS if isinstance(data.get(k), str | Path)]


def resolve_config_paths(raw: dict[str, Any], config_file: str | Path) -> dict[str, Any]:
    """``raw`` with the relative file paths of its ``data`` section resolved against the
    config file's folder: relative to the working folder when the config file is named by a
    relative path (so a config run from the repository root records the same paths as
    before this rule), absolute when it is named by an absolute one.

    Nothing is opened here (``eada run --dry-run`` touches no data); a loader that does not
    find a path says where it came from (:func:`path_origin`).
    """
    base = Path(config_file).parent
    if isinstance(raw.get("plugins"), list):  # plugin files, as data files: beside the config
        raw = {
            **raw,
            "plugins": [
                os.path.normpath(base / p)
                if isinstance(p, str) and p.endswith(".py") and not Path(p).is_absolute()
                else p
                for p in raw["plugins"]
            ],
        }
    data = raw.get("data")
    if not isinstance(data, dict):
        return raw
    out = dict(data)
    for key in _path_keys(out):
        given = Path(str(out[key]))
        if given.is_absolute():
            continue
        joined = Path(os.path.normpath(base / given))
        # a config named by a relative path gives paths relative to the working folder
        # (from the repository root, configs/x.yaml's ../../shared/data/y is recorded as
        # ../shared/data/y, as before this rule), one named by an absolute path absolute ones
        out[key] = str(joined if not base.is_absolute() else joined.absolute())
        what = _EXPECTED.get(str(out.get("kind")), "a folder or file")
        note = (
            f" (data.{key}: {given} in {config_file}; relative paths in a config resolve "
            f"against its folder {base.absolute()}; expected {what})"
        )
        for form in (joined, joined.absolute()):
            _ORIGINS[os.path.normpath(form)] = note
    return {**raw, "data": out}


_ORIGINS: dict[str, str] = {}


def path_origin(path: str | Path) -> str:
    """Where a data path came from, for a not-found message: the config key, the file, the
    folder relative paths resolved against and what was expected there (``""`` for a path
    no config file resolved, e.g. one given on the command line)."""
    p = os.path.normpath(path)
    return _ORIGINS.get(p) or _ORIGINS.get(os.path.normpath(Path(p).absolute()), "")


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (YAML keeps the last
    silently: ``lr: 0.1`` then ``lr: 10`` would train with 10 without a word)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key: SafeLoader's own error says so
                break
            if first is not key_node.start_mark:
                raise yaml.constructor.ConstructorError(
                    f"while reading a mapping (its key {key!r} first at line {first.line + 1})",
                    node.start_mark,
                    f"the key {key!r} is given twice; keep one",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)


def safe_load_unique(text: str) -> Any:
    r"""``yaml.safe_load`` that refuses duplicate keys (:class:`_UniqueKeyLoader`): configs,
    ``--set`` values and ``eada config set`` values are read with it.

    >>> safe_load_unique("a: 1\nb: 2")
    {'a': 1, 'b': 2}
    >>> try:
    ...     safe_load_unique("a: 1\na: 2")
    ... except yaml.YAMLError as e:
    ...     print(yaml_error_line(e))  # doctest: +ELLIPSIS
    the key 'a' is given twice; keep one at line 2, column 1 (while reading a mapping ...)
    """
    return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no Python objects


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """The top-level mapping of a YAML config file, or a :class:`ConfigError` on one line
    (not UTF-8, not YAML, a key given twice, not a mapping), naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        raw = safe_load_unique(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{path} is not UTF-8 text (byte {err.start}: {err.reason}); save it as UTF-8"
        ) from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {yaml_error_line(err)}") from None
    except ValueError as err:  # a 5,001-digit integer: Python's int() limit
        raise ConfigError(f"{path}: a value eada cannot read ({err})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a mapping of sections, got {type(raw).__name__}")
    return raw


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set ``a.b.c=value`` entries in a nested dict in place (values parsed with YAML)."""
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        node = raw
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
            node = child
        try:
            node[parts[-1]] = safe_load_unique(value)
        except yaml.YAMLError as err:
            raise ConfigError(
                f"override {item!r}: the value is not valid YAML: {yaml_error_line(err)}"
            ) from None
        except ValueError as err:  # a 5,001-digit integer: Python's int() limit
            raise ConfigError(f"override {key}=...: a value eada cannot read ({err})") from None
    return raw


def yaml_error_line(err: yaml.YAMLError) -> str:
    """A YAML syntax error on one line: what is wrong and where (1-based line and column).

    Example:
        >>> try:
        ...     yaml.safe_load("a: b: c")
        ... except yaml.YAMLError as e:
        ...     print(yaml_error_line(e))
        mapping values are not allowed here at line 1, column 5
    """
    if not isinstance(err, yaml.MarkedYAMLError):
        return " ".join(str(err).split())

    def at(mark: Any) -> str:
        return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""

    text = (err.problem or "syntax error") + at(err.problem_mark)
    if err.context:
        text += f" ({err.context}{at(err.context_mark)})"
    return " ".join(text.split())
