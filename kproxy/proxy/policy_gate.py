"""Enforced policy rules on one connection: which client requests kproxy answers itself.

Only when some rule says ``enforce = true`` does a connection get a gate (otherwise the
relay's cost is one attribute check per read). The gate frames the client's bytes
before anything is forwarded (a request's bytes go on only once it is whole and judged),
hands back runs of allowed frames to forward as they are, and a ``Refusal`` for a
request that breaks an enforced rule: its request event (for the observers) and the
answer kproxy gives in the broker's place (``policy.answers``). The relay writes it once
the answers to every request sent before it have gone out: Kafka answers in order.

No I/O here; the relay owns the sockets.
"""

from __future__ import annotations

import struct
import time
from collections import deque

from ..policy import Policy, Subject, refusal_answer
from ..policy.answers import NEVER_REFUSED
from ..protocol.connection import FrameTooLarge, RequestReceived, ResponseReceived, wrong_protocol
from ..protocol.pair_fields import pair_fields
from ..protocol.client_software import FIRST_NAMING_VERSION
from ..protocol.messages import decode_request
from ..protocol.api_keys import ApiKey
from ..protocol.errors import DecodeError

_PREFIX = struct.Struct(">ihhi")       # size, api key, api version, correlation id
_SIZE = struct.Struct(">i")
_PRODUCE, _API_VERSIONS = int(ApiKey.PRODUCE), int(ApiKey.API_VERSIONS)   # plain ints: compared per request


class Refusal:
    """A request kproxy answers itself: its event, and the answer (None: acks=0, no answer)."""

    __slots__ = ("event", "answer", "rule")

    def __init__(self, event: RequestReceived, answer: bytes | None, rule: str):
        self.event = event
        self.answer = answer
        self.rule = rule

    def answered(self, now: float) -> ResponseReceived:
        return ResponseReceived(self.answer, self.event, now)


class PolicyGate:
    """One connection's enforcement. ``feed(data)`` -> bytes to forward and Refusals, in order."""

    def __init__(self, policy: Policy, max_frame_size: int, counts: dict[str, int],
                 clock=time.monotonic):
        self.policy = policy
        self.max_frame_size = max_frame_size
        self.counts = counts                  # rule -> requests refused (shared by the process)
        self.clock = clock
        self._buffer = bytearray()
        self._framed = False                  # a frame has started: the client speaks Kafka
        self._software: tuple[str | None, str | None] = (None, None)
        self.answered = 0                     # broker answers delivered so far
        self._waiting: deque[tuple[int, Refusal]] = deque()    # (due after this many answers, refusal)
        # API keys some enforced rule looks at (None: every API)
        enforced = [r.apis for r in policy.rules if r.enforce]
        self._keys = None if any(a is None for a in enforced) else frozenset().union(*enforced)

    @property
    def partial(self) -> int:
        """Bytes of an incomplete request held back."""
        return len(self._buffer)

    @property
    def missing(self) -> int:
        buffer = self._buffer
        if len(buffer) < 4:
            return 4 - len(buffer) if buffer else 0
        return _SIZE.unpack_from(buffer)[0] + 4 - len(buffer)

    def feed(self, data, raw_tokens: bool) -> list:
        """Complete frames so far: runs of allowed frames (bytes, size prefixes included) and
        Refusals, in order. ``raw_tokens``: the connection is in SaslHandshake v0's raw-token
        mode, whose frames are not requests. Raises FrameTooLarge."""
        buffer = self._buffer
        buffer += data
        out: list = []
        pos = run = 0
        end = len(buffer)
        while end - pos >= 4:
            size, = _SIZE.unpack_from(buffer, pos)
            if size < 0 or size > self.max_frame_size:
                # Before any frame: maybe TLS or HTTP spoken to a Kafka listener (its reply says so).
                wrong = None if self._framed else wrong_protocol("client", buffer[pos:pos + 4])
                raise wrong or FrameTooLarge(f"client frame of {size} bytes (maximum {self.max_frame_size})")
            self._framed = True
            stop = pos + 4 + size
            if stop > end:
                break
            refusal = None if raw_tokens else self._judge(buffer, pos, stop)
            if refusal is not None:
                if pos > run:
                    out.append(bytes(buffer[run:pos]))
                out.append(refusal)
                run = stop
            pos = stop
        if pos > run:
            out.append(bytes(buffer[run:pos]))
        del buffer[:pos]
        return out

    def _judge(self, buffer: bytearray, pos: int, stop: int) -> Refusal | None:
        if stop - pos < _PREFIX.size:
            return None                       # the broker closes on it; kproxy's tracker says so
        _, api_key, api_version, correlation_id = _PREFIX.unpack_from(buffer, pos)
        keys = self._keys
        if api_key in NEVER_REFUSED:
            if api_key == _API_VERSIONS and api_version >= FIRST_NAMING_VERSION:
                self._learn_software(bytes(buffer[pos + 4:stop]))
            return None
        if keys is not None and api_key not in keys:
            return None
        frame = bytes(buffer[pos + 4:stop])
        try:
            request = decode_request(frame)
        except DecodeError:
            return None                       # the broker judges what kproxy cannot read
        if request.is_opaque:
            return None
        subject = Subject(api_key, api_version, request.client_id, self._software, request.body)
        violation = self.policy.enforced(subject)
        if violation is None:
            return None
        rule = violation.rule
        message = f"refused by kproxy policy rule {rule.name}: {violation.reason}"
        answer = refusal_answer(request, rule.error_code, message)
        if answer is None:
            return None                       # no place for an error in its answer: let it pass
        expects = not (api_key == _PRODUCE and request.body.acks == 0)
        self.counts[rule.name] = self.counts.get(rule.name, 0) + 1
        event = RequestReceived(frame, api_key, api_version, correlation_id, self.clock(), expects)
        return Refusal(event, answer if expects else None, rule.name)

    def _learn_software(self, frame: bytes) -> None:
        """The software an ApiVersions v3+ names (the latest counts, as for the broker)."""
        try:
            request = decode_request(frame)
        except DecodeError:
            return
        if not request.is_opaque:
            fields = pair_fields(_API_VERSIONS, request.body, None)
            self._software = (fields["client_software_name"], fields["client_software_version"])

    # ------------------------------------------------------------ answers, in order

    def hold(self, refusal: Refusal, in_flight: int) -> None:
        """Answer ``refusal`` after the ``in_flight`` broker answers still owed before it."""
        self._waiting.append((self.answered + in_flight, refusal))

    def due(self) -> list[Refusal]:
        """Refusals whose turn has come (every answer owed before them delivered)."""
        waiting = self._waiting
        out = []
        while waiting and waiting[0][0] <= self.answered:
            out.append(waiting.popleft()[1])
        return out
