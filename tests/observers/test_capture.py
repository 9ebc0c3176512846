"""The capture observer fed synthetic traffic through the real connection tracker.

The helpers the capture test modules share (``Link``, ``read_jsonl``, ``read_parquet``,
``pcap_streams``) are in ``tests/observers/captures.py``.
"""

from __future__ import annotations

import base64
import glob
import json
import logging
import os
import re
import struct
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kproxy.observers.capture import Capture, CaptureConfig, CaptureError, CaptureFilter
from kproxy.observers.capture import control
from kproxy.observers.capture.filters import MATCHED_CLIENT_ID_CHARS, sample_hash
from kproxy.observers.capture.parquet import SCHEMA
from kproxy.observers.capture.writer import Writer
from kproxy.protocol import Request, Struct, Uuid, encode_request, new_body
from kproxy.protocol.connection import Connection
from tests.observers.captures import (Link, all_bytes, files, metadata_response, pcap_streams, produce_request,
                                      produce_response, read_jsonl, read_parquet, records, split_frames)
from tests.protocol.frames import framed

PASSWORD = b"hunter2-Pa55word"
SECRET_VALUE = b"TOP-SECRET-VALUE"


# ---------------------------------------------------------------- helpers

def disk_use(directory, ext) -> int:
    total = 0
    for path in files(directory, ext):
        try:
            total += os.path.getsize(path)
        except FileNotFoundError:      # deleted by the writer thread meanwhile
            pass
    return total


@pytest.fixture
def capture():
    c = Capture()
    yield c
    c.stop()


def start(capture, tmp_path, **settings):
    settings.setdefault("formats", ("jsonl", "parquet", "pcapng"))
    capture.start(CaptureConfig(directory=str(tmp_path), **settings))
    return capture


# ---------------------------------------------------------------- rows

def mixed_traffic(link: Link) -> None:
    link.exchange(18, 3, 1, dict(client_software_name="t", client_software_version="1"),
                  dict(api_keys=[Struct(api_key=0, min_version=0, max_version=9)]))
    link.exchange(3, 12, 2, dict(topics=[Struct(name="orders", topic_id=Uuid(bytes(16)))]),
                  metadata_response(["orders", "audit"]))
    link.exchange(0, 9, 3, produce_request(recs=records(5, compression="gzip") + records(2)),
                  dict(produce_response(error=6), throttle_time_ms=25))
    link.request(0, 9, 4, **produce_request(topic="audit", acks=0))                 # no response
    # Pipelined: two requests, then both responses.
    link.request(1, 12, 5, topics=[Struct(topic="orders", partitions=[Struct(partition=0)])])
    link.request(1, 12, 6, topics=[Struct(topic="orders", partitions=[Struct(partition=1)])])
    for corr, part in ((5, 0), (6, 1)):
        link.response(1, 12, corr, responses=[Struct(topic="orders", partitions=[Struct(
            partition_index=part, error_code=0, high_watermark=9, records=records(4, compression="lz4"))])])


def test_one_row_per_pair_in_jsonl_and_parquet(capture, tmp_path):
    start(capture, tmp_path)
    link = Link(capture)
    mixed_traffic(link)
    link.close(capture)
    capture.stop()

    rows = read_jsonl(tmp_path)
    table = read_parquet(tmp_path)
    assert len(rows) == table.num_rows == link.pairs == 6
    assert capture.rows_written == 6 and capture.dropped == 0 and capture.row_errors == 0
    by_corr = {r["correlation_id"]: r for r in rows}
    produce = by_corr[3]
    assert produce["api_name"] == "Produce" and produce["api_version"] == 9
    assert produce["client_id"] == "app-1" and produce["client_host"] == "127.0.0.1"
    assert produce["errors"] == ["NOT_LEADER_OR_FOLLOWER"] and produce["error_count"] == 1
    assert produce["throttle_ms"] == 25 and produce["topics"] == ["orders"]
    assert produce["record_count"] == 7 and produce["batch_count"] == 2
    assert produce["compression"] == ["gzip", "none"]
    assert produce["topic_records"][0]["topic"] == "orders"
    assert produce["outcome"] == "response" and produce["latency_ms"] >= 0
    assert [(a["topic"], a["error"]) for a in produce["partition_answers"]] == [("orders", "NOT_LEADER_OR_FOLLOWER")]
    assert by_corr[4]["partition_answers"] is None                  # acks=0: no answer
    assert produce["time"].endswith("Z") and len(produce["time"]) == len("2024-01-01T00:00:00.000000Z")
    # Records summarised per partition in the body, not included.
    summary = produce["request"]["topic_data"][0]["partition_data"][0]["records"]
    assert summary == {"batches": 2, "records": 7, "bytes": summary["bytes"], "codecs": ["gzip", "none"]}
    assert by_corr[4]["outcome"] == "no_response" and by_corr[4]["response"] is None
    assert by_corr[4]["latency_ms"] is None and by_corr[4]["topics"] == ["audit"]
    assert by_corr[2]["topics"] == ["orders", "audit"]
    assert by_corr[6]["record_count"] == 4 and by_corr[6]["partition_count"] == 1
    assert by_corr[1]["response"]["api_keys"][0]["max_version"] == 9

    assert table.schema.equals(SCHEMA, check_metadata=False)
    assert table.schema.field("time").type == pa.timestamp("us", tz="UTC")
    meta = pq.read_metadata(files(tmp_path, "parquet")[0]).metadata
    assert meta[b"kproxy.capture.schema_version"] == b"4"
    assert set(table.column("capture_version").to_pylist()) == {4} and {r["capture_version"] for r in rows} == {4}
    assert pq.ParquetFile(files(tmp_path, "parquet")[0]).metadata.row_group(0).column(0).compression == "ZSTD"
    prow = {r["correlation_id"]: r for r in table.to_pylist()}[3]
    assert prow["errors"] == ["NOT_LEADER_OR_FOLLOWER"] and prow["record_count"] == 7
    assert prow["time"].isoformat(timespec="microseconds").replace("+00:00", "Z") == produce["time"]
    assert "request" not in table.column_names


