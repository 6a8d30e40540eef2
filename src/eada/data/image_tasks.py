"""Tasks from image data (fine-tuning or frozen-backbone features) and from feature matrices.

Called by :func:`eada.data.tasks.load_task` for ``data.kind: images`` and ``features``. Every
check runs before any training: class maps, label ids, empty domains, and every image decoded
once (for a frozen backbone by the first feature extraction itself, :class:`FeatureCheck`);
all unreadable or missing images are reported together, and the run stops unless
``skip_bad_images: true``, in which case they are dropped and listed in ``Task.notes``
(written into the run's record).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from eada.config import FeatureData, ImageListData, ModelConfig
from eada.data.base import Task, TensorDomain
from eada.data.datasets import DecodeChecked, ImageDomain
from eada.data.decoded import (
    base_of,
    cache_complete,
    decode_caches,
    fill_cache,
    mib,
    not_fitting,
    plan_cache,
)
from eada.data.features import (
    cache_key,
    cached_features,
    extract_features,
    feature_domains,
    read_feature_file,
    save_cached_features,
)
from eada.data.images import (
    ImageDataError,
    ImageList,
    check_domain,
    check_pair,
    find_bad_images,
    load_image_list,
)
from eada.data.transforms import (
    Normalization,
    TransformSpec,
    View,
    build_transform,
    normalization_for,
    transform_key,
)
from eada.runs import write_json


def transform_spec(cfg: ImageListData) -> TransformSpec:
    """The :class:`TransformSpec` of a data config."""
    t = cfg.transforms
    return TransformSpec(
        t.resize, t.crop, t.test_resize, t.jitter, t.hflip, t.scoring_view, t.train_crop
    )


def backbone_normalization(model: ModelConfig, name: str) -> Normalization:
    """The normalisation the model's backbone expects (``name`` unless ``auto``); timm models
    use their pretrained config's mean/std."""
    if name == "auto" and model.factory is None and model.backbone.startswith("timm:"):
        try:
            import timm

            pcfg = timm.models.get_pretrained_cfg(model.backbone.removeprefix("timm:"))
            if pcfg is not None:
                m = [float(v) for v in pcfg.mean]
                sd = [float(v) for v in pcfg.std]
                return Normalization(model.backbone, (m[0], m[1], m[2]), (sd[0], sd[1], sd[2]))
        except ImportError:
            pass
    return normalization_for(model.backbone, name)


def checked_image_lists(
    cfg: ImageListData,
    decoded: Callable[[str, ImageList], bool] | None = None,
    extract: Callable[[str, ImageList], dict[Path, str]] | None = None,
) -> tuple[dict[str, ImageList], dict[str, str]]:
    """The source/target/heldout image lists after every check; returns them and the skipped
    images (``{path: reason}``, empty unless ``skip_bad_images``).

    ``decoded(role, images)`` says that a domain's images need no decoding check: they were
    all decoded when its cached features were extracted (the cache key covers every path,
    size and modification time), so a re-run does not decode every image again
    (:func:`cached_feature_domains`). ``extract``: the decode check done by the feature
    extraction (:meth:`FeatureCheck.extract`, see :func:`drop_bad_images`).

    Raises:
        ImageDataError: label ids outside the class map, class names that differ, an empty
            domain, or (without ``skip_bad_images``) any missing/unreadable image -- each
            problem listed.
    """
    outside = cfg.allow_outside_root
    lists = {"source": load_image_list(cfg.source, cfg.root, allow_outside=outside)}
    lists["target"] = load_image_list(cfg.target, cfg.root, allow_outside=outside)
    if cfg.heldout is not None:
        lists["heldout"] = load_image_list(cfg.heldout, cfg.root, allow_outside=outside)
    report = check_pair(lists["source"], lists["target"], decode=False)
    src_classes = lists["source"].classes
    for role in ("target", "heldout"):  # a target lacking source classes: the source's map
        il = lists.get(role)
        if il is not None and report.ok and il.classes != src_classes:
            if set(il.classes) < set(src_classes):
                lists[role] = il.with_classes(src_classes)
    if "heldout" in lists:
        check_domain(lists["heldout"], "heldout", report, decode=False)
        if lists["heldout"].classes != lists["target"].classes:
            report.errors.append("heldout and target class names differ")
    if not report.ok:
        raise ImageDataError("image data check failed:\n" + report.format())
    lists, bad = drop_bad_images(lists, cfg.skip_bad_images, decoded, extract)
    if bad:
        for role in ("source", "target"):
            if not lists[role].paths:
                raise ImageDataError(f"{role}: no readable images left after skipping")
    return lists, {str(p): r for p, r in sorted(bad.items())}


