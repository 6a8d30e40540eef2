"""Tasks from image data (fine-tuning or frozen-backbone features) and from feature matrices.

Called by :func:`eada.data.tasks.load_task` for ``data.kind: images`` and ``features``. Every
check runs before any training: class maps, label ids, empty domains, and every image decoded
once; all unreadable or missing images are reported together, and the run stops unless
``skip_bad_images: true``, in which case they are dropped and listed in ``Task.notes``
(written into the run's record).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from eada.config import FeatureData, ImageListData, ModelConfig
from eada.data.base import Task, TensorDomain
from eada.data.features import cache_key, cached_features, feature_domains, read_feature_file
from eada.data.images import (
    ImageDataError,
    ImageDomain,
    ImageList,
    check_domain,
    check_pair,
    find_bad_images,
    load_image_list,
)
from eada.data.transforms import (
    Normalization,
    TransformSpec,
    build_transform,
    normalization_for,
    transform_key,
)


def transform_spec(cfg: ImageListData) -> TransformSpec:
    """The :class:`TransformSpec` of a data config."""
    t = cfg.transforms
    return TransformSpec(t.resize, t.crop, t.test_resize, t.jitter, t.hflip, t.scoring_view)


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
    cfg: ImageListData, decoded: Callable[[str, ImageList], bool] | None = None
) -> tuple[dict[str, ImageList], dict[str, str]]:
    """The source/target/heldout image lists after every check; returns them and the skipped
    images (``{path: reason}``, empty unless ``skip_bad_images``).

    ``decoded(role, images)`` says that a domain's images need no decoding check: they were
    all decoded when its cached features were extracted (the cache key covers every path,
    size and modification time), so a re-run does not decode every image again
    (:func:`cached_feature_domains`).

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
    lists, bad = drop_bad_images(lists, cfg.skip_bad_images, decoded)
    if bad:
        for role in ("source", "target"):
            if not lists[role].paths:
                raise ImageDataError(f"{role}: no readable images left after skipping")
    return lists, {str(p): r for p, r in sorted(bad.items())}


def drop_bad_images(
    lists: dict[str, ImageList],
    skip: bool,
    decoded: Callable[[str, ImageList], bool] | None = None,
) -> tuple[dict[str, ImageList], dict[Path, str]]:
    """Decode every image of ``lists`` (but the domains ``decoded(role, images)`` vouches
    for) and return the lists without the missing/unreadable ones, and those (``{path:
    reason}``).

    Raises:
        ImageDataError: any missing/unreadable image unless ``skip``
            (``data.skip_bad_images``), every one listed.
    """
    paths = sorted(
        {p for r, il in lists.items() if decoded is None or not decoded(r, il) for p in il.paths}
    )
    bad = find_bad_images(paths)
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
    lists, skipped = checked_image_lists(cfg, cached_feature_domains(cfg, model))
    domains, notes = image_domains(cfg, model, lists, device)
    notes = {"skipped_images": skipped, **notes}
    return Task(domains["source"], domains["target"], domains.get("heldout"), notes)


def cached_feature_domains(
    cfg: ImageListData, model: ModelConfig | None
) -> Callable[[str, ImageList], bool] | None:
    """For a frozen backbone: ``(role, images) -> bool``, whether the feature cache holds that
    domain's features (then its images need no decoding check); ``None`` otherwise."""
    if model is None or not model.freeze_backbone:
        return None
    from eada.models.backbones import build_backbone

    bb = build_backbone(model.backbone, model.weights, model.factory, cfg.transforms.normalization)
    tkey = transform_key("test", transform_spec(cfg), bb.normalization)
    model_id = model.factory or model.backbone

    def cached(role: str, il: ImageList) -> bool:
        key = cache_key(model_id, bb.weights_id, tkey, il.paths)
        return (cfg.cache_dir / f"{key}.pt").is_file()

    return cached


def image_domains(
    cfg: ImageListData,
    model: ModelConfig | None,
    lists: dict[str, ImageList],
    device: str = "cpu",
    progress: Callable[[str], None] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The domain of every checked image list (``{role: ImageList}``): image datasets, or
    (``model.freeze_backbone``) in-memory features extracted once and cached. ``progress``
    gets a plain line before and after each domain's extraction, naming it. Returns the
    domains by role and notes (feature cache hits/misses)."""
    import torch

    model = model if model is not None else ModelConfig(name="backbone")
    spec = transform_spec(cfg)
    norm = backbone_normalization(model, cfg.transforms.normalization)
    notes: dict[str, Any] = {}
    domains: dict[str, Any] = {}
    if model.freeze_backbone:
        from eada.models.backbones import build_backbone

        bb = build_backbone(
            model.backbone, model.weights, model.factory, cfg.transforms.normalization
        )
        tfm = build_transform("test", spec, bb.normalization)
        tkey = transform_key("test", spec, bb.normalization)
        model_id = model.factory or model.backbone
        dev = "cuda" if device == "auto" and torch.cuda.is_available() else device
        dev = "cpu" if dev == "auto" else dev
        notes["features"] = {"backbone": model_id, "weights": bb.weights_id, "view": "test"}
        for role, il in lists.items():
            ds = ImageDomain(il, {"test": tfm}, (3, spec.crop, spec.crop), cfg.workers, "test")
            key = cache_key(model_id, bb.weights_id, tkey, il.paths)
            what = f"{model_id} features of the {role} domain {il.name!r} ({len(il)} images)"
            if progress is not None:
                progress(f"{what} ...")
            feats, info = cached_features(
                cfg.cache_dir, key, bb.module, ds, cfg.extract_batch_size, dev
            )
            if progress is not None:
                how = "read from the cache" if info["cache"] == "hit" else "extracted"
                progress(f"{what}: {how} in {info['seconds']:.1f} s")
            notes["features"][role] = info
            domains[role] = TensorDomain(il.name, feats, ds.y, list(il.classes))
    else:
        views = {v: build_transform(v, spec, norm) for v in ("train", "test", "score")}
        # the unlabeled-target training stream (data.transforms.unlabeled_view)
        unl = cfg.transforms.unlabeled_view
        views["unlabeled"] = views["train"] if unl == "train" else build_transform(unl, spec, norm)
        for role, il in lists.items():
            domains[role] = ImageDomain(il, views, (3, spec.crop, spec.crop), cfg.workers)
    return domains, notes


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
