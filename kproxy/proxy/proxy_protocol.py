"""PROXY protocol on the Kafka listeners: the header is read first, exactly, from raw TCP.

A listener with ``proxy_protocol`` on accepts plain TCP whatever its TLS
setting, and gives each connection a ``HeaderReader`` first. It refuses a peer
outside ``proxy_protocol_trusted_cidrs`` at once, then reads what the sans-I/O
parser (``protocol.proxy_header``) asks for and no more, so the bytes after the
header are still unread when the header is done. Then the connection is handed
to the relay's ``Endpoint`` as any accepted client is: plain, by switching the
transport's protocol; TLS, through ``loop.start_tls`` (the client's handshake
follows the header on the wire, so TLS can only start after it). The client
address the header names is the one the relay reports (logs, metrics,
capture, the live page); the balancer's is kept beside it (``ConnectionInfo.via``).

Listeners without it are untouched: ``serve_relays`` accepts straight into an
``Endpoint``, with TLS at accept, as before.

A header that is missing, malformed, too long, of a version not taken, from an
untrusted peer or not complete in ``PROXY_HEADER_TIMEOUT_S`` closes the
connection; each is counted (``proxy_header_refused`` hook, one fixed reason)
and logged within a budget.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
from typing import Callable, Iterable

from ..protocol.proxy_header import (CLOSED, MALFORMED, TIMEOUT, UNTRUSTED_PEER, V1_MAX_BYTES, V2_MAX_BYTES, NeedMore,
                                     ProxyHeader, ProxyHeaderError, parse)
from .log_budget import LogBudget
from ..observers.contract import CloseCause, Hook
from .relay import Endpoint, HostPort, loop_read_arena, notify_hook

log = logging.getLogger("kproxy.proxy_protocol")

# Balancers send the header as soon as the connection is up (HAProxy at once; an AWS NLB
# with the client's first bytes, which a Kafka client, or its TLS handshake, sends at once).
# A peer that has not completed it by then is refused: it holds a socket and nothing else.
PROXY_HEADER_TIMEOUT_S = 10.0
# The handshake that follows the header gets what asyncio gives one at accept.
TLS_HANDSHAKE_TIMEOUT_S = 60.0
# The most a header may take (v2 bounded by its payload limit; v1 by the spec).
MAX_HEADER_BYTES = max(V1_MAX_BYTES, V2_MAX_BYTES)
# Refusals logged: each (reason, peer host) once per interval, at most this many per interval
# (a scanner or a misconfigured balancer cannot flood the log); every one is counted.
REFUSAL_LOG_INTERVAL_S = 60.0
REFUSAL_LOG_KINDS_PER_INTERVAL = 10

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def trusted(host: str, networks: Iterable[Network]) -> bool:
    """Whether a peer address is in one of the networks (an IPv4 peer of a dual-stack
    listener, ``::ffff:10.0.0.5``, as the IPv4 address it is)."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    if mapped is not None:
        address = mapped
    return any(address in network for network in networks)


class HeaderGate:
    """What every PROXY protocol listener of one proxy shares: the versions taken, the
    trusted networks, the refusal log and the connections still sending their header."""

    def __init__(self, versions: frozenset[int], networks: Iterable[Network], observers: list,
                 server_ssl: Callable[[], ssl.SSLContext | None],
                 limit: Callable[[], CloseCause | None] = lambda: None):
        self.versions = versions
        self.networks = tuple(networks)
        self.observers = observers
        self.server_ssl = server_ssl             # asked per connection (certificates may be reloaded)
        self.limit = limit                       # why no connection may be taken now, if so
        self.pending: set[HeaderReader] = set()
        self._tls_tasks: set[asyncio.Task] = set()
        self._log = LogBudget(REFUSAL_LOG_INTERVAL_S, REFUSAL_LOG_KINDS_PER_INTERVAL)

    def describe(self) -> str:
        wanted = " or ".join(f"v{v}" for v in sorted(self.versions))
        return (f"PROXY protocol {wanted} required on the Kafka listeners, from "
                f"{', '.join(map(str, self.networks))} only")

    def refused(self, listener: str, peer: HostPort, reason: str, text: str) -> None:
        notify_hook(self.observers, Hook.PROXY_HEADER_REFUSED, listener, reason)
        unlogged = self._log.admit((reason, peer[0]))
        if unlogged is None:
            return
        # A peer closing before any header is what TCP health checks do: not worth a warning.
        level = logging.DEBUG if reason == CLOSED else logging.WARNING
        log.log(level, "refusing a connection from %s:%d on %s: %s (the same again within %gs is not "
                "logged%s; see kproxy_proxy_protocol_refused_total)", *peer, listener, text,
                REFUSAL_LOG_INTERVAL_S, f"; {unlogged} earlier refusals were not logged" if unlogged else "")

    def hand_on(self, reader: "HeaderReader", header: ProxyHeader) -> None:
        """The header is read: the connection becomes an ``Endpoint``, after TLS if any."""
        transport = reader.transport
        endpoint = reader.endpoint()
        if header.source is not None:
            endpoint.client_address, endpoint.via = header.source, reader.peer
        context = self.server_ssl()
        if context is None:
            transport.set_protocol(endpoint)
            endpoint.connection_made(transport)
            transport.resume_reading()
            return
        task = asyncio.get_running_loop().create_task(self._start_tls(transport, endpoint, context))
        self._tls_tasks.add(task)
        task.add_done_callback(self._tls_tasks.discard)

    async def _start_tls(self, transport, endpoint: Endpoint, context: ssl.SSLContext) -> None:
        try:
            tls = await asyncio.get_running_loop().start_tls(
                transport, endpoint, context, server_side=True, ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S)
        except (OSError, ssl.SSLError, asyncio.TimeoutError, RuntimeError):
            # A failed handshake is reported (counted, logged) by the server context itself.
            transport.close()
            return
        except asyncio.CancelledError:           # shutting down
            transport.close()
            return
        endpoint.connection_made(tls)

    def close_all(self) -> None:
        """Shutdown: connections still sending a header or in their handshake are closed."""
        for reader in list(self.pending):
            reader.close()
        for task in list(self._tls_tasks):
            task.cancel()