def drop_bad_images(
    lists: dict[str, ImageList],
    skip: bool,
    decoded: Callable[[str, ImageList], bool] | None = None,
    extract: Callable[[str, ImageList], dict[Path, str]] | None = None,
) -> tuple[dict[str, ImageList], dict[Path, str]]:
    """Decode every image of ``lists`` (but the domains ``decoded(role, images)`` vouches
    for) and return the lists without the missing/unreadable ones, and those (``{path:
    reason}``).

    ``extract(role, images)`` (a frozen backbone's :meth:`FeatureCheck.extract`): the decoding
    is the feature extraction's, which returns the bad images of the domain, so each image is
    decoded once. A missing file is found first (``stat``); with one and without ``skip``
    every image is decoded here instead, so the error lists every problem before any
    extraction.

    Raises:
        ImageDataError: any missing/unreadable image unless ``skip``
            (``data.skip_bad_images``), every one listed.
    """
    roles = [r for r, il in lists.items() if decoded is None or not decoded(r, il)]
    paths = sorted({p for r in roles for p in lists[r].paths})
    missing = {p: "missing" for p in paths if not p.is_file()} if extract is not None else {}
    if extract is None or (missing and not skip):
        bad = find_bad_images(paths)
    else:
        bad = dict(missing)
        for r in roles:
            bad.update(extract(r, lists[r].drop(set(missing)) if missing else lists[r]))
    if bad and not skip:
        listing = "\n  ".join(f"{p}: {r}" for p, r in sorted(bad.items()))
        raise ImageDataError(
            f"{len(bad)} image(s) missing or unreadable (set data.skip_bad_images: true to "
            f"skip them):\n  {listing}"
        )
    if bad:
        lists = {k: v.drop(set(bad)) for k, v in lists.items()}
    return lists, bad


def load_image_task(
    cfg: ImageListData, model: ModelConfig | None = None, device: str = "cpu"
) -> Task:
    """Image domains, or (``model.freeze_backbone``) cached backbone features of them."""
    check = cached_feature_domains(cfg, model, device)
    dc = DecodeCheck.of(cfg, model) if check is None else None  # fine-tuning: the cache checks
    vouch: Callable[[str, ImageList], bool] | None = check if check is not None else dc
    extract = check.extract if check is not None else (dc.extract if dc is not None else None)
    lists, skipped = checked_image_lists(cfg, vouch, extract)
    domains, notes = image_domains(cfg, model, lists, device, check=check)
    notes = {"skipped_images": skipped, **notes}
    return Task(domains["source"], domains["target"], domains.get("heldout"), notes)


