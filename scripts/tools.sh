# Sourced by scripts/constraints.sh and scripts/audit.sh: a separate virtualenv for the
# supply-chain tools, so their own dependencies never mix with (or get pinned as) kproxy's.
# The tools are pinned: a refresh or an audit run twice uses the same resolver and auditor.
UV_VERSION=0.13.9
PIP_AUDIT_VERSION=2.10.1
TOOLS=${TOOLS:-.venv-tools}
PYTHON=${PYTHON:-python3}

tools_install() {
    if [ ! -x "$TOOLS/bin/python" ]; then
        "$PYTHON" -m venv "$TOOLS"
    fi
    local stamp="$TOOLS/.installed-$UV_VERSION-$PIP_AUDIT_VERSION"
    if [ ! -f "$stamp" ]; then
        "$TOOLS/bin/pip" install -q "uv==$UV_VERSION" "pip-audit==$PIP_AUDIT_VERSION"
        touch "$stamp"
    fi
}
