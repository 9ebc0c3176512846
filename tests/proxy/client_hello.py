"""A real TLS ClientHello (Python's ssl, in memory) whose server_name extension is replaced
by any bytes: names no TLS library would send (64 KiB, not ASCII, with line breaks), for
tests of what a server does with them."""

from __future__ import annotations

import ssl
import struct

HANDSHAKE = 22                 # TLS record content type
CLIENT_HELLO = 1               # handshake message type
SERVER_NAME_EXTENSION = 0
HOST_NAME = 0                  # server_name entry type
MAX_RECORD_PAYLOAD = 16384     # a TLS record's plaintext limit: longer hellos span records
PLACEHOLDER = "placeholder.example"


def _hello_body() -> bytes:
    """The body of the ClientHello Python's ssl sends for PLACEHOLDER (all records joined)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=PLACEHOLDER)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    records, handshake = outgoing.read(), b""
    while records:
        _, _, length = struct.unpack(">BHH", records[:5])
        handshake += records[5:5 + length]
        records = records[5 + length:]
    assert handshake[0] == CLIENT_HELLO
    return handshake[4:4 + int.from_bytes(handshake[1:4], "big")]


def _split_extensions(body: bytes) -> tuple[bytes, list[tuple[int, bytes]]]:
    at = 2 + 32                                         # version, random
    at += 1 + body[at]                                  # session id
    at += 2 + int.from_bytes(body[at:at + 2], "big")    # cipher suites
    at += 1 + body[at]                                  # compression methods
    head, total = body[:at], int.from_bytes(body[at:at + 2], "big")
    extensions, rest = [], body[at + 2:at + 2 + total]
    while rest:
        kind, length = struct.unpack(">HH", rest[:4])
        extensions.append((kind, rest[4:4 + length]))
        rest = rest[4 + length:]
    return head, extensions


def room_for_name() -> int:
    """The longest server name a ClientHello can carry beside the other extensions (all
    extensions share one 16-bit length)."""
    _, extensions = _split_extensions(_hello_body())
    others = sum(4 + len(data) for kind, data in extensions if kind != SERVER_NAME_EXTENSION)
    return 0xFFFF - others - 4 - 5


def client_hello(server_name: bytes) -> bytes:
    """TLS records carrying a ClientHello whose server_name is ``server_name``, as is."""
    head, extensions = _split_extensions(_hello_body())
    entry = struct.pack(">BH", HOST_NAME, len(server_name)) + server_name
    sni = struct.pack(">H", len(entry)) + entry
    joined = b"".join(struct.pack(">HH", kind, len(data)) + data
                      for kind, data in ((k, sni if k == SERVER_NAME_EXTENSION else d) for k, d in extensions))
    body = head + struct.pack(">H", len(joined)) + joined
    handshake = bytes([CLIENT_HELLO]) + len(body).to_bytes(3, "big") + body
    return b"".join(struct.pack(">BHH", HANDSHAKE, 0x0301, len(chunk)) + chunk
                    for chunk in (handshake[i:i + MAX_RECORD_PAYLOAD]
                                  for i in range(0, len(handshake), MAX_RECORD_PAYLOAD)))
