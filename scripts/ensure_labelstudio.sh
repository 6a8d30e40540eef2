#!/usr/bin/env bash
# Install Label Studio into its OWN virtualenv, .venv-labelstudio (or $EADA_LABEL_STUDIO_VENV),
# so its version pins never touch eada's environment. tests/test_labelstudio_live.py starts it
# from there (and fails under CI=true when it is missing). Idempotent and quiet: does nothing
# when that virtualenv already holds the label-studio command and the migrated database.
set -euo pipefail
VENV="${EADA_LABEL_STUDIO_VENV:-.venv-labelstudio}"
VERSION="${EADA_LABEL_STUDIO_VERSION:-1.23.*}"
TEMPLATE="$VENV/eada-db-template"
if [ ! -x "$VENV/bin/label-studio" ]; then
    PY="${PY:-python3}"
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q "label-studio==$VERSION"
fi
test -x "$VENV/bin/label-studio"
# An empty, fully migrated database the test copies: Label Studio's ~300 migrations take
# minutes on a busy 2-core machine, once here instead of at every test run.
if [ ! -f "$TEMPLATE/label_studio.sqlite3" ]; then
    mkdir -p "$TEMPLATE.tmp"
    LABEL_STUDIO_BASE_DATA_DIR="$(cd "$TEMPLATE.tmp" && pwd)" HOME="$(cd "$TEMPLATE.tmp" && pwd)" \
        "$VENV/bin/label-studio" version >/dev/null 2>&1
    test -f "$TEMPLATE.tmp/label_studio.sqlite3"
    rm -rf "$TEMPLATE"
    mv "$TEMPLATE.tmp" "$TEMPLATE"
fi
