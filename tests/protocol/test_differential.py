"""Differential tests: kproxy's codec agrees with two independent implementations on the same bytes.

Oracles:
- kio (Rust core, its own code generator over Kafka 4.x definitions): every
  (API, version, request|response) it has.
- kafka-python 3.x (pure Python, its own generator over bundled Kafka JSON,
  52 APIs): every (API, version, request|response) it has.

For each message version, in both directions: one side encodes a populated
body, the other decodes it, and the decoded values agree field by field. The
body bytes both sides produce for the same values are compared as well, and
kproxy re-encodes whatever it decoded to identical bytes.

Fields are matched by position, not by name: both oracles list the fields of
a struct in the order of Kafka's definition, as kproxy does, and the tests
check that the names agree up to the renames listed in ``KIO_RENAMES`` /
``KAFKA_PYTHON_RENAMES``. No field is skipped. Value ranges an oracle cannot
represent are narrowed before the comparison (``kio_representable``,
``kp_representable``); each narrowing says why. Representation differences are
normalised (kio: timedelta/datetime/enum/UUID-or-None; kafka-python: bit sets,
None for an absent tagged struct) in the ``*_plain`` helpers.

Both oracles parse bodies only; frames here are header + body, so the header
(whose length follows from the header version) is sliced off or prepended.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import typing
import uuid
from types import NoneType

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kproxy.protocol import (Request, Response, Struct, decode_request, decode_response,
                             encode_request, encode_response, new_body, schema)
from kproxy.protocol._codec import _Compiler, _in
from kproxy.protocol.api_keys import ApiKey
from tests.protocol.samples import sample_body

CLIENT_ID = "diff-ü"
CORRELATION_ID = 7


# ------------------------------------------------------------ common helpers

def rows_at(rows, version):
    return [f for f in rows if _in(f.versions, version)]


def element_type(f) -> str:
    return f.type[2:] if f.type.startswith("[]") else f.type


def spec_of(kind, api_key):
    return (schema.REQUESTS if kind == "request" else schema.RESPONSES)[api_key]


def header_bytes(kind, api_key, version) -> bytes:
    """The header kproxy writes in front of a body (no header tags)."""
    frame = kproxy_encode(kind, api_key, version, new_body(kind, api_key, version))
    return frame[:header_length(kind, api_key, version)]


def header_length(kind, api_key, version) -> int:
    if kind == "request":
        hv = schema.request_header_version(api_key, version)
        n = 8
        if hv >= 1:
            n += 2 + len(CLIENT_ID.encode())
        if hv == 2:
            n += 1                                   # empty tagged-field block
        return n
    hv = schema.response_header_version(api_key, version)
    return 4 + (1 if hv == 1 else 0)


def kproxy_encode(kind, api_key, version, body) -> bytes:
    if kind == "request":
        return encode_request(Request(api_key, version, CORRELATION_ID, CLIENT_ID, body))
    return encode_response(Response(CORRELATION_ID, body), api_key, version)


def kproxy_decode(kind, api_key, version, frame):
    if kind == "request":
        decoded = decode_request(frame)
        assert (decoded.api_key, decoded.api_version) == (api_key, version)
    else:
        decoded = decode_response(frame, api_key, version)
    assert not decoded.is_opaque
    assert decoded.correlation_id == CORRELATION_ID
    return decoded


def kproxy_reencode(kind, api_key, version, decoded) -> bytes:
    if kind == "request":
        return encode_request(decoded)
    return encode_response(decoded, api_key, version)


def kproxy_plain(value):
    """A kproxy value as plain data: dicts, lists, ints, str, bytes (UUIDs and records as bytes)."""
    if isinstance(value, Struct):
        return {k: kproxy_plain(v) for k, v in value.fields().items()}
    if isinstance(value, list):
        return [kproxy_plain(v) for v in value]
    if isinstance(value, (bytes, memoryview)):     # Uuid is a bytes subclass; records are memoryviews
        return bytes(value)
    return value


def assert_same(expected, actual, path="body"):
    """Recursive equality with a path in the failure message."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        # Key order differs harmlessly (kproxy appends tagged fields after the regular ones).
        assert sorted(expected) == sorted(actual), f"{path}: fields {list(expected)} != {list(actual)}"
        for key in expected:
            assert_same(expected[key], actual[key], f"{path}.{key}")
    elif isinstance(expected, list) and isinstance(actual, list):
        assert len(expected) == len(actual), f"{path}: {len(expected)} != {len(actual)} elements"
        for i, (a, b) in enumerate(zip(expected, actual)):
            assert_same(a, b, f"{path}[{i}]")
    else:
        assert type(expected) is type(actual) and expected == actual, \
            f"{path}: {expected!r} != {actual!r}"


