"""Sans-I/O tracking of one proxied Kafka connection.

Feed it the bytes each side sent, in the order the proxy saw them, in
chunks of any size::

    conn = Connection(clock=time.monotonic)
    for event in conn.receive_client(data): ...
    for event in conn.receive_broker(data): ...

It frames both byte streams, pairs each response with its request (Kafka
answers requests on a connection in order), knows that a Produce with
acks=0 gets no response, passes SASL v0 raw tokens through without ever
exposing them, and times each request with the clock it was given.

Pairing decides which responses are held for address rewriting, so it must
agree with the broker exactly. Whether a request is answered is read from
its bytes the way the broker reads them (``_broker_*`` below: padded
varints, Java int arithmetic), never with kproxy's strict codec; a request
it cannot be sure about, and a response that is not for the oldest
unanswered request, raise ``ProtocolViolation`` (the connection must close)
before any of their bytes are forwarded.

Events carry the raw frame and decode it only when asked (``.request`` /
``.response``), so the proxy can forward first and decode afterwards.
Decoding failures never raise here: they show up as ``decode_error``.
``.partial`` decodes only what observers read of Produce and Fetch (``skim``).

Frames of ``stream_frame_bytes`` and up can be streamed instead of kept whole:
the tracker reads what pairing needs from their header (a request's api key,
version, correlation id and, for Produce, acks; a response's correlation id),
keeps that, and only counts the rest. Their events say ``streamed`` and carry
no body. Responses ``hold`` selects are never streamed.
"""

from __future__ import annotations

import struct
import time
from collections import deque
from typing import Callable

from . import schema
from .api_keys import ApiKey
from .errors import DecodeError
from .fetch_cut import FIRST_FLEXIBLE_VERSION as _FETCH_CUT_FROM, FetchCut
from .messages import Request, Response, decode_request, decode_response
from .skim import SKIMMED_REQUESTS, SKIMMED_RESPONSES, skim_request, skim_response
from .tally import TALLIED as _TALLIED, tally_request, tally_response

# Kafka's own default for socket.request.max.bytes; a larger frame means a
# broken or hostile peer, and buffering it would let one connection eat memory.
DEFAULT_MAX_FRAME_SIZE = 100 * 1024 * 1024
# Frames at least this big are copied once, from the reads they arrived in (or not at
# all, when one read brought them whole) and forwarded without joining them to their
# size prefix; smaller ones are joined, which saves a write (and a TLS record).
ZERO_COPY_FRAME_BYTES = 64 * 1024
# Frames at least this big are streamed when nothing needs them whole (``Connection``'s
# ``stream_frame_bytes``; the relay passes this): only their header is kept, the rest is
# forwarded as it arrives. Far above ordinary traffic, which keeps its bodies for the
# observers: the Java producer's max.request.size is 1 MiB by default and a consumer's
# fetch answers are a few MiB (max.partition.fetch.bytes, 1 MiB per partition). A 96 MiB
# Produce (the frame limit is 100 MiB) then costs its header (tens of bytes), not 96 MiB.
STREAM_FRAME_BYTES = 16 * 1024 * 1024
# A streamed request's header (client_id, and a Produce's transactional_id and acks: two
# strings of at most 32 KiB) must end within this many bytes; one that does not (tagged
# fields in the header, say) is kept whole instead.
STREAM_HEAD_LIMIT = 64 * 1024 + 64
SIZE = struct.Struct(">i")
_REQUEST_PREFIX = struct.Struct(">hhi")
_I16 = struct.Struct(">h")

_UNREAD = object()              # an event's tally before it is read (None: it has none)
_CORRELATION_END = 8            # size prefix and correlation id: what pairing needs of a response
# Compared per frame: plain int globals (an ApiKey attribute lookup costs ~4 global
# reads, and an int compares with an int faster than with an IntEnum member).
_PRODUCE, _FETCH, _SASL_HANDSHAKE = int(ApiKey.PRODUCE), int(ApiKey.FETCH), int(ApiKey.SASL_HANDSHAKE)
# Client tokens per SASL exchange when SaslHandshake v0 put the connection in
# raw-token mode (no SaslAuthenticate framing): the broker answers each one.
RAW_SASL_ROUNDS = {"PLAIN": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2, "OAUTHBEARER": 1}
# The broker (Kafka 4.x) refuses a struct claiming more tagged fields than this
# (3.x accepted more; refusing where either refuses is safe: kproxy then closes).
BROKER_MAX_TAGGED_FIELDS = 10_000
_MAX_STRING = 0x7FFF            # the broker refuses longer strings


class ProtocolViolation(DecodeError):
    """The byte stream cannot be followed safely any more: the connection must close."""


class FrameTooLarge(ProtocolViolation):
    """A size prefix above the configured maximum (or negative)."""


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


class UntrackableRequest(ProtocolViolation):
    """A request whose answer cannot be predicted (the broker would refuse it, or kproxy
    does not know its version): closing beats guessing and mis-pairing what follows."""


class PassedAnswerChanged(ProtocolViolation):
    """A held answer whose first bytes already passed (``fetch_cut``) had to be rewritten there,
    or to another length: what the client got cannot be made right, the connection must close."""


class UnpairedResponse(ProtocolViolation):
    """A response that is not for the oldest request awaiting one (the broker answers in order)."""


def _skim_once(event, skim, *args):
    """``event``'s partial decode by ``skim(*args)``, or None when there is none to make: a
    streamed frame, a decode that already failed, or one that fails now (the whole decode
    then runs and keeps the error). Shared by both event kinds' ``partial``."""
    if event._error is not None or event._streamed_size:
        return None
    try:
        return skim(*args)
    except DecodeError:
        return None


class _FrameEvent:
    """What request and response events say alike about their frame."""

    __slots__ = ()

    @property
    def size(self) -> int:
        """Frame size on the wire, size prefix included."""
        return self._streamed_size or len(self.frame) + 4

    @property
    def held_size(self) -> int:
        """What keeping this event holds of its frame: ``size``, or for a streamed frame
        its header only (plus the prefix). What queues that hold events are charged."""
        return len(self.frame) + 4

    @property
    def streamed(self) -> bool:
        """Passed on as it arrived and not kept (nothing needed it whole): ``frame`` is
        its header only (a response's: the correlation id alone), its decoded form is None
        and ``decode_error`` None too."""
        return self._streamed_size != 0


