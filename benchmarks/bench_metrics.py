#!/usr/bin/env python3
"""What the metrics observer costs per request/response pair, beside the tracker alone.

The proxy's per-pair work is: the tracker frames and pairs (always), then the
metrics observer decodes both frames and updates its series. This measures
both on the same in-memory stream of typical traffic, no sockets, then the
observer alone on frames decoded beforehand (its series updates and batch-header
walks), and what a scrape of a fresh, a typical and an every-API registry weighs
and costs to render.

    python benchmarks/bench_metrics.py [--pairs 20000] [--json]
    python benchmarks/bench_metrics.py --compare /work/main [--rounds 5]

``--compare TREE`` runs the same measurements on kproxy from TREE (before) and
from this tree (after), alternately in child processes, and prints them side by side.

``--mix`` measures the large-frame mix instead (Produce v9-v13 requests and Fetch
v12-v18 answers of 1 MiB of 1 KiB records over 4 partitions; Metadata, Heartbeat,
OffsetCommit pairs): what the default path (address rewriting, the metrics, kproxy's
decode-failure log) costs beyond the tracker, per pair and per GB relayed.
``--instructions`` counts machine instructions per pair of it under valgrind::

    python benchmarks/bench_metrics.py --mix [--batch-records 64] [--compare /work/main]
    python benchmarks/bench_metrics.py --mix --instructions [--compare /work/main]

``--exposition`` prints /metrics after fixed traffic on a fake clock; with ``--compare TREE``
it checks that both trees export byte-identical text (a change meant to make the observers
cheaper must not change a metric)::

    python benchmarks/bench_metrics.py --exposition --compare /work/main
"""

from __future__ import annotations

import argparse
import json
import os
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def _tree_from_argv() -> str:
    """``--tree PATH`` picks the kproxy to import (before argparse: imports come first)."""
    argv = sys.argv
    return argv[argv.index("--tree") + 1] if "--tree" in argv[:-1] else str(HERE)


sys.path.insert(0, _tree_from_argv())

from prometheus_client import generate_latest  # noqa: E402

from kproxy.observers.metrics import Metrics  # noqa: E402
from kproxy.protocol import (Request, Response, Struct, Uuid, encode_request, encode_response,  # noqa: E402
                             new_body, schema)
from kproxy.protocol.connection import Connection  # noqa: E402
from kproxy.protocol.events import ResponseReceived  # noqa: E402
from kproxy.protocol.record_encoder import build_batch  # noqa: E402
from kproxy.protocol.records import Record  # noqa: E402


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def traffic(pairs: int) -> tuple[bytes, bytes]:
    """A client stream and a broker stream: Produce, Fetch and Heartbeat pairs in turn
    (the Fetch names 4 partitions, as a consumer does, and is answered with records)."""
    batch = build_batch([Record(i, 1_700_000_000_000, b"k", b"v" * 200, ()) for i in range(20)], "lz4")
    kinds = [  # one in KINDS is a Fetch
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
    ]
    client, broker = bytearray(), bytearray()
    for i in range(pairs):
        api_key, version, req, resp = kinds[i % len(kinds)]
        client += framed(encode_request(Request(api_key, version, i, "bench",
                                                new_body("request", api_key, version, **req))))
        broker += framed(encode_response(Response(i, new_body("response", api_key, version, **resp)),
                                         api_key, version))
    return bytes(client), bytes(broker)


KINDS = 3          # Produce, Fetch, Heartbeat
TYPICAL_PAIRS = 300    # the traffic before the "typical" scrape (series, not values, matter)
CHUNK = 64 * 1024


def run(client: bytes, broker: bytes, observer) -> float:
    conn = Connection()
    start = time.perf_counter()
    for stream, feed in ((client, conn.receive_client), (broker, conn.relay_broker)):
        for pos in range(0, len(stream), CHUNK):
            result = feed(stream[pos:pos + CHUNK])
            events = result[0] if isinstance(result, tuple) else result
            if observer is not None and events:
                observer(None, events)
    return time.perf_counter() - start


