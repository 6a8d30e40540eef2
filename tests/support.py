"""Helpers several test files share: output flattening, a toy project store, and calls to a
live Label Studio server's API (the ``label_studio`` fixture in ``conftest.py`` starts it)."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from eada.hparams import preset_config
from eada.store import Project, init_project

#: the real data sets (``/work/shared/data`` seen from a clone's root), README there
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def real_data(name: str) -> Path:
    """``../shared/data/NAME``: a real data set of its README (``digits``, ``office31``,
    ``office_caltech10_surf``) or a part of one (``digits/mnist_m``, ``office31/webcam``).

    Where it is absent the test is skipped with a reason naming the data set and where it was
    looked for; under ``CI=true`` (CI has the data) that is a failure instead, as a missing
    Label Studio or Chromium is (``conftest.py``).
    """
    import pytest

    path = SHARED_DATA / name
    if not path.exists():
        msg = f"real data set {name!r} not found at {path}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{msg} (CI=true: CI must have ../shared/data)")
        pytest.skip(msg)
    return path


def flat(text: str) -> str:
    """``text`` with every run of whitespace one space (messages wrap at any width)."""
    return " ".join(text.split())


def toy_overrides(budget: int = 5) -> list[str]:
    """A short toy schedule: 3 epochs, rounds after epochs 1 and 2 of ``budget`` samples."""
    return [
        "data.n_per_class=60",
        "train.epochs=3",
        "active.rounds_at=[1,2]",
        f"active.budget_per_round={budget}",
    ]


def round1_ids(proj: Project) -> list[int]:
    """The sample ids of a project's first round, in its export's order (``round-001.csv``)."""
    with open(proj.folder / "exports" / "round-001.csv", newline="") as fh:
        return [int(r["sample_id"]) for r in csv.DictReader(fh)]


def truth_rows(proj: Project, csv_path: str | Path) -> list[dict[str, Any]]:
    """The rows of a round's export CSV with each sample's true class name as its ``label``
    (a simulated annotator who is always right)."""
    with open(csv_path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        r["label"] = proj.classes[int(proj.task.target.y[int(r["index"])])]
    return rows


def toy_project(tmp_path: Path, budget: int = 5) -> Project:
    """A toy project store trained to round 1, with round 1 (``budget`` samples) queried."""
    p = init_project(tmp_path / "p", preset_config("toy", "eada", 0, toy_overrides(budget)))
    p.train()
    p.query()
    return p


def ls_api(ls: dict[str, Any], method: str, path: str, body: Any = None) -> Any:
    """One JSON call to the live Label Studio ``ls`` (its legacy token), as a user's script."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(ls["url"] + path, data=data, method=method)
    req.add_header("Authorization", f"Token {ls['legacy_token']}")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=60) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


def ls_tasks(ls: dict[str, Any], project: int) -> list[dict[str, Any]]:
    """Every task of a Label Studio project."""
    out = ls_api(ls, "GET", f"/api/projects/{project}/tasks/?page_size=1000")
    return out if isinstance(out, list) else out["tasks"]


def copy_office(
    office: Path, src: Path, tgt: Path, classes: list[str], webcam: slice, prefix: str
) -> dict[str, str]:
    """Copy 6 amazon images a class of ``classes`` into class folders under ``src`` and the
    ``webcam`` slice of each class's webcam images, renamed ``{prefix}_NNNN.jpg``, into the flat
    folder ``tgt``; returns each target file's true class."""
    truth: dict[str, str] = {}
    for c in classes:
        (src / c).mkdir(parents=True)
        for f in sorted((office / "amazon" / "images" / c).iterdir())[:6]:
            shutil.copy(f, src / c / f.name)
        for f in sorted((office / "webcam" / "images" / c).iterdir())[webcam]:
            name = f"{prefix}_{len(truth):04d}.jpg"
            shutil.copy(f, tgt / name)
            truth[name] = c
    return truth