class RequestReceived(_FrameEvent):
    """A complete request frame from the client."""

    __slots__ = ("frame", "api_key", "api_version", "correlation_id", "time",
                 "expects_response", "_streamed_size", "_request", "_error", "_partial", "_tally")

    def __init__(self, frame, api_key: int, api_version: int, correlation_id: int,
                 time: float, expects_response: bool, streamed_size: int = 0):
        """``streamed_size``: the frame was streamed (its size given, prefix included);
        ``frame`` is then only its header (see ``streamed``)."""
        self.frame = frame
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
        self.time = time
        self.expects_response = expects_response
        self._streamed_size = streamed_size
        self._request: Request | None = None
        self._error: DecodeError | None = None
        self._partial: Request | None = None
        self._tally = _UNREAD

    @property
    def api_name(self) -> str:
        return schema.api_name(self.api_key)

    @property
    def request(self) -> Request | None:
        """The decoded request (decoded once, on first access); None if it cannot be
        decoded, or was streamed."""
        if self._request is None and self._error is None and not self._streamed_size:
            try:
                self._request = decode_request(self.frame)
            except DecodeError as exc:
                self._error = exc
        return self._request

    def undecoded(self) -> "RequestReceived":
        """This event without what decoding it built: kept for later (the live page's
        recent pairs), a decoded request costs many times its frame; it decodes again
        when asked."""
        return RequestReceived(self.frame, self.api_key, self.api_version, self.correlation_id,
                               self.time, self.expects_response, self._streamed_size)

    @property
    def partial(self) -> Request | None:
        """The request with only the fields observers read of a Produce or Fetch decoded
        (``skim``; decoded once): ``request`` itself for other APIs, or once that is
        decoded. None exactly when ``request`` is None."""
        partial = self._partial
        if partial is None:
            if self.api_key in SKIMMED_REQUESTS and self._request is None:
                partial = self._partial = _skim_once(self, skim_request, self.frame)
            if partial is None:
                return self.request
        return partial

    @property
    def tally(self):
        """What the observers count of a Produce or Fetch request, read from the frame
        (``tally``; once); None for other APIs and unusual frames: ``partial`` then."""
        tally = self._tally
        if tally is _UNREAD:
            tally = self._tally = tally_request(self.frame) \
                if self.api_key in _TALLIED and not self._streamed_size else None
        return tally

    @property
    def decode_error(self) -> DecodeError | None:
        """Why ``request`` is None (a frame that decodes partially decodes whole, so a
        partial decode answers this for Produce and Fetch, the one observers use anyway)."""
        self.partial
        return self._error

    def __repr__(self) -> str:
        return (f"RequestReceived({self.api_name} v{self.api_version}, "
                f"correlation_id={self.correlation_id}, size={self.size}"
                f"{', streamed' if self.streamed else ''})")


class ResponseReceived(_FrameEvent):
    """A complete response frame from the broker, paired with its request."""

    __slots__ = ("frame", "request_event", "time", "_streamed_size", "_response", "_error", "_partial",
                 "_tally")

    def __init__(self, frame, request_event: RequestReceived, time: float, streamed_size: int = 0):
        """``streamed_size`` as for ``RequestReceived``: ``frame`` is then the correlation id."""
        self.frame = frame
        self.request_event = request_event
        self.time = time
        self._streamed_size = streamed_size
        self._response: Response | None = None
        self._error: DecodeError | None = None
        self._partial: Response | None = None
        self._tally = _UNREAD

    @property
    def correlation_id(self) -> int:
        return self.request_event.correlation_id

    @property
    def api_key(self) -> int:
        return self.request_event.api_key

    @property
    def api_version(self) -> int:
        return self.request_event.api_version

    @property
    def latency(self) -> float:
        """Seconds from the complete request to the complete response."""
        return self.time - self.request_event.time

    def undecoded(self, request_event: RequestReceived) -> "ResponseReceived":
        """As ``RequestReceived.undecoded``, paired with ``request_event`` (its own undecoded copy)."""
        return ResponseReceived(self.frame, request_event, self.time, self._streamed_size)

    @property
    def response(self) -> Response | None:
        """The decoded response; None if it cannot be decoded, or was streamed."""
        if self._response is None and self._error is None and not self._streamed_size:
            try:
                self._response = decode_response(self.frame, self.api_key, self.api_version)
            except DecodeError as exc:
                self._error = exc
        return self._response

    @property
    def partial(self) -> Response | None:
        """As ``RequestReceived.partial``: only what observers and address rewriting read of
        a Produce or Fetch answer; ``response`` itself otherwise. None exactly when it is None."""
        partial = self._partial
        if partial is None:
            request = self.request_event
            if request.api_key in SKIMMED_RESPONSES and self._response is None:
                partial = self._partial = _skim_once(self, skim_response, self.frame,
                                                     request.api_key, request.api_version)
            if partial is None:
                return self.response
        return partial

    @property
    def tally(self):
        """As ``RequestReceived.tally``, for a Produce or Fetch answer."""
        tally = self._tally
        if tally is _UNREAD:
            request = self.request_event
            tally = self._tally = tally_response(self.frame, request.api_key, request.api_version) \
                if request.api_key in _TALLIED and not self._streamed_size else None
        return tally

    @property
    def decode_error(self) -> DecodeError | None:
        """As ``RequestReceived.decode_error``."""
        self.partial
        return self._error

    def __repr__(self) -> str:
        return (f"ResponseReceived({schema.api_name(self.api_key)} v{self.api_version}, "
                f"correlation_id={self.correlation_id}, size={self.size}, "
                f"latency={self.latency:.6f}{', streamed' if self.streamed else ''})")


class SaslTokenPassed:
    """An opaque SASL token (SaslHandshake v0 raw mode). Its bytes are never kept."""

    __slots__ = ("direction", "size", "time")

    def __init__(self, direction: str, size: int, time: float):
        self.direction = direction      # "client" or "broker"
        self.size = size
        self.time = time

    def __repr__(self) -> str:
        return f"SaslTokenPassed({self.direction}, size={self.size})"


