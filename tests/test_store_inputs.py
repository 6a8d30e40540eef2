"""Issue 30, without a server: the blind audit (no model guess in its files, marked; drawn while
a round is out; a retry after a kill re-exports instead of drawing again), the Label Studio
client's redirects (the token stays home), URLs checked, and every listed bad input a clear
`error:` line with exit 2 or the right behaviour (toy data: seconds)."""

from __future__ import annotations

import csv
import http.server
import json
import os
import threading
import warnings
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

import eada
from eada.cli import main
from eada.hparams import preset_config
from eada.store import Project, init_project
from eada.store.labelstudio import LabelStudioClient, LabelStudioError
from support import flat as _flat
from support import toy_overrides, toy_project


def _error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert lines, err
    return _flat(err[err.index("error:") :])


@pytest.fixture
def proj(tmp_path: Path) -> Project:
    return toy_project(tmp_path, 5)


def _rows(p: Project, number: int = 1) -> list[dict[str, str]]:
    with open(p.folder / "exports" / f"round-{number:03d}.csv", newline="") as fh:
        return list(csv.DictReader(fh))


# -- the blind audit ---------------------------------------------------------------------------
def test_an_audit_is_blind_marked_drawn_while_a_round_is_out_and_never_drawn_twice(
    proj: Project, capsys
) -> None:
    s = ["--store", str(proj.folder)]
    pending = {int(r["sample_id"]) for r in _rows(proj)}
    assert main(["query", *s, "--audit", "6"]) == 0  # round 1 is still out for labeling
    out = _flat(capsys.readouterr().out)
    assert "minus the 5 samples round 1 has out for labeling" in out and "blind" in out
    rows = _rows(proj, 2)
    assert len(rows) == 6 and not {int(r["sample_id"]) for r in rows} & pending
    assert all(r["predicted"] == "" and r["score"] == "" and r["audit"] == "yes" for r in rows)
    assert "free_energy" not in rows[0]
    doc = json.loads((proj.folder / "exports" / "round-002.json").read_text())
    assert all(r["predicted"] is None and r["scores"] == {} for r in doc["samples"])
    tasks = json.loads((proj.folder / "exports" / "round-002.labelstudio.json").read_text())
    assert all(not t.get("predictions") and t["data"]["audit"] for t in tasks)
    assert "free_energy" not in tasks[0]["data"]
    # the store keeps the guesses: the estimate is computed from them
    p = Project(proj.folder)
    a = p.status()["audit"]["rounds"][0]
    assert a["excluded_pending"] == 5 and a["pool"] == len(p.store.samples("target")) - 5
    # killed after the round was recorded, before its files: the retry exports them
    for f in (proj.folder / "exports").glob("round-002*"):
        f.unlink()
    assert main(["query", *s, "--audit", "6"]) == 0
    assert "no second audit" in _flat(capsys.readouterr().out)
    p = Project(proj.folder)
    assert (
        len(p.store.audit_rounds()) == 1 and (proj.folder / "exports" / "round-002.csv").is_file()
    )


def test_the_ml_backend_gives_no_guess_for_an_audit_sample(proj: Project) -> None:
    from eada.store.serve import Backend

    proj.audit(3)
    audit_ids = sorted(proj.store.audit_sample_ids())
    other = int(_rows(proj)[0]["sample_id"])
    got = Backend(proj).predict(
        {"tasks": [{"data": {"sample_id": i}} for i in [*audit_ids, other]]}
    )["results"]
    assert [r["result"] for r in got[:3]] == [[], [], []] and got[3]["result"]


# -- the token stays home ----------------------------------------------------------------------
class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[str, str | None]]] = []
    target = ""

    def _answer(self) -> None:
        type(self).seen.append((self.command, self.headers.get("Authorization")))
        if self.path.startswith("/go"):
            self.send_response(302)
            self.send_header("Location", type(self).target + "/api/x")
            self.end_headers()
            return
        body = b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