class HeaderReader(asyncio.BufferedProtocol):
    """A PROXY listener's connection until its header is read: exactly the header's bytes."""

    def __init__(self, gate: HeaderGate, listener: str, endpoint: Callable[[], Endpoint]):
        self.gate = gate
        self.listener = listener
        self.endpoint = endpoint                 # makes the connection's Endpoint once the header is in
        self.transport: asyncio.Transport | None = None
        self.peer: HostPort = ("?", 0)
        self._buffer = bytearray(MAX_HEADER_BYTES)
        self._have = 0
        self._want = 1
        self._timer: asyncio.TimerHandle | None = None
        self._done = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = (peer[0], peer[1])
        gate = self.gate
        limit = gate.limit()
        if limit is not None:
            self._done = True
            notify_hook(gate.observers, Hook.CONNECTION_REFUSED, self.listener, limit)
            transport.close()
            return
        if not trusted(self.peer[0], gate.networks):
            self._refuse(UNTRUSTED_PEER, f"{self.peer[0]} may not send a PROXY protocol header (it is "
                                         f"in no network of proxy_protocol_trusted_cidrs)")
            return
        first = parse(b"", gate.versions)
        self._want = first.at_least if isinstance(first, NeedMore) else 1
        gate.pending.add(self)
        self._timer = asyncio.get_running_loop().call_later(
            PROXY_HEADER_TIMEOUT_S, self._refuse, TIMEOUT,
            f"no complete PROXY protocol header within {PROXY_HEADER_TIMEOUT_S:g}s")

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self._buffer)[self._have:self._have + self._want]

    def buffer_updated(self, nbytes: int) -> None:
        if self._done:
            return
        self._have += nbytes
        try:
            result = parse(memoryview(self._buffer)[:self._have], self.gate.versions)
        except ProxyHeaderError as exc:
            self._refuse(exc.reason, str(exc))
            return
        if isinstance(result, NeedMore):
            self._want = result.at_least
            return
        if result.length != self._have:          # the parser asked for bytes past its header
            self._refuse(MALFORMED, f"internal error: read {self._have} bytes for a "
                                    f"{result.length}-byte PROXY protocol header")
            return
        self._settle()
        self.transport.pause_reading()
        self.gate.hand_on(self, result)

    def eof_received(self) -> bool:
        self._refuse(CLOSED, "closed before its PROXY protocol header was complete")
        return False

    def connection_lost(self, exc) -> None:
        if not self._done:
            self._refuse(CLOSED, f"closed before its PROXY protocol header was complete"
                                 f"{f' ({exc})' if exc else ''}")

    def close(self) -> None:
        """Shutdown: close without counting a refusal."""
        self._settle()
        if self.transport is not None:
            self.transport.close()

    def _settle(self) -> None:
        self._done = True
        self.gate.pending.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _refuse(self, reason: str, text: str) -> None:
        if self._done:
            return
        self._settle()
        self.gate.refused(self.listener, self.peer, reason, text)
        if self.transport is not None:
            self.transport.close()


async def serve_proxied(gate: HeaderGate, listener: str, handler, sock, backlog: int) -> asyncio.Server:
    """``serve_relays`` for a PROXY protocol listener: plain TCP, the header first (see module doc)."""
    arena = loop_read_arena()
    loop = asyncio.get_running_loop()

    def endpoint() -> Endpoint:
        return Endpoint(arena, "client", handler)

    return await loop.create_server(lambda: HeaderReader(gate, listener, endpoint), sock=sock,
                                    backlog=backlog)
