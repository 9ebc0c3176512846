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
its bytes the way the broker reads them (``readers``: padded
varints, Java int arithmetic), never with kproxy's strict codec; a request
it cannot be sure about, and a response that is not for the oldest
unanswered request, raise ``ProtocolViolation`` (the connection must close)
before any of their bytes are forwarded.

Events (``events``) carry the raw frame and decode it only when asked.
Frames are cut from the reads by ``framer``.

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
from .errors import PassedAnswerChanged, UnpairedResponse, UntrackableRequest
from .fetch_cut import FIRST_FLEXIBLE_VERSION as _FETCH_CUT_FROM, FetchCut
from .events import Event, MalformedFrame, RequestReceived, ResponseReceived, SaslTokenPassed
from .framer import DEFAULT_MAX_FRAME_SIZE, SIZE, ZERO_COPY_FRAME_BYTES, StreamedFrame, _Framer
from .readers import _I16, _PRODUCE, _REFUSED, _broker_body_start, _broker_skip_string, _produce_acks

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
_REQUEST_PREFIX = struct.Struct(">hhi")

_CORRELATION_END = 8            # size prefix and correlation id: what pairing needs of a response
# Compared per frame: plain int globals (an ApiKey attribute lookup costs ~4 global
# reads, and an int compares with an int faster than with an IntEnum member).
_FETCH, _SASL_HANDSHAKE = int(ApiKey.FETCH), int(ApiKey.SASL_HANDSHAKE)   # (and readers' _PRODUCE)
# Client tokens per SASL exchange when SaslHandshake v0 put the connection in
# raw-token mode (no SaslAuthenticate framing): the broker answers each one.
RAW_SASL_ROUNDS = {"PLAIN": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2, "OAUTHBEARER": 1}


def _unchanged_so_far(frame, replacement, passed: int) -> None:
    """A rewrite of an answer whose first ``passed`` bytes (size prefix included) already went
    to the client must keep its length and those bytes; else PassedAnswerChanged."""
    kept = max(passed - 4, 0)
    if len(replacement) != len(frame) or replacement[:kept] != frame[:kept]:
        raise PassedAnswerChanged(
            f"a held answer had to be rewritten within the {passed} bytes already forwarded "
            f"(broker addresses without a partition error naming a new leader)")


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
