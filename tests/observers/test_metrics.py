"""The metrics observer, fed real frames through the connection tracker."""

import struct

import pytest

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kproxy.observers.contract import CLIENT_CLOSED, CloseCause, CloseKind
from kproxy.observers.metrics import CLOSE_REASONS, LATENCY_BUCKETS, PREINITIALIZED_APIS, SIZE_BUCKETS, Metrics
from kproxy.protocol import schema
from kproxy.protocol import Request, Response, Struct, encode_request, encode_response, new_body
from kproxy.protocol.connection import Connection
from kproxy.protocol.errors import FrameTooLarge, UnpairedResponse, UntrackableRequest
from kproxy.protocol.record_encoder import build_batch
from kproxy.protocol.records import Record
from tests.protocol.frames import framed


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


def exchange(metrics, conn, clock, api_key, version, correlation_id, request_fields, response_fields,
             wait=0.0, client_id="app-1"):
    req = framed(encode_request(Request(api_key, version, correlation_id, client_id,
                                        new_body("request", api_key, version, **request_fields))))
    metrics(None, conn.receive_client(req))
    clock.now += wait
    resp = framed(encode_response(Response(correlation_id, new_body("response", api_key, version,
                                                                       **response_fields)),
                                  api_key, version))
    metrics(None, conn.receive_broker(resp))
    return len(req), len(resp)


def value(m, name, **labels):
    return m.registry.get_sample_value(name, labels) or 0.0


def batch(n, compression):
    return build_batch([Record(i, 1000 + i, b"k", b"v" * 100, ()) for i in range(n)], compression)


def test_counts_latency_bytes_throttle_errors_and_records():
    m, clock = Metrics(), Clock()
    conn = Connection(clock=clock)
    records = batch(5, "gzip") + batch(3, "zstd")
    req_size, resp_size = exchange(
        m, conn, clock, 0, 9, 1,
        dict(acks=-1, timeout_ms=1000, topic_data=[Struct(name="orders", partition_data=[
            Struct(index=0, records=records)])]),
        dict(throttle_time_ms=250, responses=[Struct(name="orders", partition_responses=[
            Struct(index=0, error_code=6, base_offset=-1, log_append_time_ms=-1, log_start_offset=-1,
                   record_errors=[], error_message=None)])]),
        wait=0.003)
    assert value(m, "kproxy_requests_total", api="Produce") == 1
    assert value(m, "kproxy_request_versions_total", api="Produce", version="9") == 1
    assert value(m, "kproxy_request_latency_seconds_count", api="Produce") == 1
    assert value(m, "kproxy_request_latency_seconds_bucket", api="Produce", le="0.0025") == 0
    assert value(m, "kproxy_request_latency_seconds_bucket", api="Produce", le="0.005") == 1
    assert value(m, "kproxy_request_bytes_total", api="Produce") == req_size
    assert value(m, "kproxy_response_size_bytes_sum", api="Produce") == resp_size
    assert value(m, "kproxy_throttle_time_seconds_sum", api="Produce") == 0.25
    assert value(m, "kproxy_throttled_responses_total", api="Produce") == 1
    assert value(m, "kproxy_response_errors_total", api="Produce", error="NOT_LEADER_OR_FOLLOWER") == 1
    assert value(m, "kproxy_produced_records_total") == 8
    assert value(m, "kproxy_produced_bytes_total") == len(records)
    assert value(m, "kproxy_produce_batches_total", compression="gzip") == 1
    assert value(m, "kproxy_produce_batches_total", compression="zstd") == 1


