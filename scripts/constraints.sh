#!/usr/bin/env bash
# `make constraints`: re-resolve constraints.txt, the exact versions `make test`, `make demo`,
# CI and the container image install (pip -c). Reads the dependencies and every extra
# (test, demo, analysis, ship, s3) from pyproject.toml; keeps every pin that still satisfies them (uv reads
# the old file as preferences), so a refresh moves only what pyproject asks to move.
# Pass --upgrade to take the newest versions instead; commit the result after `make test`.
# One file for every platform and Python >= 3.11 (--universal: markers where they differ).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/tools.sh
tools_install
"$TOOLS/bin/uv" pip compile pyproject.toml --extra test --extra demo --extra analysis --extra ship --extra s3 \
    --universal --python-version 3.11 --custom-compile-command "make constraints" \
    --output-file constraints.txt --quiet "$@"
echo "constraints.txt: $(grep -c '==' constraints.txt) pinned packages"
