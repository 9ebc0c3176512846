"""One proxied connection: a client socket, an upstream socket, two protocols.

With ``server.py`` (and ``proxy_protocol.py``, which reads a PROXY protocol header before
a connection becomes an ``Endpoint``), the only code that touches sockets. Each socket is an
``Endpoint`` (an ``asyncio.BufferedProtocol``): the event loop reads straight
into a ``ReadArena`` that all connections of an event loop share (or, for the
rest of a large frame, into the buffer the tracker assembles it in: the arena
buffer its first bytes landed in, when it fits there), and the bytes go from
there to the tracker and, uncopied, to the other socket's transport.
Client bytes are forwarded as soon as they are read; broker bytes go through
the tracker's ``relay_broker``, which passes everything on at once except
responses that may carry broker addresses, which it holds until complete and
rewrites (but for a Fetch answer's records, which pass as they arrive unless a
partition names a new leader: ``protocol.fetch_cut``). Events reach observers *after* the bytes are on their way; an
observer that raises is logged once and otherwise ignored: observation never
breaks forwarding. When the tracker cannot follow the stream safely (a request
whose answer it cannot predict, a response out of order) it raises before those
bytes are forwarded, and the connection closes.

A client that half-closes (shuts down its sending side) after its last request
still gets the answers it is owed, as it would from Kafka: the broker gets the
half-close too, and the connection closes once nothing is in flight. Not over
TLS: asyncio's (and uvloop's) TLS transport closes once the client's
close_notify or EOF arrives, whatever ``eof_received`` answers, so a TLS client's
half-close ends the connection there (what was written to it is still flushed;
answers the broker has yet to give are not delivered).

Backpressure is explicit: when one side's transport holds more than
``WRITE_HIGH_WATER`` unsent bytes, the loop calls that side's
``pause_writing`` and kproxy stops reading the *other* side, until the buffer
is below ``WRITE_LOW_WATER``. Memory per connection is bounded by that plus the
tracker's copy of the frame in progress in each direction, kept whole so
observers can decode it: frames of ``STREAM_FRAME_BYTES`` and up are not kept
(only their header) unless an address-bearing answer or an observer that asks
for bodies (``needs_bodies``) needs them whole, so what is kept is at most that
much per direction, or ``max_frame_size`` when needed. All connections'
incomplete frames together are bounded by the ``BufferBudget`` (beyond it the
sides holding them are no longer read, all but one); a frame assembled in a buffer
allocated whole is counted when it begins (the rest of that buffer as reserved, at most
a quarter of the budget) and when it ends, not per read: pausing the reads that fill
it would free nothing. Such a buffer is at most twice the frame, and a piece of a frame
kept as a view of a read buffer more than twice its size is copied instead, so a partial
frame costs at most about twice its bytes. Answers written towards clients and not yet
taken count against the same budget (``unsent.py``): past it, every connection holding some
has its broker read again only once its client has taken them all, and brokers are read
``OVER_BUDGET_READ_BYTES`` at a time meanwhile. An idle connection holds
no read buffer at all (the arena is the event loop's). One client cannot monopolize the
loop either: a read takes at most ``PIPELINED_READ_BYTES`` of requests not begun yet, it is
not read with ``MAX_IN_FLIGHT_PER_CONNECTION`` requests unanswered, its answers are read a
little at a time once they come by the thousand, and events too many to observe at once
wait, with both sockets unread, in the loop's ``FairShare`` (``fairness.py``), which
gives all such connections together a bounded step (in number and in time) per turn.

The arena and the budget are in ``memory`` (one of each per event loop).

Every connection ends in ``Relay.finish`` (the one close path), which records
the first cause given (a ``CloseCause``: what is counted, what is logged);
``run_relay`` then logs it and tells the observers.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from ..protocol.connection import STREAM_FRAME_BYTES, Connection
from ..protocol.errors import PassedAnswerChanged, ProtocolViolation
from ..protocol.events import Event, ResponseReceived
from ..protocol.framer import DEFAULT_MAX_FRAME_SIZE
from .local_requests import ClientSplit, LocalAnswers, LocalRequest
from ..observers.contract import (BROKER_CLOSED, CANCELLED, CLIENT_CLOSED, CLIENT_DONE, UPSTREAM_UNREACHABLE,
                                  CloseCause, CloseKind, ConnectionInfo, Hook, HostPort, Observer)
from .event_routes import EventRoutes
from .log_budget import LogBudget
from .fairness import FairShare, loop_fair_share
from .memory import OVER_BUDGET_READ_BYTES, READ_CHUNK, BufferBudget, ReadArena, loop_buffer_budget, loop_read_arena
from .tls import certificate_subject
from .unsent import UnsentAnswers
from . import worker_identity

log = logging.getLogger("kproxy.relay")

WRITE_HIGH_WATER = 1024 * 1024   # stop reading the other side above this much unsent data
WRITE_LOW_WATER = WRITE_HIGH_WATER // 4   # ... and start again below this
# Kafka reads one request per connection at a time and answers in order; clients keep a
# handful in flight (the Java client 5 by default). A client with more unanswered is
# pipelining blindly: kproxy stops reading it until answers bring it below this, which
# bounds the tracker's queue and the work one client can line up.
MAX_IN_FLIGHT_PER_CONNECTION = 1000
# Events of one read handed to observers at once. More (one read of thousands of tiny
# pipelined requests) wait in the loop's ``FairShare`` (fairness.py), which gives all such
# connections together a bounded step per turn of the event loop, so other connections,
# scrapes and health checks run in between; neither side is read until they are observed.
OBSERVER_EVENTS_PER_CHECK = 8
# A closed connection's events still waiting are observed in turn for up to this long
# (one read's worth takes a few turns; a flood of closing connections, a queue's worth).
CLOSE_OBSERVE_S = 5.0
# Room a client's read is offered beyond the rest of the request in progress: what a read
# may bring of requests not begun yet, at most ~600 minimal ones (14 bytes each).
# Beyond the cap on requests in flight, a connection holds at most this many more, and no
# read of 1 MiB of tiny requests (50,000 of them) lands at once; a large request's rest is
# still read a READ_CHUNK at a time.
PIPELINED_READ_BYTES = 8 * 1024
# A request must be complete this long after its first byte arrived, else the connection
# closes (a trickle of bytes would otherwise keep it open forever: every byte is
# activity). Generous: a 100 MiB frame at 1 MB/s fits; clients time out requests after
# 30 s by default anyway.
REQUEST_DEADLINE_S = 120.0


UNREACHABLE_LOG_INTERVAL_S = 60.0
UNREACHABLE_LOG_CAUSES_PER_INTERVAL = 5


class RewriteFailed(Exception):
    """A response that must be rewritten could not be: the connection closes rather than leak."""


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
    stream_frame_bytes: int | None = STREAM_FRAME_BYTES   # None: keep every frame whole
    connect_timeout: float = 10.0
    routes: EventRoutes | None = field(default=None, repr=False)     # see listener_routes
    # The context for a new upstream connection (the newest, as TLS files are reloaded); None: plaintext.
    upstream_ssl: Callable[[], ssl.SSLContext | None] | None = None
    upstream_check_hostname: bool = True
    unreachable_log: LogBudget = field(default_factory=lambda: unreachable_log_budget())
    # A connection's answerers of requests kproxy answers itself, never forwarded (telemetry
    # offer, enforced policy rules: local_requests.py); None: all are forwarded.
    local_answers: Callable[[], Sequence[LocalAnswers]] | None = None


def bodies_needed(observers: Iterable[Observer]) -> Callable[[], bool]:
    """Whether any observer needs whole frames now: those that may say so with a
    ``needs_bodies()`` method (capture while it runs, the live view while watched);
    the tracker asks when a large frame starts. One that raises is taken as yes."""
    hooks = [hook for hook in (getattr(o, "needs_bodies", None) for o in observers) if callable(hook)]

    def needed() -> bool:
        try:
            return any(hook() for hook in hooks)
        except Exception:                        # noqa: BLE001 - keeping frames whole is the safe side
            return True
    return needed


def listener_routes(policy: RelayPolicy) -> EventRoutes:
    """Which of a listener's observers take which events: shared by its connections, found
    again if its list of observers changed."""
    routes = policy.routes
    if routes is None or routes.given != policy.observers:
        routes = policy.routes = EventRoutes(policy.observers)
    return routes


def unreachable_log_budget() -> LogBudget:
    """An upstream that is down fails every client's connect (hundreds a second in an
    outage): each cause (address and error) is logged once a minute, at most five causes a
    minute; the rest are counted in the next line and in
    kproxy_connections_closed_total{reason="upstream_unreachable"}."""
    return LogBudget(UNREACHABLE_LOG_INTERVAL_S, UNREACHABLE_LOG_CAUSES_PER_INTERVAL)


class Endpoint(asyncio.BufferedProtocol):
    """One socket of a proxied connection (the client's or the broker's)."""

    # Set (on the instance) by a PROXY protocol listener whose header named the client:
    # its address, and the peer that sent the header. Class defaults: nothing per connection.
    client_address: HostPort | None = None
    via: HostPort | None = None

    def __init__(self, arena: ReadArena, side: str, on_accept=None):
        self.arena = arena
        self.side = side                         # "client" or "broker"
        self.relay: Relay | None = None          # set once both sockets are up
        self.transport: asyncio.Transport | None = None
        self.peer: Endpoint | None = None        # the other socket, once linked
        self.task: asyncio.Task | None = None    # the accepted client's handler
        self.lost = False
        self._on_accept = on_accept
        self._room: memoryview | None = None
        self._in_place = False                   # that room is the tracker's, not the arena's
        self._in_held = False                    # ... the rest of an answer held until whole
        self._held_room: memoryview | None = None     # that room, whole (not cut to read_limit)
        self._held_rest: memoryview | None = None     # what of it the next read may fill
        self._broker_side = side == "broker"
        # Most bytes one read may take (a client's: see PIPELINED_READ_BYTES).
        self.read_limit = PIPELINED_READ_BYTES if side == "client" else READ_CHUNK
        self._paused_for: set[str] = set()
        self.held = 0                            # bytes of this side's incomplete frame (for the budget)
        self.reserved = 0                        # bytes allocated for it that have not arrived
        self._early: list[bytes] = []            # client bytes read before the relay was linked
        self._early_eof = False

    # ------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport) -> None:
        self.transport = transport
        if self._paused_for:       # read before this call (TLS started after a PROXY header)
            transport.pause_reading()
        if self._on_accept is not None:
            self.task = asyncio.get_running_loop().create_task(self._on_accept(self))

    def get_buffer(self, sizehint: int) -> memoryview:
        room = self._held_rest
        if room is not None:                     # the rest of the held answer the last read filled
            self._held_rest = None
            self._held_room = room
            if len(room) > self.read_limit:
                room = room[:self.read_limit]
            self._room = room
            return room
        # A large frame being assembled takes the read in place; else the arena does.
        relay = self.relay
        tracker = relay.tracker if relay is not None else None     # None once closed
        room = tracker.room(self.side) if tracker is not None else None
        self._in_place = room is not None
        # Most reads of a large answer land in a held one: see buffer_updated.
        self._in_held = room is not None and self._broker_side and tracker.holding_answer
        if self._in_held:
            self._held_room = room
        limit = self.read_limit
        budget = relay.budget if relay is not None else None
        if room is None and self.side == "broker" and budget is not None and budget.over_with_answers():
            # Not the shared arena: uvloop keeps what a client has not taken as a view of the
            # buffer it was read into, and one such view keeps a whole arena buffer alive.
            limit = OVER_BUDGET_READ_BYTES
            room = memoryview(bytearray(limit))
            self._in_place = True                # not the arena's to account for
        if room is None:
            room = self.arena.room()
        if len(room) > limit:
            room = room[:limit]
        self._room = room
        return room

    def buffer_updated(self, nbytes: int) -> None:
        if self._in_held:
            if self.relay.filled_held_answer(nbytes):
                # Counted: nothing to forward, observe or budget; the next read lands right after.
                self._room = None
                self._held_rest = self._held_room[nbytes:]
                return
            self._held_room = None               # a view keeps the arena from reusing its buffer
        data = self._room[:nbytes]
        self._room = None
        if not self._in_place:
            self.arena.filled(nbytes)
        relay = self.relay
        if relay is None:                        # still connecting upstream: keep it, stop reading
            self._early.append(bytes(data))
            self.pause("connecting")
            return
        relay.received(self, data)

    def eof_received(self) -> bool:
        # A TLS transport cannot stay open for writing (it closes, and warns if told to):
        # its half-close is a close.
        half_close = self.transport.get_extra_info("ssl_object") is None
        if self.relay is None:
            self._early_eof = True
            return half_close
        return self.relay.eof(self, half_close)

    def connection_lost(self, exc) -> None:
        self.lost = True
        self._room = self._held_room = self._held_rest = None
        if self.relay is not None:
            self.relay.finish(CloseCause(CloseKind.SOCKET_ERROR, f"socket error: {exc}") if exc
                              else CLIENT_CLOSED if self.side == "client" else BROKER_CLOSED)

    def pause_writing(self) -> None:
        if self.peer is not None:
            self.peer.pause("backpressure")

    def resume_writing(self) -> None:
        relay = self.relay
        if relay is not None and relay.budget is not None and self in relay.budget.unsent.squeezed:
            relay.budget.unsent.drained(self)    # squeezed: resumed only once all was sent
            self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
        if self.peer is not None:
            self.peer.resume("backpressure")

    # ------------------------------------------------------------ for the relay and server

    def pause(self, why: str) -> None:
        """Stop reading this socket (until every reason given is withdrawn)."""
        if not self._paused_for and self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
        self._paused_for.add(why)

    def resume(self, why: str) -> None:
        if why not in self._paused_for:
            return
        self._paused_for.discard(why)
        if not self._paused_for and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def get_extra_info(self, name: str, default=None):
        return self.transport.get_extra_info(name, default) if self.transport is not None else default

    def closing(self) -> bool:
        return self.lost or self.transport is None or self.transport.is_closing()

    def close(self) -> None:
        """Close gracefully: what is already written is still sent."""
        if self.transport is not None:
            self.transport.close()

    def link(self, relay: "Relay", peer: "Endpoint") -> None:
        """Both sockets are up: from now on bytes go to ``relay`` (early ones first)."""
        self.relay, self.peer = relay, peer
        early, self._early = self._early, []
        for data in early:
            if relay.close_reason is not None:
                return
            relay.received(self, data)
        if self._early_eof and relay.close_reason is None and not relay.eof(
                self, self.transport.get_extra_info("ssl_object") is None):
            self.close()
        self.resume("connecting")


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
    close_reason: CloseCause | None = None
    client: Endpoint | None = None
    broker: Endpoint | None = None
    observers: list = field(default_factory=list)
    routes: EventRoutes | None = None    # which of them take which events (None: all take all)
    done: asyncio.Future | None = None   # set by finish(); run_relay waits on it
    # Events not yet given to observers (more than a step's worth came at once), in order.
    _unobserved: deque | None = field(default=None, repr=False)
    _all_observed: asyncio.Future | None = field(default=None, repr=False)   # set once _unobserved empties
    _request_deadline: asyncio.TimerHandle | None = field(default=None, repr=False)
    budget: BufferBudget | None = None
    share: FairShare | None = None       # where events too many to observe at once wait
    # Requests kproxy answers itself (policy.local_answers): the client's bytes split, what
    # waits behind a local request for earlier answers, local pairs not yet observed.
    split: ClientSplit | None = None
    _backlog: deque | None = field(default=None, repr=False)
    _answered: list = field(default_factory=list, repr=False)

    @property
    def in_flight(self) -> int:
        return self.tracker.in_flight if self.tracker is not None else 0

    def stop_reading_requests(self) -> None:
        """Shutdown has begun: take no new requests from the client; answers still flow."""
        if self.client is not None:
            self.client.pause("shutting down")

    def close(self, reason: CloseCause) -> None:
        """Close both sockets now (idle timeout, shutdown, limits)."""
        self.finish(reason)
        if self.done is None and self.task is not None:
            self.task.cancel()                   # still connecting upstream

    def finish(self, reason: CloseCause) -> None:
        """The one place a connection ends: keep the first reason, close both sockets
        (gracefully: bytes already written are still sent), wake ``run_relay``."""
        if self.close_reason is None:
            self.close_reason = reason
        if self._request_deadline is not None:
            self._request_deadline.cancel()
            self._request_deadline = None
        for endpoint in (self.client, self.broker):
            if endpoint is not None:
                endpoint.close()
                if self.budget is not None:
                    self.budget.forget(endpoint)
        if self.done is not None and not self.done.done():
            self.done.set_result(None)

    # ------------------------------------------------------------ bytes (called by Endpoint)

    def filled_held_answer(self, nbytes: int) -> bool:
        """Bytes read into the held answer's room (``Endpoint.get_buffer``): True when they did
        not complete it, and are only counted (what ``received`` would do with them, in a few
        steps: a 1 MiB answer takes ~10 reads); False: give them to ``received``."""
        tracker = self.tracker
        if self.close_reason is not None or not tracker.filled_held_answer(nbytes):
            return False
        self.bytes_from_broker += nbytes
        self.last_active = time.monotonic()
        passing = tracker.passing()              # a Fetch answer's records, as they come
        if passing is not None:
            self._pass(passing)
        return True

    def _pass(self, passing: memoryview) -> None:
        """Forward what of a held answer may go before it is complete: a view of the buffer it
        is assembled in, which the budget counts as held until the answer completes (and then
        as unsent, if the client has not taken it all)."""
        self.client.transport.write(passing)
        self.bytes_to_client += len(passing)

    def received(self, endpoint: Endpoint, data: memoryview) -> None:
        if self.close_reason is not None:
            return
        try:
            if endpoint is self.client:
                filled = self._from_client(data)
            else:
                filled = self._from_broker(data)
            # A read that only filled a frame assembled in a buffer allocated whole changes
            # nothing the budget counts: it counted the frame (the rest as reserved) when it
            # began, and hears of it again when it completes; pausing such reads frees nothing.
            if self.close_reason is None and not filled:
                held, reserved = self.tracker.holding(endpoint.side)
                if held != endpoint.held:
                    self.budget.update(endpoint, held)
                if reserved != endpoint.reserved:
                    endpoint.reserved = reserved
                    self.budget.reserve(endpoint, reserved)
        except Exception as exc:                 # noqa: BLE001 - a bug must close one connection, not the loop
            log.exception("conn=%d relaying failed", self.info.id if self.info else 0)
            self.finish(CloseCause(CloseKind.OTHER, f"internal error: {type(exc).__name__}: {exc}"))

    def _from_client(self, data: memoryview) -> bool:
        """Forward a read from the client; True when it only filled the large request being
        assembled in place (no frame ends: nothing to observe, no deadline to change)."""
        tracker = self.tracker
        filled = tracker.fills_request(data)
        if not filled:
            try:
                # Framed before forwarding (cheap: decoding is lazy) so that an oversized or
                # negative size prefix, or a request whose answer cannot be predicted, closes
                # the connection before the broker sees any of it.
                events = tracker.receive_client(data)
            except ProtocolViolation as exc:
                self._close_for_violation(exc)
                return False
        if self.split is None:
            self.broker.transport.write(data)
        else:
            self._to_broker(self.split.split(data, () if filled else events))
        self.bytes_from_client += len(data)
        self.last_active = time.monotonic()
        client = self.client
        client.read_limit = min(READ_CHUNK, tracker.client_missing + PIPELINED_READ_BYTES)
        if filled:
            return True
        if tracker.in_flight >= MAX_IN_FLIGHT_PER_CONNECTION:
            client.pause("requests in flight")
        partial = tracker.client_partial
        if self._request_deadline is not None and (events or not partial):
            self._request_deadline.cancel()
            self._request_deadline = None
        if partial and self._request_deadline is None:
            self._request_deadline = asyncio.get_running_loop().call_later(
                REQUEST_DEADLINE_S, self.finish, CloseCause(
                    CloseKind.REQUEST_DEADLINE, f"request not complete {REQUEST_DEADLINE_S:g}s after its first byte"))
        if events:
            self._observe(events)
        if self._answered:
            self._observe_answered()
        return False

    def _to_client(self, out: list) -> None:
        """Write answers' bytes (views, never copied here) to the client, and count them."""
        transport = self.client.transport
        if len(out) == 1:
            transport.write(out[0])
            self.bytes_to_client += len(out[0])
        else:
            transport.writelines(out)
            self.bytes_to_client += sum(len(chunk) for chunk in out)
        self._count_unsent(out)

    def _close_for_violation(self, exc: ProtocolViolation) -> None:
        """The client broke the protocol: tell it why where there is a way (e.g. a TLS
        alert for a TLS hello on a plaintext port), then close."""
        reply = getattr(exc, "reply", b"")
        if reply:
            self.client.transport.write(reply)
        self.finish(CloseCause.of_violation(exc))

    @staticmethod
    def _pinned(out: list, unsent: int) -> int:
        """What answers a client has not taken keep alive: their bytes, or, when the last
        write was a view of a read buffer (uvloop keeps the view, not a copy), that whole
        buffer (an arena buffer is READ_CHUNK and more; shared ones are counted by each)."""
        if not unsent:
            return 0
        last = out[-1]
        return max(unsent, len(last.obj) if last.__class__ is memoryview else len(last))

    def _count_unsent(self, out: list) -> None:
        """Answers the client has not taken count against the buffer budget; past it, every
        connection holding some is squeezed (``unsent.py``)."""
        unsent = self.budget.unsent
        client = self.client
        if client in unsent.squeezed:
            return                               # paused until drained: counted then
        unsent.note(client, self._pinned(out, client.transport.get_write_buffer_size()))
        if not self.budget.over_with_answers():
            return
        for endpoint in unsent.holders():
            transport = endpoint.transport
            size = transport.get_write_buffer_size() if not endpoint.closing() else 0
            if size:                             # still counted as it was (what it keeps alive)
                unsent.squeeze(endpoint)
                # Paused now (its buffer is over the new high mark), resumed once empty:
                # kproxy reads its broker again only when its client has taken everything.
                transport.set_write_buffer_limits(high=0, low=0)
            else:
                unsent.drained(endpoint)

    # ------------------------------------------------------------ requests kproxy answers

    def _to_broker(self, pieces: list) -> None:
        """Client bytes to the broker, local requests answered, in order: a local request
        with earlier requests unanswered holds what follows it (``_backlog``) until they are."""
        for piece in pieces:
            if self._backlog is not None:
                self._backlog.append(piece)
            elif piece.__class__ is LocalRequest:
                if not piece.event.expects_response:
                    continue                     # kept from the broker; no answer is owed
                if self.tracker.oldest_unanswered() is not piece.event:
                    self._backlog = deque([piece])
                    self.client.pause("earlier answers first")
                    continue
                frame = piece.by.answer(self.info, piece.event)
                self._answered.append(self.tracker.answer_locally(piece.event, frame))
                self.client.transport.write(len(frame).to_bytes(4, "big") + frame)
                self.bytes_to_client += len(frame) + 4
            elif len(piece):
                self.broker.transport.write(piece)

    def _release(self) -> None:
        """Answers arrived: the local request waiting for them may be answered now."""
        head = self._backlog[0]
        if self.tracker.oldest_unanswered() is not head.event:
            return
        backlog, self._backlog = self._backlog, None
        self.client.resume("earlier answers first")
        self._to_broker(list(backlog))
        broker = self.broker.transport
        if self._backlog is None and self.client_done_sending and broker.can_write_eof():
            broker.write_eof()                   # the client's half-close, held back with the backlog

    def _observe_answered(self) -> None:
        answered, self._answered = self._answered, []
        self._observe(answered)

    def _from_broker(self, data: memoryview) -> bool:
        """Forward what of a read from the broker can go now; True when it only filled the
        held answer being assembled in place (nothing to forward or observe yet)."""
        self.bytes_from_broker += len(data)
        self.last_active = time.monotonic()
        tracker = self.tracker
        if tracker.fills_held_answer(data):
            passing = tracker.passing()
            if passing is not None:
                self._pass(passing)
            return True
        try:
            events, out = tracker.relay_broker(data)
        except PassedAnswerChanged as exc:
            self.finish(CloseCause(CloseKind.REWRITE_FAILED, f"closing rather than leak an address: {exc}"))
            return False
        except ProtocolViolation as exc:
            self.finish(CloseCause.of_violation(exc))
            return False
        except RewriteFailed as exc:
            self.finish(CloseCause(CloseKind.REWRITE_FAILED,
                                   f"rewrite failed, closing rather than leak an address: {exc}"))
            return False
        # A read that brought many answers is followed by small ones, until one brings few:
        # each answer costs work (pairing, maybe rewriting), and one read must not take the
        # loop (1 MiB of ApiVersions answers is 2,200 of them). Large answers still come a
        # READ_CHUNK at a time.
        self.broker.read_limit = PIPELINED_READ_BYTES if len(events) > OBSERVER_EVENTS_PER_CHECK else READ_CHUNK
        if out:
            self._to_client(out)
        if tracker.in_flight < MAX_IN_FLIGHT_PER_CONNECTION:
            self.client.resume("requests in flight")
        if events:
            self._observe(events)
        if self._backlog is not None:
            self._release()
            if self._answered:
                self._observe_answered()
        if self.client_done_sending and not tracker.in_flight:
            self.finish(CLIENT_DONE)
        return False

    def _observe(self, events: list) -> None:
        """Give events to the observers: at once if few, else in the loop's ``FairShare``,
        with neither socket read meanwhile (what waits is bounded by one read of each)."""
        if self._unobserved is None:
            if len(events) <= OBSERVER_EVENTS_PER_CHECK:
                routes = self.routes
                _notify(self.observers if routes is None else routes.to(events), self.info, events)
                return
            self._unobserved = deque(events)
            self.client.pause("observers catching up")
            self.broker.pause("observers catching up")
            self.share.defer(self)
        else:
            self._unobserved.extend(events)

    def step(self, most: int) -> bool:
        """Observe at most ``most`` waiting events (for the ``FairShare``); True while more wait."""
        unobserved = self._unobserved
        if unobserved is None:                   # closed meanwhile: observe_the_rest took them
            return False
        count = min(most, len(unobserved))
        batch = [unobserved.popleft() for _ in range(count)]
        _notify(self._observers_of(batch), self.info, batch)
        if unobserved:
            return True
        self._unobserved = None
        self.client.resume("observers catching up")
        self.broker.resume("observers catching up")
        if self._all_observed is not None and not self._all_observed.done():
            self._all_observed.set_result(None)
        return False

    async def observed_in_turn(self) -> None:
        """The connection ended: wait (at most ``CLOSE_OBSERVE_S``) while the ``FairShare``
        observes what still waits, rather than all at once (a client that pipelines, closes
        and comes back would get it done in one go each time)."""
        if not self._unobserved:
            return
        self._all_observed = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(asyncio.shield(self._all_observed), CLOSE_OBSERVE_S)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            pass                                 # observe_the_rest takes what is left

    def _observers_of(self, events: list) -> list:
        return self.observers if self.routes is None else self.routes.to(events)

    def observe_the_rest(self) -> None:
        """The connection ended: observers get every event before they hear of the close."""
        unobserved, self._unobserved = self._unobserved, None
        if unobserved:
            _notify(self.observers, self.info, list(unobserved))     # (rare: no routing)

    def eof(self, endpoint: Endpoint, half_close: bool = True) -> bool:
        """A side shut down its sending half; True keeps the socket open for writing
        (``half_close`` False: it cannot be, as over TLS)."""
        if self.close_reason is not None:
            return False
        if endpoint is self.broker:
            self.finish(BROKER_CLOSED)
            return False
        if not half_close:
            self.finish(CLIENT_CLOSED)
            return False
        self.client_done_sending = True
        broker = self.broker.transport
        if broker.can_write_eof() and self._backlog is None:    # else once the backlog is sent
            broker.write_eof()
        if not self.in_flight:
            self.finish(CLIENT_CLOSED)
            return False
        return True                              # answers still come