def test_empty_fetch_long_poll_is_kept_apart_from_latency():
    m, clock = Metrics(), Clock()
    conn = Connection(clock=clock)
    empty = [Struct(topic="t", partitions=[Struct(partition_index=0, records=None)])]
    exchange(m, conn, clock, 1, 12, 1, dict(topics=[]), dict(responses=empty), wait=0.5)
    full = [Struct(topic="t", partitions=[Struct(partition_index=0, records=batch(4, "lz4"))])]
    exchange(m, conn, clock, 1, 12, 2, dict(topics=[]), dict(responses=full), wait=0.002)
    assert value(m, "kproxy_fetch_long_poll_seconds_count", api="Fetch") == 1
    assert value(m, "kproxy_fetch_long_poll_seconds_sum", api="Fetch") == 0.5
    assert value(m, "kproxy_request_latency_seconds_count", api="Fetch") == 1
    assert value(m, "kproxy_fetched_records_total") == 4
    assert value(m, "kproxy_fetch_batches_total", compression="lz4") == 1


def test_unknown_versions_and_decode_failures_are_counted():
    m, clock = Metrics(), Clock()
    conn = Connection(clock=clock)
    m(None, conn.receive_client(framed(struct.pack(">hhih", 3, 99, 1, 0))))       # future version
    m(None, conn.receive_client(framed(struct.pack(">hhih", 3, 12, 2, 5) + b"ab")))  # truncated
    m(None, conn.receive_client(framed(struct.pack(">hhih", 31000, 0, 3, 0))))    # no such API
    assert value(m, "kproxy_opaque_requests_total", api="Metadata") == 1
    assert value(m, "kproxy_opaque_requests_total", api="unknown") == 1
    assert value(m, "kproxy_decode_failures_total", direction="request") == 1


def test_versions_the_schema_does_not_define_share_one_series_per_api():
    m, clock = Metrics(), Clock()
    conn = Connection(clock=clock)
    undefined = [*range(1000, 1100), -1]              # a broken or hostile client's versions
    for correlation_id, version in enumerate(undefined):
        m(None, conn.receive_client(framed(struct.pack(">hhih", 18, version, correlation_id, 0))))
        answer = Response(correlation_id, new_body("response", 18, 0, error_code=35, api_keys=[]))
        m(None, conn.receive_broker(framed(encode_response(answer, 18, 0))))   # the broker's v0 answer
    exchange(m, conn, clock, 18, 3, 200, {}, {})
    text = generate_latest(m.registry).decode()
    series = [line for line in text.splitlines()
              if line.startswith('kproxy_request_versions_total{api="ApiVersions"')]
    assert sorted(series) == ['kproxy_request_versions_total{api="ApiVersions",version="3"} 1.0',
                              'kproxy_request_versions_total{api="ApiVersions",version="unknown"} 101.0']
    assert value(m, "kproxy_requests_total", api="ApiVersions") == 102
    assert value(m, "kproxy_request_latency_seconds_count", api="ApiVersions") == 102
    assert value(m, "kproxy_response_size_bytes_count", api="ApiVersions") == 102


def test_an_api_versions_answer_at_v0_counts_its_error_whatever_version_was_asked():
    """A client asks ApiVersions at a version the broker does not serve; the broker answers
    at v0 with UNSUPPORTED_VERSION (the fallback clients rely on to negotiate). The error is
    read from the v0 body: also when the version asked for is one no Kafka defines."""
    m, clock = Metrics(), Clock()
    conn = Connection(clock=clock)
    for correlation_id, version in enumerate((3, 1000)):
        m(None, conn.receive_client(framed(struct.pack(">hhih", 18, version, correlation_id, 0))))
        answer = Response(correlation_id, new_body("response", 18, 0, error_code=35, api_keys=[]))
        m(None, conn.receive_broker(framed(encode_response(answer, 18, 0))))
    assert value(m, "kproxy_response_errors_total", api="ApiVersions", error="UNSUPPORTED_VERSION") == 2


def test_versions_kafka_removed_are_defined_so_none_is_folded_into_unknown():
    for api_key, (first, last) in schema.REMOVED_VERSIONS.items():
        assert schema.REQUESTS[api_key].has_version(first) and schema.REQUESTS[api_key].has_version(last)