def lite0_config(
    folder: Path, name: str, src: Path, tgt: Path, store: dict[str, Any] | None = None
) -> Path:
    """``folder/C.yaml``: a small project on frozen EfficientNet-Lite0 features (3 epochs,
    rounds of 5 after epochs 1 and 2), with an optional ``store:`` section."""
    cfg: dict[str, Any] = {
        "name": name,
        "device": "cpu",
        "data": {
            "kind": "images",
            "source": str(src),
            "target": str(tgt),
            "workers": 0,
            "cache_dir": str(folder / "cache"),
        },
        "model": {
            "name": "backbone",
            "backbone": "efficientnet_lite0",
            "weights": "pretrained",
            "bottleneck_dim": 64,
            "freeze_backbone": True,
        },
        "optim": {"name": "adadelta", "lr": 0.1},
        "train": {"epochs": 3, "batch_size": 8},
        "active": {"strategy": "eada", "rounds_at": [1, 2], "budget_per_round": 5},
    }
    if store is not None:
        cfg["store"] = store
    path = folder / "C.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def surf_task(folder: Path, name: str, lr: float = 0.1, epochs: int = 2) -> str:
    """A tiny Office-Caltech10 SURF task (Caltech10 -> amazon, an MLP of 32 hidden units,
    ``epochs`` epochs, one round) as a YAML file in ``folder``; its path. Skips the test where
    the data set is absent (:func:`real_data`). ``lr=1e30`` makes a task whose training
    diverges."""
    root = real_data("office_caltech10_surf")
    path = folder / f"{name}.yaml"
    path.write_text(
        f"name: {name}\nseed: 0\n"
        f"data:\n  kind: features\n  source: {root}/Caltech10_SURF_L10.mat\n"
        f"  target: {root}/amazon_SURF_L10.mat\n  features_key: fts\n  labels_key: labels\n"
        "  normalize: l1_zscore\n"
        "model:\n  name: mlp\n  hidden: [32]\n"
        f"optim:\n  name: adadelta\n  lr: {lr}\n"
        f"train:\n  epochs: {epochs}\n  batch_size: 32\n"
        "active:\n  strategy: eada\n  rounds_at: [1]\n  budget_per_round: 0.01\n"
    )
    return str(path)


@contextlib.contextmanager
def kept_registries() -> Iterator[None]:
    """Every registry of strategies, components, backbones and methods (and the plugins
    loaded) as it was before the block: a test's plugin names and modules are forgotten
    after it."""
    import copy
    import sys

    from eada import hparams, plugins
    from eada.models import backbones
    from eada.strategies import STRATEGIES
    from eada.strategies.components import COMPONENT_CLASSES

    saved: list[tuple[Any, Any]] = [
        (STRATEGIES, dict(STRATEGIES)),
        (COMPONENT_CLASSES, dict(COMPONENT_CLASSES)),
        (backbones.BACKBONES, dict(backbones.BACKBONES)),
        (hparams.METHODS, copy.deepcopy(hparams.METHODS)),
        (hparams.METHOD_LABELS, dict(hparams.METHOD_LABELS)),
        (plugins.LOADED, dict(plugins.LOADED)),
        (plugins._ORIGINS, dict(plugins._ORIGINS)),
        (plugins._GROUPS_DONE, set(plugins._GROUPS_DONE)),
    ]
    before = set(plugins.LOADED)
    try:
        yield
    finally:
        new = {n for n in plugins.LOADED if n not in before}
        new |= {plugins.LOADED[n].module for n in new}
        for name in new:
            sys.modules.pop(name, None)
        for registry, kept in saved:
            registry.clear()
            registry.update(kept)


#: a single-file plugin written against eada.extend only: the strategy ``my_margin``
PLUGIN = """
import numpy as np
from eada.extend import PoolOutputs, Selection, check_request, register_strategy


@register_strategy("my_margin", needs=("energies",), summary="smallest top-2 margin",
                   reference="Scheffer et al., 2001")
def my_margin(pool: PoolOutputs, budget: int, rng: np.random.Generator, *,
              temperature: float = 1.0) -> Selection:
    check_request(pool, budget)
    p = np.sort(pool.probabilities("my_margin") ** (1.0 / temperature), axis=1)
    score = p[:, -2] - p[:, -1]
    return Selection(np.argsort(-score, kind="stable")[:budget], {"margin": -score})
"""


def write_plugin(folder: Path, name: str = "plug", text: str = PLUGIN) -> Path:
    """``text`` (default :data:`PLUGIN`) as ``folder/NAME.py``; its path."""
    path = folder / f"{name}.py"
    path.write_text(text)
    return path