def test_wall_clock_time_comes_from_the_monotonic_event_time(capture, tmp_path):
    start(capture, tmp_path, formats=("parquet",))
    before = time.time()
    Link(capture).exchange(18, 3, 1)
    after = time.time()
    capture.stop()
    t = read_parquet(tmp_path).column("time")[0].as_py().timestamp()
    assert before - 0.01 <= t <= after + 0.01


def test_unanswered_requests_get_a_row_at_close(capture, tmp_path):
    start(capture, tmp_path, formats=("jsonl",))
    link = Link(capture)
    link.exchange(18, 3, 1)
    link.request(1, 12, 2, topics=[])
    link.request(1, 12, 3, topics=[])
    link.close(capture)
    capture.stop()
    rows = read_jsonl(tmp_path)
    assert [(r["correlation_id"], r["outcome"]) for r in rows] == \
        [(1, "response"), (2, "unanswered"), (3, "unanswered")]
    assert rows[1]["response_size"] is None


def test_sasl_secrets_never_reach_any_file(capture, tmp_path):
    start(capture, tmp_path)
    link = Link(capture)
    plain = b"\0alice\0" + PASSWORD
    link.exchange(17, 1, 1, dict(mechanism="PLAIN"), dict(error_code=0, mechanisms=["PLAIN"]))
    link.exchange(36, 2, 2, dict(auth_bytes=plain), dict(error_code=0, auth_bytes=b"",
                                                         session_lifetime_ms=0))
    # SCRAM credentials, delegation token HMAC, a password-bearing config.
    link.exchange(51, 0, 3, dict(deletions=[], upsertions=[Struct(
        name="bob", mechanism=1, iterations=4096, salt=b"SALTSALT" + PASSWORD,
        salted_password=PASSWORD + b"-salted")]), dict(results=[]))
    link.exchange(38, 2, 4, dict(renewers=[], max_lifetime_ms=-1),
                  dict(error_code=0, principal_type="User", principal_name="a", issue_timestamp_ms=0,
                       expiry_timestamp_ms=0, max_timestamp_ms=0, token_id="tok-1",
                       hmac=PASSWORD + b"-hmac", throttle_time_ms=0))
    link.exchange(44, 1, 5, dict(resources=[Struct(resource_type=4, resource_name="1", configs=[
        Struct(name="listener.name.sasl_ssl.ssl.key.password", config_operation=0,
               value=PASSWORD.decode())])], validate_only=False), dict(responses=[]))
    # SaslHandshake v0: raw tokens follow, with no Kafka framing; the tracker never keeps them.
    raw = Link(capture, conn_id=2, client=("127.0.0.1", 40002))
    raw.exchange(17, 0, 1, dict(mechanism="PLAIN"), dict(error_code=0, mechanisms=["PLAIN"]))
    raw.raw_client(framed(plain))
    raw.raw_broker(framed(b""))
    raw.exchange(3, 1, 2, dict(topics=None), metadata_response([], version=1))
    link.close(capture)
    raw.close(capture)
    capture.stop()

    assert PASSWORD not in all_bytes(tmp_path)
    rows = {(r["connection_id"], r["correlation_id"]): r for r in read_jsonl(tmp_path)}
    assert rows[(1, 2)]["request"]["auth_bytes"] == f"<redacted {len(plain)} bytes>"
    upsert = rows[(1, 3)]["request"]["upsertions"][0]
    assert upsert["salted_password"].startswith("<redacted") and upsert["name"] == "bob"
    assert rows[(1, 4)]["response"]["hmac"] == f"<redacted {len(PASSWORD) + 5} bytes>"
    assert rows[(1, 4)]["response"]["token_id"] == "tok-1"
    config = rows[(1, 5)]["request"]["resources"][0]["configs"][0]
    assert config["value"] == f"<redacted {len(PASSWORD)} bytes>"
    assert (2, 2) in rows                                       # framing resumed after the raw tokens
    # pcapng: the streams keep their true lengths (zero-filled), so framing still works.
    streams = pcap_streams(files(tmp_path, "pcapng"))
    client_frames = split_frames(streams[(40002, 9092)][0])
    assert len(client_frames) == 3 and client_frames[1] == bytes(len(plain))
    auth = split_frames(streams[(40001, 9092)][0])[1]
    assert len(auth) == len(encode_request(Request(36, 2, 2, "app-1", new_body("request", 36, 2,
                                                                              auth_bytes=plain))))


