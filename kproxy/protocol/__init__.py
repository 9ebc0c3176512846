"""kproxy's sans-I/O Kafka codec: bytes in, decoded messages and events out.

No sockets and no asyncio here: the proxy's I/O layer feeds bytes in and
forwards bytes out; this package only interprets them.

- ``decode_request(frame)`` / ``encode_request(request)``: a request frame
  (the bytes after the int32 size prefix) ⇄ ``Request``.
- ``decode_response(frame, api_key, api_version)`` /
  ``encode_response(response, api_key, api_version)``: responses need the
  request's key and version, which the wire does not repeat.
- Bodies are ``Struct`` objects whose attributes are the snake_case names of
  the fields in Kafka's message definitions (``body.brokers[0].host``);
  unknown API keys/versions give an ``OpaqueBody`` that re-encodes unchanged.
- Re-encoding a decoded frame gives the same bytes.
- ``DecodeError`` is the only exception decoding raises, whatever the input.
- ``is_removed(api_key, version)`` / ``removed_versions(api_key)``: request
  versions Kafka 4.0 removed (KIP-896), still decoded here, rejected by 4.x.
- ``pair_fields`` names, per API, the fields holding a group, member,
  generation or client software (shared by capture and metrics).
- ``records`` decodes record batches on demand; ``connection`` pairs requests
  and responses on a byte stream, from ``framer``'s frames into ``events``,
  predicting the broker with ``readers``; ``sniff`` names a peer speaking TLS or HTTP.
"""

from ._codec import Struct, Uuid
from .errors import DecodeError
from .messages import (OpaqueBody, Request, Response, decode_request, decode_response,
                       encode_request, encode_response, new_body)
from .schema import (API_KEYS, API_NAMES, SCHEMA_SOURCES, api_name, error_name, is_known,
                     is_removed, removed_versions, request_header_version,
                     response_header_version, version_range)

__all__ = [
    "API_KEYS", "API_NAMES", "DecodeError", "OpaqueBody", "Request", "Response",
    "SCHEMA_SOURCES", "Struct", "Uuid", "api_name", "decode_request", "decode_response",
    "encode_request", "encode_response", "error_name", "is_known", "is_removed", "new_body",
    "removed_versions", "request_header_version", "response_header_version", "version_range",
]