class MalformedFrame:
    """A frame that breaks the protocol's framing rules; forwarding goes on, the peer decides."""

    __slots__ = ("direction", "frame", "reason", "time")

    def __init__(self, direction: str, frame, reason: str, time: float):
        self.direction = direction
        self.frame = frame
        self.reason = reason
        self.time = time

    @property
    def size(self) -> int:
        return len(self.frame) + 4

    def __repr__(self) -> str:
        return f"MalformedFrame({self.direction}, size={self.size}: {self.reason})"


Event = RequestReceived | ResponseReceived | SaslTokenPassed | MalformedFrame


class StreamedFrame:
    """What ``_Framer.feed`` gives for a frame it streamed: its first bytes and its length."""

    __slots__ = ("head", "length")

    def __init__(self, head, length: int):
        self.head = head            # the frame's first bytes (no size prefix)
        self.length = length        # the whole frame's length (no size prefix)


class _Framer:
    """Splits one direction's byte stream into frames (without the size prefix).

    Frames are cut from the reads in place: a large one (``ZERO_COPY_FRAME_BYTES``
    and up) that one read brought whole is a view of that read, not a copy; one
    that spans reads is kept as views of them and joined once, when complete
    (growing a bytearray to MBs a read at a time moves and copies it again and
    again). Small frames are copied out (a view would keep a whole read buffer
    alive for a few bytes), and the beginning of one that a read cut is kept in
    a bytearray until the next read completes it. Copying each read of a large
    frame before gathering it cost a second copy of every byte: ~15 % of
    kproxy's CPU relaying 1 MiB Produce requests.

    Better still, when ``assemble(size, start)`` gives a buffer for it, a large
    frame that spans reads is assembled there, and ``room()`` offers its free
    part for the next read to land in: nothing is copied but the start that
    arrived with the read before, and not even that when the buffer given is
    the one that read landed in, with the frame placed where its start already
    is. The caller decides (it knows the memory budget, and can hand out a
    buffer used before, saving its zero fill).

    A large frame can instead be streamed (``stream``): its first bytes are kept,
    the rest only counted, and ``feed`` gives a ``StreamedFrame`` when it ends.
    Frames that big are gathered, never assembled: the decision comes once their
    header is in, and a buffer allocated whole would be wasted.
    """

    __slots__ = ("buffer", "max_frame_size", "direction", "assemble", "gather_from", "_parts",
                 "_missing", "_gathered", "_framed", "_frame", "_base", "_total", "_filled", "_skipped",
                 "_streaming", "decided", "head_tried")

    def __init__(self, max_frame_size: int, direction: str,
                 assemble: Callable[[int, memoryview], tuple[bytearray, int] | None] | None = None,
                 gather_from: int = ZERO_COPY_FRAME_BYTES):
        self.buffer = bytearray()            # the start of a small frame cut by a read
        self.max_frame_size = max_frame_size
        self.direction = direction
        self.assemble = assemble             # (frame bytes with size prefix, its start) -> (buffer, offset) or None
        self.gather_from = gather_from       # incomplete frames this big are large (assembled or gathered)
        self._frame: bytearray | None = None   # where the large frame is assembled, size prefix first
        self._base = 0                       # ... from this offset of it
        self._total = 0                      # its bytes (the buffer may be longer)
        self._filled = 0                     # bytes of it that arrived
        self._parts: list | None = None      # views of a large frame's reads, size prefix first
        self._missing = 0                    # bytes that frame still lacks
        self._gathered = 0                   # bytes of it in _parts
        self._framed = False                 # a frame has started: the peer speaks Kafka
        self._skipped = 0                    # bytes of the large frame passed without keeping (streamed)
        self._streaming = False              # that frame is streamed
        self.decided = False                 # whether to stream that frame has been decided
        self.head_tried = 0                  # its bytes when its header was last read

    def feed(self, data) -> list:
        """Complete frames in ``data`` (and what came before): ``bytes`` or ``memoryview``.

        ``data`` may be kept by reference until its frame is complete, and large
        frames are views of it: callers must not change it afterwards (bytes from
        a socket read never change; the relay's read arena never reuses a buffer
        that anything still refers to).
        """
        frames: list = []
        view = memoryview(data)
        while view:
            if self._frame is not None:
                view = self._fill(view, frames)
            elif self._parts is not None:
                view = self._gather(view, frames)
            elif self.buffer:
                view = self._complete_buffered(view, frames)
            else:
                view = self._frame_in_place(view, frames)
        return frames

    def _size(self, data, pos: int) -> int:
        """The size prefix at ``pos``; raises FrameTooLarge (or WrongProtocol) if impossible."""
        size, = SIZE.unpack_from(data, pos)
        if size < 0 or size > self.max_frame_size:
            wrong = None if self._framed else wrong_protocol(self.direction, data[pos:pos + 4])
            if wrong is not None:
                raise wrong
            raise FrameTooLarge(f"{self.direction} frame of {size} bytes "
                                f"(maximum {self.max_frame_size})")
        self._framed = True
        return size

    def room(self) -> memoryview | None:
        """The free part of the frame being assembled (a read may land there), or None."""
        frame = self._frame
        return None if frame is None else memoryview(frame)[self._base + self._filled:self._base + self._total]

    def fills_in_place(self, data) -> bool:
        """Whether ``data`` was read into ``room()`` without completing the frame; if so it
        is counted, and there is nothing else to do (no frame ends, no byte moves)."""
        frame = self._frame
        if frame is None or data.__class__ is not memoryview or data.obj is not frame:
            return False
        filled = self._filled + len(data)
        if filled >= self._total:
            return False
        self._filled = filled
        return True

    def filled_in_place(self, nbytes: int) -> bool:
        """``fills_in_place`` for ``nbytes`` known to have been read into ``room()``."""
        filled = self._filled + nbytes
        if filled >= self._total:
            return False
        self._filled = filled
        return True

    @property
    def reserved(self) -> int:
        """Bytes of the buffer the frame is being assembled in beyond those that arrived:
        the whole buffer is kept alive until the frame completes, not only the frame's part."""
        return 0 if self._frame is None else len(self._frame) - self._filled

    def _large(self, start, size: int) -> None:
        """A large frame (size prefix included in ``start``, its beginning) spans reads:
        assemble it in a buffer of its own if allowed, else gather views of the reads."""
        total = 4 + size
        given = self.assemble(total, start) if self.assemble is not None else None
        if given is not None:
            frame, base = given
            if memoryview(start).obj is not frame:     # else the start was read where it belongs
                frame[base:base + len(start)] = start
            self._frame, self._base, self._total, self._filled = frame, base, total, len(start)
            return
        self._parts = [_kept(start)]
        self._gathered = len(start)
        self._missing = total - len(start)

    def _fill(self, view: memoryview, frames: list) -> memoryview | None:
        """More of the frame being assembled: landed in place (a read into ``room()``), or
        copied in; what follows it, if it ends here."""
        frame = self._frame
        filled = self._filled
        total = self._total
        base = self._base
        take = min(len(view), total - filled)
        if view.obj is not frame:                # in place, it already is where it belongs
            frame[base + filled:base + filled + take] = view[:take]
        filled += take
        if filled < total:
            self._filled = filled
            return None
        frames.append(memoryview(frame)[base + 4:base + total])
        self._frame = None
        self._filled = self._total = self._base = 0
        self.decided = False
        self.head_tried = 0
        return view[take:]

    def _gather(self, view: memoryview, frames: list) -> memoryview | None:
        """More of the large frame in progress (kept, or only counted when streamed); what
        follows it, if it ends here."""
        missing = self._missing
        if len(view) < missing:
            self._missing = missing - len(view)
            if self._streaming:
                self._skipped += len(view)
            else:
                self._parts.append(_kept(view))
                self._gathered += len(view)
            return None
        if self._streaming:
            frames.append(StreamedFrame(memoryview(self._parts[0])[4:], self.frame_length))
        else:
            self._parts.append(view[:missing])
            frames.append(memoryview(b"".join(self._parts))[4:])
        self._parts = None
        self._missing = self._gathered = self._skipped = 0
        self.decided = self._streaming = False
        self.head_tried = 0
        return view[missing:]

    def _complete_buffered(self, view: memoryview, frames: list) -> memoryview | None:
        """Continue the small frame (or size prefix) an earlier read cut; what is left."""
        buf = self.buffer
        if len(buf) < 4:
            take = 4 - len(buf)
            buf += view[:take]
            view = view[take:]
            if len(buf) < 4:
                return None
        size = self._size(buf, 0)
        if size >= self.gather_from:            # a large frame whose size prefix was cut
            self._large(bytes(buf), size)
            del buf[:]
            return view
        take = 4 + size - len(buf)
        buf += view[:take]
        if len(buf) < 4 + size:
            return None
        frames.append(memoryview(buf)[4:])       # handed over whole: no copy
        self.buffer = bytearray()
        return view[take:]

    def _frame_in_place(self, view: memoryview, frames: list) -> None:
        """Frames starting at the beginning of ``view``, which is all consumed."""
        pos = 0
        end = len(view)
        while end - pos >= 4:
            size = self._size(view, pos)
            stop = pos + 4 + size
            if stop > end:
                if size >= self.gather_from:          # the rest comes in later reads
                    self._large(view[pos:end], size)
                    return None
                break
            frames.append(view[pos + 4:stop] if size >= ZERO_COPY_FRAME_BYTES
                          else bytes(view[pos + 4:stop]))
            pos = stop
        if pos < end:
            self.buffer += view[pos:end]
        return None

    def assembly(self) -> tuple[bytearray, int, int] | None:
        """The frame being assembled in a buffer of its own: (buffer, base, its bytes); None
        when there is none."""
        frame = self._frame
        return None if frame is None else (frame, self._base, self._total)

    @property
    def filled(self) -> int:
        """Bytes of the frame being assembled that arrived (size prefix included)."""
        return self._filled

    @property
    def large(self) -> bool:
        """A large frame is in progress (assembled, gathered or streamed)."""
        return self._parts is not None or self._frame is not None

    @property
    def gathering(self) -> bool:
        """A large incomplete frame is being kept whole (assembled or gathered, not streamed)."""
        return self._frame is not None or (self._parts is not None and not self._streaming)

    @property
    def frame_length(self) -> int:
        """The length of the large incomplete frame (size prefix excluded)."""
        if self._frame is not None:
            return self._total - 4
        return self._gathered + self._skipped + self._missing - 4

    def stream(self, keep: int) -> None:
        """Keep only the first ``keep`` bytes (size prefix included, fewer than it has)
        of the large incomplete frame, which is gathered (never assembled: see the class);
        pass the rest, now and to come, without keeping it."""
        head = self.buffered_bytes(0, keep)
        self._skipped = self._gathered - keep
        self._parts = [head]
        self._gathered = keep
        self._streaming = self.decided = True

    @property
    def missing(self) -> int:
        """Bytes the incomplete frame still lacks (0 between frames, or before its size is in)."""
        if self._frame is not None:
            return self._total - self._filled
        if self._parts is not None:
            return self._missing
        buf = self.buffer
        return 4 + SIZE.unpack_from(buf, 0)[0] - len(buf) if len(buf) >= 4 else 0

    @property
    def buffered(self) -> int:
        """Bytes held of the incomplete frame at the end of the stream so far."""
        return len(self.buffer) + self._gathered + self._filled

    @property
    def progress(self) -> int:
        """Bytes of that frame received so far, held or streamed (size prefix included)."""
        return len(self.buffer) + self._gathered + self._skipped + self._filled

    def buffered_bytes(self, start: int = 0, end: int | None = None) -> bytes:
        """Those bytes (``start`` to ``end``), size prefix included."""
        if self._frame is not None:
            stop = self._filled if end is None else min(end, self._filled)
            return bytes(memoryview(self._frame)[self._base + start:self._base + stop])
        if self._parts is None:
            return bytes(self.buffer[start:end])
        if end is not None and end <= len(self._parts[0]):     # no need to join megabytes
            return bytes(self._parts[0][start:end])
        return b"".join(self._parts)[start:end]


