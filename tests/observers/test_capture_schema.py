"""Capture schema version 2: proxy instance, connection start, client software and group columns.

Rows are built from real encoded frames fed through the connection tracker,
as the proxy would; version 1 files (written here with the version 1 schema)
must still be read by ``kproxy capture show`` and ``stats``.
"""

from __future__ import annotations

import datetime as dt
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kproxy.observers.capture import SCHEMA_VERSION, Capture, CaptureConfig, cli
from kproxy.observers.capture.parquet import SCHEMA
from kproxy.observers.capture.summary import PAIR_COLUMNS, PAIR_FIELDS, build_row
from kproxy.protocol import API_KEYS, Request, Response, Struct, encode_request, encode_response, new_body
from kproxy.protocol import schema
from kproxy.protocol.connection import Connection
from kproxy.proxy.relay import ConnectionInfo
from tests.observers.captures import (PASSWORD, V2_COLUMNS, V3_COLUMNS, V4_COLUMNS, Link, produce_request, produce_response,
                                      read_jsonl, read_parquet, sasl_plain, v1_rows)
from tests.protocol.frames import framed

OPENED = 1_700_000_000.25
INFO = ConnectionInfo(5, ("10.0.0.5", 40000), "broker-1", ("10.0.1.1", 9092), 1, OPENED)


def pair(api: str, version: int, request: dict | None = None, response: dict | None = None):
    """(RequestReceived, ResponseReceived or None) for one exchange, through the real tracker."""
    key = API_KEYS[api]
    conn = Connection()
    [req] = conn.receive_client(framed(encode_request(
        Request(key, version, 7, "app-1", new_body("request", key, version, **(request or {}))))))
    if response is None:
        return req, None
    [resp] = conn.receive_broker(framed(encode_response(
        Response(7, new_body("response", key, version, **response)), key, version)))
    return req, resp


def row_of(api, version, request=None, response=None, instance="sidecar-3"):
    req, resp = pair(api, version, request, response)
    row, _ = build_row(INFO, req, resp, "response" if resp is not None else "unanswered", 0.0, {},
                       False, False, instance)
    assert row["decode_error"] is None
    return row


def group_columns(row):
    return row["group_id"], row["member_id"], row["generation"]