def lag_alone(client: bytes, broker: bytes, repeat: int) -> float:
    """Seconds per Fetch pair of the consumer-lag step alone, on frames decoded beforehand:
    the difference of two whole runs drowns in noise on a shared machine; this does not."""
    conn = Connection()
    conn.receive_client(client)
    fetches = [e for e in conn.receive_broker(broker) if isinstance(e, ResponseReceived) and e.api_key == 1]
    bodies = [(e, e.response.body) for e in fetches if e.request_event.request is not None]
    best = float("inf")
    for _ in range(repeat):
        metrics = Metrics()
        # The consumer-lag part (a tree from before the parts: the observer's own method).
        fetch_answered = metrics.lag.fetch_answered if hasattr(metrics, "lag") else metrics._fetch_answered
        start = time.perf_counter()
        for event, body in bodies:
            fetch_answered(event, None, body)
        best = min(best, (time.perf_counter() - start) / len(bodies))
    return best


def observer_alone(client: bytes, broker: bytes, repeat: int) -> float:
    """Seconds per pair of the metrics observer on events whose frames were decoded beforehand
    (decoding is cached on the event): its series updates, batch-header and error walks."""
    conn = Connection()
    events = list(conn.receive_client(client))
    events += conn.receive_broker(broker)
    warm = Metrics(consumer_lag=False)
    warm(None, events)                       # decodes every frame once
    best = float("inf")
    for _ in range(repeat):
        metrics = Metrics(consumer_lag=False)
        start = time.perf_counter()
        metrics(None, events)
        best = min(best, time.perf_counter() - start)
    return best / (len(events) / 2)


# The large-frame mix (issue 12): what relaying 1 KiB records looks like to the observers.
RECORD_BYTES = 1024
FRAME_RECORDS = 1024             # 1 MiB of records per Produce request and per Fetch answer
MIX_PARTITIONS = 4               # spread over this many partitions of one topic
PRODUCE_VERSIONS = range(9, 14)  # every version modern clients send, in turn
FETCH_VERSIONS = range(12, 19)
TOPIC_ID = Uuid(bytes(range(16)))
MIX_KINDS = ("produce", "fetch", "small")


def _partition_records(batch_records: int, first_offset: int) -> bytes:
    """``FRAME_RECORDS / MIX_PARTITIONS`` records of 1 KiB as uncompressed batches of ``batch_records``."""
    count = FRAME_RECORDS // MIX_PARTITIONS
    value = b"v" * (RECORD_BYTES - 8)
    return b"".join(
        build_batch([Record(0, 1_700_000_000_000, b"k" * 8, value, ()) for _ in range(min(batch_records, count - i))],
                    base_offset=first_offset + i)
        for i in range(0, count, batch_records))


