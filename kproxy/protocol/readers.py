"""Requests read the way the broker reads them, to predict what it does with them.

Pairing must agree with the broker exactly (``connection``), so whether a request
is answered is read from its bytes as Kafka's own parser reads them: padded
varints accepted, Java int arithmetic, the broker's own limits. kproxy's strict
codec refuses what the broker accepts, so it cannot be used here. The names are
the package's own (``connection`` and nothing else uses them).
"""

from __future__ import annotations

import struct

from . import schema
from .api_keys import ApiKey
from .errors import UntrackableRequest

_I16 = struct.Struct(">h")
# Compared per frame: plain int globals (an ApiKey attribute lookup costs ~4 global
# reads, and an int compares with an int faster than with an IntEnum member).
_PRODUCE = int(ApiKey.PRODUCE)
# The broker (Kafka 4.x) refuses a struct claiming more tagged fields than this
# (3.x accepted more; refusing where either refuses is safe: kproxy then closes).
BROKER_MAX_TAGGED_FIELDS = 10_000
_MAX_STRING = 0x7FFF            # the broker refuses longer strings


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
