"""Bounds checked up front and a nearly full disk (issue 39, part B): an image size whose
decoded images cannot fit is refused before any decode, naming the largest that fits; sample
ids have one form; annotator names are text of bounded length; a checkpoint write that runs
out of space (148 KB free on a small tmpfs) is the documented error, the store unchanged."""

from __future__ import annotations

import gc
import hashlib
import json
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest

from eada.cli import main
from eada.data.images import ImageSizeError, check_image_memory, image_memory
from eada.hparams import preset_config
from eada.store import init_project
from eada.store.config import MAX_ANNOTATOR_CHARS, check_annotator
from eada.store.labelfiles import read_csv, read_json
from eada.threads import memory_limit
from support import real_data, truth_rows

sys.path.insert(0, str(Path(__file__).parent))
from test_atomic_exports import _fill, small_tmpfs  # noqa: F401  (the fixture, reused)
from test_images import _make_domain
from test_store_reliability import _dump, _refused, _write_csv, queried  # noqa: F401


# -- image size ---------------------------------------------------------------------------------
def test_image_size_100000_is_refused_before_any_decode(tmp_path: Path, monkeypatch, capsys):
    src, tgt = _make_domain(tmp_path, "src", n=2), _make_domain(tmp_path, "tgt", n=2, shift=9)
    from eada.store import data as store_data

    def no_decode(*a: object, **k: object) -> None:
        raise AssertionError("an image was decoded")

    monkeypatch.setattr(store_data, "decode_image", no_decode)
    store = tmp_path / "proj"
    args = ["init", "--store", str(store), "--source-dir", str(src), "--target-dir", str(tgt)]
    assert main([*args, "--image-size", "100000"]) == 2
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("error:"))
    assert "data.image_size (--image-size) 100000 is too large" in line
    largest = int(line.rsplit("the largest image size that fits is ", 1)[1])
    avail, why = memory_limit()
    assert why in line
    need = [image_memory(s, 8, 3, 32) for s in (largest, largest + 1)]
    assert need[0] <= avail * 1.01 and need[1] > avail * 0.99  # (this process's RSS moved)
    assert not store.exists()  # nothing written


def test_the_memory_limit_follows_rlimit_data(monkeypatch) -> None:
    import resource

    real = resource.getrlimit
    small = 3 * 2**30 + 2**31  # above this process's data segment, far below physical memory

    def limited(which: int) -> tuple[int, int]:
        return (small, small) if which == resource.RLIMIT_DATA else real(which)

    monkeypatch.setattr(resource, "getrlimit", limited)
    avail, why = memory_limit()
    assert why.startswith("RLIMIT_DATA") and 0 < avail < small
    with pytest.raises(ImageSizeError, match=r"RLIMIT_DATA .*the largest image size that fits"):
        check_image_memory(60_000, 100, 3, 32, "data.image_size")
    check_image_memory(32, 100, 3, 32)  # a small size passes


# -- sample ids and annotators ------------------------------------------------------------------
@pytest.mark.parametrize("text", ["5_7", "\u0665\u0667", "+57", "57.5", "5e1", "0x39", "57.00"])
def test_sample_ids_have_one_form(text: str) -> None:
    with pytest.raises(ValueError, match="ASCII digits 0-9") as got:
        read_csv(f"sample_id,label\n{text},plus\n")
    assert repr(text) in str(got.value)


def test_whole_number_forms_are_read_as_the_number() -> None:
    ids = [it.sample_id for it in read_csv("sample_id,label\n57,a\n 58.0 ,a\n")]
    _, items = read_json('[{"sample_id": 59, "label": "a"}, {"sample_id": 60.0, "label": "a"}]')
    assert ids + [it.sample_id for it in items] == [57, 58, 59, 60]
    with pytest.raises(ValueError, match="ASCII digits"):
        read_json('[{"sample_id": true, "label": "a"}]')


def test_annotator_names_are_bounded_text(queried, capsys) -> None:  # noqa: F811
    folder, rows, _ = queried
    j = folder.parent / "n.json"
    j.write_text(json.dumps([{**rows[0], "annotator": 5}]))
    _refused(["label", "import", str(j), "--store", str(folder)], folder, "annotator must be text",
             capsys)  # fmt: skip
    f = folder.parent / "long.csv"
    _write_csv(f, [{**rows[0], "annotator": "x" * 100_000}])
    before = _dump(folder)
    assert main(["label", "import", str(f), "--store", str(folder)]) == 2
    err = capsys.readouterr().err
    assert f"name is 100,000 characters long, over the limit of {MAX_ANNOTATOR_CHARS}" in err
    assert len(err) < 1000 and _dump(folder) == before  # the name is not echoed whole
    assert check_annotator("y" * MAX_ANNOTATOR_CHARS)
    args = ["label", "import", str(f), "--store", str(folder), "--annotator", "z" * 400]
    _write_csv(f, rows[:1])
    _refused(args, folder, "--annotator: the annotator's name is 400 characters", capsys)


