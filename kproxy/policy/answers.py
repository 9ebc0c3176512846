"""The answer kproxy gives a request it refuses: a well-formed response of the request's
version carrying the error where the client reads it (per partition for Produce and Fetch,
per topic for CreateTopics, top level elsewhere), so a client library reports an ordinary
Kafka error.

APIs a connection needs to start or find the cluster (ApiVersions, SASL, Metadata) are
never refused, nor APIs whose answer has no place for an error (``refusal_answer`` None).
"""

from __future__ import annotations

from ..protocol import API_KEYS, Request, Response, Struct, encode_response, new_body
from .subject import field, items

# A connection needs these to begin and to find its brokers: refusing them would look to a
# client like a broken cluster, not a refused request.
NEVER_REFUSED = frozenset(API_KEYS[name] for name in
                          ("ApiVersions", "SaslHandshake", "SaslAuthenticate", "Metadata"))
PRODUCE, FETCH, CREATE_TOPICS = API_KEYS["Produce"], API_KEYS["Fetch"], API_KEYS["CreateTopics"]
UNKNOWN_OFFSET = -1                 # base offset, high watermark ...: what a failed partition says


def _given(**fields) -> Struct:
    """A struct of the fields given a value (absent ones are written as their defaults: a
    topic id where the version names topics, a name where it uses ids)."""
    return Struct(**{k: v for k, v in fields.items() if v is not None})


def _produce(request: Request, code: int, message: str) -> Struct:
    topics = [_given(name=field(t, "name"), topic_id=field(t, "topic_id"), partition_responses=[
        Struct(index=field(p, "index"), error_code=code, base_offset=UNKNOWN_OFFSET,
               log_append_time_ms=UNKNOWN_OFFSET, log_start_offset=UNKNOWN_OFFSET, error_message=message)
        for p in items(t, "partition_data")]) for t in items(request.body, "topic_data")]
    return new_body("response", PRODUCE, request.api_version, responses=topics)


def _fetch(request: Request, code: int, message: str) -> Struct:
    topics = [_given(topic=field(t, "topic"), topic_id=field(t, "topic_id"), partitions=[
        Struct(partition_index=field(p, "partition"), error_code=code, high_watermark=UNKNOWN_OFFSET,
               last_stable_offset=UNKNOWN_OFFSET, log_start_offset=UNKNOWN_OFFSET)
        for p in items(t, "partitions")]) for t in items(request.body, "topics")]
    return new_body("response", FETCH, request.api_version, responses=topics)


def _create_topics(request: Request, code: int, message: str) -> Struct:
    topics = [Struct(name=field(t, "name"), error_code=code, error_message=message,
                     num_partitions=-1, replication_factor=-1)
              for t in items(request.body, "topics")]
    return new_body("response", CREATE_TOPICS, request.api_version, topics=topics)


_BUILDERS = {PRODUCE: _produce, FETCH: _fetch, CREATE_TOPICS: _create_topics}


def _top_level(request: Request, code: int, message: str) -> Struct | None:
    body = new_body("response", request.api_key, request.api_version)
    if "error_code" not in body.__dict__:
        return None
    body.error_code = code
    if "error_message" in body.__dict__:
        body.error_message = message
    if "member_id" in body.__dict__ and isinstance(field(request.body, "member_id"), str):
        body.member_id = field(request.body, "member_id")
    return body


def refusal_answer(request: Request, error_code: int, message: str) -> bytes | None:
    """The response frame (without its size prefix) refusing ``request`` with ``error_code``;
    None when kproxy does not refuse this API."""
    if request.api_key in NEVER_REFUSED or request.is_opaque:
        return None
    build = _BUILDERS.get(request.api_key, _top_level)
    body = build(request, error_code, message)
    if body is None:
        return None
    return encode_response(Response(request.correlation_id, body), request.api_key, request.api_version)
