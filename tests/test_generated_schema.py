"""The committed generated schema matches a fresh generation from Kafka's jars."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_generated_schema_is_up_to_date():
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "generate_schema.py"), "--check"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "up to date" in result.stdout
