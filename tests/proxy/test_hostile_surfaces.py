"""Hostile input against kproxy's other faces: the live page's data routes, its event stream,
the capture writer's disk, and TLS handshakes naming absurd hosts.

Each test drives a real kproxy (in front of the session's Kafka broker where traffic
matters) the way an attacker or a broken environment would, and checks what kproxy
promises: a clear 4xx and no traceback, bounded memory, one log line, traffic unaffected.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import secrets
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest

from kproxy.admin.live_web import MAX_ID_DIGITS
from tests.proxy.harness import ProxyThread

TOKEN = secrets.token_hex(20)


def get(url: str, token: str | None = TOKEN, timeout: float = 30) -> tuple[int, bytes, str]:
    """GET with the admin token: status, body, content type (errors included)."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read(), answer.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers.get("Content-Type", "")


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def errors_logged(caplog) -> list[logging.LogRecord]:
    """kproxy's and asyncio's ERROR records (clients log their own, e.g. an unknown topic)."""
    return [r for r in caplog.records if r.levelno >= logging.ERROR
            and (r.name.startswith("kproxy") or r.name == "asyncio")]


# ---------------------------------------------------------------- ids that are not ids

# Path segments a caller may put where a pair or connection id goes. Each is percent-encoded
# as a browser would send it; aiohttp decodes it before kproxy sees it.
NOT_IDS = [
    "abc", "-1", "0x10", "1.5", " 1", "1e3", "%00",
    "9" * (MAX_ID_DIGITS + 1),            # past any int64
    "9" * 5000,                           # past int()'s 4,300-digit limit: used to be a 500
    "\u00b2",                             # '²': str.isdigit() is true, int() raises: used to be a 500
    "\u0663", "\uff11",                   # Arabic-Indic 3, fullwidth 1: digits, not ASCII
    "..", "..%2F..%2Fetc%2Fpasswd", "1%2F..%2F..%2Fpcapng", "%2e%2e%2f%2e%2e%2fetc",
]


def test_a_pcapng_download_or_pair_with_an_id_that_is_not_one_gets_a_clear_4xx(caplog):
    """The live page's id routes, given ids that are not ids (huge, negative, path-like,
    digits int() refuses): a 4xx with a short JSON or text answer each, never a 500, no
    error logged, nothing served from outside kproxy."""
    caplog.set_level(logging.INFO)
    with ProxyThread(upstream="127.0.0.1:1", broker_port_base=0, admin_token=TOKEN) as proxy:
        answers = {}
        for raw in NOT_IDS:
            segment = urllib.parse.quote(raw, safe="%")
            for path in (f"/live/connections/{segment}/pcapng", f"/live/pairs/{segment}"):
                answers[path] = get(proxy.admin_url + path)
        # A well-formed id of nothing kproxy has: 404 with a reason.
        for path in ("/live/connections/123456/pcapng", "/live/pairs/123456",
                     f"/live/connections/{'9' * MAX_ID_DIGITS}/pcapng"):
            status, body, _ = get(proxy.admin_url + path)
            assert status == 404 and b"error" in body, (path, status, body)
    for path, (status, body, ctype) in answers.items():
        assert 400 <= status < 500, (path[:80], status, body[:200])
        assert len(body) < 200 and b"Traceback" not in body and b"root:" not in body, (path[:80], body[:200])
        assert not ctype.startswith("application/vnd.tcpdump"), path[:80]
    bad_ids = [path for path, (status, _, _) in answers.items() if status == 400]
    assert len(bad_ids) >= 2 * 12, bad_ids       # every id-shaped segment refused as such
    assert not errors_logged(caplog), [r.getMessage() for r in errors_logged(caplog)]


# ---------------------------------------------------------------- the capture's disk fills up

# Room left on the small file system once the filler is written: a few Produce requests'
# worth of pcapng and JSONL, so the capture runs out within the first seconds of traffic.
ROOM_LEFT = 48 * 1024
TINY_FS_BYTES = 1024 * 1024
RECORD = b"r" * 4096
RECORDS_BEFORE_FULL = 60                  # 60 x 4 KiB of pcapng alone: past ROOM_LEFT
RECORDS_AFTER_FULL = 20


@contextlib.contextmanager
def tiny_file_system(mount_point: Path):
    """A 1 MiB tmpfs at ``mount_point``, nearly full (needs CAP_SYS_ADMIN; skipped without)."""
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TINY_FS_BYTES},mode=0700", "tmpfs",
                              str(mount_point)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        free = os.statvfs(mount_point).f_bavail * os.statvfs(mount_point).f_frsize
        (mount_point / "filler").write_bytes(b"\0" * (free - ROOM_LEFT))
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def metric_value(text: str, name: str) -> float:
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")]
    assert len(values) == 1, (name, values)
    return values[0]


def test_a_full_disk_stops_capture_with_one_line_and_a_metric_and_traffic_goes_on(
        kafka_cluster, tmp_path, caplog, monkeypatch):
    """The capture directory's file system fills up (a real ENOSPC, a tmpfs of 1 MiB) while
    a producer sends through kproxy with JSONL, Parquet and pcapng on: capture stops with one
    ERROR line naming the cause, ``kproxy_capture_write_errors_total`` 1, its status says
    why; every record is acknowledged, before and after."""
    from kafka import KafkaProducer

    caplog.set_level(logging.INFO)
    thread_failures = []
    monkeypatch.setattr(threading, "excepthook", lambda args: thread_failures.append(args.exc_value))
    with tiny_file_system(tmp_path / "tiny") as root, \
            ProxyThread(upstream=kafka_cluster.bootstrap_servers, admin_token=TOKEN,
                        capture_root=str(root)) as proxy:
        status, started = post(proxy.admin_url + "/capture/start",
                               {"directory": "full", "formats": ["jsonl", "parquet", "pcapng"],
                                "parquet_flush_seconds": 0.2})
        assert status == 200 and started["active"], started
        topic = f"enospc-{uuid.uuid4().hex[:6]}"
        producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, client_id="enospc", linger_ms=0)
        try:
            for _ in range(RECORDS_BEFORE_FULL):
                producer.send(topic, value=RECORD).get(timeout=30)
            stopped = wait_for_capture_stop(proxy)
            for _ in range(RECORDS_AFTER_FULL):
                producer.send(topic, value=RECORD).get(timeout=30)
        finally:
            producer.close()
        _, metrics, _ = get(proxy.admin_url + "/metrics")
    assert not stopped["active"] and "No space left on device" in stopped["error"], stopped
    assert metric_value(metrics.decode(), "kproxy_capture_write_errors_total") == 1
    errors = errors_logged(caplog)
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert errors[0].name == "kproxy.capture" and "No space left on device" in errors[0].getMessage()
    assert errors[0].exc_info is None                     # one line, no traceback
    assert not thread_failures, thread_failures


def wait_for_capture_stop(proxy, timeout: float = 30.0) -> dict:
    import time
    deadline = time.monotonic() + timeout
    while True:
        status, body, _ = get(proxy.admin_url + "/capture")
        answer = json.loads(body)
        if not answer["active"] or time.monotonic() > deadline:
            return answer
        time.sleep(0.1)
