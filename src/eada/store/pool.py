"""A growing pool: ``eada target scan`` registers the files added to an unlabeled image
target (a flat folder or a path list) since it was registered, and leaves out the ones that
vanished.

* **New files** get new sample ids after every registered one (positions appended), so every
  id, label, round and export stays valid. For a frozen backbone their features are extracted
  and joined to the registered files' cached features: only the new images are decoded.
* **Vanished files** are reported and left out of the pool (their sample row, labels and
  rounds stay in the store as history; the sample takes a negative position, which no domain
  holds). A file that comes back gets its old sample id again.
* Once the pool has changed, the project loads its target from the registered files in
  position order (:meth:`eada.store.base.ProjectBase.registered_pool`), not from the folder:
  files added later do not move any sample. ``eada train`` and ``eada query`` name the
  command when the folder holds files the store has not registered, and refuse to run on
  vanished files until the scan left them out.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eada.config import ImageListData
from eada.store.config import FolderData
from eada.store.data import confine, content_hash
from eada.store.db import StoreError, how, now
from eada.store.targets import _flat_images, read_path_list

Progress = Callable[[str], None] | None


@dataclass
class PoolChanges:
    """The target files now listed vs. the registered ones (absolute, resolved paths)."""

    new: list[Path] = field(default_factory=list)
    vanished: list[Path] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.new or self.vanished)


def target_listing(project: Any) -> list[Path] | None:
    """The files an unlabeled image target's folder or list names now (resolved, in listing
    order); ``None`` for a target this module does not handle (labeled, feature rows, toy
    or digits data)."""
    data: Any = project.cfg.data
    if project.target_labeled or not isinstance(data, FolderData | ImageListData):
        return None
    spec = Path(data.target)
    root = getattr(data, "root", None)
    if spec.is_dir():
        return _flat_images(spec)
    if not spec.is_file():
        raise FileNotFoundError(f"target not found: {spec} (the project's data.target)")
    paths, _ = read_path_list(spec, Path(root) if root is not None else None)
    return [p.resolve() for p in paths]


def pool_changes(project: Any) -> PoolChanges | None:
    """New and vanished target files since they were registered (``None``: a target that
    cannot grow this way, see :func:`target_listing`)."""
    listing = target_listing(project)
    if listing is None:
        return None
    registered = [Path(r["path"]) for r in project.store.samples("target")]
    known = set(registered)
    return PoolChanges(
        new=[p for p in dict.fromkeys(listing) if p not in known],
        vanished=[p for p in registered if not p.is_file()],
    )


def changes_note(project: Any) -> str | None:
    """One line naming the command when the target folder/list changed, else ``None``."""
    ch = pool_changes(project)
    if not ch:
        return None
    assert ch is not None
    parts = []
    if ch.new:
        parts.append(f"{len(ch.new)} new target file(s) not registered (first: {ch.new[0]})")
    if ch.vanished:
        parts.append(f"{len(ch.vanished)} registered file(s) vanished (first: {ch.vanished[0]})")
    run = how(f"eada target scan --store {project.folder}", "project.scan_target()")
    return f"{'; '.join(parts)}: run {run}"


def scan_target(project: Any, progress: Progress = None) -> dict[str, Any]:
    """Register the new files of the project's unlabeled image target, extract features for
    them only (frozen backbone), and leave out the files that vanished; one transaction.

    Returns:
        ``new`` (files registered), ``vanished`` (files left out), ``returned`` (vanished
        files that came back, with their old ids), ``bad`` (new files that are not readable
        images, not registered), ``extracted`` (images whose features were extracted),
        ``n_target`` (the pool's size now).

    Raises:
        StoreError: the target is labeled or not image files, or a training segment was
            interrupted (finish it with ``eada train`` first).
    """
    store = project.store
    store.check_writable()
    if target_listing(project) is None:
        raise StoreError(
            f"the project at {project.folder} has a "
            f"{'labeled' if project.target_labeled else 'non-file'} target: `eada target scan` "
            "grows an unlabeled image target (a flat folder or a path list)"
        )
    ck = store.latest_checkpoint()
    if ck is not None and ck["kind"] == "epoch":
        raise StoreError(
            "a training segment was interrupted: finish it with "
            f"{how(f'eada train --store {project.folder}', 'project.train()')} before scanning "
            "the target"
        )
    ch = pool_changes(project)
    assert ch is not None
    rows = store.samples("target")
    gone = set(ch.vanished)
    kept = [Path(r["path"]) for r in rows if Path(r["path"]) not in gone]
    old_ids = {
        Path(r["path"]): r["id"]
        for r in store.conn.execute(
            "SELECT id, path FROM samples WHERE role = 'target' AND position < 0"
        )
    }
    roots = store.roots()
    problems = []
    for p in ch.new:
        try:
            confine(p, roots)
        except ValueError as err:
            problems.append(str(err))
    if problems:
        raise StoreError(
            f"{len(problems)} new target file(s) lie outside the data roots of {project.folder}: "
            + "; ".join(problems[:5])
        )
    bad: dict[Path, str] = {}
    extracted = 0
    new = list(ch.new)
    data: Any = project.cfg.data
    frozen = isinstance(data, ImageListData) and project.cfg.model.freeze_backbone
    if (new or gone) and frozen:  # the pool's features: cached rows + the new ones
        bad, extracted = _extend_feature_cache(project, data, rows, kept, new, gone, progress)
        new = [p for p in new if p not in bad]
    elif new:
        from eada.store.data import decode_image

        for p in new:  # what the loader will decode: refuse unreadable files up front
            try:
                decode_image(p, 8, 3)
            except ValueError as err:
                bad[p] = str(err)
        new = [p for p in new if p not in bad]
    domain = rows[0]["domain"] if rows else Path(str(data.target)).stem
    returned = [p for p in new if p in old_ids]
    with store.transaction() as c:
        # positions: the kept files in their order, then the new ones; vanished: -id
        c.execute(
            "UPDATE samples SET position = -id - 1000000000 WHERE role = 'target' AND position >= 0"
        )
        ids = {Path(r["path"]): r["id"] for r in rows}
        for pos, p in enumerate(kept):
            c.execute("UPDATE samples SET position = ? WHERE id = ?", (pos, ids[p]))
        for p in gone:
            c.execute("UPDATE samples SET position = -id WHERE id = ?", (ids[p],))
        for pos, p in enumerate(new, start=len(kept)):
            if p in old_ids:
                c.execute(
                    "UPDATE samples SET position = ?, content_hash = ? WHERE id = ?",
                    (pos, content_hash(p.read_bytes()), old_ids[p]),
                )
            else:
                c.execute(
                    "INSERT INTO samples (role, domain, position, path, content_hash) "
                    "VALUES ('target', ?, ?, ?, ?)",
                    (domain, pos, str(p), content_hash(p.read_bytes())),
                )
        log = store.get_json("target_scans") or []
        log.append(
            {
                "time": now(),
                "new": len(new) - len(returned),
                "returned": len(returned),
                "vanished": len(gone),
                "bad": len(bad),
                "extracted": extracted,
            }
        )
        store.set_meta("target_scans", json.dumps(log))
        store.set_meta("pool_scanned", "1")
    project._task = None  # the domains are loaded again from the registered files
    return {
        "new": [str(p) for p in new if p not in old_ids],
        "returned": [str(p) for p in returned],
        "vanished": [str(p) for p in sorted(gone)],
        "bad": {str(p): r for p, r in bad.items()},
        "extracted": extracted,
        "n_target": len(kept) + len(new),
    }


def _extend_feature_cache(
    project: Any,
    data: ImageListData,
    rows: list[Any],
    kept: list[Path],
    new: list[Path],
    gone: set[Path],
    progress: Progress,
) -> tuple[dict[Path, str], int]:
    """Extract the features of the ``new`` images only and cache the features of the pool
    after the scan (``kept`` then the readable new ones) under its key, from the cached
    features of the registered files. Returns the unreadable new images and how many images
    were extracted (all kept ones too when the cache no longer holds theirs)."""
    import torch

    from eada.data.features import save_cached_features
    from eada.data.image_tasks import FeatureCheck
    from eada.data.images import ImageList

    fc = FeatureCheck(data, project.cfg.model, project.cfg.device, progress)
    classes = list(project.classes)
    name = rows[0]["domain"] if rows else "target"

    def images(paths: list[Path]) -> ImageList:
        return ImageList(name, paths, [0] * len(paths), classes)

    cached: Any = None
    record = project.store.get_json("target_features") or {}
    registered = [Path(r["path"]) for r in rows]
    if not gone:
        f = data.cache_dir / f"{fc.key(images(registered))}.pt"
        if f.is_file():
            cached = torch.load(f, map_location="cpu", weights_only=True)
    elif record.get("paths") == [str(p) for p in registered] and Path(record["file"]).is_file():
        cached = torch.load(record["file"], map_location="cpu", weights_only=True)
    extracted = 0
    if cached is None or cached.shape[0] != len(registered):
        if progress is not None:
            progress(f"the feature cache holds no features of the {len(kept)} registered files")
        bad_kept = fc.extract("target", images(kept))
        if bad_kept:
            raise StoreError(
                f"{len(bad_kept)} registered target files are no longer readable images "
                f"(first: {next(iter(bad_kept))})"
            )
        taken = fc.take("target", images(kept))
        assert taken is not None
        kept_feats = taken[0]
        extracted += len(kept)
    else:
        row = {p: i for i, p in enumerate(registered)}
        kept_feats = cached[[row[p] for p in kept]]
    bad = fc.extract("target", images(new)) if new else {}
    good = [p for p in new if p not in bad]
    extracted += len(new)
    parts = [kept_feats]
    if good:
        taken = fc.take("target", images(good))
        assert taken is not None
        parts.append(taken[0])
    pool = [*kept, *good]
    f = save_cached_features(data.cache_dir, fc.key(images(pool)), torch.cat(parts))
    with project.store.transaction():
        project.store.set_meta(
            "target_features", json.dumps({"file": str(f), "paths": [str(p) for p in pool]})
        )
    return bad, extracted
