"""Peers that do not speak Kafka at all are named, not reported as a 369 MB frame."""

import pytest

from kproxy.protocol.connection import Connection
from kproxy.protocol.errors import FrameTooLarge
from kproxy.protocol.sniff import (HTTP_BAD_REQUEST, TLS_HANDSHAKE_FAILURE_ALERT, WRONG_PROTOCOLS,
                                   WrongProtocol)

# The first bytes of what real tools send: a TLS 1.2/1.3 ClientHello record header
# (openssl s_client, Java, librdkafka: record version 3.1), an SSL 3.0 record, HTTP.
CLIENT_HELLO = bytes.fromhex("16030100f4010000f00303") + bytes(32)


@pytest.mark.parametrize("first, cause, reply", [
    (CLIENT_HELLO, "tls_on_plaintext_listener", TLS_HANDSHAKE_FAILURE_ALERT),
    (bytes.fromhex("1603000050"), "tls_on_plaintext_listener", TLS_HANDSHAKE_FAILURE_ALERT),
    (b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", "http_on_kafka_port", HTTP_BAD_REQUEST),
    (b"POST /v1/x HTTP/1.1\r\n", "http_on_kafka_port", HTTP_BAD_REQUEST),
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "http_on_kafka_port", HTTP_BAD_REQUEST),
])
def test_a_client_speaking_tls_or_http_is_named(first, cause, reply):
    with pytest.raises(WrongProtocol) as raised:
        Connection().receive_client(first)
    assert raised.value.cause == cause and raised.value.reply == reply
    assert str(raised.value).startswith(WRONG_PROTOCOLS[cause])
    assert "bytes (maximum" not in str(raised.value)       # not the 369 MB frame any more
    assert isinstance(raised.value, FrameTooLarge)          # still closes as before


def test_the_signature_may_arrive_a_byte_at_a_time():
    conn = Connection()
    for byte in CLIENT_HELLO[:3]:
        assert conn.receive_client(bytes([byte])) == []
    with pytest.raises(WrongProtocol):
        conn.receive_client(CLIENT_HELLO[3:])


@pytest.mark.parametrize("first, cause", [
    (TLS_HANDSHAKE_FAILURE_ALERT, "upstream_speaks_tls"),
    (b"HTTP/1.1 400 Bad Request\r\n\r\n", "upstream_speaks_http"),
])
def test_an_upstream_answering_tls_or_http_is_named(first, cause):
    conn = Connection()
    conn.receive_client(bytes.fromhex("0000000e0012000300000001000461707031"))   # ApiVersions v3
    for feed in (conn.receive_broker, lambda data: conn.relay_broker(data)):
        with pytest.raises(WrongProtocol) as raised:
            feed(first)
        assert raised.value.cause == cause and raised.value.reply == b""


def test_only_the_start_of_a_stream_is_read_as_a_signature():
    conn = Connection()
    request = bytes.fromhex("0000000e0012000300000001000461707031")
    conn.receive_client(request)
    with pytest.raises(FrameTooLarge) as raised:             # Kafka first, then garbage: a bad frame
        conn.receive_client(CLIENT_HELLO)
    assert not isinstance(raised.value, WrongProtocol)
    with pytest.raises(FrameTooLarge) as raised:             # huge, but no known signature
        Connection().receive_client(bytes.fromhex("7f000000"))
    assert not isinstance(raised.value, WrongProtocol)


def test_small_frames_that_happen_to_start_alike_are_kafka():
    # 0x16 as the first byte of a size prefix is a 369 MB frame; a size below the limit
    # whose bytes look like nothing in particular is framed normally.
    assert Connection().receive_client(bytes.fromhex("0000000200ff")) != []