def mix_pairs(kind: str, batch_records: int) -> list[tuple[int, int, Struct, Struct]]:
    """(api key, version, request body, response body) of one round of a kind of the mix:
    ``produce`` (Produce v9-v13 of 1 MiB), ``fetch`` (Fetch v12-v18 answered with 1 MiB) or
    ``small`` (Metadata v12, Heartbeat v4, OffsetCommit v8)."""
    records = [_partition_records(batch_records, 1000 * p) for p in range(MIX_PARTITIONS)]

    def topic(version: int, by_id_from: int, **fields) -> Struct:
        key = dict(topic_id=TOPIC_ID) if version >= by_id_from else {}
        return Struct(**key, **fields)

    pairs = []
    if kind == "produce":
        for v in PRODUCE_VERSIONS:
            name = dict(name="orders") if v < 13 else {}
            request = new_body("request", 0, v, acks=-1, timeout_ms=30000, topic_data=[
                topic(v, 13, **name, partition_data=[Struct(index=p, records=records[p])
                                                     for p in range(MIX_PARTITIONS)])])
            response = new_body("response", 0, v, responses=[topic(v, 13, **name, partition_responses=[
                Struct(index=p, error_code=0, base_offset=1000 * p, log_append_time_ms=-1, log_start_offset=0,
                       record_errors=[], error_message=None) for p in range(MIX_PARTITIONS)])])
            pairs.append((0, v, request, response))
    elif kind == "fetch":
        for v in FETCH_VERSIONS:
            name = dict(topic="orders") if v < 13 else {}
            request = new_body("request", 1, v, max_wait_ms=500, min_bytes=1, max_bytes=52428800,
                               session_id=7, session_epoch=5, topics=[topic(v, 13, **name, partitions=[
                                   Struct(partition=p, fetch_offset=1000 * p, partition_max_bytes=1048576,
                                          log_start_offset=-1, current_leader_epoch=0, last_fetched_epoch=-1)
                                   for p in range(MIX_PARTITIONS)])])
            response = new_body("response", 1, v, session_id=7, responses=[topic(v, 13, **name, partitions=[
                Struct(partition_index=p, error_code=0, high_watermark=1000 * p + 5000, last_stable_offset=1000 * p + 5000,
                       log_start_offset=0, aborted_transactions=None, preferred_read_replica=-1, records=records[p])
                for p in range(MIX_PARTITIONS)])])
            pairs.append((1, v, request, response))
    else:
        partitions = [Struct(partition_index=p, leader_id=p % 3, leader_epoch=1, replica_nodes=[0, 1, 2],
                             isr_nodes=[0, 1, 2], offline_replicas=[]) for p in range(MIX_PARTITIONS)]
        pairs.append((3, 12, new_body("request", 3, 12, topics=[Struct(topic_id=TOPIC_ID, name="orders")]),
                      new_body("response", 3, 12, cluster_id="c", controller_id=0, brokers=[
                          Struct(node_id=n, host=f"broker-{n}.example", port=9092, rack=None) for n in range(3)],
                          topics=[Struct(name="orders", topic_id=TOPIC_ID, partitions=partitions)])))
        pairs.append((12, 4, new_body("request", 12, 4, group_id="g", generation_id=3, member_id="m"),
                      new_body("response", 12, 4)))
        pairs.append((8, 8, new_body("request", 8, 8, group_id="g", generation_id_or_member_epoch=3, member_id="m",
                                     topics=[Struct(name="orders", partitions=[
                                         Struct(partition_index=p, committed_offset=1000 * p, committed_metadata="")
                                         for p in range(MIX_PARTITIONS)])]),
                      new_body("response", 8, 8, topics=[Struct(name="orders", partitions=[
                          Struct(partition_index=p, error_code=0) for p in range(MIX_PARTITIONS)])])))
    return pairs


def mix_streams(kind: str, batch_records: int) -> tuple[list, list, int, int]:
    """Client and broker frames (size prefix included) of one round of ``kind``, its pairs and
    its bytes (both ways)."""
    client, broker = [], []
    pairs = mix_pairs(kind, batch_records)
    for i, (api_key, version, request, response) in enumerate(pairs):
        client.append(framed(encode_request(Request(api_key, version, i, "bench", request))))
        broker.append(framed(encode_response(Response(i, response), api_key, version)))
    return client, broker, len(pairs), sum(map(len, client + broker))


MIX_ROUNDS = 4          # rounds of a kind's versions per run


def mix_run(client: list, broker: list, proxy=None, observers=()) -> None:
    """What kproxy does with the frames, each as one read (the relay's reads are large, and it
    assembles frames that span them in place): the tracker alone (no ``proxy``), or as ``kproxy
    run`` has it (``proxy``'s address rewriting holds and reads Produce v10+ and Fetch v16+
    answers) with ``observers`` fed each read's events."""
    conn = Connection(hold=proxy.hold, transform=proxy.transform) if proxy else Connection()
    for frames, feed in ((client, conn.receive_client), (broker, conn.relay_broker)):
        for frame in frames:
            result = feed(frame)
            events = result[0] if isinstance(result, tuple) else result
            for observer in observers:
                observer(None, events)


