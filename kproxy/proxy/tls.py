"""TLS contexts for both sides, built from the config's TLS sections.

Client side (kproxy terminates) and broker side (kproxy originates) are
independent: either, both or neither may use TLS. Because kproxy terminates
TLS, it sees plaintext and can decode and capture what the wire hides. What the
files hold is read by ``tls_files``; ``tls_reload`` rebuilds these contexts when
the files change.
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING, Callable

from ..config import TLSClient, TLSServer
from ..protocol.sniff import TLS_HANDSHAKE_FAILURE_ALERT
from ..protocol.tls_failures import handshake_failure

if TYPE_CHECKING:            # tls_files loads cryptography (~16 MB): only where TLS is configured
    from ..certs.tls_files import Material


class _WatchedSSLObject(ssl.SSLObject):
    """A server-side TLS session that reports a failed handshake (asyncio otherwise drops
    it silently: it happens before any connection handler runs) and lets the client hear
    OpenSSL's alert: asyncio and uvloop close at once on a handshake error, without sending
    the alert OpenSSL wrote, so a client is left guessing (a Java client retries for a minute).
    The first failure is reported as "need more data", which makes the event loop send what
    OpenSSL wrote (or a handshake_failure alert if it wrote nothing, as for a client not
    speaking TLS at all); the client, told, closes; if it sends anything instead, the error is
    raised then (and ``ssl_handshake_timeout`` bounds a client that does neither).

    Built only by ``_WatchingContext.wrap_bio``, which hands it its BIOs and the callback."""

    def _watch(self, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO,
               on_failure: Callable[[str, ssl.SSLError], None]) -> None:
        self._kproxy_incoming, self._kproxy_outgoing = incoming, outgoing
        self._kproxy_on_failure = on_failure
        self._kproxy_first = self._kproxy_failed = None

    def do_handshake(self):
        if self._kproxy_failed is not None:
            raise self._kproxy_failed
        if self._kproxy_first is None and self._kproxy_incoming.pending:
            data = self._kproxy_incoming.read()     # peek: read all, put it back unchanged
            self._kproxy_incoming.write(data)
            self._kproxy_first = data[0]
        try:
            return super().do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            raise
        except ssl.SSLError as exc:
            self._kproxy_on_failure(handshake_failure(getattr(exc, "reason", None), self._kproxy_first), exc)
            self._kproxy_failed = exc
            if not self._kproxy_outgoing.pending:    # OpenSSL wrote none (not TLS at all)
                self._kproxy_outgoing.write(TLS_HANDSHAKE_FAILURE_ALERT)
            raise ssl.SSLWantReadError("handshake failed; sending the alert first") from exc


class _WatchingContext(ssl.SSLContext):
    """A server context whose sessions report failed handshakes. asyncio and uvloop both
    build a connection's TLS session with ``wrap_bio`` (public API), which is where the
    session can be given its BIOs (it has no public way to reach them itself)."""

    on_handshake_failure: Callable[[str, ssl.SSLError], None]

    def wrap_bio(self, incoming, outgoing, server_side=False, server_hostname=None, session=None):
        obj = super().wrap_bio(incoming, outgoing, server_side, server_hostname, session)
        obj._watch(incoming, outgoing, self.on_handshake_failure)
        return obj


def server_context(tls: TLSServer, material: Material | None = None, sni_callback=None,
                   on_handshake_failure: Callable[[str, ssl.SSLError], None] | None = None
                   ) -> ssl.SSLContext:
    """For listeners: kproxy's certificate, and client-certificate checks if a CA is given
    (``material``: what the section's files hold, read now if not given).

    ``sni_callback(ssl_object, server_name, context)`` runs during each handshake, before
    the certificate is sent; it may set ``ssl_object.context`` to another context (a
    reloaded certificate) or return an ``ssl.ALERT_DESCRIPTION_*`` to end the handshake
    with that alert (SNI routing). ``on_handshake_failure(cause, error)`` hears of every
    client handshake that fails.
    """
    from ..certs.tls_files import load, load_identity
    material = material or load("tls_server", tls)
    if on_handshake_failure is None:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    else:   # what create_default_context(CLIENT_AUTH) builds, as the watching class
        ctx = _WatchingContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.sslobject_class = _WatchedSSLObject
        ctx.on_handshake_failure = on_handshake_failure
    ctx.sni_callback = sni_callback
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    load_identity(ctx, material)
    if material.ca_pem is not None:
        ctx.load_verify_locations(cadata=material.ca_pem)
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


def client_context(tls: TLSClient, material: Material | None = None) -> ssl.SSLContext:
    """For upstream connections: verify the broker (hostname too, unless switched off)."""
    from ..certs.tls_files import load, load_identity
    material = material or load("tls_client", tls)
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=material.ca_pem)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = tls.check_hostname
    load_identity(ctx, material)
    return ctx
