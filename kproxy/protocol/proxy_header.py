"""The PROXY protocol header (HAProxy's, versions 1 and 2), sans-I/O.

A load balancer that passes TCP through (HAProxy, an AWS NLB, Envoy, ...)
writes one header before the client's first byte, naming the client's
address: kproxy reads it, reports that address as the client's, and passes the
rest of the stream on. ``parse(data, versions)`` takes the bytes read so far
and returns a ``ProxyHeader``, or ``NeedMore(at_least)``: the fewest bytes the
header still needs, so a reader that reads exactly that much never takes a
byte past the header (the TLS handshake or the first Kafka request that follow
stay unread). Malformed, oversized or unexpected input raises
``ProxyHeaderError`` whose ``reason`` is one of ``REFUSAL_REASONS``; nothing
else is raised, whatever the bytes.

- v1: one text line, ``PROXY TCP4|TCP6 SRC DST SPORT DPORT\\r\\n`` or
  ``PROXY UNKNOWN ...\\r\\n``, at most 107 bytes.
- v2: a 16-byte binary prefix (12-byte signature, version/command, family/
  transport, 2-byte length), then addresses and optional TLVs.

A v2 ``LOCAL`` header (a balancer's own health check) and v1 ``UNKNOWN`` carry
no client address (``source`` is None): the connection's own peer is the client.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

HostPort = tuple[str, int]

V1_SIGNATURE = b"PROXY "
V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
# The spec's bound: "PROXY TCP6 " + two full IPv6 addresses + two 5-digit ports + CRLF.
V1_MAX_BYTES = 107
# "PROXY UNKNOWN\r\n", the shortest v1 header; no v2 header is shorter than its 16-byte prefix.
V1_MIN_BYTES = 15
V2_PREFIX_BYTES = 16
# The v2 length field allows 65,535 bytes, held per connection before anything is known of
# it. Addresses take at most 216 (AF_UNIX); the TLVs balancers send (AWS/Azure/GCP endpoint
# ids, the authority, TLS facts, a CRC) take some hundreds. Beyond this: refused (too_long).
V2_MAX_PAYLOAD_BYTES = 4096
V2_MAX_BYTES = V2_PREFIX_BYTES + V2_MAX_PAYLOAD_BYTES

V2_VERSION = 0x2
V2_LOCAL, V2_PROXY = 0x0, 0x1
# Family/transport byte -> (address family, bytes its addresses take). The spec lists these
# seven and says receivers must reject any other value.
V2_UNSPEC, V2_INET, V2_INET6, V2_UNIX = 0x0, 0x1, 0x2, 0x3
V2_FAMILIES = {0x00: (V2_UNSPEC, 0), 0x11: (V2_INET, 12), 0x12: (V2_INET, 12),
               0x21: (V2_INET6, 36), 0x22: (V2_INET6, 36), 0x31: (V2_UNIX, 216), 0x32: (V2_UNIX, 216)}
TLV_HEADER_BYTES = 3                      # type (1) and length (2)

V1_UNKNOWN = b"UNKNOWN"
# v1 protocol -> the shortest text of each field after it (src, dst, sport, dport): used for
# the lower bound ``NeedMore`` gives, so reads never go past the line.
V1_FIELD_MINIMA = {b"TCP4": (7, 7, 1, 1), b"TCP6": (2, 2, 1, 1)}    # "0.0.0.0", "::", "0"
V1_ADDRESS_CHARS = {b"TCP4": frozenset(b"0123456789."),
                    b"TCP6": frozenset(b"0123456789abcdefABCDEF:.")}
V1_MAX_PORT_DIGITS = 5
MAX_PORT = 65535

# Why a connection's header was refused: the label set of kproxy_proxy_protocol_refused_total.
UNTRUSTED_PEER = "untrusted_peer"   # the peer may not send a header (proxy_protocol_trusted_cidrs)
MISSING = "missing"                 # the first bytes are no PROXY header (a client connecting directly)
WRONG_VERSION = "wrong_version"     # a header of a version this listener does not take
MALFORMED = "malformed"
TOO_LONG = "too_long"
TIMEOUT = "timeout"                 # no complete header in time
CLOSED = "closed"                   # the peer closed before its header was complete (a TCP health check)
REFUSAL_REASONS = (UNTRUSTED_PEER, MISSING, WRONG_VERSION, MALFORMED, TOO_LONG, TIMEOUT, CLOSED)


class ProxyHeaderError(ValueError):
    """The bytes are not an acceptable PROXY header; ``reason`` is one of REFUSAL_REASONS."""

    def __init__(self, reason: str, text: str):
        super().__init__(text)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class NeedMore:
    """The header is not complete: at least this many more bytes belong to it."""
    at_least: int


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """A complete header: ``length`` bytes; the client's address, if it names one."""
    version: int
    length: int
    source: HostPort | None           # None: LOCAL, UNKNOWN, AF_UNSPEC or AF_UNIX (use the peer)
    destination: HostPort | None
    local: bool = False               # v2 LOCAL: the balancer's own connection (health check)
    tlvs: tuple[tuple[int, bytes], ...] = ()