def _id(kind, api_key, version):
    return f"{schema.api_name(api_key)}-{kind}-v{version}"


# ------------------------------------------------------------ kio

kio = pytest.importorskip("kio")
from kio.index import load_request_schema, load_response_schema    # noqa: E402
from kio.schema.errors import ErrorCode                              # noqa: E402
from kio.schema.index import api_key_map, schema_name_map          # noqa: E402
from kio.serial import entity_reader, entity_writer                 # noqa: E402
from kio.static.primitive import Records                            # noqa: E402

# kio registers strategies for its primitives but not for opaque record batches.
st.register_type_strategy(Records, st.binary(max_size=64).map(Records))

# kio names a millisecond duration/timestamp field without its "_ms" suffix (its values are
# timedelta/datetime), appends "_" to names that shadow Python builtins ("id" -> "id_"),
# and was generated from Kafka definitions in which these fields had older names.
KIO_SUFFIX_TYPES = {"timedelta_i32", "timedelta_i64", "datetime_i64"}
KIO_RENAMES = {
    ("generation_id_or_member_epoch", "generation_id"),             # OffsetCommit request (KIP-848 rename)
    ("acceptable_recovery_lag_legacy", "acceptable_recovery_lag"),  # StreamsGroupHeartbeat
}
KNOWN_ERROR_CODES = sorted(int(c) for c in ErrorCode)
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
MS = datetime.timedelta(milliseconds=1)
MAX_EXACT_DATETIME_MS = 2**41     # kio goes through float seconds; exact below this
ZERO_UUID_BYTES = bytes(16)


def kio_messages():
    """(kind, api_key, version, kio class) for every message kio and kproxy both have."""
    out = []
    for api_key, name in sorted(api_key_map.items()):
        for version in sorted(schema_name_map[name]):
            for kind, load in (("request", load_request_schema), ("response", load_response_schema)):
                if api_key not in schema.REQUESTS or not spec_of(kind, api_key).has_version(version):
                    continue
                try:
                    cls = load(api_key, version)
                except Exception:          # noqa: BLE001 - kio has no such entity
                    continue
                out.append((kind, api_key, version, cls))
    return out


KIO_MESSAGES = kio_messages()
KIO_IDS = [_id(k, a, v) for k, a, v, _ in KIO_MESSAGES]


def _kio_inner(tp):
    """The entity or primitive type inside Optional[...] / tuple[..., ...]."""
    while typing.get_args(tp):
        tp = next(a for a in typing.get_args(tp) if a is not NoneType and a is not Ellipsis)
    return tp


def _kio_optional(field) -> bool:
    tp = field.type
    if typing.get_origin(tp) is tuple:
        tp = typing.get_args(tp)[0]
    return NoneType in typing.get_args(tp)


def kio_pairs(rows, version, cls):
    """Zip kproxy's fields at a version with the kio dataclass fields; names must agree."""
    ours = rows_at(rows, version)
    theirs = dataclasses.fields(cls)
    assert [f.name for f in ours] == [_kio_expected_name(f, t) for f, t in zip(ours, theirs)] \
        and len(ours) == len(theirs), \
        f"{cls.__name__}: kproxy fields {[f.name for f in ours]} vs kio {[t.name for t in theirs]}"
    return list(zip(ours, theirs))


