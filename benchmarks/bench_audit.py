#!/usr/bin/env python3
"""What the audit observer costs: per ordinary pair on the event loop, per audited pair on
the event loop, and per event in its writer thread.

Ordinary traffic (Produce, Fetch, Heartbeat and a group member's OffsetCommit, in turn)
is what 99.9 % of pairs are: the observer only looks at the API key (and, for
OffsetCommit, at the already decoded generation and member id). It is measured on
events decoded beforehand, beside the metrics observer on the same events (the cost
every pair already pays), so the figure is the audit's own share. Audited pairs
(CreateTopics) cost an enqueue on the loop; the writer thread builds, writes and logs
each event (measured to a JSON Lines file, log line off, and on to a null handler).

    python benchmarks/bench_audit.py [--pairs 8000] [--rounds 30] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kproxy.observers.audit import Audit, AuditConfig  # noqa: E402
from kproxy.observers.metrics import Metrics  # noqa: E402
from kproxy.protocol import Request, Response, Struct, encode_request, encode_response, new_body  # noqa: E402
from kproxy.protocol.api_keys import ApiKey  # noqa: E402
from kproxy.protocol.connection import Connection  # noqa: E402
from kproxy.protocol.events import RequestReceived, ResponseReceived  # noqa: E402
from kproxy.protocol.record_encoder import build_batch  # noqa: E402
from kproxy.protocol.records import Record  # noqa: E402
from kproxy.observers.contract import ConnectionInfo  # noqa: E402

INFO = ConnectionInfo(id=1, client=("127.0.0.1", 40000), listener="bootstrap",
                      upstream=("127.0.0.1", 9092), node_id=None)


def _frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def _streams(kinds: list, pairs: int) -> tuple[bytes, bytes]:
    client, broker = bytearray(), bytearray()
    for i in range(pairs):
        api_key, version, req, resp = kinds[i % len(kinds)]
        client += _frame(encode_request(Request(api_key, version, i, "bench",
                                                new_body("request", api_key, version, **req))))
        broker += _frame(encode_response(Response(i, new_body("response", api_key, version, **resp)),
                                         api_key, version))
    return bytes(client), bytes(broker)


def ordinary(pairs: int) -> tuple[bytes, bytes]:
    batch = build_batch([Record(i, 1_700_000_000_000, b"k", b"v" * 200, ()) for i in range(20)], "lz4")
    return _streams([
        (0, 9, dict(acks=-1, timeout_ms=30000, topic_data=[Struct(name="orders", partition_data=[
            Struct(index=p, records=batch) for p in range(2)])]),
         dict(responses=[Struct(name="orders", partition_responses=[
             Struct(index=p, error_code=0, base_offset=100, log_append_time_ms=-1, log_start_offset=0,
                    record_errors=[], error_message=None) for p in range(2)])])),
        (1, 12, dict(session_epoch=-1, topics=[Struct(topic="orders", partitions=[
            Struct(partition=p, fetch_offset=980) for p in range(4)])]),
         dict(responses=[Struct(topic="orders", partitions=[
             Struct(partition_index=p, high_watermark=1000, records=batch) for p in range(4)])])),
        (12, 4, dict(group_id="g", generation_id=3, member_id="m"), dict()),
        (8, 8, dict(group_id="g", generation_id_or_member_epoch=3, member_id="m", topics=[
            Struct(name="orders", partitions=[Struct(partition_index=p, committed_offset=1000)
                                              for p in range(4)])]),
         dict(topics=[Struct(name="orders", partitions=[Struct(partition_index=p, error_code=0)
                                                         for p in range(4)])])),
    ], pairs)


def audited(pairs: int) -> tuple[bytes, bytes]:
    return _streams([(19, 7, dict(topics=[Struct(
        name="orders-new", num_partitions=6, replication_factor=3, assignments=[],
        configs=[Struct(name="retention.ms", value="604800000"),
                 Struct(name="cleanup.policy", value="compact")])], timeout_ms=30000),
        dict(topics=[Struct(name="orders-new", error_code=0, error_message=None, num_partitions=6,
                            replication_factor=3, configs=[])]))], pairs)


def decoded_events(client: bytes, broker: bytes) -> list:
    conn = Connection()
    events = list(conn.receive_client(client)) + list(conn.receive_broker(broker))
    Metrics(consumer_lag=False)(INFO, events)          # decodes every frame once (cached)
    for event in events:
        if isinstance(event, ResponseReceived):
            event.response
            event.request_event.request
    return events


def per_pair(observer, events: list, pairs: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        observer(INFO, events)
        best = min(best, (time.perf_counter() - start) / pairs)
    return best


def writer_rate(events: list, pairs: int, config: AuditConfig) -> float:
    """Seconds per event in the writer thread (queued first, then drained)."""
    audit = Audit(config, "bench")
    audit.start()
    start = time.perf_counter()
    audit(INFO, events)
    audit.stop(timeout=600)
    elapsed = time.perf_counter() - start
    assert sum(audit.events.values()) == pairs and audit.dropped == 0
    return elapsed / pairs


def _api_key(event) -> int:
    return event.api_key if isinstance(event, RequestReceived) else event.request_event.api_key


def measure(pairs: int, rounds: int) -> dict:
    plain = decoded_events(*ordinary(pairs))
    commits = [e for e in plain if _api_key(e) == ApiKey.OFFSET_COMMIT]
    others = [e for e in plain if _api_key(e) != ApiKey.OFFSET_COMMIT]
    metrics_cost = per_pair(Metrics(consumer_lag=False), plain, pairs, rounds)
    audit = Audit(AuditConfig(log=False, queue_max_items=10 ** 9), "bench")
    audit.start()
    ordinary_cost = per_pair(audit, plain, pairs, rounds)
    others_cost = per_pair(audit, others, len(others) // 2, rounds)
    commits_cost = per_pair(audit, commits, len(commits) // 2, rounds)
    assert audit.enqueued == 0, "ordinary traffic was queued"
    audit.stop()
    off_cost = per_pair(lambda info, ev: None, plain, pairs, rounds)

    changes = decoded_events(*audited(pairs))
    loop = Audit(AuditConfig(log=False, queue_max_items=10 ** 9), "bench")
    loop._active = True                   # enqueue only (no writer draining meanwhile)
    audited_loop = per_pair(loop, changes, pairs, 1)
    with tempfile.TemporaryDirectory() as tmp:
        to_file = writer_rate(changes, pairs, AuditConfig(path=os.path.join(tmp, "a.jsonl"), log=False,
                                                          queue_max_items=10 ** 9))
    logging.getLogger("kproxy.audit").addHandler(logging.NullHandler())
    logging.getLogger("kproxy.audit").propagate = False
    logging.getLogger("kproxy.audit").setLevel(logging.INFO)
    with tempfile.TemporaryDirectory() as tmp:
        to_both = writer_rate(changes, pairs, AuditConfig(path=os.path.join(tmp, "a.jsonl"), log=True,
                                                          queue_max_items=10 ** 9))
    return {
        "pairs": pairs,
        "ordinary_pair_ns": {"audit_on": round((ordinary_cost - off_cost) * 1e9, 1),
                             "audit_on_not_offset_commit": round((others_cost - off_cost) * 1e9, 1),
                             "audit_on_member_offset_commit": round((commits_cost - off_cost) * 1e9, 1),
                             "metrics_observer": round((metrics_cost - off_cost) * 1e9, 1)},
        "audited_pair_event_loop_us": round(audited_loop * 1e6, 2),
        "writer_event_us": {"file": round(to_file * 1e6, 1), "file_and_log": round(to_both * 1e6, 1)},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8_000)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args.pairs, args.rounds)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    o = result["ordinary_pair_ns"]
    print(f"ordinary pair (Produce/Fetch/Heartbeat/member OffsetCommit), event loop:\n"
          f"  audit observer     {o['audit_on']:8.1f} ns/pair (Produce/Fetch/Heartbeat: "
          f"{o['audit_on_not_offset_commit']:.1f}, member OffsetCommit: {o['audit_on_member_offset_commit']:.1f})\n"
          f"  metrics observer   {o['metrics_observer']:8.1f} ns/pair (for scale: what every pair already pays)\n"
          f"audited pair (CreateTopics), event loop: {result['audited_pair_event_loop_us']:.2f} us (enqueue)\n"
          f"writer thread per event: {result['writer_event_us']['file']:.1f} us (file), "
          f"{result['writer_event_us']['file_and_log']:.1f} us (file + log line)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