def test_record_data_is_left_out_by_default(capture, tmp_path):
    start(capture, tmp_path)
    link = Link(capture)
    headers = (("trace-id", SECRET_VALUE + b"-h"),)
    link.exchange(0, 9, 1, produce_request(recs=records(3, key=SECRET_VALUE + b"-k",
                                                        value=SECRET_VALUE, headers=headers)),
                  produce_response())
    link.exchange(0, 9, 2, produce_request(recs=records(3, value=SECRET_VALUE, compression="zstd")),
                  produce_response())
    link.exchange(0, 2, 3, produce_request(recs=records(2, value=SECRET_VALUE, magic=1)),
                  dict(responses=[Struct(name="orders", partition_responses=[Struct(
                      index=0, error_code=0, base_offset=0, log_append_time_ms=-1)])], throttle_time_ms=0))
    link.close(capture)
    capture.stop()
    data = all_bytes(tmp_path)
    assert SECRET_VALUE not in data
    assert b"trace-id" in data                      # header keys are kept in pcapng
    assert read_jsonl(tmp_path)[0]["record_count"] == 3


def test_record_data_when_enabled(capture, tmp_path):
    start(capture, tmp_path, include_record_data=True)
    link = Link(capture)
    link.exchange(0, 9, 1, produce_request(recs=records(2, value=SECRET_VALUE,
                                                        headers=(("h", b"hv"),))), produce_response())
    capture.stop()
    rows = read_jsonl(tmp_path)
    data = rows[0]["request"]["topic_data"][0]["partition_data"][0]["records"]["data"]
    assert base64.b64decode(data[1]["value"]) == SECRET_VALUE + b"1"
    assert data[0]["headers"] == [{"key": "h", "value": base64.b64encode(b"hv").decode()}]
    assert SECRET_VALUE in all_bytes(tmp_path)      # pcapng carries the frames unchanged


# ---------------------------------------------------------------- filters

def test_filters_by_api_client_id_address_and_topic(tmp_path):
    def run(name, **flt):
        capture = Capture()
        capture.start(CaptureConfig(directory=str(tmp_path / name), formats=("jsonl",), filter=flt))
        a = Link(capture, conn_id=1, client=("10.1.2.3", 5000))
        b = Link(capture, conn_id=2, client=("192.168.0.9", 5001))
        for link in (a, b):
            link.exchange(18, 3, 1, client_id="billing-api")
            link.exchange(0, 9, 2, produce_request("orders"), produce_response("orders"),
                          client_id="billing-worker")
            link.exchange(0, 9, 3, produce_request("audit"), produce_response("audit"),
                          client_id="reports")
        capture.stop()
        return capture, sorted((r["connection_id"], r["correlation_id"]) for r in read_jsonl(tmp_path / name))

    assert run("all")[1] == [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (2, 3)]
    assert run("api", apis=["Produce"])[1] == [(1, 2), (1, 3), (2, 2), (2, 3)]
    assert run("glob", client_id="billing-*")[1] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert run("regex", client_id_regex="work|rep")[1] == [(1, 2), (1, 3), (2, 2), (2, 3)]
    assert run("cidr", clients=["10.0.0.0/8"])[1] == [(1, 1), (1, 2), (1, 3)]
    assert run("host", clients=["192.168.0.9"])[1] == [(2, 1), (2, 2), (2, 3)]
    capture, rows = run("topic", topics=["ord*"])
    assert rows == [(1, 2), (2, 2)]
    assert capture.filtered_topics == 4
    capture, rows = run("combined", apis="Produce", topics=["audit"], clients="10.1.2.3")
    assert rows == [(1, 3)] and capture.filtered == 4


