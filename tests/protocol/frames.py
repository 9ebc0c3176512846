"""Kafka frames for the tracker tests: requests, responses, Produce v9 by hand and its padded varints."""

import struct

from kproxy.protocol import Request, Response, Struct, encode_request, encode_response, new_body

# header tagged fields / transactional_id bytes, as Kafka 4.4 reads them (checked against a real
# broker in tests/proxy/test_wire_hardening.py)
PADDED_BUT_ACCEPTED = {
    "count 0 as 80 00": dict(header_tags=b"\x80\x00"),
    "count 0 in five bytes": dict(header_tags=b"\x80\x80\x80\x80\x00"),
    "count 0, fifth byte's high bits dropped": dict(header_tags=b"\x80\x80\x80\x80\x70"),
    "one field, padded size": dict(header_tags=b"\x01\x85\x00\x82\x00ab"),
    "null transactional id as 80 00": dict(transactional_id=b"\x80\x00"),
    "transactional id length wrapping to null": dict(transactional_id=b"\x81\x80\x80\x80\x08"),
    "trailing bytes": dict(rest=struct.pack(">i", 1000) + b"\x01\x00junk"),
}
REFUSED_BY_THE_BROKER = {
    "six-byte varint": dict(header_tags=b"\x80\x80\x80\x80\x80\x00"),
    "negative tagged field count": dict(header_tags=b"\x80\x80\x80\x80\x08"),
    "tagged field longer than the frame": dict(header_tags=b"\x01\x05\x7f"),
    "transactional id length wrapping past int max": dict(transactional_id=b"\x80\x80\x80\x80\x08"),
    "cut before acks": dict(transactional_id=b"\x03a", rest=b""),     # the string takes half of acks
}


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def request_bytes(api_key, version, correlation_id, **fields):
    body = new_body("request", api_key, version, **fields)
    return framed(encode_request(Request(api_key, version, correlation_id, "test", body)))


def response_bytes(api_key, version, correlation_id, **fields):
    body = new_body("response", api_key, version, **fields)
    return framed(encode_response(Response(correlation_id, body), api_key, version))


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def produce(version, correlation_id, acks):
    return request_bytes(0, version, correlation_id, acks=acks, transactional_id=None, timeout_ms=1000,
                         topic_data=[Struct(name="t", topic_id=None, partition_data=[Struct(index=0, records=b"x" * 10)])]
                         if version < 13 else [])


def produce_v9(correlation_id, acks, header_tags=b"\x00", transactional_id=b"\x00", rest=None):
    """Produce v9 built by hand, so its varints can be padded the way Kafka still accepts."""
    if rest is None:
        rest = struct.pack(">i", 1000) + b"\x01\x00"       # timeout, no topics, no tagged fields
    return framed(struct.pack(">hhih", 0, 9, correlation_id, 4) + b"test" + header_tags
                  + transactional_id + struct.pack(">h", acks) + rest)


def uvarint(value: int, padding: int = 0) -> bytes:
    """``value`` as an unsigned varint, with ``padding`` extra zero groups (Kafka reads them)."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    for _ in range(padding):
        out[-1] |= 0x80
        out.append(0)
    return bytes(out)