def _kio_expected_name(ours, theirs) -> str:
    """Map kio's field name back to kproxy's, if it is one of the known renames."""
    name = theirs.name
    if name == ours.name:
        return name
    if theirs.metadata.get("kafka_type") in KIO_SUFFIX_TYPES and name + "_ms" == ours.name:
        return ours.name
    if name == ours.name + "_":
        return ours.name
    if (ours.name, name) in KIO_RENAMES:
        return ours.name
    return name


def kio_representable(spec, rows, version, cls, body: Struct) -> Struct:
    """Narrow a kproxy sample body (in place) to values kio can represent.

    - error_code: kio decodes into an enum and raises on codes it does not know;
      unknown codes are mapped onto known ones.
    - datetime_i64: kio decodes to an aware datetime and raises on negative
      timestamps other than -1 in a nullable field; it also converts through
      float seconds, which is exact only up to about 2**41 ms (year 2039):
      values go into [0, 2**41).
    - timedelta_i64: kio decodes to datetime.timedelta (which holds less than
      int64 milliseconds), through float seconds as well: values are kept
      under 2**41 in magnitude.
    """
    for ours, theirs in kio_pairs(rows, version, cls):
        value = getattr(body, ours.name)
        kafka_type = theirs.metadata.get("kafka_type")
        inner = element_type(ours)
        if inner in spec.structs:
            nested = _kio_inner(theirs.type)
            items = value if isinstance(value, list) else [value]
            for item in items:
                if item is not None:
                    kio_representable(spec, spec.structs[inner], version, nested, item)
            continue

        def narrow(v):
            if kafka_type == "error_code" and v not in KNOWN_ERROR_CODES:
                return KNOWN_ERROR_CODES[v % len(KNOWN_ERROR_CODES)]
            if kafka_type == "datetime_i64" and not (v == -1 and _kio_optional(theirs)):
                return v % MAX_EXACT_DATETIME_MS
            if kafka_type == "timedelta_i64" and abs(v) >= MAX_EXACT_DATETIME_MS:
                return v % MAX_EXACT_DATETIME_MS
            return v
        if isinstance(value, list):
            setattr(body, ours.name, [narrow(v) for v in value])
        elif value is not None:
            setattr(body, ours.name, narrow(value))
    return body


def kio_scalar_plain(kafka_type, value):
    if value is None:
        if kafka_type == "uuid":
            return ZERO_UUID_BYTES        # kio reads the zero UUID as None
        if kafka_type == "datetime_i64":
            return -1                      # kio reads timestamp -1 as None
        return None
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return value // MS
    if kafka_type == "datetime_i64":
        return (value - EPOCH) // MS
    if kafka_type == "uuid":
        return value.bytes
    if kafka_type in ("bytes", "records"):
        return bytes(value)
    if kafka_type == "bool":
        return bool(value)
    if kafka_type == "float64":
        return float(value)
    if kafka_type == "string":
        return str(value)
    return int(value)                      # int8..int64, uint16, error_code enum


def kio_plain(spec, rows, version, entity) -> dict:
    """A kio entity as plain data keyed by kproxy's field names."""
    out = {}
    for ours, theirs in kio_pairs(rows, version, type(entity)):
        value = getattr(entity, theirs.name)
        inner = element_type(ours)
        kafka_type = theirs.metadata.get("kafka_type")
        if inner in spec.structs:
            convert = lambda e: None if e is None else kio_plain(spec, spec.structs[inner], version, e)  # noqa: E731
        else:
            convert = lambda e: kio_scalar_plain(kafka_type, e)  # noqa: E731
        if ours.type.startswith("[]"):
            out[ours.name] = None if value is None else [convert(e) for e in value]
        else:
            out[ours.name] = convert(value)
    return out


def kio_scalar(kafka_type, optional, value):
    if value is None:
        return None
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(milliseconds=value)
    if kafka_type == "datetime_i64":
        return None if value == -1 and optional else EPOCH + value * MS
    if kafka_type == "uuid":
        return uuid.UUID(bytes=bytes(value))
    if kafka_type == "error_code":
        return ErrorCode(value)
    if kafka_type in ("bytes", "records"):
        return bytes(value)
    return value


