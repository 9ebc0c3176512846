"""TLS contexts for both sides, built from the config's TLS sections.

Client side (kproxy terminates) and broker side (kproxy originates) are
independent: either, both or neither may use TLS. Because kproxy terminates
TLS, it sees plaintext and can decode and capture what the wire hides.
"""

from __future__ import annotations

import ssl

from ..config import TLSClient, TLSServer


def server_context(tls: TLSServer, sni_callback=None) -> ssl.SSLContext:
    """For listeners: kproxy's certificate, and client-certificate checks if a CA is given.

    ``sni_callback(ssl_object, server_name, context)`` (SNI routing) runs during each
    handshake, before the certificate is sent; returning an ``ssl.ALERT_DESCRIPTION_*``
    ends the handshake with that alert.
    """
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.sni_callback = sni_callback
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.client_ca_file:
        ctx.load_verify_locations(tls.client_ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(tls: TLSClient) -> ssl.SSLContext:
    """For upstream connections: verify the broker (hostname too, unless switched off)."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls.ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = tls.check_hostname
    if tls.cert_file:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    return ctx


def certificate_names(cert_file: str) -> list[str] | None:
    """The DNS names a PEM certificate is for (its SANs, else its common name); None if
    they cannot be read (the check that uses them is then skipped, never fatal)."""
    try:       # the ssl module reads certificates only through this helper (no public API)
        decoded = ssl._ssl._test_decode_cert(cert_file)
    except (AttributeError, OSError, ssl.SSLError, ValueError):
        return None
    sans = [value for kind, value in decoded.get("subjectAltName", ()) if kind == "DNS"]
    if sans:
        return sans
    return [value for rdn in decoded.get("subject", ()) for key, value in rdn if key == "commonName"]
