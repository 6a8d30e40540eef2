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

A **feature-row target** (an unlabeled ``data.kind: features`` file) grows the same way, by
rows (:func:`scan_rows`): a row is known by its id (the file's ``ids`` array or ``id`` column)
or, in a file without ids, by its row number (rows may then only be appended). Rows with new
ids become new samples; registered ids missing from the file are left out like vanished files;
a registered id whose row changed, or a repeated id, is refused naming it. The per-domain
statistics of ``zscore``/``l1_zscore`` are frozen at ``eada init`` (meta
``target_statistics``): the new rows are normalised with the registered rows' statistics, so
no registered row ever changes.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from eada.config import FeatureData, ImageListData
from eada.store.config import FolderData
from eada.store.data import confine, content_hash
from eada.store.db import StoreError, how, now, q
from eada.store.roots import name_problem, shown_name
from eada.store.targets import (
    SampleInfo,
    TargetRows,
    _flat_images,
    read_path_list,
    read_unlabeled_features,
    record_sample_info,
    sample_info,
)

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


def _links_to(project: Any) -> dict[Path, Path]:
    """``{where a link resolves: the link}`` for the symbolic links in an unlabeled image
    target's folder (so that a scan names the link, not only the file it points at)."""
    spec = Path(project.cfg.data.target)
    if not spec.is_dir():
        return {}
    out: dict[Path, Path] = {}
    for p in spec.rglob("*"):
        if p.is_symlink():
            try:
                out.setdefault(p.resolve(), p)
            except OSError:
                continue
    return out


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
    """One line naming the command when the target folder/list (or the target's feature
    file: rows with new ids, registered ids gone) changed, else ``None``."""
    run = how(f"eada target scan --store {q(project.folder)}", "project.scan_target()")
    rows = row_changes(project)
    if rows is not None:
        if not rows:
            return None
        file, what = project.cfg.data.target, "id" if rows.by_id else "row"
        parts = []
        if rows.new:
            parts.append(
                f"{len(rows.new)} new target row(s) in {file} not registered "
                f"(first {what}: {rows.new[0]})"
            )
        if rows.vanished:
            parts.append(
                f"{len(rows.vanished)} registered row(s) vanished from {file} "
                f"(first {what}: {rows.vanished[0]})"
            )
        return f"{'; '.join(parts)}: run {run}"
    ch = pool_changes(project)
    if not ch:
        return None
    assert ch is not None
    parts = []
    if ch.new:
        parts.append(f"{len(ch.new)} new target file(s) not registered (first: {ch.new[0]})")
    if ch.vanished:
        parts.append(f"{len(ch.vanished)} registered file(s) vanished (first: {ch.vanished[0]})")
    return f"{'; '.join(parts)}: run {run}"


def scan_target(project: Any, progress: Progress = None) -> dict[str, Any]:
    """Register the new files of the project's unlabeled image target, extract features for
    them only (frozen backbone), and leave out the files that vanished; one transaction. A
    feature-row target is scanned by :func:`scan_rows` (its return value).

    Returns:
        ``new`` (files registered), ``vanished`` (files left out), ``returned`` (vanished
        files that came back, with their old ids), ``bad`` (new files that are not readable
        images, not registered), ``extracted`` (images whose features were extracted),
        ``n_target`` (the pool's size now).

    Raises:
        StoreError: the target is labeled or neither image files nor feature rows, or a
            training segment was interrupted (finish it with ``eada train`` first).
    """
    store = project.store
    store.check_writable()
    if target_listing(project) is None and _feature_target(project) is None:
        raise StoreError(
            f"the project at {project.folder} has a "
            f"{'labeled' if project.target_labeled else 'non-file'} target: `eada target scan` "
            "grows an unlabeled target: image files (a flat folder or a path list) or feature "
            "rows (a features file)"
        )
    _check_not_interrupted(project)
    if _feature_target(project) is not None:
        return scan_rows(project)
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
    outside: dict[Path, str] = {}
    links = _links_to(project)
    for p in ch.new:
        try:
            confine(p, roots)
        except ValueError as err:
            link = links.get(p)
            outside[p] = (
                f"{link} is a link to {p}, outside the data roots: not registered"
                if link is not None
                else f"{err}: not registered"
            )
    for p in ch.new:  # a name the store cannot record as text: named readably, left out
        why = name_problem(p)
        if why is not None:
            outside[p] = f"{shown_name(p)}: its name {why}: not registered (rename it)"
    bad: dict[Path, str] = {}
    extracted = 0
    new = [p for p in ch.new if p not in outside]  # the good new files are registered anyway
    data: Any = project.cfg.data
    frozen = isinstance(data, ImageListData) and project.cfg.model.freeze_backbone
    if (new or gone) and frozen:  # the pool's features: cached rows + the new ones
        bad, extracted = _extend_feature_cache(project, data, rows, kept, new, gone, progress)
        new = [p for p in new if p not in bad]
    elif new:
        from eada.store.data import check_image

        for p in new:  # what the loader will decode: refuse unreadable files up front
            try:
                check_image(p)
            except ValueError as err:
                bad[p] = str(err)
        new = [p for p in new if p not in bad]
    bad = {**outside, **bad}
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


def _check_not_interrupted(project: Any) -> None:
    ck = project.store.latest_checkpoint()
    if ck is not None and ck["kind"] == "epoch":
        raise StoreError(
            "a training segment was interrupted: finish it with "
            f"{how(f'eada train --store {q(project.folder)}', 'project.train()')} before scanning "
            "the target"
        )


# -- feature rows ---------------------------------------------------------------------------
@dataclass
class RowChanges:
    """The rows a feature-row target's file holds now vs. the registered ones, by row key:
    the row's id (``by_id``) or, in a file without ids, its row number as text."""

    by_id: bool
    new: list[str] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.new or self.vanished)


