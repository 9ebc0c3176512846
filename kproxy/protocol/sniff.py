"""Wrong-protocol sniffing: a peer that does not speak Kafka at all (TLS, HTTP).

Its first four bytes, read as a Kafka size prefix, give an impossible frame; before
refusing it the framer asks ``wrong_protocol`` what they are, so the close says what
is misconfigured and the client hears back in its own protocol (a TLS alert, an
HTTP 400) instead of a bare close.
"""

from __future__ import annotations

from .errors import FrameTooLarge


class WrongProtocol(FrameTooLarge):
    """The peer does not speak Kafka at all (TLS, HTTP): its first bytes, read as a size
    prefix, give a huge frame. ``cause`` is one of ``WRONG_PROTOCOLS``; ``reply`` is what
    to send the client before closing, so it learns what went wrong in its own protocol."""

    def __init__(self, cause: str, message: str, reply: bytes = b""):
        super().__init__(message)
        self.cause = cause
        self.reply = reply


# cause -> the phrase its message starts with (also how close reasons are recognised).
WRONG_PROTOCOLS = {
    "tls_on_plaintext_listener": "TLS handshake on a plaintext listener",
    "http_on_kafka_port": "HTTP on the Kafka port",
    "upstream_speaks_tls": "the upstream answered with TLS",
    "upstream_speaks_http": "the upstream answered with HTTP",
}
_TLS_RECORD_VERSION_MAJOR = 3         # SSL 3.0 and TLS 1.0-1.3 records: 0x0300-0x0304
_TLS_HANDSHAKE, _TLS_ALERT = 0x16, 0x15
# A fatal handshake_failure alert (TLS record: type, version 3.3, length 2, level, description):
# the client's TLS stack reports a failed handshake at once instead of waiting or retrying.
TLS_HANDSHAKE_FAILURE_ALERT = bytes((_TLS_ALERT, 3, 3, 0, 2, 2, 40))
_HTTP_METHODS = (b"GET ", b"POST", b"PUT ", b"HEAD", b"DELE", b"OPTI", b"PATC", b"CONN", b"PRI ")
_HTTP_BODY = (b"This is a Kafka listener (kproxy), not an HTTP server. kproxy's metrics and "
              b"health checks are on its admin listener (admin_listen).\n")
HTTP_BAD_REQUEST = (b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(_HTTP_BODY)) + _HTTP_BODY


def wrong_protocol(direction: str, start) -> WrongProtocol | None:
    """What a stream starting with ``start`` (at least 4 bytes) is, if plainly not Kafka."""
    start = bytes(start[:4])
    tls = start[1] == _TLS_RECORD_VERSION_MAJOR and start[2] <= 4
    if direction == "client":
        if start[0] == _TLS_HANDSHAKE and tls:
            return WrongProtocol("tls_on_plaintext_listener", (
                f"{WRONG_PROTOCOLS['tls_on_plaintext_listener']}: the client sent a TLS ClientHello, "
                f"not a Kafka request; set security.protocol to PLAINTEXT or SASL_PLAINTEXT on the "
                f"client, or give kproxy a tls_server section to terminate TLS"),
                TLS_HANDSHAKE_FAILURE_ALERT)
        if start in _HTTP_METHODS:
            return WrongProtocol("http_on_kafka_port", (
                f"{WRONG_PROTOCOLS['http_on_kafka_port']}: the client sent an HTTP request "
                f"({start.decode('ascii').strip()} ...); point HTTP clients (metrics, health checks) "
                f"at admin_listen"), HTTP_BAD_REQUEST)
        return None
    if start[0] in (_TLS_ALERT, _TLS_HANDSHAKE) and tls:
        return WrongProtocol("upstream_speaks_tls", (
            f"{WRONG_PROTOCOLS['upstream_speaks_tls']} (a TLS record, not a Kafka response): "
            f"the broker's listener expects TLS; give kproxy a tls_client section"))
    if start == b"HTTP":
        return WrongProtocol("upstream_speaks_http", (
            f"{WRONG_PROTOCOLS['upstream_speaks_http']}, not Kafka: the upstream address is an "
            f"HTTP server, not a Kafka listener"))
    return None