# -- a nearly full disk -------------------------------------------------------------------------
def test_train_with_148_kb_free_is_the_documented_error(tmp_path, small_tmpfs, capsys) -> None:  # noqa: F811
    """A checkpoint of about 330 KB (an MLP of 160x160) into 148 KB: torch.save's zip writer fails
    part-way (before: ``unexpected RuntimeError: [enforce fail at inline_container.cc]``)."""
    over = ["data.n_per_class=60", "train.epochs=3", "active.rounds_at=[1,2]"]
    over += ["active.budget_per_round=5", "model.name=mlp", "model.hidden=[160,160]"]
    proj = init_project(tmp_path / "p", preset_config("toy", "eada", 0, over))
    proj.train()
    out = proj.query()
    rows = truth_rows(proj, out["files"]["csv"])
    proj.close()
    f = tmp_path / "l.csv"
    _write_csv(f, rows)
    store = small_tmpfs / "p"
    shutil.copytree(tmp_path / "p", store)
    assert main(["label", "import", str(f), "--store", str(store)]) == 0
    cks = sorted((store / "checkpoints").iterdir())
    assert min(c.stat().st_size for c in cks) > 2 * 148 * 1024
    _fill(small_tmpfs, 148 * 1024)
    capsys.readouterr()
    line = _refused(["train", "--store", str(store)], store, "no space left on the device", capsys)
    assert f"writing {store / 'checkpoints'}" in line
    assert sorted((store / "checkpoints").iterdir()) == cks  # no partial or temporary file
    for obj in gc.get_objects():  # connections on the tmpfs (the refused command's, the
        if isinstance(obj, sqlite3.Connection):  # dumps'): closed so that it unmounts
            obj.close()


# -- label-file size ----------------------------------------------------------------------------
def test_label_files_are_streamed_bounded_and_show_progress(tmp_path: Path, monkeypatch) -> None:
    from eada.store import labelfiles

    monkeypatch.setattr(labelfiles, "MAX_LABEL_ROWS", 1000)
    monkeypatch.setattr(labelfiles, "PROGRESS_BYTES", 2000)
    monkeypatch.setattr(labelfiles, "PROGRESS_ROWS", 250)
    f = tmp_path / "l.csv"
    f.write_text("sample_id,label\n" + "".join(f"{i},plus\n" for i in range(900)))
    said: list[str] = []
    _, items, digest = labelfiles.read_label_file(f, said.append)
    assert len(items) == 900 and digest == hashlib.sha256(f.read_bytes()).hexdigest()
    assert len(said) == 3 and all(f"reading {f}: " in s and "MiB" in s for s in said)
    assert said[-1].endswith("750 rows")
    f.write_text("sample_id,label\n" + "".join(f'{i},"plus"\n' for i in range(1001)))
    with pytest.raises(ValueError, match="more than 1,000 rows, the most one label file"):
        labelfiles.read_label_file(f, said.append)
    j = tmp_path / "l.json"
    j.write_text(json.dumps([{"sample_id": i, "label": "plus"} for i in range(1001)]))
    with pytest.raises(ValueError, match="1,001 items, more than the 1,000"):
        labelfiles.read_label_file(j)
    monkeypatch.setattr(labelfiles, "MAX_JSON_BYTES", 100)
    with pytest.raises(ValueError, match="over the 0 MiB a JSON label file may hold"):
        labelfiles.read_label_file(j)
    f.write_text("sample_id,label\n" + "".join(f"{i},plus\n" for i in range(1001)))
    monkeypatch.setattr(labelfiles, "read_csv", None)  # no quotes: refused before parsing
    with pytest.raises(ValueError, match="1,001 rows, more than the 1,000"):
        labelfiles.read_label_file(f)


def test_digits_image_size_is_bounded_too(monkeypatch) -> None:
    root = real_data("digits/usps").parent
    from eada.data import digits

    def no_resize(*a: object, **k: object) -> None:
        raise AssertionError("resized")

    monkeypatch.setattr(digits, "_to_tensor", no_resize)
    with pytest.raises(ImageSizeError, match=r"data.image_size of usps 100000 is too large: "):
        digits.load_digits("usps", root, "test", image_size=100_000)
