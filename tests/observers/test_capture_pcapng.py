"""pcapng captures read back by tshark (Wireshark's Kafka dissector) and by our own reader."""

from __future__ import annotations

import struct

import pytest

from kproxy.observers.capture import Capture, CaptureConfig
from kproxy.observers.capture import pcapng
from kproxy.observers.capture.pcapng import MAX_SEGMENT, checksum
from kproxy.protocol import Struct
from tests.observers.captures import (BROKER_PORT, Link, files, metadata_response, pcap_packets, pcap_streams,
                                      read_jsonl, records, split_frames, tshark)

SECRET = b"RECORD-PAYLOAD-"


@pytest.fixture(autouse=True)
def tcp_checksums(monkeypatch):
    """Off by default (they cost the relay GIL time); on here, where their correctness is checked."""
    monkeypatch.setattr(pcapng, "TCP_CHECKSUMS", True)


def old_version_traffic(link: Link, big: bool = True) -> None:
    """Versions Debian's tshark 4.0 dissects in full (Produce <= 8, Fetch <= 11, Metadata <= 9)."""
    link.exchange(18, 0, 1, {}, dict(error_code=0, api_keys=[Struct(api_key=0, min_version=0, max_version=8)]))
    link.exchange(3, 1, 2, dict(topics=[Struct(name="orders"), Struct(name="audit")]),
                  metadata_response(["orders", "audit"], version=1))
    # Produce v3, not v2: tshark 4.0 misreads legacy (magic 0/1) message sets by one byte
    # (it advances past the attributes byte twice), a bug fixed in later Wireshark releases.
    link.exchange(0, 3, 3, dict(transactional_id=None, acks=1, timeout_ms=1000, topic_data=[Struct(
        name="orders", partition_data=[Struct(index=0, records=records(3, value=SECRET,
                                                                      headers=(("trace", b"t1"),)))])]),
        dict(responses=[Struct(name="orders", partition_responses=[Struct(
            index=0, error_code=0, base_offset=0, log_append_time_ms=-1)])], throttle_time_ms=0))
    link.request(0, 3, 4, transactional_id=None, acks=0, timeout_ms=1000, topic_data=[Struct(
        name="audit", partition_data=[Struct(index=1, records=records(1, value=SECRET))])])
    fetch = dict(replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=10 ** 8, isolation_level=0,
                 topics=[Struct(topic="orders", partitions=[Struct(partition=0, fetch_offset=0,
                                                                   partition_max_bytes=10 ** 8)])])
    value = SECRET + b"x" * (150_000 if big else 10)
    link.exchange(1, 4, 5, fetch, dict(throttle_time_ms=0, responses=[Struct(topic="orders", partitions=[
        Struct(partition_index=0, error_code=0, high_watermark=3, last_stable_offset=3,
               aborted_transactions=[], records=records(2, value=value))])]))
    link.exchange(10, 1, 6, dict(key="group-1", key_type=0),
                  dict(throttle_time_ms=0, error_code=15, error_message=None, node_id=-1, host="", port=-1))


def tshark_frames(path):
    """[(from client?, correlation id, api key, topic names)] for every Kafka PDU tshark found."""
    out = []
    for src, corr, key, topics in tshark(path, "tcp.srcport", "kafka.correlation_id", "kafka.api_key",
                                         "kafka.topic_name"):
        out.append((int(src) != BROKER_PORT, int(corr), int(key) if key else None,
                    [t for t in topics.split(",") if t]))
    return out


@pytest.mark.parametrize("include_record_data", [False, True])
def test_tshark_finds_every_request_and_response(tmp_path, include_record_data):
    capture = Capture()
    capture.start(CaptureConfig(directory=str(tmp_path), formats=("jsonl", "pcapng"),
                                include_record_data=include_record_data))
    a = Link(capture, conn_id=1, client=("127.0.0.1", 45001), upstream=("127.0.0.1", BROKER_PORT))
    b = Link(capture, conn_id=2, client=("127.0.0.2", 45002), upstream=("127.0.0.1", BROKER_PORT), node_id=1)
    old_version_traffic(a)
    old_version_traffic(b, big=False)
    a.close(capture)
    b.close(capture)
    capture.stop()
    rows = read_jsonl(tmp_path)
    assert len(rows) == a.pairs + b.pairs == 12
    pcap = files(tmp_path, "pcapng")[0]

    seen = tshark_frames(pcap)
    requests = sorted((corr, key) for client, corr, key, _ in seen if client)
    responses = sorted((corr, key) for client, corr, key, _ in seen if not client)
    assert requests == sorted((r["correlation_id"], r["api_key"]) for r in rows)
    assert responses == sorted((r["correlation_id"], r["api_key"]) for r in rows if r["outcome"] == "response")
    # Topic names as tshark dissects them agree with the JSONL rows.
    by_pdu = {}
    for client, corr, key, topics in seen:
        by_pdu.setdefault(corr, set()).update(topics)
    for row in rows:
        if row["api_key"] in (0, 1, 3):
            assert by_pdu[row["correlation_id"]] == set(row["topics"]), row["api_name"]
    # Nothing tshark calls malformed; every checksum verified good.
    assert tshark(pcap, "frame.number", display="_ws.malformed || _ws.expert.severity == error") == []
    statuses = tshark(pcap, "ip.checksum.status", "tcp.checksum.status", display="tcp",
                      options=("ip.check_checksum:TRUE", "tcp.check_checksum:TRUE"))
    assert statuses and all(s == ["1", "1"] for s in statuses)
    # The 150 kB fetch response was split into segments and reassembled.
    sizes = [len(p[-1]) for p in pcap_packets(pcap)]
    assert max(sizes) == MAX_SEGMENT
    values = tshark(pcap, "kafka.message_value", display="kafka.api_key == 0 || kafka.response_frame")
    blob = "".join("".join(v) for v in values)
    assert (SECRET.hex() in blob) == include_record_data


