"""The observer contract: what the proxy tells its observers, as types.

An observer is a callable ``observer(info, events)``, given each connection's codec
events (``protocol.events``) after their bytes were forwarded; ``info`` is the
connection's ``ConnectionInfo``. It may also define any of the ``Hook`` methods
(lifecycle), ``needs_bodies()`` (keep large frames whole for it now),
``takes_events = False`` (hooks only) and ``interest`` (an ``Interest``: the APIs whose
events it wants now; the relay calls it for no others). Failures are isolated: an observer
that raises is logged once and otherwise ignored.

A close is a ``CloseCause``: its ``kind`` is what is counted (the ``reason`` label of
``kproxy_connections_closed_total``), its ``text`` what is logged. Both are decided
where the connection ends, so rewording a log line cannot change a metric.

Imported by the proxy (which reports) and the observers (which listen); it imports
only the codec, so neither side reaches into the other.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Iterable

from ..protocol.errors import FrameTooLarge, ProtocolViolation, UnpairedResponse, UntrackableRequest
from ..protocol.events import Event
from ..protocol.sniff import WRONG_PROTOCOLS, WrongProtocol

HostPort = tuple[str, int]


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
    # The peer kproxy accepted (a load balancer) when a PROXY protocol header named the
    # client; ``client`` is then the header's source.
    via: HostPort | None = None


Observer = Callable[[ConnectionInfo, Iterable[Event]], None]


class Interest:
    """The API keys whose events an observer wants now (``None``: every event), kept by the
    observer as its needs change (a capture starts, a page opens). The relay skips calling an
    observer for events of other APIs, which it would only have looked at and ignored: an
    observer that is idle costs nothing per pair. A hint, not a filter: an observer may still
    be given other events (a batch that mixes APIs goes to every observer) and ignores them."""

    __slots__ = ("api_keys",)
    # Bumped by every change of any observer's interest: routes computed before are stale.
    # (One number for all: interests change a few times a minute, events thousands of times a second.)
    generation = 0

    def __init__(self, api_keys: frozenset[int] | None = None):
        self.api_keys = api_keys

    def set(self, api_keys: frozenset[int] | None) -> None:
        if api_keys != self.api_keys:
            self.api_keys = api_keys
            Interest.generation += 1

    def wants(self, api_key: int | None) -> bool:
        """``api_key`` None: an event of no single API (a SASL token, a malformed frame, a mix)."""
        return self.api_keys is None or api_key is None or api_key in self.api_keys


NO_EVENTS: frozenset[int] = frozenset()


class CloseKind(enum.Enum):
    """Why a connection ended, one member per ``reason`` label value (a fixed set, so
    every one can be exported at zero). The value is the label."""
    CLIENT_CLOSED = "client_closed"
    BROKER_CLOSED = "broker_closed"
    FRAME_TOO_LARGE = "frame_too_large"
    REWRITE_FAILED = "rewrite_failed"
    IDLE_TIMEOUT = "idle_timeout"
    SHUTDOWN = "shutdown"
    SOCKET_ERROR = "socket_error"
    UPSTREAM_UNREACHABLE = "upstream_unreachable"
    MAX_CONNECTIONS = "max_connections"
    FD_LIMIT = "fd_limit"
    REQUEST_DEADLINE = "request_deadline"
    UNTRACKABLE_REQUEST = "untrackable_request"
    UNPAIRED_RESPONSE = "unpaired_response"
    # The peer speaks another protocol: a misconfiguration, named in a WARNING. The values
    # are the codec's ``WRONG_PROTOCOLS`` causes (a test holds them equal).
    TLS_ON_PLAINTEXT_LISTENER = "tls_on_plaintext_listener"
    HTTP_ON_KAFKA_PORT = "http_on_kafka_port"
    UPSTREAM_SPEAKS_TLS = "upstream_speaks_tls"
    UPSTREAM_SPEAKS_HTTP = "upstream_speaks_http"
    PROXY_PROTOCOL = "proxy_protocol"     # refused for its PROXY protocol header (or its absence)
    OTHER = "other"                       # a bug (internal error), or cancelled without a cause

    @property
    def label(self) -> str:
        return self.value

    @property
    def misconfiguration(self) -> bool:
        """The client or the upstream is set up for another protocol (worth a WARNING)."""
        return self.value in WRONG_PROTOCOLS


@dataclass(frozen=True, slots=True)
class CloseCause:
    """Why one connection ended: ``kind`` for counting, ``text`` (a sentence with the
    particulars: sizes, errors, limits) for the log line."""
    kind: CloseKind
    text: str

    def __str__(self) -> str:
        return self.text

    @property
    def label(self) -> str:
        return self.kind.value

    @classmethod
    def of_violation(cls, exc: ProtocolViolation) -> CloseCause:
        """The cause of a close for a stream the codec could not follow."""
        if isinstance(exc, WrongProtocol):
            kind = CloseKind(exc.cause)
        else:
            kind = next((k for t, k in _VIOLATION_KINDS if isinstance(exc, t)), CloseKind.OTHER)
        return cls(kind, str(exc))


# Most specific first (WrongProtocol, handled above, is a FrameTooLarge too).
_VIOLATION_KINDS = ((FrameTooLarge, CloseKind.FRAME_TOO_LARGE),
                    (UntrackableRequest, CloseKind.UNTRACKABLE_REQUEST),
                    (UnpairedResponse, CloseKind.UNPAIRED_RESPONSE))

# The causes that carry no particulars: one value each.
CLIENT_CLOSED = CloseCause(CloseKind.CLIENT_CLOSED, "client closed")
CLIENT_DONE = CloseCause(CloseKind.CLIENT_CLOSED, "client closed, its answers delivered")
BROKER_CLOSED = CloseCause(CloseKind.BROKER_CLOSED, "broker closed")
SHUTTING_DOWN = CloseCause(CloseKind.SHUTDOWN, "shutting down")
UPSTREAM_UNREACHABLE = CloseCause(CloseKind.UPSTREAM_UNREACHABLE, "upstream unreachable")
CANCELLED = CloseCause(CloseKind.OTHER, "cancelled")


class Hook(enum.StrEnum):
    """The optional lifecycle methods an observer may define (the value is the method's
    name); the proxy calls each with the arguments noted, isolating failures like events.
    Events themselves go to ``observer(info, events)``."""
    CONNECTION_OPENED = "connection_opened"          # (info): relayed from now on
    # (info, reason: CloseCause, in_flight: int): after every event of the connection;
    # never without a connection_opened before it.
    CONNECTION_CLOSED = "connection_closed"
    # (listener: str, reason: CloseCause): accepted, then closed before it was relayed
    # (no connection_opened nor connection_closed for it).
    CONNECTION_REFUSED = "connection_refused"
    TLS_HANDSHAKE_FAILED = "tls_handshake_failed"    # (cause: str), one of tls_failures' causes
    LISTENER_BIND_FAILED = "listener_bind_failed"    # (listener: str, error: OSError)
    SNI_REFUSED = "sni_refused"                      # (reason: str), one of SNI_REFUSAL_REASONS
    PROXY_HEADER_REFUSED = "proxy_header_refused"    # (listener: str, reason: str)
    TLS_CERTIFICATE_LOADED = "tls_certificate_loaded"   # (side: str, not_after: float | None)
    TLS_RELOADED = "tls_reloaded"                    # (side: str, outcome: "success" | "failure")
