"""Retries and refusals leave no trace (issue 39, part B): a retried ``query --audit N`` (same
N, model and labels) never draws a second audit, ``--again`` draws one deliberately; refused
``train``/``query`` commands record no file stamps."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import eada
from eada.cli import main
from eada.store import Project
from support import flat as _flat
from support import toy_project

sys.path.insert(0, str(Path(__file__).parent))
from test_store_inputs import _images, _rows


def test_a_retried_audit_is_not_drawn_twice_again_draws_another(tmp_path: Path, capsys) -> None:
    proj = toy_project(tmp_path, 5)
    s = ["--store", str(proj.folder)]
    proj.close()
    assert main(["query", *s, "--audit", "4"]) == 0
    first = sorted(r["sample_id"] for r in _rows(Project(proj.folder), 2))
    capsys.readouterr()
    # the command finished (files and all) but its output was lost: the user runs it again
    assert main(["query", *s, "--audit", "4"]) == 0
    out = _flat(capsys.readouterr().out)
    assert "was drawn already with the same model and labels" in out and "--again" in out
    p = Project(proj.folder)
    assert len(p.store.audit_rounds()) == 1
    assert sorted(r["sample_id"] for r in _rows(p, 2)) == first
    p.close()
    assert main(["query", *s, "--audit", "3"]) == 0  # another request (N): a new audit
    assert main(["query", *s, "--audit", "3", "--again"]) == 0  # deliberately another
    p = Project(proj.folder)
    assert len(p.store.audit_rounds()) == 3
    assert not {r["sample_id"] for r in _rows(p, 4)} & {r["sample_id"] for r in _rows(p, 3)}
    p.close()
    capsys.readouterr()
    assert main(["query", *s, "--again"]) == 2
    assert "--again draws another audit: give it with --audit N" in capsys.readouterr().err


def test_refused_train_and_query_record_no_file_stamps(tmp_path: Path, capsys) -> None:
    _images(tmp_path / "src", 4, 0)
    _images(tmp_path / "tgt", 4, 1)
    s = ["--store", str(tmp_path / "P")]
    sets = ["train.epochs=4", "active.rounds_at=[1,2]", "active.budget_per_round=3"]
    args = ["--source-dir", str(tmp_path / "src"), "--target-dir", str(tmp_path / "tgt")]
    assert main(["init", *s, *args, *[w for k in sets for w in ("--set", k)]]) == 0
    assert main(["train", *s]) == 0 and main(["query", *s]) == 0
    p = Project(tmp_path / "P")
    rows = _rows(p)
    recs = [{"sample_id": r["sample_id"], "label": Path(r["path"]).parent.name} for r in rows]
    eada.import_labels(p, recs, annotator="ann")
    p.close()
    assert main(["train", *s]) == 0  # stamps of the labeled files recorded

    def stamps() -> dict[str, list[int]]:
        q = Project(tmp_path / "P")
        try:
            return json.loads(q.store.get_meta("file_stamps") or "{}")
        finally:
            q.close()

    before = stamps()
    assert len(before) == 3
    victim = Path(rows[0]["path"])
    st = victim.stat()
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched, same pixels
    capsys.readouterr()
    for cmd in (["train", *s, "--epochs", "0"], ["query", *s, "--audit", "100000"]):
        assert main(cmd) == 2, cmd
        assert stamps() == before, cmd
    assert main(["train", *s, "--epochs", "1"]) == 0  # a command that runs records them
    after = stamps()
    assert after != before and after[rows[0]["sample_id"]][1] == st.st_mtime_ns + 10**9
