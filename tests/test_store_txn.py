"""Every read-modify-write of the store is one write transaction: two `eada config set` of
different keys while another connection holds the write lock both keep their key; an import
applies the conflicts policy in force when it commits; `eada init` commits schema,
registration and config at once (a failure or a SIGKILL leaves no store, and a half-made one
is named by `eada status` and replaced by `eada init`); string settings are stored as their
exact text (toy data)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from eada.cli import main
from eada.hparams import preset_config
from eada.store import Project, StoreError, init_project
from eada.store import db as store_db
from eada.store.config import parse_setting
from support import flat

SMALL = ["data.n_per_class=20", "train.epochs=2", "active.rounds_at=[1]"]
SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture
def proj(tmp_path: Path) -> Project:
    """A toy project store (initialised, nothing trained)."""
    return init_project(tmp_path / "p", preset_config("toy", "eada", 0, SMALL))


def _store_section(folder: Path) -> dict[str, object]:
    with sqlite3.connect(folder / "eada.sqlite") as c:
        raw = c.execute("SELECT value FROM meta WHERE key = 'config'").fetchone()[0]
    return dict(json.loads(raw)["store"])


def test_two_config_sets_behind_a_held_lock_both_keep_their_key(
    proj: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each `config set` (its own connection) has opened the project and reached BEGIN
    IMMEDIATE while a third connection holds the write lock; once it is released, both run.
    Reading the config before the lock (the old code) lost one key in every run."""
    folder = proj.folder
    proj.close()
    holder = sqlite3.connect(folder / "eada.sqlite", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    waiting = threading.Semaphore(0)
    real_begin = store_db.Store._begin

    def begin(self: store_db.Store) -> None:
        waiting.release()  # this writer's reads before its transaction are done
        real_begin(self)

    monkeypatch.setattr(store_db.Store, "_begin", begin)
    errors: list[BaseException] = []

    def set_one(key: str, value: object) -> None:
        try:
            Project(folder).set_options({key: value})
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [
        threading.Thread(target=set_one, args=("reviewer", "alice")),
        threading.Thread(target=set_one, args=("near_duplicate_threshold", 0.9)),
    ]
    for t in threads:
        t.start()
    for _ in threads:
        assert waiting.acquire(timeout=60)
    time.sleep(0.3)  # both are inside SQLite's busy wait now
    holder.execute("ROLLBACK")
    holder.close()
    for t in threads:
        t.join(60)
    assert not errors, errors
    section = _store_section(folder)
    assert section["reviewer"] == "alice" and section["near_duplicate_threshold"] == 0.9


def test_an_import_applies_the_policy_in_force_when_it_commits(
    proj: Project, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A `config set store.conflicts=newest-wins` (another connection) commits after this
    import opened the project and read its file, just before its transaction: the import
    applies newest-wins (bob's answer replaces alice's) and opens no dispute."""
    ids = [r["id"] for r in proj.store.samples("target")][:2]
    a, b = proj.classes[0], proj.classes[1]
    proj.import_records(
        [{"sample_id": i, "label": a} for i in ids], annotator="alice", allow_unqueried=True
    )
    assert proj.options.conflicts == "refuse"  # what this open project read at its start
    real_begin = store_db.Store._begin
    fired: list[int] = []

    def begin(self: store_db.Store) -> None:
        if self is proj.store and not fired:  # the import's transaction, once
            fired.append(1)
            other = ["config", "set", "--store", str(proj.folder), "store.conflicts=newest-wins"]
            assert main(other) == 0
        real_begin(self)

    monkeypatch.setattr(store_db.Store, "_begin", begin)
    f = tmp_path / "bob.csv"
    f.write_text("sample_id,label\n" + "".join(f"{i},{b}\n" for i in ids))
    out = proj.import_labels(f, annotator="bob", allow_unqueried=True)
    assert fired and out["disputes"] == [] and out["corrections"] == 2
    assert out["replaced_other_annotators"] == 2
    labels = {r["sample_id"]: (r["class_name"], r["annotator"]) for r in proj.store.answers()}
    assert all(labels[i] == (b, "bob") for i in ids)


@pytest.mark.parametrize(
    "text", ["@alice", "{", "alice #x", "yes", "123", " padded ", "[a]", "null"]
)
def test_string_settings_are_the_exact_text(text: str) -> None:
    assert parse_setting(f"store.reviewer={text}") == ("reviewer", text)


def test_config_set_values_through_the_command(
    proj: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    s = ["--store", str(proj.folder)]
    proj.import_records(
        [{"sample_id": proj.store.samples("target")[0]["id"], "label": proj.classes[0]}],
        annotator="@alice",
        allow_unqueried=True,
    )
    proj.close()
    for text in ("@alice", "{", "alice #x", "yes", "123"):
        assert main(["config", "set", *s, f"store.reviewer={text}"]) == 0, text
        assert _store_section(proj.folder)["reviewer"] == text
        err = flat(capsys.readouterr().err)
        if text == "@alice":
            assert "warning" not in err  # @alice has answered
        else:  # set, with a warning naming who has answered
            assert f"warning: store.reviewer {text!r} has not answered any sample yet" in err
            assert "'@alice'" in err
    assert main(["config", "set", *s, "store.near_duplicate_threshold=0.95"]) == 0
    assert _store_section(proj.folder)["near_duplicate_threshold"] == 0.95
    capsys.readouterr()
    before = _store_section(proj.folder)
    for bad, says in (
        ("store.near_duplicate_threshold={", "store.near_duplicate_threshold='{': not a value"),
        ("store.near_duplicate_threshold=high", "store.near_duplicate_threshold"),
        ("store.conflicts=maybe", "store.conflicts"),
        ("store.target=labeled", "store.target cannot change after"),
        ("store.reviewr=alice", "store.reviewr is not a store setting (unknown key)"),
    ):
        assert main(["config", "set", *s, bad]) == 2, bad
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and says in err, (bad, err)
    assert _store_section(proj.folder) == before


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir()) if folder.parent.exists() else []


def test_a_failed_init_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure inside init's one transaction (here: registering the samples' extra info)
    rolls back schema, registration and config, and the files and folders it made go."""
    import eada.store.project as project_mod

    def broken(*args: object, **kwargs: object) -> None:
        raise ValueError("injected failure while registering")

    monkeypatch.setattr(project_mod, "record_sample_info", broken)
    folder = tmp_path / "new" / "p"
    with pytest.raises(ValueError, match="injected"):
        init_project(folder, preset_config("toy", "eada", 0, SMALL))
    assert not (tmp_path / "new").exists()
    existing = tmp_path / "kept"
    existing.mkdir()
    (existing / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="injected"):
        init_project(existing, preset_config("toy", "eada", 0, SMALL))
    assert sorted(p.name for p in existing.iterdir()) == ["notes.txt"]


def test_init_with_a_non_utf8_file_name_leaves_nothing_or_a_whole_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A target file whose name is not UTF-8: init either registers it or fails leaving no
    file and no folder behind (never a store without a config)."""
    if sys.platform != "linux":
        pytest.skip("bytes file names are a Linux file system's")
    from PIL import Image

    rng = np.random.default_rng(0)
    for dom in ("src", "tgt"):
        for c in ("a", "b"):
            (tmp_path / dom / c).mkdir(parents=True)
            for i in range(4):
                img = (rng.random((8, 8, 3)) * 255).astype("uint8")
                Image.fromarray(img).save(tmp_path / dom / c / f"{i}.png")
    odd = Path(os.fsdecode(os.fsencode(tmp_path / "tgt" / "a") + b"/caf\xe9.png"))
    Image.fromarray((rng.random((8, 8, 3)) * 255).astype("uint8")).save(odd, format="PNG")
    folder = tmp_path / "out" / "p"
    argv = ["init", "--store", str(folder), "--source-dir", str(tmp_path / "src")]
    code = main([*argv, "--target-dir", str(tmp_path / "tgt")])
    err = capsys.readouterr().err
    if code == 0:
        assert Project(folder).status()["n_target"] == 9
    else:  # the name's failure, not any other: and no file, no folder left
        assert code == 2 and ("utf-8" in err or "caf" in err), err
        assert not (tmp_path / "out").exists()


def test_a_killed_init_is_named_and_replaced(tmp_path: Path) -> None:
    """SIGKILL just before init's commit: the store holds nothing, `eada status` names it
    half-made (exit 2, no traceback), and `eada init` replaces it without --force."""
    folder = tmp_path / "p"
    env = {**os.environ, "PYTHONPATH": SRC, "EADA_CRASH_AT": "init:before_commit"}
    sets = [x for s in SMALL for x in ("--set", s)]
    cmd = [sys.executable, "-m", "eada.cli", "init", "--store", str(folder), "--preset", "toy"]
    res = subprocess.run([*cmd, *sets], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == -9, res.stderr
    assert (folder / "eada.sqlite").exists() and store_db.half_made(folder)
    with pytest.raises(StoreError, match="half-made"):
        Project(folder)
    assert main(["status", "--store", str(folder)]) == 2
    p = init_project(folder, preset_config("toy", "eada", 0, SMALL))
    assert p.status()["n_target"] == 40 and not store_db.half_made(folder)
    with pytest.raises(StoreError, match="already exists"):
        init_project(folder, preset_config("toy", "eada", 0, SMALL))


def test_an_older_half_made_store_is_named_and_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What an older eada's failed init left: the schema committed, no registration."""
    folder = tmp_path / "p"
    store_db.Store(folder, create=True).close()  # schema + schema_version, no config
    assert main(["status", "--store", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the project store") and "half-made" in err
    assert "AttributeError" not in err
    assert main(["init", "--store", str(folder), "--preset", "toy", *_sets()]) == 0
    assert Project(folder).status()["n_target"] == 40


def _sets() -> list[str]:
    return [x for s in SMALL for x in ("--set", s)]
