"""``benchmarks/_cpu_profile.py``: a process started with ``BENCH_PROFILE_OUT`` leaves a CPU
profile and its gc pauses at exit."""

from __future__ import annotations

import json
import os
import pstats
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# A process that profiles itself, burns a little CPU in a function of its own, collects once.
SCRIPT = """
import gc
from benchmarks import _cpu_profile
_cpu_profile.start_if_asked()
def busy():
    return sum(i * i for i in range(200_000))
busy()
gc.collect()
print(__import__("os").getpid())
"""


def test_profile_and_gc_pauses_are_written_at_exit(tmp_path):
    out = tmp_path / "kproxy.prof"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BENCH_PROFILE_OUT": str(out)}
    pid = subprocess.run([sys.executable, "-c", SCRIPT], env=env, check=True, capture_output=True, text=True,
                         timeout=60).stdout.strip()
    stats = pstats.Stats(f"{out}.{pid}")
    busy = [v for k, v in stats.stats.items() if k[2] == "busy"]
    assert busy and busy[0][3] > 0                # called, with CPU time charged to it
    pauses = json.loads(Path(f"{out}.{pid}.gc.json").read_text())
    assert pauses["runs"][2] >= 1 and pauses["seconds"][2] > 0