def default_path():
    """A Proxy (sidecar mode: no listeners to open) and the observers ``kproxy run`` has on by
    default that look at events: metrics, and the proxy's own decode-failure log (capture off
    and the live view unwatched return at once)."""
    from kproxy.config import build
    from kproxy.proxy.server import Proxy
    # Without the topic-name lookup: it asks the broker (there is none) from an event loop (none here).
    proxy = Proxy(build({"upstream": "127.0.0.1:1", "mode": "sidecar", "topic_id_lookup": False}), [Metrics()])
    return proxy, [o for o in proxy.observers if callable(o)]


def mix_observe(kind: str, batch_records: int, runs: int, observed: bool) -> None:
    """``runs`` runs of ``MIX_ROUNDS`` rounds of ``kind``, observed (``default_path``) or the
    tracker alone: for instruction counts (``--only KIND`` with ``--observer metrics|none``)."""
    client, broker, _, _ = mix_streams(kind, batch_records)
    client, broker = client * MIX_ROUNDS, broker * MIX_ROUNDS
    proxy, observers = default_path() if observed else (None, ())
    for _ in range(runs):
        mix_run(client, broker, proxy, observers)


def measure_mix(args) -> dict:
    """CPU µs per pair and s per GB relayed of ``default_path`` beyond the tracker alone, on
    each kind of the mix: decoding, rewriting checks, metrics. Alternated, best of ``--repeat``."""
    result = {"batch_records": args.batch_records}
    for kind in MIX_KINDS:
        client, broker, pairs, nbytes = mix_streams(kind, args.batch_records)
        client, broker, pairs, nbytes = (client * MIX_ROUNDS, broker * MIX_ROUNDS, pairs * MIX_ROUNDS,
                                         nbytes * MIX_ROUNDS)
        proxy, observers = default_path()
        mix_run(client, broker, proxy, observers)          # codecs compiled, series made
        alone = observed = float("inf")
        for _ in range(args.repeat):
            start = time.process_time()
            mix_run(client, broker)
            middle = time.process_time()
            mix_run(client, broker, proxy, observers)
            alone, observed = min(alone, middle - start), min(observed, time.process_time() - middle)
        result[f"mix_{kind}_us_per_pair"] = (observed - alone) / pairs * 1e6
        result[f"mix_{kind}_s_per_gb"] = (observed - alone) / nbytes * 1e9
        result[f"mix_{kind}_tracker_us_per_pair"] = alone / pairs * 1e6
        result[f"mix_{kind}_bytes_per_pair"] = nbytes // pairs
    return result


def every_api_requested(metrics) -> None:
    """One header-only request of every API kproxy knows (the bodies do not decode): each API's
    series then exist, as after a client that used them all."""
    for api_key in sorted(schema.API_NAMES):
        try:
            events = Connection().receive_client(framed(struct.pack(">hhih", api_key, 0, 1, 0)))
        except Exception:        # the tracker refuses what the broker could not parse (Produce)
            continue
        metrics(None, events)


