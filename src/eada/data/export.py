"""``eada data features``: write a frozen backbone's features of an image config as feature
files, with a config that trains on them.

One file a domain (``OUT_source.npz``, ``OUT_target.npz``, ``OUT_heldout.npz`` for ``--out
OUT.npz``; the same with ``.parquet``), each holding

* ``features`` ``(N, D)`` float32: the backbone's pooled features, test view (the same numbers
  the frozen-backbone mode caches and trains on: this reuses its extraction and its cache);
* ``labels`` ``(N,)`` int64: class ids (every image of an image list has its label);
* ``paths``: the image files, as the list resolved them;
* ``classes``: the class names (ids index them); ``domain``: the domain's name;
* ``backbone`` / ``weights``: what made the features.

In ``.parquet`` these are the columns ``features`` (a list a row), ``labels``, ``paths`` and
``domain``, the rest schema metadata. ``OUT.yaml`` is a ``data.kind: features`` config on the
files with the image config's optimiser, training and rounds, and the model that matches the
frozen-backbone configs (``linear`` + ``bottleneck_dim: 256``, :data:`FEATURE_MODEL`), so
``eada run OUT.yaml`` trains what the frozen-backbone config trains.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from eada.config import ConfigError, ExperimentConfig, ImageListData
from eada.runs import check_not_store

#: The head the frozen-backbone configs train on the features (and the default model of a
#: ``data.kind: features`` config without a ``model`` section).
FEATURE_MODEL: dict[str, Any] = {"name": "linear", "bottleneck_dim": 256}

FORMATS = (".npz", ".parquet")


def output_paths(out: Path, roles: list[str]) -> dict[str, Path]:
    """``{role: OUT_<role>.<ext>}`` and ``"config": OUT.yaml`` for ``out = OUT.<ext>``."""
    if out.suffix not in FORMATS:
        raise ConfigError(f"--out {out}: use a .npz or .parquet file name")
    paths = {r: out.with_name(f"{out.stem}_{r}{out.suffix}") for r in roles}
    paths["config"] = out.with_suffix(".yaml")
    for p in (out, *paths.values()):
        check_not_store(p)  # never over a project store's files
    return paths


def write_feature_file(
    path: Path,
    features: np.ndarray,
    labels: np.ndarray | None,
    paths: list[str],
    classes: list[str],
    domain: str,
    meta: dict[str, str],
) -> Path:
    """Write one domain's features (see the module docstring) as ``.npz`` or ``.parquet``
    (``labels=None``: an unlabeled domain, written without labels)."""
    features = np.ascontiguousarray(features, dtype=np.float32)
    labeled = {} if labels is None else {"labels": np.asarray(labels, dtype=np.int64)}
    tmp = path.with_name(path.name + ".tmp" + path.suffix)
    if path.suffix == ".npz":
        arrays: dict[str, np.ndarray] = {
            "features": features,
            **labeled,
            "paths": np.array(paths, dtype=str),
            "classes": np.array(classes, dtype=str),
            "domain": np.array(domain),
            **{k: np.array(v) for k, v in meta.items()},
        }
        np.savez(tmp, **arrays)  # type: ignore[arg-type]
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        flat = pa.array(features.reshape(-1))
        col = pa.FixedSizeListArray.from_arrays(flat, features.shape[1])
        table = pa.table(
            {
                "features": col,
                **{k: pa.array(v) for k, v in labeled.items()},
                "paths": pa.array(paths),
                "domain": pa.array([domain] * len(paths)),
            }
        )
        extra = {"classes": json.dumps(classes), **meta}
        table = table.replace_schema_metadata({k: str(v) for k, v in extra.items()})
        pq.write_table(table, tmp)
    tmp.replace(path)
    return path


def _say(line: str) -> None:
    """A plain progress line on stderr (naming the domain before and after its extraction)."""
    print(line, file=sys.stderr, flush=True)


def export_features(cfg: ExperimentConfig, out: Path, device: str = "cpu") -> dict[str, Path]:
    """Extract (or read from the feature cache) every domain's backbone features of the image
    config ``cfg`` and write them, plus the matching features config; returns the paths
    (``{role: file, "config": yaml}``).

    Raises:
        ConfigError: ``cfg`` has no image data, or ``out`` is neither ``.npz`` nor
            ``.parquet``.
    """
    from eada.data.image_tasks import (
        cached_feature_domains,
        checked_image_lists,
        drop_bad_images,
        image_domains,
    )
    from eada.data.images import ImageList, flat_image_folder, load_image_list

    if not isinstance(cfg.data, ImageListData):
        raise ConfigError(
            f"eada data features needs an image config (data.kind: images), got "
            f"data.kind: {cfg.data.kind}"
        )
    output_paths(out, [])  # check the name before any work
    model = cfg.model.model_copy(update={"freeze_backbone": True})
    check = cached_feature_domains(cfg.data, model, device, _say)
    flat = flat_image_folder(cfg.data.target)  # an unlabeled target: no labels to write
    if flat is None:
        lists, _ = checked_image_lists(cfg.data, check, check.extract if check else None)
    else:
        d = cfg.data
        src = load_image_list(d.source, d.root, allow_outside=d.allow_outside_root)
        tgt = ImageList(Path(d.target).name, flat, [0] * len(flat), list(src.classes))
        if not flat:
            raise ConfigError(f"data.target {d.target}: a folder without images")
        lists = {"source": src, "target": tgt}
        extract = check.extract if check else None
        lists, _ = drop_bad_images(lists, d.skip_bad_images, check, extract)
    domains, notes = image_domains(cfg.data, model, lists, device, _say, check)
    feats = {role: d.x for role, d in domains.items()}
    files = output_paths(out, list(lists))
    out.parent.mkdir(parents=True, exist_ok=True)
    info = notes["features"]
    meta = {"backbone": str(info["backbone"]), "weights": str(info["weights"]), "view": "test"}
    for role, il in lists.items():
        write_feature_file(
            files[role],
            feats[role].numpy(),
            None if flat is not None and role == "target" else np.asarray(il.labels),
            [str(p) for p in il.paths],
            list(il.classes),
            il.name,
            meta,
        )
    raw = cfg.resolved()
    data: dict[str, Any] = {
        "kind": "features",
        **{role: str(files[role].resolve()) for role in lists},
    }
    src = lists["source"]
    if len(set(src.labels)) == len(src.classes):  # every class present: keep their names
        data["classes"] = list(src.classes)
    raw.update(
        name=f"{cfg.name}/features",
        data=data,
        model=dict(FEATURE_MODEL),
    )
    if flat is not None:  # a project config: `eada init --config OUT.yaml`
        raw["store"] = {"target": "unlabeled"}
    header = (
        f"# features of {info['backbone']} ({info['weights']}, test view) written by "
        "`eada data features`;\n# the model is the frozen-backbone configs' head (linear + "
        "bottleneck 256)\n"
    )
    files["config"].write_text(header + yaml.safe_dump(raw, sort_keys=False))
    return files
