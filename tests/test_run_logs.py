"""The committed raw run logs: compressed logs read as plain ones, nothing archived out of reach."""

from __future__ import annotations

import json
import lzma
import subprocess
import sys
from pathlib import Path

import pytest

from eada.reports.collect import load_report_input
from eada.runs import append_jsonl, compressed_log, find_jsonl, read_jsonl

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
sys.path.insert(0, str(REPO / "scripts"))
import run_logs  # noqa: E402


def _git_history() -> bool:
    try:
        return run_logs.git("rev-parse", "--is-shallow-repository").strip() == "false"
    except (OSError, subprocess.CalledProcessError):
        return False


def test_a_compressed_log_reads_as_the_plain_one_and_takes_appended_runs(tmp_path: Path) -> None:
    """A resumed grid appends to a plain ``runs.jsonl`` beside the committed ``.xz``: the two
    read as one log, compressed records first."""
    log = tmp_path / "task" / "eada" / "runs.jsonl"
    append_jsonl(log, {"seed": 0, "x": 1.5})
    append_jsonl(log, {"seed": 1, "x": 2.5})
    plain = log.read_bytes()
    assert run_logs.compress([tmp_path]) == 0
    assert not log.exists() and compressed_log(log).is_file()
    assert lzma.decompress(compressed_log(log).read_bytes()) == plain
    assert run_logs.pack(plain) == compressed_log(log).read_bytes()  # deterministic
    append_jsonl(log, {"seed": 2, "x": 3.5})
    assert [r["seed"] for r in read_jsonl(log)] == [0, 1, 2]
    assert find_jsonl(tmp_path) == [log]


def test_a_damaged_compressed_log_is_named(tmp_path: Path) -> None:
    log = tmp_path / "runs.jsonl"
    compressed_log(log).write_bytes(b"\xfd7zXZ\x00 truncated")
    with pytest.raises(ValueError, match=r"runs\.jsonl\.xz: not a readable xz file"):
        read_jsonl(log)


def test_eada_report_reads_the_committed_compressed_results() -> None:
    """``eada report benchmarks/results/digits`` (a README command) reads ``.xz`` logs only."""
    folder = RESULTS / "digits"
    assert not list(folder.rglob("runs.jsonl")) and list(folder.rglob("runs.jsonl.xz"))
    report = load_report_input(folder)
    assert report.groups and all(g.runs for g in report.groups)


def test_every_committed_log_is_compressed_or_archived_with_its_blob_in_history() -> None:
    """No plain raw log creeps back into the tree (``scripts/run_logs.py compress`` a new one),
    and each archived log's blob is in the repository with the recorded SHA-256."""
    plain = [p.relative_to(REPO).as_posix() for p in RESULTS.rglob("runs.jsonl")]
    assert not plain, f"commit raw logs compressed (scripts/run_logs.py compress): {plain}"
    manifest = json.loads(run_logs.MANIFEST.read_text())["logs"]
    assert manifest and all(not (REPO / e["path"]).exists() for e in manifest)
    if not _git_history():
        pytest.skip("not a full git clone: the archived blobs cannot be checked")
    blobs = "\n".join(e["blob"] for e in manifest) + "\n"
    out = subprocess.run(
        ["git", "cat-file", "--batch-check"],
        cwd=REPO,
        input=blobs,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    sizes = {line.split()[0]: line.split() for line in out}
    for e in manifest:
        assert sizes[e["blob"]][1] == "blob", e["path"]
        assert int(sizes[e["blob"]][2]) == e["bytes"], e["path"]