def test_topic_filter_resolves_topic_ids_from_metadata(capture, tmp_path):
    topic_id = Uuid(bytes(range(1, 17)))
    start(capture, tmp_path, formats=("jsonl",), filter={"apis": ["Fetch"], "topics": ["orders"]})
    link = Link(capture)
    link.exchange(3, 12, 1, dict(topics=None), metadata_response(["orders"], {"orders": topic_id}))
    fetch = dict(topics=[Struct(topic_id=topic_id, partitions=[Struct(partition=0)])])
    link.exchange(1, 13, 2, fetch, dict(responses=[Struct(topic_id=topic_id, partitions=[Struct(
        partition_index=0, records=records(2))])]))
    link.exchange(1, 13, 3, dict(topics=[Struct(topic_id=Uuid(bytes(16)), partitions=[])]), dict(responses=[]))
    capture.stop()
    rows = read_jsonl(tmp_path)
    assert [(r["correlation_id"], r["topics"]) for r in rows] == [(2, ["orders"])]
    assert rows[0]["request"]["topics"][0]["topic_id"] == str(topic_id)


def test_sampling_keeps_requests_and_responses_together(capture, tmp_path):
    start(capture, tmp_path, formats=("jsonl", "pcapng"), filter={"sample": 0.3})
    links = [Link(capture, conn_id=i, client=("127.0.0.1", 41000 + i)) for i in range(1, 4)]
    for corr in range(1, 101):
        for link in links:
            link.exchange(18, 3, corr)
    for link in links:
        link.close(capture)
    capture.stop()
    kept = {(r["connection_id"], r["correlation_id"]) for r in read_jsonl(tmp_path)}
    expected = {(link.info.id, corr) for link in links for corr in range(1, 101)
                if sample_hash(link.info.id, corr) < 0.3}
    assert kept == expected and 45 < len(kept) < 135
    streams = pcap_streams(files(tmp_path, "pcapng"))
    for link in links:
        client, server = streams[(link.info.client[1], 9092)]
        requests = [struct.unpack_from(">i", f, 4)[0] for f in split_frames(client)]
        responses = [struct.unpack_from(">i", f, 0)[0] for f in split_frames(server)]
        assert requests == responses == sorted(c for i, c in kept if i == link.info.id)


def api_versions_event(client_id_bytes: bytes):
    """The RequestReceived of an ApiVersions v3 whose header carries these client_id bytes."""
    body = new_body("request", 18, 3, client_software_name="t", client_software_version="1")
    placeholder = "\x01" * len(client_id_bytes)
    frame = encode_request(Request(18, 3, 7, placeholder, body))
    assert frame[10:10 + len(client_id_bytes)] == placeholder.encode()      # after its int16 length
    frame = frame[:10] + client_id_bytes + frame[10 + len(client_id_bytes):]
    return Connection().receive_client(framed(frame))[-1]


def test_client_id_regex_is_re2_on_a_bounded_client_id():
    def kept(pattern: str, client_id: bytes) -> bool:
        return CaptureFilter(client_id_regex=pattern).compile().request_ok(1, api_versions_event(client_id))

    # Only the first MATCHED_CLIENT_ID_CHARS characters are matched.
    assert kept("^x+$", b"x" * MATCHED_CLIENT_ID_CHARS + b"y")
    assert not kept("y", b"x" * MATCHED_CLIENT_ID_CHARS + b"y")
    assert kept("y", b"x" * (MATCHED_CLIENT_ID_CHARS - 1) + b"y")
    # Invalid UTF-8 is matched as U+FFFD (RE2 takes valid text only), never an exception.
    assert kept("^caf.$", b"caf\xff") and kept("^caf\uFFFD", b"caf\xff")
    assert kept("^caf\u00e9$", "caf\u00e9".encode()) and not kept("^caf$", "caf\u00e9".encode())
    # The pattern that backtracks exponentially in Python's re, and the hostile client_id.
    assert kept("(a+)+$", b"aaa") and not kept("(a+)+$", b"aaa!")
    assert kept("(a+)+$", b"a" * 10_000 + b"!")          # its first characters are all 'a'
    # The glob filter sees the same bounded client_id.
    glob = CaptureFilter(client_id="*y").compile()
    assert not glob.request_ok(1, api_versions_event(b"x" * MATCHED_CLIENT_ID_CHARS + b"y"))


