"""pcapng capture: each proxied connection as one synthesized TCP stream.

The stream runs between the client's real address and the real upstream
broker address (as if kproxy were not there), opens with a SYN / SYN-ACK /
ACK handshake at the first captured event, carries each direction's frames
(size prefix + frame) as TCP segments of at most ``MAX_SEGMENT`` bytes with
consistent sequence and acknowledgement numbers, and closes with FIN / FIN /
ACK when kproxy reports the connection closed. Wireshark's and tshark's
Kafka dissector reads it directly (``-d tcp.port==<broker port>,kafka`` for
a port other than 9092).

What is written is the decoded plaintext, even if the real wire was TLS.
Frames are the broker's own bytes (responses kproxy rewrote for the client
appear as the broker sent them). Redaction keeps every length, so sequence
numbers stay true: secret fields are zero-filled; record keys, values and
header values are zero-filled unless record data is enabled (compressed
batches: the whole payload); SASL v0 raw tokens (never seen by kproxy's
observers) are written as their size prefix plus zeros. Every packet
changed this way carries a pcapng comment saying so.

Format (pcapng 1.0, little-endian): one Section Header Block, one Interface
Description Block with LINKTYPE_RAW (bare IPv4/IPv6 packets; both families
in one file) and microsecond timestamps, then Enhanced Packet Blocks. IPv4
header checksums are computed; TCP checksums only if ``TCP_CHECKSUMS`` (off: see there).
"""

from __future__ import annotations

import ipaddress
import socket
import struct

from ... import __version__
from .files import RotatingSink

LINKTYPE_RAW = 101
MAX_SEGMENT = 65000            # TCP payload per packet: keeps IPv4 total length < 65535
_SHB = 0x0A0D0D0A
_IDB = 0x00000001
_EPB = 0x00000006
_BYTE_ORDER_MAGIC = 0x1A2B3C4D
_OPT_COMMENT = 1
_SHB_USERAPPL = 4
_IF_NAME = 2
_IF_DESCRIPTION = 3
_IF_TSRESOL = 9

TCP_FIN, TCP_SYN, TCP_PSH, TCP_ACK = 0x01, 0x02, 0x08, 0x10
_SIZE = struct.Struct(">i")
_EPB_HEAD = struct.Struct("<IIIII")
_BLOCK_HEAD = struct.Struct("<II")
_BLOCK_TAIL = struct.Struct("<I")
_IPV4 = struct.Struct("!BBHHHBBH4s4s")
_IPV6 = struct.Struct("!IHBB16s16s")
_TCP = struct.Struct("!HHIIBBHHH")
# Stand-ins when an address is a host name that does not resolve (TEST-NET-1/2, RFC 5737).
_FALLBACK_CLIENT = ipaddress.ip_address("192.0.2.1")
_FALLBACK_SERVER = ipaddress.ip_address("198.51.100.1")


def _option(code: int, value: bytes) -> bytes:
    return struct.pack("<HH", code, len(value)) + value + b"\0" * (-len(value) % 4)


def _options(*opts: bytes) -> bytes:
    return b"".join(opts) + b"\0\0\0\0" if opts else b""


def _block(block_type: int, body: bytes) -> bytes:
    body += b"\0" * (-len(body) % 4)
    total = len(body) + 12
    return struct.pack("<II", block_type, total) + body + struct.pack("<I", total)


def section_header() -> bytes:
    body = struct.pack("<IHHq", _BYTE_ORDER_MAGIC, 1, 0, -1)
    body += _options(_option(_SHB_USERAPPL, f"kproxy {__version__}".encode()))
    return _block(_SHB, body)


def interface_description() -> bytes:
    body = struct.pack("<HHI", LINKTYPE_RAW, 0, 0)
    body += _options(_option(_IF_NAME, b"kproxy"),
                     _option(_IF_DESCRIPTION, b"synthesized TCP streams of decoded Kafka frames"),
                     _option(_IF_TSRESOL, b"\x06"))
    return _block(_IDB, body)


def enhanced_packet(micros: int, packet: bytes, comment: str | None = None) -> bytes:
    return b"".join(enhanced_packet_parts(micros, packet, b"", comment))


def enhanced_packet_parts(micros: int, headers: bytes, payload, comment: str | None = None) -> list:
    """An Enhanced Packet Block as parts to join, ``payload`` (a view) never copied here."""
    length = len(headers) + len(payload)
    trailer = b"\0" * (-length % 4)
    if comment:
        trailer += _options(_option(_OPT_COMMENT, comment.encode()))
    total = 12 + _EPB_HEAD.size + length + len(trailer)
    head = _BLOCK_HEAD.pack(_EPB, total) + _EPB_HEAD.pack(
        0, (micros >> 32) & 0xFFFFFFFF, micros & 0xFFFFFFFF, length, length)
    return [head + headers, payload, trailer + _BLOCK_TAIL.pack(total)]


