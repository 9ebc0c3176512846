"""Client requests kproxy answers itself instead of forwarding them: the one mechanism its
features share (client telemetry when kproxy offers it, ``telemetry_offer``; requests that
break an enforced policy rule, ``policy_answers``). Which bytes go to the broker, which
requests stay, in what order.

Kafka clients read answers in request order (Java's NetworkClient insists), and the broker
must never see a request it did not announce, nor one kproxy refused. So, on a connection
with ``LocalAnswers`` (a listener's ``RelayPolicy.local_answers`` makes them per connection):

- the bytes of a client frame whose API key is not in yet (its first 6 bytes), or is one
  some ``LocalAnswers`` may answer, are kept back until the frame is complete; then the
  first that ``takes`` it answers it, or its bytes go on. Every other frame's bytes are
  forwarded as they arrive, as without it (``ClientSplit``);
- a taken request is answered once every request sent before it has its answer (the
  tracker's oldest unanswered is it); until then the bytes that follow it wait (``Relay``'s
  backlog) and the client is not read, so no answer can overtake it. One that expects no
  answer (Produce with acks=0) is only kept from the broker.

What is answered, and how, is each ``LocalAnswers``' business. No I/O here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Protocol, Sequence

from ..protocol.events import RequestReceived

# A frame's size prefix and API key: what must be in to know whether kproxy may answer it.
HEAD_BYTES = 6
_API_KEY = struct.Struct(">h")


class LocalAnswers(Protocol):
    """One feature's requests answered by kproxy (never forwarded)."""

    def answers(self, api_key: int) -> bool:
        """Whether requests of this API may be answered here now: their bytes are kept back
        until the frame is whole, and ``takes`` decides (cheap: asked per frame)."""

    def takes(self, info, request: RequestReceived) -> bool:
        """Whether kproxy answers this whole request itself, decided before any of its
        bytes is forwarded (``request.frame`` is whole, even for a large one)."""

    def answer(self, info, request: RequestReceived) -> bytes:
        """The response frame (without size prefix) to a request ``takes`` took that
        expects one, asked when its turn comes, in request order."""


@dataclass(frozen=True, slots=True)
class LocalRequest:
    """A request kproxy answers: none of its bytes go to the broker; ``by`` answers it."""
    event: RequestReceived
    by: LocalAnswers


class ClientSplit:
    """One connection's client bytes, split into what goes to the broker and ``LocalRequest``s."""

    __slots__ = ("answerers", "info", "_may_answer", "_held", "_sent")

    def __init__(self, answerers: Sequence[LocalAnswers], info=None):
        self.answerers = tuple(answerers)      # the first that takes a request answers it
        self.info = info
        # Asked per frame: one answerer's own method when there is one (most connections).
        self._may_answer = self.answerers[0].answers if len(self.answerers) == 1 else self._any_answers
        self._held = bytearray()      # bytes of the incomplete frame kept back (all of them so far)
        self._sent = 0                # ... or: bytes of it already forwarded (no one may answer it)

    def _any_answers(self, api_key: int) -> bool:
        for answerer in self.answerers:
            if answerer.answers(api_key):
                return True
        return False

    def _taker(self, event: RequestReceived, whole) -> LocalAnswers | None:
        """Who answers ``event`` (``whole``: its frame, size prefix included), if anyone."""
        judged = event
        if event.streamed:            # the tracker kept only its header: judged on the bytes kept here
            judged = RequestReceived(bytes(whole[4:]), event.api_key, event.api_version,
                                     event.correlation_id, event.time, event.expects_response)
        for answerer in self.answerers:
            if answerer.answers(event.api_key) and answerer.takes(self.info, judged):
                return answerer
        return None

    def split(self, data, events) -> list:
        """``data`` as read, and the events the tracker made of it: the pieces to forward
        (bytes-like) and the local requests, in order."""
        out: list = []
        before = self._sent + len(self._held)     # bytes of the first frame that came earlier
        offset = 0
        for event in events:
            end = offset + event.size - before
            piece = data[offset:end]
            offset = end
            taker = None
            if not self._sent and event.__class__ is RequestReceived and self._may_answer(event.api_key):
                taker = self._taker(event, self._held + piece if self._held else piece)
            if taker is not None:
                out.append(LocalRequest(event, taker))
            else:
                if self._held:
                    out.append(bytes(self._held))
                out.append(piece)
            self._held = bytearray()
            self._sent = before = 0
        rest = data[offset:]
        if not rest:
            return out
        if self._sent:                            # a frame already being forwarded
            self._sent += len(rest)
            out.append(rest)
            return out
        self._held += rest
        if len(self._held) >= HEAD_BYTES and not self._may_answer(_API_KEY.unpack_from(self._held, 4)[0]):
            out.append(bytes(self._held))
            self._sent, self._held = len(self._held), bytearray()
        return out