@pytest.mark.parametrize("pattern,message", [
    (r"(a)\1", r"invalid escape sequence: \1"),
    (r"(?=a)b", "invalid perl operator: (?="),
    (r"(?<!a)b", "invalid perl operator: (?<!"),
    (r"a\Z", r"invalid escape sequence: \Z"),
    (r"(", "missing ): ("),
    (r"(.{0,50}){20}z", "too large to run on every request"),
])
def test_client_id_regex_refuses_what_re2_cannot_match_in_linear_time(pattern, message):
    expected = "^" + re.escape(f"capture.filter.client_id_regex: {message}")
    with pytest.raises(ValueError, match=expected):
        CaptureFilter.from_dict({"client_id_regex": pattern})
    with pytest.raises(ValueError, match=expected):
        CaptureConfig.from_dict({"directory": "d", "filter": {"client_id_regex": pattern}})


def test_filter_settings_are_validated():
    with pytest.raises(ValueError, match="capture.filter.apis: unknown API 'Produse'"):
        CaptureFilter.from_dict({"apis": ["Produse"]})
    with pytest.raises(ValueError, match="capture.filter.sample"):
        CaptureFilter.from_dict({"sample": 0})
    with pytest.raises(ValueError, match="client_id_regex"):
        CaptureFilter.from_dict({"client_id_regex": "("})
    with pytest.raises(ValueError, match="capture.filter.clients"):
        CaptureFilter.from_dict({"clients": ["10.0.0.0/8 bad"]})
    with pytest.raises(ValueError, match="capture.filter.topic: unknown setting"):
        CaptureFilter.from_dict({"topic": "x"})
    with pytest.raises(ValueError, match="capture.formats: unknown format 'pcap'"):
        CaptureConfig.from_dict({"directory": "/tmp/x", "formats": "jsonl,pcap"})
    with pytest.raises(ValueError, match="capture.directory: required"):
        CaptureConfig.from_dict({"formats": ["jsonl"]})
    with pytest.raises(ValueError, match="capture.max_total_bytes"):
        CaptureConfig.from_dict({"directory": "d", "rotate_bytes": "1MiB", "max_total_bytes": "1MiB",
                                 "formats": "jsonl,parquet"})
    config = CaptureConfig.from_dict({"directory": "d", "rotate_bytes": "64MiB", "include_record_data": "yes",
                                      "filter": {"apis": "Produce,fetch", "sample": "0.5"}})
    assert config.rotate_bytes == 64 * 1024 * 1024 and config.include_record_data
    assert config.filter.compile().api_keys == {0, 1}
    assert CaptureConfig.from_dict(config.to_dict()) == config


# ---------------------------------------------------------------- files

def test_files_are_private(capture, tmp_path):
    directory = tmp_path / "new" / "captures"
    capture.start(CaptureConfig(directory=str(directory), formats=("jsonl", "parquet", "pcapng")))
    Link(capture).exchange(18, 3, 1)
    capture.stop()
    assert os.stat(directory).st_mode & 0o777 == 0o700
    paths = glob.glob(str(directory / "*"))
    assert len(paths) == 3
    for path in paths:
        assert os.stat(path).st_mode & 0o777 == 0o600
        assert os.path.basename(path).startswith("kproxy-capture-")


def test_rotation_by_size_keeps_every_row(capture, tmp_path):
    start(capture, tmp_path, formats=("jsonl", "parquet", "pcapng"), rotate_bytes=8192,
          max_total_bytes=10 ** 9, parquet_batch_rows=20)
    link = Link(capture)
    for corr in range(1, 301):
        link.exchange(0, 9, corr, produce_request(), produce_response())
    link.close(capture)
    capture.stop()
    jsonl = files(tmp_path, "jsonl")
    assert len(jsonl) > 5
    assert all(os.path.getsize(p) <= 8192 for p in jsonl)
    assert len(read_jsonl(tmp_path)) == 300
    assert len(files(tmp_path, "parquet")) > 1 and read_parquet(tmp_path).num_rows == 300
    pcaps = files(tmp_path, "pcapng")
    assert len(pcaps) > 5 and all(os.path.getsize(p) <= 8192 for p in pcaps)
    client, server = pcap_streams(pcaps)[(40001, 9092)]
    assert len(split_frames(client)) == len(split_frames(server)) == 300