# A piece of a frame in progress that is a view of a buffer more than this many times its
# size is copied rather than kept as a view: reads land in a buffer shared by all of an event
# loop's connections, and a view keeps the whole of it alive (a client dribbling its frame a
# little per read could hold a MiB of memory per byte it sent).
VIEW_MAX_OVERHEAD = 2


def _unchanged_so_far(frame, replacement, passed: int) -> None:
    """A rewrite of an answer whose first ``passed`` bytes (size prefix included) already went
    to the client must keep its length and those bytes; else PassedAnswerChanged."""
    kept = max(passed - 4, 0)
    if len(replacement) != len(frame) or replacement[:kept] != frame[:kept]:
        raise PassedAnswerChanged(
            f"a held answer had to be rewritten within the {passed} bytes already forwarded "
            f"(broker addresses without a partition error naming a new leader)")


def _kept(piece):
    """``piece`` (bytes or a memoryview of a read) as it may be kept until its frame ends."""
    view = memoryview(piece)
    return bytes(view) if len(view) * VIEW_MAX_OVERHEAD < len(view.obj) else piece


_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


class _BrokerRefuses(Exception):
    """Bytes the broker's parser throws on (it closes the connection then)."""


def _java_int(value: int) -> int:
    """``value`` wrapped to a signed 32-bit int, as the broker's Java arithmetic does."""
    value &= 0xFFFFFFFF
    return value - 0x1_0000_0000 if value & 0x8000_0000 else value