def exposition(batch_records: int) -> bytes:
    """/metrics after fixed traffic on a fake clock (every latency the same run to run): the
    mix through ``default_path``, the Produce/Fetch/Heartbeat stream, answers with errors, a
    Fetch of an unknown version, a frame that does not decode, every API once; with every
    opt-in label on. The process's own families (CPU, memory, GC) are left out: they vary."""
    from kproxy.config import build
    from kproxy.proxy.server import Proxy
    ticks = iter(range(10**9))
    clock = lambda: next(ticks) * 0.0003  # noqa: E731  (0.3 ms per read: every latency bucket low down)
    metrics = Metrics(client_id_label=True, topic_label=True, group_label=True)
    # Without the topic-name lookup, as in ``default_path``.
    proxy = Proxy(build({"upstream": "127.0.0.1:1", "mode": "sidecar", "topic_id_lookup": False}), [metrics])
    observers = [o for o in proxy.observers if callable(o)]
    errors = [(0, 9, dict(acks=1, topic_data=[Struct(name="t", partition_data=[Struct(index=0, records=None)])]),
               dict(throttle_time_ms=20, responses=[Struct(name="t", partition_responses=[
                   Struct(index=0, error_code=6, record_errors=[])])])),
              (12, 4, dict(group_id="g", generation_id=3, member_id="m"), dict(error_code=27)),
              (11, 9, dict(group_id="g", member_id="", protocol_type="consumer", protocols=[]),
               dict(generation_id=4, leader="m", member_id="m", members=[Struct(member_id="m")])),
              (14, 5, dict(group_id="g", generation_id=4, member_id="m"), dict()),
              # Produce answers a tally does not read (a leader hint: tagged), and a classic version.
              (0, 10, dict(acks=-1, topic_data=[Struct(name="t", partition_data=[Struct(index=1, records=None)])]),
               dict(responses=[Struct(name="t", partition_responses=[Struct(
                   index=1, error_code=6, current_leader=Struct(leader_id=2, leader_epoch=7))])])),
              (0, 3, dict(transactional_id="tx", acks=-1, topic_data=[Struct(name="t", partition_data=[
                  Struct(index=2, records=None)])]),
               dict(throttle_time_ms=5, responses=[Struct(name="t", partition_responses=[
                   Struct(index=2, error_code=19)])]))]
    streams = [mix_streams(kind, batch_records)[:2] for kind in MIX_KINDS]
    client, broker = [], []
    for i, (api_key, version, request, response) in enumerate(errors):
        client.append(framed(encode_request(Request(api_key, version, i, "errors",
                                                    new_body("request", api_key, version, **request)))))
        broker.append(framed(encode_response(Response(i, new_body("response", api_key, version, **response)),
                                             api_key, version)))
    client.append(framed(struct.pack(">hhih", 2, 99, 50, 0) + b"x"))       # ListOffsets v99: opaque
    broker.append(framed(struct.pack(">i", 50) + b"y"))
    client.append(framed(struct.pack(">hhih", 31000, 0, 51, 0)))           # no such API: opaque
    broker.append(framed(struct.pack(">i", 51)))
    client.append(framed(struct.pack(">hhih", 12, 4, 52, 0) + b"\x00"))   # Heartbeat cut short
    broker.append(framed(struct.pack(">i", 52) + b"\x00"))
    client.append(framed(struct.pack(">hhih", 0, 9, 53, -1) + b"\x00\x00\x00\x01\x00\x00"))  # Produce cut short
    broker.append(framed(struct.pack(">i", 53) + b"\x00\x01"))                   # an answer cut short
    streams.append((client, broker))
    for client, broker in streams:
        conn = Connection(hold=proxy.hold, transform=proxy.transform, clock=clock)
        for frames, feed in ((client, conn.receive_client), (broker, conn.relay_broker)):
            for frame in frames:
                result = feed(frame)
                for observer in observers:
                    observer(None, result[0] if isinstance(result, tuple) else result)
    every_api_requested(metrics)
    text = generate_latest(metrics.registry)
    kept = [line for line in text.splitlines()
            if not (line.split()[2] if line.startswith(b"#") else line).startswith((b"process_", b"python_"))]
    return b"\n".join(kept) + b"\n"