_failed_observers: set[int] = set()


def notify_hook(observers: list, hook: Hook, *args, **kwargs) -> None:
    """Call an optional lifecycle hook (see ``Hook``) on every observer that has it;
    failures isolated like events."""
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


async def _connect(policy: RelayPolicy, arena: ReadArena) -> tuple[HostPort, Endpoint]:
    loop = asyncio.get_running_loop()
    errors = []
    for host, port in policy.upstreams():
        try:
            kwargs = {}
            context = policy.upstream_ssl() if policy.upstream_ssl is not None else None
            if context is not None:
                kwargs = {"ssl": context,
                          "server_hostname": host if policy.upstream_check_hostname else None}
            _, endpoint = await asyncio.wait_for(
                loop.create_connection(lambda: Endpoint(arena, "broker"), host, port, **kwargs),
                policy.connect_timeout)
            return (host, port), endpoint
        except (OSError, asyncio.TimeoutError, ssl.SSLError) as exc:
            errors.append(f"{host}:{port}: {str(exc) or type(exc).__name__}")   # timeouts have no text
    raise ConnectionError("; ".join(errors) or "no upstream address known")


async def run_relay(relay: Relay, policy: RelayPolicy, client: Endpoint) -> None:
    """Serve one accepted client connection until either side closes."""
    via = client.via                     # a PROXY protocol header named the client: its sender
    peer = client.client_address or client.get_extra_info("peername") or ("?", 0)
    peer = (peer[0], peer[1])
    relay.client = client
    try:
        upstream, broker = await _connect(policy, client.arena)
    except ConnectionError as exc:
        unlogged = policy.unreachable_log.admit(str(exc))
        if unlogged is not None:
            log.warning("conn client=%s:%d listener=%s upstream unreachable: %s "
                        "(the same again within %gs is not logged%s)", *peer, policy.name, exc,
                        policy.unreachable_log.interval,
                        f"; {unlogged} earlier refusals were not logged" if unlogged else "")
        notify_hook(policy.observers, Hook.CONNECTION_REFUSED, policy.name, UPSTREAM_UNREACHABLE)
        client.close()
        return
    except asyncio.CancelledError:
        # Closed (shutdown, idle) while still connecting. End normally: a connection
        # handler that ends cancelled makes asyncio log a traceback as an error.
        log.info("conn client=%s:%d listener=%s closed while connecting upstream: %s",
                 *peer, policy.name, relay.close_reason or CANCELLED)
        client.close()
        return
    relay.broker = broker
    gone = next((e.side for e in (client, broker) if e.closing()), None)
    if gone is not None or relay.close_reason is not None:
        # Typically a client that connected and reset at once, while kproxy was still
        # connecting upstream: its transport is already closed and cannot be set up.
        log.info("conn client=%s:%d listener=%s upstream=%s:%d %s closed while connecting upstream",
                 *peer, policy.name, *upstream, gone or relay.close_reason)
        client.close()
        broker.close()
        return
    relay.info = ConnectionInfo(next(worker_identity.connection_ids), peer, policy.name, upstream,
                                policy.node_id, relay.opened,
                                certificate_subject(client.get_extra_info("peercert")), via)
    relay.budget = budget = loop_buffer_budget()
    relay.share = loop_fair_share()
    relay.routes = listener_routes(policy)     # the observers, each for the APIs it takes now
    arena = client.arena

    def assemble(nbytes: int, start) -> tuple[bytearray, int] | None:
        return arena.frame_buffer(nbytes, start) if budget.admits(nbytes) else None

    relay.tracker = Connection(max_frame_size=policy.max_frame_size, hold=policy.hold,
                               transform=policy.transform, stream_frame_bytes=policy.stream_frame_bytes,
                               keep_bodies=bodies_needed(policy.observers), assemble=assemble)
    # Those that take events (one with lifecycle hooks only says ``takes_events = False``).
    relay.observers = [o for o in policy.observers if getattr(o, "takes_events", True)]
    if policy.local_answers is not None:
        relay.split = ClientSplit(policy.local_answers(), relay.info)
    for endpoint in (client, broker):
        endpoint.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
    log.info("conn=%d open client=%s:%d%s listener=%s upstream=%s:%d",
             relay.info.id, *peer, "" if via is None else f" via={via[0]}:{via[1]}", policy.name, *upstream)
    notify_hook(policy.observers, Hook.CONNECTION_OPENED, relay.info)
    relay.done = asyncio.get_running_loop().create_future()
    broker.link(relay, client)
    client.link(relay, broker)
    try:
        await relay.done
    except asyncio.CancelledError:
        relay.finish(CANCELLED)
    finally:
        relay.finish(CANCELLED)                # a no-op unless something above raised
        await relay.observed_in_turn()
        relay.observe_the_rest()
        reason = relay.close_reason
        log.info("conn=%d close client=%s:%d reason=%s bytes_client_to_broker=%d "
                 "bytes_broker_to_client=%d bytes_to_client=%d in_flight=%d",
                 relay.info.id, *peer, reason, relay.bytes_from_client,
                 relay.bytes_from_broker, relay.bytes_to_client, relay.in_flight)
        notify_hook(policy.observers, Hook.CONNECTION_CLOSED, relay.info, reason=reason,
                    in_flight=relay.in_flight)
        # The relay and its endpoints refer to each other: without this the frames its
        # tracker holds would wait for a full garbage collection (2,000 closed
        # connections' half-frames, 265 MB, waited minutes).
        relay.tracker = None


async def serve_relays(handler: Callable[[Endpoint], object], sock=None, host=None, port=None,
                       ssl: ssl.SSLContext | None = None, backlog: int = 100) -> asyncio.Server:
    """``asyncio.start_server`` for relays: ``handler(client)`` runs as a task per accepted
    client, ``client`` being its ``Endpoint`` (reading paused until the relay links it)."""
    arena = loop_read_arena()
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: Endpoint(arena, "client", handler), host, port,
                                    sock=sock, ssl=ssl, backlog=backlog)


async def start_relay(listen: HostPort, upstream: HostPort, observers: Iterable[Observer] = (),
                      max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> asyncio.Server:
    """A plain observing relay to one upstream: no rewriting (for tools and tests)."""
    policy = RelayPolicy("relay", None, lambda: [upstream], list(observers),
                         max_frame_size=max_frame_size)

    async def handle(client):
        await run_relay(Relay(), policy, client)

    return await serve_relays(handle, host=listen[0], port=listen[1])
