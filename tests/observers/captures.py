"""What the capture tests share: synthetic traffic (``Link``, frame bodies) and readers of the files written."""

from __future__ import annotations

import glob
import json
import os
import shutil
import struct
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kproxy.observers.capture.parquet import SCHEMA
from kproxy.protocol import Request, Response, Struct, Uuid, encode_request, encode_response, new_body
from kproxy.protocol.connection import Connection
from kproxy.protocol.record_encoder import build_batch
from kproxy.protocol.records import Record
from kproxy.observers.contract import ConnectionInfo
from tests.protocol.frames import framed


class Link:
    """One proxied connection: a tracker, its ConnectionInfo, events fed to the observers."""

    def __init__(self, *observers, conn_id=1, client=("127.0.0.1", 40001),
                 upstream=("127.0.0.1", 9092), node_id=None, opened=None):
        self.observers = observers
        self.info = ConnectionInfo(conn_id, client, "bootstrap" if node_id is None else f"broker-{node_id}",
                                   upstream, node_id, opened)
        self.conn = Connection()
        self.pairs = 0            # request/response pairs completed (incl. acks=0 requests)

    def _feed(self, events):
        for observer in self.observers:
            observer(self.info, events)
        return events

    def request(self, api_key, version, corr, client_id="app-1", **fields):
        body = new_body("request", api_key, version, **fields)
        events = self._feed(self.conn.receive_client(framed(encode_request(
            Request(api_key, version, corr, client_id, body)))))
        if not events[-1].expects_response:
            self.pairs += 1
        return events

    def response(self, api_key, version, corr, **fields):
        body = new_body("response", api_key, version, **fields)
        self.pairs += 1
        return self._feed(self.conn.receive_broker(framed(encode_response(Response(corr, body),
                                                                             api_key, version))))

    def exchange(self, api_key, version, corr, request=None, response=None, client_id="app-1"):
        self.request(api_key, version, corr, client_id=client_id, **(request or {}))
        return self.response(api_key, version, corr, **(response or {}))

    def raw_client(self, data: bytes):
        return self._feed(self.conn.receive_client(data))

    def raw_broker(self, data: bytes):
        return self._feed(self.conn.receive_broker(data))

    def close(self, capture):
        capture.connection_closed(self.info, in_flight=self.conn.in_flight)


def records(n=3, key=b"k", value=b"v", magic=2, compression="none", headers=()):
    return build_batch([Record(i, 1_700_000_000_000 + i, key + b"%d" % i, value + b"%d" % i, headers)
                        for i in range(n)], compression, magic=magic)


def produce_request(topic="orders", recs=None, acks=-1, partition=0):
    return dict(acks=acks, timeout_ms=1000, topic_data=[Struct(name=topic, partition_data=[
        Struct(index=partition, records=recs if recs is not None else records())])])


def produce_response(topic="orders", error=0, partition=0):
    return dict(responses=[Struct(name=topic, partition_responses=[Struct(
        index=partition, error_code=error, base_offset=0, log_append_time_ms=-1, log_start_offset=0,
        record_errors=[], error_message=None)])])


def produce_answer(partition: int, error: int = 0, hint=None, topic="orders"):
    """A Produce v10+ answer for one partition; ``hint``: the KIP-951 (leader id, epoch)."""
    part = dict(index=partition, error_code=error, base_offset=0, log_append_time_ms=-1, log_start_offset=0,
                record_errors=[], error_message=None)
    if hint is not None:
        part["current_leader"] = Struct(leader_id=hint[0], leader_epoch=hint[1])
    return dict(responses=[Struct(name=topic, partition_responses=[Struct(**part)])])


def metadata_response(topics=("orders",), topic_ids=None, version=12):
    if version < 10:
        return dict(brokers=[Struct(node_id=1, host="127.0.0.1", port=9092, rack=None)], controller_id=1,
                    topics=[Struct(error_code=0, name=t, is_internal=False, partitions=[]) for t in topics])
    return dict(brokers=[Struct(node_id=1, host="127.0.0.1", port=9092, rack=None)], cluster_id="c",
                controller_id=1, topics=[
                    Struct(error_code=0, name=t, is_internal=False,
                           topic_id=(topic_ids or {}).get(t, Uuid(bytes(16))),
                           partitions=[], topic_authorized_operations=-2147483648)
                    for t in topics])


def files(directory, ext):
    return sorted(glob.glob(os.path.join(str(directory), f"*.{ext}")))


def read_jsonl(directory) -> list[dict]:
    rows = []
    for path in files(directory, "jsonl"):
        with open(path) as f:
            rows.extend(json.loads(line) for line in f if line.strip())
    return rows


def read_parquet(directory) -> pa.Table:
    tables = [pq.read_table(p) for p in files(directory, "parquet")]
    return pa.concat_tables(tables) if tables else SCHEMA.empty_table()


def all_bytes(directory) -> bytes:
    out = b""
    for path in sorted(glob.glob(os.path.join(str(directory), "*"))):
        with open(path, "rb") as f:
            out += f.read()
    return out


