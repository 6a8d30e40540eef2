#!/usr/bin/env bash
# Make sure Debian's headless-capable Chromium is installed (used by tests/test_browser.py).
# Idempotent and quiet: does nothing when /usr/bin/chromium exists; otherwise installs the
# `chromium` package with apt-get (needs root, or sudo without a password).
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure_chromium: /usr/bin/chromium is missing and apt-get is not available;" \
        "install Chromium yourself (the browser test fails under CI=true without it)" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo -n"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
test -x /usr/bin/chromium
