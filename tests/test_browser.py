"""Open `eada report` pages in headless Chromium (Debian's ``chromium``) over the DevTools
protocol: the page must load with no console error, no exception and no request leaving the
file (no network), show its figures and tables, and a screenshot is saved.

Under ``CI=true`` a missing Chromium is a failure (``scripts/ensure_chromium.sh`` installs it);
elsewhere the test is skipped.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eada.experiment import run_seeds
from eada.hparams import preset_config
from eada.reports.html import build_report

CHROMIUM = os.environ.get("EADA_CHROMIUM", "/usr/bin/chromium")
SMALL_TOY = [
    "data.n_per_class=60",
    "train.epochs=3",
    "active.rounds_at=[1,2]",
    "active.budget_per_round=0.05",
]


def _chromium() -> str:
    path = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    if path:
        return path
    msg = f"chromium not found at {CHROMIUM} (run scripts/ensure_chromium.sh)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(msg)
    pytest.skip(msg)


class DevTools:
    """A headless Chromium and a DevTools-protocol session on one page."""

    def __init__(self, binary: str, profile: Path) -> None:
        import websocket  # websocket-client (dev dependency)

        self.proc = subprocess.Popen(
            [
                binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
                "--hide-scrollbars",
                "--window-size=1280,900",
                f"--user-data-dir={profile}",
                "--remote-debugging-port=0",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        url = self._browser_url(timeout=60)
        port = re.search(r":(\d+)/", url)
        assert port, url
        targets = self._json(f"http://127.0.0.1:{port.group(1)}/json/list")
        page = next(t for t in targets if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60)
        self._id = 0
        self.events: list[dict[str, Any]] = []

    def _browser_url(self, timeout: float) -> str:
        assert self.proc.stderr is not None
        deadline = time.monotonic() + timeout
        lines = []
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                if self.proc.poll() is not None:
                    break
                continue
            lines.append(line)
            m = re.search(r"DevTools listening on (ws://\S+)", line)
            if m:
                return m.group(1)
        raise RuntimeError("chromium did not start its DevTools server:\n" + "".join(lines))

    @staticmethod
    def _json(url: str) -> Any:
        for _ in range(50):
            try:
                with urllib.request.urlopen(url, timeout=5) as r:  # local DevTools endpoint
                    return json.loads(r.read())
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"no answer from {url}")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send a command; keep the events that arrive meanwhile; return its result."""
        self._id += 1
        my_id = self._id
        self.ws.send(json.dumps({"id": my_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == my_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return dict(msg.get("result", {}))
            if "method" in msg:
                self.events.append(msg)

    def wait_for(self, event: str, timeout: float = 60) -> None:
        """Read events until ``event`` arrives."""
        if any(e["method"] == event for e in self.events):
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = json.loads(self.ws.recv())
            if "method" in msg:
                self.events.append(msg)
                if msg["method"] == event:
                    return
        raise TimeoutError(event)

    def close(self) -> None:
        """Close the session and stop the browser."""
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@contextlib.contextmanager
def chromium_page(url: str) -> Iterator[DevTools]:
    """Headless Chromium on a fresh profile, its Page, Runtime, Log and Network events on, once
    ``url`` has loaded; closed afterwards, and its profile removed."""
    binary = _chromium()
    # Chromium's helper processes can still write to the profile for a moment after the main
    # process exits: clean up with retries instead of failing the test on a busy machine
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        b = DevTools(binary, Path(profile))
        try:
            for domain in ("Page", "Runtime", "Log", "Network"):
                b.call(f"{domain}.enable")
            b.call("Page.navigate", url=url)
            b.wait_for("Page.loadEventFired")
            yield b
        finally:
            b.close()
            for _ in range(20):
                shutil.rmtree(profile, ignore_errors=True)
                if not os.path.exists(profile):
                    break
                time.sleep(0.25)


def open_report(html: Path, screenshot: Path) -> dict[str, Any]:
    """Load ``html`` in headless Chromium; return what the page shows and every error."""
    with chromium_page(html.resolve().as_uri()) as b:
        facts = b.call(
            "Runtime.evaluate",
            returnByValue=True,
            expression="""({
              imgs: document.images.length,
              brokenImgs: [...document.images]
                .filter(i => !i.complete || i.naturalWidth === 0).length,
              svgs: document.querySelectorAll('figure svg').length,
              figures: document.querySelectorAll('figure').length,
              tables: document.querySelectorAll('table').length,
              rounds: document.querySelectorAll('table.rounds tbody tr').length,
              h2: [...document.querySelectorAll('h2')].map(h => h.textContent),
              height: document.documentElement.scrollHeight,
              title: document.title,
            })""",
        )["result"]["value"]
        shot = b.call("Page.captureScreenshot", format="png", captureBeyondViewport=False)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        errors = []
        requests = []
        for e in b.events:
            p = e.get("params", {})
            if e["method"] == "Runtime.consoleAPICalled" and p.get("type") in (
                "error",
                "assert",
            ):
                errors.append(("console", p.get("args")))
            elif e["method"] == "Runtime.exceptionThrown":
                errors.append(("exception", p.get("exceptionDetails")))
            elif e["method"] == "Log.entryAdded" and p["entry"]["level"] == "error":
                errors.append(("log", p["entry"].get("text")))
            elif e["method"] == "Network.requestWillBeSent":
                requests.append(p["request"]["url"])
        facts["errors"] = errors
        facts["requests"] = requests
        return dict(facts)


def _check(facts: dict[str, Any], html: Path) -> None:
    assert facts["errors"] == [], facts["errors"]
    external = [u for u in facts["requests"] if not u.startswith(("file:", "data:"))]
    assert external == [], f"the page asked the network for {external}"
    assert facts["title"].startswith("eada report")
    assert facts["brokenImgs"] == 0
    assert facts["imgs"] >= 1 and facts["svgs"] >= 1, facts
    assert facts["tables"] >= 2 and facts["rounds"] >= 1, facts
    assert facts["height"] > 900


@pytest.fixture(scope="module")
def toy_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bench-style folder: toy/<method>/ for two methods, one seed each (a few seconds)."""
    root = tmp_path_factory.mktemp("bench")
    for method in ("random", "eada"):
        run_seeds(
            lambda s, m=method: preset_config("toy", m, s, SMALL_TOY), [0], root / "toy" / method
        )
    return root


def test_run_report_in_chromium(toy_runs: Path, tmp_path: Path) -> None:
    html = build_report(toy_runs / "toy" / "eada", tmp_path / "run.html")
    facts = open_report(html, tmp_path / "run.png")
    _check(facts, html)
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_report_in_chromium(toy_runs: Path, tmp_path: Path) -> None:
    html = build_report(toy_runs, tmp_path / "bench.html")
    facts = open_report(html, tmp_path / "bench.png")
    _check(facts, html)
    assert facts["h2"] == ["toy"]
    assert facts["rounds"] >= 2 * 3  # both methods, rounds 0-2


def test_browser_sees_a_broken_page(tmp_path: Path) -> None:
    """The checks can fail: a script error and a missing image are reported."""
    page = tmp_path / "bad.html"
    page.write_text(
        "<!DOCTYPE html><html><head><title>x</title></head><body>"
        '<img src="missing.png"><script>console.error("boom"); undefinedFn();</script>'
        "</body></html>"
    )
    facts = open_report(page, tmp_path / "bad.png")
    kinds = {k for k, _ in facts["errors"]}
    assert "console" in kinds and "exception" in kinds
    assert facts["brokenImgs"] == 1


def _poll(b: DevTools, expression: str, timeout: float = 30) -> Any:
    """Evaluate ``expression`` until it is truthy (or ``timeout`` passes); its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = b.call("Runtime.evaluate", returnByValue=True, expression=expression)["result"]
        if value.get("value") or time.monotonic() > deadline:
            return value.get("value")
        time.sleep(0.25)


def test_docs_site_in_chromium(docs_site: Path, tmp_path: Path) -> None:
    """The documentation site opened as files (``file://``, no server): the API page's formulas
    are drawn by the site's own KaTeX, the search finds ``free_energy``, and nothing is
    requested from the network."""
    with chromium_page((docs_site / "api/energy.html").as_uri()) as b:
        math = _poll(
            b,
            """(() => { const all = document.querySelectorAll('.arithmatex').length;
               const drawn = document.querySelectorAll('.arithmatex .katex-html').length;
               return all > 0 && all === drawn ? [all, drawn] : null })()""",
        )
        assert math, "the formulas were not drawn by KaTeX"
        # the search, from file:// (its worker runs in the vendored iframe shim)
        b.call(
            "Runtime.evaluate",
            expression="""(() => {
              document.querySelector('label[for="__search"]').click();
              const input = document.querySelector('.md-search__input');
              input.value = 'free energy';
              input.dispatchEvent(new Event('input', {bubbles: true}));
            })()""",
        )
        hits = _poll(
            b,
            """[...document.querySelectorAll('.md-search-result__item')]
               .map(e => e.textContent).join(' ')""",
        )
        assert hits and "free_energy" in hits, hits
        # ... and the formulas in the results are drawn too, none left as \( ... \)
        drawn = _poll(b, "document.querySelectorAll('.md-search-result .katex').length")
        raw = b.call(
            "Runtime.evaluate",
            returnByValue=True,
            expression=r"""[...document.querySelectorAll('.md-search-result__article')]
               .filter(a => a.textContent.includes('\\(')).length""",
        )["result"]["value"]
        assert drawn and raw == 0, (drawn, raw)
        shot = b.call("Page.captureScreenshot", format="png")
        (tmp_path / "energy.png").write_bytes(base64.b64decode(shot["data"]))
        errors, requests = [], []
        for e in b.events:
            p = e.get("params", {})
            if e["method"] == "Runtime.exceptionThrown" or (
                e["method"] == "Log.entryAdded" and p["entry"]["level"] == "error"
            ):
                errors.append(p)
            elif e["method"] == "Network.requestWillBeSent":
                requests.append(p["request"]["url"])
        assert errors == []
        external = [u for u in requests if not u.startswith(("file:", "data:", "about:"))]
        assert external == [], f"the site asked the network for {external}"
        assert any(u.endswith("katex/fonts/KaTeX_Main-Regular.woff2") for u in requests)
