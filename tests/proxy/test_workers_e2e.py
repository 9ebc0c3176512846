"""``kproxy run --workers 2`` as an operator starts it, in front of a real broker, real clients.

The clients are the witnesses: raw sockets whose every request and byte is known,
and confluent-kafka producing and consuming through the shared port. Each
worker's own (private) metrics prove where connections landed; the supervisor's
/metrics must equal the sum of what the clients did.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from kproxy.protocol import Struct, new_body
from tests.proxy.harness import WORKERS_TOKEN, Workers, children_of, exited, silent_port, value
from tests.proxy.wire import WitnessClient

pytestmark = pytest.mark.broker

START_TIMEOUT_S = 60.0
# Connections opened to show the kernel spreads them: all on one of two workers by chance
# has odds 2 x 2^-16.
SPREAD_CONNECTIONS = 16


def total(samples, name) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


def test_connections_spread_over_both_workers(workers_proxy):
    sockets = [socket.create_connection(("127.0.0.1", workers_proxy.listen_port), timeout=10)
               for _ in range(SPREAD_CONNECTIONS)]
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            open_now = [value(m, "kproxy_connections_open", listener="bootstrap")
                        for m in workers_proxy.per_worker_metrics()]
            if sum(open_now) == SPREAD_CONNECTIONS:
                break
            time.sleep(0.1)
        assert sum(open_now) == SPREAD_CONNECTIONS
        assert len(open_now) == 2 and min(open_now) > 0, open_now         # the kernel used both
        merged = workers_proxy.metrics()
        assert value(merged, "kproxy_connections_open", listener="bootstrap") == SPREAD_CONNECTIONS
    finally:
        for s in sockets:
            s.close()


def test_summed_metrics_equal_what_raw_clients_sent(workers_proxy, workers_topic):
    before = workers_proxy.metrics()
    clients, produces = 8, 5
    sent = 0
    for i in range(clients):
        with WitnessClient(workers_proxy.bootstrap) as client:
            for j in range(produces):
                client.produce(workers_topic, b"raw %d %d" % (i, j))
            sent += client.sent
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:           # a close is counted once kproxy has seen it
        after = workers_proxy.metrics()
        if value(after, "kproxy_connections_open", listener="bootstrap") == 0:
            break
        time.sleep(0.1)
    delta = lambda name, **labels: value(after, name, **labels) - value(before, name, **labels)
    assert delta("kproxy_requests_total", api="Produce") == clients * produces
    assert delta("kproxy_produced_records_total") == clients * produces
    assert delta("kproxy_client_received_bytes_total") == sent
    assert delta("kproxy_connections_opened_total", listener="bootstrap") == clients
    per_worker = [value(m, "kproxy_requests_total", api="Produce") for m in workers_proxy.per_worker_metrics()]
    assert sum(per_worker) == value(after, "kproxy_requests_total", api="Produce")
    assert value(after, "kproxy_workers") == 2 and value(after, "kproxy_workers_up") == 2
    from kproxy.observers.metrics import SupervisorMetrics     # every supervisor series is served
    assert {s.name for f in SupervisorMetrics(2).registry.collect() for s in f.samples} <= \
        {name for name, _ in after}
    assert ("process_resident_memory_bytes", (("worker", "1"),)) in after


def test_produce_and_consume_through_both_workers_lose_nothing(workers_proxy, workers_topic):
    from confluent_kafka import Consumer, Producer
    count = 2000
    producer = Producer({"bootstrap.servers": workers_proxy.bootstrap, "linger.ms": 5})
    delivered = []
    for i in range(count):
        producer.produce(workers_topic, value=b"m%05d" % i,
                         on_delivery=lambda err, msg: delivered.append(err is None))
    assert producer.flush(30) == 0
    assert len(delivered) == count and all(delivered)
    consumer = Consumer({"bootstrap.servers": workers_proxy.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
                         "fetch.queue.backoff.ms": 10})
    consumer.subscribe([workers_topic])
    seen = set()
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and len(seen) < count:
            for msg in consumer.consume(500, timeout=1.0):
                if msg.error() is None and msg.value().startswith(b"m"):
                    seen.add(msg.value())
    finally:
        consumer.close()
    assert seen == {b"m%05d" % i for i in range(count)}


def test_health_readiness_and_the_live_page_name_every_worker(workers_proxy):
    status, body = workers_proxy.get("/readyz")
    assert status == 200 and b"worker 0:" in body and b"worker 1:" in body
    assert workers_proxy.get("/healthz")[0] == 200
    for path in ("/readyz", "/healthz"):       # the probe port is the supervisor's alone
        status, body = workers_proxy.get(path, token=None, base=workers_proxy.probe_url)
        assert status == 200 and b"worker 0:" in body and b"worker 1:" in body, body
    # A slot per worker on the probe board, each posted by its own worker.
    body = workers_proxy.get("/healthz", token=None, base=workers_proxy.probe_url)[1].decode()
    assert body == "".join(f"worker {w['index']}: ok (pid {w['pid']})\n" for w in workers_proxy.workers()), body
    assert workers_proxy.get("/live/overview", token=None)[0] == 401
    status, body = workers_proxy.get("/live/overview")                  # merged from both (no notice)
    assert status == 200 and json.loads(body)["workers"] == 2 and "notice" not in json.loads(body)
    assert workers_proxy.get("/")[0] == 200                              # the page itself
    stream = urllib.request.Request(workers_proxy.admin_url + "/live/stream",
                                    headers={"Authorization": f"Bearer {WORKERS_TOKEN}"})
    with urllib.request.urlopen(stream, timeout=20) as response:  # server-sent events, merged
        assert response.headers["Content-Type"] == "text/event-stream"
        assert response.readline().startswith(b"event: status")


def test_capture_writes_per_worker_files_the_pipeline_reads_together(workers_proxy, workers_topic):
    import pyarrow.parquet as pq
    from kproxy.pipeline.source import resolve_inputs
    assert workers_proxy.call("/capture/start", {"formats": ["parquet"]}, token=None)[0] == 401
    status, body = workers_proxy.call("/capture/start", {"directory": "run1", "formats": ["parquet"]})
    assert status == 200, body
    assert json.loads(body)["state"] == "running"
    for i in range(SPREAD_CONNECTIONS):
        with WitnessClient(workers_proxy.bootstrap) as client:
            client.produce(workers_topic, b"captured %d" % i)
    status, body = workers_proxy.call("/capture/stop", {})
    assert status == 200 and json.loads(body)["state"] == "stopped", body
    directory = workers_proxy.capture_root / "run1"
    names = sorted(p.name for p in directory.glob("*.parquet"))
    assert any("-w0-" in n for n in names) and any("-w1-" in n for n in names), names
    inputs = resolve_inputs([str(directory)])
    assert sorted(os.path.basename(f) for f in inputs.files) == names
    rows = [row for f in inputs.files for row in pq.read_table(f).to_pylist()]
    produced = [r for r in rows if r["api_name"] == "Produce"]
    assert len(produced) == SPREAD_CONNECTIONS
    # Connection ids never collide: worker w numbers its connections w+1, w+1+2, ...
    for f in inputs.files:
        worker = int(os.path.basename(f).split("-w")[1][0])
        ids = {r["connection_id"] for r in pq.read_table(f).to_pylist()}
        assert ids and all(i % 2 == (worker + 1) % 2 for i in ids), (f, ids)
    assert len({r["connection_id"] for r in produced}) == SPREAD_CONNECTIONS
    # `kproxy capture stats DIR` reads every worker's files as one capture.
    from kproxy.observers.capture.cli import compute_stats, read_rows
    summary = compute_stats(read_rows(str(directory), None), 10)
    assert summary["apis"]["Produce"]["pairs"] == summary["connections"] == SPREAD_CONNECTIONS


def test_a_killed_worker_is_restarted_and_the_port_keeps_serving(workers_proxy, workers_topic):
    before = workers_proxy.metrics()
    victim = workers_proxy.workers()[1]
    os.kill(victim["pid"], signal.SIGKILL)
    # Connections the kernel had queued for the dead worker die with it (as with one process);
    # once the supervisor has seen it go, every new connection reaches the other worker.
    deadline = time.monotonic() + 10
    while workers_proxy.workers()[1]["state"] == "serving" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert workers_proxy.workers()[1]["state"] == "restarting"
    # Its probe slot was reset as it died: no answer in the dead worker's name, and no
    # stall to restart the pod for (a worker being restarted is the supervisor's job).
    status, body = workers_proxy.get("/healthz", token=None, base=workers_proxy.probe_url)
    assert status == 200 and f"pid {victim['pid']}" not in body.decode(), body
    for i in range(10):                           # the other worker serves meanwhile
        with WitnessClient(workers_proxy.bootstrap) as client:
            client.produce(workers_topic, b"during restart %d" % i)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        worker = workers_proxy.workers()[1]
        if worker["state"] == "serving" and worker["pid"] != victim["pid"]:
            break
        time.sleep(0.2)
    assert worker["state"] == "serving" and worker["restarts"] == 1, worker
    assert "SIGKILL" in worker["last_exit"]
    status, body = workers_proxy.get("/healthz", token=None, base=workers_proxy.probe_url)      # its successor posts
    assert status == 200 and f"worker 1: ok (pid {worker['pid']})" in body.decode(), body
    after = workers_proxy.metrics()
    assert value(after, "kproxy_worker_restarts_total") == 1
    # What the dead worker had counted stays in the sum: the counter does not go back.
    assert value(after, "kproxy_requests_total", api="Produce") >= \
        value(before, "kproxy_requests_total", api="Produce") + 10
    assert workers_proxy.get("/readyz")[0] == 200
    assert "died after" in workers_proxy.log_text()


def test_sigterm_drains_a_request_in_flight_then_exits_zero(kafka_cluster, node_ids, tmp_path, workers_topic):
    with Workers(kafka_cluster.bootstrap_servers, node_ids, tmp_path) as workers:
        with WitnessClient(workers.bootstrap) as client:
            client.produce(workers_topic, b"before the long poll")
            # A long poll past the end of the partition: the broker answers after max_wait_ms.
            offsets = client.request(2, 1, new_body("request", 2, 1, replica_id=-1, topics=[
                Struct(name=workers_topic, partitions=[Struct(partition_index=0, timestamp=-1)])]))
            end = offsets.topics[0].partitions[0].offset
            fetch = new_body("request", 1, 4, replica_id=-1, max_wait_ms=2000, min_bytes=1,
                             max_bytes=1 << 20, topics=[Struct(topic=workers_topic, partitions=[
                                 Struct(partition=0, fetch_offset=end, partition_max_bytes=1 << 20)])])
            correlation_id = client.send(1, 4, fetch)
            time.sleep(0.3)                        # the Fetch is with the broker
            started = time.monotonic()
            workers.process.send_signal(signal.SIGTERM)
            response = client.receive(1, 4)        # answered, not cut off
            assert response.correlation_id == correlation_id
            assert response.body.responses[0].partitions[0].error_code == 0
            assert client.sock.recv(1) == b""      # then closed by the drain
        assert workers.process.wait(30) == 0
        assert time.monotonic() - started < 15


def test_a_taken_port_stops_start_with_one_line_naming_it(kafka_cluster, node_ids, tmp_path):
    with silent_port() as (_, taken), \
            Workers(kafka_cluster.bootstrap_servers, node_ids, tmp_path, listen_port=taken, ready=None) as workers:
        line = workers.refusal(START_TIMEOUT_S)
    assert "cannot start: worker" in line and "Address already in use" in line, line


def test_a_worker_that_keeps_dying_stops_everything_with_one_line(tmp_path):
    """Three quick deaths in a row: a restart loop would only hide the cause."""
    killed = set()
    with Workers("127.0.0.1:1", [1], tmp_path, ready=None) as workers:     # no broker needed to start
        deadline = time.monotonic() + START_TIMEOUT_S
        while workers.process.poll() is None and time.monotonic() < deadline:
            try:
                worker = workers.workers()[0]
            except (OSError, ValueError):                 # the admin listener not up yet, or gone
                worker = None
            if worker and worker["state"] == "serving" and worker["pid"] not in killed:
                os.kill(worker["pid"], signal.SIGKILL)
                killed.add(worker["pid"])
            time.sleep(0.05)
        line = workers.refusal(30)
    assert len(killed) == 3
    assert "worker 0 died 3 times in a row" in line, line


def test_a_killed_supervisor_leaves_no_probe_process_and_no_worker(tmp_path):
    """SIGKILL to the supervisor: the probe process (its stdin pipe closes), the workers
    (their pipe from the supervisor closes) and every other child end by themselves."""
    workers = Workers("127.0.0.1:1", [1], tmp_path, ready=None)      # no broker needed to start
    workers.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        body = b""
        while body.count(b": ok (pid") < 2:
            assert time.monotonic() < deadline and workers.process.poll() is None, workers.log_text()
            try:
                body = workers.get("/healthz", token=None, base=workers.probe_url)[1]
            except OSError:
                time.sleep(0.2)
        # Two workers, the probe process (and multiprocessing's resource tracker).
        children = children_of(workers.process.pid)
        commands = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in children]
        assert sum(b"probe_server" in c for c in commands) == 1, commands
        assert sum(b"multiprocessing" in c for c in commands) >= 2, commands
        workers.process.kill()
        workers.process.wait(30)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all(exited(pid) for pid in children):
            assert time.monotonic() < deadline, [pid for pid in children if not exited(pid)]
            time.sleep(0.1)
    finally:
        workers.stop()