def test_rotation_by_time(capture, tmp_path):
    start(capture, tmp_path, formats=("jsonl", "parquet"), rotate_seconds=0.3, parquet_flush_seconds=0.05)
    link = Link(capture)
    link.exchange(18, 3, 1)
    time.sleep(0.9)
    link.exchange(18, 3, 2)
    time.sleep(0.9)                 # an empty file is not rotated again and again
    capture.stop()
    assert len(files(tmp_path, "jsonl")) == 2 and len(files(tmp_path, "parquet")) == 2
    assert [r["correlation_id"] for r in read_jsonl(tmp_path)] == [1, 2]
    assert read_parquet(tmp_path).num_rows == 2


def test_total_size_cap_deletes_the_oldest_of_its_own_files(capture, tmp_path):
    # A file named like ours but not written by this capture is neither counted nor deleted.
    old = tmp_path / "kproxy-capture-20000101T000000-000001.jsonl"
    old.write_bytes(b"x" * 50_000)
    os.utime(old, (946684800, 946684800))
    unrelated = tmp_path / "notes.txt"
    unrelated.write_bytes(b"y" * 50_000)
    start(capture, tmp_path, formats=("jsonl",), rotate_bytes=4096, max_total_bytes=20_000)
    assert old.exists() and unrelated.exists()
    link = Link(capture)
    for corr in range(1, 400):
        link.exchange(0, 9, corr, produce_request(), produce_response())
        assert disk_use(tmp_path, "jsonl") - 50_000 <= 20_000 + 4096
    capture.stop()
    assert disk_use(tmp_path, "jsonl") - 50_000 <= 20_000
    assert old.read_bytes() == b"x" * 50_000 and unrelated.exists()
    old.unlink()
    assert capture.files_deleted > 3
    rows = read_jsonl(tmp_path)
    assert rows[-1]["correlation_id"] == 399 and len(rows) < 399


# ---------------------------------------------------------------- never blocking, never failing traffic

def test_a_full_queue_drops_and_counts_without_blocking(capture, tmp_path, monkeypatch):
    original = Writer._handle
    monkeypatch.setattr(Writer, "_handle", lambda self, item: (time.sleep(0.02), original(self, item)))
    start(capture, tmp_path, formats=("jsonl",), queue_max_items=10)
    link = Link(capture)
    began = time.perf_counter()
    for corr in range(1, 501):
        link.exchange(0, 9, corr, produce_request(), produce_response())
    elapsed = time.perf_counter() - began
    assert elapsed < 2.0, "the observer waited for the writer"
    assert capture.dropped > 400
    assert capture.enqueued + capture.dropped == 1000          # every request and response
    assert capture.status()["queue"]["items"] <= 10
    link.close(capture)
    capture.stop()
    assert capture.rows_written == len(read_jsonl(tmp_path)) > 0


@pytest.mark.parametrize("share", [0.25, 0.5, 1.0])
def test_the_writer_pauses_to_stay_within_its_cpu_share(capture, tmp_path, monkeypatch, share):
    """Each pair "costs" 10 ms of the writer's CPU (a fake thread clock); the writer must
    then sleep (1 - share) / share of that, so it holds the interpreter lock the relay
    needs at most ``share`` of the time."""
    from kproxy.observers.capture import writer as writer_module
    cpu = [0.0]
    pauses = []
    real_sleep = time.sleep
    original = Writer._handle

    def handle(self, item):
        cpu[0] += 0.010
        return original(self, item)

    def sleep(seconds):
        if threading.current_thread().name == "kproxy-capture":
            pauses.append(seconds)
        real_sleep(0)

    monkeypatch.setattr(Writer, "_handle", handle)
    monkeypatch.setattr(writer_module.time, "thread_time", lambda: cpu[0])
    monkeypatch.setattr(writer_module.time, "sleep", sleep)
    start(capture, tmp_path, formats=("jsonl",), writer_cpu_share=share)
    link = Link(capture)
    for corr in range(1, 21):
        link.exchange(18, 3, corr)
    capture.stop()
    assert capture.rows_written == 20
    handled = capture.enqueued                           # every request and response, 10 ms each
    assert cpu[0] == pytest.approx(handled * 0.010)
    assert sum(pauses) == pytest.approx(cpu[0] * (1 - share) / share)
    assert capture.status()["config"]["writer_cpu_share"] == share


def test_writer_cpu_share_is_validated(tmp_path):
    for bad in (0, -0.1, 1.5, "much"):
        with pytest.raises(ValueError, match="writer_cpu_share"):
            CaptureConfig.from_dict({"directory": str(tmp_path), "writer_cpu_share": bad})


def test_queue_bytes_bound(capture, tmp_path, monkeypatch):
    gate = threading.Event()
    original = Writer._handle
    monkeypatch.setattr(Writer, "_handle", lambda self, item: (gate.wait(5), original(self, item)))
    start(capture, tmp_path, formats=("jsonl",), queue_max_bytes=64 * 1024)
    link = Link(capture)
    big = records(1, value=b"x" * 20_000)
    for corr in range(1, 11):
        link.exchange(0, 9, corr, produce_request(recs=big), produce_response())
    assert capture.dropped > 0 and capture.status()["queue"]["bytes"] <= 64 * 1024
    gate.set()


