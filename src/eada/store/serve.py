"""``eada serve``: Label Studio's ML-backend protocol over a project store, for interactive
pre-annotation (Label Studio > project settings > Model > Connect model, URL of this server).

=========== ======== ==========================================================================
route       method   answer
=========== ======== ==========================================================================
/health     GET      ``{"status": "UP", "model_class": "eada", "model_version": V}``
/setup      POST     ``{"model_version": V}`` (V names the store's latest checkpoint)
/predict    POST     ``{"results": [...]}``: for each task holding an eada ``sample_id``, the
                     latest model's class as a ``choices`` result of the ``label`` control,
                     with its probability as ``score``; an empty result for an audit
                     sample (the audit is blind) and for any other task
/webhook    POST     an annotation event of a connected store pulls the annotations
                     (``eada labelstudio pull``); disagreements become disputes as there
=========== ======== ==========================================================================

Predictions come from the latest checkpoint of the store, computed once per checkpoint for the
whole target (as ``eada export``'s ``predictions.csv``). One request at a time (the store is
one SQLite file; the server is a plain :class:`http.server.HTTPServer`).
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from eada.store.labelfiles import LS_FROM_NAME

ANNOTATION_EVENTS = ("ANNOTATION_CREATED", "ANNOTATIONS_CREATED", "ANNOTATION_UPDATED")


class Backend:
    """The predictions and pulls behind the routes, for one project store.

    Args:
        project: an open :class:`~eada.store.project.Project`.
    """

    def __init__(self, project: Any) -> None:
        self.project = project
        self._cache: tuple[int, dict[int, tuple[str, float]]] | None = None

    def model_version(self) -> str:
        """``eada-checkpoint-N`` for the latest checkpoint (``eada-untrained`` without one)."""
        ck = self.project.store.latest_checkpoint()
        return "eada-untrained" if ck is None else f"eada-checkpoint-{ck['id']}"

    def predictions(self) -> dict[int, tuple[str, float]]:
        """``{sample id: (predicted class, probability)}`` of the latest checkpoint's model."""
        from eada.store.exports import final_predictions

        ck = self.project.store.latest_checkpoint()
        if ck is None:
            return {}
        if self._cache is None or self._cache[0] != ck["id"]:
            state = self.project.load_checkpoint(ck)
            rows = final_predictions(self.project, state["model"])
            self._cache = (ck["id"], {r["sample_id"]: (r["predicted"], r["score"]) for r in rows})
        return self._cache[1]

    def predict(self, body: dict[str, Any]) -> dict[str, Any]:
        """Label Studio's ``/predict`` request -> ``{"results": [...]}`` (one a task)."""
        tasks = body.get("tasks")
        if not isinstance(tasks, list):
            raise ValueError("/predict: the request needs a 'tasks' list")
        preds = self.predictions()
        version = self.model_version()
        audit = self.project.store.audit_sample_ids()  # blind: never a guess for them
        results: list[dict[str, Any]] = []
        for t in tasks:
            data = t.get("data") if isinstance(t, dict) else None
            sid = data.get("sample_id") if isinstance(data, dict) else None
            got = (
                preds.get(int(sid)) if isinstance(sid, (int, str)) and str(sid).isdigit() else None
            )
            if got is not None and (int(str(sid)) in audit or data.get("audit")):  # type: ignore[union-attr]
                got = None
            if got is None:
                results.append({"model_version": version, "result": []})
                continue
            to = "image" if data.get("image") else "text"  # type: ignore[union-attr]
            results.append(
                {
                    "model_version": version,
                    "score": got[1],
                    "result": [
                        {
                            "from_name": LS_FROM_NAME,
                            "to_name": to,
                            "type": "choices",
                            "value": {"choices": [got[0]]},
                        }
                    ],
                }
            )
        return {"results": results}

    def webhook(self, body: dict[str, Any]) -> dict[str, Any]:
        """An annotation event pulls the connected store's annotations."""
        from eada.store import labelstudio

        if body.get("action") not in ANNOTATION_EVENTS:
            return {"status": "ignored"}
        if labelstudio.connection(self.project) is None:
            return {"status": "ignored", "reason": "the store is not connected"}
        out = labelstudio.pull(self.project)
        return {"status": "pulled", **{k: out[k] for k in ("new", "corrections", "skipped")}}


def make_server(project: Any, host: str = "127.0.0.1", port: int = 9090) -> HTTPServer:
    """An HTTP server answering Label Studio's ML-backend routes for ``project`` (call
    ``serve_forever()``; ``port`` 0 picks a free one: ``server.server_address``)."""
    backend = Backend(project)

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, code: int, doc: dict[str, Any]) -> None:
            raw = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet; errors are answered as JSON

        def do_GET(self) -> None:
            if self.path.rstrip("/") in ("/health", ""):
                self._answer(
                    200,
                    {
                        "status": "UP",
                        "model_class": "eada",
                        "model_version": backend.model_version(),
                    },
                )
            else:
                self._answer(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:
            try:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                if not isinstance(body, dict):
                    raise ValueError("the request body must be a JSON object")
                route = self.path.split("?", 1)[0].rstrip("/")
                if route == "/setup":
                    self._answer(200, {"model_version": backend.model_version()})
                elif route == "/predict":
                    self._answer(200, backend.predict(body))
                elif route == "/webhook":
                    self._answer(200, backend.webhook(body))
                else:
                    self._answer(404, {"error": f"no route {self.path}"})
            except ValueError as err:  # bad requests, refused pulls (conflicts): named
                self._answer(400, {"error": str(err)})

    return HTTPServer((host, port), Handler)
