"""``kproxy demo`` as a newcomer runs it: its whole output must read as a working system."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kproxy.embedded import KAFKA_4_VERSION

pytestmark = pytest.mark.timeout(300)

ROUNDS_SEEN = 2                   # traffic rounds (one every ~3 s once the group has joined) before SIGTERM
DEMO_TIMEOUT_S = 240              # a broker start, the run and the shutdown on a busy machine
ROUND = re.compile(r"^--- round (\d+): produced (\d+), consumed (\d+) through kproxy$")
# A log line of a client library (kafka-python logs under "kafka.*").
CLIENT_LOG = re.compile(r"^\S+ \S+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) kafka[.\s]")
# kproxy's log line per connection opened or closed (kproxy.relay, INFO).
CONNECTION_LOG = re.compile(r"kproxy\.relay conn=\d+ (open|close) ")
REPO = Path(__file__).resolve().parent.parent


def test_demo_rounds_get_through_and_sigterm_stops_it_in_order(require_kafka):
    """One demo run, as a newcomer reads it: every round gets through, nothing reads as an
    error. Then SIGTERM (a container stop, `timeout`, a supervisor) is treated as Ctrl-C:
    clients close first, then kproxy, then the broker, and the demo exits 0 with its
    summary, rather than being interrupted mid-flight (exit 130, no summary, analysis
    skipped). One run proves both: a demo costs a broker start."""
    require_kafka(KAFKA_4_VERSION)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    # --duration only bounds it: the test stops it once ROUNDS_SEEN rounds got through.
    demo = subprocess.Popen([sys.executable, "-m", "kproxy", "demo", "--duration", str(DEMO_TIMEOUT_S)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, rounds_seen = [], 0        # stdout and stderr (kproxy's log) as they interleaved
    try:
        for line in demo.stdout:
            lines.append(line.rstrip("\n"))
            rounds_seen += bool(ROUND.match(lines[-1]))
            if rounds_seen == ROUNDS_SEEN:
                break
        demo.send_signal(signal.SIGTERM)
        lines += demo.stdout.read().splitlines()        # the file's own buffer first: not communicate()
        demo.wait(DEMO_TIMEOUT_S)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    shown = "\n".join(lines[-40:])
    assert demo.returncode == 0, shown
    assert not [line for line in lines if "ERROR" in line or "WARNING" in line or "Traceback" in line], shown
    assert not [line for line in lines if CLIENT_LOG.match(line)], shown
    # kproxy's per-connection log lines stay out of the pair lines; the demo sums them up.
    assert not [line for line in lines if CONNECTION_LOG.search(line)], shown
    text = "\n".join(lines)
    summary = re.search(r"^kproxy relayed (\d+) client connections \(closed: (.*)\)$", text, re.M)
    assert summary and int(summary[1]) >= 3, shown          # the admin client, producer, consumer
    assert "by the client" in summary[2], summary[0]          # worded, not the relay's raw reason
    assert "stopping" not in summary[0], summary[0]

    bootstrap = re.search(r"^kproxy bootstrap\s+127\.0\.0\.1:(\d+)", text, re.M)
    listening = re.search(r"kproxy gateway listening on 127\.0\.0\.1:(\d+)", text)
    assert bootstrap and listening and bootstrap[1] == listening[1] != "0"   # what kproxy bound
    assert re.search(r"^live page\s+http://127\.0\.0\.1:\d+/ ", text, re.M), text[:2000]

    rounds = [ROUND.match(line) for line in lines if line.startswith("--- ")]
    assert all(rounds), [line for line in lines if line.startswith("--- ")]
    assert len(rounds) >= ROUNDS_SEEN
    assert all(m[2] == m[3] == "20" for m in rounds), [m[0] for m in rounds]
    assert "stopping: clients first, then kproxy, then the broker ..." in lines, shown
    assert lines[-1] == "demo stopped; broker stopped", shown
