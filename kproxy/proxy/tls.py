"""TLS contexts for both sides, built from the config's TLS sections.

Client side (kproxy terminates) and broker side (kproxy originates) are
independent: either, both or neither may use TLS. Because kproxy terminates
TLS, it sees plaintext and can decode and capture what the wire hides.
"""

from __future__ import annotations

import ssl

from ..config import TLSClient, TLSServer


def server_context(tls: TLSServer) -> ssl.SSLContext:
    """For listeners: kproxy's certificate, and client-certificate checks if a CA is given."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.client_ca_file:
        ctx.load_verify_locations(tls.client_ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


# Attribute names as Kafka's default principal builder prints them (X500Principal, RFC 2253).
SUBJECT_KEYS = {"commonName": "CN", "organizationalUnitName": "OU", "organizationName": "O",
                "localityName": "L", "stateOrProvinceName": "ST", "countryName": "C",
                "streetAddress": "STREET", "domainComponent": "DC", "userId": "UID"}


def certificate_subject(peercert: dict | None) -> str | None:
    """A verified client certificate's subject, written as Kafka names an mTLS principal
    (``CN=alice,O=Example,C=DE``: most specific first); None without a certificate."""
    if not peercert or not peercert.get("subject"):
        return None
    rdns = []
    for rdn in reversed(peercert["subject"]):
        rdns.append("+".join(f"{SUBJECT_KEYS.get(key, key)}={_escape(value)}" for key, value in rdn))
    return ",".join(rdns)


def _escape(value: str) -> str:
    value = "".join("\\" + c if c in ',+"\\<>;' else c for c in value)
    if value[:1] in (" ", "#"):
        value = "\\" + value
    if value.endswith(" "):
        value = value[:-1] + "\\ "
    return value


def client_context(tls: TLSClient) -> ssl.SSLContext:
    """For upstream connections: verify the broker (hostname too, unless switched off)."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls.ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = tls.check_hostname
    if tls.cert_file:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    return ctx
