#!/usr/bin/env bash
# Install Label Studio into its OWN virtualenv, .venv-labelstudio (or $EADA_LABEL_STUDIO_VENV),
# so its version pins never touch eada's environment. tests/test_labelstudio_live.py starts it
# from there (and fails under CI=true when it is missing). Idempotent and quiet: does nothing
# when that virtualenv already holds the label-studio command.
set -euo pipefail
VENV="${EADA_LABEL_STUDIO_VENV:-.venv-labelstudio}"
VERSION="${EADA_LABEL_STUDIO_VERSION:-1.23.*}"
if [ -x "$VENV/bin/label-studio" ]; then
    exit 0
fi
PY="${PY:-python3}"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "label-studio==$VERSION"
test -x "$VENV/bin/label-studio"