GROUP_CASES = [
    # JoinGroup: the broker's member id and generation
    ("JoinGroup", 9, dict(group_id="g", member_id=""), dict(member_id="m-1", generation_id=5, leader="m-1"),
     ("g", "m-1", 5)),
    # KIP-394: the first join is answered MEMBER_ID_REQUIRED with the id to use
    ("JoinGroup", 5, dict(group_id="g", member_id=""), dict(error_code=79, member_id="m-new", generation_id=-1),
     ("g", "m-new", None)),
    ("JoinGroup", 9, dict(group_id="g", member_id="m-1"), None, ("g", "m-1", None)),     # unanswered
    ("SyncGroup", 5, dict(group_id="g", generation_id=5, member_id="m-1"), dict(), ("g", "m-1", 5)),
    ("Heartbeat", 4, dict(group_id="g", generation_id=6, member_id="m-1"), dict(), ("g", "m-1", 6)),
    ("Heartbeat", 0, dict(group_id="g", generation_id=-1, member_id=""), dict(), ("g", None, None)),
    ("LeaveGroup", 2, dict(group_id="g", member_id="m-1"), dict(), ("g", "m-1", None)),
    ("LeaveGroup", 5, dict(group_id="g", members=[
        Struct(member_id="m-1", group_instance_id=None, reason=None),
        Struct(member_id="m-2", group_instance_id="i-2", reason=None)]), dict(members=[]), ("g", "m-1", None)),
    ("OffsetCommit", 2, dict(group_id="g", generation_id_or_member_epoch=3, member_id="m-1",
                             retention_time_ms=-1, topics=[]), dict(topics=[]), ("g", "m-1", 3)),
    ("OffsetCommit", 9, dict(group_id="g", generation_id_or_member_epoch=7, member_id="m-1",
                             topics=[]), dict(topics=[]), ("g", "m-1", 7)),
    ("OffsetCommit", 0, dict(group_id="g", topics=[]), dict(topics=[]), ("g", None, None)),
    ("TxnOffsetCommit", 3, dict(transactional_id="tx", group_id="g", producer_id=1, producer_epoch=0,
                                generation_id_or_member_epoch=4, member_id="m-1", topics=[]),
     dict(topics=[]), ("g", "m-1", 4)),
    ("OffsetFetch", 7, dict(group_id="g", topics=None), dict(topics=[]), ("g", None, None)),
    ("OffsetFetch", 9, dict(groups=[Struct(group_id="g1", member_id="m-1", member_epoch=3, topics=None),
                                    Struct(group_id="g2", member_id=None, member_epoch=-1, topics=None)]),
     dict(groups=[]), ("g1", "m-1", None)),
    # KIP-848: the response's member id and epoch ...
    ("ConsumerGroupHeartbeat", 0, dict(group_id="g", member_id="", member_epoch=0, subscribed_topic_names=["t"]),
     dict(member_id="m-uuid", member_epoch=1, heartbeat_interval_ms=5000), ("g", "m-uuid", 1)),
    # ... but a failed heartbeat's epoch is the default 0, not a fact: the member's own is kept
    ("ConsumerGroupHeartbeat", 1, dict(group_id="g", member_id="m-uuid", member_epoch=4),
     dict(error_code=110, error_message="fenced", member_id=None, member_epoch=0), ("g", "m-uuid", 4)),
    ("ConsumerGroupHeartbeat", 1, dict(group_id="g", member_id="m-uuid", member_epoch=-1),     # leaving
     dict(member_id="m-uuid", member_epoch=-1), ("g", "m-uuid", None)),
    ("ShareGroupHeartbeat", 1, dict(group_id="sg", member_id="m-s", member_epoch=2, subscribed_topic_names=["t"]),
     dict(member_id="m-s", member_epoch=3, heartbeat_interval_ms=5000), ("sg", "m-s", 3)),
    ("StreamsGroupHeartbeat", 0, dict(group_id="app", member_id="m-x", member_epoch=0, process_id="p"),
     dict(member_id="m-x", member_epoch=2), ("app", "m-x", 2)),
    ("DescribeGroups", 5, dict(groups=["g1", "g2"]), dict(groups=[]), ("g1", None, None)),
    ("ConsumerGroupDescribe", 0, dict(group_ids=["g3"]), dict(groups=[]), ("g3", None, None)),
    ("ShareGroupDescribe", 1, dict(group_ids=["sg"]), dict(groups=[]), ("sg", None, None)),
]


@pytest.mark.parametrize("api,version,request_fields,response_fields,expected", GROUP_CASES,
                         ids=[f"{c[0]}-v{c[1]}-{i}" for i, c in enumerate(GROUP_CASES)])
def test_group_columns_per_api(api, version, request_fields, response_fields, expected):
    row = row_of(api, version, request_fields, response_fields)
    assert group_columns(row) == expected
    assert row["client_software_name"] is None and row["client_software_version"] is None


def test_other_apis_have_no_group_columns_and_every_row_the_v2_columns():
    row = row_of("Metadata", 12, dict(topics=None), dict(brokers=[], topics=[]))
    assert list(row)[-len(V2_COLUMNS + V3_COLUMNS + V4_COLUMNS):] == V2_COLUMNS + V3_COLUMNS + V4_COLUMNS
    assert row["capture_version"] == SCHEMA_VERSION == 4
    assert row["principal"] is None                        # no client certificate, no SASL
    assert {c: row[c] for c in PAIR_COLUMNS} == dict.fromkeys(PAIR_COLUMNS)
    assert row["proxy_instance"] == "sidecar-3" and row["connection_start"] == OPENED


def test_client_software_from_api_versions_v3_plus():
    row = row_of("ApiVersions", 3, dict(client_software_name="librdkafka", client_software_version="2.6.0"),
                 dict(api_keys=[]))
    assert (row["client_software_name"], row["client_software_version"]) == ("librdkafka", "2.6.0")
    assert row["group_id"] is None
    old = row_of("ApiVersions", 2, {}, dict(api_keys=[]))
    assert (old["client_software_name"], old["client_software_version"]) == (None, None)


