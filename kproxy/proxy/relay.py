"""One proxied connection: a client socket, an upstream socket, two pumps.

With ``server.py``, the only code that touches sockets. Client bytes are
forwarded as soon as they are read; broker bytes go through the tracker's
``relay_broker``, which passes everything on at once except responses that
may carry broker addresses, which it holds until complete and rewrites.
Events reach observers *after* the bytes are on their way; an observer that
raises is logged once and otherwise ignored: observation never breaks
forwarding. When the tracker cannot follow the stream safely (a request whose
answer it cannot predict, a response out of order) it raises before those
bytes are forwarded, and the connection closes.

A client that half-closes (shuts down its sending side) after its last request
still gets the answers it is owed, as it would from Kafka: the broker gets the
half-close too, and the connection closes once nothing is in flight.

Backpressure: each pump awaits ``drain()`` after writing, so it stops
reading its side while the other side's write buffer is above
``WRITE_HIGH_WATER``. Memory per connection is bounded by that plus the
tracker's copy of the frame in progress in each direction (kept whole so
observers can decode it), i.e. at most ``max_frame_size`` per direction; a
streaming header walk for large pass-through frames would lower that.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from ..protocol.connection import DEFAULT_MAX_FRAME_SIZE, Connection, Event, ProtocolViolation, ResponseReceived
from .tls import certificate_subject

log = logging.getLogger("kproxy.relay")

READ_CHUNK = 256 * 1024          # one read per wake-up; fetch responses are often this big
WRITE_HIGH_WATER = 1024 * 1024   # stop reading the other side above this much unsent data

HostPort = tuple[str, int]
Observer = Callable[["ConnectionInfo", Iterable[Event]], None]
_ids = itertools.count(1)


class RewriteFailed(Exception):
    """A response that must be rewritten could not be: the connection closes rather than leak."""


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """Who is talking: what observers need to attribute events."""
    id: int
    client: HostPort
    listener: str                 # "bootstrap" or "broker-<node id>"
    upstream: HostPort
    node_id: int | None           # upstream node, when the listener is a broker's
    opened: float | None = None   # wall clock (time.time()) when kproxy accepted the client
    principal: str | None = None  # the client certificate's subject, when TLS verified one


@dataclass
class RelayPolicy:
    """What every connection accepted on one listener shares."""
    name: str
    node_id: int | None
    upstreams: Callable[[], Sequence[HostPort]]          # candidates, tried in order
    observers: list[Observer]
    hold: Callable[[int, int], bool] | None = None
    transform: Callable[[ResponseReceived], bytes | None] | None = None
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    connect_timeout: float = 10.0
    upstream_ssl: ssl.SSLContext | None = None
    upstream_check_hostname: bool = True


@dataclass(eq=False)
class Relay:
    """Live state of one proxied connection (for limits, idle reaping and shutdown)."""
    info: ConnectionInfo | None = None
    # Wall clock when the client was accepted (after its TLS handshake, if any): the
    # handler that accepts a client makes its Relay at once.
    opened: float = field(default_factory=time.time)
    tracker: Connection | None = None
    last_active: float = field(default_factory=time.monotonic)
    task: asyncio.Task | None = None
    bytes_from_client: int = 0
    bytes_from_broker: int = 0
    bytes_to_client: int = 0           # differs from bytes_from_broker where responses were rewritten
    client_done_sending: bool = False  # the client half-closed: deliver what is in flight, then close
    close_reason: str | None = None
    writers: list = field(default_factory=list)

    @property
    def in_flight(self) -> int:
        return self.tracker.in_flight if self.tracker is not None else 0

    def stop_reading_requests(self) -> None:
        """Shutdown has begun: take no new requests from the client; answers still flow."""
        if self.writers:
            self.writers[0].transport.pause_reading()

    def close(self, reason: str) -> None:
        """Close both sockets now (idle timeout, shutdown, limits)."""
        if self.close_reason is None:
            self.close_reason = reason
        for writer in self.writers:
            writer.close()
        if self.task is not None:
            self.task.cancel()


_failed_observers: set[int] = set()


def notify_hook(observers: list, hook: str, *args, **kwargs) -> None:
    """Call an optional lifecycle hook (``connection_opened``, ``connection_closed``,
    ``connection_refused``) on every observer that has it; failures isolated like events."""
    for observer in observers:
        method = getattr(observer, hook, None)
        if method is None:
            continue
        try:
            method(*args, **kwargs)
        except Exception:                        # noqa: BLE001 - isolation is the point
            if id(observer) not in _failed_observers:
                _failed_observers.add(id(observer))
                log.exception("observer %r failed in %s; its further failures are not logged",
                              observer, hook)


def _notify(observers: list[Observer], info: ConnectionInfo, events: list[Event]) -> None:
    for observer in observers:
        try:
            observer(info, events)
        except Exception:                        # noqa: BLE001 - isolation is the point
            if id(observer) not in _failed_observers:
                _failed_observers.add(id(observer))
                log.exception("observer %r failed; its further failures are not logged", observer)


async def _client_to_broker(relay: Relay, reader, writer, observers) -> str:
    tracker = relay.tracker
    while True:
        data = await reader.read(READ_CHUNK)
        if not data:
            relay.client_done_sending = True
            if writer.can_write_eof():
                writer.write_eof()
            return "client closed"
        try:
            # Framed before forwarding (cheap: decoding is lazy) so that an oversized or
            # negative size prefix, or a request whose answer cannot be predicted, closes
            # the connection before the broker sees any of it.
            events = tracker.receive_client(data)
        except ProtocolViolation as exc:
            relay.writers[0].write(getattr(exc, "reply", b""))   # e.g. a TLS alert: say why
            return str(exc)
        writer.write(data)
        relay.bytes_from_client += len(data)
        relay.last_active = time.monotonic()
        if events:
            _notify(observers, relay.info, events)
        await writer.drain()


async def _broker_to_client(relay: Relay, reader, writer, observers) -> str:
    tracker = relay.tracker
    while True:
        data = await reader.read(READ_CHUNK)
        if not data:
            return "broker closed"
        relay.bytes_from_broker += len(data)
        relay.last_active = time.monotonic()
        try:
            events, out = tracker.relay_broker(data)
        except ProtocolViolation as exc:
            return str(exc)
        except RewriteFailed as exc:
            return f"rewrite failed, closing rather than leak an address: {exc}"
        if len(out) == 1:
            writer.write(out[0])
            relay.bytes_to_client += len(out[0])
        elif out:
            writer.writelines(out)
            relay.bytes_to_client += sum(len(chunk) for chunk in out)
        if events:
            _notify(observers, relay.info, events)
        await writer.drain()
        if relay.client_done_sending and not tracker.in_flight:
            return "client closed, its answers delivered"


async def _connect(policy: RelayPolicy) -> tuple[HostPort, asyncio.StreamReader, asyncio.StreamWriter]:
    errors = []
    for host, port in policy.upstreams():
        try:
            kwargs = {}
            if policy.upstream_ssl is not None:
                kwargs = {"ssl": policy.upstream_ssl,
                          "server_hostname": host if policy.upstream_check_hostname else None}
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, **kwargs),
                                                    policy.connect_timeout)
            return (host, port), reader, writer
        except (OSError, asyncio.TimeoutError, ssl.SSLError) as exc:
            errors.append(f"{host}:{port}: {str(exc) or type(exc).__name__}")   # timeouts have no text
    raise ConnectionError("; ".join(errors) or "no upstream address known")


async def run_relay(relay: Relay, policy: RelayPolicy, client_reader, client_writer) -> None:
    """Serve one accepted client connection until either side closes."""
    peer = client_writer.get_extra_info("peername") or ("?", 0)
    peer = (peer[0], peer[1])
    relay.writers.append(client_writer)
    try:
        upstream, broker_reader, broker_writer = await _connect(policy)
    except ConnectionError as exc:
        log.warning("conn client=%s:%d listener=%s upstream unreachable: %s",
                    *peer, policy.name, exc)
        notify_hook(policy.observers, "connection_refused", policy.name, "upstream unreachable")
        client_writer.close()
        return
    except asyncio.CancelledError:
        # Closed (shutdown, idle) while still connecting. End normally: a connection
        # handler that ends cancelled makes asyncio log a traceback as an error.
        log.info("conn client=%s:%d listener=%s closed while connecting upstream: %s",
                 *peer, policy.name, relay.close_reason or "cancelled")
        client_writer.close()
        return
    relay.writers.append(broker_writer)
    gone = next((side for side, w in (("client", client_writer), ("broker", broker_writer))
                 if w.transport.is_closing()), None)
    if gone is not None:
        # Typically a client that connected and reset at once, while kproxy was still
        # connecting upstream: its transport is already closed and cannot be set up.
        log.info("conn client=%s:%d listener=%s upstream=%s:%d %s closed while connecting upstream",
                 *peer, policy.name, *upstream, gone)
        for w in relay.writers:
            w.close()
        return
    relay.info = ConnectionInfo(next(_ids), peer, policy.name, upstream, policy.node_id, relay.opened,
                                certificate_subject(client_writer.get_extra_info("peercert")))
    relay.tracker = Connection(max_frame_size=policy.max_frame_size, hold=policy.hold,
                               transform=policy.transform)
    for w in (client_writer, broker_writer):
        w.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
    log.info("conn=%d open client=%s:%d listener=%s upstream=%s:%d",
             relay.info.id, *peer, policy.name, *upstream)
    notify_hook(policy.observers, "connection_opened", relay.info)
    client_pump = asyncio.create_task(_client_to_broker(relay, client_reader, broker_writer, policy.observers))
    broker_pump = asyncio.create_task(_broker_to_client(relay, broker_reader, client_writer, policy.observers))
    reason = "cancelled"
    try:
        done, _ = await asyncio.wait((client_pump, broker_pump), return_when=asyncio.FIRST_COMPLETED)
        if broker_pump not in done and relay.client_done_sending and relay.in_flight:
            reason = await broker_pump           # half-closed: the answers still come
        else:
            reason = next(iter(done)).result()
    except asyncio.CancelledError:
        reason = relay.close_reason or "cancelled"
    except (ConnectionError, OSError, ssl.SSLError) as exc:
        reason = f"socket error: {exc}"
    finally:
        for task in (client_pump, broker_pump):
            task.cancel()
        for w in relay.writers:
            w.close()
        reason = relay.close_reason or reason
        log.info("conn=%d close client=%s:%d reason=%s bytes_client_to_broker=%d "
                 "bytes_broker_to_client=%d bytes_to_client=%d in_flight=%d",
                 relay.info.id, *peer, reason, relay.bytes_from_client,
                 relay.bytes_from_broker, relay.bytes_to_client, relay.in_flight)
        notify_hook(policy.observers, "connection_closed", relay.info, reason=reason,
                    in_flight=relay.in_flight)


async def start_relay(listen: HostPort, upstream: HostPort, observers: Iterable[Observer] = (),
                      max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> asyncio.Server:
    """A plain observing relay to one upstream: no rewriting (for tools and tests)."""
    policy = RelayPolicy("relay", None, lambda: [upstream], list(observers),
                         max_frame_size=max_frame_size)

    async def handle(reader, writer):
        await run_relay(Relay(), policy, reader, writer)

    return await asyncio.start_server(handle, *listen)