def pcap_packets(path):
    """(timestamp µs, IP src, sport, IP dst, dport, seq, ack, flags, payload) of every EPB."""
    data = open(path, "rb").read()
    pos, packets = 0, []
    while pos < len(data):
        block_type, total = struct.unpack_from("<II", data, pos)
        assert total % 4 == 0 and struct.unpack_from("<I", data, pos + total - 4)[0] == total
        if block_type == 6:
            _, hi, lo, caplen, origlen = struct.unpack_from("<IIIII", data, pos + 8)
            assert caplen == origlen
            pkt = data[pos + 28:pos + 28 + caplen]
            version = pkt[0] >> 4
            if version == 4:
                ihl = (pkt[0] & 15) * 4
                src, dst, tcp = pkt[12:16], pkt[16:20], pkt[ihl:]
                assert struct.unpack_from("!H", pkt, 2)[0] == len(pkt)
            else:
                src, dst, tcp = pkt[8:24], pkt[24:40], pkt[40:]
            sport, dport, seq, ack, off, flags = struct.unpack_from("!HHIIBB", tcp, 0)
            packets.append(((hi << 32) | lo, src, sport, dst, dport, seq, ack, flags, tcp[(off >> 4) * 4:]))
        pos += total
    return packets


def pcap_streams(paths) -> dict:
    """{(client port, server port): (client bytes, server bytes)}, checking seq/ack consistency."""
    state, streams = {}, {}
    for path in paths:
        for _, src, sport, dst, dport, seq, ack, flags, payload in pcap_packets(path):
            if flags & 0x02 and not flags & 0x10:            # SYN
                state[(sport, dport)] = seq + 1
                streams[(sport, dport)] = [b"", b""]
                continue
            if flags & 0x02:                                   # SYN-ACK
                state[(sport, dport)] = seq + 1
                continue
            key, direction = ((sport, dport), 0) if (sport, dport) in streams else ((dport, sport), 1)
            here = (sport, dport)
            if payload:
                assert seq == state[here], f"sequence gap in {here}"
                state[here] = (seq + len(payload)) & 0xFFFFFFFF
                streams[key][direction] += payload
            other = (dport, sport)
            if other in state and flags & 0x10:
                assert ack == state[other], "ack does not match the other side's next sequence number"
            if flags & 0x01:                                   # FIN takes one sequence number
                state[here] = (seq + len(payload) + 1) & 0xFFFFFFFF
    return {k: tuple(v) for k, v in streams.items()}


def split_frames(data: bytes) -> list[bytes]:
    frames, pos = [], 0
    while pos < len(data):
        size, = struct.unpack_from(">i", data, pos)
        frames.append(data[pos + 4:pos + 4 + size])
        pos += 4 + size
    assert pos == len(data)
    return frames


# ---------------------------------------------------------------- pcapng read by tshark

BROKER_PORT = 19092          # not 9092: tshark must be told (-d) that this port speaks Kafka


def tshark(path, *fields, display="kafka", decode_port=BROKER_PORT, options=()):
    exe = shutil.which("tshark")
    if exe is None:
        pytest.fail("tshark is not installed (scripts/setup.sh installs it: apt-get install tshark)",
                    pytrace=False)
    args = [exe, "-r", str(path), "-d", f"tcp.port=={decode_port},kafka", "-Y", display, "-T", "fields",
            "-E", "separator=\t", "-E", "occurrence=a", "-E", "aggregator=,"]
    for option in options:
        args += ["-o", option]
    for field in fields:
        args += ["-e", field]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [line.split("\t") for line in done.stdout.splitlines()]


# ---------------------------------------------------------------- capture schema versions

V2_COLUMNS = ["proxy_instance", "connection_start", "client_software_name", "client_software_version",
              "group_id", "member_id", "generation"]
V3_COLUMNS = ["principal"]
V4_COLUMNS = ["client_instance_id", "telemetry_metrics", "topic_ids", "partition_answers"]
PASSWORD = b"hunter2-never-written"


def v1_rows():
    base = dict(capture_version=1, connection_id=1, client_host="10.0.0.1", client_port=5000,
                listener="bootstrap", upstream_host="10.0.1.1", upstream_port=9092, node_id=None,
                client_id="billing", outcome="response", latency_ms=1.5, request_size=100, response_size=50,
                throttle_ms=0, error_count=0, errors=[], topics=["orders"], partition_count=1,
                record_count=3, record_bytes=90, batch_count=1, compression=["none"],
                topic_records=[{"topic": "orders", "record_count": 3, "record_bytes": 90}], decode_error=None)
    return [dict(base, time=1_700_000_000.0 + i, api_key=0, api_name="Produce", api_version=9, correlation_id=i)
            for i in range(1, 4)]


def sasl_plain(link, user, first_corr=1, accept=True, client_id="app-1"):
    link.exchange(17, 1, first_corr, dict(mechanism="PLAIN"), dict(mechanisms=["PLAIN"]), client_id=client_id)
    link.exchange(36, 2, first_corr + 1, dict(auth_bytes=b"\0" + user.encode() + b"\0" + PASSWORD),
                  dict(error_code=0 if accept else 58, auth_bytes=b""), client_id=client_id)
