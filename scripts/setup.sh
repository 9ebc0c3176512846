#!/usr/bin/env bash
# Installs everything kproxy's demo and tests need on a fresh Debian machine:
# system packages (only those missing), a virtualenv with kproxy and its test
# extras, and Apache Kafka's jars from Maven Central. Safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}

need_apt=()
command -v java >/dev/null || need_apt+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || need_apt+=(maven)
command -v promtool >/dev/null || need_apt+=(prometheus)   # Prometheus server + promtool (metrics tests)
command -v tshark >/dev/null || need_apt+=(tshark)         # reads kproxy's pcapng captures (capture tests)
command -v chromium >/dev/null || need_apt+=(chromium)     # the analysis report and web view, tested in a real browser
if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "setup: installing ${need_apt[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
    else
        echo "setup: please install ${need_apt[*]} (needs root)" >&2
        exit 1
    fi
fi

# Container image test: podman, runc, debootstrap (a separate script: the image is built
# without a registry, see scripts/build-image.sh).
bash scripts/setup-image.sh

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.kproxy-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ]; then
    "$VENV/bin/pip" install -q --upgrade pip
    # The exact versions in constraints.txt (refresh: make constraints), not whatever is newest.
    "$VENV/bin/pip" install -q -e '.[test,analysis]' -c constraints.txt
    touch "$stamp"
fi

# Kafka jars (both protocol lines) into ~/.cache/kproxy; skipped when cached.
"$VENV/bin/python" -m kproxy.embedded fetch
