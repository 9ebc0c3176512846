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

# Helm, for the chart's tests (tests/deploy/test_helm.py: helm lint and helm template),
# built from its Go module (no binary download is reachable) into the same cache; skipped
# when cached. The tests look for it at $KPROXY_CACHE_DIR/helm-$HELM_VERSION/helm.
HELM_VERSION=v3.22.0
# The Kubernetes version helm renders for and lints against by default: its release builds
# take it from their client-go (v0.37.0 in v3.22.0 -> 1.37); without these flags it says 1.20.
HELM_KUBE_MINOR=37
cache=${KPROXY_CACHE_DIR:-$HOME/.cache/kproxy}
if [ ! -x "$cache/helm-$HELM_VERSION/helm" ]; then
    go=$(command -v go || echo /usr/local/go/bin/go)
    if [ ! -x "$go" ]; then
        echo "setup: Go is needed to build helm $HELM_VERSION (the Helm chart's tests); install Go 1.26 or later (helm v3.22 needs it)" >&2
        exit 1
    fi
    echo "setup: building helm $HELM_VERSION from its Go module (once; a few minutes)"
    ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.metadata="
    for pkg in pkg/lint/rules pkg/chartutil; do
        ldflags+=" -X helm.sh/helm/v3/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$HELM_KUBE_MINOR"
    done
    GOBIN="$cache/helm-$HELM_VERSION" CGO_ENABLED=0 "$go" install -ldflags "$ldflags" \
        "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi
