"""The admin listener on aiohttp: slow callers are dropped, scrapes are shared and never stall Kafka.

Issue 10 item 8 (an admin slowloris kept 200/200 connections open) and item 4's
scrape part (1,000 concurrent scrapes stopped Kafka traffic), against a real
AdminServer, and for the storm a real kproxy in front of a real broker.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
import urllib.request
import uuid

import pytest

from kproxy.admin import admin as admin_module
from kproxy.admin.admin import AdminServer, ScrapeBusy, SharedRender
from tests.proxy.harness import ProxyThread

SHORT_TIMEOUT_S = 0.5          # the listener's read timeout in these tests (default: 5 s)
SLOW_CALLERS = 40


async def _healthz():
    return 200, "text/plain", b"ok\n"


async def _echo(body: bytes):
    return 200, "application/octet-stream", body


def _closed_by_peer(sock: socket.socket) -> bool:
    """True once the server has closed (or reset) the connection."""
    try:
        return sock.recv(65536) == b""
    except (BlockingIOError, socket.timeout):
        return False
    except ConnectionError:
        return True


def test_slowloris_headers_and_trickled_bodies_are_dropped():
    """Callers that dribble header lines (or a body) forever are closed; others are served."""
    async def scenario():
        admin = AdminServer({"/healthz": _healthz, "/echo": {"POST": _echo}}, read_timeout=SHORT_TIMEOUT_S)
        await admin.start("127.0.0.1", 0)
        host, port = admin.address
        loop = asyncio.get_running_loop()
        try:
            slow = []
            for i in range(SLOW_CALLERS):
                sock = socket.create_connection((host, port))
                sock.setblocking(False)
                if i % 2:
                    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")        # headers never end
                else:
                    sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nab")
                slow.append(sock)
            closed: set[int] = set()
            deadline = time.monotonic() + 20 * SHORT_TIMEOUT_S
            while len(closed) < len(slow) and time.monotonic() < deadline:
                for i, sock in enumerate(slow):       # one more header line / body byte each round
                    if i in closed:
                        continue
                    try:
                        sock.send(b"X-Slow: 1\r\n" if i % 2 else b"c")
                    except OSError:
                        pass
                    if _closed_by_peer(sock):
                        closed.add(i)
                # Meanwhile a well-behaved probe is answered.
                status = await loop.run_in_executor(None, _get_status, f"http://{host}:{port}/healthz")
                assert status == 200
                await asyncio.sleep(SHORT_TIMEOUT_S / 4)
            for sock in slow:
                sock.close()
            return len(closed)
        finally:
            await admin.stop()

    assert asyncio.run(scenario()) == SLOW_CALLERS


def test_malformed_requests_get_400_and_one_log_line(caplog, monkeypatch):
    """aiohttp would log each with a traceback at ERROR: a log anyone could fill."""
    monkeypatch.setattr(admin_module.malformed_request_log, "logged_at", float("-inf"))
    garbage = [b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n",
               b"GET /healthz HTTP/1.1\r\n" + b"X-Many: y\r\n" * 500 + b"\r\n",
               b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Long: " + b"v" * 20_000 + b"\r\n\r\n",
               b"GET /healthz HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"] * 5

    async def scenario() -> list[bytes]:
        admin = AdminServer({"/healthz": _healthz})
        await admin.start("127.0.0.1", 0)
        answers = []
        try:
            for payload in garbage:
                reader, writer = await asyncio.open_connection(*admin.address)
                writer.write(payload)
                answers.append(await asyncio.wait_for(reader.read(64), 10))
                writer.close()
        finally:
            await admin.stop()
        return answers

    with caplog.at_level(logging.INFO):
        answers = asyncio.run(scenario())
    assert all(a.startswith(b"HTTP/1.") and b" 400 " in a[:16] for a in answers), answers
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    lines = [r.getMessage() for r in caplog.records if r.name == "kproxy.admin.http"]
    assert len(lines) == 1 and "malformed HTTP request from 127.0.0.1 (400" in lines[0], lines


def test_bodies_over_the_limit_are_refused_before_the_handler_runs():
    """A declared length over 64 KiB, and a chunked body that grows past it: 413 either way."""
    seen = []

    async def record(body: bytes):
        seen.append(len(body))
        return 200, "text/plain", b"ok\n"

    async def scenario() -> list[bytes]:
        admin = AdminServer({"/echo": {"POST": record}})
        await admin.start("127.0.0.1", 0)
        big = b"x" * (admin_module.MAX_BODY_BYTES + 1)
        chunked = b"".join(b"%x\r\n%s\r\n" % (len(part), part)
                           for part in (big[:40_000], big[40_000:])) + b"0\r\n\r\n"
        answers = []
        try:
            for head, body in ((b"Content-Length: %d\r\n" % len(big), big),
                               (b"Transfer-Encoding: chunked\r\n", chunked),
                               (b"Content-Length: 5\r\n", b"small")):
                reader, writer = await asyncio.open_connection(*admin.address)
                writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n" + body)
                answers.append(await asyncio.wait_for(reader.read(200), 10))
                writer.close()
        finally:
            await admin.stop()
        return answers

    too_long, too_long_chunked, small = asyncio.run(scenario())
    assert b" 413 " in too_long[:16] and too_long.endswith(b"body too large\n"), too_long
    assert b" 413 " in too_long_chunked[:16], too_long_chunked
    assert b" 200 " in small[:16] and seen == [5]


def _get_status(url: str) -> int:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status


def test_shared_render_renders_once_for_concurrent_callers_and_refuses_a_storm():
    release = threading.Event()
    calls = []

    def produce() -> bytes:
        calls.append(1)
        release.wait(10)
        return b"exposition %d" % len(calls)

    async def scenario():
        render = SharedRender(produce, max_waiting=5)
        callers = [asyncio.create_task(render()) for _ in range(5)]
        await asyncio.sleep(0.05)
        with pytest.raises(ScrapeBusy):
            await render()                                  # the sixth waiter is refused at once
        callers[0].cancel()                                 # a caller that goes away...
        await asyncio.sleep(0.05)
        release.set()
        results = await asyncio.gather(*callers[1:])        # ...does not cancel the others' render
        assert results == [b"exposition 1"] * 4
        assert await render() == b"exposition 2"            # a later call renders afresh
        return render

    render = asyncio.run(scenario())
    assert render.renders == 2 and render.refused == 1 and len(calls) == 2


def test_a_scrape_storm_does_not_stop_kafka_traffic(kafka_cluster):
    """Hundreds of concurrent scrapes in waves while a producer sends through kproxy:
    every record is acknowledged, and the storm cost far fewer renders than scrapes."""
    from confluent_kafka import Producer

    scrapes = 400
    with ProxyThread(upstream=kafka_cluster.bootstrap_servers) as proxy:
        url = proxy.admin_url + "/metrics"
        answered: list[int] = []
        stop = threading.Event()

        def storm():
            async def wave():
                import aiohttp
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                    async def one():
                        try:
                            async with session.get(url, timeout=aiohttp.ClientTimeout(total=60)) as r:
                                await r.read()
                                answered.append(r.status)
                        except (aiohttp.ClientError, asyncio.TimeoutError):
                            answered.append(0)
                    while not stop.is_set():
                        await asyncio.gather(*(one() for _ in range(scrapes)))
            asyncio.run(wave())

        stormer = threading.Thread(target=storm, daemon=True)
        stormer.start()
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "linger.ms": 0,
                             "session.timeout.ms": 6000, "message.timeout.ms": 30000})
        topic = f"storm-{uuid.uuid4().hex[:6]}"
        delivered, failed = [], []

        def on_delivery(err, msg):
            (failed if err is not None else delivered).append(err)

        try:
            while len(answered) < 2 * scrapes:             # two full waves while producing
                producer.produce(topic, b"during the storm", on_delivery=on_delivery)
                producer.poll(0.05)
            producer.flush(60)
        finally:
            stop.set()
            stormer.join(120)
        renders = proxy.runtime.scrape.renders
    assert failed == [] and len(delivered) > 0
    ok = answered.count(200)
    assert ok > 0 and set(answered) <= {200, 503}, sorted(set(answered))
    assert renders < ok, "concurrent scrapes did not share a render"