def test_every_field_the_table_names_is_in_the_generated_schema():
    """PAIR_FIELDS is written by hand: each path must exist in Kafka's definitions."""
    checked = 0
    for api, columns in PAIR_FIELDS.items():
        assert api in API_KEYS, api
        for sources in columns.values():
            for source in sources:
                side, *steps = source.split(".")
                spec = (schema.REQUESTS if side == "request" else schema.RESPONSES)[API_KEYS[api]]
                rows = spec.fields
                for i, step in enumerate(steps):
                    field = next((f for f in rows if f.name == step), None)
                    assert field is not None, f"{api} {source}: no field {step!r}"
                    element = field.type.removeprefix("[]")
                    if i < len(steps) - 1:
                        rows = spec.structs[element]
                checked += 1
    assert checked >= 30


# ---------------------------------------------------------------- through the Capture observer

def api_versions(link, corr, name=None, version=None, api_version=3, client_id="app-1"):
    request = {} if name is None else dict(client_software_name=name, client_software_version=version)
    link.exchange(18, api_version, corr, request, dict(api_keys=[]), client_id=client_id)


def test_client_software_fills_later_rows_of_its_connection_only(tmp_path):
    capture = Capture(instance_name="sidecar-9")
    capture.start(CaptureConfig(directory=str(tmp_path), formats=("jsonl", "parquet")))
    opened = OPENED                                        # a quarter second: exact in binary
    a = Link(capture, conn_id=1, client=("10.0.0.1", 5000), opened=opened)
    b = Link(capture, conn_id=2, client=("10.0.0.2", 5001), opened=opened + 1)
    c = Link(capture, conn_id=3, client=("10.0.0.3", 5002))
    api_versions(a, 1, "confluent-kafka-python", "2.16.1-rdkafka-2.16.0")
    api_versions(b, 1, api_version=2)                      # v2: names no software
    api_versions(c, 1, "kafka-python", "3.0.12", api_version=4)
    for link in (a, b, c):
        link.exchange(0, 9, 2, produce_request(), produce_response())
        link.request(1, 12, 3, topics=[])                   # unanswered: its row is built at close
    for link in (a, b, c):
        link.close(capture)
    capture.stop()

    rows = read_jsonl(tmp_path)
    table = read_parquet(tmp_path)
    assert len(rows) == table.num_rows == 9
    assert table.schema.equals(SCHEMA, check_metadata=False)
    software = {(r["connection_id"], r["correlation_id"]): (r["client_software_name"], r["client_software_version"])
                for r in rows}
    assert software == {
        **{(1, corr): ("confluent-kafka-python", "2.16.1-rdkafka-2.16.0") for corr in (1, 2, 3)},
        **{(2, corr): (None, None) for corr in (1, 2, 3)},
        **{(3, corr): ("kafka-python", "3.0.12") for corr in (1, 2, 3)}}
    assert [(r["connection_id"], r["correlation_id"], r["client_software_name"]) for r in table.to_pylist()] == \
        [(r["connection_id"], r["correlation_id"], r["client_software_name"]) for r in rows]
    assert {r["proxy_instance"] for r in rows} == {"sidecar-9"} == set(table.column("proxy_instance").to_pylist())
    starts = {r["connection_id"]: r["connection_start"] for r in table.to_pylist()}
    assert starts[1] == dt.datetime(2023, 11, 14, 22, 13, 20, 250000, tzinfo=dt.timezone.utc)
    assert starts[2] - starts[1] == dt.timedelta(seconds=1) and starts[3] is None   # no accept time given
    assert table.schema.field("connection_start").type == pa.timestamp("us", tz="UTC")
    by_conn = {r["connection_id"]: r for r in rows}
    assert by_conn[1]["connection_start"] == "2023-11-14T22:13:20.250000Z" and by_conn[3]["connection_start"] is None


