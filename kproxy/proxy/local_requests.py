"""Client requests kproxy answers itself instead of forwarding them (e.g. client telemetry
when kproxy offers it): which bytes go to the broker, which requests stay, in what order.

Kafka clients read answers in request order (Java's NetworkClient insists), and the broker
must never see a request it did not announce. So the relay, when a policy has a
``LocalAnswers``:

- keeps back the bytes of a client frame whose API key is not in yet (its first 6 bytes),
  or is one kproxy answers, until the frame is complete; every other frame's bytes are
  forwarded as they arrive, as without it (``ClientSplit``);
- answers a local request once every request sent before it has its answer; until then
  the bytes that follow it wait (``Relay``'s backlog) and the client is not read, so no
  answer can overtake it.

The answers themselves (and which API keys are local) are the ``LocalAnswers``' business.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Protocol

from ..protocol.connection import RequestReceived

# A frame's size prefix and API key: what must be in to know whether kproxy answers it.
HEAD_BYTES = 6
_API_KEY = struct.Struct(">h")


class LocalAnswers(Protocol):
    def answers(self, api_key: int) -> bool:
        """Whether requests of this API are answered by kproxy now (never forwarded)."""

    def answer(self, info, request: RequestReceived) -> bytes:
        """The response frame (without size prefix) to ``request``."""


@dataclass(frozen=True, slots=True)
class LocalRequest:
    """A request kproxy answers: none of its bytes go to the broker."""
    event: RequestReceived


class ClientSplit:
    """One connection's client bytes, split into what goes to the broker and ``LocalRequest``s."""

    __slots__ = ("local", "_held", "_sent")

    def __init__(self, local: LocalAnswers):
        self.local = local
        self._held = bytearray()      # bytes of the incomplete frame kept back (all of them so far)
        self._sent = 0                # ... or: bytes of it already forwarded (its API key is not local)

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
            if not self._sent and event.__class__ is RequestReceived and self.local.answers(event.api_key):
                out.append(LocalRequest(event))
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
        if len(self._held) >= HEAD_BYTES and not self.local.answers(_API_KEY.unpack_from(self._held, 4)[0]):
            out.append(bytes(self._held))
            self._sent, self._held = len(self._held), bytearray()
        return out