def test_streamed_frames_are_counted_with_requests_and_latency_but_no_decode_failure():
    m, clock = Metrics(), Clock()
    conn = Connection(clock=clock, stream_frame_bytes=4096)
    records = batch(60, "none")                                   # ~8 KiB: streamed at 4 KiB
    produce = Struct(name="orders", partition_data=[Struct(index=0, records=records)])
    fetched = [Struct(topic="t", partitions=[Struct(partition_index=0, records=records)])]
    req_size, resp_size = exchange(m, conn, clock, 0, 9, 1,
                                   dict(acks=-1, timeout_ms=1000, topic_data=[produce]),
                                   dict(responses=[]), wait=0.003)
    exchange(m, conn, clock, 1, 12, 2, dict(topics=[]), dict(responses=fetched), wait=0.02)
    assert value(m, "kproxy_frames_streamed_total", direction="request") == 1
    assert value(m, "kproxy_frames_streamed_total", direction="response") == 1
    assert value(m, "kproxy_requests_total", api="Produce") == 1
    assert value(m, "kproxy_request_bytes_total", api="Produce") == req_size > 4096
    assert value(m, "kproxy_request_latency_seconds_sum", api="Produce") == pytest.approx(0.003)
    assert value(m, "kproxy_request_latency_seconds_sum", api="Fetch") == pytest.approx(0.02)
    assert value(m, "kproxy_fetch_long_poll_seconds_count", api="Fetch") == 0
    assert value(m, "kproxy_decode_failures_total", direction="request") == 0
    assert value(m, "kproxy_decode_failures_total", direction="response") == 0
    assert value(m, "kproxy_produced_records_total") == 0          # a streamed body is not read


def test_client_id_label_is_opt_in_and_capped():
    m, clock = Metrics(client_id_label=True, label_cap=2), Clock()
    conn = Connection(clock=clock)
    for i, client in enumerate(["a", "b", "c", "d", "a"]):
        exchange(m, conn, clock, 18, 3, i, {}, {}, client_id=client)
    assert value(m, "kproxy_client_requests_total", client_id="a") == 2
    assert value(m, "kproxy_client_requests_total", client_id="b") == 1
    assert value(m, "kproxy_client_requests_total", client_id="other") == 2
    assert Metrics().registry.get_sample_value("kproxy_client_requests_total", {"client_id": "a"}) is None


def test_exposition_follows_naming_rules():
    from types import SimpleNamespace
    m = Metrics(traffic=lambda: {"from_client": 10, "to_client": 20})
    info = SimpleNamespace(id=1, listener="bootstrap")
    m.connection_opened(info)
    m.connection_closed(info, reason=CLIENT_CLOSED, in_flight=0)
    text = generate_latest(m.registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    ours = [f for name, f in families.items() if name.startswith("kproxy_")]
    assert len(ours) >= 25
    for family in ours:
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples), family.name
        assert "milliseconds" not in family.name and "_ms" not in family.name
    assert 'kproxy_connections_closed_total{listener="bootstrap",reason="client_closed"} 1.0' in text
    assert "kproxy_build_info{" in text and "process_cpu_seconds_total" in text
    assert "kproxy_client_received_bytes_total 10.0" in text and "kproxy_client_sent_bytes_total 20.0" in text
    assert 'kproxy_connections_open{listener="bootstrap"} 0.0' in text