def test_a_streamed_frame_is_charged_only_the_header_it_holds(capture, tmp_path, monkeypatch):
    """A frame streamed before the capture began (or by a tracker nobody asked for
    bodies) holds its header only: the queue is charged that, not the frame's wire size,
    so a 200 KiB streamed Produce passes a 64 KiB queue that it does not fill."""
    gate = threading.Event()
    original = Writer._handle
    monkeypatch.setattr(Writer, "_handle", lambda self, item: (gate.wait(5), original(self, item)))
    start(capture, tmp_path, formats=("jsonl", "pcapng"), queue_max_bytes=64 * 1024)
    link = Link(capture)
    link.conn = Connection(stream_frame_bytes=4096)
    events = link.request(0, 9, 1, **produce_request(recs=records(1, value=b"x" * 200_000)))
    link.response(0, 9, 1, **produce_response())
    (request,) = events
    assert request.streamed and request.size > 200_000 and request.held_size < 1024
    queued = capture.status()["queue"]["bytes"]
    gate.set()
    assert capture.dropped == 0 and capture.enqueued == 2          # the request (pcapng), the pair
    assert queued < 4 * 1024, queued
    capture.stop()
    (row,) = read_jsonl(tmp_path)
    assert row["api_name"] == "Produce" and row["request_size"] == request.size


def test_a_failing_disk_stops_capture_with_one_log_line(capture, tmp_path, monkeypatch, caplog):
    start(capture, tmp_path, formats=("jsonl", "parquet"))
    link = Link(capture)
    link.exchange(18, 3, 1)
    from kproxy.observers.capture.jsonl import JsonlSink

    def full_disk(self, row):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(JsonlSink, "write", full_disk)
    with caplog.at_level(logging.INFO, logger="kproxy.capture"):
        for corr in range(2, 50):
            link.exchange(18, 3, corr)
        deadline = time.monotonic() + 5
        while capture.active and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not capture.active
        enqueued = capture.enqueued
        for corr in range(50, 60):                       # traffic flows on; nothing is queued any more
            events = link.exchange(18, 3, corr)
            assert events and events[0].response is not None
        assert capture.enqueued == enqueued
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "capture stopped" in errors[0].getMessage()
    assert "No space left on device" in errors[0].getMessage()
    status = capture.status()
    assert status["state"] == "failed" and "No space left" in status["error"]
    assert capture.write_errors == 1
    # Capture can be started again once the disk is back.
    monkeypatch.undo()
    capture.start(CaptureConfig(directory=str(tmp_path / "again"), formats=("jsonl",)))
    link.exchange(18, 3, 100)
    capture.stop()
    assert len(read_jsonl(tmp_path / "again")) == 1


def test_a_removed_directory_stops_capture_at_rotation(capture, tmp_path, caplog):
    directory = tmp_path / "gone"
    capture.start(CaptureConfig(directory=str(directory), formats=("pcapng",), rotate_bytes=4096,
                                max_total_bytes=10 ** 6))
    link = Link(capture)
    link.exchange(18, 3, 1)
    for path in glob.glob(str(directory / "*")):
        os.unlink(path)
    os.rmdir(directory)
    with caplog.at_level(logging.ERROR, logger="kproxy.capture"):
        for corr in range(2, 200):
            link.exchange(0, 9, corr, produce_request(), produce_response())
        deadline = time.monotonic() + 5
        while capture.active and time.monotonic() < deadline:
            time.sleep(0.01)
    assert not capture.active and capture.write_errors == 1
    assert len([r for r in caplog.records if r.name == "kproxy.capture"]) == 1


def test_start_fails_cleanly_when_the_directory_cannot_be_created(capture, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError):
        capture.start(CaptureConfig(directory=str(blocker / "sub")))
    assert not capture.active and capture.status()["state"] == "off"
    status, body = control.start_capture(capture, {"directory": str(blocker / "sub")}, root=str(tmp_path))
    assert status == 500 and "cannot write captures" in body["error"]


