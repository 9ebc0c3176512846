#!/usr/bin/env bash
# Installs what `make demo` or `make test` needs on a fresh Debian machine, and nothing
# more: system packages (only those missing; the one step that needs root), a virtualenv
# with kproxy and the profile's extras, and Apache Kafka's jars from Maven Central.
# Safe to run repeatedly.
#
#   scripts/setup.sh demo   Java (the embedded Kafka broker, Spark) and Maven (only until the
#                           broker's jars are cached); kproxy with the demo and analysis extras
#   scripts/setup.sh test   all of the above, plus the tools the test suite drives: Prometheus
#                           and promtool, tshark, Chromium, openssl; the test and s3 extras;
#                           both Kafka lines' jars; Spark's Kafka and S3A jars; s3proxy
set -euo pipefail
cd "$(dirname "$0")/.."

PROFILE=${1:-test}
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}

case "$PROFILE" in
    demo) extras=demo,analysis ;;
    test) extras=test,demo,analysis,s3 ;;
    *) echo "usage: scripts/setup.sh demo|test" >&2; exit 2 ;;
esac

# The Kafka versions the profile runs (the demo: the newest line only), and whether their jars
# are all cached already (then Maven, which resolves them, is not needed). kproxy.embedded.kafka
# is standard library only, so the system Python can answer before the virtualenv exists.
read -r kafka_fetched kafka_versions < <(PYTHONPATH=. "$PYTHON" - "$PROFILE" <<'EOF'
import sys
from kproxy.embedded.kafka import KAFKA_3_VERSION, KAFKA_4_VERSION, is_fetched
versions = [KAFKA_4_VERSION] if sys.argv[1] == "demo" else [KAFKA_4_VERSION, KAFKA_3_VERSION]
print(int(all(map(is_fetched, versions))), " ".join(versions))
EOF
)
[ -n "$kafka_versions" ] || { echo "setup: $PYTHON could not read kproxy.embedded's Kafka versions" >&2; exit 1; }

need_apt=()
"$PYTHON" -c 'import ensurepip' 2>/dev/null || need_apt+=(python3-venv)   # Debian splits venv's pip out
command -v java >/dev/null || need_apt+=(openjdk-17-jre-headless)         # the Kafka broker; Spark
[ "$kafka_fetched" = 1 ] || command -v mvn >/dev/null || need_apt+=(maven) # fetches the broker's jars
[ "$PROFILE" != test ] || command -v mvn >/dev/null || need_apt+=(maven)     # Spark's Kafka connector
if [ "$PROFILE" = test ]; then
    command -v promtool >/dev/null || need_apt+=(prometheus)  # Prometheus server + promtool (metrics tests)
    command -v tshark >/dev/null || need_apt+=(tshark)        # reads kproxy's pcapng captures (capture tests)
    command -v chromium >/dev/null || need_apt+=(chromium)    # the analysis report and web view, in a real browser
    command -v openssl >/dev/null || need_apt+=(openssl)      # the TLS tests' certificates
    command -v javac >/dev/null || need_apt+=(openjdk-17-jdk-headless)  # compiles the test broker's telemetry plugin
fi
if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "setup ($PROFILE): installing ${need_apt[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
    else
        echo "setup ($PROFILE): please install ${need_apt[*]} (needs root), then run this again" >&2
        exit 1
    fi
fi

# Container image test: podman, runc, debootstrap (a separate script: the image is built
# without a registry, see scripts/build-image.sh). The demo needs none of them.
if [ "$PROFILE" = test ]; then
    bash scripts/setup-image.sh
fi

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
# One stamp per profile; the test profile's installs everything the demo's does.
stamp="$VENV/.kproxy-installed"
[ "$PROFILE" = test ] || stamp="$VENV/.kproxy-installed-$PROFILE"
fresh() { [ -f "$1" ] && [ ! pyproject.toml -nt "$1" ] && [ ! constraints.txt -nt "$1" ]; }
if ! fresh "$stamp" && ! fresh "$VENV/.kproxy-installed"; then
    "$VENV/bin/pip" install -q --upgrade pip
    # An install from before the distribution was renamed would stay beside the new one.
    if "$VENV/bin/pip" show -q kproxy 2>/dev/null; then "$VENV/bin/pip" uninstall -q -y kproxy; fi
    # The exact versions in constraints.txt (refresh: make constraints), not whatever is newest.
    "$VENV/bin/pip" install -q -e ".[$extras]" -c constraints.txt
    touch "$stamp"
fi

# Kafka jars into ~/.cache/kproxy; skipped when cached.
fetch_args=()
for version in $kafka_versions; do
    fetch_args+=(--version "$version")
done
"$VENV/bin/python" -m kproxy.embedded fetch "${fetch_args[@]}"

# Spark's Kafka connector (test profile: the tests read shipped capture rows from a topic;
# kproxy analyze kafka://... fetches it itself on first use). Skipped when cached.
if [ "$PROFILE" = test ]; then
    "$VENV/bin/python" -m kproxy.pipeline.kafka_jars >/dev/null
    # Hadoop's S3A for Spark, and s3proxy (a real S3-compatible server) for the tests of
    # captures uploaded to object storage and read back over s3a://. Skipped when cached.
    "$VENV/bin/python" -m kproxy.pipeline.s3_jars >/dev/null
    "$VENV/bin/python" -m kproxy.embedded.s3proxy >/dev/null
fi

# A librdkafka of the line that crashes on a telemetry subscription naming none of its
# metrics (confluent-kafka 2.5.0 bundles librdkafka 2.5.0), beside the venv, not in it: the
# telemetry offer's test runs it to show kproxy never offers it telemetry. Skipped when cached.
OLD_RDKAFKA=2.5.0
cache_dir=${KPROXY_CACHE_DIR:-$HOME/.cache/kproxy}
if [ "$PROFILE" = test ] && [ ! -d "$cache_dir/confluent-kafka-$OLD_RDKAFKA/confluent_kafka" ]; then
    "$VENV/bin/pip" install -q --no-deps --only-binary=:all: --target "$cache_dir/confluent-kafka-$OLD_RDKAFKA" \
        "confluent-kafka==$OLD_RDKAFKA"
fi

# Helm, for the chart's tests (test profile; tests/deploy/test_helm.py: helm lint and template),
# built from its Go module (no binary download is reachable) into the same cache; skipped
# when cached. The tests look for it at $KPROXY_CACHE_DIR/helm-$HELM_VERSION/helm.
HELM_VERSION=v3.22.0
# The Kubernetes version helm renders for and lints against by default: its release builds
# take it from their client-go (v0.37.0 in v3.22.0 -> 1.37); without these flags it says 1.20.
HELM_KUBE_MINOR=37
cache=${KPROXY_CACHE_DIR:-$HOME/.cache/kproxy}
if [ "$PROFILE" = test ] && [ ! -x "$cache/helm-$HELM_VERSION/helm" ]; then
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
