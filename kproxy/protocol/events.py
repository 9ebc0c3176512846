"""The events a ``Connection`` gives: small classes over the raw frame.

Events carry the raw frame and decode it only when asked (``.request`` /
``.response``), so the proxy can forward first and decode afterwards.
Decoding failures never raise here: they show up as ``decode_error``.
``.partial`` decodes only what observers read of Produce and Fetch (``skim``).
"""

from __future__ import annotations

from . import schema
from .errors import DecodeError
from .messages import Request, Response, decode_request, decode_response
from .skim import SKIMMED_REQUESTS, SKIMMED_RESPONSES, skim_request, skim_response
from .tally import TALLIED as _TALLIED, tally_request, tally_response

_UNREAD = object()              # an event's tally before it is read (None: it has none)


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
