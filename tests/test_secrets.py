"""Secrets never printed: a hostile HTTP server on 127.0.0.1 (a real server thread, started
here) reflects the ``Authorization`` header in its 401/403/500 bodies, in JSON, URL-encoded
and across the 400th character; the ``eada`` error line and the error log never show the
token. A token holding CR/LF, and a ``--url`` holding a password, are refused without being
echoed (toy project)."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from eada.cli import main
from eada.errors import report_error
from eada.hparams import preset_config
from eada.store import init_project
from eada.store import labelstudio as ls

TOKEN = "s3cr3t-f00dcafe-0123456789abcdef"
SMALL = ["data.n_per_class=20", "train.epochs=2", "active.rounds_at=[1]"]


class _Reflector(BaseHTTPRequestHandler):
    """Answers every request with the status in the path (``/api/...`` -> 401) and a body
    that repeats the Authorization header it got, raw, JSON-escaped and URL-encoded, with
    padding that puts one copy across the 400th character."""

    def _answer(self) -> None:
        auth = self.headers.get("Authorization", "")
        length = int(self.headers.get("Content-Length") or 0)
        body_in = self.rfile.read(length).decode("utf-8", "replace") if length else ""
        code = 403 if "forbidden" in self.path else 500 if "boom" in self.path else 401
        text = (
            "x" * (390 - len("Token "))
            + auth  # a copy across character 400
            + f" | got: {auth} | json: {json.dumps({'header': auth})}"
            + f" | url: {urllib.parse.quote(auth, safe='')} | body: {body_in}"
        )
        data = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PATCH = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Reflector)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(10)


def test_a_reflected_token_is_never_printed(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv(ls.TOKEN_ENV, TOKEN)
    monkeypatch.setenv("EADA_LOG_DIR", str(tmp_path / "logs"))
    proj = init_project(tmp_path / "p", preset_config("toy", "eada", 0, SMALL))
    proj.close()
    code = main(["labelstudio", "connect", "--store", str(tmp_path / "p"), "--url", server])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: Label Studio POST") and "HTTP 401" in err
    assert "[hidden]" in err  # the body is shown, with the token out of it
    assert TOKEN not in err and TOKEN[:12] not in err and "f00dcafe" not in err
    client = ls.LabelStudioClient(server, TOKEN)
    for path in ("/api/projects/", "/forbidden/", "/boom/"):
        with pytest.raises(ls.LabelStudioError) as got:
            client.request("POST", path, {"note": f"the body holds it too: {TOKEN}"})
        text = str(got.value)
        assert "[hidden]" in text and "f00dcafe" not in text, text
    # a bug's message and its log hide it too
    said: list[str] = []
    code = report_error(KeyError(f"Token {TOKEN}"), said.append, ["x", f"--token={TOKEN}"])
    assert code == 1 and "f00dcafe" not in said[0]
    logs = list((tmp_path / "logs").iterdir())
    assert logs and all("f00dcafe" not in f.read_text() for f in logs)


@pytest.mark.parametrize("bad", [TOKEN + "\r\nX-Evil: 1", "abc\ndef" + TOKEN, TOKEN + " x"])
def test_a_token_with_control_characters_is_refused_unechoed(
    bad: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv(ls.TOKEN_ENV, bad)
    with pytest.raises(ls.LabelStudioError) as got:
        ls.LabelStudioClient("http://127.0.0.1:9")
    text = str(got.value)
    assert "position" in text and "f00dcafe" not in text and "X-Evil" not in text, text
    assert ls.LabelStudioClient("http://127.0.0.1:9", f"  {TOKEN}\n").token == TOKEN


def test_a_url_with_credentials_is_refused_unechoed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv(ls.TOKEN_ENV, TOKEN)
    monkeypatch.setenv("EADA_LOG_DIR", str(tmp_path / "logs"))
    proj = init_project(tmp_path / "p", preset_config("toy", "eada", 0, SMALL))
    proj.close()
    for url in (
        "http://user:PASSWORD1234@127.0.0.1:9",
        "http://PASSWORD1234@127.0.0.1:9",
        "http://user:PASSWORD1234@127.0.0.1:bad",
    ):
        code = main(["labelstudio", "connect", "--store", str(tmp_path / "p"), "--url", url])
        err = capsys.readouterr().err
        assert code == 2 and "PASSWORD1234" not in err and "user:" not in err, err
        assert "no user name or password" in err and "--url http://127.0.0.1:" in err
    assert ls.scrub(f"GET http://u:PASSWORD1234@h/x {TOKEN}") == "GET http://[hidden]@h/x [hidden]"


def _encodings(token: str) -> list[tuple[str, str]]:
    """One row a way an error body may carry the token: (name, the text)."""
    import base64
    import html

    header = f"Token {token}"
    return [
        ("base64 of the token", base64.b64encode(token.encode()).decode()),
        ("base64 of the header", base64.b64encode(header.encode()).decode()),
        (
            "base64 inside a longer text",
            base64.b64encode(b"Authorization: " + header.encode()).decode(),
        ),
        ("URL-safe base64", base64.urlsafe_b64encode(b"xy" + token.encode()).decode()),
        ("hex", token.encode().hex()),
        ("upper-case hex", token.encode().hex().upper()),
        ("upper-case", token.upper()),
        ("reversed", token[::-1]),
        ("HTML decimal entities", "".join(f"&#{ord(c)};" for c in token)),
        ("HTML hex entities", "".join(f"&#x{ord(c):x};" for c in token)),
        ("HTML-escaped", html.escape(header)),
        ("letter-spaced", " ".join(token)),
        ("dash-spaced", "-".join(token)),
        ("tagged letters", "".join(f"<b>{c}</b>" for c in token)),
        ("URL-encoded header", urllib.parse.quote(header, safe="")),
    ]


@pytest.mark.parametrize(("name", "text"), _encodings(TOKEN))
def test_every_encoding_of_the_token_is_hidden(
    name: str, text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ls.TOKEN_ENV, TOKEN)
    shown = ls.scrub(f"error: {text} end")
    assert "[hidden]" in shown, (name, shown)
    for part in ("f00dcafe", "F00DCAFE", "efacd00f", "0123456789", TOKEN.encode().hex()[8:30]):
        assert part.lower() not in shown.lower(), (name, shown)


def test_a_short_token_in_an_echoed_header_is_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ls.TOKEN_ENV, "abc")
    assert "abc" not in ls.scrub("got Token%20abc and Token abc and Bearer abc.")
    assert ls.scrub("expected abcd") == "expected abcd"  # a short one is no part of a word


class _Hostile(BaseHTTPRequestHandler):
    """Bodies too large, too slow, or of the wrong shape, by path."""

    def _answer(self) -> None:
        if self.path.startswith("/api/token/refresh"):
            body = json.dumps({"access": "eyJhbGciOiJIUzI1NiJ9.e30.sig-refreshed"}).encode()
            self._send(200, body)
        elif "big" in self.path:
            self._send(200 if "ok" in self.path else 401, b"[" + b"1," * 600_000 + b"1]")
        elif "slow" in self.path:
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            for _ in range(100):
                try:
                    self.wfile.write(b" ")
                    self.wfile.flush()
                except OSError:  # the client gave up at its deadline, as it should
                    return
                threading.Event().wait(0.2)
        elif self.path.startswith("/api/projects/") and self.command == "POST":
            self._send(200, b"[]")  # a list where a project belongs
        elif self.path.startswith("/api/users/"):
            self._send(200, b"[]")
        elif "export" in self.path:
            self._send(200, json.dumps([{"id": 1, "annotations": "abc"}]).encode())
        else:
            self._send(401, b'{"detail": "no"}')  # a second 401 on the refreshed token

    def _send(self, code: int, body: bytes) -> None:
        try:
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the client stopped reading, as it should
            pass

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


def test_hostile_answers_are_bounded_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One row a hostile answer: the client's error (never a traceback, never unbounded)."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    legacy = ls.LabelStudioClient(url, "0123456789abcdef", max_bytes=100_000, deadline=2.0)
    jwt = "eyJhbGciOiJIUzI1NiJ9.e30.sig"  # a refresh token: exchanged for an access token
    try:
        cases = [
            (legacy, "GET", "/big/ok", "larger than 100,000 bytes"),
            (legacy, "GET", "/big/401", "HTTP 401"),  # its body cut, not read whole
            (legacy, "GET", "/slow/", "within 2 s"),
            (ls.LabelStudioClient(url, jwt), "GET", "/api/projects/1/", "freshly refreshed"),
        ]
        for client, method, path, says in cases:
            with pytest.raises(ls.LabelStudioError, match=says):
                client.request(method, path)
        proj = init_project(tmp_path / "p", preset_config("toy", "eada", 0, SMALL))
        monkeypatch.setenv(ls.TOKEN_ENV, "0123456789abcdef")
        with pytest.raises(ls.LabelStudioError, match="the answer is not a project"):
            ls.connect(proj, url)
        ls_meta = {"url": url, "project": 1, "storages": [], "pushed": []}
        proj.store.set_meta("labelstudio", json.dumps(ls_meta))
        with pytest.raises(ls.LabelStudioError, match="annotations are not a list"):
            ls.fetch_tasks(proj, legacy)
        proj.close()
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(10)