def test_close_causes_fall_into_a_fixed_set():
    assert CLIENT_CLOSED.label == "client_closed" and str(CLIENT_CLOSED) == "client closed"
    with pytest.raises(FrameTooLarge) as large:
        Connection().receive_client(struct.pack(">i", 200_000_000))
    assert CloseCause.of_violation(large.value).label == "frame_too_large"
    assert str(CloseCause.of_violation(large.value)).startswith("client frame of 200000000 bytes")
    with pytest.raises(UnpairedResponse) as unpaired:
        Connection().receive_broker(struct.pack(">ii", 4, 7))
    assert CloseCause.of_violation(unpaired.value).label == "unpaired_response"
    header = struct.pack(">hhih", 0, 99, 1, -1)          # Produce v99: no one can tell if it is answered
    with pytest.raises(UntrackableRequest) as refused:
        Connection().receive_client(struct.pack(">i", len(header)) + header)
    assert CloseCause.of_violation(refused.value).label == "untrackable_request"
    assert CLOSE_REASONS == tuple(kind.label for kind in CloseKind) and CLOSE_REASONS[-1] == "other"
    assert len(set(CLOSE_REASONS)) == len(CLOSE_REASONS) == 19


def api_values(m, name):
    return {s.labels["api"]: s.value for f in m.registry.collect() for s in f.samples if s.name == name}


def test_a_fresh_registry_has_series_for_the_preinitialized_apis_only_and_no_created():
    m, clock = Metrics(), Clock()
    assert api_values(m, "kproxy_requests_total") == dict.fromkeys(PREINITIALIZED_APIS, 0)
    assert set(api_values(m, "kproxy_fetch_long_poll_seconds_count")) == {"Fetch"}
    text = generate_latest(m.registry).decode()
    assert "_created" not in text
    assert 'kproxy_request_latency_seconds_bucket{api="Heartbeat"' not in text
    conn = Connection(clock=clock)
    exchange(m, conn, clock, 12, 4, 1, dict(group_id="g", generation_id=1, member_id="m"), {})
    m(None, conn.receive_client(framed(struct.pack(">hhih", 31000, 0, 2, 0))))    # no such API
    m(None, conn.receive_client(framed(struct.pack(">hhih", 31001, 0, 3, 0))))    # nor this one
    requests = api_values(m, "kproxy_requests_total")
    assert set(requests) == {*PREINITIALIZED_APIS, "Heartbeat", "unknown"}
    assert requests["Heartbeat"] == 1 and requests["unknown"] == 2
    assert value(m, "kproxy_request_latency_seconds_count", api="Heartbeat") == 1


def samples_of(registry, name, **labels):
    return sorted((s.name, tuple(sorted(s.labels.items())), s.value)
                  for f in registry.collect() if f.name == name for s in f.samples
                  if not s.name.endswith("_created") and labels.items() <= s.labels.items())


def test_plain_numbers_render_as_prometheus_clients_own_histogram_would():
    """Values on a bucket bound belong to that bucket (le), as prometheus-client counts them."""
    from prometheus_client import CollectorRegistry, Histogram
    reference = CollectorRegistry()
    latency = Histogram("kproxy_request_latency_seconds", "x", ["api"], buckets=LATENCY_BUCKETS,
                        registry=reference).labels("Heartbeat")
    sizes = Histogram("kproxy_request_size_bytes", "x", ["api"], buckets=SIZE_BUCKETS,
                      registry=reference).labels("Heartbeat")
    m, clock = Metrics(), Clock()
    conn = Connection(clock=clock)
    waits = [0.0, LATENCY_BUCKETS[0], 0.0007, LATENCY_BUCKETS[-1], LATENCY_BUCKETS[-1] + 1, 0.01]
    for i, wait in enumerate(waits):
        clock.now = 0.0
        req_size, _ = exchange(m, conn, clock, 12, 4, i, dict(group_id="g" * (i * 30), generation_id=1,
                                                              member_id="m"), {}, wait=wait)
        latency.observe(wait)
        sizes.observe(req_size)
    for name in ("kproxy_request_latency_seconds", "kproxy_request_size_bytes"):
        assert samples_of(m.registry, name, api="Heartbeat") == samples_of(reference, name)