def to_kio(spec, rows, version, cls, body: Struct):
    """Build a kio entity holding the values of a kproxy body."""
    kwargs = {}
    for ours, theirs in kio_pairs(rows, version, cls):
        value = getattr(body, ours.name)
        inner = element_type(ours)
        kafka_type = theirs.metadata.get("kafka_type")
        if inner in spec.structs:
            nested = _kio_inner(theirs.type)
            convert = lambda e: None if e is None else to_kio(spec, spec.structs[inner], version, nested, e)  # noqa: E731
        else:
            optional = _kio_optional(theirs)
            convert = lambda e: kio_scalar(kafka_type, optional, e)  # noqa: E731
        if ours.type.startswith("[]"):
            kwargs[theirs.name] = None if value is None else tuple(convert(e) for e in value)
        else:
            kwargs[theirs.name] = convert(value)
    return cls(**kwargs)


def kio_serialize(cls, entity) -> bytes:
    buf = io.BytesIO()
    entity_writer(cls)(buf, entity)
    return buf.getvalue()


def kio_parse(cls, data: bytes, offset: int = 0):
    entity, size = entity_reader(cls)(data, offset)
    return entity, size


def test_kio_coverage():
    """kio's message versions are all checked: both oracles list what they cover."""
    kinds = {k for k, _, _, _ in KIO_MESSAGES}
    assert kinds == {"request", "response"}
    assert len({a for _, a, _, _ in KIO_MESSAGES}) >= 80
    assert len(KIO_MESSAGES) >= 600


@pytest.mark.parametrize("kind,api_key,version,cls", KIO_MESSAGES, ids=KIO_IDS)
def test_kproxy_encodes_kio_parses(kind, api_key, version, cls):
    spec = spec_of(kind, api_key)
    body = kio_representable(spec, spec.fields, version, cls, sample_body(kind, api_key, version))
    frame = kproxy_encode(kind, api_key, version, body)
    start = header_length(kind, api_key, version)
    entity, size = kio_parse(cls, frame, start)
    assert start + size == len(frame), "kio stopped before the end of the body"
    assert_same(kproxy_plain(body), kio_plain(spec, spec.fields, version, entity))
    assert kio_serialize(cls, entity) == frame[start:], "kio re-serializes differently"


@pytest.mark.parametrize("kind,api_key,version,cls", KIO_MESSAGES, ids=KIO_IDS)
def test_kio_serializes_kproxy_decodes(kind, api_key, version, cls):
    spec = spec_of(kind, api_key)
    values = kio_representable(spec, spec.fields, version, cls,
                               sample_body(kind, api_key, version, seed=1))
    entity = to_kio(spec, spec.fields, version, cls, values)
    data = kio_serialize(cls, entity)
    frame = header_bytes(kind, api_key, version) + data
    decoded = kproxy_decode(kind, api_key, version, frame)
    assert_same(kio_plain(spec, spec.fields, version, entity), kproxy_plain(decoded.body))
    assert kproxy_reencode(kind, api_key, version, decoded) == frame
    # Same values, same bytes: kproxy's own encoding of them matches kio's.
    assert kproxy_encode(kind, api_key, version, values) == frame


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_kio_generated_entities_decode_identically(data):
    """kio's own hypothesis strategies (st.from_type on its entities) build the values."""
    kind, api_key, version, cls = data.draw(st.sampled_from(KIO_MESSAGES), label="message")
    entity = data.draw(st.from_type(cls), label="entity")
    spec = spec_of(kind, api_key)
    body = kio_serialize(cls, entity)
    frame = header_bytes(kind, api_key, version) + body
    decoded = kproxy_decode(kind, api_key, version, frame)
    assert_same(kio_plain(spec, spec.fields, version, entity), kproxy_plain(decoded.body))
    assert kproxy_reencode(kind, api_key, version, decoded) == frame


# ------------------------------------------------------------ kafka-python

pytest.importorskip("kafka")
import kafka.protocol.admin        # noqa: E402,F401 - importing registers the message classes
import kafka.protocol.consumer     # noqa: E402,F401
import kafka.protocol.metadata     # noqa: E402,F401
import kafka.protocol.producer     # noqa: E402,F401
from kafka.protocol.api_message import ApiMessage    # noqa: E402

