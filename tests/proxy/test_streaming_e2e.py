"""Issue 10, item 7: a large frame streamed through a real kproxy process, both ways.

A ~50 MiB Produce (one record) goes through ``kproxy run`` to a real Kafka 4.4 broker,
and is read back through kproxy (a ~50 MiB Fetch answer). kproxy keeps only
the frames' headers, so its peak RSS grows far less than one frame (before streaming,
it held the whole frame and a joined copy: more than twice the frame), and the record
arrives intact.
"""

from __future__ import annotations

import random
import uuid

import pytest

from tests.proxy.harness import KproxyProcess, http_status
from tests.proxy.wire import FETCH, FETCH_VERSION, RawClient, fetch_fields

pytestmark = [pytest.mark.timeout(300)]

RECORD_BYTES = 50 * 1024 * 1024
# The topic must accept the record (the broker's message.max.bytes is ~1 MiB); one request
# of it stays under socket.request.max.bytes (100 MiB).
TOPIC_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# kproxy's peak RSS may grow by this much while the frames pass: read buffers, write
# buffers up to their high-water mark, the interpreter's own. A fifth of one frame.
RSS_GROWTH_LIMIT = RECORD_BYTES // 5
CLIENT_TIMEOUT_S = 120


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM of a process, in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


@pytest.fixture
def kproxy_process(kafka_cluster, tmp_path):
    """``kproxy run`` in its own process (its memory is measured alone), in front of the broker."""
    with KproxyProcess(tmp_path, upstream=kafka_cluster.bootstrap_servers,
                       broker_port_base=0) as kproxy:          # broker listeners: ports chosen by the OS
        yield kproxy


def test_a_50_mib_produce_and_its_fetch_stream_through_without_being_held(kafka_cluster, kproxy_process):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"kp-stream-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 1, 1, config={
        "max.message.bytes": str(TOPIC_MAX_MESSAGE_BYTES)})])[topic].result(30)
    producer = Producer({"bootstrap.servers": kproxy_process.bootstrap, "acks": 1,
                         "compression.type": "none", "linger.ms": 0,
                         "message.max.bytes": TOPIC_MAX_MESSAGE_BYTES,
                         "batch.size": TOPIC_MAX_MESSAGE_BYTES})
    failures = []

    def delivered(err, msg):
        if err is not None:
            failures.append(err)

    producer.produce(topic, value=b"warm-up", on_delivery=delivered)     # connections, metadata
    assert producer.flush(CLIENT_TIMEOUT_S) == 0 and not failures
    before = proc_status(kproxy_process.pid)

    value = random.Random(10).randbytes(RECORD_BYTES)                      # incompressible
    producer.produce(topic, value=value, key=b"big", on_delivery=delivered)
    assert producer.flush(CLIENT_TIMEOUT_S) == 0 and not failures

    # Read back through kproxy with Fetch v12: v16+ answers carry broker addresses
    # (KIP-951 node endpoints), which kproxy must hold whole to rewrite.
    client = RawClient(kproxy_process.bootstrap)
    try:
        response = client.roundtrip(FETCH, FETCH_VERSION, **fetch_fields(
            topic, max_wait_ms=5000, max_bytes=TOPIC_MAX_MESSAGE_BYTES))
    finally:
        client.close()
    after = proc_status(kproxy_process.pid)

    [topic_answer] = response.body.responses
    [partition] = topic_answer.partitions
    records = bytes(partition.records)
    assert partition.error_code == 0 and len(records) > RECORD_BYTES
    assert records.find(value) > 0, "the record did not arrive intact"
    metrics = http_status(kproxy_process.admin_url + "/metrics")[1]
    streamed = {line.split('"')[1]: float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                if line.startswith("kproxy_frames_streamed_total{")}
    growth = after["VmHWM"] - before["VmRSS"]
    print(f"kproxy RSS before {before['VmRSS'] >> 20} MiB, peak {after['VmHWM'] >> 20} MiB "
          f"(+{growth / 2**20:.1f} MiB for a {RECORD_BYTES >> 20} MiB frame each way)")
    assert growth < RSS_GROWTH_LIMIT, f"kproxy peak RSS grew by {growth >> 20} MiB; streamed {streamed}"
    assert streamed["request"] >= 1 and streamed["response"] >= 1