class FeatureCheck:
    """The feature cache of a frozen backbone, and the decode check done by its extraction.

    ``check(role, images)``: whether the cache holds that domain's features (its images were
    all decoded when they were extracted, so they need no decoding check). :meth:`extract`
    extracts a domain's features, decoding each image ONCE, and returns the missing or
    unreadable ones (the check and the extraction in one pass); :func:`image_domains` then
    takes those features (less the rows of images dropped) instead of extracting again.
    ``progress`` gets a plain line before and after each extraction, naming the domain.
    """

    def __init__(
        self,
        cfg: ImageListData,
        model: ModelConfig,
        device: str = "cpu",
        progress: Callable[[str], None] | None = None,
    ) -> None:
        import torch

        from eada.models.backbones import build_backbone

        self.cfg, self.progress = cfg, progress
        self.backbone = build_backbone(
            model.backbone, model.weights, model.factory, cfg.transforms.normalization
        )
        self.spec = transform_spec(cfg)
        self.tkey = transform_key("test", self.spec, self.backbone.normalization)
        self.model_id = model.factory or model.backbone
        dev = "cuda" if device == "auto" and torch.cuda.is_available() else device
        self.device = "cpu" if dev == "auto" else dev
        self._extracted: dict[str, tuple[ImageList, Any, dict[str, Any]]] = {}

    def key(self, images: ImageList) -> str:
        """The feature cache key of ``images`` (every path, size and modification time)."""
        return cache_key(self.model_id, self.backbone.weights_id, self.tkey, images.paths)

    def __call__(self, role: str, images: ImageList) -> bool:
        if not all(p.is_file() for p in images.paths):
            return False  # a missing image: the check names it
        return (self.cfg.cache_dir / f"{self.key(images)}.pt").is_file()

    def domain(self, images: ImageList) -> ImageDomain:
        """``images`` read through the backbone's test view."""
        tfm = build_transform("test", self.spec, self.backbone.normalization)
        shape = (3, self.spec.crop, self.spec.crop)
        return ImageDomain(images, {"test": tfm}, shape, self.cfg.workers, "test")

    def describe(self, role: str, images: ImageList) -> str:
        """``"<backbone> features of the <role> domain '<name>' (<n> images)"``."""
        return (
            f"{self.model_id} features of the {role} domain {images.name!r} ({len(images)} images)"
        )

    def extract(self, role: str, images: ImageList) -> dict[Path, str]:
        """Extract the features of ``images``, decoding each image once, and return the
        missing/unreadable ones (``{path: reason}``). The features of the readable images
        are cached under their key and, when some are bad, the bad ones under the key of
        ``images`` (``<key>.bad.json``), so a re-run over the same files decodes only the
        images found bad (an image can fail without a change of its size or time: a
        permission, a network file system; one that decodes now sends the domain through a
        new extraction)."""
        import torch

        if not images.paths:
            return {}
        t0 = time.perf_counter()
        what = self.describe(role, images)
        cache = self.cfg.cache_dir
        known = cache / f"{self.key(images)}.bad.json"
        bad = _read_bad_images(known)
        kept = images.drop(set(bad))
        f = cache / f"{self.key(kept)}.pt"
        if bad and kept.paths and f.is_file():  # these files were checked: the bad ones again
            still = find_bad_images(sorted(bad))
            feats = torch.load(f, map_location="cpu", weights_only=True)
            if set(still) == set(bad) and feats.shape[0] == len(kept):
                info = {"cache": "hit", "file": str(f), "seconds": time.perf_counter() - t0}
                self._extracted[role] = (kept, feats, info)
                if self.progress is not None:
                    self.progress(f"{what}: read from the cache in {info['seconds']:.1f} s")
                return still
        if self.progress is not None:
            self.progress(f"{what} ...")
        reasons: list[str] = []
        used: dict[str, Any] = {}
        feats = extract_features(
            self.backbone.module,
            DecodeChecked(self.domain(images)),
            self.cfg.extract_batch_size,
            self.device,
            reasons,
            f"extracting features of the {role} domain {images.name!r}",
            cache_dir=cache,
            record=used,
        )
        bad = {p: r for p, r in zip(images.paths, reasons, strict=True) if r}
        kept = images
        if bad:
            kept = images.drop(set(bad))
            feats = feats[[i for i, r in enumerate(reasons) if not r]]
            write_json(known, {str(p): r for p, r in bad.items()})  # atomic, per process
        saved = save_cached_features(cache, self.key(kept), feats) if kept.paths else None
        info = {"cache": "miss", "file": str(saved), "seconds": time.perf_counter() - t0, **used}
        self._extracted[role] = (kept, feats, info)
        if self.progress is not None:
            self.progress(f"{what}: extracted in {info['seconds']:.1f} s{engine_note(info)}")
        return bad

    def take(self, role: str, images: ImageList) -> tuple[Any, dict[str, Any]] | None:
        """The features :meth:`extract` made of ``role`` for ``images`` (its readable images
        less any dropped since, then cached under their key) and their cache info, once;
        ``None`` when it extracted none."""
        if role not in self._extracted:
            return None
        done, feats, info = self._extracted.pop(role)
        if done.paths != images.paths:  # images dropped in another domain: keep their rows
            row = {p: i for i, p in enumerate(done.paths)}
            feats = feats[[row[p] for p in images.paths]]
            info["file"] = str(save_cached_features(self.cfg.cache_dir, self.key(images), feats))
        return feats, info