def test_client_software_survives_filters_that_leave_api_versions_out(tmp_path):
    capture = Capture()
    capture.start(CaptureConfig(directory=str(tmp_path), formats=("jsonl",), filter={"apis": ["Produce"]}))
    link = Link(capture)
    api_versions(link, 1, "librdkafka", "2.6.0")
    link.exchange(0, 9, 2, produce_request(), produce_response())
    link.close(capture)
    capture.stop()
    [row] = read_jsonl(tmp_path)
    assert row["api_name"] == "Produce" and row["client_software_name"] == "librdkafka"
    assert row["proxy_instance"] == capture.instance_name != ""
    assert capture.filtered == 1


def test_group_columns_reach_jsonl_and_parquet(tmp_path):
    capture = Capture()
    capture.start(CaptureConfig(directory=str(tmp_path), formats=("jsonl", "parquet")))
    link = Link(capture)
    link.exchange(11, 9, 1, dict(group_id="g", member_id=""), dict(member_id="m-1", generation_id=5, leader="m-1"))
    link.exchange(14, 5, 2, dict(group_id="g", generation_id=5, member_id="m-1"), dict())
    link.close(capture)
    capture.stop()
    expected = [("g", "m-1", 5), ("g", "m-1", 5)]
    assert [group_columns(r) for r in read_jsonl(tmp_path)] == expected
    assert [group_columns(r) for r in read_parquet(tmp_path).to_pylist()] == expected
    assert read_parquet(tmp_path).schema.field("generation").type == pa.int32()


# ---------------------------------------------------------------- version 1 files still read

V1_SCHEMA = pa.schema([f for f in SCHEMA if f.name not in V2_COLUMNS + V3_COLUMNS + V4_COLUMNS],
                      metadata={b"kproxy.capture.schema_version": b"1"})


