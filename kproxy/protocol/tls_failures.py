"""Why a client's TLS handshake with kproxy failed, named from what OpenSSL reported
and the first byte the client sent (sans-I/O: the proxy's TLS layer asks, then logs
and counts the answer)."""

from __future__ import annotations

# Why a client's TLS handshake failed (bounded label values), and what to tell the operator.
HANDSHAKE_FAILURES = {
    "plaintext_on_tls_listener": "plaintext Kafka on a TLS listener: the client does not speak TLS; "
                                 "set security.protocol to SSL or SASL_SSL on the client",
    "http_on_tls_listener": "HTTP on the Kafka port (TLS listener); point HTTP clients at admin_listen",
    "no_client_certificate": "the client sent no certificate and tls_server.client_ca_file requires "
                             "one; give the client a keystore (ssl.keystore.* / ssl.certificate.location)",
    "client_certificate_rejected": "the client's certificate does not verify against "
                                   "tls_server.client_ca_file (unknown CA, expired, wrong usage)",
    "protocol_mismatch": "no TLS version or cipher both sides accept (kproxy needs TLS 1.2+)",
    "other": "TLS handshake failed",
}
_FAILURE_OF_REASON = {          # OpenSSL's reason code -> HANDSHAKE_FAILURES key
    "HTTP_REQUEST": "http_on_tls_listener", "HTTPS_PROXY_REQUEST": "http_on_tls_listener",
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "no_client_certificate",
    "CERTIFICATE_VERIFY_FAILED": "client_certificate_rejected",
    "UNSUPPORTED_PROTOCOL": "protocol_mismatch", "NO_PROTOCOLS_AVAILABLE": "protocol_mismatch",
    "NO_SHARED_CIPHER": "protocol_mismatch", "TLSV1_ALERT_PROTOCOL_VERSION": "protocol_mismatch",
    "VERSION_TOO_LOW": "protocol_mismatch",
}
# A Kafka request's size prefix starts with 0 (frames under 16 MiB); a TLS record with 0x16.
_KAFKA_FIRST_BYTE = 0


def handshake_failure(reason: str | None, first_byte: int | None) -> str:
    """The HANDSHAKE_FAILURES key for a failed server-side handshake. A Kafka client without
    TLS starts with a size prefix, which OpenSSL calls a wrong version number; the first byte
    tells it from a broken TLS client."""
    if first_byte == _KAFKA_FIRST_BYTE and reason == "WRONG_VERSION_NUMBER":
        return "plaintext_on_tls_listener"
    return _FAILURE_OF_REASON.get(reason or "", "other")
