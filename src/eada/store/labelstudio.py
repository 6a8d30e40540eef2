"""A live Label Studio connection through its REST API (plain HTTP with the standard library:
no SDK and none of its version pins in eada's environment).

* :func:`connect` links a project store to a Label Studio project: it creates the project (or
  checks a given one) with the labeling config of the store's classes, and the Local Files
  storage that lets Label Studio serve the images (``/data/local-files/?d=...``);
* :func:`push_round` sends a query round as tasks: the image, the EADA scores as task data, and
  the model's predicted class with its score as a pre-annotation;
* :func:`pull` imports the submitted annotations (annotator = the Label Studio user's e-mail)
  and the skipped tasks as skips, through the store's one label write.

The connection (URL, project id, storages, pushed rounds) is kept in the store's ``meta``
table under ``labelstudio``; the access token never is: it is read from
``$LABEL_STUDIO_API_KEY`` each time. Both Label Studio token kinds work: a personal access
token (a JWT refresh token, exchanged for a short-lived access token) and a legacy API token.

Secrets are never printed: a server's error body is shown only after every occurrence of
the token and of the ``Authorization`` value is replaced (:func:`scrub`, before it is cut to
400 characters), the same goes for the ``eada`` error line and its log, a token holding a
control character (CR/LF) or a URL holding a user or password is refused without echoing
it (:func:`check_token`, :func:`check_url`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from eada.store import attention
from eada.store.db import how, now, q
from eada.store.labelfiles import (
    LS_FROM_NAME,
    label_studio_config,
    label_studio_tasks,
    model_version,
)
from eada.store.roots import NO_DOCUMENT_ROOT, label_studio_root, unsafe_document_root

TOKEN_ENV = "LABEL_STUDIO_API_KEY"
MAX_RESPONSE_BYTES = 512 * 2**20
"""The largest answer the client reads (a project's whole JSON export included)."""
MAX_ERROR_BYTES = 64 * 2**10
"""The most of an error's body read (400 characters of it are shown, scrubbed)."""
META_KEY = "labelstudio"


class LabelStudioError(ValueError):
    """Label Studio could not be reached, refused a request, or does not fit the store."""


HIDDEN = "[hidden]"
_SECRETS: set[str] = set()  # every token this process was given or received (scrub hides them)
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@]*@")


def scrub(text: str) -> str:
    """``text`` with every secret replaced by ``[hidden]``: the value of
    ``$LABEL_STUDIO_API_KEY`` (and its parts between control characters), every token a
    client of this process was given or received (so every ``Authorization`` value it
    sent), as they are and as JSON, URL-encoding or ``repr`` would write them (one shorter
    than 8 characters only as a whole word); and the ``user:password@`` of any URL.

    >>> scrub("see http://bob:pw@host:8080/x")
    'see http://[hidden]@host:8080/x'
    """
    found = set(_SECRETS)
    env = os.environ.get(TOKEN_ENV)
    if env:
        found |= {env, env.strip()}
        found |= {p for p in re.split(r"[\x00-\x20\x7f]+", env) if len(p) >= 6}
    forms: set[str] = set()
    for s in found:
        if s:
            forms |= {s, urllib.parse.quote(s, safe=""), json.dumps(s)[1:-1], repr(s)[1:-1]}
            forms |= _encoded_forms(s)
    for form in sorted(forms, key=len, reverse=True):  # the longest first: no part left over
        if len(form) >= 8:
            text = re.sub(re.escape(form), HIDDEN, text, flags=re.IGNORECASE)
        else:  # a short one only as a whole word: "x" must not mangle "expected"
            text = re.sub(rf"(?<!\w){re.escape(form)}(?!\w)", HIDDEN, text)
    for s in sorted(found, key=len, reverse=True):  # spelled out: HTML entities, spaced letters
        if len(s) >= 8:
            for each in (s, s[::-1]):
                text = re.sub(_spelled(each), HIDDEN, text, flags=re.IGNORECASE)
    text = _AUTH_VALUE.sub(lambda m: m.group(1) + HIDDEN, text)  # any token's place, any length
    return _USERINFO.sub(lambda m: m.group(1) + HIDDEN + "@", text)


_AUTH_VALUE = re.compile(
    r"\b((?:Token|Bearer)(?:\s|%20|\+|&#0*32;|&#x0*20;|\\u0020)+)[^\s\"'<>&,;]+"
)
"""An ``Authorization`` value as a server may echo it (``Token abc``, ``Token%20abc``,
``Bearer ...``, the header's own capitals): hidden whatever the token's length."""