def _server(handler: type) -> Any:
    srv = http.server.HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_redirects_never_carry_the_token_away_nor_turn_a_post_into_a_get() -> None:
    class Other(_Recorder):
        seen: ClassVar[list[tuple[str, str | None]]] = []

    class Home(_Recorder):
        seen: ClassVar[list[tuple[str, str | None]]] = []

    other, home = _server(Other), _server(Home)
    try:
        Home.target = f"http://127.0.0.1:{other.server_address[1]}"
        client = LabelStudioClient(f"http://127.0.0.1:{home.server_address[1]}", "secret")
        with pytest.raises(LabelStudioError, match="another origin"):
            client.request("GET", "/go")
        assert Other.seen == []  # nothing, token or not, reached the other host
        Home.target = f"http://127.0.0.1:{home.server_address[1]}"  # same origin
        assert client.request("GET", "/go") == {}
        assert Home.seen[-1] == ("GET", "Token secret")
        with pytest.raises(LabelStudioError, match="POST with a redirect"):
            client.request("POST", "/go", {"a": 1})
        assert [m for m, _ in Home.seen].count("POST") == 1  # never resent as a GET
    finally:
        other.shutdown()
        home.shutdown()


def test_a_url_that_is_not_http_host_port_is_named(proj: Project, capsys, monkeypatch) -> None:
    monkeypatch.setenv("LABEL_STUDIO_API_KEY", "x")
    code = main(["labelstudio", "connect", "--store", str(proj.folder), "--url", "not-a-url"])
    assert code == 2
    assert "expected http://HOST:PORT" in _error(capsys.readouterr().err)
    url = ["--url", "http://127.0.0.1:9"]
    assert (
        main(["labelstudio", "connect", "--store", str(proj.folder), *url, "--overlap", "0"]) == 2
    )
    assert "--overlap must be between 1 and 100" in _error(capsys.readouterr().err)


# -- label files that were accepted but wrong --------------------------------------------------
def test_label_files_that_were_accepted_wrongly_are_refused(
    proj: Project, tmp_path: Path, capsys
) -> None:
    s = ["--store", str(proj.folder)]
    rows = _rows(proj)
    ids = [int(r["sample_id"]) for r in rows]
    c0 = proj.classes[0]
    cases = {
        "twocols.csv": (f"sample_id,label,label\n{ids[0]},{c0},{c0}\n", "more than once"),
        "dupkeys.json": (
            f'[{{"sample_id": {ids[0]}, "label": "{c0}", "label": "{c0}"}}]',
            "more than once",
        ),
        "malformed.csv": (f'sample_id,label\n{ids[0]},"{c0}\n', "row 2"),
    }
    for name, (text, match) in cases.items():
        (tmp_path / name).write_text(text)
        assert main(["label", "import", str(tmp_path / name), *s]) == 2, name
        assert match in _error(capsys.readouterr().err), name
    # a folder and a named pipe are named as such, not "not found"
    (tmp_path / "dir.csv").mkdir()
    assert main(["label", "import", str(tmp_path / "dir.csv"), *s]) == 2
    assert "is a folder" in _error(capsys.readouterr().err)
    os.mkfifo(tmp_path / "pipe.csv")
    assert main(["label", "import", str(tmp_path / "pipe.csv"), *s]) == 2
    assert "not a regular file" in _error(capsys.readouterr().err)
    # empty or multi-line annotator names
    (tmp_path / "ok.csv").write_text(f"sample_id,label\n{ids[0]},{c0}\n")
    assert main(["label", "import", str(tmp_path / "ok.csv"), *s, "--annotator", ""]) == 2
    assert "may not be empty" in _error(capsys.readouterr().err)
    (tmp_path / "nl.csv").write_text(f'sample_id,label,annotator\n{ids[0]},{c0},"a\nb"\n')
    assert main(["label", "import", str(tmp_path / "nl.csv"), *s]) == 2
    assert "control character" in _error(capsys.readouterr().err)
    assert Project(proj.folder).status()["n_labeled"] == 0
    # skip = false / 0 / no is not a skip; true is one
    recs = [
        {"sample_id": ids[0], "label": c0, "skip": "false"},
        {"sample_id": ids[1], "label": c0, "skip": "0"},
        {"sample_id": ids[2], "label": c0, "skip": "no"},
        {"sample_id": ids[3], "skip": "true"},
    ]
    out = eada.import_labels(proj, recs, annotator="ann")
    assert (out["new"], out["skipped"]) == (3, 1)
    assert proj.status()["skipped_by_reason"] == {"skipped": 1}