# kafka-python patches Metadata's authorized-operations fields into a "bitfield" (a set of
# bit numbers, None for the int32 default -2**31) named "authorized_operations", and was
# generated from definitions where OffsetCommit's field had its older name.
KAFKA_PYTHON_RENAMES = {
    ("topic_authorized_operations", "authorized_operations"),
    ("cluster_authorized_operations", "authorized_operations"),
    ("generation_id_or_member_epoch", "generation_id"),
}


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def kafka_python_messages():
    """(kind, api_key, version, class) for every message kafka-python and kproxy both have."""
    classes = {}
    for cls in _subclasses(ApiMessage):
        if getattr(cls, "_class_version", None) is None and getattr(cls, "_json", None):
            classes[(cls.API_KEY, cls.type)] = cls
    out = []
    for (api_key, kind), cls in sorted(classes.items()):
        if api_key not in schema.REQUESTS:
            continue
        lo, hi = cls.valid_versions
        for version in range(lo, hi + 1):
            if spec_of(kind, api_key).has_version(version):
                out.append((kind, api_key, version, cls))
    return out


KP_MESSAGES = kafka_python_messages()
KP_IDS = [_id(k, a, v) for k, a, v, _ in KP_MESSAGES]


def kp_pairs(rows, version, struct_field):
    ours = rows_at(rows, version)
    theirs = [f for f in struct_field.fields.values() if f.for_version_q(version)]
    names = [f.name if (f.name == t.name or (f.name, t.name) in KAFKA_PYTHON_RENAMES) else t.name
             for f, t in zip(ours, theirs)]
    assert len(ours) == len(theirs) and names == [f.name for f in ours], \
        f"{struct_field.name}: kproxy {[f.name for f in ours]} vs kafka-python {[t.name for t in theirs]}"
    return list(zip(ours, theirs))


def kproxy_default(spec, version, field):
    """kproxy's default for a field (a default-valued Struct for struct fields)."""
    return _Compiler(spec, version).default(field)


def kp_representable(kind, api_key, body: Struct) -> Struct:
    """Narrow a kproxy sample body to values kafka-python decodes the same way.

    - ApiVersions response error_code: kafka-python decodes the body as v0 whenever
      the error code is non-zero; kproxy (like the Java client) falls back to v0
      only for UNSUPPORTED_VERSION (35) and only if the body fits v0. Use 0.
    """
    if kind == "response" and api_key == ApiKey.API_VERSIONS:
        body.error_code = 0
    return body


def _is_bitfield(field) -> bool:
    return getattr(field, "type_str", None) == "bitfield"


def kp_scalar_plain(ours, theirs, value):
    if _is_bitfield(theirs):
        bits = 1 << 31 if value is None else sum(1 << b for b in value)
        return bits - (1 << 32) if bits >= 1 << 31 else bits
    if value is None:
        return ZERO_UUID_BYTES if element_type(ours) == "uuid" else None
    if isinstance(value, uuid.UUID):
        return value.bytes
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    return value


def kp_plain(spec, rows, version, struct_field, obj) -> dict:
    out = {}
    for ours, theirs in kp_pairs(rows, version, struct_field):
        value = getattr(obj, theirs.name)
        inner = element_type(ours)
        if value is None and inner in spec.structs and _in(ours.tagged, version):
            # An absent tagged struct: kafka-python says None, kproxy gives the default struct.
            out[ours.name] = kproxy_plain(kproxy_default(spec, version, ours))
            continue
        if inner in spec.structs:
            convert = lambda e: None if e is None else kp_plain(spec, spec.structs[inner], version, theirs, e)  # noqa: E731
        else:
            convert = lambda e: kp_scalar_plain(ours, theirs, e)  # noqa: E731
        if ours.type.startswith("[]"):
            out[ours.name] = None if value is None else [convert(e) for e in value]
        else:
            out[ours.name] = convert(value)
    return out


def kp_scalar(ours, theirs, value):
    if _is_bitfield(theirs):
        bits = {b for b in range(32) if value & (1 << b)}
        return None if bits == {31} else bits
    if value is None:
        return None
    if element_type(ours) == "uuid":
        return uuid.UUID(bytes=bytes(value))
    if isinstance(value, memoryview):
        return bytes(value)
    return value


