"""PROXY protocol headers as a load balancer writes them, built from the spec's layout
(HAProxy's proxy-protocol.txt) by hand, independently of kproxy's parser."""

from __future__ import annotations

import ipaddress
import struct

V2_SIGNATURE = b"\x0d\x0a\x0d\x0a\x00\x0d\x0a\x51\x55\x49\x54\x0a"   # spelt out as the spec does


def v1(source: tuple[str, int] | None, destination: tuple[str, int] | None = None) -> bytes:
    """``PROXY TCP4|TCP6 ...\\r\\n``, or ``PROXY UNKNOWN\\r\\n`` without a source."""
    if source is None:
        return b"PROXY UNKNOWN\r\n"
    destination = destination or (("10.0.0.1", 9092) if ":" not in source[0] else ("2001:db8::1", 9092))
    family = "TCP6" if ":" in source[0] else "TCP4"
    return f"PROXY {family} {source[0]} {destination[0]} {source[1]} {destination[1]}\r\n".encode()


def v2(source: tuple[str, int] | None, destination: tuple[str, int] | None = None, *,
       local: bool = False, tlvs: list[tuple[int, bytes]] = (), transport: int = 1) -> bytes:
    """A v2 header: PROXY (0x21) with TCP over IPv4/IPv6 addresses, or LOCAL (0x20)."""
    command = 0x20 if local else 0x21
    if source is None:
        family, addresses = 0x00, b""
    else:
        src = ipaddress.ip_address(source[0])
        destination = destination or (("10.0.0.1", 9092) if src.version == 4 else ("2001:db8::1", 9092))
        dst = ipaddress.ip_address(destination[0])
        family = (0x10 if src.version == 4 else 0x20) | transport
        addresses = src.packed + dst.packed + struct.pack(">HH", source[1], destination[1])
    rest = addresses + b"".join(struct.pack(">BH", kind, len(value)) + value for kind, value in tlvs)
    return V2_SIGNATURE + bytes([command, family]) + struct.pack(">H", len(rest)) + rest