def _feature_project(tmp_path: Path, target_extra: dict[str, Any] | None = None) -> Path:
    """A feature-row project: a labeled source, an unlabeled target with ids ``u0``..."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 6)).astype(np.float32)
    np.savez(tmp_path / "src.npz", fts=x, labels=np.arange(40) % 2)
    tgt = tmp_path / "tgt.npz"
    np.savez(tgt, fts=x + 0.1, ids=np.array([f"u{i}" for i in range(40)]))
    raw = {
        "data": {"kind": "features", "source": str(tmp_path / "src.npz"), "target": str(tgt)},
        "model": {"name": "mlp", "hidden": [8]},
        "train": {"epochs": 2, "batch_size": 16},
        "active": {"rounds_at": [1], "budget_per_round": 4},
    }
    (tmp_path / "F.yaml").write_text(json.dumps(raw))
    return tmp_path / "F.yaml"


def test_an_external_id_naming_another_sample_is_refused(tmp_path: Path) -> None:
    """Feature rows with the user's own ids: a row whose sample_id and external_id name two
    different samples is refused (the external id was ignored before)."""
    cfg = _feature_project(tmp_path)
    s = ["--store", str(tmp_path / "P")]
    assert main(["init", *s, "--config", str(cfg)]) == 0
    assert main(["train", *s]) == 0 and main(["query", *s]) == 0
    p = Project(tmp_path / "P")
    rows = _rows(p)
    a, b = rows[0], rows[1]
    with pytest.raises(ValueError, match=f"external_id '{b['external_id']}' names sample"):
        eada.import_labels(
            p, [{"sample_id": a["sample_id"], "external_id": b["external_id"], "label": "0"}]
        )
    assert p.status()["n_labeled"] == 0


# -- feature files, epochs, --out --------------------------------------------------------------
def _one_error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err and "Warning" not in err, err
    return lines[0]


def test_bad_feature_files_are_named(tmp_path: Path, capsys) -> None:
    import scipy.io

    cfg = _feature_project(tmp_path)
    good = (tmp_path / "tgt.npz").read_bytes()
    x = np.zeros((8, 6), np.float32)
    (tmp_path / "cut.npz").write_bytes(good[: len(good) // 2])
    np.savez(tmp_path / "obj.npz", fts=x, ids=np.array([f"u{i}" for i in range(8)], dtype=object))
    scipy.io.savemat(tmp_path / "m.mat", {"fts": x})
    mat = (tmp_path / "m.mat").read_bytes()
    (tmp_path / "cut.mat").write_bytes(mat[: len(mat) // 2])
    np.savez(tmp_path / "empty.npz", fts=np.zeros((0, 6), np.float32))
    raw = json.loads(cfg.read_text())
    for name, match in (
        ("cut.npz", "truncated or damaged"),
        ("obj.npz", "object array"),
        ("cut.mat", "truncated or damaged"),
        ("empty.npz", "is empty"),
        ("empty.npz+zscore", "is empty"),  # no numpy warning before the error
    ):
        name, _, norm = name.partition("+")
        raw["data"]["normalize"] = norm or "none"
        raw["data"]["target"] = str(tmp_path / name)
        cfg.write_text(json.dumps(raw))
        store = str(tmp_path / f"P-{name}{norm}")
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            code = main(["init", "--store", store, "--config", str(cfg)])
        assert code == 2 and not [w for w in seen if issubclass(w.category, RuntimeWarning)]
        line = _one_error(capsys.readouterr().err)
        assert match in line and (name in line or match == "is empty"), line


def test_absurd_epochs_and_misleading_out_paths(proj: Project, tmp_path: Path, capsys) -> None:
    s = ["--store", str(proj.folder)]
    before = proj.status()
    assert main(["train", *s, "--epochs", "99999999999999999999"]) == 2
    assert "more than 1,000,000 epochs" in _one_error(capsys.readouterr().err)
    assert Project(proj.folder).status() == before  # not an epoch trained
    assert main(["export", *s, "--out", "/etc/hostname/sub"]) == 2
    assert "its parent /etc/hostname is a file" in _one_error(capsys.readouterr().err)
    assert main(["report", str(proj.folder), "--out", str(tmp_path)]) == 2
    line = _one_error(capsys.readouterr().err)
    assert str(tmp_path) in line and "is a folder" in line and ".tmp" not in line


def test_store_paths_with_spaces_are_quoted_in_printed_commands(tmp_path: Path, capsys) -> None:
    store = tmp_path / "my project"
    cfg = preset_config("toy", "eada", 0, toy_overrides())
    init_project(store, cfg)
    assert main(["status", "--store", str(store)]) == 0
    out = capsys.readouterr().out
    assert f"next: eada train --store '{store}'" in out
    p = Project(store)
    p.train()
    assert main(["query", "--store", str(store)]) == 0
    out = capsys.readouterr().out
    assert f"next: eada label import '{store}/exports/round-001.csv' --store '{store}'" in out


# -- image files: changed, corrupt, linked out ---------------------------------------------------
def _images(folder: Path, n: int, seed: int, classes: tuple[str, ...] = ("a", "b")) -> None:
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c in classes:
        (folder / c).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            px = (rng.random((16, 16, 3)) * 255).astype("uint8")
            Image.fromarray(px).save(folder / c / f"{c}{i}.png")


def test_a_labeled_image_replaced_under_its_name_stops_train_and_query(
    tmp_path: Path, capsys
) -> None:
    from PIL import Image

    _images(tmp_path / "src", 6, 0)
    _images(tmp_path / "tgt", 6, 1)
    s = ["--store", str(tmp_path / "P")]
    common = ["--set", "train.epochs=3", "--set", "active.rounds_at=[1,2]"]
    assert (
        main(
            [
                "init",
                *s,
                "--source-dir",
                str(tmp_path / "src"),
                "--target-dir",
                str(tmp_path / "tgt"),
                *common,
                "--set",
                "active.budget_per_round=3",
            ]
        )
        == 0
    )
    assert main(["train", *s]) == 0 and main(["query", *s]) == 0
    p = Project(tmp_path / "P")
    rows = _rows(p)
    recs = [{"sample_id": r["sample_id"], "label": Path(r["path"]).parent.name} for r in rows]
    eada.import_labels(p, recs, annotator="ann")
    assert main(["train", *s]) == 0  # unchanged files: a stat each, trains
    capsys.readouterr()
    victim = Path(rows[0]["path"])
    Image.fromarray(np.zeros((16, 16, 3), "uint8")).save(victim)  # another photo, same name
    for cmd in (["train", *s], ["query", *s]):
        assert main(cmd) == 2
        line = _one_error(capsys.readouterr().err)
        assert "1 labeled image(s) changed" in line and str(victim) in line


def test_every_corrupt_image_is_named_and_a_link_out_does_not_block_a_scan(
    tmp_path: Path, capsys
) -> None:
    _images(tmp_path / "src", 4, 0)
    _images(tmp_path / "tgt", 4, 1)
    (tmp_path / "tgt" / "a" / "bad1.png").write_text("junk")
    (tmp_path / "tgt" / "b" / "bad2.png").write_text("junk")
    s = ["--store", str(tmp_path / "P")]
    args = ["--source-dir", str(tmp_path / "src"), "--target-dir", str(tmp_path / "tgt")]
    assert main(["init", *s, *args]) == 2
    err = capsys.readouterr().err
    assert "2 corrupt or unreadable image(s)" in err and "bad1.png" in err and "bad2.png" in err
    # an unlabeled flat target grows: a link to a file outside the roots is left out and named,
    # the good new file is registered
    flat = tmp_path / "flat"
    flat.mkdir()
    for i, f in enumerate(sorted((tmp_path / "src" / "a").iterdir())):
        (flat / f"t{i}.png").write_bytes(f.read_bytes())
    _images(tmp_path / "src2", 4, 2)
    args = ["--source-dir", str(tmp_path / "src2"), "--target-dir", str(flat)]
    sets = ["active.budget_per_round=1", "active.rounds_at=[1]", "train.epochs=2"]
    assert main(["init", *s, *args, *[w for k in sets for w in ("--set", k)]]) == 0
    secret = tmp_path / "secret.png"
    secret.write_bytes((flat / "t0.png").read_bytes())
    (flat / "evil.png").symlink_to(secret)
    (flat / "new.png").write_bytes((tmp_path / "src" / "b" / "b0.png").read_bytes())
    capsys.readouterr()
    assert main(["target", "scan", *s]) == 0
    out = _flat(capsys.readouterr().out)
    assert "1 new file(s) registered" in out
    assert f"{flat / 'evil.png'} is a link to {secret}" in out


def test_report_says_when_a_runs_data_changed_since_it_ran(tmp_path: Path, capsys) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 6)).astype(np.float32)
    np.savez(tmp_path / "src.npz", fts=x, labels=np.arange(40) % 2)
    np.savez(tmp_path / "tgt.npz", fts=x + 0.1, labels=np.arange(40) % 2)
    raw = {
        "name": "changed",
        "data": {
            "kind": "features",
            "source": str(tmp_path / "src.npz"),
            "target": str(tmp_path / "tgt.npz"),
        },
        "model": {"name": "mlp", "hidden": [8]},
        "train": {"epochs": 2, "batch_size": 16},
        "active": {"rounds_at": [1], "budget_per_round": 4},
    }
    (tmp_path / "R.yaml").write_text(json.dumps(raw))
    out = tmp_path / "run"
    assert main(["run", str(tmp_path / "R.yaml"), "--out", str(out), "--threads", "1"]) == 0
    assert main(["report", str(out)]) == 0
    assert "the data changed" not in capsys.readouterr().err
    np.savez(tmp_path / "tgt.npz", fts=x - 0.1, labels=np.arange(40) % 2)  # other data
    assert main(["report", str(out)]) == 0
    err = _flat(capsys.readouterr().err)
    assert "note: the data changed since the run" in err and "tgt.npz" in err
    assert "The data changed since these runs ran" in (out / "report.html").read_text()


def test_one_annotators_newest_label_studio_annotation_counts(
    proj: Project, tmp_path: Path
) -> None:
    """alice skips a task, then labels it: her newest annotation is her answer (not a
    refused import); bob's agreeing label makes it agreed."""
    sid = int(_rows(proj)[0]["sample_id"])
    c0 = proj.classes[0]
    choice = [{"type": "choices", "from_name": "label", "value": {"choices": [c0]}}]
    task = {
        "id": 41,
        "data": {"sample_id": sid},
        "annotations": [
            {
                "id": 2,
                "result": choice,
                "completed_by": {"email": "alice"},
                "updated_at": "2026-01-02T00:00:00Z",
            },
            {
                "id": 1,
                "result": [],
                "was_cancelled": True,
                "completed_by": {"email": "alice"},
                "updated_at": "2026-01-01T00:00:00Z",
            },
            {
                "id": 3,
                "result": choice,
                "completed_by": {"email": "bob"},
                "updated_at": "2026-01-03T00:00:00Z",
            },
        ],
    }
    (tmp_path / "ls.json").write_text(json.dumps([task]))
    out = proj.import_labels(tmp_path / "ls.json")
    assert out["new"] == 1 and out["disputes"] == []
    assert proj.status()["agreement"][0]["agree"] == 1