def test_admin_helpers(capture, tmp_path):
    assert control.capture_status(capture) == (200, capture.status())
    assert capture.status()["state"] == "off"
    root = str(tmp_path)
    status, body = control.start_capture(capture, {"formats": ["jsonl"]}, defaults=CaptureConfig(directory=root),
                                         root=root)
    assert status == 200 and body["state"] == "running" and body["files"]["jsonl"].startswith(root)
    json.dumps(body)
    status, body = control.start_capture(capture, {}, defaults=CaptureConfig(directory=root), root=root)
    assert status == 409
    assert control.start_capture(Capture(), {"directory": root, "formats": ["x"]}, root=root)[0] == 400
    assert control.parse_json_body(b"[1]")[0] == 400 and control.parse_json_body(b"") == {}
    Link(capture).exchange(18, 3, 1)
    status, body = control.stop_capture(capture)
    assert status == 200 and body["state"] == "stopped" and body["counters"]["rows_written"] == 1
    json.dumps(body)
    with pytest.raises(CaptureError):
        capture.start(CaptureConfig(directory=str(tmp_path)))
        capture.start(CaptureConfig(directory=str(tmp_path)))


def test_idle_capture_costs_nothing_and_accepts_no_info():
    capture = Capture()
    link = Link(capture)
    link.exchange(18, 3, 1)
    capture(None, [])
    capture.connection_closed(link.info)
    assert capture.counters() == dict.fromkeys(capture.counters(), 0)


def test_undecodable_and_malformed_frames_are_recorded_not_fatal(capture, tmp_path):
    start(capture, tmp_path, formats=("jsonl", "pcapng"))
    link = Link(capture)
    truncated = struct.pack(">hhih", 3, 12, 1, 5) + b"app-9" + b"\x01"        # Metadata v12, body cut
    link.raw_client(framed(truncated))
    link.response(3, 12, 1, **metadata_response([]))
    link.raw_client(framed(b"\x00\x01"))                                       # shorter than a header
    link.exchange(18, 3, 2)
    link.close(capture)
    capture.stop()
    rows = read_jsonl(tmp_path)
    assert [r["correlation_id"] for r in rows] == [1, 2]
    assert rows[0]["decode_error"].startswith("request:") and rows[0]["client_id"] == "app-9"
    assert rows[0]["request"] is None and rows[0]["response"]["controller_id"] == 1
    assert capture.malformed_frames == 1
    client, _ = pcap_streams(files(tmp_path, "pcapng"))[(40001, 9092)]
    assert split_frames(client) == [truncated, b"\x00\x01", split_frames(client)[2]]


def test_a_pair_that_cannot_be_written_is_counted_and_logged_once(capture, tmp_path, monkeypatch, caplog):
    from kproxy.observers.capture import writer as writer_module

    original = writer_module.build_row

    def flaky(info, request, *args, **kwargs):
        if request.correlation_id % 2:
            raise RuntimeError("bug")
        return original(info, request, *args, **kwargs)

    monkeypatch.setattr(writer_module, "build_row", flaky)
    start(capture, tmp_path, formats=("jsonl",))
    link = Link(capture)
    with caplog.at_level(logging.ERROR, logger="kproxy.capture"):
        for corr in range(1, 11):
            link.exchange(18, 3, corr)
        capture.stop()
    assert capture.row_errors == 5 and capture.rows_written == 5 and capture.write_errors == 0
    assert [r["correlation_id"] for r in read_jsonl(tmp_path)] == [2, 4, 6, 8, 10]
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1


def test_memory_held_for_pairs_stays_within_the_queue_bound(capture, tmp_path, monkeypatch):
    """Responses hold their requests' frames: under overload neither queued responses
    nor requests awaiting answers in the writer may keep more than the bound alive."""
    gate = threading.Event()
    original = Writer._handle
    seen = []

    def handle(self, item):
        gate.wait(5)
        original(self, item)
        seen.append(self.pending_bytes)

    monkeypatch.setattr(Writer, "_handle", handle)
    bound = 256 * 1024
    start(capture, tmp_path, formats=("jsonl",), queue_max_bytes=bound)
    link = Link(capture)
    big = records(1, value=b"x" * 60_000)
    for corr in range(1, 41):             # requests fill the queue, then their small responses
        link.request(0, 9, corr, **produce_request(recs=big))
    for corr in range(1, 41):
        link.response(0, 9, corr, **produce_response())
    queued = capture.status()["queue"]["bytes"]
    assert queued <= bound and capture.dropped > 0
    gate.set()
    for corr in range(41, 81):            # the writer keeps requests awaiting answers
        link.request(0, 9, corr, **produce_request(recs=big))
        deadline = time.monotonic() + 5
        while capture.status()["queue"]["items"] and time.monotonic() < deadline:
            time.sleep(0.001)             # let the writer take each one: none dropped
    assert capture.dropped < 80
    link.close(capture)
    capture.stop()
    assert seen and max(seen) <= bound + 70_000       # one frame over the bound at most