def _broker_uvarint(frame, pos: int) -> tuple[int, int]:
    """An unsigned varint as the broker reads it: padding (non-minimal encodings) is
    accepted, at most five bytes, bits past 32 are dropped, and the result is a Java
    int (so it may be negative). kproxy's codec refuses padding, so it cannot be used
    to predict what the broker does."""
    byte = frame[pos]
    if byte < 0x80:                                  # nearly always: one byte
        return byte, pos + 1
    value = 0
    for shift in (0, 7, 14, 21):
        byte = frame[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
    byte = frame[pos]
    if byte & 0x80:
        raise _BrokerRefuses("varint longer than five bytes")
    return _java_int(value | byte << 28), pos + 1


def _broker_skip_string(frame, pos: int, compact: bool) -> int:
    """Past a nullable string (int16 or compact varint length), as the broker reads it."""
    if compact:
        length, pos = _broker_uvarint(frame, pos)
        length = length - 1 if length != _INT32_MIN else _INT32_MAX     # Java's int wraps
    else:
        length, = _I16.unpack_from(frame, pos)
        pos += 2
    if length < 0:
        return pos                                   # null
    if length > _MAX_STRING or length > len(frame) - pos:
        raise _BrokerRefuses(f"string of {length} bytes")
    return pos + length


def _broker_skip_tagged_fields(frame, pos: int) -> int:
    count, pos = _broker_uvarint(frame, pos)
    if count == 0:
        return pos
    if count < 0 or count > len(frame) - pos or count > BROKER_MAX_TAGGED_FIELDS:
        raise _BrokerRefuses(f"{count} tagged fields")
    for _ in range(count):
        _, pos = _broker_uvarint(frame, pos)         # tag
        size, pos = _broker_uvarint(frame, pos)
        if size < 0 or size > len(frame) - pos:
            raise _BrokerRefuses(f"tagged field of {size} bytes")
        pos += size
    return pos


def _broker_body_start(frame, header_version: int) -> int:
    """Where a request's body starts, reading its header as the broker does.
    Raises _BrokerRefuses, IndexError or struct.error where the broker refuses it."""
    if header_version == 0:
        return 8
    pos = _broker_skip_string(frame, 8, compact=False)      # client_id: int16 length in every version
    if header_version >= 2:
        pos = _broker_skip_tagged_fields(frame, pos)
    return pos


_REFUSED = (_BrokerRefuses, IndexError, struct.error)


def _produce_acks(frame, version: int) -> tuple[bool, int]:
    """Whether the broker answers this Produce (acks != 0), read as the broker reads it,
    and where acks ends.

    Raises UntrackableRequest for a version kproxy does not know (its layout could
    differ) and for bytes the broker refuses (it closes the connection on them). Given
    only the frame's first bytes, an answer is the whole frame's answer (every check
    passed there passes on the whole); UntrackableRequest then may mean "more bytes".
    """
    spec = schema.REQUESTS[_PRODUCE]
    if not spec.has_version(version):
        raise UntrackableRequest(f"Produce v{version} is unknown to kproxy: cannot tell "
                                 f"whether the broker answers it")
    flexible = spec.is_flexible(version)
    try:
        pos = _broker_body_start(frame, 2 if flexible else 1)
        if version >= 3:
            pos = _broker_skip_string(frame, pos, compact=flexible)    # transactional_id
        acks, = _I16.unpack_from(frame, pos)
    except _REFUSED as exc:
        reason = str(exc) if isinstance(exc, _BrokerRefuses) else "cut short"
        raise UntrackableRequest(f"Produce v{version} that the broker cannot parse ({reason}): "
                                 f"cannot tell whether it is answered") from None
    return acks != 0, pos + 2


def _stream_head(frame) -> int | None:
    """How many of a request's first bytes (``frame``: at most ``STREAM_HEAD_LIMIT`` of
    them, no size prefix) tell all that pairing and the observers' headers need:
    api key, version, correlation id, client_id and, for a Produce, acks. None: these
    bytes cannot tell (the request is then kept whole, and judged when complete)."""
    if len(frame) < _REQUEST_PREFIX.size:
        return None
    api_key, api_version, _ = _REQUEST_PREFIX.unpack_from(frame, 0)
    if api_key == _SASL_HANDSHAKE:
        return None                          # its body names the mechanism (raw SASL follows)
    try:
        if api_key == _PRODUCE:
            return _produce_acks(frame, api_version)[1]
        header_version = schema.request_header_version(api_key, api_version)
        if not header_version:
            return _REQUEST_PREFIX.size       # unknown (answered or closed), or no client_id
        return _broker_skip_string(frame, _REQUEST_PREFIX.size, compact=False)
    except (UntrackableRequest, *_REFUSED):
        return None


# What relay_broker does with the start of the broker's incomplete frame.
_PASS = "pass"          # forward it now: it answers a request that is not held
_HOLD = "hold"          # keep it until complete: it answers a held request
_WAIT = "wait"          # keep it until its correlation id has arrived (under 8 bytes so far)


def _never() -> bool:
    return False


_NO_LIMIT = 1 << 62


class Connection:
    """Pairs requests and responses on one client⇄broker connection."""

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 clock: Callable[[], float] = time.monotonic,
                 hold: Callable[[int, int], bool] | None = None,
                 transform: Callable[[ResponseReceived], bytes | None] | None = None,
                 stream_frame_bytes: int | None = None,
                 keep_bodies: Callable[[], bool] | None = None,
                 assemble: Callable[[int, memoryview], tuple[bytearray, int] | None] | None = None):
        """``hold(api_key, api_version)`` says which responses ``relay_broker`` must keep
        until complete and pass to ``transform``, which returns replacement frame bytes
        (without size prefix) or None to send the original. All other bytes pass through
        as they arrive, once the correlation id at their start has shown which request
        they answer.

        ``stream_frame_bytes`` (None: never) streams frames at least that big, unless
        ``keep_bodies()`` says, when one starts, that something needs them whole: only
        their header is kept (what pairing needs), and their events say ``streamed``.
        Held responses, SaslHandshake v0 and raw SASL tokens are always kept whole.

        ``assemble(size, start)`` gives a writable buffer and an offset with at least
        ``size`` bytes free from there (or None) to assemble a large frame of that size
        that spans reads in, which reads can then fill in place (see ``room``); without
        it, never. ``start`` is what arrived of the frame so far: given the buffer it was
        read into, with the offset where it lies, it is not copied. Frames that may be streamed are
        never assembled (they are gathered until their header decides)."""
        self._clock = clock
        self._hold = hold
        self._transform = transform
        self._stream_frame_bytes = stream_frame_bytes
        self._stream_from = stream_frame_bytes or _NO_LIMIT     # one comparison per frame
        self._keep_bodies = keep_bodies or _never
        gather_from = min(ZERO_COPY_FRAME_BYTES, stream_frame_bytes or ZERO_COPY_FRAME_BYTES)
        if assemble is not None and stream_frame_bytes is not None:
            whole = assemble
            stream_from = self._stream_from

            def assemble(total: int, start) -> tuple[bytearray, int] | None:
                return None if total - 4 >= stream_from else whole(total, start)
        self._client = _Framer(max_frame_size, "client", assemble, gather_from)
        self._broker = _Framer(max_frame_size, "broker", assemble, gather_from)
        self._broker_passed = 0      # bytes of the broker's incomplete frame already forwarded
        self._broker_waiting = b""   # its first bytes, held back until the correlation id is in
        self.holding_answer = False  # it is held (forwarded once complete, maybe rewritten); read-only outside
        self._cut: FetchCut | None = None    # the walk of a held Fetch answer that may pass early
        self._cut_passed = 0                 # bytes of that answer already forwarded
        self._pending: deque[RequestReceived] = deque()
        self._sasl_mechanism: str | None = None
        self._raw_sasl_rounds: int | None = None     # None: not in raw-token mode
        self._raw_sasl_client_tokens = 0
        self._raw_sasl_broker_tokens = 0

    @property
    def in_flight(self) -> int:
        """Requests sent and still waiting for a response."""
        return len(self._pending)

    @property
    def in_raw_sasl(self) -> bool:
        return self._raw_sasl_rounds is not None

    @property
    def client_partial(self) -> int:
        """Bytes of the client's incomplete frame so far (0 between requests)."""
        return self._client.buffered

    @property
    def client_missing(self) -> int:
        """Bytes the client's incomplete frame still lacks (0 between requests)."""
        return self._client.missing

    @property
    def buffered(self) -> int:
        """Bytes held for incomplete frames, both directions (of streamed ones: their header)."""
        return self._client.buffered + self._broker.buffered

    def _streams(self, length: int) -> bool:
        """Whether a frame of ``length`` bytes that could be streamed is: big enough, and
        nothing needs it whole now."""
        return (self._stream_frame_bytes is not None and length >= self._stream_frame_bytes
                and not self._keep_bodies())

    def _sasl_pending(self) -> bool:
        """Raw SASL mode, or a SaslHandshake v0 not yet answered: the client's frames may be
        (or become) tokens, which are judged by their whole bytes."""
        return self._raw_sasl_rounds is not None or any(
            r.api_key == _SASL_HANDSHAKE and r.api_version == 0 for r in self._pending)

    def room(self, direction: str) -> memoryview | None:
        """Where the next read from ``direction`` ("client" or "broker") can land in place:
        the rest of the large frame being assembled; None when there is none. Bytes read
        there are then passed to ``receive_client`` / ``relay_broker`` as a view of it."""
        return (self._client if direction == "client" else self._broker).room()

    def holding(self, direction: str) -> tuple[int, int]:
        """Bytes held of ``direction``'s incomplete frame, and bytes allocated for it that have
        not arrived: what the relay's memory budget counts, asked after every read."""
        framer = self._client if direction == "client" else self._broker
        return framer.buffered, framer.reserved

    # ------------------------------------------------------------ client side

    def receive_client(self, data) -> list[Event]:
        """Bytes the client sent. Raises ProtocolViolation (FrameTooLarge,
        UntrackableRequest): the connection must close, and ``data`` must not be
        forwarded."""
        now = self._clock()
        events: list[Event] = []
        framer = self._client
        for frame in framer.feed(data):
            if frame.__class__ is StreamedFrame:
                events.append(self._request(frame.head, now, frame.length + 4))
                continue
            if self._raw_sasl_rounds is not None and not self._raw_sasl_exit(frame):
                self._raw_sasl_client_tokens += 1
                events.append(SaslTokenPassed("client", len(frame) + 4, now))
                continue
            events.append(self._request(frame, now))
        if framer.large and not framer.decided:
            self._maybe_stream_request()
        return events

    def _maybe_stream_request(self) -> None:
        """Decide whether the client's large incomplete frame is streamed, once its header
        is in (read again each time what has arrived doubles: a trickle costs no more)."""
        framer = self._client
        if not self._streams(framer.frame_length) or self._sasl_pending():
            framer.decided = True
            return
        have = framer.buffered - 4
        if have < 2 * framer.head_tried and have < STREAM_HEAD_LIMIT:
            return
        framer.head_tried = have
        end = _stream_head(framer.buffered_bytes(4, 4 + STREAM_HEAD_LIMIT))
        if end is not None:
            framer.stream(4 + end)
        elif have >= STREAM_HEAD_LIMIT:
            framer.decided = True            # the header runs on: keep it whole
    def _request(self, frame, now: float, streamed_size: int = 0) -> Event:
        """``streamed_size``: ``frame`` is the head of a streamed frame of that size."""
        if not streamed_size and len(frame) >= self._stream_from \
                and self._streams(len(frame)) and not self._sasl_pending():
            # Complete in one read: streamed too, so what observers get does not depend on reads.
            end = _stream_head(frame[:STREAM_HEAD_LIMIT])
            if end is not None:
                frame, streamed_size = bytes(frame[:end]), len(frame) + 4
        if len(frame) < _REQUEST_PREFIX.size:
            # The broker cannot read its header either: it closes the connection, unanswered.
            return MalformedFrame("client", frame, "request shorter than its header", now)
        api_key, api_version, correlation_id = _REQUEST_PREFIX.unpack_from(frame, 0)
        # Every request is answered or makes the broker close the connection, except a
        # Produce with acks=0. (Unknown APIs and versions: the broker answers or closes.)
        expects = True
        if api_key == _PRODUCE:
            expects = _produce_acks(frame, api_version)[0]
        event = RequestReceived(frame, api_key, api_version, correlation_id, now, expects, streamed_size)
        if api_key == _SASL_HANDSHAKE and api_version == 0:
            request = event.request
            self._sasl_mechanism = getattr(request.body, "mechanism", None) if request else None
        if expects:
            self._pending.append(event)
        return event

    def _raw_sasl_exit(self, frame) -> bool:
        """For mechanisms whose round count is unknown: a frame with a request header the
        broker accepts, for an API version kproxy knows, ends raw mode. Judged by the
        header alone: a body kproxy cannot decode must not keep a request (and the
        address-bearing answer that follows) in raw mode, passed through unexamined."""
        if self._raw_sasl_rounds != 0 or len(frame) < _REQUEST_PREFIX.size:
            return False
        api_key, api_version, _ = _REQUEST_PREFIX.unpack_from(frame, 0)
        header_version = schema.request_header_version(api_key, api_version)
        if header_version is None:
            return False
        try:
            _broker_body_start(frame, header_version)
        except _REFUSED:
            return False
        self._raw_sasl_rounds = None
        return True

    # ------------------------------------------------------------ requests kproxy answers itself

    def client_head(self, count: int) -> bytes:
        """The first ``count`` bytes (size prefix included) of the client's incomplete frame,
        fewer if fewer arrived: enough to read its API key before any of it is forwarded."""
        return self._client.buffered_bytes(0, count) if self._client.buffered else b""

    def oldest_unanswered(self) -> RequestReceived | None:
        return self._pending[0] if self._pending else None

    def answer_locally(self, request: RequestReceived, frame: bytes) -> ResponseReceived:
        """``request`` (the oldest unanswered, never forwarded) is answered with ``frame``
        (without size prefix) by kproxy itself: its pair, as observers get it."""
        if not self._pending or self._pending[0] is not request:
            raise UnpairedResponse(f"a local answer to {request!r}, which is not the oldest unanswered")
        self._pending.popleft()
        return ResponseReceived(frame, request, self._clock())

    # ------------------------------------------------------------ broker side

    def receive_broker(self, data) -> list[Event]:
        """Bytes the broker sent. Raises ProtocolViolation (FrameTooLarge, UnpairedResponse)."""
        return self.relay_broker(data)[0]

    def relay_broker(self, data) -> tuple[list[Event], list]:
        """Like ``receive_broker``, and also the bytes to forward to the client now.

        Frames that ``hold`` selects are forwarded whole once complete, after
        ``transform`` (a Fetch answer assembled in a buffer of its own excepted: its records
        pass as they arrive when ``fetch_cut`` allows, and a rewrite of what passed raises
        PassedAnswerChanged); every other byte is forwarded as soon as it arrives (the
        chunk itself, uncopied, when nothing in it is held), except the first
        bytes of a frame whose correlation id has not arrived yet. A response
        that is not for the oldest unanswered request raises UnpairedResponse
        before any of its bytes are returned.
        """
        framer = self._broker
        if self.fills_held_answer(data):
            passing = self.passing()         # more of a held answer, read where it belongs
            return [], [] if passing is None else [passing]
        passed = self._broker_passed
        cut, cut_passed = self._cut, self._cut_passed
        frames = framer.feed(data)
        if frames and cut is not None:           # the held answer is complete
            self._cut, self._cut_passed = None, 0
        if passed and not frames:            # more of a response already being passed on
            self._broker_passed += len(data)
            return [], [data]
        now = self._clock()
        waiting = self._broker_waiting
        events: list[Event] = []
        held: list[bool] = []
        any_held = False
        for frame in frames:
            if frame.__class__ is StreamedFrame:
                event = self._response(frame.head, now, frame.length + 4)
            elif self._raw_sasl_rounds is not None:
                event = self._sasl_token(frame, now)
            else:
                event = self._response(frame, now)
            # A frame whose first bytes already went out (the first, if any passed) cannot
            # be held back any more.
            is_held = (event.__class__ is ResponseReceived and self._held(event.request_event)
                       and not (passed and not events))
            events.append(event)
            held.append(is_held)
            any_held = any_held or is_held
        tail = framer.progress
        if tail:
            tail_action = self._broker_tail_action()
            self._broker_passed = tail if tail_action is _PASS else 0
            self._broker_waiting = framer.buffered_bytes() if tail_action is _WAIT else b""
            self.holding_answer = tail_action is _HOLD
        else:
            tail_action = _PASS
            self._broker_passed = 0
            self._broker_waiting = b""
            self.holding_answer = False
        if not any_held:
            if tail_action is _PASS:
                return events, ([waiting, data] if waiting else [data])
            passing = self.passing() if tail_action is _HOLD else None
            if not frames:                   # the incomplete frame is all there is, kept back
                return events, [] if passing is None else [passing]
            # The kept-back tail started in this chunk (frames completed before it).
            out = [waiting] if waiting else []
            out.append(memoryview(data)[:len(data) - tail])
            if passing is not None:
                out.append(passing)
            return events, out
        out: list = []
        transform = self._transform
        already = passed or cut_passed       # bytes of the first frame already forwarded
        for frame, event, is_held in zip(frames, events, held):
            if frame.__class__ is StreamedFrame:     # only ever first: the rest of it is here
                out.append(memoryview(data)[:frame.length + 4 - passed])
                already = 0
                continue
            # A Fetch answer that passed up to its empty tail has nothing to rewrite: it goes on
            # without waiting for the transform's decode (the observers' comes after the write).
            replacement = transform(event) if is_held and transform is not None and not (
                already and cut is not None and cut.bare_tail(frame)) else None
            if replacement is not None:
                if already:
                    _unchanged_so_far(frame, replacement, already)
                out.append((SIZE.pack(len(replacement)) + replacement)[already:])
            # Unchanged frames: the read itself when it was this frame exactly (the usual
            # small answer); else small ones joined with their prefix (one write, one TLS
            # record), and large ones (a held Fetch v16+ response is often MBs) as prefix +
            # the frame itself, so record payloads are never copied.
            elif not tail and len(frames) == 1 and len(frame) + 4 == len(data):
                out.append(data)                 # (all of it, and nothing else, came in this read)
            elif len(frame) < ZERO_COPY_FRAME_BYTES:
                out.append((SIZE.pack(len(frame)) + bytes(frame))[already:])
            elif already < 4:
                out.append(SIZE.pack(len(frame))[already:])
                out.append(frame)
            else:
                out.append(memoryview(frame)[already - 4:])
            already = 0
        if tail and tail_action is _PASS:            # it started in this chunk
            out.append(memoryview(data)[len(data) - tail:])
        elif tail_action is _HOLD:
            passing = self.passing()
            if passing is not None:
                out.append(passing)
        return events, out

    def passing(self) -> memoryview | None:
        """What of the held answer being assembled may go to the client now that more of it
        arrived (``fetch_cut``: a Fetch answer's records pass as they come): a view of the
        buffer it is assembled in, or None. Asked after every read of it."""
        cut = self._cut
        if cut is None:
            return None
        filled = self._broker.filled
        upto = cut.cut
        if upto is None:
            upto = cut.advance(filled)
            if upto is None:
                return None
        if upto > filled:
            upto = filled
        start = self._cut_passed
        if upto <= start:                    # (HOLD_WHOLE is below any start)
            return None
        self._cut_passed = upto
        return cut.view(start, upto)

    def fills_request(self, data) -> bool:
        """Whether ``data`` (from the client) was read into ``room("client")`` without completing
        the request assembled there: then it is counted, and ``receive_client`` would return
        no event (the relay still forwards it)."""
        return self._client.fills_in_place(data)

    def filled_held_answer(self, nbytes: int) -> bool:
        """``nbytes`` were read into ``room("broker")`` while ``holding_answer``: True when they
        did not complete the answer (counted; nothing to forward or observe), False when the
        bytes must go to ``relay_broker`` as usual (a view of that room)."""
        return self._broker.filled_in_place(nbytes)

    def fills_held_answer(self, data) -> bool:
        """Whether ``data`` (from the broker) was read into ``room("broker")`` of a held answer
        without completing it: then it is counted, and ``relay_broker`` would return nothing."""
        return self.holding_answer and self._broker.fills_in_place(data)

    def _held(self, request: RequestReceived) -> bool:
        return self._hold is not None and self._hold(request.api_key, request.api_version)

    def _broker_tail_action(self) -> str:
        """What to do with the broker's incomplete frame: decided by the request it
        answers, which its correlation id must show to be the oldest unanswered one."""
        if self._raw_sasl_rounds is not None:
            return _PASS                     # an opaque token, not a response
        start = self._broker.buffered_bytes(0, _CORRELATION_END)
        if len(start) < _CORRELATION_END:
            return _WAIT
        correlation_id, = SIZE.unpack_from(start, 4)
        request = self._oldest_unanswered(correlation_id)
        if self._held(request):
            if self._cut is None and request.api_key == _FETCH and request.api_version >= _FETCH_CUT_FROM:
                assembly = self._broker.assembly()
                if assembly is not None:
                    self._cut = FetchCut(*assembly, request.api_version)
            return _HOLD
        framer = self._broker
        if framer.large and not framer.decided:
            framer.decided = True
            if request.api_key != _SASL_HANDSHAKE and self._streams(framer.frame_length):
                framer.stream(_CORRELATION_END)
        return _PASS

    def _oldest_unanswered(self, correlation_id: int) -> RequestReceived:
        """The request a response with this correlation id answers; UnpairedResponse if it
        is not the oldest one awaiting an answer (the broker answers in order, so either
        kproxy and the broker disagree about what is answered, or the broker broke the
        protocol: pairing it with anything would risk forwarding addresses unrewritten)."""
        pending = self._pending
        if pending and pending[0].correlation_id == correlation_id:
            return pending[0]
        expected = (f"the oldest unanswered request is {pending[0]!r}" if pending
                    else "no request awaits an answer")
        raise UnpairedResponse(f"broker response with correlation id {correlation_id}, "
                               f"but {expected}")

    def _sasl_token(self, frame, now: float) -> SaslTokenPassed:
        """A raw SASL token from the broker (ending raw mode once the mechanism's rounds are done)."""
        self._raw_sasl_broker_tokens += 1
        rounds = self._raw_sasl_rounds
        if rounds and self._raw_sasl_broker_tokens >= rounds:
            self._raw_sasl_rounds = None
        return SaslTokenPassed("broker", len(frame) + 4, now)

    def _response(self, frame, now: float, streamed_size: int = 0) -> Event:
        if len(frame) < 4:
            raise UnpairedResponse(f"broker frame of {len(frame)} bytes is too short for a response")
        correlation_id, = SIZE.unpack_from(frame, 0)
        pending = self._pending
        if not pending or pending[0].correlation_id != correlation_id:
            self._oldest_unanswered(correlation_id)              # raises UnpairedResponse
        request = pending.popleft()
        if not streamed_size and len(frame) >= self._stream_from \
                and request.api_key != _SASL_HANDSHAKE and not self._held(request) \
                and self._streams(len(frame)):
            # Complete in one read: streamed too, so what observers get does not depend on reads.
            frame, streamed_size = bytes(frame[:4]), len(frame) + 4
        event = ResponseReceived(frame, request, now, streamed_size)
        if request.api_key == _SASL_HANDSHAKE and request.api_version == 0 \
                and len(frame) >= 6 and _I16.unpack_from(frame, 4)[0] == 0:      # error_code: none
            self._raw_sasl_rounds = RAW_SASL_ROUNDS.get(self._sasl_mechanism or "", 0)
            self._raw_sasl_client_tokens = self._raw_sasl_broker_tokens = 0
        return event
