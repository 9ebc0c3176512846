#!/usr/bin/env bash
# `make audit`: known vulnerabilities in the versions kproxy installs (constraints.txt), by
# pip-audit against PyPI's advisory data, else OSV's.
#
# pip-audit reports a package its service cannot look up as "skipped" and still prints "No
# known vulnerabilities found" with exit 0: on a network where the advisory service does
# not answer (PyPI's per-version JSON API returns 404 through some mirrors and proxies, and
# OSV may be unreachable), a clean result would mean nothing. So a canary goes first: a
# release with published advisories (requests 2.19.0, CVE-2018-18074) must be reported as
# vulnerable, or the audit is not run. --strict then fails on any package not checked.
#
# AUDIT_OSV_URL: another OSV-compatible endpoint (a mirror inside a closed network).
# Exit 0: every pin checked, none has a known vulnerability. 1: vulnerabilities found, or
# a pin could not be checked. 2: audit not run (no advisory database answered).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/tools.sh
tools_install
CANARY="requests==2.19.0"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
echo "$CANARY" > "$scratch/canary.txt"

reasons=()
answers() {     # does the advisory service $1 report the canary's advisories?
    local report="$scratch/canary-$1.json" log="$scratch/canary-$1.log"
    "$TOOLS/bin/pip-audit" -s "$1" ${AUDIT_OSV_URL:+--osv-url "$AUDIT_OSV_URL"} --no-deps --disable-pip --progress-spinner off \
        -r "$scratch/canary.txt" -f json -o "$report" >"$log" 2>&1 || true
    local verdict
    verdict=$("$TOOLS/bin/python" - "$report" "$log" <<'PY'
import json, sys
try:
    report = json.load(open(sys.argv[1]))
except (OSError, ValueError):          # pip-audit gave up: its last words say why
    lines = [l.strip() for l in open(sys.argv[2]) if l.strip()]
    print(lines[-1][:200] if lines else "no answer")
    sys.exit()
found = [d for d in report.get("dependencies", []) if d.get("vulns")]
skipped = [d.get("skip_reason") for d in report.get("dependencies", []) if d.get("skip_reason")]
print("ok" if found else (skipped[0] if skipped else "no advisory reported"))
PY
)
    [ "$verdict" = ok ] && return 0
    reasons+=("$1: $verdict")
    return 1
}

service=""
for candidate in pypi osv; do
    if answers "$candidate"; then
        service=$candidate
        break
    fi
done
if [ -z "$service" ]; then
    why=$(IFS=";"; echo "${reasons[*]}")
    echo "audit not run: database unreachable (no advisory service reported the published" \
         "advisories of $CANARY from this machine: ${why//;/; }); no package was checked" >&2
    exit 2
fi
echo "audit: constraints.txt against $service's advisories"
"$TOOLS/bin/pip-audit" -s "$service" ${AUDIT_OSV_URL:+--osv-url "$AUDIT_OSV_URL"} --no-deps --disable-pip --strict --progress-spinner off \
    -r constraints.txt
