"""Frames ⇄ Kafka requests and responses (headers + bodies).

A *frame* here is what follows the int32 size prefix on the wire. Request
frames carry their own API key and version; response frames do not, so the
caller (normally the connection tracker) supplies the request's key and
version. Frames for API keys or versions the schema does not know decode to
an ``OpaqueBody``: the header is still read, the body kept as raw bytes, and
re-encoding reproduces the frame.
"""

from __future__ import annotations

import copy
import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

from . import schema
from .api_keys import ApiKey
from ._codec import Struct, StructCodec, message_codec, read_uvarint
from .errors import DecodeError

_REQUEST_PREFIX = struct.Struct(">hhi")    # api_key, api_version, correlation_id
_CORRELATION = struct.Struct(">i")
_I16 = struct.Struct(">h")
EMPTY_TAGS = b"\x00"                        # a tagged-field block holding no fields
# Header versions of (API key, version) pairs, remembered (every frame needs one): room for
# every pair Kafka defines (~1,500 per direction) and some unknown ones; bounded, as a client
# may send any of 2^32.
HEADER_VERSIONS_CACHED = 4096
_request_header_version = lru_cache(HEADER_VERSIONS_CACHED)(schema.request_header_version)
_response_header_version = lru_cache(HEADER_VERSIONS_CACHED)(schema.response_header_version)


@dataclass(frozen=True, slots=True)
class OpaqueBody:
    """A body kproxy cannot decode (unknown API key or version): raw bytes, kept intact."""
    data: bytes

    def __len__(self) -> int:
        return len(self.data)


@dataclass(slots=True)
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Struct | OpaqueBody
    header_version: int | None = None     # None when the API version is unknown
    header_tags: bytes = EMPTY_TAGS        # raw header tagged-field block (header v2)
    trailing: bytes = b""                  # bytes after the body (librdkafka sends some; Kafka ignores them)

    @property
    def api_name(self) -> str:
        return schema.api_name(self.api_key)

    @property
    def is_opaque(self) -> bool:
        return isinstance(self.body, OpaqueBody)


@dataclass(slots=True)
class Response:
    correlation_id: int
    body: Struct | OpaqueBody
    header_version: int | None = None
    header_tags: bytes = EMPTY_TAGS        # raw header tagged-field block (header v1)
    body_version: int | None = None        # version the body was decoded at (ApiVersions fallback: 0)
    trailing: bytes = b""                  # bytes after the body, kept for byte-identical re-encoding

    @property
    def is_opaque(self) -> bool:
        return isinstance(self.body, OpaqueBody)


_LOW_LEVEL = (struct.error, IndexError, ValueError, OverflowError, TypeError, RecursionError)


def _tag_block_end(frame, pos: int) -> int:
    """Skip a tagged-field block, returning where it ends."""
    count, pos = read_uvarint(frame, pos)
    for _ in range(count):
        _, pos = read_uvarint(frame, pos)
        size, pos = read_uvarint(frame, pos)
        pos += size
    if pos > len(frame):
        raise DecodeError("header tagged fields run past the end of the frame")
    return pos


def _header_tags(frame, pos: int) -> tuple[int, bytes]:
    """Where a header's tagged-field block ends, and the block. Nearly every header has none
    (one zero byte): that block is told at a glance, every frame."""
    if frame[pos] == 0:
        return pos + 1, EMPTY_TAGS
    end = _tag_block_end(frame, pos)
    return end, bytes(frame[pos:end])


# (message spec, version) -> its compiled body codec: the whole one, or a partial one (``skim``).
BodyCodec = Callable[[schema.MessageSpec, int], StructCodec]


def _decode_body(spec: schema.MessageSpec, version: int, frame, pos: int,
                 codec: BodyCodec) -> tuple[Struct, bytes]:
    """The body, and any bytes after it (kept: Kafka ignores them, and re-encoding must too)."""
    body, end = codec(spec, version).read(frame, pos)
    return body, bytes(frame[end:]) if end < len(frame) else b""


