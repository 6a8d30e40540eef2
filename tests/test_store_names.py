"""File and folder names (issue 39, part B): a label file in a folder whose names are not
UTF-8 is imported and recorded readably; image names that are not UTF-8 or hold a newline, the
same folder as source and target, and an empty source class folder are refused at ``init``
before anything is written (an empty target class folder is a warning)."""

from __future__ import annotations

import csv
import os
import sqlite3
import sys
from pathlib import Path

import pytest

from eada.cli import main
from support import toy_project

sys.path.insert(0, str(Path(__file__).parent))
from test_store_inputs import _images


def test_a_label_file_named_in_latin_1_is_imported_and_named(tmp_path: Path, capsys) -> None:
    proj = toy_project(tmp_path, 5)
    with open(proj.folder / "exports" / "round-001.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    label = proj.classes[int(proj.task.target.y[int(rows[0]["index"])])]
    proj.close()
    folder = Path(os.fsdecode(os.fsencode(tmp_path) + b"/caf\xe9"))
    folder.mkdir()
    f = folder / os.fsdecode(b"\xe9t\xe9.csv")
    f.write_text(f"sample_id,label\n{rows[0]['sample_id']},{label}\n")
    assert main(["label", "import", str(f), "--store", str(proj.folder)]) == 0
    with sqlite3.connect(proj.folder / "eada.sqlite") as c:
        (name,) = c.execute("SELECT file FROM imports").fetchone()
    assert name == str(tmp_path) + "/caf\\xe9/\\xe9t\\xe9.csv"


def _init(tmp_path: Path, src: Path, tgt: Path) -> int:
    sets = ["active.budget_per_round=1", "active.rounds_at=[1]", "train.epochs=2"]
    args = ["--store", str(tmp_path / "P"), "--source-dir", str(src), "--target-dir", str(tgt)]
    return main(["init", *args, *[w for k in sets for w in ("--set", k)]])


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        (b"bad\xff.png", "bad\\xff.png (its name is not UTF-8)"),
        (b"two\nlines.png", "two\\nlines.png"),
    ],
)
def test_image_names_the_store_cannot_record_are_refused_readably(
    tmp_path: Path, capsys, name: bytes, shown: str
) -> None:
    _images(tmp_path / "src", 2, 0)
    _images(tmp_path / "tgt", 2, 1)
    good = tmp_path / "tgt" / "a" / "a0.png"
    os.link(good, os.fsencode(good.parent) + b"/" + name)
    assert _init(tmp_path, tmp_path / "src", tmp_path / "tgt") == 2
    err = capsys.readouterr().err
    assert "1 file name(s) the store cannot record" in err and shown in err
    assert "\udcff" not in err
    assert not (tmp_path / "P").exists()


def test_same_folder_twice_and_an_empty_source_class_are_refused(tmp_path: Path, capsys) -> None:
    _images(tmp_path / "src", 2, 0)
    _images(tmp_path / "tgt", 2, 1)
    assert _init(tmp_path, tmp_path / "src", tmp_path / "src" / ".." / "src") == 2
    assert "the source and target folders are the same folder" in capsys.readouterr().err
    (tmp_path / "src" / "c").mkdir()
    (tmp_path / "tgt" / "c").mkdir()
    assert _init(tmp_path, tmp_path / "src", tmp_path / "tgt") == 2
    assert "class folder(s) c hold no images" in capsys.readouterr().err
    assert not (tmp_path / "P").exists()
    (tmp_path / "src" / "c" / "c0.png").write_bytes(
        (tmp_path / "src" / "a" / "a0.png").read_bytes()
    )
    with pytest.warns(UserWarning, match=r"tgt: class folder\(s\) c hold no images"):
        assert _init(tmp_path, tmp_path / "src", tmp_path / "tgt") == 0


def test_target_scan_names_a_file_it_cannot_record_and_registers_the_rest(
    tmp_path: Path, capsys
) -> None:
    _images(tmp_path / "src", 2, 0)
    flat = tmp_path / "flat"
    flat.mkdir()
    for i, f in enumerate(sorted((tmp_path / "src" / "a").iterdir())):
        (flat / f"t{i}.png").write_bytes(f.read_bytes())
    assert _init(tmp_path, tmp_path / "src", flat) == 0
    png = (flat / "t0.png").read_bytes()
    Path(os.fsdecode(os.fsencode(flat) + b"/bad\xff.png")).write_bytes(png)
    (flat / "new.png").write_bytes(png[:-1] + b"\0")
    capsys.readouterr()
    assert main(["target", "scan", "--store", str(tmp_path / "P")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "1 new file(s) registered" in out
    assert "bad\\xff.png: its name is not UTF-8: not registered (rename it)" in out
