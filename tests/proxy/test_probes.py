"""The probe port (``probe_listen``): /healthz and /readyz from a process of their own.

Issue 10 item 4's health-check part: on the admin port a probe waited behind a
scrape storm's connections, and on a thread of its own behind the proxy's
garbage collections. Here a real kproxy (ProxyThread, or ``kproxy run`` in a
process of its own) with its admin port and probe process: probes answered while
scrapes are held in flight, /healthz turning 503 when the event loop is blocked
or the whole kproxy process is stopped (SIGSTOP; answered meanwhile), /readyz 503
when the broker does not answer, the probe process gone with a killed kproxy, a
taken probe port refused at start, and the settings.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from pathlib import Path

import pytest

from kproxy import config as config_module
from kproxy.admin import admin as admin_module
from kproxy.probes.probes import READY_WAIT_S
from tests.proxy.harness import (KproxyProcess, ProxyThread, children_of, exited, process_state,
                                  silent_port, wait_for)
from tests.proxy.probes import PROBE_ANSWER_TIMEOUT_S, get

PROBE_ANY = "127.0.0.1:0"
SCRAPES = 200                      # far more than the admin port lets wait for one render
PROBES = 20
STALL_LIMIT_S = 0.5                # the heartbeat's limit in these tests (default 5 s)
START_TIMEOUT_S = 30.0
# `kproxy run` with the stall limit injected (a constant, read when the heartbeat is made).
KPROXY_RUN = ("import sys; from kproxy.probes import probes; probes.LOOP_STALL_LIMIT_S = %r; "
              "from kproxy.cli import main; sys.exit(main(sys.argv[1:]))" % STALL_LIMIT_S)


def test_probe_listen_from_file_env_and_flags():
    base = {"upstream": "127.0.0.1:9092"}
    assert config_module.build(base).probe_listen is None                     # off by default
    assert config_module.build(base, {"probe_listen": "0.0.0.0:9645"}).probe_listen == ("0.0.0.0", 9645)
    env = config_module.from_env({"KPROXY_PROBE_LISTEN": "127.0.0.1:19645"})
    assert config_module.build(base, env).probe_listen == ("127.0.0.1", 19645)
    assert config_module.build(base, env, {"probe_listen": "off"}).probe_listen is None
    with pytest.raises(config_module.ConfigError, match="probe_listen"):
        config_module.build(base, {"probe_listen": "nowhere"})


def test_the_probe_port_answers_the_probes_and_nothing_else(kafka_cluster):
    with ProxyThread(upstream=kafka_cluster.bootstrap_servers, probe_listen=PROBE_ANY) as proxy:
        probe, admin = proxy.runtime.probe_url, proxy.admin_url
        assert probe is not None and probe != admin
        answerer = proxy.runtime.probes.process
        assert answerer.pid != os.getpid() and answerer.poll() is None       # a process of its own
        assert get(probe + "/healthz") == (200, "ok\n")
        status, body = get(probe + "/readyz")
        assert status == 200 and "answers ApiVersions" in body, body
        for path in ("/metrics", "/capture", "/live/", "/"):
            assert get(probe + path)[0] == 404, path
        # The admin port's probes answer as before.
        assert get(admin + "/healthz") == (200, "ok\n") and get(admin + "/readyz")[0] == 200
    assert proxy.runtime.probe_url is None                    # closed with the rest
    assert answerer.poll() == 0                               # and its process ended


def test_probes_are_answered_while_a_scrape_storm_is_in_flight(kafka_cluster):
    """The render is held, so the scrapes the admin port lets wait stay unanswered (the
    storm is not over) while every probe on the probe port gets 200."""
    release = threading.Event()
    renders = []

    def held_render() -> bytes:
        renders.append(1)
        release.wait(60)
        return b"# held\n"

    with ProxyThread(upstream=kafka_cluster.bootstrap_servers, probe_listen=PROBE_ANY) as proxy:
        proxy.runtime.scrape.produce = held_render
        host, port = proxy.runtime.admin.address
        scrapes = []
        try:
            for _ in range(SCRAPES):
                sock = socket.create_connection((host, port))
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: storm\r\n\r\n")
                scrapes.append(sock)
            held = admin_module.MAX_WAITING_SCRAPES
            wait_for(lambda: proxy.runtime.scrape.refused == SCRAPES - held, 30, "the excess scrapes' 503")
            probe = proxy.runtime.probe_url
            answers = [get(probe + path)[0] for _ in range(PROBES) for path in ("/healthz", "/readyz")]
            in_flight = proxy.runtime.scrape._waiting
            release.set()
            for sock in scrapes:
                sock.settimeout(PROBE_ANSWER_TIMEOUT_S)
            statuses = [int(sock.recv(64).split()[1]) for sock in scrapes]
        finally:
            release.set()
            for sock in scrapes:
                sock.close()
    assert answers == [200] * (2 * PROBES), answers
    assert in_flight == held and len(renders) == 1           # the storm was still on meanwhile
    assert statuses.count(200) == held and statuses.count(503) == SCRAPES - held


def test_healthz_turns_503_when_the_event_loop_is_blocked():
    """The probe process answers while the loop is blocked, and says it is: 503 past the
    heartbeat's limit, and /readyz 503 when the loop cannot run the broker check; both
    well before the loop turns again. Then 200 again."""
    block_s = 2 * READY_WAIT_S + 2
    unreachable = socket.socket()
    unreachable.bind(("127.0.0.1", 0))                      # bound, not listening: refused
    proxy = ProxyThread(upstream="%s:%d" % unreachable.getsockname(), probe_listen=PROBE_ANY)
    proxy.runtime.heartbeat.stall_limit = STALL_LIMIT_S     # posted with every heartbeat
    with proxy:
        probe = proxy.runtime.probe_url
        assert get(probe + "/healthz")[0] == 200
        unblocked, release = threading.Event(), threading.Event()
        # The loop does nothing else until the checks below are done (block_s at most).
        proxy.loop.call_soon_threadsafe(release.wait, block_s)
        proxy.loop.call_soon_threadsafe(unblocked.set)
        stalled = []
        wait_for(lambda: stalled.append(get(probe + "/healthz")) or stalled[-1][0] == 503,
                 block_s, "/healthz to say the loop is stalled")
        healthz_while_blocked = not unblocked.is_set()
        ready_status, ready_body = get(probe + "/readyz")
        readyz_while_blocked = not unblocked.is_set()
        release.set()
        wait_for(unblocked.is_set, block_s + 5, "the loop to run again")
        wait_for(lambda: get(probe + "/healthz")[0] == 200, 5, "/healthz to recover")
    unreachable.close()
    assert healthz_while_blocked and "event loop stalled" in stalled[-1][1], stalled[-1]
    assert readyz_while_blocked and ready_status == 503, (ready_status, ready_body)
    assert "did not check the upstream" in ready_body, ready_body


def test_a_gateway_serves_every_broker_port_once_ready(kafka_cluster, node_ids):
    """Gateway replicas behind one Service (the Helm chart's): a client that bootstrapped
    through one replica may open its broker connections on another, through which no
    client's Metadata has passed. The readiness check learns the brokers, so a gateway
    that answers ready accepts on every broker's port."""
    with ProxyThread(upstream=kafka_cluster.bootstrap_servers) as proxy:
        assert proxy.served_broker_addresses() == set()        # no client yet, nothing learnt
        status, body = get(proxy.admin_url + "/readyz")
        assert status == 200, body
        served = proxy.runtime.proxy.broker_addresses()
        assert sorted(served) == sorted(node_ids)
        for host, port in served.values():
            socket.create_connection((host, port), timeout=PROBE_ANSWER_TIMEOUT_S).close()


def test_readyz_on_the_probe_port_is_503_when_the_broker_does_not_answer():
    """A port that accepts TCP but never answers (a stopped broker): 503 naming it."""
    with silent_port() as (host, port), \
            ProxyThread(upstream=f"{host}:{port}", probe_listen=PROBE_ANY) as proxy:
        status, body = get(proxy.runtime.probe_url + "/readyz")
        healthz = get(proxy.runtime.probe_url + "/healthz")[0]
    assert status == 503 and f"{host}:{port}: TimeoutError" in body, (status, body)
    assert healthz == 200                                   # alive, only not ready


# ---------------------------------------------------------------- `kproxy run`, a process of its own

class KproxyRun(KproxyProcess):
    """``kproxy run`` (stall limit STALL_LIMIT_S) with a probe port and no admin port."""

    def __init__(self, directory: Path, upstream: str, probe_port: int | None = None,
                 ready: str | None = "/healthz"):
        super().__init__(directory, ready=ready, entry=("-c", KPROXY_RUN), upstream=upstream,
                         admin_listen="off", probe_listen=f"127.0.0.1:{probe_port or 0}")

    def probe_pid(self) -> int:
        """The probe process: kproxy's child."""
        children = children_of(self.pid)
        assert len(children) == 1, children
        return children[0]


def test_probes_are_answered_while_the_kproxy_process_is_stopped(tmp_path):
    """SIGSTOP freezes every thread of kproxy (a thread of its own would freeze too): the
    probe process still answers, /healthz 503 once the stall limit passes, /readyz 503
    when the loop cannot check; both 200/serving again after SIGCONT."""
    unreachable = socket.socket()
    unreachable.bind(("127.0.0.1", 0))
    with KproxyRun(tmp_path, "%s:%d" % unreachable.getsockname()) as kproxy:
        kproxy.process.send_signal(signal.SIGSTOP)
        try:
            stalled = []
            wait_for(lambda: stalled.append(get(kproxy.probe_url + "/healthz")) or stalled[-1][0] == 503,
                     START_TIMEOUT_S, "/healthz to say the loop is stalled")
            ready = get(kproxy.probe_url + "/readyz")
            stopped = process_state(kproxy.process.pid)
        finally:
            kproxy.process.send_signal(signal.SIGCONT)
        wait_for(lambda: get(kproxy.probe_url + "/healthz")[0] == 200, START_TIMEOUT_S, "/healthz to recover")
    unreachable.close()
    assert stopped == "T"                                        # still stopped when both answered
    assert "event loop stalled" in stalled[-1][1] and f"limit {STALL_LIMIT_S:g}s" in stalled[-1][1], stalled[-1]
    assert ready[0] == 503 and "did not check the upstream" in ready[1], ready


def test_the_probe_process_ends_when_kproxy_is_killed(tmp_path):
    with KproxyRun(tmp_path, "127.0.0.1:1") as kproxy:
        probe_pid = kproxy.probe_pid()
        kproxy.process.kill()                                     # SIGKILL: no cleanup of its own
        kproxy.process.wait(30)
        wait_for(lambda: exited(probe_pid), START_TIMEOUT_S, "the probe process to exit")
    with pytest.raises(OSError):                                   # and nothing listens any more
        get(kproxy.probe_url + "/healthz")


def test_a_taken_probe_port_stops_start_with_one_line_naming_it(tmp_path):
    with silent_port() as (_, taken), \
            KproxyRun(tmp_path, "127.0.0.1:1", probe_port=taken, ready=None) as kproxy:
        line = kproxy.refusal(START_TIMEOUT_S)
    assert "probe_listen 127.0.0.1:" in line and "address already in use" in line.lower(), line