# TCP checksums cover the whole payload: ~5 ms of pure Python per MiB of Fetch response,
# all of it holding the GIL the relay needs, so capture would slow forwarding. Captures
# from NICs with checksum offload carry no valid TCP checksum either; Wireshark does not
# verify them by default. The 20-byte IPv4 header checksum is always computed.
TCP_CHECKSUMS = False


def checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071) of ``data``."""
    if len(data) & 1:
        data += b"\0"
    # 2**16 ≡ 1 (mod 2**16 - 1): the big number's residue is the one's-complement word sum.
    total = int.from_bytes(data, "big") % 0xFFFF
    if total == 0 and any(data):
        total = 0xFFFF
    return ~total & 0xFFFF


Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class TcpStream:
    """Sequence numbers of one synthesized connection (client = the TCP opener)."""

    __slots__ = ("client", "client_port", "server", "server_port", "client_seq", "server_seq",
                 "ip_id", "closed")

    def __init__(self, connection_id: int, client: Address, client_port: int,
                 server: Address, server_port: int):
        if client.version != server.version:        # IPv4 client, IPv6 broker (or the reverse)
            client, server = _as_v6(client), _as_v6(server)
        self.client, self.client_port = client, client_port
        self.server, self.server_port = server, server_port
        isn = (connection_id * 2654435761) & 0xFFFFFFFF
        self.client_seq = isn
        self.server_seq = isn ^ 0x5BD1E995
        self.ip_id = connection_id & 0xFFFF
        self.closed = False

    def _packet(self, from_client: bool, seq: int, ack: int, flags: int, payload: bytes) -> bytes:
        return self._headers(from_client, seq, ack, flags, payload) + payload

    def _headers(self, from_client: bool, seq: int, ack: int, flags: int, payload) -> bytes:
        """The IP and TCP headers of one segment carrying ``payload``."""
        if from_client:
            src, dst, sport, dport = self.client, self.server, self.client_port, self.server_port
        else:
            src, dst, sport, dport = self.server, self.client, self.server_port, self.client_port
        tcp = _TCP.pack(sport, dport, seq & 0xFFFFFFFF, ack & 0xFFFFFFFF, 5 << 4, flags, 65535, 0, 0)
        length = len(tcp) + len(payload)
        if TCP_CHECKSUMS:
            if src.version == 4:
                pseudo = src.packed + dst.packed + struct.pack("!BBH", 0, 6, length)
            else:
                pseudo = src.packed + dst.packed + struct.pack("!I3xB", length, 6)
            csum = checksum(pseudo + tcp + payload)
            tcp = tcp[:16] + struct.pack("!H", csum) + tcp[18:]
        if src.version == 4:
            self.ip_id = (self.ip_id + 1) & 0xFFFF
            ip = _IPV4.pack(0x45, 0, 20 + length, self.ip_id, 0x4000, 64, 6, 0, src.packed, dst.packed)
            ip = ip[:10] + struct.pack("!H", checksum(ip)) + ip[12:]
        else:
            ip = _IPV6.pack(6 << 28, length, 6, 64, src.packed, dst.packed)
        return ip + tcp

    def handshake(self) -> list[bytes]:
        c, s = self.client_seq, self.server_seq
        packets = [self._packet(True, c, 0, TCP_SYN, b""),
                   self._packet(False, s, c + 1, TCP_SYN | TCP_ACK, b""),
                   self._packet(True, c + 1, s + 1, TCP_ACK, b"")]
        self.client_seq = (c + 1) & 0xFFFFFFFF
        self.server_seq = (s + 1) & 0xFFFFFFFF
        return packets

    def data(self, from_client: bool, payload) -> list[tuple[bytes, memoryview]]:
        """``payload`` as segments: (IP + TCP headers, a view of the payload) each."""
        view = memoryview(payload)
        segments = []
        for start in range(0, len(view), MAX_SEGMENT):
            chunk = view[start:start + MAX_SEGMENT]
            if from_client:
                segments.append((self._headers(True, self.client_seq, self.server_seq,
                                               TCP_PSH | TCP_ACK, chunk), chunk))
                self.client_seq = (self.client_seq + len(chunk)) & 0xFFFFFFFF
            else:
                segments.append((self._headers(False, self.server_seq, self.client_seq,
                                               TCP_PSH | TCP_ACK, chunk), chunk))
                self.server_seq = (self.server_seq + len(chunk)) & 0xFFFFFFFF
        return segments

    def close(self) -> list[bytes]:
        c, s = self.client_seq, self.server_seq
        self.closed = True
        return [self._packet(True, c, s, TCP_FIN | TCP_ACK, b""),
                self._packet(False, s, c + 1, TCP_FIN | TCP_ACK, b""),
                self._packet(True, c + 1, s + 1, TCP_ACK, b"")]


def frame_packets(stream: TcpStream, from_client: bool, micros: int, payload, comment: str | None,
                  out: list) -> int:
    """Append to ``out`` the Enhanced Packet Blocks (as parts) carrying ``payload``, a
    size-prefixed frame; the comment goes on the first. Returns the packet count."""
    segments = stream.data(from_client, payload)
    for i, (headers, chunk) in enumerate(segments):
        out.extend(enhanced_packet_parts(micros, headers, chunk, comment if i == 0 else None))
    return len(segments)


def stream_file(info, frames) -> bytes:
    """A whole pcapng file of one connection from ``(from_client, wall time, frame, comment)``
    tuples (frames without size prefix, already redacted), closed at the last one's time."""
    out: list = [section_header(), interface_description()]
    stream = TcpStream(info.id, resolve(info.client[0]) or _FALLBACK_CLIENT, info.client[1],
                       resolve(info.upstream[0]) or _FALLBACK_SERVER, info.upstream[1])
    micros = 0
    for i, (from_client, wall, frame, comment) in enumerate(frames):
        micros = int(round(wall * 1_000_000))
        if i == 0:
            out.extend(enhanced_packet(micros, p) for p in stream.handshake())
        frame_packets(stream, from_client, micros, b"".join((_SIZE.pack(len(frame)), frame)), comment, out)
    if micros:
        out.extend(enhanced_packet(micros, p) for p in stream.close())
    return b"".join(out)


