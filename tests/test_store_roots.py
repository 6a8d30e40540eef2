"""The store never widens its data roots by itself (issue 23, part 2).

One absolute path in an image list registered `/` as a data root; the list's `../` entries were
then accepted and `eada query` printed `LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT=/`. A symlink in
a flat target folder pointing outside registered the outside parent. Now every file must resolve
inside the config's folders or a folder named with `--allow-root`, and the Label Studio document
root is never `/` nor a parent of a home folder. Small synthetic images and a tiny frozen
backbone: seconds."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from eada.cli import main
from eada.store import roots as roots_mod
from eada.store.roots import (
    OutsideRootsError,
    check_within_roots,
    label_studio_root,
    unsafe_document_root,
)


def _png(path: Path, seed: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    px = np.random.default_rng(seed).integers(0, 255, (12, 12, 3), dtype=np.uint8)
    Image.fromarray(px).save(path)
    return path


def _data(base: Path) -> dict[str, Path]:
    """base/data/src/{a,b}/*.png (source), base/data/tgt/*.png (flat target), and
    base/outside/*.png (a folder no config names)."""
    for c in ("a", "b"):
        for i in range(3):
            _png(base / "data" / "src" / c / f"{i}.png", 10 * ord(c) + i)
    for i in range(4):
        _png(base / "data" / "tgt" / f"t{i}.png", 100 + i)
    for i in range(2):
        _png(base / "outside" / f"o{i}.png", 200 + i)
    return {"src": base / "data" / "src", "tgt": base / "data" / "tgt", "out": base / "outside"}


def _config(tmp_path: Path, target: Path, **data: object) -> Path:
    cfg = {
        "name": "roots",
        "device": "cpu",
        "data": {
            "kind": "images",
            "source": str(tmp_path / "data" / "src"),
            "target": str(target),
            "workers": 0,
            "cache_dir": str(tmp_path / "cache"),
            "transforms": {"resize": 20, "crop": 16, "test_resize": 20, "jitter": None},
            **data,
        },
        "model": {
            "name": "backbone",
            "factory": "test_images:tiny_backbone",
            "weights": "none",
            "bottleneck_dim": 8,
            "freeze_backbone": True,
        },
        "optim": {"name": "adadelta", "lr": 0.1},
        "train": {"epochs": 2, "batch_size": 4},
        "active": {"strategy": "random", "rounds_at": [1], "budget_per_round": 2},
        "store": {"target": "unlabeled"},
    }
    path = tmp_path / "C.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture
def d(tmp_path: Path, monkeypatch) -> dict[str, Path]:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # test_images:tiny_backbone
    return _data(tmp_path)


def _error(err: str) -> str:
    """From the `error:` line on (progress lines come first on stderr)."""
    assert "error: " in err, err
    return err[err.index("error: ") :]


def _init(tmp_path: Path, cfg: Path, *extra: str) -> int:
    return main(["init", "--store", str(tmp_path / "P"), "--config", str(cfg), *extra])


def _roots(tmp_path: Path) -> list[str]:
    with sqlite3.connect(tmp_path / "P" / "eada.sqlite") as c:
        return [r[0] for r in c.execute("SELECT path FROM roots ORDER BY id")]


def test_list_with_dotdot_entries_is_refused_until_the_root_is_allowed(
    tmp_path: Path, d, capsys
) -> None:
    lst = d["tgt"] / "list.txt"
    lst.write_text("t0.png\nt1.png\n../../outside/o0.png\n")
    cfg = _config(tmp_path, lst)
    assert _init(tmp_path, cfg) == 2
    err = _error(capsys.readouterr().err)
    assert err.startswith("error: 1 target file(s) resolve outside the data roots")
    assert "../../outside/o0.png" in err and f"--allow-root {d['out']}" in err
    assert not (tmp_path / "P").exists()  # nothing registered
    assert _init(tmp_path, cfg, "--allow-root", str(d["out"])) == 0
    capsys.readouterr()
    assert str(d["out"]) in _roots(tmp_path) and "/" not in _roots(tmp_path)
    with sqlite3.connect(tmp_path / "P" / "eada.sqlite") as c:
        meta = c.execute("SELECT value FROM meta WHERE key = 'allowed_roots'").fetchone()[0]
    assert json.loads(meta) == [str(d["out"])]


def test_absolute_path_in_a_list_registers_no_root(tmp_path: Path, d, capsys) -> None:
    """The defeat of the issue: one absolute path made `/` a root."""
    lst = d["tgt"] / "list.txt"
    lst.write_text(f"t0.png\nt1.png\nt2.png\n{d['out'] / 'o1.png'}\n")
    assert _init(tmp_path, _config(tmp_path, lst)) == 2
    err = _error(capsys.readouterr().err)
    assert f"target: {d['out'] / 'o1.png'}" in err and err.count("\n") > 1
    assert not (tmp_path / "P").exists()


def test_mixed_list_names_every_outside_entry(tmp_path: Path, d, capsys) -> None:
    """Inside entries, an absolute one outside and a `..` one outside: both are named (the
    absolute one no longer opens the door for the `..` one)."""
    lst = d["tgt"] / "list.txt"
    lst.write_text(f"t0.png\n{d['out'] / 'o0.png'}\nt1.png\n../../outside/o1.png\nt2.png\n")
    assert _init(tmp_path, _config(tmp_path, lst)) == 2
    err = _error(capsys.readouterr().err)
    assert "2 target file(s) resolve outside" in err
    assert "o0.png" in err and "../../outside/o1.png" in err and "t1.png" not in err
    assert not (tmp_path / "P").exists()


def test_labeled_list_let_out_by_the_config_still_needs_allow_root(
    tmp_path: Path, d, capsys
) -> None:
    """`data.allow_outside_root: true` lets `eada run` read a list pointing out; the store
    still registers no folder the user did not name."""
    _png(d["out"] / "a" / "x.png", 7)
    lst = d["tgt"] / "labeled.txt"
    lst.write_text("# class 0 a\n# class 1 b\nt0.png 0\nt1.png 1\n../../outside/a/x.png 0\n")
    cfg = _config(tmp_path, lst, allow_outside_root=True)
    text = cfg.read_text().replace("target: unlabeled", "target: labeled")
    cfg.write_text(text)
    assert _init(tmp_path, cfg) == 2
    assert "outside/a/x.png" in _error(capsys.readouterr().err)
    assert _init(tmp_path, cfg, "--allow-root", str(d["out"])) == 0


def test_symlink_in_a_flat_folder_pointing_out_is_refused(tmp_path: Path, d, capsys) -> None:
    (d["tgt"] / "inner.png").symlink_to(d["tgt"] / "t0.png")  # inside: fine
    cfg = _config(tmp_path, d["tgt"])
    assert _init(tmp_path, cfg) == 0
    capsys.readouterr()
    assert _roots(tmp_path) == [str(d["tgt"].resolve()), str(d["src"].resolve())]
    (d["tgt"] / "link.png").symlink_to(d["out"] / "o0.png")
    assert _init(tmp_path, cfg, "--store", str(tmp_path / "P2")) == 2
    err = _error(capsys.readouterr().err)
    assert "1 target file(s) resolve outside" in err and str(d["out"] / "o0.png") in err
    assert not (tmp_path / "P2").exists()


def test_check_within_roots_is_the_one_check() -> None:
    """The function other commands call (`eada target scan`, a live Label Studio link)."""
    with pytest.raises(OutsideRootsError, match=r"2 heldout/target file\(s\)"):
        check_within_roots(
            {"target": [Path("/data/x/a.png")], "heldout": [Path("/etc/passwd")], "s": None},
            [Path("/data/y")],
        )
    check_within_roots({"target": [Path("/data/y/sub/a.png")]}, [Path("/data/y")])


def test_document_root_is_never_slash_nor_a_home_parent(tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / "home" / "alice"
    home.mkdir(parents=True)
    monkeypatch.setattr(roots_mod, "home_folders", lambda: [home.resolve()])
    assert unsafe_document_root("/") is not None
    assert unsafe_document_root("/home") is not None
    assert unsafe_document_root(tmp_path / "home") is not None  # holds alice's home
    assert unsafe_document_root(tmp_path) is not None
    assert unsafe_document_root(home) is None and unsafe_document_root(home / "data") is None
    # derived from the roots: the deepest common folder, or none when that one is unsafe
    a, b = home / "imgs", tmp_path / "home" / "bob" / "imgs"
    assert label_studio_root([a, home / "more"], None) == home.resolve()
    assert label_studio_root([a, b], None) is None
    assert label_studio_root([Path("/usr/x"), a], None) is None
    assert label_studio_root([], None) is None
    with pytest.raises(ValueError, match="holds the home folder"):
        label_studio_root([a], tmp_path / "home")
    assert label_studio_root([a, b], a) == a.resolve()


def test_query_prints_no_unsafe_document_root(tmp_path: Path, d, capsys, monkeypatch) -> None:
    """Data in one home and an allowed root in another: the folder holding both is a parent
    of a home folder, so `eada query` names no document root and says what to set; an unsafe
    `store.label_studio_root` is refused at init."""
    monkeypatch.setattr(roots_mod, "home_folders", lambda: [d["out"].resolve()])
    lst = d["tgt"] / "list.txt"
    lst.write_text("t0.png\nt1.png\nt2.png\n../../outside/o0.png\n")
    cfg = _config(tmp_path, lst)
    s = ["--store", str(tmp_path / "P")]
    assert _init(tmp_path, cfg, "--allow-root", str(d["out"])) == 0
    assert main(["train", *s]) == 0 and main(["query", *s]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "DOCUMENT_ROOT=" not in out and "set store.label_studio_root" in out
    doc = json.loads((tmp_path / "P" / "exports" / "round-001.json").read_text())
    assert doc["label_studio_document_root"] is None and "label_studio_note" in doc
    bad = yaml.safe_load(cfg.read_text())
    bad["store"]["label_studio_root"] = str(tmp_path)  # holds the "home" d["out"]
    cfg.write_text(yaml.safe_dump(bad))
    assert _init(tmp_path, cfg, "--store", str(tmp_path / "P2")) == 2
    err = _error(capsys.readouterr().err)
    assert "store.label_studio_root" in err and "holds the home folder" in err
    assert err.count("\n") == 1 and not (tmp_path / "P2").exists()


def test_one_storage_per_target_root_and_no_label_studio_file_without_a_root(
    tmp_path: Path, d, capsys, monkeypatch
) -> None:
    """Issue 30: target files in two data roots (the list's folder and an allowed one) get one
    Local Files storage each under a document root that holds both; the source plays no part.
    Where the target's roots share no safe folder, no round-NNN.labelstudio.json is written
    (its URLs would not resolve) until `eada config set store.label_studio_root=DIR` names one."""
    from eada.store import Project
    from eada.store.labelstudio import _storage_folders, document_root_or_none

    lst = d["tgt"] / "list.txt"
    lst.write_text("t0.png\nt1.png\nt2.png\n../../outside/o0.png\n../../outside/o1.png\n")
    cfg = _config(tmp_path, lst)
    s = ["--store", str(tmp_path / "P")]
    assert _init(tmp_path, cfg, "--allow-root", str(d["out"])) == 0
    p = Project(tmp_path / "P")
    root = document_root_or_none(p)
    assert root == tmp_path.resolve()
    assert _storage_folders(p, root) == [d["tgt"].resolve(), d["out"].resolve()]
    # the same two roots, no safe folder above them: no Label Studio file, a note instead
    monkeypatch.setattr(roots_mod, "home_folders", lambda: [d["out"].resolve()])
    assert main(["train", *s]) == 0 and main(["query", *s]) == 0
    out = " ".join(capsys.readouterr().out.split())
    exports = tmp_path / "P" / "exports"
    assert not (exports / "round-001.labelstudio.json").exists()
    assert "is not written" in out and "eada labelstudio connect --root DIR" in out
    # a root named after init: the file is written, every URL under it
    safe = tmp_path / "serve"
    safe.mkdir()
    assert main(["config", "set", *s, f"store.label_studio_root={safe}"]) == 2
    assert "lie outside it" in capsys.readouterr().err
    monkeypatch.setattr(roots_mod, "home_folders", lambda: [])
    assert main(["config", "set", *s, f"store.label_studio_root={tmp_path}"]) == 0
    assert main(["query", *s]) == 0  # re-exports the open round
    tasks = json.loads((exports / "round-001.labelstudio.json").read_text())
    assert {t["data"]["image"].split("?d=")[1].split("/")[0] for t in tasks} <= {"data", "outside"}
