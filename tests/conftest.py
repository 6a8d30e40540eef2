"""Shared fixtures: where the real data lives, small configs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
#: Label Studio 1.23's default banned subnets (core/utils/io.py) but loopback: with
#: ``USE_DEFAULT_BANNED_SUBNETS=false`` the settings docs/label-studio.md ("Your team") gives
#: for an ML backend on 127.0.0.1, which the live server runs with
LS_BANNED_BUT_LOOPBACK = (
    "0.0.0.0/8,10.0.0.0/8,100.64.0.0/10,169.254.0.0/16,172.16.0.0/12,192.0.0.0/24,"
    "192.0.2.0/24,192.88.99.0/24,192.168.0.0/16,198.18.0.0/15,198.51.100.0/24,203.0.113.0/24,"
    "224.0.0.0/4,233.252.0.0/24,240.0.0.0/4,255.255.255.255/32,::/128,::ffff:0:0/96,"
    "::ffff:0:0:0/96,64:ff9b::/96,64:ff9b:1::/48,100::/64,2001:0000::/32,2001:20::/28,"
    "2001:db8::/32,2002::/16,fc00::/7,fe80::/10,ff00::/8"
)


@pytest.fixture
def digits_root() -> Path:
    """``../shared/data/digits``; the test is skipped where it is absent (under ``CI=true``
    failed: ``support.real_data``)."""
    from support import real_data

    return real_data("digits")


@pytest.fixture(autouse=True)
def _forget_thread_flag() -> Iterator[None]:
    """A test that runs ``eada ... --threads N`` in this process leaves the flag set in
    :mod:`eada.threads`; forget it after each test so the next one sees the defaults."""
    yield
    from eada import threads

    threads.set_threads(None)


#: Label Studio's own virtualenv (its pins never touch eada's): `.ci/run` installs it here.
LABEL_STUDIO_VENV = Path(
    __import__("os").environ.get("EADA_LABEL_STUDIO_VENV", str(REPO / ".venv-labelstudio"))
)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Torch on one thread for the test (tiny convolutions on a shared 2-core machine run far
    faster so); the previous count restored after."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def label_studio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A real Label Studio server on 127.0.0.1 (a free port), its SQLite database in a temp
    folder, local-files serving on with the document root ``root``; stopped afterwards.
    Yields ``{"url", "root", "legacy_token", "email", "password"}``. Skipped where its virtualenv is
    missing, except under ``CI=true``, where that is a failure."""
    import os
    import shutil
    import signal
    import socket
    import subprocess
    import time
    import urllib.request

    exe = LABEL_STUDIO_VENV / "bin" / "label-studio"
    if not exe.is_file():
        msg = f"Label Studio is not installed at {LABEL_STUDIO_VENV} (.ci/run installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    base = tmp_path_factory.mktemp("label-studio")
    root, data = base / "root", base / "data"
    root.mkdir()
    data.mkdir()
    template = LABEL_STUDIO_VENV / "eada-db-template" / "label_studio.sqlite3"
    if template.is_file():  # migrated once by scripts/ensure_labelstudio.sh: starts in seconds
        shutil.copy(template, data / template.name)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token, email = "eada-test-legacy-token", "annotator@example.org"
    env = {
        **os.environ,
        "HOME": str(base),
        "LABEL_STUDIO_BASE_DATA_DIR": str(data),
        "LABEL_STUDIO_LOCAL_FILES_SERVING_ENABLED": "true",
        "LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT": str(root),
        "LABEL_STUDIO_DISABLE_SIGNUP_WITHOUT_LINK": "true",
        "COLLECT_ANALYTICS": "false",
        # `eada serve` runs on this host: let Label Studio call an ML backend on 127.0.0.1,
        # and keep every other banned range for its webhooks (docs/label-studio.md)
        "ML_BLOCK_LOCAL_IP": "false",
        "USE_DEFAULT_BANNED_SUBNETS": "false",
        "USER_ADDITIONAL_BANNED_SUBNETS": LS_BANNED_BUT_LOOPBACK,
        "OMP_NUM_THREADS": "1",
        # the admin's password from the environment, not the command line (ps shows that),
        # as docs/label-studio.md says
        "LABEL_STUDIO_PASSWORD": "eada-test-password",
    }
    log = open(base / "server.log", "wb")  # open while the server runs
    proc = subprocess.Popen(
        [
            str(exe),
            "start",
            "--no-browser",
            "--internal-host",
            "127.0.0.1",
            "--port",
            str(port),
            "--data-dir",
            str(data),
            "--username",
            email,
            "--user-token",
            token,
            "--enable-legacy-api-token",
        ],
        env=env,
        cwd=base,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600  # migrations take minutes on a busy 2-core machine
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"Label Studio exited ({proc.returncode}): "
                    + (base / "server.log").read_text(errors="replace")[-2000:]
                )
            try:
                req = urllib.request.Request(
                    url + "/api/current-user/whoami", headers={"Authorization": f"Token {token}"}
                )
                with urllib.request.urlopen(req, timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("Label Studio did not answer within 600 s")
            time.sleep(1)
        yield {
            "url": url,
            "root": root,
            "legacy_token": token,
            "email": email,
            "password": env["LABEL_STUDIO_PASSWORD"],
            "banned_subnets": LS_BANNED_BUT_LOOPBACK,
        }
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and the workers it started
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.fixture(scope="session")
def docs_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The documentation site, built once per test session as ``make docs`` builds it
    (``mkdocs build --strict``); skipped where the docs extra is not installed."""
    import importlib.util
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("the docs extra is not installed (pip install -e '.[docs]')")
    built = os.environ.get("EADA_DOCS_SITE")  # `make test`: the site `make docs` built just now
    if built and (Path(built) / "index.html").is_file():
        return Path(built).resolve()
    import fcntl

    # under pytest-xdist each worker has its own temp folder below one of the run's: the first
    # worker to ask builds the site there, under a lock, and the others read it
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out = shared / "docs-site"
    with open(shared / "docs-site.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "index.html").is_file():
            cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)]
            env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
            proc = subprocess.run(
                cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=env
            )
            assert proc.returncode == 0, proc.stdout + proc.stderr
    return out