def _as_v6(address: Address) -> ipaddress.IPv6Address:
    if address.version == 6:
        return address
    return ipaddress.IPv6Address("::ffff:" + str(address))


_resolved: dict[str, Address | None] = {}


def resolve(host: str) -> Address | None:
    """An IP literal, or a host name resolved once (on the writer thread) and remembered."""
    try:
        address = ipaddress.ip_address(host.split("%")[0])
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            return address.ipv4_mapped
        return address
    except ValueError:
        pass
    if host not in _resolved:
        try:
            info = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
            _resolved[host] = ipaddress.ip_address(info[0][4][0].split("%")[0])
        except (OSError, ValueError, IndexError):
            _resolved[host] = None
    return _resolved[host]


class PcapngSink(RotatingSink):
    ext = ".pcapng"

    def __init__(self, files, counters):
        super().__init__(files)
        self.counters = counters
        self.streams: dict[int, TcpStream] = {}

    def on_open(self) -> None:
        self._raw(section_header() + interface_description())

    def _raw(self, data: bytes) -> None:
        self.file.write(data)
        self.counters.bytes_written += len(data)

    def _stream(self, info, micros: int, out: list[bytes]) -> TcpStream:
        stream = self.streams.get(info.id)
        if stream is None:
            client = resolve(info.client[0]) or _FALLBACK_CLIENT
            server = resolve(info.upstream[0]) or _FALLBACK_SERVER
            stream = self.streams[info.id] = TcpStream(info.id, client, info.client[1],
                                                       server, info.upstream[1])
            out.extend(enhanced_packet(micros, p) for p in stream.handshake())
        return stream

    def frame(self, info, from_client: bool, wall: float, frame, comment: str | None = None) -> None:
        """One Kafka frame (without its size prefix) sent by the client or the broker."""
        micros = int(round(wall * 1_000_000))
        payload = b"".join((_SIZE.pack(len(frame)), frame))
        self.before_write(len(payload) + 200 * (1 + len(payload) // MAX_SEGMENT))
        out: list = []
        stream = self._stream(info, micros, out)
        packets = len(out) + frame_packets(stream, from_client, micros, payload, comment, out)
        self._raw(b"".join(out))          # the one copy of the payload into the file's buffer
        self.items_in_file += 1
        self.counters.packets_written += packets

    def placeholder(self, info, from_client: bool, wall: float, size: int, comment: str) -> None:
        """A frame whose bytes kproxy never kept (SASL v0 raw token): size prefix + zeros."""
        self.frame(info, from_client, wall, bytes(max(size - 4, 0)), comment)

    def close_stream(self, info, wall: float) -> None:
        stream = self.streams.pop(info.id, None)
        if stream is None:
            return
        self.before_write(200 * 3)
        micros = int(round(wall * 1_000_000))
        packets = stream.close()
        self._raw(b"".join(enhanced_packet(micros, p) for p in packets))
        self.counters.packets_written += len(packets)