def decode_request(frame, codec: BodyCodec = message_codec) -> Request:
    """Decode a request frame (bytes after the size prefix). Raises only DecodeError.
    ``codec`` picks the body reader (``skim`` passes its partial ones)."""
    try:
        api_key, api_version, correlation_id = _REQUEST_PREFIX.unpack_from(frame, 0)
        header_version = _request_header_version(api_key, api_version)
        pos = 8
        client_id = None
        header_tags = EMPTY_TAGS
        if header_version != 0:
            # Header v1 and v2 share this prefix; unknown versions are read as v1.
            n, = _I16.unpack_from(frame, pos)
            pos += 2
            if n >= 0:
                if pos + n > len(frame):
                    raise DecodeError("client_id runs past the end of the frame")
                client_id = str(frame[pos:pos + n], "utf-8", "surrogateescape")
                pos += n
            elif n != -1:
                raise DecodeError(f"bad client_id length {n}")
        if header_version is None:
            return Request(api_key, api_version, correlation_id, client_id,
                           OpaqueBody(bytes(frame[pos:])), None, EMPTY_TAGS)
        if header_version == 2:
            pos, header_tags = _header_tags(frame, pos)
        body, trailing = _decode_body(schema.REQUESTS[api_key], api_version, frame, pos, codec)
        return Request(api_key, api_version, correlation_id, client_id, body,
                       header_version, header_tags, trailing)
    except DecodeError as exc:
        raise DecodeError(f"request: {exc}") from None
    except _LOW_LEVEL as exc:
        raise DecodeError(f"request: truncated or malformed ({exc})") from None


def _api_versions_fallback(frame, pos: int) -> bool:
    """True if an ApiVersions response body is the v0 'unsupported version' answer."""
    return len(frame) >= pos + 2 and _I16.unpack_from(frame, pos)[0] == schema.UNSUPPORTED_VERSION


def decode_response(frame, api_key: int, api_version: int, codec: BodyCodec = message_codec) -> Response:
    """Decode a response frame to a request of (api_key, api_version). Raises only DecodeError.
    ``codec`` as for ``decode_request``."""
    try:
        correlation_id, = _CORRELATION.unpack_from(frame, 0)
        pos = 4
        if api_key == ApiKey.API_VERSIONS and _api_versions_fallback(frame, pos):
            try:
                body, trailing = _decode_body(schema.RESPONSES[api_key], 0, frame, pos, codec)
                if not trailing:
                    return Response(correlation_id, body, 0, EMPTY_TAGS, 0)
            except DecodeError:
                pass   # error 35 at the version asked for after all
        header_version = _response_header_version(api_key, api_version)
        body_version = api_version
        if header_version is None:
            return Response(correlation_id, OpaqueBody(bytes(frame[pos:])), None)
        header_tags = EMPTY_TAGS
        if header_version == 1:
            pos, header_tags = _header_tags(frame, pos)
        body, trailing = _decode_body(schema.RESPONSES[api_key], body_version, frame, pos, codec)
        return Response(correlation_id, body, header_version, header_tags, body_version, trailing)
    except DecodeError as exc:
        raise DecodeError(f"{schema.api_name(api_key)} v{api_version} response: {exc}") from None
    except _LOW_LEVEL as exc:
        raise DecodeError(f"{schema.api_name(api_key)} v{api_version} response: "
                          f"truncated or malformed ({exc})") from None


def encode_request(request: Request) -> bytes:
    """Encode a request to frame bytes (no size prefix)."""
    out = bytearray(_REQUEST_PREFIX.pack(request.api_key, request.api_version, request.correlation_id))
    header_version = request.header_version
    if header_version is None:
        header_version = schema.request_header_version(request.api_key, request.api_version)
    if header_version != 0:
        if request.client_id is None:
            out += b"\xff\xff"
        else:
            data = request.client_id.encode("utf-8", "surrogateescape")
            out += _I16.pack(len(data))
            out += data
    if isinstance(request.body, OpaqueBody):
        out += request.body.data
        return bytes(out)
    if header_version == 2:
        out += request.header_tags
    spec = schema.REQUESTS[request.api_key]
    message_codec(spec, request.api_version).write(request.body, out)
    out += request.trailing
    return bytes(out)


def encode_response(response: Response, api_key: int, api_version: int) -> bytes:
    """Encode a response to a request of (api_key, api_version) to frame bytes (no size prefix)."""
    out = bytearray(_CORRELATION.pack(response.correlation_id))
    if isinstance(response.body, OpaqueBody):
        out += response.body.data
        return bytes(out)
    body_version = api_version if response.body_version is None else response.body_version
    header_version = schema.response_header_version(api_key, body_version)
    if header_version is None:
        raise ValueError(f"{schema.api_name(api_key)} v{api_version} is not in the schema")
    if header_version == 1:
        out += response.header_tags
    message_codec(schema.RESPONSES[api_key], body_version).write(response.body, out)
    out += response.trailing
    return bytes(out)


def new_body(kind: str, api_key: int, api_version: int, **fields: Any) -> Struct:
    """A body with every field at its default, overridden by ``fields`` (for tools and tests)."""
    spec = (schema.REQUESTS if kind == "request" else schema.RESPONSES)[api_key]
    codec = message_codec(spec, api_version)
    values = copy.deepcopy(codec.defaults)
    unknown = set(fields) - set(values)
    if unknown:
        raise ValueError(f"{spec.name} v{api_version} has no field(s) {sorted(unknown)}")
    values.update(fields)
    return Struct(**values)
