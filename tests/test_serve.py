"""``eada serve`` (Label Studio's ML-backend protocol) on a toy project, without Label Studio:
the routes answer, /predict gives the latest checkpoint's class and probability for eada
tasks and an empty result for others, /webhook ignores what it cannot act on, bad requests get
HTTP 400 (seconds; the live test registers the server in a real Label Studio)."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from eada.hparams import preset_config
from eada.store import Project, init_project
from eada.store.exports import final_predictions
from eada.store.serve import make_server

TOY = [
    "data.n_per_class=60",
    "train.epochs=3",
    "active.rounds_at=[1,2]",
    "active.budget_per_round=5",
]


def _call(url: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_ml_backend_routes(tmp_path: Path) -> None:
    p = init_project(tmp_path / "p", preset_config("toy", "eada", 0, TOY))
    p.train()
    p.close()
    box: dict[str, Any] = {}
    ready = threading.Event()

    def run() -> None:  # the store is opened in the serving thread (SQLite's rule)
        box["server"] = make_server(Project(tmp_path / "p"), "127.0.0.1", 0)
        ready.set()
        box["server"].serve_forever()

    threading.Thread(target=run, daemon=True).start()
    assert ready.wait(60)
    url = f"http://127.0.0.1:{box['server'].server_address[1]}"
    try:
        proj = Project(tmp_path / "p")
        ck = proj.store.latest_checkpoint()
        version = f"eada-checkpoint-{ck['id']}"
        assert _call(url + "/health") == (
            200,
            {"status": "UP", "model_class": "eada", "model_version": version},
        )
        assert _call(url + "/setup", {"project": "1"}) == (200, {"model_version": version})
        rows = final_predictions(proj, proj.load_checkpoint(ck)["model"])[:3]
        tasks = [{"id": i, "data": {"sample_id": r["sample_id"]}} for i, r in enumerate(rows)]
        code, out = _call(url + "/predict", {"tasks": [*tasks, {"id": 9, "data": {"x": 1}}]})
        assert code == 200 and len(out["results"]) == 4
        for r, res in zip(rows, out["results"], strict=False):
            assert res["result"][0]["value"]["choices"] == [r["predicted"]]
            assert res["result"][0]["from_name"] == "label" and res["score"] == r["score"]
        assert out["results"][3]["result"] == []  # not an eada task
        assert _call(url + "/webhook", {"action": "ANNOTATION_CREATED"})[1]["status"] == "ignored"
        code, out = _call(url + "/predict", {"no": "tasks"})
        assert code == 400 and "'tasks' list" in out["error"]
        assert _call(url + "/nowhere")[0] == 404
    finally:
        box["server"].shutdown()
        box["server"].server_close()


def test_predict_on_an_untrained_store(tmp_path: Path) -> None:
    from eada.store.serve import Backend

    p = init_project(tmp_path / "p", preset_config("toy", "eada", 0, TOY))
    b = Backend(p)
    assert b.model_version() == "eada-untrained"
    assert b.predict({"tasks": [{"data": {"sample_id": 1}}]}) == {
        "results": [{"model_version": "eada-untrained", "result": []}]
    }


def test_label_studio_errors_are_one_line_exit_2(tmp_path: Path, monkeypatch, capsys) -> None:
    """No token, an unreachable server, a store never connected: one `error:` line, exit 2,
    nothing recorded."""
    from eada.cli import main

    p = init_project(tmp_path / "p", preset_config("toy", "eada", 0, TOY))
    p.close()
    s = ["--store", str(tmp_path / "p")]
    monkeypatch.delenv("LABEL_STUDIO_API_KEY", raising=False)
    assert main(["labelstudio", "connect", *s, "--url", "http://127.0.0.1:9"]) == 2
    assert "set $LABEL_STUDIO_API_KEY" in capsys.readouterr().err
    monkeypatch.setenv("LABEL_STUDIO_API_KEY", "some-legacy-token")
    assert main(["labelstudio", "connect", *s, "--url", "http://127.0.0.1:9"]) == 2
    assert "cannot reach Label Studio at http://127.0.0.1:9" in capsys.readouterr().err
    assert main(["labelstudio", "pull", *s]) == 2
    err = capsys.readouterr().err
    assert "is not connected to Label Studio" in err and "eada labelstudio connect" in err
    assert Project(tmp_path / "p").store.get_meta("labelstudio") is None