def test_ipv6_and_mixed_family_streams(tmp_path):
    capture = Capture()
    capture.start(CaptureConfig(directory=str(tmp_path), formats=("pcapng",)))
    v6 = Link(capture, conn_id=1, client=("::1", 45010), upstream=("::1", BROKER_PORT))
    mixed = Link(capture, conn_id=2, client=("127.0.0.1", 45011), upstream=("fd00::5", BROKER_PORT))
    named = Link(capture, conn_id=3, client=("127.0.0.1", 45012), upstream=("localhost", BROKER_PORT))
    for link in (v6, mixed, named):
        link.exchange(3, 1, 7, dict(topics=[Struct(name="orders")]), metadata_response(["orders"], version=1))
        link.close(capture)
    capture.stop()
    pcap = files(tmp_path, "pcapng")[0]
    seen = tshark(pcap, "ipv6.src", "ip.src", "tcp.srcport", "kafka.correlation_id", "kafka.topic_name")
    assert ["::1", "", "45010", "7", "orders"] in seen
    assert ["::ffff:127.0.0.1", "", "45011", "7", "orders"] in seen
    assert ["", "127.0.0.1", "45012", "7", "orders"] in seen
    assert len(seen) == 6
    statuses = tshark(pcap, "tcp.checksum.status", display="tcp", options=("tcp.check_checksum:TRUE",))
    assert statuses and all(s == ["1"] for s in statuses)


def test_sasl_v0_tokens_become_zero_placeholders_of_the_same_size(tmp_path):
    capture = Capture()
    capture.start(CaptureConfig(directory=str(tmp_path), formats=("pcapng",)))
    link = Link(capture, client=("127.0.0.1", 45020), upstream=("127.0.0.1", BROKER_PORT))
    link.exchange(17, 0, 1, dict(mechanism="PLAIN"), dict(error_code=0, mechanisms=["PLAIN"]))
    token = b"\0alice\0very-secret-password"
    link.raw_client(struct.pack(">i", len(token)) + token)
    link.raw_broker(struct.pack(">i", 0))
    link.exchange(3, 1, 2, dict(topics=[Struct(name="orders")]), metadata_response(["orders"], version=1))
    link.close(capture)
    capture.stop()
    pcap = files(tmp_path, "pcapng")[0]
    assert b"very-secret-password" not in open(pcap, "rb").read()
    client, server = pcap_streams([pcap])[(45020, BROKER_PORT)]
    assert split_frames(client)[1] == bytes(len(token)) and split_frames(server)[1] == b""
    comments = tshark(pcap, "frame.comment", display="frame.comment")
    assert any("SASL token" in c[0] for c in comments)
    corrs = [int(c) for _, c in tshark(pcap, "tcp.srcport", "kafka.correlation_id",
                                       display="kafka.correlation_id == 2")]
    assert corrs == [2, 2]


def test_checksum_matches_the_rfc_1071_example():
    # RFC 1071 section 3: words 0001 f203 f4f5 f6f7 sum to ddf2 (one's complement), checksum 220d.
    assert checksum(bytes.fromhex("0001f203f4f5f6f7")) == 0x220D
    assert checksum(b"\x45\x00\x00\x73\x00\x00\x40\x00\x40\x11\x00\x00\xc0\xa8\x00\x01\xc0\xa8\x00\xc7") \
        == 0xB861


@pytest.mark.parametrize("value_size", [0, 5, 63, 64, 200, 70_000])
def test_scrub_records_zeroes_data_and_keeps_framing(value_size):
    """Record keys, values and header values become zeros of the same length; offsets,
    timestamps, header keys and the batch itself stay readable (varints of 1-3 bytes,
    null keys and values larger than the zero block included)."""
    from kproxy.observers.capture.redact import scrub_records
    from kproxy.protocol.record_encoder import build_batch
    from kproxy.protocol.records import Record, iter_batches

    sent = [Record(i, 1_700_000_000_000 + i * 1000, None if i % 2 else b"key-%d" % i,
                   b"v" * value_size if i % 3 else None,
                   (("trace", b"secret-%d" % i), ("empty", None)) if i % 4 == 0 else ())
            for i in range(12)]
    blob = b"".join([build_batch(sent, "none"), build_batch(sent[:3], "none")])
    scrubbed = scrub_records(blob)
    assert len(scrubbed) == len(blob)
    batches = list(iter_batches(scrubbed))
    got = [r for batch in batches for r in batch.records()]
    assert len(got) == len(sent) + 3
    for before, after in zip(sent + sent[:3], got):
        assert after.offset == before.offset and after.timestamp == before.timestamp
        assert after.key == (None if before.key is None else bytes(len(before.key)))
        assert after.value == (None if before.value is None else bytes(len(before.value)))
        assert [k for k, _ in after.headers] == [k for k, _ in before.headers]
        assert [v for _, v in after.headers] == [None if v is None else bytes(len(v))
                                                  for _, v in before.headers]
    assert b"secret" not in scrubbed and b"key-" not in scrubbed