@dataclass
class _Registered:
    """Every registered target row (left-out ones included): sample id, position, key and
    content hash, plus how rows are known (``by_id``)."""

    by_id: bool
    rows: list[sqlite3.Row]
    keys: dict[int, str]

    def active(self) -> list[sqlite3.Row]:
        return sorted((r for r in self.rows if r["position"] >= 0), key=lambda r: r["position"])


def _feature_target(project: Any) -> FeatureData | None:
    data: Any = project.cfg.data
    if project.target_labeled or not isinstance(data, FeatureData):
        return None
    return data


def _registered(project: Any) -> _Registered:
    conn = project.store.conn
    rows = list(
        conn.execute(
            "SELECT id, position, content_hash FROM samples WHERE role = 'target' ORDER BY id"
        )
    )
    given = {sid: ext for sid, (ext, _) in sample_info(conn).items()}
    by_id = any(given.get(r["id"]) is not None for r in rows)
    if not by_id:  # rows are known by their number: the file only ever grew at its end
        return _Registered(False, rows, {r["id"]: str(r["position"]) for r in rows})
    missing = [r["id"] for r in rows if given.get(r["id"]) is None]
    if missing:
        raise StoreError(
            f"{len(missing)} target sample(s) of {project.folder} were registered without an id "
            f"(first: sample {missing[0]}) while others have one: rows cannot be matched to "
            "the features file; start a new project from a file whose rows all have ids"
        )
    return _Registered(True, rows, {r["id"]: str(given[r["id"]]) for r in rows})


def _read_rows(data: FeatureData, reg: _Registered) -> tuple[np.ndarray, SampleInfo, list[str]]:
    """The target file's raw rows, ids/paths, and the key of every row."""
    file = Path(data.target)
    x, info = read_unlabeled_features(file, data.features_key)
    if reg.by_id:
        if not info.ids:
            raise StoreError(
                f"{file} has no ids now, but its rows were registered by their ids: keep the "
                "ids array (or id column) in the file"
            )
        blank = [i for i, k in enumerate(info.ids) if k is None]
        if blank:
            raise StoreError(f"{file}: {len(blank)} row(s) without an id (first: row {blank[0]})")
        return x, info, [str(k) for k in info.ids]
    if info.ids:
        raise StoreError(
            f"{file} has ids now, but its rows were registered by their row numbers (the file "
            "had no ids): rows can only be appended to it; to work with ids, start a new project"
        )
    if len(x) < len(reg.rows):
        raise StoreError(
            f"{file} has {len(x)} rows but {len(reg.rows)} were registered: a features file "
            "without ids may only gain rows at its end (give its rows an ids array to leave "
            "some out, in a new project)"
        )
    return x, info, [str(i) for i in range(len(x))]


