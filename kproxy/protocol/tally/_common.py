"""What the tally readers share: lengths, strings and topics read as the strict reader
checks them, the unpackers, and version thresholds looked up in the schema's rows."""

from __future__ import annotations

import struct

from .. import schema
from .._codec import Uuid, read_uvarint
from ..errors import DecodeError

HEAD = struct.Struct(">hhih").unpack_from        # api key, version, correlation id, client_id length
I8 = struct.Struct(">b").unpack_from
I16 = struct.Struct(">h").unpack_from
I32 = struct.Struct(">i").unpack_from
I64 = struct.Struct(">q").unpack_from
INDEX_BYTES = 4                                  # a partition index, int32
UUID_BYTES = 16
MALFORMED = (DecodeError, struct.error, IndexError)


def since(spec: schema.MessageSpec, field: str, struct_name: str | None = None) -> int:
    """The first version of ``spec`` (or its struct) with ``field``."""
    rows = spec.fields if struct_name is None else spec.structs[struct_name]
    return next(f.versions[0] for f in rows if f.name == field)


def long_length(buf, pos: int) -> tuple[int, int]:
    """A compact length (uvarint N+1) of two bytes or more: N, and where it ends."""
    n, pos = read_uvarint(buf, pos)
    return n - 1, pos


def skip_nullable_string(buf, pos: int, flexible: bool, end: int, nullable: bool = True) -> int:
    """Where a string (nullable unless told) ends; DecodeError where the strict reader refuses it."""
    if flexible:
        n = buf[pos] - 1
        pos += 1
        if n >= 0x7F:
            n, pos = long_length(buf, pos - 1)
    else:
        n, = I16(buf, pos)
        pos += 2
    if n < (-1 if nullable else 0) or pos + n > end:
        raise DecodeError("malformed string")
    return pos + n if n > 0 else pos


def array_count(buf, pos: int, flexible: bool, end: int) -> tuple[int, int]:
    """A non-nullable array's count, checked as the strict reader checks it."""
    if flexible:
        n = buf[pos] - 1
        pos += 1
        if n >= 0x7F:
            n, pos = long_length(buf, pos - 1)
    else:
        n, = I32(buf, pos)
        pos += 4
    if n < 0 or n > end - pos:
        raise DecodeError("malformed array count")
    return n, pos


def read_topic(buf, pos: int, flexible: bool, by_id: bool, end: int) -> tuple[str | Uuid, int]:
    """A topic's id (``by_id``) or name (a non-nullable string)."""
    if by_id:
        if pos + UUID_BYTES > end:
            raise DecodeError("truncated topic id")
        return Uuid(buf[pos:pos + UUID_BYTES]), pos + UUID_BYTES
    if flexible:
        n = buf[pos] - 1
        pos += 1
        if n >= 0x7F:
            n, pos = long_length(buf, pos - 1)
    else:
        n, = I16(buf, pos)
        pos += 2
    if n < 0 or pos + n > end:
        raise DecodeError("malformed topic name")
    return str(buf[pos:pos + n], "utf-8", "surrogateescape"), pos + n
