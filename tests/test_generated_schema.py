"""The committed generated schema matches a fresh generation from Kafka's jars."""

import importlib.util
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kproxy.protocol.schema import REMOVED_VERSIONS, SCHEMA_SOURCES

ROOT = Path(__file__).resolve().parent.parent
GENERATOR = ROOT / "tools" / "generate_schema.py"


def test_generated_schema_is_up_to_date():
    result = subprocess.run([sys.executable, str(GENERATOR), "--check"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "up to date" in result.stdout


def _jar_cache() -> Path:
    """Where the generator keeps the kafka-clients jars (the check above fills it)."""
    spec = importlib.util.spec_from_file_location("generate_schema", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)   # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module.CACHE


def _request_versions(jar: Path) -> dict[int, set[int]]:
    """api key -> released request versions, straight from the jar's JSON definitions."""
    out = {}
    with zipfile.ZipFile(jar) as zf:
        for name in zf.namelist():
            if not re.fullmatch(r"common/message/\w+Request\.json", name):
                continue
            text = re.sub(r"^\s*//.*$", "", zf.read(name).decode(), flags=re.M)
            spec = json.loads(text)
            if spec["type"] != "request":
                continue
            valid = spec["validVersions"]
            if valid == "none":
                versions = set()
            else:
                lo, _, hi = valid.partition("-")
                versions = set(range(int(lo), int(hi or lo) + 1))
            if spec.get("latestVersionUnstable") and versions:
                versions.discard(max(versions))     # early access, never released
            out[spec["apiKey"]] = versions
    return out


def test_removed_versions_match_the_jars():
    cache = _jar_cache()
    jars = [cache / f"kafka-clients-{version}.jar" for version in SCHEMA_SOURCES]
    missing = [jar for jar in jars if not jar.exists()]
    if missing:
        pytest.skip(f"kafka-clients jars not cached: {', '.join(map(str, missing))}")
    old, new = (_request_versions(jar) for jar in jars)
    expected = {(key, v) for key, versions in old.items() for v in versions - new.get(key, set())}
    table = {(key, v) for key, (lo, hi) in REMOVED_VERSIONS.items() for v in range(lo, hi + 1)}
    assert table == expected
    # Produce is decided by its definition (3-13), not by the 0-13 a 4.x broker advertises.
    assert min(new[0]) == 3 and (0, 0) in table