def compare_expositions(args) -> int:
    """``--exposition --compare TREE``: whether both trees' /metrics (and what they log) are
    byte-identical on the same traffic (exit status 1 and the first differing lines if not)."""
    texts = {}
    for side, tree in (("before", args.compare), ("after", str(HERE))):
        command = [sys.executable, __file__, "--tree", tree, "--exposition", "--batch-records", str(args.batch_records)]
        done = subprocess.run(command, env={**os.environ, "PYTHONPATH": tree}, check=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        texts[side] = done.stdout + b"\n# log:\n" + done.stderr      # the decode-failure log too
    if texts["before"] == texts["after"]:
        lines = texts["after"].count(b"\n")
        print(f"/metrics byte-identical: {len(texts['after'])} bytes, {lines} lines (process families left out)")
        return 0
    import difflib
    sys.stdout.writelines(list(difflib.unified_diff(texts["before"].decode().splitlines(True),
                                                    texts["after"].decode().splitlines(True),
                                                    "before", "after"))[:60])
    return 1


def scrape(metrics, repeat: int) -> dict:
    """Series and bytes of one /metrics exposition, and the best time to render it."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        text = generate_latest(metrics.registry)
        best = min(best, time.perf_counter() - start)
    series = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
    return {"series": series, "bytes": len(text), "render_ms": best * 1e3}


def measure(args) -> dict:
    client, broker = traffic(args.pairs)
    tracker = min(run(client, broker, None) for _ in range(args.repeat))
    # Alternated, so both see the same machine load.
    without_lag, metrics = [], []
    for _ in range(args.repeat):
        without_lag.append(run(client, broker, Metrics(consumer_lag=False)))
        metrics.append(run(client, broker, Metrics()))
    without_lag, metrics = min(without_lag), min(metrics)
    per_pair = lambda t: t / args.pairs * 1e6  # noqa: E731
    result = {"pairs": args.pairs, "tracker_us_per_pair": per_pair(tracker),
              "tracker_and_metrics_us_per_pair": per_pair(metrics),
              "metrics_us_per_pair": per_pair(metrics - tracker),
              "metrics_without_lag_us_per_pair": per_pair(without_lag - tracker),
              "observer_on_decoded_frames_us_per_pair": observer_alone(client, broker, args.repeat) * 1e6,
              "consumer_lag_us_per_fetch_pair": per_pair(metrics - without_lag) * KINDS,
              "consumer_lag_alone_us_per_fetch_pair": lag_alone(client, broker, args.repeat) * 1e6}
    fresh, typical, every_api = Metrics(), Metrics(), Metrics()
    run(*traffic(TYPICAL_PAIRS), typical)
    every_api_requested(every_api)
    for name, registry in (("fresh", fresh), ("typical", typical), ("every_api", every_api)):
        for key, figure in scrape(registry, args.repeat).items():
            result[f"scrape_{name}_{key}"] = figure
    return result


# Figures of a side-by-side run: (key, label, unit); best (lowest) of the rounds for timings.
COMPARED = (
    ("tracker_us_per_pair", "tracker only (framing, pairing)", "us/pair"),
    ("metrics_us_per_pair", "metrics' own cost (decode + series)", "us/pair"),
    ("observer_on_decoded_frames_us_per_pair", "observer on decoded frames (series, batch walks)", "us/pair"),
    ("scrape_fresh_series", "fresh scrape: series", ""),
    ("scrape_fresh_bytes", "fresh scrape: bytes", ""),
    ("scrape_fresh_render_ms", "fresh scrape: render", "ms"),
    ("scrape_typical_series", "after Produce/Fetch/Heartbeat traffic: series", ""),
    ("scrape_typical_bytes", "after Produce/Fetch/Heartbeat traffic: bytes", ""),
    ("scrape_typical_render_ms", "after Produce/Fetch/Heartbeat traffic: render", "ms"),
    ("scrape_every_api_series", "after every API once: series", ""),
    ("scrape_every_api_bytes", "after every API once: bytes", ""),
    ("scrape_every_api_render_ms", "after every API once: render", "ms"),
)

# Instruction counts (valgrind): runs of a kind with the observer and without, at two run
# counts, so that start-up, building the traffic and compiling codecs cancel out.
INSTRUCTION_RUNS = (2, 12)


def instructions(tree: str, kind: str, observer: str, runs: int, batch_records: int) -> int:
    """Machine instructions of one ``--only`` run under valgrind (cachegrind, no cache simulation)."""
    command = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
               sys.executable, __file__, "--tree", tree, "--only", kind, "--observer", observer,
               "--runs", str(runs), "--batch-records", str(batch_records)]
    env = {**os.environ, "PYTHONPATH": tree, "PYTHONHASHSEED": "0"}
    err = subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True).stderr
    return int(re.search(r"I\s+refs:\s+([\d,]+)", err).group(1).replace(",", ""))


def measure_instructions(trees: dict[str, str], batch_records: int) -> dict:
    """Instructions per pair of the metrics observer (decoding included) and of the tracker, per
    kind of the mix and tree."""
    low, high = INSTRUCTION_RUNS
    out: dict = {}
    for kind in MIX_KINDS:
        pairs = len(mix_pairs(kind, 1024)) * MIX_ROUNDS * (high - low)
        for side, tree in trees.items():
            counts = {(observer, runs): instructions(tree, kind, observer, runs, batch_records)
                      for observer in ("metrics", "none") for runs in INSTRUCTION_RUNS}
            observed = (counts["metrics", high] - counts["none", high]) - (counts["metrics", low] - counts["none", low])
            out[f"{side}_{kind}_metrics_instructions_per_pair"] = observed / pairs
            out[f"{side}_{kind}_tracker_instructions_per_pair"] = (counts["none", high] - counts["none", low]) / pairs
    return out


MIX_COMPARED = tuple((f"mix_{kind}_{key}", f"{kind}: {label}", unit) for kind in MIX_KINDS
                     for key, label, unit in (("us_per_pair", "observers + rewriting beyond the tracker", "us/pair"),
                                              ("s_per_gb", "the same per GB relayed", "s/GB")))


def compare(args) -> int:
    """Before (``--compare`` tree) and after (this tree), alternately, best of the rounds."""
    trees = {"before": args.compare, "after": str(HERE)}
    runs: dict[str, list[dict]] = {side: [] for side in trees}
    loads = [os.getloadavg()[0]]
    for round_number in range(args.rounds):
        order = list(trees) if round_number % 2 == 0 else list(trees)[::-1]
        for side in order:
            command = [sys.executable, __file__, "--tree", trees[side], "--json",
                       "--pairs", str(args.pairs), "--repeat", str(args.repeat)]
            if args.mix:
                command += ["--mix", "--batch-records", str(args.batch_records)]
            env = {**os.environ, "PYTHONPATH": trees[side]}
            out = subprocess.run(command, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
            runs[side].append(json.loads(out))
        loads.append(os.getloadavg()[0])
    best = {side: {key: min(run[key] for run in results) for key in results[0]}
            for side, results in runs.items()}
    if args.json:
        print(json.dumps({"trees": trees, "rounds": args.rounds, "load_average_1m": loads,
                          "best": best, "runs": runs}, indent=2))
        return 0
    what = f"the mix ({args.batch_records} records per batch)" if args.mix else f"{args.pairs} pairs"
    print(f"{what}, best of {args.rounds} rounds x {args.repeat}; before = {trees['before']}, "
          f"after = {trees['after']}; 1-minute load average {min(loads):.1f}-{max(loads):.1f} "
          f"on {os.cpu_count()} cores")
    print(f"{'':52} {'before':>10} {'after':>10}")
    for key, label, unit in (MIX_COMPARED if args.mix else COMPARED):
        before, after = best["before"].get(key), best["after"].get(key)
        digits = 3 if unit == "s/GB" else 1
        shown = [f"{v:10.{digits}f}" if isinstance(v, float) else f"{v:10}" for v in (before, after)]
        print(f"{label:52} {shown[0]} {shown[1]} {unit}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--tree", help="import kproxy from this checkout (default: this one)")
    parser.add_argument("--compare", metavar="TREE", help="before/after: kproxy of TREE beside this one")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds of --compare")
    parser.add_argument("--mix", action="store_true",
                        help="the large-frame mix instead: Produce v9-v13 and Fetch v12-v18 of 1 MiB, small pairs")
    parser.add_argument("--batch-records", type=int, default=64, help="records per batch in the mix")
    parser.add_argument("--only", choices=MIX_KINDS, help="run one kind of the mix --runs times, untimed")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--observer", choices=("metrics", "none"), default="metrics",
                        help="with --only: metrics and rewriting as kproxy run has them, or none (the tracker alone)")
    parser.add_argument("--instructions", action="store_true",
                        help="instructions per pair of the mix under valgrind (with --compare: both trees)")
    parser.add_argument("--exposition", action="store_true",
                        help="/metrics after fixed traffic on a fake clock (with --compare: byte-identical in both trees?)")
    args = parser.parse_args()
    if args.exposition:
        if args.compare:
            return compare_expositions(args)
        sys.stdout.buffer.write(exposition(args.batch_records))
        return 0
    if args.only:
        mix_observe(args.only, args.batch_records, args.runs, args.observer == "metrics")
        return 0
    if args.instructions:
        trees = {"before": args.compare, "after": str(HERE)} if args.compare else {"this": str(HERE)}
        result = measure_instructions(trees, args.batch_records)
        if args.json:
            print(json.dumps(result, indent=2))
            return 0
        print(f"instructions per pair (valgrind), {args.batch_records} records per batch")
        for kind in MIX_KINDS:
            print(f"{kind:8} " + "  ".join(
                f"{side}: metrics {result[f'{side}_{kind}_metrics_instructions_per_pair']:10,.0f} "
                f"tracker {result[f'{side}_{kind}_tracker_instructions_per_pair']:9,.0f}" for side in trees))
        return 0
    if args.compare:
        return compare(args)
    result = measure_mix(args) if args.mix else measure(args)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    if args.mix:
        print(f"observers and rewriting beyond the tracker (decoding included), CPU time, best of "
              f"{args.repeat} ({args.batch_records} records of {RECORD_BYTES} B per batch)")
        for kind in MIX_KINDS:
            print(f"{kind:8} {result[f'mix_{kind}_bytes_per_pair']:10,} B/pair "
                  f"{result[f'mix_{kind}_us_per_pair']:9.1f} us/pair {result[f'mix_{kind}_s_per_gb']:7.3f} s/GB"
                  f"   (tracker alone {result[f'mix_{kind}_tracker_us_per_pair']:.1f} us/pair)")
        return 0
    print(f"{args.pairs} request/response pairs (Produce v9, Fetch v12 of 4 partitions with records, Heartbeat v4), "
          f"best of {args.repeat}")
    print(f"tracker only (framing, pairing)          {result['tracker_us_per_pair']:7.1f} us/pair")
    print(f"tracker + metrics (decode + series)      {result['tracker_and_metrics_us_per_pair']:7.1f} us/pair")
    print(f"metrics' own cost                        {result['metrics_us_per_pair']:7.1f} us/pair")
    print(f"  of which consumer lag                  {result['consumer_lag_us_per_fetch_pair']:7.1f} us "
          f"per Fetch pair (4 partitions; metrics without it: "
          f"{result['metrics_without_lag_us_per_pair']:.1f} us/pair)")
    print(f"observer on decoded frames               {result['observer_on_decoded_frames_us_per_pair']:7.1f} "
          f"us/pair (series updates, batch-header walks)")
    for name in ("fresh", "typical", "every_api"):
        print(f"scrape {name:10} {result[f'scrape_{name}_series']:6} series "
              f"{result[f'scrape_{name}_bytes']:8} bytes, render {result[f'scrape_{name}_render_ms']:6.1f} ms")
    print(f"  consumer lag step alone                {result['consumer_lag_alone_us_per_fetch_pair']:7.1f} us "
          f"per Fetch pair (decoded beforehand)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