def _encoded_forms(secret: str) -> set[str]:
    """What an error body may carry ``secret`` as: base64 (standard and URL-safe, at each of
    the three alignments inside a longer encoded text, and of the ``Authorization`` values),
    hexadecimal, reversed (matched without regard to case by :func:`scrub`)."""
    raw = secret.encode("utf-8", "surrogateescape")
    out = {secret[::-1], raw.hex()}
    for value in (raw, b"Token " + raw, b"Bearer " + raw):
        for k in range(3):  # the secret starting at each byte offset of a 3-byte group
            enc = base64.b64encode(b"\0" * k + value).decode()
            body = enc[(4 * k + 2) // 3 + (1 if k else 0) : -3]  # the chars only it decides
            for form in (body, body.replace("+", "-").replace("/", "_")):
                if len(form) >= 8:
                    out.add(form)
    return out


def _spelled(secret: str) -> str:
    """A pattern of ``secret`` written out a character at a time: each one as itself, an HTML
    numeric entity (``&#97;``, ``&#x61;``) or a %-escape, with any separators between them
    (``a b c``, ``a-b-c``, ``a</b>b``)."""
    sep = r"(?:\s|[-_.,:;|/\\*]|<[^>]{0,20}>|&nbsp;)*"
    parts = []
    for c in secret:
        n = ord(c)
        parts.append(rf"(?:{re.escape(c)}|&#0*{n};|&#x0*{n:x};|%{n:02x})")
    return sep.join(parts)


def check_token(token: str) -> str:
    """A Label Studio token without its surrounding whitespace, or an error that does not
    echo it: a token is printable ASCII with no space (a legacy hex token, a JWT), so a
    control character (a CR or LF would forge a header line), a space inside or a
    non-ASCII character is refused.

    Raises:
        LabelStudioError: naming the position of the character, never the token.

    >>> check_token("  abc123\\n")
    'abc123'
    """
    _SECRETS.add(token)
    value = token.strip()
    _SECRETS.add(value)
    if not value:
        raise LabelStudioError(f"${TOKEN_ENV} is empty (only whitespace): set it to the token")
    bad = next((i for i, c in enumerate(value) if not 0x21 <= ord(c) <= 0x7E), None)
    if bad is not None:
        kind = (
            "a control character (CR, LF, ...)"
            if ord(value[bad]) < 0x20
            else ("a space" if value[bad] == " " else "a character outside printable ASCII")
        )
        raise LabelStudioError(
            f"${TOKEN_ENV} holds {kind} at position {bad + 1} of {len(value)}, which no "
            "Label Studio token holds; it was not sent (and is not shown): set the variable "
            "to the token alone"
        )
    return value


def _is_jwt(token: str) -> bool:
    parts = token.split(".")
    if len(parts) != 3:
        return False
    try:
        head = json.loads(base64.urlsafe_b64decode(parts[0] + "=" * (-len(parts[0]) % 4)))
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(head, dict) and "alg" in head


class LabelStudioClient:
    """A minimal Label Studio REST client.

    Args:
        url: the server, e.g. ``http://127.0.0.1:8080``.
        token: a personal access token (JWT refresh token) or a legacy API token; default
            ``$LABEL_STUDIO_API_KEY``.
        timeout: seconds to wait for one read of the socket.
        deadline: seconds one request may take in all (a server trickling its answer a byte
            at a time is cut off then).
        max_bytes: the largest answer read (:data:`MAX_RESPONSE_BYTES`); an error's body is
            read only up to :data:`MAX_ERROR_BYTES`.

    Raises:
        LabelStudioError: no token given and ``$LABEL_STUDIO_API_KEY`` unset.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float = 60.0,
        deadline: float = 600.0,
        max_bytes: int = MAX_RESPONSE_BYTES,
    ) -> None:
        self.url = check_url(url)
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        if not token:
            raise LabelStudioError(
                f"set ${TOKEN_ENV} to a Label Studio access token (Account & Settings: a "
                "personal access token, or the legacy token where the organization allows it)"
            )
        self.token = check_token(token)
        self.timeout = timeout
        self.deadline = deadline
        self.max_bytes = max_bytes
        self._access: str | None = None

    def _auth(self, renew: bool = False) -> str:
        if not _is_jwt(self.token):
            return f"Token {self.token}"
        if self._access is None or renew:
            out = self._send("POST", "/api/token/refresh/", {"refresh": self.token}, auth=None)
            if not isinstance(out, dict) or "access" not in out:
                raise LabelStudioError(f"{self.url}: the token refresh returned no access token")
            self._access = check_token(str(out["access"]))
        return f"Bearer {self._access}"

    def request(
        self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None
    ) -> Any:
        """One API call; returns the decoded JSON (``None`` for an empty answer).

        Raises:
            LabelStudioError: the server is unreachable or answers an HTTP error (named with
                the method, the path, the status and the start of the server's message).
        """
        if params:
            path = f"{path}?{urllib.parse.urlencode(params)}"
        try:
            return self._send(method, path, body, self._auth())
        except _Unauthorized:
            pass  # the access token expired: renew it once
        try:
            return self._send(method, path, body, self._auth(renew=True))
        except _Unauthorized:
            raise LabelStudioError(
                f"Label Studio {method} {self.url}{path}: HTTP 401 with a freshly refreshed "
                f"access token (check ${TOKEN_ENV}: the token was refused)"
            ) from None

    def _send(self, method: str, path: str, body: Any, auth: str | None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if auth is not None:
            req.add_header("Authorization", auth)
        start = time.monotonic()
        try:
            with _OPENER.open(req, timeout=self.timeout) as resp:
                raw = self._read(resp, self.max_bytes, start, f"{method} {self.url}{path}")
        except _RedirectRefused as err:
            text = scrub(f"Label Studio {method} {self.url}{path}: {err}")
            raise LabelStudioError(text) from None
        except urllib.error.HTTPError as err:
            # every secret out BEFORE the cut: a token across the 400th character goes too
            try:  # at most MAX_ERROR_BYTES of it, then the connection is dropped
                body = self._read(err, MAX_ERROR_BYTES, start, "", cut=True)
            except (OSError, LabelStudioError):
                body = b""
            text = scrub(body.decode("utf-8", "replace"))[:400]
            if err.code == 401 and auth is not None and auth.startswith("Bearer "):
                raise _Unauthorized() from None
            hint = ""
            if err.code in (401, 403):
                hint = f" (check ${TOKEN_ENV}: the token was refused)"
            raise LabelStudioError(
                f"Label Studio {method} {self.url}{path}: HTTP {err.code}{hint}: {text}"
            ) from None
        except (urllib.error.URLError, OSError) as err:
            reason = scrub(str(getattr(err, "reason", err)))
            raise LabelStudioError(
                f"cannot reach Label Studio at {self.url} ({reason}); is it running there?"
            ) from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise LabelStudioError(
                f"Label Studio {method} {self.url}{path}: the answer is not JSON"
            ) from None

    def _read(self, resp: Any, limit: int, start: float, what: str, cut: bool = False) -> bytes:
        """The body of ``resp``, a read at a time (``read1``: whatever arrived), refused over
        ``limit`` bytes (``cut``: returned cut there) or past the request's deadline."""
        parts: list[bytes] = []
        size = 0
        read = getattr(resp, "read1", None) or resp.read
        while True:
            if time.monotonic() - start > self.deadline:
                raise LabelStudioError(
                    f"Label Studio {what}: no whole answer within {self.deadline:.0f} s (the "
                    "request's deadline); is the server overloaded?"
                )
            chunk = read(min(1 << 16, limit + 1 - size))
            if not chunk:
                return b"".join(parts)
            parts.append(chunk)
            size += len(chunk)
            if size > limit:
                if cut:
                    return b"".join(parts)[:limit]
                raise LabelStudioError(
                    f"Label Studio {what}: the answer is larger than {limit:,} bytes; not read "
                    "further"
                )


class _Unauthorized(Exception):
    """An expired access token (internal: renewed once)."""


class _RedirectRefused(urllib.error.URLError):
    """A redirect the client does not follow (internal: named in a LabelStudioError)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


def _origin(url: str) -> tuple[str, str, int | None]:
    u = urllib.parse.urlsplit(url)
    port = u.port or {"http": 80, "https": 443}.get(u.scheme)
    return u.scheme, (u.hostname or "").lower(), port


class _KeepTokenHome(urllib.request.HTTPRedirectHandler):
    """Redirects that never carry the token away: one to another scheme, host or port is
    refused (urllib would resend ``Authorization`` there), and any redirect of a request
    that is not a GET is an error (urllib would turn a POST into a GET and drop its body)."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: Any,
        code: int,
        msg: str,
        headers: Any,
        newurl: str,
    ) -> urllib.request.Request | None:
        method = req.get_method()
        if method not in ("GET", "HEAD"):
            raise _RedirectRefused(
                f"the server answered {method} with a redirect (HTTP {code}) to {newurl}; "
                "a redirected request is not resent: give --url the address Label Studio "
                "really serves (scheme, host and port)"
            )
        if _origin(newurl) != _origin(req.full_url):
            raise _RedirectRefused(
                f"the server redirects (HTTP {code}) to another origin, {newurl}; the access "
                "token is never sent there: give --url the address Label Studio really "
                "serves"
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENER = urllib.request.build_opener(_KeepTokenHome)


def check_url(url: str) -> str:
    """A Label Studio address ``http://HOST:PORT`` (or ``https://``), without a trailing
    slash.

    Raises:
        LabelStudioError: anything else, naming the form.

    >>> check_url("http://127.0.0.1:8080/")
    'http://127.0.0.1:8080'
    """
    u = urllib.parse.urlsplit(url.strip())
    if "@" in u.netloc:  # user:password@: refused, and never echoed
        host = u.netloc.rpartition("@")[2]
        raise LabelStudioError(
            f"--url {u.scheme}://{HIDDEN}@{host}: a Label Studio address holds no user name "
            f"or password (it is not sent, and not shown); the token goes in ${TOKEN_ENV}: "
            f"give --url {u.scheme}://{host}"
        )
    try:
        u.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        u = u._replace(netloc="")
    if u.scheme not in ("http", "https") or not u.hostname or u.query or u.fragment:
        raise LabelStudioError(
            f"--url {scrub(url)!r} is not a Label Studio address: expected http://HOST:PORT "
            "(e.g. http://127.0.0.1:8080)"
        )
    return url.strip().rstrip("/")


def connection(project: Any) -> dict[str, Any] | None:
    """The store's recorded Label Studio connection, or ``None`` when it has none."""
    raw = project.store.get_json(META_KEY)
    return raw if isinstance(raw, dict) else None


def client_for(project: Any, token: str | None = None) -> LabelStudioClient:
    """A client for the store's recorded connection.

    Raises:
        LabelStudioError: the store is not connected.
    """
    conn = connection(project)
    if conn is None:
        raise LabelStudioError(
            f"the project {project.folder} is not connected to Label Studio: run "
            f"`eada labelstudio connect --store {q(project.folder)} --url URL` first"
        )
    return LabelStudioClient(conn["url"], token)


def target_roots(project: Any) -> list[Path]:
    """The registered data roots that hold target image files (the only files Label Studio
    shows: source files never need serving), in registration order."""
    roots = [Path(r).resolve() for r in project.store.roots()]
    files = [Path(r["path"]) for r in project.store.samples("target") if r["path"]]
    used = []
    for root in roots:
        if any(root in f.parents for f in files):
            used.append(root)
    return used


def document_root_or_none(project: Any) -> Path | None:
    """The folder Label Studio serves the project's target files from:
    ``store.label_studio_root``, else the deepest folder holding every data root that holds
    target files (the source may live elsewhere); ``None`` where that would be ``/`` or a
    parent of a home folder. Label Studio never serves files lying directly in its document
    root (a storage must name a subfolder): where the target's files would, the derived root
    is the folder above."""
    option = project.options.label_studio_root
    root = label_studio_root(target_roots(project), option)
    if root is None or option is not None:
        return root
    files = [Path(r["path"]) for r in project.store.samples("target") if r["path"]]
    if any(f.parent == root for f in files):  # a file directly in it: Label Studio refuses
        up = root.parent
        return None if unsafe_document_root(up) is not None else up
    return root


def _document_root(project: Any) -> Path:
    """:func:`document_root_or_none`, required.

    Raises:
        LabelStudioError: no safe single folder (it would be ``/`` or a parent of a home
            folder): the message says to name one with ``eada labelstudio connect --root``.
    """
    root = document_root_or_none(project)
    if root is None:
        raise LabelStudioError(NO_DOCUMENT_ROOT)
    return root


def _storage_folders(project: Any, root: Path) -> list[Path]:
    """One folder a Local Files storage names for each data root holding target files: the
    root itself, or the deepest folder holding its target files where the root is the
    document root (Label Studio refuses the document root itself)."""
    files = [Path(r["path"]) for r in project.store.samples("target") if r["path"]]
    if not files:
        raise LabelStudioError(
            "the target has no image files (feature rows): Label Studio has nothing to show; "
            "use the exported round-NNN.labelstudio.json with its text stand-ins instead"
        )
    folders: list[Path] = []
    for data_root in target_roots(project) or [root]:
        mine = [f for f in files if data_root in f.parents]
        folder = data_root
        if folder == root or root not in folder.parents:
            folder = Path(os.path.commonpath([str(f.parent) for f in mine]))
        if folder == root or root not in folder.parents:
            raise LabelStudioError(
                f"the target images lie in {folder}, which must be a subfolder of the Label "
                f"Studio document root {root}: name a folder above it with `eada labelstudio "
                "connect --root DIR` (or `eada config set store.label_studio_root=DIR`), and "
                "start Label Studio with that folder as LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT"
            )
        if folder not in folders:
            folders.append(folder)
    return folders


def connect(
    project: Any,
    url: str,
    project_id: int | None = None,
    title: str | None = None,
    token: str | None = None,
    root: str | Path | None = None,
    overlap: int | None = None,
) -> dict[str, Any]:
    """Link ``project`` to a Label Studio project and push its rounds.

    Creates the Label Studio project (or uses ``project_id``, whose labeling config must offer
    every class of the store as a choice of the ``label`` control), adds a Local Files storage
    over the target images (Label Studio must run with
    ``LABEL_STUDIO_LOCAL_FILES_SERVING_ENABLED=true`` and
    ``LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT`` = the store's document root), records the
    connection and pushes every round not pushed yet.

    Connecting a connected store again to the same server and project only pushes the rounds
    not pushed yet (no task is sent twice).

    ``root``: the folder Label Studio serves files from (its
    ``LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT``), recorded as ``store.label_studio_root`` (it
    may change after init: source and target in two places need one that holds the target's
    folders). One Local Files storage is added for each data root holding target images.
    ``overlap``: how many annotators Label Studio asks for each task (``maximum_annotations``,
    every task in the overlap cohort), also set as ``store.answers_needed``: a sample counts
    as labeled once that many answers agree (or ``store.conflicts`` settles them); their
    disagreements become disputes on ``pull``.

    Returns:
        ``{"url", "project", "storage", "storages", "document_root", "overlap", "pushed":
        [round numbers pushed now], "already_pushed": [those pushed before],
        "answers_needed"}``.

    Raises:
        LabelStudioError: Label Studio unreachable, the token refused, a given project whose
            config lacks classes, or a storage Label Studio refuses (its reason is quoted).
    """
    project.store.check_writable()
    if overlap is not None and not 1 <= overlap <= 100:
        raise LabelStudioError(f"--overlap must be between 1 and 100 annotators, got {overlap}")
    client = LabelStudioClient(url, token)
    if root is not None:
        project.set_options({"label_studio_root": str(Path(root).absolute())})
    old = connection(project)
    same = old is not None and old["url"] == client.url and project_id in (None, old["project"])
    if same and root is None and overlap is None:
        assert old is not None
        client.request("GET", f"/api/projects/{old['project']}/")  # still there, token valid
        before = sorted(old.get("pushed", []))
        pushed = [push_round(project, n, client) for n in _unpushed(project)]
        sync_model_version(project, client)
        return {
            **old,
            "pushed": pushed,
            "already_pushed": before,
            "answers_needed": project.options.answers_needed,
        }
    images = any(r["path"] for r in project.store.samples("target"))
    doc_root = _document_root(project) if images else None  # feature rows: no files served
    folders = _storage_folders(project, doc_root) if doc_root is not None else []
    config = label_studio_config(project.classes, images)
    settings: dict[str, Any] = {}
    if overlap is not None:
        settings = {"maximum_annotations": overlap, "overlap_cohort_percentage": 100}
    if same:
        assert old is not None
        project_id = int(old["project"])
        if settings:
            client.request("PATCH", f"/api/projects/{project_id}/", settings)
    elif project_id is None:
        made = client.request(
            "POST",
            "/api/projects/",
            {"title": title or f"eada {project.folder.name}", "label_config": config, **settings},
        )
        if not isinstance(made, dict) or not isinstance(made.get("id"), int):
            raise LabelStudioError(
                f"Label Studio POST {client.url}/api/projects/: the answer is not a project "
                f"(expected a JSON object with an id, got {type(made).__name__}); is "
                f"{client.url} a Label Studio server?"
            )
        project_id = int(made["id"])
    else:
        got = client.request("GET", f"/api/projects/{project_id}/")
        if settings:
            client.request("PATCH", f"/api/projects/{project_id}/", settings)
        have = str(got.get("label_config", ""))
        missing = [c for c in project.classes if f'"{c}"' not in have and f"'{c}'" not in have]
        if f'name="{LS_FROM_NAME}"' not in have or missing:
            raise LabelStudioError(
                f"Label Studio project {project_id} does not label with a Choices control "
                f"named {LS_FROM_NAME!r} offering every class (missing: {missing[:8]}); use "
                f"{project.folder / 'exports' / 'labelstudio-config.xml'} as its labeling config"
                " or let `eada labelstudio connect` create the project"
            )
    storages = dict((old or {}).get("storage_paths") or {}) if same else {}
    for folder in folders:
        if str(folder) in storages:
            continue
        st = client.request(
            "POST",
            "/api/storages/localfiles/",
            {
                "project": project_id,
                "title": f"eada target images {folder.name}",
                "path": str(folder),
                "use_blob_urls": False,
            },
        )
        storages[str(folder)] = int(st["id"])
    conn: dict[str, Any] = {
        "url": client.url,
        "project": project_id,
        "storage": next(iter(storages.values()), None),
        "storages": list(storages.values()),
        "storage_paths": storages,
        "document_root": None if doc_root is None else str(doc_root),
        "overlap": overlap if overlap is not None else (old or {}).get("overlap"),
        "pushed": list((old or {}).get("pushed", [])) if same else [],
    }
    with project.store.transaction():  # rounds another process pushed meanwhile stay pushed
        now_conn = connection(project)
        if same and now_conn is not None:
            conn["pushed"] = sorted({*conn["pushed"], *now_conn.get("pushed", [])})
        project.store.set_meta(META_KEY, json.dumps(conn))
    if overlap is not None and overlap != project.options.answers_needed:
        project.set_options({"answers_needed": overlap})  # a sample counts once N agree
    before = sorted(conn["pushed"])
    pushed = [push_round(project, n, client) for n in _unpushed(project)]
    return {
        **conn,
        "pushed": pushed,
        "already_pushed": before,
        "answers_needed": project.options.answers_needed,
    }


def _unpushed(project: Any) -> list[int]:
    conn = connection(project) or {}
    done = set(conn.get("pushed", []))
    return [r["number"] for r in project.store.rounds() if r["number"] not in done]


def push_round(project: Any, number: int, client: LabelStudioClient | None = None) -> int:
    """Send round ``number`` to the connected Label Studio project as tasks (image, EADA
    scores as task data, the model's class and score as a pre-annotation); recorded so that a
    round is pushed once. Returns ``number``."""
    conn = connection(project)
    client = client or client_for(project)
    assert conn is not None
    rnd = project.store.conn.execute("SELECT * FROM rounds WHERE number = ?", (number,)).fetchone()
    if rnd is None:
        raise LabelStudioError(f"no round {number} in {project.folder}")
    rows = project.round_rows(number)
    roots = [_document_root(project)] if any(r["path"] for r in rows) else []
    try:
        tasks = label_studio_tasks(rows, roots, number)
    except ValueError as err:
        raise LabelStudioError(str(err)) from None
    client.request("POST", f"/api/projects/{conn['project']}/import", tasks)
    with project.store.transaction():
        now_conn = connection(project) or conn
        now_conn["pushed"] = sorted({*now_conn.get("pushed", []), number})
        project.store.set_meta(META_KEY, json.dumps(now_conn))
    sync_model_version(project, client)
    return number


def sync_model_version(project: Any, client: LabelStudioClient | None = None) -> str | None:
    """Set the Label Studio project's ``model_version`` to the newest pushed active round's
    (``eada-round-N``; audit rounds carry no prediction): Label Studio shows the predictions
    of its project's model version, so each round's tasks show their own pre-annotations.
    Runs after every push (a failure to set it is retried by the next push or connect).
    Returns the version set, or ``None`` when no active round was pushed."""
    conn = connection(project)
    if conn is None:
        return None
    pushed = set(conn.get("pushed", []))
    active = [r["number"] for r in project.store.active_rounds() if r["number"] in pushed]
    if not active:
        return None
    version = model_version(max(active))
    client = client or client_for(project)
    got = client.request("GET", f"/api/projects/{conn['project']}/")
    if not isinstance(got, dict) or got.get("model_version") != version:
        client.request("PATCH", f"/api/projects/{conn['project']}/", {"model_version": version})
    return version


def push_pending(project: Any) -> list[int]:
    """Push every round of a connected store that Label Studio has not received yet."""
    if connection(project) is None:
        return []
    client = client_for(project)
    return [push_round(project, n, client) for n in _unpushed(project)]


EXPORT_TRIES = 3
"""How often a pull asks Label Studio for the project's export before it gives up."""


def fetch_tasks(project: Any, client: LabelStudioClient | None = None) -> list[dict[str, Any]]:
    """Every task of the connected project with its annotations (Label Studio's JSON export),
    ``completed_by`` resolved to the user's e-mail."""
    conn = connection(project)
    client = client or client_for(project)
    assert conn is not None
    tasks: Any = None
    for attempt in range(EXPORT_TRIES):  # a busy server (two pulls at once) may answer
        tasks = client.request(  # something else than the list once: asked again
            "GET",
            f"/api/projects/{conn['project']}/export",
            params={"exportType": "JSON", "download_all_tasks": "true"},
        )
        if isinstance(tasks, list):
            break
        time.sleep(0.5 * (attempt + 1))
    if not isinstance(tasks, list):
        shown = scrub(json.dumps(tasks, default=str)[:200])
        raise LabelStudioError(
            f"{client.url}: the export of project {conn['project']} is no list after "
            f"{EXPORT_TRIES} tries (it answered {shown}); retry later"
        )
    users: dict[int, str] = {}
    listed = client.request("GET", "/api/users/")
    for u in listed if isinstance(listed, list) else []:
        if isinstance(u, dict) and "id" in u:
            users[int(u["id"])] = str(u.get("email") or u.get("username") or u["id"])
    for t in tasks:
        anns = t.get("annotations") if isinstance(t, dict) else None
        if not isinstance(t, dict) or not isinstance(anns or [], list):
            what = type(anns).__name__ if isinstance(t, dict) else f"a {type(t).__name__} task"
            raise LabelStudioError(
                f"{client.url}: the export of project {conn['project']} holds a task whose "
                f"annotations are not a list ({what}); is it a Label Studio JSON export?"
            )
        for ann in anns or []:
            if not isinstance(ann, dict):
                continue
            who = ann.get("completed_by")
            if isinstance(who, int):
                ann["completed_by"] = {"id": who, "email": users.get(who, str(who))}
    return tasks


def pull(project: Any, force: bool = False, token: str | None = None) -> dict[str, Any]:
    """Import the connected Label Studio project's submitted annotations (the annotator's
    e-mail as ``label-studio:EMAIL``) and skipped tasks (as skips), validated and written
    like a file import. Several annotators of one task are several answers, settled by the
    project's ``store.conflicts``; what none settles is a dispute (in the result's
    ``disputes``), never a refused pull: the rest is imported. ``force``: the newest answer
    wins. Re-pulling unchanged annotations changes nothing.

    Raises:
        LabelStudioError: not connected, Label Studio unreachable or the token refused.
    """
    from eada.store.labelfiles import ImportFileError, read_label_studio

    client = client_for(project, token)
    conn = connection(project)
    assert conn is not None
    tasks = fetch_tasks(project, client)
    try:
        items = read_label_studio(tasks)
    except ImportFileError as err:
        raise LabelStudioError(f"{client.url} project {conn['project']}: {err}") from None
    raw = json.dumps(tasks, sort_keys=True, default=str).encode()
    project.store.check_writable()
    if project.store.get_meta("mode") == "simulated":
        project._set_mode("human")  # raises: a simulated run takes no human labels
    source = f"{client.url}/projects/{conn['project']}"
    out: dict[str, Any] = project._write_labels(
        items,
        source,
        hashlib.sha256(raw).hexdigest(),
        "label-studio-live",
        "label-studio",
        "human",
        False,
        force,
    )
    with project.store.transaction() as c:  # the dead ends, read under the write lock
        out["deleted_tasks"] = _note_deleted_tasks(project, c, tasks, source)
        out["deleted_answers"] = _mark_deleted_answers(c, tasks, source)
        out["needs_attention_total"] = len(attention.needs_attention(c))
    out["duplicate_tasks"] = {
        sid: sorted(int(t["id"]) for t in ts)
        for sid, ts in sorted(_samples_of_tasks(tasks).items())
        if len(ts) > 1
    }
    out["pending"] = len(project.pending())
    return out


DELETED_TASK = "its Label Studio task was deleted: no task serves it"
"""The ``why`` of a sample whose task is gone while it still needs answers."""
_TASK_IN_ORIGIN = re.compile(r"Label Studio task (\d+)")


def _samples_of_tasks(tasks: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for t in tasks:
        data = t.get("data") if isinstance(t, dict) else None
        sid = data.get("sample_id") if isinstance(data, dict) else None
        if isinstance(sid, int):
            out.setdefault(sid, []).append(t)
    return out


def unserved(project: Any, c: Any, tasks: list[dict[str, Any]]) -> list[int]:
    """The samples of the rounds pushed to Label Studio that no task serves any more (deleted
    there) although they still need answers (no answer in force, no open dispute)."""
    conn = connection(project) or {}
    pushed = [int(n) for n in conn.get("pushed", [])]
    if not pushed:
        return []
    have = _samples_of_tasks(tasks)
    marks = ",".join("?" * len(pushed))
    rows = c.execute(
        "SELECT rs.sample_id FROM round_samples rs JOIN rounds r ON r.id = rs.round_id WHERE "
        f"r.number IN ({marks}) AND rs.rank IS NOT NULL AND NOT EXISTS (SELECT 1 FROM labels l "
        "WHERE l.sample_id = rs.sample_id) AND NOT EXISTS (SELECT 1 FROM disputes d WHERE "
        "d.sample_id = rs.sample_id AND d.resolved IS NULL) ORDER BY rs.sample_id",
        pushed,
    )
    return [int(r[0]) for r in rows if int(r[0]) not in have]


def _note_deleted_tasks(
    project: Any, c: Any, tasks: list[dict[str, Any]], source: str
) -> list[int]:
    """Put each sample no task serves any more in *needs attention* (action: ``eada
    labelstudio push``, which re-creates its task); clear that entry where a task serves it
    again. Returns the samples found without a task."""
    gone = unserved(project, c, tasks)
    have = _samples_of_tasks(tasks)
    stamp = now()
    for r in c.execute(
        "SELECT id, sample_id FROM attention WHERE cleared IS NULL AND why = ?", (DELETED_TASK,)
    ).fetchall():
        if int(r["sample_id"]) in have:
            c.execute(
                "UPDATE attention SET cleared = ?, how = 'a task serves it again' WHERE id = ?",
                (stamp, r["id"]),
            )
    action = "re-create its task: " + how(
        f"eada labelstudio push --store {q(project.folder)}",
        "eada.store.labelstudio.recreate_deleted(project)",
    )
    attention.record(
        c,
        [attention.Problem(sid, LS_IMPORTER, DELETED_TASK, action) for sid in gone],
        source,
        stamp,
    )
    return gone


def _mark_deleted_answers(c: Any, tasks: list[dict[str, Any]], source: str) -> int:
    """Mark (``votes.deleted``) every answer pulled from this project whose annotation is no
    longer there (the annotation or its task deleted in Label Studio); the answer stays in
    the store and in ``votes.csv``. Returns how many were marked."""
    from eada.store.labelfiles import _ls_annotator

    present: set[tuple[int, str]] = set()
    for t in tasks:
        tid = t.get("id") if isinstance(t, dict) else None
        for ann in (t.get("annotations") or []) if isinstance(t, dict) else []:
            who = _ls_annotator(ann) if isinstance(ann, dict) else None
            if isinstance(tid, int) and who is not None:
                present.add((tid, who))
    stamp = now()
    marked = 0
    for v in c.execute(
        "SELECT v.id, v.annotator, v.origin FROM votes v JOIN imports i ON i.id = v.import_id "
        "WHERE i.file = ? AND i.format = 'label-studio-live' AND v.deleted IS NULL",
        (source,),
    ).fetchall():
        m = _TASK_IN_ORIGIN.search(v["origin"] or "")
        if m is not None and (int(m.group(1)), v["annotator"]) not in present:
            c.execute("UPDATE votes SET deleted = ? WHERE id = ?", (stamp, v["id"]))
            marked += 1
    return marked


LS_IMPORTER = "label-studio"
"""The annotator named on an entry that no annotator's answer caused (a deleted task)."""


def recreate_deleted(project: Any, client: LabelStudioClient | None = None) -> list[int]:
    """Re-create the task of every pushed sample that no Label Studio task serves any more
    while it still needs answers (deleted there). Returns the samples sent again."""
    conn = connection(project)
    if conn is None:
        return []
    client = client or client_for(project)
    tasks = fetch_tasks(project, client)
    gone = set(unserved(project, project.store.conn, tasks))
    if not gone:
        return []
    sent: list[int] = []
    rows_by_round: dict[int, list[dict[str, Any]]] = {}
    for r in project.store.rounds():
        if r["number"] not in conn.get("pushed", []):
            continue
        rows = [x for x in project.round_rows(r["number"]) if x["sample_id"] in gone]
        rows = [x for x in rows if x["sample_id"] not in sent]
        if rows:
            rows_by_round[r["number"]] = rows
            sent += [x["sample_id"] for x in rows]
    for number, rows in rows_by_round.items():
        roots = [_document_root(project)] if any(r["path"] for r in rows) else []
        try:
            made = label_studio_tasks(rows, roots, number)
        except ValueError as err:
            raise LabelStudioError(str(err)) from None
        client.request("POST", f"/api/projects/{conn['project']}/import", made)
    with project.store.transaction() as c:
        stamp = now()
        for sid in sent:
            c.execute(
                "UPDATE attention SET cleared = ?, how = 'task re-created by push' WHERE "
                "sample_id = ? AND why = ? AND cleared IS NULL",
                (stamp, sid, DELETED_TASK),
            )
    return sorted(sent)


def reopen(project: Any, sample_ids: list[int], token: str | None = None) -> dict[str, Any]:
    """Serve the tasks of ``sample_ids`` (samples that need attention) again to the
    annotators they need: the unusable annotations of each entry's annotator on the
    sample's tasks are deleted in Label Studio (an empty submission, an unknown class,
    several choices, one annotator's contradicting answers; eada keeps what it recorded),
    duplicate tasks of one sample beyond the first are deleted, and a sample no task serves
    is given a new task. The entry stays open (its action now says to answer and pull) until
    the annotator's usable answer is pulled.

    Returns:
        ``{"reopened": [{"sample_id", "task", "deleted_annotations"}], "recreated": [ids]}``.

    Raises:
        LabelStudioError: not connected, Label Studio unreachable, or a sample that does
            not need attention.
    """
    from eada.store.labelfiles import _ls_annotator, _ls_answer

    conn = connection(project)
    if conn is None:
        raise LabelStudioError(
            f"{project.folder} is not connected to Label Studio: `eada labelstudio connect`"
        )
    project.store.check_writable()
    entries = attention.needs_attention(project.store.conn)
    open_for: dict[int, list[dict[str, Any]]] = {}
    for e in entries:
        open_for.setdefault(int(e["sample_id"]), []).append(e)
    wrong = [sid for sid in sample_ids if sid not in open_for]
    if wrong:
        listed = ", ".join(str(s) for s in sorted(open_for)) or "none"
        raise LabelStudioError(
            f"sample(s) {', '.join(map(str, wrong))} do not need attention (those that do: "
            f"{listed}; `eada status` lists them)"
        )
    client = client_for(project, token)
    tasks = fetch_tasks(project, client)
    by_sample = _samples_of_tasks(tasks)
    classes = set(project.classes)
    out: list[dict[str, Any]] = []
    recreate = False
    for sid in sample_ids:
        mine = sorted(by_sample.get(sid, []), key=lambda t: int(t.get("id") or 0))
        if not mine:
            recreate = True
            continue
        deleted = []
        for dup in mine[1:]:  # duplicates (a round's JSON imported again): one task a sample
            client.request("DELETE", f"/api/tasks/{dup['id']}/")  # its annotations go with it
            deleted += [int(a["id"]) for a in dup.get("annotations") or [] if "id" in a]
        who = {e["annotator"] for e in open_for[sid]}
        contradicted = any("conflicting duplicates" in e["why"] for e in open_for[sid])
        for ann in mine[0].get("annotations") or []:
            if not isinstance(ann, dict) or _ls_annotator(ann) not in who:
                continue
            label, _, problem = _ls_answer(ann)
            if problem is None and (label is None or label in classes) and not contradicted:
                continue  # a usable answer on the kept task stays
            client.request("DELETE", f"/api/annotations/{ann['id']}/")
            deleted.append(int(ann["id"]))
        out.append({"sample_id": sid, "task": int(mine[0]["id"]), "deleted_annotations": deleted})
    recreated = recreate_deleted(project, client) if recreate else []
    with project.store.transaction() as c:
        for r in out:
            c.execute(
                "UPDATE attention SET action = ?, task = ? WHERE sample_id = ? AND cleared IS NULL",
                (
                    f"re-served in Label Studio (task {r['task']}): answer it there, then pull: "
                    + how(
                        f"eada labelstudio pull --store {q(project.folder)}",
                        "eada.store.labelstudio.pull(project)",
                    ),
                    r["task"],
                    r["sample_id"],
                ),
            )
    return {"reopened": out, "recreated": recreated}