def test_scrapes_in_another_thread_see_consistent_histograms_while_the_loop_counts():
    """The admin listener renders in a worker thread, without a lock on the loop's counting."""
    import sys
    import threading
    m, clock = Metrics(), Clock()
    conn = Connection(clock=clock)
    problems, done = [], threading.Event()

    def scrape():
        while not done.is_set():
            try:
                for family in m.registry.collect():
                    if family.type != "histogram" or not family.name.startswith("kproxy_"):
                        continue
                    by_series: dict = {}
                    for s in family.samples:
                        key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                        by_series.setdefault(key, []).append(s)
                    for samples in by_series.values():
                        buckets = [s.value for s in samples if s.name.endswith("_bucket")]
                        count = [s.value for s in samples if s.name.endswith("_count")]
                        if buckets != sorted(buckets) or count != buckets[-1:]:
                            problems.append((family.name, buckets, count))
            except Exception as error:          # e.g. a dict changing size under the scrape
                problems.append(repr(error))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)                 # switch threads as often as CPython allows
    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        unanswered = Connection(clock=clock)   # unknown APIs, never answered
        for i in range(3000):
            if i % 7 == 0:
                m(None, unanswered.receive_client(framed(struct.pack(">hhih", 31000 + i % 1000, 0, i, 0))))
            else:
                exchange(m, conn, clock, 12, 4, i, dict(group_id="g", generation_id=1, member_id="m"), {},
                         wait=0.001 * (i % 50))
            for api in list(schema.API_NAMES)[: i % 20]:
                m._series(api)                  # new APIs appear while scrapes run
    finally:
        done.set()
        scraper.join()
        sys.setswitchinterval(interval)
    assert not problems, problems[:5]
    assert value(m, "kproxy_requests_total", api="Heartbeat") == 3000 - len(range(0, 3000, 7))


def test_produce_and_fetch_are_counted_without_decoding_them_whole(monkeypatch):
    """Only what the metrics read of Produce and Fetch pairs is decoded (``protocol.skim``):
    the whole decoders are not called for them, and every count is still there."""
    import kproxy.protocol.events as events_module
    from kproxy.protocol import Uuid

    def whole(*args):
        raise AssertionError("a Produce or Fetch frame was decoded whole")

    monkeypatch.setattr(events_module, "decode_request", whole)
    monkeypatch.setattr(events_module, "decode_response", whole)
    m, clock = Metrics(), Clock()
    conn = Connection(clock=clock)
    records, topic_id = batch(5, "lz4"), Uuid(bytes(range(16)))
    for correlation_id, version in enumerate((9, 13)):
        topic = dict(name="orders") if version < 13 else dict(topic_id=topic_id)
        exchange(m, conn, clock, 0, version, correlation_id,
                 dict(acks=-1, timeout_ms=1000, topic_data=[Struct(**topic, partition_data=[
                     Struct(index=0, records=records)])]),
                 dict(throttle_time_ms=5, responses=[Struct(**topic, partition_responses=[
                     Struct(index=0, error_code=6)])]))
    for correlation_id, version in enumerate((12, 16, 18), start=2):
        topic = dict(topic="orders") if version < 13 else dict(topic_id=topic_id)
        exchange(m, conn, clock, 1, version, correlation_id,
                 dict(session_epoch=-1, topics=[Struct(**topic, partitions=[Struct(partition=0, fetch_offset=90)])]),
                 dict(responses=[Struct(**topic, partitions=[
                     Struct(partition_index=0, high_watermark=100 + version, records=records)])]))
    assert value(m, "kproxy_produced_records_total") == 10
    assert value(m, "kproxy_fetched_records_total") == 15
    assert value(m, "kproxy_fetch_batches_total", compression="lz4") == 3
    assert value(m, "kproxy_response_errors_total", api="Produce", error="NOT_LEADER_OR_FOLLOWER") == 2
    assert value(m, "kproxy_throttle_time_seconds_sum", api="Produce") == 0.01
    assert value(m, "kproxy_consumer_lag_records") == 118 - 90     # full fetches: the last one counts