def to_kp(spec, rows, version, struct_field, body: Struct, data_class=None):
    kwargs = {}
    for ours, theirs in kp_pairs(rows, version, struct_field):
        value = getattr(body, ours.name)
        inner = element_type(ours)
        if _in(ours.tagged, version) and value == kproxy_default(spec, version, ours):
            # Leave default-valued tagged fields unset, as kproxy does (Kafka omits them too).
            # kafka-python's default for a tagged struct is None, so it would write a
            # default-valued struct out explicitly: valid, but not byte-identical.
            continue
        if inner in spec.structs:
            convert = lambda e: None if e is None else to_kp(spec, spec.structs[inner], version, theirs, e)  # noqa: E731
        else:
            convert = lambda e: kp_scalar(ours, theirs, e)  # noqa: E731
        if ours.type.startswith("[]"):
            kwargs[theirs.name] = None if value is None else [convert(e) for e in value]
        else:
            kwargs[theirs.name] = convert(value)
    return (data_class or struct_field.data_class)(version=version, **kwargs)


def test_kafka_python_coverage():
    assert {k for k, _, _, _ in KP_MESSAGES} == {"request", "response"}
    assert len({a for _, a, _, _ in KP_MESSAGES}) >= 50
    assert len(KP_MESSAGES) >= 450


@pytest.mark.parametrize("kind,api_key,version,cls", KP_MESSAGES, ids=KP_IDS)
def test_kafka_python_encodes_kproxy_decodes(kind, api_key, version, cls):
    spec = spec_of(kind, api_key)
    values = kp_representable(kind, api_key, sample_body(kind, api_key, version, seed=1))
    message = to_kp(spec, spec.fields, version, cls._struct, values, data_class=cls)
    data = message.encode(version=version)
    frame = header_bytes(kind, api_key, version) + bytes(data)
    decoded = kproxy_decode(kind, api_key, version, frame)
    assert_same(kproxy_plain(values), kproxy_plain(decoded.body))
    assert kproxy_reencode(kind, api_key, version, decoded) == frame
    assert kproxy_encode(kind, api_key, version, values) == frame


@pytest.mark.parametrize("kind,api_key,version,cls", KP_MESSAGES, ids=KP_IDS)
def test_kproxy_encodes_kafka_python_decodes(kind, api_key, version, cls):
    spec = spec_of(kind, api_key)
    body = kp_representable(kind, api_key, sample_body(kind, api_key, version))
    frame = kproxy_encode(kind, api_key, version, body)
    start = header_length(kind, api_key, version)
    decoded = cls.decode(frame[start:], version=version)
    decoded._header = None      # decode() leaves it unset; encode() reads it
    assert_same(kproxy_plain(body), kp_plain(spec, spec.fields, version, cls._struct, decoded))
    assert bytes(decoded.encode()) == frame[start:], "kafka-python re-encodes differently"


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_api_versions_unsupported_version_fallback_agrees(version):
    """A broker answers an ApiVersions version it lacks with a v0 body and error 35: both read v0."""
    cls = next(c for k, a, v, c in KP_MESSAGES if (k, a) == ("response", ApiKey.API_VERSIONS))
    body = new_body("response", ApiKey.API_VERSIONS, 0, error_code=35,
                    api_keys=[Struct(api_key=18, min_version=0, max_version=3)])
    frame = encode_response(Response(CORRELATION_ID, body, body_version=0), ApiKey.API_VERSIONS, 0)
    ours = decode_response(frame, ApiKey.API_VERSIONS, version)
    assert ours.body_version == 0 and ours.body.error_code == 35
    theirs = cls.decode(frame[4:], version=version)
    assert theirs.version == 0 and theirs.error_code == 35
    assert [(k.api_key, k.min_version, k.max_version) for k in theirs.api_keys] == \
        [(k.api_key, k.min_version, k.max_version) for k in ours.body.api_keys] == [(18, 0, 3)]
    assert encode_response(ours, ApiKey.API_VERSIONS, version) == frame
