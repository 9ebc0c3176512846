"""The codec's exceptions: one type for decoding, and its kinds for a stream that ends.

Decoding untrusted bytes can fail in many low-level ways (short buffers,
bad lengths, invalid varints). All of them surface as ``DecodeError`` so a
caller needs exactly one ``except`` to keep forwarding safe.

Following a connection's byte stream (``connection``) can fail in ways that
forwarding cannot survive: those are ``ProtocolViolation`` (a ``DecodeError``
too), and the connection must close before the bytes that caused it are forwarded.
"""


class DecodeError(ValueError):
    """Raised for any input the codec cannot decode; says where and why."""


class ProtocolViolation(DecodeError):
    """The byte stream cannot be followed safely any more: the connection must close."""


class FrameTooLarge(ProtocolViolation):
    """A size prefix above the configured maximum (or negative)."""


class UntrackableRequest(ProtocolViolation):
    """A request whose answer cannot be predicted (the broker would refuse it, or kproxy
    does not know its version): closing beats guessing and mis-pairing what follows."""


class PassedAnswerChanged(ProtocolViolation):
    """A held answer whose first bytes already passed (``fetch_cut``) had to be rewritten there,
    or to another length: what the client got cannot be made right, the connection must close."""


class UnpairedResponse(ProtocolViolation):
    """A response that is not for the oldest request awaiting one (the broker answers in order)."""