def parse(data: bytes | bytearray | memoryview, versions: frozenset[int] = frozenset({1, 2})
          ) -> ProxyHeader | NeedMore:
    """The header at the start of ``data`` (versions: which ones are accepted)."""
    data = bytes(data)
    if not data:
        return NeedMore(V1_MIN_BYTES if 1 in versions else V2_PREFIX_BYTES)
    if V2_SIGNATURE.startswith(data[:len(V2_SIGNATURE)]):
        if 2 not in versions:
            return _unexpected(data, 2, versions)
        return _parse_v2(data)
    if V1_SIGNATURE.startswith(data[:len(V1_SIGNATURE)]):
        if 1 not in versions:
            return _unexpected(data, 1, versions)
        return _parse_v1(data)
    raise ProxyHeaderError(MISSING, f"no PROXY protocol header (the first bytes are {data[:8]!r})")


def _unexpected(data: bytes, version: int, versions: frozenset[int]) -> NeedMore:
    """A header of a version this listener does not take: refused once its signature is
    whole (until then the bytes may be no header at all, which is another reason)."""
    signature = V2_SIGNATURE if version == 2 else V1_SIGNATURE
    if len(data) < len(signature):
        return NeedMore(len(signature) - len(data))
    wanted = " or ".join(f"v{v}" for v in sorted(versions))
    raise ProxyHeaderError(WRONG_VERSION, f"a PROXY protocol v{version} header, but this listener "
                                          f"takes {wanted} (proxy_protocol)")


def _host(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """An address as kproxy reports it: an IPv4 client behind a dual-stack balancer
    (``::ffff:203.0.113.7``) as the IPv4 address it is."""
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped if mapped is not None else address)


# ---------------------------------------------------------------- v1

def _parse_v1(data: bytes) -> ProxyHeader | NeedMore:
    end = data.find(b"\r\n", 0, V1_MAX_BYTES)
    if end < 0:
        if len(data) >= V1_MAX_BYTES:
            raise ProxyHeaderError(TOO_LONG, f"PROXY v1 header without its CRLF in {V1_MAX_BYTES} bytes")
        return NeedMore(min(_v1_shortest_rest(data), V1_MAX_BYTES - len(data)))
    line = data[:end]
    fields = line.split(b" ")
    if fields[0] != b"PROXY" or len(fields) < 2:
        raise ProxyHeaderError(MALFORMED, f"malformed PROXY v1 header {line[:V1_MAX_BYTES]!r}")
    protocol = fields[1]
    if protocol == V1_UNKNOWN:            # the rest of the line is to be ignored
        return ProxyHeader(1, end + 2, None, None)
    if protocol not in V1_FIELD_MINIMA or len(fields) != 6:
        raise ProxyHeaderError(MALFORMED, f"malformed PROXY v1 header {line!r}: expected "
                                          f"'PROXY TCP4|TCP6 SRC DST SPORT DPORT' or 'PROXY UNKNOWN'")
    family = ipaddress.IPv4Address if protocol == b"TCP4" else ipaddress.IPv6Address
    source = (_v1_address(fields[2], family, line), _v1_port(fields[4], line))
    destination = (_v1_address(fields[3], family, line), _v1_port(fields[5], line))
    return ProxyHeader(1, end + 2, source, destination)


def _v1_address(text: bytes, family, line: bytes) -> str:
    try:
        return _host(family(text.decode("ascii")))
    except (UnicodeDecodeError, ValueError):
        raise ProxyHeaderError(MALFORMED, f"PROXY v1 header {line!r}: {text!r} is no "
                                          f"{'IPv4' if family is ipaddress.IPv4Address else 'IPv6'} "
                                          f"address") from None


def _v1_port(text: bytes, line: bytes) -> int:
    # isdigit on bytes is ASCII only; the spec's ports have no sign, spaces or leading zeros.
    if not text.isdigit() or len(text) > V1_MAX_PORT_DIGITS or (len(text) > 1 and text[0] == 0x30) \
            or int(text) > MAX_PORT:
        raise ProxyHeaderError(MALFORMED, f"PROXY v1 header {line!r}: {text!r} is no port")
    return int(text)