def write_v1(directory):
    rows = v1_rows()
    columns = {name: [r[name] for r in rows] for name in V1_SCHEMA.names}
    columns["time"] = [int(t * 1_000_000) for t in columns["time"]]
    pq.write_table(pa.Table.from_pydict(columns, schema=V1_SCHEMA),
                   directory / "kproxy-capture-20231114T221320-000001.parquet")
    with open(directory / "kproxy-capture-20231114T221320-000002.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(dict(r, time=cli.iso_utc(r["time"]), request=None, response=None)) + "\n")


def test_version_1_files_are_still_read(tmp_path):
    write_v1(tmp_path)
    for fmt in ("parquet", "jsonl"):
        out = io.StringIO()
        assert cli.show(str(tmp_path), fmt=fmt, out=out) == 3
        assert "client=billing" in out.getvalue() and "group=" not in out.getvalue()
        out = io.StringIO()
        s = cli.stats(str(tmp_path), fmt=fmt, out=out)
        assert s["pairs"] == 3 and s["connections"] == 1 and s["client_software"] is None
        assert "client software" not in out.getvalue()


def test_stats_lists_client_software_and_reads_v1_and_v2_together(tmp_path):
    write_v1(tmp_path)
    capture = Capture(instance_name="sidecar-2")
    capture.start(CaptureConfig(directory=str(tmp_path), formats=("parquet",)))
    for conn_id, client_id in ((1, "orders-svc"), (2, "orders-svc"), (3, "audit")):    # ids repeat across kproxies
        link = Link(capture, conn_id=conn_id)
        api_versions(link, 1, "confluent-kafka-python", "2.16.1-rdkafka-2.16.0", client_id=client_id)
        link.exchange(0, 9, 2, produce_request(), produce_response(), client_id=client_id)
        link.close(capture)
    link = Link(capture, conn_id=4)
    api_versions(link, 1, api_version=2, client_id="legacy")
    link.close(capture)
    capture.stop()
    out = io.StringIO()
    s = cli.stats(str(tmp_path), fmt="parquet", out=out)
    assert s["pairs"] == 3 + 7
    assert s["connections"] == 1 + 4        # v1's connection 1 and sidecar-2's connection 1 are different
    assert s["client_software"] == [
        {"name": "confluent-kafka-python", "version": "2.16.1-rdkafka-2.16.0", "connections": 3,
         "client_ids": ["audit", "orders-svc"]},
        {"name": None, "version": None, "connections": 2, "client_ids": ["billing", "legacy"]}]
    text = out.getvalue()
    assert "client software (ApiVersions v3+):" in text
    line = next(line for line in text.splitlines() if "confluent-kafka-python" in line)
    assert line.split() == ["confluent-kafka-python", "2.16.1-rdkafka-2.16.0", "3", "audit,", "orders-svc"]


# ---------------------------------------------------------------- version 3: principal


def test_principal_fills_the_rows_after_the_exchange_and_never_the_password(tmp_path):
    import dataclasses
    from tests.observers.captures import all_bytes
    capture = Capture()
    capture.start(CaptureConfig(directory=str(tmp_path), formats=("jsonl", "parquet", "pcapng")))
    sasl = Link(capture, conn_id=1)
    sasl_plain(sasl, "frank")
    sasl.exchange(0, 9, 3, produce_request(), produce_response())
    refused = Link(capture, conn_id=2)
    sasl_plain(refused, "mallory", accept=False)
    certified = Link(capture, conn_id=3)
    certified.info = dataclasses.replace(certified.info, principal="CN=svc,O=Example")
    certified.exchange(0, 9, 1, produce_request(), produce_response())
    for link in (sasl, refused, certified):
        link.close(capture)
    capture.stop()
    rows = read_jsonl(tmp_path)
    principals = {(r["connection_id"], r["api_name"]): r["principal"] for r in rows}
    assert principals == {(1, "SaslHandshake"): None, (1, "SaslAuthenticate"): "frank", (1, "Produce"): "frank",
                          (2, "SaslHandshake"): None, (2, "SaslAuthenticate"): None,
                          (3, "Produce"): "CN=svc,O=Example"}
    table = read_parquet(tmp_path)
    assert sorted(map(str, table.column("principal").to_pylist())) == sorted(map(str, principals.values()))
    assert PASSWORD not in all_bytes(tmp_path)
    out = io.StringIO()
    s = cli.stats(str(tmp_path), fmt="parquet", out=out)
    # produce_request() writes one batch of 3 records to "orders" (see test_capture).
    assert s["topic_writers"] == [
        {"topic": "orders", "principal": "CN=svc,O=Example", "pairs": 1, "records": 3},
        {"topic": "orders", "principal": "frank", "pairs": 1, "records": 3}]
    assert "who writes to each topic (Produce, by principal):" in out.getvalue()


def test_principal_survives_filters_that_leave_sasl_out(tmp_path):
    capture = Capture()
    capture.start(CaptureConfig(directory=str(tmp_path), formats=("jsonl",), filter={"apis": ["Produce"]}))
    link = Link(capture)
    sasl_plain(link, "grace")
    link.exchange(0, 9, 3, produce_request(), produce_response())
    link.close(capture)
    capture.stop()
    assert [(r["api_name"], r["principal"]) for r in read_jsonl(tmp_path)] == [("Produce", "grace")]


V2_SCHEMA = pa.schema([f for f in SCHEMA if f.name not in V3_COLUMNS + V4_COLUMNS],
                      metadata={b"kproxy.capture.schema_version": b"2"})


def test_version_2_files_are_still_read(tmp_path):
    rows = [dict(r, capture_version=2, proxy_instance="old", connection_start=None,
                 client_software_name="librdkafka", client_software_version="2.6.0",
                 group_id=None, member_id=None, generation=None) for r in v1_rows()]
    columns = {name: [r[name] for r in rows] for name in V2_SCHEMA.names}
    columns["time"] = [int(t * 1_000_000) for t in columns["time"]]
    pq.write_table(pa.Table.from_pydict(columns, schema=V2_SCHEMA),
                   tmp_path / "kproxy-capture-20231114T221320-000001.parquet")
    out = io.StringIO()
    assert cli.show(str(tmp_path), fmt="parquet", out=out) == 3
    s = cli.stats(str(tmp_path), fmt="parquet", out=io.StringIO())
    assert s["pairs"] == 3 and s["client_software"][0]["name"] == "librdkafka"
    assert s["topic_writers"] is None                      # no principal column before v3
