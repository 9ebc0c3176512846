"""The PROXY protocol header parser: v1 and v2 as balancers write them, byte at a time,
never reading past the header, and every bad input refused with a reason (never a crash)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from kproxy.protocol.proxy_header import (MALFORMED, MISSING, REFUSAL_REASONS, TOO_LONG, V1_MAX_BYTES,
                                          V2_MAX_PAYLOAD_BYTES, WRONG_VERSION, NeedMore, ProxyHeader,
                                          ProxyHeaderError, parse)
from tests.protocol.proxy_headers import V2_SIGNATURE, v1, v2

BOTH = frozenset({1, 2})
KAFKA_REQUEST = b"\x00\x00\x00\x1f\x00\x12\x00\x03\x00\x00\x00\x01"   # an ApiVersions frame's start
TLS_CLIENT_HELLO = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"


def read_exactly(stream: bytes, versions=BOTH) -> tuple[ProxyHeader, int]:
    """Feed ``stream`` as a reader does: exactly what ``NeedMore`` asks for each time.
    Returns the header and how many bytes were read (must be the header's length)."""
    data = b""
    while True:
        result = parse(data, versions)
        if isinstance(result, ProxyHeader):
            return result, len(data)
        assert result.at_least >= 1
        assert len(data) + result.at_least <= len(stream), "asked for more than the stream holds"
        data = stream[:len(data) + result.at_least]


def refusal(data: bytes, versions=BOTH) -> str:
    with pytest.raises(ProxyHeaderError) as caught:
        parse(data, versions)
    assert caught.value.reason in REFUSAL_REASONS
    return caught.value.reason


# ------------------------------------------------------------ v1

def test_v1_tcp4_exact_bytes():
    header = parse(b"PROXY TCP4 203.0.113.7 10.0.0.1 40000 9092\r\n")
    assert header == ProxyHeader(1, 44, ("203.0.113.7", 40000), ("10.0.0.1", 9092))


def test_v1_tcp6():
    data = v1(("2001:db8::7", 40000), ("2001:db8::1", 9092))
    header = parse(data + KAFKA_REQUEST)
    assert (header.version, header.length) == (1, len(data))
    assert header.source == ("2001:db8::7", 40000)
    assert header.destination == ("2001:db8::1", 9092)


def test_v1_unknown_names_no_client():
    assert parse(b"PROXY UNKNOWN\r\n") == ProxyHeader(1, 15, None, None)
    # "the receiver must ignore anything presented before the CRLF is found"
    assert parse(b"PROXY UNKNOWN ffff::1 ffff::2 1 2\r\nrest").source is None


def test_v1_longest_header_fits_and_one_more_byte_does_not():
    addresses = b"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
    longest = b"PROXY UNKNOWN " + addresses + b" 65535 65535\r\n"      # the spec's worst case
    assert len(longest) == V1_MAX_BYTES
    assert parse(longest) == ProxyHeader(1, V1_MAX_BYTES, None, None)
    assert parse(b"PROXY TCP6 " + addresses + b" 65535 65535\r\n").source == (
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 65535)
    assert refusal(b"PROXY UNKNOWN " + b"x" * (V1_MAX_BYTES - 14)) == TOO_LONG
    assert refusal(b"PROXY UNKNOWN " + b"x" * V1_MAX_BYTES + b"\r\n") == TOO_LONG


@pytest.mark.parametrize("line", [
    b"PROXY TCP4 203.0.113.7 10.0.0.1 40000\r\n",              # a field missing
    b"PROXY TCP4 203.0.113.7 10.0.0.1 40000 9092 7\r\n",       # one too many
    b"PROXY TCP4 2001:db8::1 10.0.0.1 40000 9092\r\n",         # IPv6 under TCP4
    b"PROXY TCP6 203.0.113.7 2001:db8::1 40000 9092\r\n",      # IPv4 under TCP6
    b"PROXY TCP4 203.0.113.7 10.0.0.1 65536 9092\r\n",         # port out of range
    b"PROXY TCP4 203.0.113.7 10.0.0.1 -1 9092\r\n",
    b"PROXY TCP4 203.0.113.7 10.0.0.1 040000 9092\r\n",        # leading zero
    b"PROXY TCP4 203.0.113.07 10.0.0.1 40000 9092\r\n",        # leading zero in an octet
    b"PROXY TCP4  203.0.113.7 10.0.0.1 40000 9092\r\n",        # two spaces
    b"PROXY UDP4 203.0.113.7 10.0.0.1 40000 9092\r\n",
    b"PROXY TCP4 203.0.113.7\n",
    b"PROXY TCP4 203.0.\xc3\xa9.7 10.0.0.1 40000 9092\r\n",
    b"PROXY \r\n",
])
def test_v1_malformed(line):
    assert refusal(line) == MALFORMED


# ------------------------------------------------------------ v2

def test_v2_ipv4_exact_bytes():
    data = (V2_SIGNATURE + b"\x21\x11\x00\x0c" + bytes([203, 0, 113, 7, 10, 0, 0, 1])
            + (40000).to_bytes(2, "big") + (9092).to_bytes(2, "big"))
    assert parse(data + KAFKA_REQUEST) == ProxyHeader(2, 28, ("203.0.113.7", 40000), ("10.0.0.1", 9092))


def test_v2_ipv6_and_ipv4_mapped():
    header = parse(v2(("2001:db8::7", 40000)))
    assert header.source == ("2001:db8::7", 40000) and header.length == 16 + 36
    assert parse(v2(("::ffff:203.0.113.7", 40000), ("::ffff:10.0.0.1", 9092))).source == ("203.0.113.7", 40000)


def test_v2_local_names_no_client_and_skips_its_payload():
    data = v2(("203.0.113.7", 40000), local=True)
    header = parse(data + KAFKA_REQUEST)
    assert header.local and header.source is None and header.length == len(data)


def test_v2_unspec_and_unix_name_no_client():
    assert parse(v2(None)).source is None
    unix = V2_SIGNATURE + b"\x21\x31" + (216).to_bytes(2, "big") + b"/run/lb.sock".ljust(216, b"\x00")
    header = parse(unix)
    assert header.source is None and header.length == 16 + 216


def test_v2_tlvs_are_kept_in_order():
    tlvs = [(0x02, b"bootstrap.kafka.example.com"), (0xEA, b"\x01vpce-0123456789abcdef0"), (0x04, b"")]
    header = parse(v2(("203.0.113.7", 40000), tlvs=tlvs))
    assert header.tlvs == tuple(tlvs) and header.source == ("203.0.113.7", 40000)


def test_v2_longest_payload_taken_and_one_more_refused_before_it_arrives():
    filler = [(0xE0, b"x" * (V2_MAX_PAYLOAD_BYTES - 12 - 3))]
    assert parse(v2(("203.0.113.7", 40000), tlvs=filler)).length == 16 + V2_MAX_PAYLOAD_BYTES
    prefix = V2_SIGNATURE + b"\x21\x11" + (V2_MAX_PAYLOAD_BYTES + 1).to_bytes(2, "big")
    assert refusal(prefix) == TOO_LONG                          # only the 16-byte prefix is needed
    assert refusal(V2_SIGNATURE + b"\x21\x11\xff\xff") == TOO_LONG


@pytest.mark.parametrize("data", [
    V2_SIGNATURE + b"\x11\x11\x00\x0c" + bytes(12),             # version 1 in a v2 prefix
    V2_SIGNATURE + b"\x22\x11\x00\x0c" + bytes(12),             # command 2
    V2_SIGNATURE + b"\x21\x13\x00\x0c" + bytes(12),             # transport 3
    V2_SIGNATURE + b"\x21\x41\x00\x0c" + bytes(12),             # family 4
    V2_SIGNATURE + b"\x21\x11\x00\x08" + bytes(8),              # too short for IPv4 addresses
    V2_SIGNATURE + b"\x21\x21\x00\x0c" + bytes(12),             # too short for IPv6 addresses
    V2_SIGNATURE + b"\x21\x11\x00\x0e" + bytes(14),             # a TLV cut in its type/length
    V2_SIGNATURE + b"\x21\x11\x00\x10" + bytes(12) + b"\x02\x00\x05\x61",   # TLV longer than the rest
])
def test_v2_malformed(data):
    assert refusal(data) == MALFORMED


# ------------------------------------------------------------ what is no header

@pytest.mark.parametrize("data", [KAFKA_REQUEST, TLS_CLIENT_HELLO, b"GET / HTTP/1.1\r\n", b"\x00", b"proxy "])
def test_no_header_is_refused_at_the_first_byte_that_shows_it(data):
    assert refusal(data) == MISSING
    assert refusal(data[:1]) == MISSING


def test_a_version_the_listener_does_not_take():
    assert refusal(v1(("203.0.113.7", 40000)), frozenset({2})) == WRONG_VERSION
    assert refusal(v2(("203.0.113.7", 40000)), frozenset({1})) == WRONG_VERSION
    assert isinstance(parse(b"PROX", frozenset({2})), NeedMore)     # not yet a whole signature


# ------------------------------------------------------------ reading: exact, byte at a time

HEADERS = [
    v1(("203.0.113.7", 40000)), v1(("2001:db8::7", 1)), v1(None),
    v1(("255.255.255.255", 65535), ("255.255.255.255", 65535)),
    v1(("0.0.0.0", 0), ("0.0.0.0", 0)), v1(("::", 0), ("::", 0)),
    b"PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n",
    v2(("203.0.113.7", 40000)), v2(("2001:db8::7", 40000)), v2(None), v2(("203.0.113.7", 1), local=True),
    v2(("203.0.113.7", 40000), tlvs=[(0x02, b"broker-1.example.com"), (0x03, b"\x00" * 4)]),
]


@pytest.mark.parametrize("header", HEADERS)
@pytest.mark.parametrize("following", [b"", KAFKA_REQUEST, TLS_CLIENT_HELLO])
def test_a_reader_reading_what_it_is_asked_for_stops_at_the_header_end(header, following):
    parsed, read = read_exactly(header + following)
    assert read == len(header) == parsed.length


@pytest.mark.parametrize("header", HEADERS)
def test_byte_at_a_time_every_prefix_needs_more_until_the_whole(header):
    for n in range(len(header)):
        result = parse(header[:n])
        assert isinstance(result, NeedMore), (n, result)
        assert n + result.at_least <= len(header), f"at {n} asks past the header's end"
    assert parse(header).length == len(header)


@pytest.mark.parametrize("header", HEADERS)
def test_truncated_headers_only_ever_ask_for_more(header):
    for cut in range(1, len(header)):
        assert isinstance(parse(header[:cut]), NeedMore)


@settings(max_examples=1500, deadline=None, database=None)
@given(st.binary(max_size=300), st.sampled_from([frozenset({1}), frozenset({2}), BOTH]))
def test_random_bytes_parse_need_more_or_refuse_with_a_reason(data, versions):
    check_any_input(data, versions)


@settings(max_examples=1500, deadline=None, database=None)
@given(st.sampled_from(HEADERS), st.integers(0, 200), st.integers(0, 255), st.booleans())
def test_mutated_headers_parse_need_more_or_refuse_with_a_reason(header, at, value, cut):
    data = bytearray(header)
    at %= len(data)
    data[at] = value
    if cut:
        del data[at:]
    check_any_input(bytes(data), BOTH)


def check_any_input(data: bytes, versions) -> None:
    try:
        result = parse(data, versions)
    except ProxyHeaderError as exc:
        assert exc.reason in REFUSAL_REASONS
        return
    if isinstance(result, NeedMore):
        assert result.at_least >= 1
        assert len(data) + result.at_least <= max(V1_MAX_BYTES, 16 + V2_MAX_PAYLOAD_BYTES)
    else:
        assert result.length <= len(data)


def test_seeded_mutations_never_raise_anything_else():
    rng = random.Random(23)
    for _ in range(20_000):
        data = bytearray(rng.choice(HEADERS))
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        check_any_input(bytes(data[:rng.randint(0, len(data))]), BOTH)