def engine_note(info: dict[str, Any]) -> str:
    """`` (onnxruntime, 2 threads)``: the engine and thread count of an extraction's record, or
    ``""`` (a cache hit).

    >>> engine_note({"engine": "torch", "threads": 1})
    ' (torch, 1 thread)'
    """
    if "engine" not in info:
        return ""
    n = int(info.get("threads", 1))
    return f" ({info['engine']}, {n} thread{'s' if n != 1 else ''})"


def _read_bad_images(f: Path) -> dict[Path, str]:
    """The bad images :meth:`FeatureCheck.extract` recorded in ``f`` (``{}``: none, or no
    readable record)."""
    try:
        return {Path(p): str(r) for p, r in json.loads(f.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def cached_feature_domains(
    cfg: ImageListData,
    model: ModelConfig | None,
    device: str = "cpu",
    progress: Callable[[str], None] | None = None,
) -> FeatureCheck | None:
    """For a frozen backbone: its :class:`FeatureCheck` (``check(role, images)``: whether the
    feature cache holds that domain's features, so its images need no decoding check;
    ``check.extract``: the decode check by the extraction); ``None`` otherwise."""
    if model is None or not model.freeze_backbone:
        return None
    return FeatureCheck(cfg, model, device, progress)


def image_domains(
    cfg: ImageListData,
    model: ModelConfig | None,
    lists: dict[str, ImageList],
    device: str = "cpu",
    progress: Callable[[str], None] | None = None,
    check: FeatureCheck | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The domain of every checked image list (``{role: ImageList}``): image datasets, or
    (``model.freeze_backbone``) in-memory features extracted once and cached. ``progress``
    gets a plain line before and after each domain's extraction, naming it. ``check``: the
    :class:`FeatureCheck` that checked the lists; the features its extraction made are used,
    not extracted again. Returns the domains by role and notes (feature cache hits/misses)."""
    model = model if model is not None else ModelConfig(name="backbone")
    spec = transform_spec(cfg)
    norm = backbone_normalization(model, cfg.transforms.normalization)
    notes: dict[str, Any] = {}
    domains: dict[str, Any] = {}
    if model.freeze_backbone:
        fc = check if check is not None else FeatureCheck(cfg, model, device)
        bb = fc.backbone
        notes["features"] = {"backbone": fc.model_id, "weights": bb.weights_id, "view": "test"}
        for role, il in lists.items():
            ds = fc.domain(il)
            taken = fc.take(role, il)  # extracted (and checked) already
            if taken is None:
                what = fc.describe(role, il)
                if progress is not None:
                    progress(f"{what} ...")
                feats, info = cached_features(
                    cfg.cache_dir,
                    fc.key(il),
                    bb.module,
                    ds,
                    cfg.extract_batch_size,
                    fc.device,
                    f"extracting features of the {role} domain {il.name!r}",
                )
                if progress is not None:
                    how = "read from the cache" if info["cache"] == "hit" else "extracted"
                    progress(f"{what}: {how} in {info['seconds']:.1f} s{engine_note(info)}")
            else:
                feats, info = taken
            notes["features"][role] = info
            domains[role] = TensorDomain(il.name, feats, ds.y, list(il.classes))
    else:
        views = {
            v: build_transform(v, spec, norm)
            for v in ("train", "test", "score", "strong", "anchor")
        }
        # the unlabeled-target training stream (data.transforms.unlabeled_view)
        unl = cfg.transforms.unlabeled_view
        views["unlabeled"] = views["train"] if unl == "train" else build_transform(unl, spec, norm)
        kinds = view_kinds(cfg)
        dev = torch.device(
            "cuda"
            if device == "cuda" or (device == "auto" and torch.cuda.is_available())
            else "cpu"
        )
        for role, il in lists.items():
            d = ImageDomain(
                il, views, (3, spec.crop, spec.crop), cfg.workers, "train",
                cfg.persistent_workers, cfg.prefetch,
            )  # fmt: skip
            d.kinds, d.spec, d.norm, d.device = kinds, spec, norm, dev
            domains[role] = d
        bases = [base_of(k, spec) for k in kinds.values()]
        plans = (
            [plan_cache(f"{r} {il.name!r}", il.paths, spec, bases) for r, il in lists.items()]
            if cfg.decode_cache_mb > 0
            else []
        )
        caches = decode_caches(
            plans, cfg.decode_cache_dir,
            cfg.decode_cache_mb, max(1, cfg.workers), progress or _say,
        )  # fmt: skip
        notes["decode_cache"] = "off" if caches is None else str(cfg.decode_cache_dir)
        for role, c in zip(lists, caches or [], strict=False):
            domains[role].decode_cache = c
    return domains, notes


def view_kinds(cfg: ImageListData) -> dict[str, View]:
    """The kind of each view a fine-tuning domain is read through (``unlabeled``:
    ``data.transforms.unlabeled_view``)."""
    return {"train": "train", "test": "test", "score": "score",
            "unlabeled": cfg.transforms.unlabeled_view}  # fmt: skip


class DecodeCheck:
    """Fine-tuning's data check through the decode cache (``data.decode_cache_mb`` on), so
    each image is decoded ONCE, by the check that fills the cache:

    ``check(role, images)``: whether a complete cache of those images (same paths, sizes,
    modification times) exists; every image decoded fine when it was filled, so a later run
    (seed, method) decodes none of them. :meth:`extract` is the decoding check of a domain that
    has none: it fills the cache (its size stated first) and returns the missing or unreadable
    images; a domain whose cache would not fit is checked without it.
    """

    def __init__(self, cfg: ImageListData, say: Callable[[str], None] | None = None) -> None:
        self.cfg = cfg
        self.spec = transform_spec(cfg)
        self.bases = [base_of(k, self.spec) for k in view_kinds(cfg).values()]
        self.say = say or _say
        self.filled = 0  # bytes of the caches this check filled

    @classmethod
    def of(cls, cfg: ImageListData, model: ModelConfig | None) -> DecodeCheck | None:
        """The check of a fine-tuning config with the cache on, else ``None``."""
        if (model is not None and model.freeze_backbone) or cfg.decode_cache_mb <= 0:
            return None
        return cls(cfg)

    def __call__(self, role: str, images: ImageList) -> bool:
        try:
            plan = plan_cache(role, images.paths, self.spec, self.bases)
        except OSError:  # a missing or unreadable header: the check decodes and reports it
            return False
        return cache_complete(plan, self.cfg.decode_cache_dir)

    def extract(self, role: str, images: ImageList) -> dict[Path, str]:
        """The missing or unreadable images of ``images``, found by filling its cache."""
        try:
            plan = plan_cache(f"{role} {images.name!r}", images.paths, self.spec, self.bases)
        except OSError:
            return find_bad_images(images.paths)
        folder = self.cfg.decode_cache_dir
        total = self.filled + plan.nbytes
        if not_fitting(total, plan.nbytes, folder, self.cfg.decode_cache_mb) is not None:
            return find_bad_images(images.paths)  # the run states why, without a cache
        self.say(
            f"decode cache: {plan.name} {len(plan.paths)} images {mib(plan.nbytes)}, decoded "
            f"once into {folder} by the data check"
        )
        bad: dict[Path, str] = {}
        fill_cache(plan, folder, max(1, self.cfg.workers), bad=bad)
        self.filled = total if not bad else self.filled
        return bad


def _say(message: str) -> None:
    """A plain line on stderr (where no progress callback is given)."""
    import sys

    print(message, file=sys.stderr, flush=True)


def load_feature_task(cfg: FeatureData) -> Task:
    """In-memory domains from feature-matrix files."""
    files = {"source": (cfg.source, cfg.source_labels), "target": (cfg.target, cfg.target_labels)}
    if cfg.heldout is not None:
        files["heldout"] = (cfg.heldout, cfg.heldout_labels)
    raw = {
        role: read_feature_file(f, lab, cfg.features_key, cfg.labels_key)
        for role, (f, lab) in files.items()
    }
    doms = feature_domains(raw, cfg.classes, cfg.normalize)
    names = {"source": cfg.source.stem, "target": cfg.target.stem}
    for role, d in doms.items():
        d.name = names.get(role, f"{cfg.target.stem}-heldout")
    return Task(doms["source"], doms["target"], doms.get("heldout"))
