"""Address rewriting and ApiVersions capping on decoded responses (no sockets)."""

import pytest

from kproxy.protocol import (Response, Struct, decode_response, encode_response, new_body, schema)
from kproxy.proxy.rewrite import (ADDRESS_BEARING, cap_api_versions, carries_addresses,
                                  node_addresses, rewrite_addresses)
from tests.protocol.samples import sample_body
from tests.proxy.addresses import REWRITE_CASES

NOT_BROKER_ADDRESSES = {
    29: "DescribeAcls: ACL host pattern",
    31: "DeleteAcls: ACL host pattern",
    88: "StreamsGroupHeartbeat: application endpoint",
    89: "StreamsGroupDescribe: application endpoint",
}


def test_every_response_with_a_host_is_rewritten_or_excluded_with_a_reason():
    holders = set()
    for key, spec in schema.RESPONSES.items():
        rows = [spec.fields, *spec.structs.values()]
        if any("host" in {f.name for f in r} for r in rows):
            holders.add(key)
    assert holders == set(ADDRESS_BEARING) | set(NOT_BROKER_ADDRESSES)


def mapper(node_id, host, port):
    return f"kproxy-{node_id}.local", 20000 + (node_id % 1000 + 1000) % 1000


@pytest.mark.parametrize("api_key,version", REWRITE_CASES)
def test_rewrite_every_version_of_every_address_bearing_response(api_key, version):
    for seed in range(40):
        body = sample_body("response", api_key, version, seed=seed, width=2)
        frame = encode_response(Response(9, body), api_key, version)
        decoded = decode_response(frame, api_key, version)
        before = node_addresses(api_key, version, decoded.body)
        rewrite_addresses(api_key, version, decoded, mapper)
        again = decode_response(encode_response(decoded, api_key, version), api_key, version)
        after = node_addresses(api_key, version, again.body)
        assert [n for n, _, _ in after] == [n for n, _, _ in before]
        assert all((h, p) == mapper(n, None, None) for n, h, p in after)
        if before:
            return
    pytest.fail("no sample carried an address")    # the samples must exercise the rewrite


def test_metadata_rewrite_changes_only_addresses():
    body = new_body("response", 3, 12, cluster_id="c", controller_id=2, brokers=[
        Struct(node_id=1, host="10.0.0.1", port=9092, rack="r1"),
        Struct(node_id=2, host="10.0.0.2", port=9092, rack=None)])
    frame = encode_response(Response(1, body), 3, 12)
    decoded = decode_response(frame, 3, 12)
    assert rewrite_addresses(3, 12, decoded, lambda n, h, p: ("127.0.0.1", 19090 + n))
    out = encode_response(decoded, 3, 12)
    assert b"10.0.0." not in out
    result = decode_response(out, 3, 12).body
    assert [(b.node_id, b.host, b.port, b.rack) for b in result.brokers] == [
        (1, "127.0.0.1", 19091, "r1"), (2, "127.0.0.1", 19092, None)]
    assert result.cluster_id == "c" and result.controller_id == 2


def test_kip951_endpoints_are_tagged_and_rewritten():
    """Produce v10+ carries NodeEndpoints as tagged field 0: the peers that miss it leak."""
    body = new_body("response", 0, 11, node_endpoints=[Struct(node_id=3, host="upstream-3", port=9093, rack=None)])
    frame = encode_response(Response(5, body), 0, 11)
    assert b"upstream-3" in frame
    decoded = decode_response(frame, 0, 11)
    assert carries_addresses(0, 11) and not carries_addresses(0, 9)
    rewrite_addresses(0, 11, decoded, lambda n, h, p: ("proxy", 30000 + n))
    out = encode_response(decoded, 0, 11)
    assert b"upstream-3" not in out
    assert node_addresses(0, 11, decode_response(out, 0, 11).body) == [(3, "proxy", 30003)]


def test_find_coordinator_error_without_node_is_left_alone():
    body = new_body("response", 10, 3, error_code=15, node_id=-1, host="", port=-1)
    decoded = decode_response(encode_response(Response(1, body), 10, 3), 10, 3)
    assert not rewrite_addresses(10, 3, decoded, mapper)


def test_api_versions_capped_to_what_kproxy_decodes():
    produce_max = schema.version_range(0)[1]
    body = new_body("response", 18, 3, api_keys=[
        Struct(api_key=0, min_version=0, max_version=produce_max + 5),
        Struct(api_key=3, min_version=0, max_version=12),
        Struct(api_key=999, min_version=0, max_version=1)])
    decoded = decode_response(encode_response(Response(1, body), 18, 3), 18, 3)
    assert cap_api_versions(decoded)
    capped = decode_response(encode_response(decoded, 18, 3), 18, 3).body.api_keys
    assert [(a.api_key, a.min_version, a.max_version) for a in capped] == [(0, 0, produce_max), (3, 0, 12)]
    assert not cap_api_versions(decode_response(encode_response(Response(1, new_body(
        "response", 18, 3, api_keys=[Struct(api_key=3, min_version=0, max_version=12)])), 18, 3), 18, 3))


@pytest.mark.parametrize("api_key,version", [(0, 10), (0, 13), (1, 16), (1, 18)])
def test_produce_and_fetch_answers_are_decoded_whole_only_when_they_name_endpoints(
        api_key, version, monkeypatch):
    """Brokers add KIP-951 endpoints only after a leader moved: an answer without any is
    passed on as is, read partially (``protocol.skim``), not decoded whole; one with them
    is rewritten as before."""
    import struct
    import kproxy.protocol.events as events_module
    from kproxy.config import build
    from kproxy.protocol import Request, encode_request
    from kproxy.protocol.connection import Connection
    from kproxy.proxy.server import Proxy

    proxy = Proxy(build({"upstream": "127.0.0.1:1", "mode": "sidecar"}))
    decoded_whole = []
    whole = events_module.decode_response
    monkeypatch.setattr(events_module, "decode_response", lambda *a: decoded_whole.append(a) or whole(*a))

    def answer(correlation_id, **fields):
        conn = Connection(hold=proxy.hold, transform=proxy.transform)
        acks = dict(acks=-1) if api_key == 0 else {}          # acks=0 is never answered
        request = encode_request(Request(api_key, version, correlation_id, "c",
                                         new_body("request", api_key, version, **acks)))
        conn.receive_client(struct.pack(">i", len(request)) + request)
        frame = encode_response(Response(correlation_id, new_body("response", api_key, version, **fields)),
                                api_key, version)
        events, out = conn.relay_broker(struct.pack(">i", len(frame)) + frame)
        return decode_response(frame, api_key, version), b"".join(bytes(chunk) for chunk in out)[4:]

    sent, passed = answer(1)
    assert passed == encode_response(sent, api_key, version) and decoded_whole == []
    sent, passed = answer(2, node_endpoints=[Struct(node_id=3, host="upstream-3", port=9093, rack=None)])
    assert len(decoded_whole) == 1
    assert node_addresses(api_key, version, decode_response(passed, api_key, version).body) == [
        (3, *proxy.advertise(3, "upstream-3", 9093))]
