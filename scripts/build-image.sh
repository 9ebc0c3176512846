#!/usr/bin/env bash
# Builds kproxy's container image from deploy/Dockerfile with podman on a machine that
# reaches no container registry: the base image is made from Debian packages (debootstrap),
# kproxy's Python dependencies come from PyPI. Where a registry is reachable, build the
# usual way instead: docker build -f deploy/Dockerfile -t kproxy .
#
#   scripts/build-image.sh              build the image (or reuse it), print its name last
#   scripts/build-image.sh --run-flags  print the flags `podman run` needs here, one a line
#
# The image is tagged localhost/kproxy:<hash of what goes into it> (and :latest); a tag that
# exists already is reused, so a second run with the same sources takes seconds. The base
# (a Debian rootfs tarball) is cached in ~/.cache/kproxy and imported as localhost/kproxy-base.
# Needs root (debootstrap, rootful podman) and the packages scripts/setup-image.sh installs.
# Exit 3: no container can run on this machine (the reason is on stderr).
set -euo pipefail
cd "$(dirname "$0")/.."

NO_ENGINE=3
SUITE=bookworm                              # Debian 12: python3 is 3.11, kproxy's minimum
MIRROR=${KPROXY_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# What python:3.12-slim gives the Dockerfile: python, pip, groupadd/useradd (in minbase).
PACKAGES=python3,python3-pip,python-is-python3
BASE_RECIPE=1                               # bump when the base is made differently
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/kproxy
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt

no_engine() { echo "build-image: no container can run here: $*" >&2; exit "$NO_ENGINE"; }

engine_flags() {                            # for podman run and podman build
    # runc, not crun, when it is there: crun 1.8 (Debian 12) refuses to start anything on a
    # hybrid cgroup hierarchy whose v2 part has controllers ("cgroups in hybrid mode not
    # supported"); runc runs on v1, v2 and hybrid alike.
    if command -v runc >/dev/null; then
        echo --runtime; echo runc
    fi
    # The caller's own limits: podman asks by default for more (1048576 open files) than a
    # root without CAP_SYS_RESOURCE may set, and the container start then fails ("setrlimit
    # RLIMIT_NOFILE: Operation not permitted"). Podman lowers its own process limit to
    # kernel.pid_max, and a container may not ask for more processes than podman holds.
    local files procs pid_max
    files=$(ulimit -Hn)
    procs=$(ulimit -Hu)
    pid_max=$(cat /proc/sys/kernel/pid_max)
    if [ "$procs" = unlimited ] || [ "$procs" -gt "$pid_max" ]; then
        procs=$pid_max
    fi
    echo --ulimit; echo "nofile=$files:$files"
    echo --ulimit; echo "nproc=$procs:$procs"
}

run_flags() {
    engine_flags
    # Podman runs the image's HEALTHCHECK from systemd timers; without systemd it logs an
    # error at every start and checks nothing.
    if [ ! -d /run/systemd/system ]; then
        echo --no-healthcheck
    fi
}

if [ "${1:-}" = --run-flags ]; then
    run_flags
    exit 0
fi
mapfile -t FLAGS < <(engine_flags)
mapfile -t RUN_FLAGS < <(run_flags)

command -v podman >/dev/null || no_engine "podman is not installed (scripts/setup-image.sh installs it)"
[ "$(id -u)" = 0 ] || no_engine "this script runs rootful podman and debootstrap: run it as root"

# ---- the base: a minimal Debian with Python, standing in for python:3.12-slim
base_key=$(echo "$SUITE $PACKAGES $BASE_RECIPE" | sha256sum | cut -c1-12)
BASE=localhost/kproxy-base:$SUITE-$base_key
if ! podman image exists "$BASE"; then
    tarball=$CACHE/image-base-$SUITE-$base_key.tar
    if [ ! -f "$tarball" ]; then
        command -v debootstrap >/dev/null || no_engine "debootstrap is not installed (scripts/setup-image.sh installs it)"
        mkdir -p "$CACHE"
        rootfs=$(mktemp -d "$CACHE/rootfs.XXXXXX")
        trap 'rm -rf "$rootfs" "$rootfs.tar"' EXIT
        echo "build-image: debootstrap $SUITE into $rootfs (a few minutes, once per machine)" >&2
        start=$SECONDS
        debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" "$MIRROR" >&2
        # pip in python:3.12-slim installs into the system's Python; Debian's refuses to
        # (PEP 668) while this marker is there. This base stands in for that image only.
        rm -f "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
        tar -C "$rootfs" -cf "$rootfs.tar" .
        mv "$rootfs.tar" "$tarball"                 # whole or not at all, whoever else builds
        rm -rf "$rootfs"
        trap - EXIT
        echo "build-image: base rootfs made in $((SECONDS - start)) s" >&2
    fi
    podman import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' "$tarball" "$BASE" >&2
fi
# Can a container start at all? (Here is where a machine without the means says so.)
if ! error=$(podman run --rm --network none "${RUN_FLAGS[@]}" "$BASE" python3 -c 'import sys; assert sys.version_info >= (3, 11)' 2>&1); then
    no_engine "podman run ${RUN_FLAGS[*]} $BASE: $error"
fi

# ---- the image, named by a hash of everything that goes into it
inputs=$( (sha256sum deploy/Dockerfile .dockerignore pyproject.toml README.md constraints.txt
           find kproxy -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | sort -z | xargs -0 sha256sum
           echo "$BASE") | sha256sum | cut -c1-12)
IMAGE=localhost/kproxy:$inputs
if ! podman image exists "$IMAGE"; then
    start=$SECONDS
    # --network host: the build container uses the host's network as is (pip reaches PyPI
    # as the host does). The host's CA bundle is mounted over the base's for the RUN steps
    # only (nothing of it stays in the image), so pip trusts what the host trusts, e.g. a
    # TLS-inspecting proxy. --format docker keeps the HEALTHCHECK (OCI images have none).
    podman build --pull=never --format docker --layers=false --network host "${FLAGS[@]}" \
        --volume "$CA_BUNDLE:$CA_BUNDLE:ro" --build-arg "PYTHON_IMAGE=$BASE" \
        -f deploy/Dockerfile -t "$IMAGE" -t localhost/kproxy:latest . >&2
    echo "build-image: image built in $((SECONDS - start)) s" >&2
    # Earlier builds' tags (other sources): each holds a few hundred MB of layers. One a
    # container still runs (another checkout's test, say) stays.
    podman images --format '{{.Repository}}:{{.Tag}}' localhost/kproxy | while read -r old; do
        case $old in "$IMAGE"|localhost/kproxy:latest) ;; *) podman rmi "$old" >/dev/null 2>&1 || true ;; esac
    done
fi
podman tag "$IMAGE" localhost/kproxy:latest
echo "$IMAGE"