def _frozen_statistics(
    project: Any, data: FeatureData, x: np.ndarray, where: dict[str, int], reg: _Registered
) -> dict[str, Any]:
    """The target's frozen statistics: recorded at ``eada init`` (or by the first scan of a
    store made before they were recorded: then those of the registered rows, as at init)."""
    from eada.data.features import domain_statistics

    recorded = project.store.get_json("target_statistics")
    if recorded is not None:
        width = len(recorded.get("mean", ())) or None
        if width is not None and x.shape[1] != width:
            raise StoreError(
                f"{data.target} has {x.shape[1]} feature columns but its rows were registered "
                f"with {width}: new rows must have the registered rows' columns"
            )
        return dict(recorded)
    if any(r["position"] < 0 for r in reg.rows) or any(
        reg.keys[r["id"]] not in where for r in reg.active()
    ):
        raise StoreError(
            f"the target statistics of {project.folder} were never recorded and registered "
            f"rows are missing from {data.target}, so they cannot be recomputed: restore the "
            "file's registered rows and scan again, or start a new project"
        )
    active = reg.active()
    rows = x[[where[reg.keys[r["id"]]] for r in active]]
    want = [r["content_hash"] for r in active]
    # a column mean's last bits depend on the memory layout init read the file in (row- or
    # column-major, which the file may no longer have): take the one that reproduces the
    # registered rows
    found = [domain_statistics(a, data.normalize) for a in (rows, np.asfortranarray(rows))]
    return next((st for st in found if _row_hashes(rows, data, st) == want), found[0])


def row_changes(project: Any) -> RowChanges | None:
    """New and vanished rows of an unlabeled feature-row target since they were registered
    (``None``: not such a target)."""
    data = _feature_target(project)
    if data is None:
        return None
    reg = _registered(project)
    _, _, keys = _read_rows(data, reg)
    in_file = set(keys)
    active = {reg.keys[r["id"]] for r in reg.active()}
    return RowChanges(
        reg.by_id,
        new=[k for k in keys if k not in active],
        vanished=[reg.keys[r["id"]] for r in reg.active() if reg.keys[r["id"]] not in in_file],
    )


def registered_rows(project: Any) -> TargetRows | None:
    """The registered rows of an unlabeled feature-row target in position order with their
    frozen statistics (rows added to the file later are not among them until a scan); ``None``
    for any other target.

    Raises:
        StoreError: registered rows vanished from the file, naming ``eada target scan``.
    """
    data = _feature_target(project)
    if data is None:
        return None
    reg = _registered(project)
    x, info, keys = _read_rows(data, reg)
    where = {k: i for i, k in enumerate(keys)}
    gone = [reg.keys[r["id"]] for r in reg.active() if reg.keys[r["id"]] not in where]
    if gone:
        raise StoreError(
            f"{len(gone)} registered target row(s) vanished from {data.target} (first "
            f"{'id' if reg.by_id else 'row'}: {gone[0]}): leave them out of the pool with "
            + how(f"eada target scan --store {q(project.folder)}", "project.scan_target()")
        )
    stats = _frozen_statistics(project, data, x, where, reg)
    take = [where[reg.keys[r["id"]]] for r in reg.active()]
    return TargetRows(x[take], _pick_info(info, take), stats)


def _pick_info(info: SampleInfo, take: list[int]) -> SampleInfo:
    return SampleInfo(
        [info.ids[i] for i in take] if info.ids else [],
        [info.paths[i] for i in take] if info.paths else [],
    )


def _row_hashes(x: np.ndarray, data: FeatureData, stats: dict[str, Any]) -> list[str]:
    """The content hash of each row as the store registers it: its model-ready (normalised,
    float32) values (:func:`eada.store.data.row_hashes`)."""
    from eada.data.features import normalize_features

    xn = np.ascontiguousarray(normalize_features(x, data.normalize, stats).astype(np.float32))
    return [content_hash(xn[i].tobytes()) for i in range(len(xn))]


