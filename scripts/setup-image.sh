#!/usr/bin/env bash
# Installs what tests/deploy/test_image.py needs to build and run kproxy's container image
# without a registry (scripts/build-image.sh): podman and runc to build and run it,
# debootstrap to make its Debian base. Only what is missing; needs root and apt.
set -euo pipefail

need_apt=()
command -v podman >/dev/null || need_apt+=(podman)
command -v runc >/dev/null || need_apt+=(runc)            # crun 1.8 cannot run on hybrid cgroups
command -v debootstrap >/dev/null || need_apt+=(debootstrap)
if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "setup-image: installing ${need_apt[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
    else
        echo "setup-image: please install ${need_apt[*]} (needs root); the image test skips without them" >&2
    fi
fi
