"""``eada report --compare``: per-task paired tests, Friedman, post-hoc tests, the Bayesian
signed-rank test and the critical-difference diagram (eada.reports.compare), on synthetic logs
with a known winner and a known tie, and on the committed leaderboard's records."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from eada.cli import main
from eada.reports import compare as cmp
from eada.runs import append_jsonl

REPO = Path(__file__).resolve().parents[1]
TASKS = [f"task{i}" for i in range(8)]


def _record(task: str, method: str, seed: int, acc: float, **config: Any) -> dict[str, Any]:
    return {
        "key": json.dumps([task, method, [], seed]),
        "task": task,
        "method": method,
        "variant": [],
        "seed": seed,
        "config": {"name": task, "seed": seed, "active": {"strategy": method}, **config},
        "final": {"target/accuracy": acc},
        "time_utc": "2026-11-28T00:00:00Z",
    }


def _synthetic(log: Path, seeds: int = 3) -> None:
    """8 tasks x 3 seeds: ``eada`` ~10 points above ``random`` on every task (the clear
    winner); ``margin`` is ``eada``'s own scores with the seeds rotated (a tie by
    construction: the same per-task mean, differences summing to zero)."""
    rng = np.random.default_rng(0)
    for i, task in enumerate(TASKS):
        base = 50.0 + 4 * i
        eada = [round(base + 10 + rng.normal(0, 0.5), 2) for _ in range(seeds)]
        rand = [round(base + rng.normal(0, 0.5), 2) for _ in range(seeds)]
        tie = eada[1:] + eada[:1]
        for s in range(seeds):
            append_jsonl(log, _record(task, "eada", s, eada[s]))
            append_jsonl(log, _record(task, "random", s, rand[s]))
            append_jsonl(log, _record(task, "margin", s, tie[s]))


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("grid")
    _synthetic(folder / "runs.jsonl")
    scores = cmp.load_scores([folder])
    return {"folder": folder, "result": cmp.compare(scores, bayes_samples=2000)}


def test_clear_winner_is_significant_and_tie_is_not(synthetic: dict[str, Any]) -> None:
    res = synthetic["result"]
    assert res["reference"] == "EADA"
    for task in TASKS:
        vs = res["tasks"][task]["vs_reference"]
        assert vs["Random"]["verdict"] == "worse" and vs["Random"]["p_holm"] < 0.05
        assert vs["BvSB"]["significant"] is False  # the tie (margin's label is BvSB)
        assert vs["BvSB"]["p"] == pytest.approx(1.0)  # mean difference 0 over the seeds
    across = res["across_tasks"]
    assert across["friedman"]["p_value"] < 0.05 and across["friedman"]["significant"]
    assert across["mean_ranks"]["Random"] == 3.0
    pairs = {(d["better"], d["worse"]) for d in across["significant_pairs"]}
    assert ("EADA", "Random") in pairs and ("BvSB", "Random") in pairs
    assert not {("EADA", "BvSB"), ("BvSB", "EADA")} & pairs  # the tie: not told apart
    assert across["wilcoxon_holm"]["p"]["EADA"]["BvSB"] == 1.0
    bayes = across["bayesian_signed_rank"]
    assert bayes["Random"]["verdict"] == "worse" and bayes["Random"]["p_worse"] > 0.95
    assert bayes["BvSB"]["verdict"] == "equivalent" and bayes["BvSB"]["p_rope"] > 0.95
    assert res["against_reference"]["Random"]["worse"] == TASKS
    md = cmp.comparison_markdown(res)
    assert "▼" in md and "Friedman" in md and "EADA > Random" in md


def test_report_compare_command_writes_json_markdown_and_diagram(
    synthetic: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "C"
    assert main(["report", "--compare", str(synthetic["folder"]), "--out", str(out)]) == 0
    res = json.loads((out / "comparison.json").read_text())
    assert 0 < res["across_tasks"]["friedman"]["p_value"] < 0.05
    assert (out / "comparison.md").read_text().startswith("**target/accuracy")
    assert (out / "cd_diagram.svg").read_bytes().lstrip().startswith(b"<?xml")
    assert (out / "cd_diagram.png").read_bytes()[:4] == b"\x89PNG"
    assert "Friedman p = " in capsys.readouterr().out
    # the same input gives the same files, byte for byte (baycomp's samples are seeded)
    again = tmp_path / "again"
    assert main(["report", "--compare", str(synthetic["folder"] / "runs.jsonl"), "--out",
                 str(again)]) == 0  # fmt: skip
    for name in ("comparison.md", "cd_diagram.svg", "cd_diagram.png"):
        assert (out / name).read_bytes() == (again / name).read_bytes(), name
    a, b = (json.loads((d / "comparison.json").read_text()) for d in (out, again))
    a.pop("sources"), b.pop("sources")
    assert a == b
    # OUT is a folder: the same command again replaces its files; never into its input
    assert main(["report", "--compare", str(synthetic["folder"]), "--out", str(out)]) == 0
    assert main(["report", "--compare", str(synthetic["folder"]), "--out",
                 str(synthetic["folder"] / "runs.jsonl")]) == 2  # fmt: skip


def test_bad_requests_are_one_line_errors(
    synthetic: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    g = str(synthetic["folder"])
    cases = [
        (["report", "--compare", g], "--compare needs --out"),
        (["report", "--compare", str(tmp_path / "nope"), "--out", str(tmp_path / "o")], "nope"),
        (["report", "--compare", g, "--out", str(tmp_path / "o"), "--reference", "las"],
         "reference 'las' is not among the rows"),
        (["report", "--compare", g, "--out", str(tmp_path / "o"), "--methods", "duc"],
         "no rows of duc"),
        (["report"], "give a RUN_DIR"),
    ]  # fmt: skip
    for argv, message in cases:
        assert main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv


def test_missing_stats_extra_names_it(
    synthetic: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "baycomp", None)  # import baycomp -> ImportError
    scores = cmp.load_scores([synthetic["folder"]])
    with pytest.raises(cmp.ComparisonError, match=r"stats extra \(baycomp.*eada\[stats\]"):
        cmp.compare(scores)


def test_few_seeds_missing_methods_and_tasks_are_reported(tmp_path: Path) -> None:
    log = tmp_path / "runs.jsonl"
    for i, task in enumerate(TASKS):
        for s in range(2):
            append_jsonl(log, _record(task, "eada", s, 70.0 + i + s))
            append_jsonl(log, _record(task, "random", s, 60.0 + i + 2 * s))
        append_jsonl(log, _record(task, "entropy", 0, 65.0 + i))  # one seed only
        if i < 2:
            append_jsonl(log, _record(task, "coreset", 0, 55.0))  # on 2 tasks of 8
    append_jsonl(log, _record("extra", "random", 0, 50.0))  # a task without the reference
    append_jsonl(log, _record("task1", "entropy", 1, float("nan")))  # diverged: written null
    append_jsonl(log, {**_record("task0", "eada", 0, 71.0), "time_utc": "2026-11-29T00:00:00Z"})
    res = cmp.compare(cmp.load_scores([log]), bayes_samples=500)
    t0 = res["tasks"]["task0"]["vs_reference"]
    assert t0["Entropy"]["p"] is None and "fewer than 2 paired seeds" in t0["Entropy"]["note"]
    assert res["tasks"]["task0"]["cells"]["EADA"]["seeds"] == {"0": 71.0, "1": 71.0}  # newest
    assert any("newest counts" in n for n in res["notes"])
    assert any("task1 / entropy / seed 1: None" in n for n in res["notes"])  # NaN: null
    assert res["tasks"]["task1"]["cells"]["Entropy"]["n"] == 1
    across = res["across_tasks"]
    assert set(across["rows"]) == {"EADA", "Random", "Entropy"}
    assert across["dropped_rows"]["CoreSet"].startswith("no value on task2")
    assert across["dropped_tasks"] == {"extra": "the reference has no value on it"}
    assert "CoreSet (no value on" in cmp.comparison_markdown(res)
    # only two rows left: no Friedman test, the Wilcoxon and Bayesian tests still run
    two = cmp.compare(cmp.load_scores([log]), methods=["eada", "random"], bayes_samples=500)
    assert two["across_tasks"]["friedman"]["p_value"] is None
    assert "needs 3 rows" in two["across_tasks"]["friedman"]["note"]
    assert "Random" in two["across_tasks"]["bayesian_signed_rank"]


def test_every_method_tied_everywhere_gives_p_one(tmp_path: Path) -> None:
    """2 tasks x 2 seeds x 3 methods, all at the same accuracy (tiny runs often are): scipy's
    Friedman statistic is 0/0 there; the comparison says p = 1 and still draws the diagram."""
    for task in ("T1", "T2"):
        for method in ("my_margin", "random", "eada"):
            for s in range(2):
                append_jsonl(tmp_path / "g" / "runs.jsonl", _record(task, method, s, 80.0))
    out = tmp_path / "C"
    assert main(["report", "--compare", str(tmp_path / "g"), "--out", str(out)]) == 0
    res = json.loads((out / "comparison.json").read_text())
    fr = res["across_tasks"]["friedman"]
    assert fr["p_value"] == 1.0 and not fr["significant"] and "tied" in fr["note"]
    assert res["tasks"]["T1"]["vs_reference"]["my_margin"]["note"].startswith("identical")
    assert (out / "cd_diagram.svg").is_file()


def _leaderboard() -> ModuleType:
    spec = importlib.util.spec_from_file_location("leaderboard", REPO / "benchmarks/leaderboard.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("leaderboard", mod)  # its dataclasses look their module up there
    spec.loader.exec_module(sys.modules["leaderboard"])
    return sys.modules["leaderboard"]


def test_committed_leaderboard_comparison_is_current() -> None:
    """The committed comparison is what the leaderboard's ``summary.json`` gives now (a re-run
    that changes a number fails this until ``benchmarks/leaderboard.py --compare`` is run);
    LAS and EADA (default) are not told apart by any test."""
    lb = _leaderboard()
    summary = json.loads((REPO / lb.OUT / "summary.json").read_text())
    committed = json.loads((REPO / lb.COMPARISON / "comparison.json").read_text())
    result = cmp.compare(lb.comparison_scores(summary), "EADA (default)")
    result["diagram"] = lb.CD_FIGURE.as_posix()
    assert json.loads(json.dumps(result)) == committed, (
        "stale: run python benchmarks/leaderboard.py --compare"
    )
    across = committed["across_tasks"]
    assert across["friedman"]["p_value"] < 0.05
    las = "LAS"
    assert across["wilcoxon_holm"]["p"][las]["EADA (default)"] > 0.05
    assert committed["across_tasks"]["bayesian_signed_rank"][las]["verdict"] != "better"
    assert (REPO / lb.CD_FIGURE).read_bytes().lstrip().startswith(b"<?xml")


def test_raw_leaderboard_logs_through_read_jsonl() -> None:
    """The committed leaderboard folder read as ``eada report --compare`` reads any grid: its
    compressed logs through eada.runs.read_jsonl, the two EADA rows told apart by their sweep,
    the SURF pairs (one YAML file) by their config's name."""
    scores = cmp.load_scores([REPO / "benchmarks/results/leaderboard"])
    assert len(scores.tasks) == 18 and "surf/A->C" in scores.tasks
    labels = [r.label for r in scores.rows]
    assert "LADA (LAS)" in labels and "CLUE" in labels
    # two EADA rows (the labels gate on 18 tasks, the confidence gate on the 12 SURF pairs):
    # the method names the one on the most tasks
    ref = next(x for x in labels if x.startswith("EADA (") and "labels" in x)
    res = cmp.compare(scores, "eada", methods=["eada", "las", "clue"], bayes_samples=500)
    assert res["reference"] == ref
    across = res["across_tasks"]
    assert across["friedman"]["p_value"] is not None
    assert {ref, "CLUE"} <= set(across["rows"])
    assert all(t in res["tasks"] for t in across["tasks"])


def test_holm_equals_statsmodels() -> None:
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(1)
    for m in (1, 2, 5, 17):
        p = list(rng.uniform(0, 0.2, m))
        assert cmp.holm(p) == pytest.approx(list(multipletests(p, method="holm")[1]))