def scan_rows(project: Any) -> dict[str, Any]:
    """``eada target scan`` for an unlabeled feature-row target: register the rows with new
    ids (new sample ids after every registered one), leave out the registered ids the file
    no longer holds (a left-out id that comes back gets its old sample id again), and record
    the frozen statistics; one transaction. Nothing is extracted: the rows are the features.

    Returns:
        ``new`` (keys of the rows registered), ``returned``, ``vanished`` (keys), ``bad``
        (always empty), ``extracted`` (0), ``n_target`` and ``unit`` (``"rows"``).

    Raises:
        StoreError: a registered id's row changed (naming the id; a changed row needs a new
            id), the file lost its ids (or gained ids it was registered without), or a file
            without ids lost rows. ValueError: the file repeats an id (naming it).
    """
    store = project.store
    data = _feature_target(project)
    assert data is not None
    reg = _registered(project)
    x, info, keys = _read_rows(data, reg)
    where = {k: i for i, k in enumerate(keys)}
    stats = _frozen_statistics(project, data, x, where, reg)
    active = reg.active()
    active_keys = {reg.keys[r["id"]] for r in active}
    left_out = {reg.keys[r["id"]]: r for r in reg.rows if r["position"] < 0}
    kept = [r for r in active if reg.keys[r["id"]] in where]
    gone = [r for r in active if reg.keys[r["id"]] not in where]
    new_keys = [k for k in keys if k not in active_keys]
    # every registered row the file still holds (and every returning one) must be unchanged
    known = [*kept, *(left_out[k] for k in new_keys if k in left_out)]
    hashes = _row_hashes(x[[where[reg.keys[r["id"]]] for r in known]], data, stats)
    changed = [
        reg.keys[r["id"]] for r, h in zip(known, hashes, strict=True) if h != r["content_hash"]
    ]
    what = "id" if reg.by_id else "row"
    if changed:
        raise StoreError(
            f"{len(changed)} registered row(s) of {data.target} changed (first {what}: "
            f"{changed[0]!r}): a registered sample never changes; give a changed row a new "
            f"id (the old id then vanishes and is left out); nothing was registered"
        )
    fresh = [k for k in new_keys if k not in left_out]
    fresh_hashes = _row_hashes(x[[where[k] for k in fresh]], data, stats) if fresh else []
    one = store.conn.execute("SELECT domain FROM samples WHERE role = 'target' LIMIT 1").fetchone()
    domain = one[0] if one is not None else Path(data.target).stem
    with store.transaction() as c:
        c.execute(
            "UPDATE samples SET position = -id - 1000000000 WHERE role = 'target' AND position >= 0"
        )
        for pos, r in enumerate(kept):
            c.execute("UPDATE samples SET position = ? WHERE id = ?", (pos, r["id"]))
        for r in gone:
            c.execute("UPDATE samples SET position = -id WHERE id = ?", (r["id"],))
        added: list[int] = []
        for pos, k in enumerate(new_keys, start=len(kept)):
            if k in left_out:
                c.execute("UPDATE samples SET position = ? WHERE id = ?", (pos, left_out[k]["id"]))
                continue
            cur = c.execute(
                "INSERT INTO samples (role, domain, position, path, content_hash) "
                "VALUES ('target', ?, ?, NULL, ?)",
                (domain, pos, fresh_hashes[len(added)]),
            )
            added.append(int(cur.lastrowid or 0))
        record_sample_info(c, added, _pick_info(info, [where[k] for k in fresh]))
        if store.get_meta("target_statistics") is None:
            store.set_meta("target_statistics", json.dumps(stats))
        log = store.get_json("target_scans") or []
        log.append(
            {
                "time": now(),
                "new": len(fresh),
                "returned": len(new_keys) - len(fresh),
                "vanished": len(gone),
                "bad": 0,
                "extracted": 0,
            }
        )
        store.set_meta("target_scans", json.dumps(log))
        store.set_meta("pool_scanned", "1")
    project._task = None  # the domains are loaded again from the registered rows
    return {
        "new": fresh,
        "returned": [k for k in new_keys if k in left_out],
        "vanished": [reg.keys[r["id"]] for r in gone],
        "bad": {},
        "extracted": 0,
        "n_target": len(kept) + len(new_keys),
        "unit": "rows",
    }