def _v1_shortest_rest(data: bytes) -> int:
    """The fewest bytes a v1 header starting with ``data`` (no CRLF yet) still needs;
    a prefix no header can start with raises (refused before more is read)."""
    if data.endswith(b"\r"):
        if b"\r" in data[:-1]:
            raise ProxyHeaderError(MALFORMED, f"malformed PROXY v1 header {data!r}")
        return 1
    if b"\r" in data or b"\n" in data:
        raise ProxyHeaderError(MALFORMED, f"malformed PROXY v1 header {data!r}")
    fields = data.split(b" ")
    if len(fields) == 1:                  # "PROX": the signature is checked by parse
        return V1_MIN_BYTES - len(data)
    protocol = fields[1]
    if len(fields) == 2:                  # the protocol, perhaps partly
        rests = [len(name) - len(protocol) + (2 if name == V1_UNKNOWN else 1 + sum(m + 1 for m in minima) + 1)
                 for name, minima in [(V1_UNKNOWN, ()), *V1_FIELD_MINIMA.items()]
                 if name.startswith(protocol)]
        if not rests:
            raise ProxyHeaderError(MALFORMED, f"PROXY v1 header with protocol {protocol!r} "
                                              f"(expected TCP4, TCP6 or UNKNOWN)")
        return min(rests)
    if protocol == V1_UNKNOWN:
        return 2
    minima = V1_FIELD_MINIMA.get(protocol)
    if minima is None:
        raise ProxyHeaderError(MALFORMED, f"PROXY v1 header with protocol {protocol!r} "
                                          f"(expected TCP4, TCP6 or UNKNOWN)")
    given = fields[2:]                   # the last one may be partial
    if len(given) > len(minima):
        raise ProxyHeaderError(MALFORMED, f"PROXY v1 header with too many fields: {data!r}")
    for i, text in enumerate(given):
        allowed = V1_ADDRESS_CHARS[protocol] if i < 2 else frozenset(b"0123456789")
        if (i < len(given) - 1 and not text) or not set(text) <= allowed \
                or (i >= 2 and len(text) > V1_MAX_PORT_DIGITS):
            raise ProxyHeaderError(MALFORMED, f"malformed PROXY v1 header {data!r}")
    current = len(given) - 1
    rest = max(0, minima[current] - len(given[current]))
    rest += sum(1 + m for m in minima[current + 1:])
    return rest + 2                       # CRLF


# ---------------------------------------------------------------- v2

def _parse_v2(data: bytes) -> ProxyHeader | NeedMore:
    if len(data) < V2_PREFIX_BYTES:
        return NeedMore(V2_PREFIX_BYTES - len(data))
    version, command = data[12] >> 4, data[12] & 0x0F
    if version != V2_VERSION:
        raise ProxyHeaderError(MALFORMED, f"PROXY v2 signature with version {version}")
    if command not in (V2_LOCAL, V2_PROXY):
        raise ProxyHeaderError(MALFORMED, f"PROXY v2 header with command {command:#x} "
                                          f"(expected LOCAL or PROXY)")
    family_byte = data[13]
    payload = int.from_bytes(data[14:16], "big")
    if payload > V2_MAX_PAYLOAD_BYTES:
        raise ProxyHeaderError(TOO_LONG, f"PROXY v2 header of {payload} bytes after its prefix "
                                         f"(at most {V2_MAX_PAYLOAD_BYTES} are taken)")
    length = V2_PREFIX_BYTES + payload
    if len(data) < length:
        return NeedMore(length - len(data))
    if command == V2_LOCAL:               # the spec: ignore the rest, use the real endpoints
        return ProxyHeader(2, length, None, None, local=True)
    if family_byte not in V2_FAMILIES:
        raise ProxyHeaderError(MALFORMED, f"PROXY v2 header with family/transport {family_byte:#04x}")
    family, address_bytes = V2_FAMILIES[family_byte]
    if payload < address_bytes:
        raise ProxyHeaderError(MALFORMED, f"PROXY v2 header of {payload} bytes after its prefix, "
                                          f"too short for its addresses ({address_bytes})")
    body = data[V2_PREFIX_BYTES:length]
    source = destination = None
    if family == V2_INET:
        source = (str(ipaddress.IPv4Address(body[0:4])), int.from_bytes(body[8:10], "big"))
        destination = (str(ipaddress.IPv4Address(body[4:8])), int.from_bytes(body[10:12], "big"))
    elif family == V2_INET6:
        source = (_host(ipaddress.IPv6Address(body[0:16])), int.from_bytes(body[32:34], "big"))
        destination = (_host(ipaddress.IPv6Address(body[16:32])), int.from_bytes(body[34:36], "big"))
    # AF_UNSPEC and AF_UNIX name no IP client: the peer stands for it.
    return ProxyHeader(2, length, source, destination, tlvs=_tlvs(body[address_bytes:]))


def _tlvs(data: bytes) -> tuple[tuple[int, bytes], ...]:
    """The type-length-value entries after the addresses, each checked to fit."""
    out = []
    at = 0
    while at < len(data):
        if len(data) - at < TLV_HEADER_BYTES:
            raise ProxyHeaderError(MALFORMED, "PROXY v2 header ends inside a TLV's type and length")
        kind, size = data[at], int.from_bytes(data[at + 1:at + 3], "big")
        at += TLV_HEADER_BYTES
        if at + size > len(data):
            raise ProxyHeaderError(MALFORMED, f"PROXY v2 TLV {kind:#04x} of {size} bytes runs past "
                                              f"the header")
        out.append((kind, data[at:at + size]))
        at += size
    return tuple(out)
