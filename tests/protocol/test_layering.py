"""The codec is sans-I/O: its modules import no I/O machinery and nothing above them."""

import ast
import subprocess
import sys
from pathlib import Path

PROTOCOL = Path(__file__).resolve().parents[2] / "kproxy" / "protocol"
FORBIDDEN = {"asyncio", "socket", "ssl", "selectors", "uvloop", "threading"}


def imported_modules(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield "." * node.level + (node.module or "")


def test_protocol_modules_import_no_io_and_nothing_outside_the_codec():
    files = sorted(PROTOCOL.glob("*.py"))
    assert len(files) >= 8
    for path in files:
        for name in imported_modules(path):
            assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"
            assert not name.startswith(".."), f"{path.name} reaches outside the codec: {name}"
            assert not name.startswith("kproxy.") or name.startswith("kproxy.protocol"), \
                f"{path.name} imports {name}"


def test_importing_the_codec_loads_no_event_loop():
    code = ("import sys, kproxy.protocol, kproxy.protocol.records, kproxy.protocol.connection; "
            "print(sorted(m for m in ('asyncio', 'uvloop') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
