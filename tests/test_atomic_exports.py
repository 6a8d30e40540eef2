"""Exports and reports are atomic and consistent (issue 23, part 3): one read transaction, a
staging folder renamed into place, ``--force`` to replace an export, errors naming their path;
tested with an import committing during an export, SIGKILL at random and injected points, and a
small tmpfs for a full disk."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eada.cli import main
from eada.hparams import preset_config
from eada.store import Project, init_project
from eada.store import exports as store_exports
from eada.store.exports import EXPORT_FILES
from support import truth_rows

TOY = [
    "data.n_per_class=60",
    "train.epochs=3",
    "active.rounds_at=[1,2]",
    "active.budget_per_round=5",
]


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A toy project with one open round of 10 samples (a checkpoint, no label yet) and a CSV
    that labels the round; copied by each test (:func:`_fresh`)."""
    root = tmp_path_factory.mktemp("atomic")
    proj = init_project(root / "p", preset_config("toy", "eada", 0, TOY))
    out = proj.query(budget=10)
    rows = truth_rows(proj, out["files"]["csv"])
    proj.close()
    labels = root / "labels.csv"
    with open(labels, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return root / "p", labels


def _fresh(template: tuple[Path, Path], where: Path) -> Path:
    shutil.copytree(template[0], where)
    return where


def _labeled(export: Path) -> tuple[set[str], set[str]]:
    """The samples labeled in ``labels.csv`` and those with a label in ``predictions.csv``."""
    with open(export / "labels.csv", newline="") as fh:
        in_labels = {r["sample_id"] for r in csv.DictReader(fh)}
    with open(export / "predictions.csv", newline="") as fh:
        in_preds = {r["sample_id"] for r in csv.DictReader(fh) if r["label"]}
    return in_labels, in_preds


def _whole(export: Path) -> bytes:
    """Check that ``export`` is one whole export (every file, ``model.json`` naming the SHA-256
    of ``model.pt``, labels agreeing with predictions); returns its ``labels.csv``."""
    assert sorted(p.name for p in export.iterdir()) == sorted(EXPORT_FILES)
    meta = json.loads((export / "model.json").read_text())
    assert meta["sha256"] == hashlib.sha256((export / "model.pt").read_bytes()).hexdigest()
    a, b = _labeled(export)
    assert a == b, "labels.csv and predictions.csv disagree: a torn export"
    return (export / "labels.csv").read_bytes()


def test_existing_export_needs_force_and_other_files_are_never_replaced(
    template: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _fresh(template, tmp_path / "p")
    s = ["export", "--store", str(folder), "--out"]
    out = tmp_path / "out"
    out.mkdir()  # an empty folder is fine
    assert main([*s, str(out)]) == 0
    first = _whole(out)
    capsys.readouterr()
    assert main(["label", "import", str(template[1]), "--store", str(folder)]) == 0
    assert main([*s, str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--out {out} already holds an export" in err and "--force" in err
    assert _whole(out) == first  # untouched
    assert main([*s, str(out), "--force"]) == 0
    assert _whole(out) != first and len(_labeled(out)[0]) == 10
    # a folder holding anything else is not replaced, even with --force
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    capsys.readouterr()
    assert main([*s, str(mine), "--force"]) == 2
    assert "not part of an eada export (notes.txt)" in capsys.readouterr().err
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    assert not list(tmp_path.glob(".*.tmp"))  # no staging folder left behind


def test_import_during_export_never_tears_it(
    template: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An import that commits while the export reads: the export shows the store either before
    or after it, in every file. Forced once (the import commits between the export's read of
    the labels and of the predictions), then 20 tries at free timing."""
    folder = _fresh(template, tmp_path / "p")
    pristine = tmp_path / "pristine"
    shutil.copytree(folder, pristine)
    real = store_exports.predictions_csv
    gate: dict[str, Any] = {}

    def slow_predictions(project: Any, state: Any) -> str:
        if "between" in gate:
            gate["between"]()  # the import commits here
        return real(project, state)

    monkeypatch.setattr(store_exports, "predictions_csv", slow_predictions)

    def do_import() -> None:
        p = Project(folder)
        try:
            p.import_labels(template[1], annotator="a")
        finally:
            p.close()

    # forced: the import runs to its commit between the two reads
    gate["between"] = do_import
    p = Project(folder)
    p.export(tmp_path / "forced")
    p.close()
    del gate["between"]
    assert _labeled(tmp_path / "forced") == (set(), set())  # the store as the export began
    _whole(tmp_path / "forced")
    # 20 tries, the import and the export in two threads (their own connections)
    errors: list[BaseException] = []

    def guarded(fn: Any) -> Any:
        def run() -> None:
            try:
                time.sleep(random.random() * 0.05)
                fn()
            except BaseException as err:  # reported below
                errors.append(err)

        return run

    seen = set()
    for i in range(20):
        shutil.rmtree(folder)
        shutil.copytree(pristine, folder)
        out = tmp_path / f"e{i}"

        def do_export(out: Path = out) -> None:
            q = Project(folder)
            try:
                q.export(out)
            finally:
                q.close()

        threads = [threading.Thread(target=guarded(f)) for f in (do_import, do_export)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        _whole(out)
        seen.add(len(_labeled(out)[0]))
    assert seen <= {0, 10}


def _fork_export(folder: Path, out: Path, crash_at: str | None = None) -> int:
    """Run an export in a forked child; returns its pid (killed by the caller or by
    ``EADA_CRASH_AT``)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            if crash_at:
                os.environ["EADA_CRASH_AT"] = crash_at
            p = Project(folder)
            p.export(out, force=True)
            code = 0
        finally:
            os._exit(code)
    return pid


def test_killed_export_leaves_the_previous_one_whole(
    template: tuple[Path, Path], tmp_path: Path
) -> None:
    """SIGKILL at every injected point of the export and at 12 random moments: ``out`` is the
    previous export (byte for byte) or the new one, whole; a later export cleans up."""
    folder = _fresh(template, tmp_path / "p")
    out, first = tmp_path / "out", tmp_path / "first"
    p = Project(folder)
    p.export(first)
    before = _whole(first)
    p.import_labels(template[1], annotator="a")  # the next export differs
    t0 = time.monotonic()
    p.export(tmp_path / "timing")
    took = time.monotonic() - t0
    after = _whole(tmp_path / "timing")
    p.close()
    assert before != after
    points = [f"export:{n}" for n in sorted(EXPORT_FILES)] + ["export:staged"]
    rng = random.Random(0)
    new = 0
    for i, point in enumerate([*points, *[None] * 12]):
        if i == len(points):  # every injected kill came before the rename: its staging is left
            # (checked here: a random-moment export that finishes cleans the leftovers up)
            assert list(tmp_path.glob(".out.*.tmp"))
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(first, out)  # the previous export
        pid = _fork_export(folder, out, point)
        if point is None:
            time.sleep(rng.random() * took * 1.2)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _, status = os.waitpid(pid, 0)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        assert killed or (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0)
        now = _whole(out)  # never a mix, never a part
        assert now in (before, after)
        if point is not None:  # killed before the rename: the previous export
            assert killed and now == before, point
        new += now == after
    # the staging folders of the killed children go with the next export
    q = Project(folder)
    q.export(out, force=True)
    q.close()
    assert _whole(out) == after
    assert not list(tmp_path.glob(".out.*"))


def test_killed_report_leaves_the_previous_page(
    template: tuple[Path, Path], tmp_path: Path
) -> None:
    """SIGKILL at 6 random moments of `eada report` on a project: ``report.html`` is the
    previous page or the new one, whole; the next report removes a killed one's temporary
    file."""
    from eada.reports.project import build_project_report

    folder = _fresh(template, tmp_path / "p")
    page = build_project_report(folder)
    old = page.read_bytes()
    t0 = time.monotonic()
    build_project_report(folder, tmp_path / "timing.html")
    took = time.monotonic() - t0
    rng = random.Random(1)
    for _ in range(6):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                build_project_report(folder)
                code = 0
            finally:
                os._exit(code)
        time.sleep(rng.random() * took * 1.2)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        now = page.read_bytes()
        assert now == old or (now.endswith(b"</html>\n") and len(now) > len(old) // 2)
        old = now
    build_project_report(folder)
    assert not list(folder.glob(".report.html.*"))


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs (a disk that fills up); skipped where mounting is not permitted."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    try:
        res = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as err:
        pytest.skip(f"cannot mount a tmpfs here: {err}")
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (not permitted?): {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True, timeout=30)


def _fill(mnt: Path, leave: int) -> None:
    """Fill the file system of ``mnt`` until about ``leave`` bytes are free."""
    st = os.statvfs(mnt)
    free = st.f_bavail * st.f_frsize
    with open(mnt / "filler", "wb") as fh:
        fh.write(b"\0" * max(0, free - leave))


def test_disk_full_export_and_report_leave_the_previous_ones(
    template: tuple[Path, Path],
    tmp_path: Path,
    small_tmpfs: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder = _fresh(template, tmp_path / "p")
    out, report = small_tmpfs / "export", small_tmpfs / "report.html"
    assert main(["export", "--store", str(folder), "--out", str(out)]) == 0
    assert main(["report", str(folder), "--out", str(report)]) == 0
    before, page = _whole(out), report.read_bytes()
    assert main(["label", "import", str(template[1]), "--store", str(folder)]) == 0
    size = sum(f.stat().st_size for f in out.iterdir())
    _fill(small_tmpfs, min(size, len(page)) // 2)
    capsys.readouterr()
    assert main(["export", "--store", str(folder), "--out", str(out), "--force"]) == 2
    err = capsys.readouterr().err
    assert "no space left on device" in err and str(out) in err
    assert _whole(out) == before
    assert main(["report", str(folder), "--out", str(report)]) == 2
    err = capsys.readouterr().err
    assert f"no space left on device: {report}" in err
    assert report.read_bytes() == page
    left = sorted(p.name for p in small_tmpfs.iterdir())
    assert left == ["export", "filler", "report.html"]  # no partial or temporary file
    (small_tmpfs / "filler").unlink()
    assert main(["export", "--store", str(folder), "--out", str(out), "--force"]) == 0
    assert _whole(out) != before
