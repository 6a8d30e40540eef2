"""``eada demo`` says what its table shows: a line per surprising cell, from the run's numbers."""

from __future__ import annotations

import copy
import json
import statistics
from pathlib import Path
from typing import Any

import pytest

import eada.demo
from eada.cli import main
from eada.demo import demo_notes

REPO = Path(__file__).resolve().parents[1]
#: the committed ``eada demo --seeds 5 --out docs/demo`` record (seeds 0-4) of the original toy
#: (``--preset toy``, before the calibrated toy became the default)
RECORD = REPO / "docs" / "demo" / "toy-original" / "results.json"


def _record() -> dict[str, Any]:
    return json.loads(RECORD.read_text())


def _set_errors(results: dict[str, Any], name: str, errors: list[float]) -> None:
    s = results["strategies"][name]
    s["errors"] = errors
    s["mean_error"] = statistics.mean(errors)
    s["std_error"] = statistics.stdev(errors)


def test_the_committed_demo_explains_eada_behind_random() -> None:
    notes = demo_notes(_record())
    # EADA's mean is pulled up by seed 1's cold start, and the numbers are this run's
    assert notes[0] == (
        "EADA's mean (3.6) is pulled up by seed 1: 16.6 % error against 0.1-0.8 % on the other "
        "seeds; a cold start: before the first labels the model was wrong on 92 % of the target."
    )
    # the paired ablation fails on the same seed, so L_fea is not the cause
    assert any(n.startswith("EADA w/o L_fea fails on seed 1 too (13.3 %") for n in notes)
    # the inverted order against the paper, with the per-seed count (seed 3: both 0.2 %)
    assert (
        "EADA's mean error is above Random's (3.6 against 1.4; the paper: 1.0 against 8.5), yet "
        "EADA is below Random on 3 of 5 seeds (level on 1)." in notes
    )
    assert not any(n.startswith("Source-only") for n in notes)  # within its spread of 52.0
    # seed 2 started cold too (87 %) without being an outlier: the means split by start
    assert (
        "Seeds 1 and 2 started cold (92 % and 87 % of the target wrong before the first labels). "
        "Mean error there: Random 2.0, EADA 8.7; on the other seeds: Random 1.0, EADA 0.1." in notes
    )


def test_the_notes_follow_the_numbers_not_a_fixed_text() -> None:
    r = _record()
    _set_errors(r, "eada", [0.1, 0.4, 0.8, 0.2, 0.1])  # no cold start on seed 1
    notes = demo_notes(r)
    assert not any(n.startswith("EADA's mean") for n in notes)
    assert not any("above Random's" in n for n in notes)
    # the ablation still fails on seed 1, alone now
    assert any(n.startswith("EADA w/o L_fea's mean (2.9) is pulled up by seed 1") for n in notes)
    assert not any(n.startswith("EADA w/o L_fea fails on seed 1 too") for n in notes)

    r = _record()
    _set_errors(r, "eada_no_fea", [0.1, 0.5, 0.8, 0.2, 0.1])  # the ablation does not fail
    notes = demo_notes(r)
    assert (
        "EADA w/o L_fea does not fail on seed 1 (0.5 % against EADA's 16.6 %): there the "
        "alignment loss costs EADA." in notes
    )

    r = _record()
    _set_errors(r, "random", [8.0, 9.0, 8.5, 8.7, 8.4])  # as the paper's Random
    assert not any(n.startswith("Random") or "Random's" in n for n in demo_notes(r))


def test_no_note_on_an_unremarkable_run_or_too_few_seeds() -> None:
    r = _record()
    _set_errors(r, "eada", [0.1, 0.4, 0.8, 0.2, 0.1])
    _set_errors(r, "eada_no_fea", [0.1, 0.5, 0.8, 0.2, 0.1])
    _set_errors(r, "random", [8.0, 9.0, 8.5, 8.7, 8.4])
    assert demo_notes(r) == []
    two = copy.deepcopy(_record())
    two["seeds"] = [0, 1]
    for s in two["strategies"].values():
        for key in ("errors", "round_errors"):
            s[key] = s[key][:2]
    # two seeds: no seed can be called an outlier (EADA 0.1 / 16.6 is just a spread)
    assert not any("pulled up" in n for n in demo_notes(two))


def test_eada_demo_prints_the_notes_below_its_table(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(eada.demo, "run_demo", lambda **kw: _record())
    assert main(["demo", "--seeds", "5", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    table_end = out.index("EADA w/o L_fea")  # the table's last row
    note = out.index("note: EADA's mean (3.6) is pulled up by seed 1: 16.6 % error")
    assert table_end < note < out.index("results: ")
    assert out.count("note: ") == len(demo_notes(_record())) == 6
