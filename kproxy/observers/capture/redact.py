"""What a capture must never write: secrets, and record data unless asked for.

One rule set, two uses:

- ``to_json(body)``: a decoded body as JSON-able values for the JSONL
  format, secrets replaced by ``"<redacted N bytes>"`` and ``records``
  fields by a per-partition summary (or the decoded records when record
  data is enabled).
- ``scrub_frame(...)``: the same frame with the same length for the pcapng
  format (so TCP sequence numbers stay true), secret bytes zero-filled and
  record keys, values and header values zero-filled.

Secrets: any field whose name ends in password, secret, hmac, auth_bytes,
token, salt or credential(s), in any API (SaslAuthenticate ``auth_bytes``,
AlterUserScramCredentials ``salted_password``/``salt``,
Create/Describe/Renew/ExpireDelegationToken ``hmac``), Envelope's wrapped
request/response and principal; and the ``value``
of any config entry whose name looks sensitive (``ssl.key.password``,
``sasl.jaas.config``, ...) or that is marked ``is_sensitive``. SASL v0 raw
tokens never reach a capture at all (the tracker keeps only their size).
"""

from __future__ import annotations

import base64
import re
import struct
from typing import Any

from ...protocol import DecodeError, OpaqueBody, Struct, Uuid, schema
from ...protocol.messages import decode_request, decode_response, encode_request, encode_response
from ...protocol.records import DecompressionLimit, iter_batches

SENSITIVE_FIELD = re.compile(r"(?:^|_)(?:password|passwd|secret|hmac|auth_bytes|token|salt|"
                             r"credentials?)$"
                             # Envelope (broker to controller) wraps whole requests, which may be
                             # AlterUserScramCredentials: never written.
                             r"|^(?:request_data|response_data|request_principal)$")
SENSITIVE_CONFIG = re.compile(r"password|secret|jaas|credential|token|private|\.key$|keystore\.key",
                              re.I)
_CONFIG_NAME_FIELDS = ("name", "key", "config_name")

RECORDS_FIELD = "records"

# Capture inflates a compressed batch (to count a legacy wrapper's records, or to
# write record data) only this far. A producer's batch is at most max.message.bytes
# (1 MiB by default) compressed and real data rarely compresses 10:1, so past this it
# is a decompression bomb: decompression stops at the bound (kproxy.protocol.records
# never produces more) and the batch is counted in ``decompression_refused``.
MAX_INFLATED_BYTES = 16 * 1024 * 1024
_refused = [0]          # batches given up on, process-wide (written by capture writer threads)


def decompression_refused() -> int:
    """Batches capture declined to inflate past MAX_INFLATED_BYTES, since start."""
    return _refused[0]


def inflate(batch) -> list:
    """``batch.records()`` within capture's bound; a refusal is counted, then raised."""
    try:
        return batch.records(max_decompressed_bytes=MAX_INFLATED_BYTES)
    except DecompressionLimit:
        _refused[0] += 1
        raise
# APIs whose frames carry a ``records`` field (request or response).
RECORDS_APIS = {
    kind: frozenset(key for key, spec in specs.items()
                    if any(f.type == "records" for f in spec.fields)
                    or any(f.type == "records" for rows in spec.structs.values() for f in rows))
    for kind, specs in (("request", schema.REQUESTS), ("response", schema.RESPONSES))
}


def _has_sensitive(spec: schema.MessageSpec) -> bool:
    rows = list(spec.fields) + [f for rows in spec.structs.values() for f in rows]
    names = {f.name for f in rows}
    if any(SENSITIVE_FIELD.search(f.name) for f in rows):
        return True
    # Config-like entries: a name/key field next to a value field.
    for struct_rows in spec.structs.values():
        fields = {f.name for f in struct_rows}
        if "value" in fields and fields & set(_CONFIG_NAME_FIELDS):
            return True
    return "value" in names and bool(names & set(_CONFIG_NAME_FIELDS))


# APIs that may carry a secret somewhere, by direction.
SENSITIVE_APIS = {
    kind: frozenset(key for key, spec in specs.items() if _has_sensitive(spec))
    for kind, specs in (("request", schema.REQUESTS), ("response", schema.RESPONSES))
}


def redacted(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, str):
        n = len(value.encode("utf-8", "surrogateescape"))
    elif isinstance(value, (bytes, bytearray, memoryview)):
        n = len(value)
    elif isinstance(value, list):
        return [redacted(v) for v in value]
    else:
        return "<redacted>"
    return f"<redacted {n} bytes>"


def _sensitive_config_value(fields: dict) -> bool:
    if fields.get("is_sensitive") is True:
        return True
    for name in _CONFIG_NAME_FIELDS:
        text = fields.get(name)
        if isinstance(text, str) and SENSITIVE_CONFIG.search(text):
            return True
    return False


# ---------------------------------------------------------------- JSON (JSONL bodies)

def b64(data) -> str:
    return base64.b64encode(data).decode("ascii")


def to_json(body, include_record_data: bool = False) -> Any:
    """A decoded body (Struct or OpaqueBody) as JSON-able values, redacted."""
    if isinstance(body, OpaqueBody):
        return {"opaque_bytes": len(body.data)}
    return _json(body, "", include_record_data)


def _json(value: Any, name: str, data: bool) -> Any:
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if name and SENSITIVE_FIELD.search(name):
        return redacted(value)
    if isinstance(value, str):
        return value
    if isinstance(value, Struct):
        fields = value.fields()
        out = {k: _json(v, k, data) for k, v in fields.items()}
        if "value" in fields and _sensitive_config_value(fields):
            out["value"] = redacted(fields["value"])
        return out
    if isinstance(value, list):
        return [_json(v, name, data) for v in value]
    if isinstance(value, Uuid):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        if name == RECORDS_FIELD:
            return records_json(value, data)
        return b64(value)
    return str(value)


def records_summary(blob) -> dict:
    """Batch headers only (no decompression): batches, records, bytes, codecs."""
    out = {"batches": 0, "records": 0, "bytes": 0, "codecs": []}
    if blob is None:
        return out
    try:
        walker = iter_batches(blob)
        for batch in walker:
            out["batches"] += 1
            out["bytes"] += batch.size_bytes
            count = batch.record_count
            if count is None:                      # legacy compressed wrapper
                try:
                    count = len(inflate(batch))
                except DecodeError:
                    count = 0
            out["records"] += count
            if batch.compression not in out["codecs"]:
                out["codecs"].append(batch.compression)
        if walker.trailing_bytes:
            out["truncated_bytes"] = walker.trailing_bytes
    except DecodeError as exc:
        out["error"] = str(exc)
    return out


def records_json(blob, include_data: bool) -> Any:
    if blob is None:
        return None
    summary = records_summary(blob)
    if not include_data:
        return summary
    records = []
    try:
        for batch in iter_batches(blob):
            for r in inflate(batch):
                records.append({
                    "offset": r.offset, "timestamp": r.timestamp,
                    "key": None if r.key is None else b64(r.key),
                    "value": None if r.value is None else b64(r.value),
                    "headers": [{"key": k, "value": None if v is None else b64(v)} for k, v in r.headers],
                })
    except DecodeError as exc:
        summary["error"] = str(exc)
    summary["data"] = records
    return summary


# ---------------------------------------------------------------- frames (pcapng)

_I32 = struct.Struct(">i")
_V2_HEADER_SIZE = 61
_LEGACY_KEY_POS = {0: 18, 1: 26}


def scrub_frame(frame, kind: str, api_key: int, api_version: int,
                include_record_data: bool) -> tuple[bytes | memoryview, str | None]:
    """The frame to write to a pcapng file, same length; and a note if anything was changed.

    ``kind`` is "request" or "response"; frames of APIs without secrets or
    records pass through untouched (no decoding).
    """
    sensitive = api_key in SENSITIVE_APIS[kind]
    records = not include_record_data and api_key in RECORDS_APIS[kind]
    if not sensitive and not records:
        return frame, None
    prefix = 8 if kind == "request" else 4
    try:
        if kind == "request":
            message = decode_request(bytes(frame))
        else:
            message = decode_response(bytes(frame), api_key, api_version)
    except DecodeError:
        message = None
    if message is None or message.is_opaque:
        if not sensitive:
            return frame, None       # cannot find the records; an opaque body is forwarded as is
        return _zero_after(frame, prefix), "kproxy: undecodable frame of an API that may carry " \
                                            "secrets: zero-filled after the header"
    counts = [0, 0]
    _scrub(message.body, sensitive, records, counts)
    if counts == [0, 0]:
        return frame, None
    try:
        out = encode_request(message) if kind == "request" \
            else encode_response(message, api_key, api_version)
    except Exception:           # noqa: BLE001 - never write the original when scrubbing failed
        out = b""
    if len(out) != len(frame):
        return _zero_after(frame, prefix), "kproxy: frame zero-filled after the header (redaction)"
    notes = []
    if counts[0]:
        notes.append(f"{counts[0]} secret field(s) zero-filled")
    if counts[1]:
        notes.append(f"record data zero-filled in {counts[1]} records field(s)")
    return out, "kproxy: " + "; ".join(notes)


def _zero_after(frame, prefix: int) -> bytes:
    return bytes(frame[:prefix]) + bytes(max(len(frame) - prefix, 0))


def _blank(value: Any) -> Any:
    """Same encoded length, no content."""
    if isinstance(value, str):
        return "*" * len(value.encode("utf-8", "surrogateescape"))
    if isinstance(value, Uuid):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(len(value))
    if isinstance(value, list):
        return [_blank(v) for v in value]
    return value


def _scrub(struct_: Struct, sensitive: bool, records: bool, counts: list[int]) -> None:
    fields = struct_.__dict__
    for name, value in list(fields.items()):
        if name[:1] == "_" or value is None:
            continue
        if sensitive and SENSITIVE_FIELD.search(name) and not isinstance(value, (bool, int, float)):
            if isinstance(value, (Struct, list)) and not _is_plain_list(value):
                pass            # a struct named like a secret: its leaves are checked below
            else:
                fields[name] = _blank(value)
                if len(value):
                    counts[0] += 1
                continue
        if name == RECORDS_FIELD and records and isinstance(value, (bytes, bytearray, memoryview)):
            fields[name] = scrub_records(value)
            counts[1] += 1
        elif isinstance(value, Struct):
            _scrub(value, sensitive, records, counts)
        elif isinstance(value, list) and value and isinstance(value[0], Struct):
            for item in value:
                _scrub(item, sensitive, records, counts)
    if sensitive and "value" in fields and fields["value"] is not None \
            and isinstance(fields["value"], str) and _sensitive_config_value(fields):
        fields["value"] = _blank(fields["value"])
        counts[0] += 1


def _is_plain_list(value) -> bool:
    return isinstance(value, list) and not (value and isinstance(value[0], Struct))


def _read_varint(buf, pos: int) -> tuple[int, int]:
    """A zigzag varint at ``pos``: (value, position after it). One-byte ones (most
    record lengths of small records, null keys, empty header lists) return at once."""
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise DecodeError("varint too long")


def scrub_records(blob) -> bytes:
    """A records blob of the same length with record keys, values and header values zeroed.

    Structure is kept where it can be: batch and message headers, record
    framing and header keys of uncompressed magic 2 batches. A compressed
    payload cannot be scrubbed in place and is zeroed whole.
    """
    out = bytearray(blob)
    pos = 0
    walker = iter_batches(blob)
    try:
        for batch in walker:
            size = batch.size_bytes
            if batch.magic == 2:
                if batch.compression == "none":
                    try:
                        _scrub_v2_records(out, pos + _V2_HEADER_SIZE, pos + size)
                    except (DecodeError, IndexError):
                        out[pos + _V2_HEADER_SIZE:pos + size] = bytes(size - _V2_HEADER_SIZE)
                else:
                    out[pos + _V2_HEADER_SIZE:pos + size] = bytes(size - _V2_HEADER_SIZE)
            else:
                _scrub_legacy(out, pos, size, batch.magic)
            pos += size
    except DecodeError:
        pass
    if pos < len(out):            # a truncated batch at the end, or garbage: keep only its header
        keep = min(len(out), pos + 17)
        out[keep:] = bytes(len(out) - keep)
    return bytes(out)


_ZEROS = memoryview(bytes(64 * 1024))     # slices of it zero-fill without allocating
_ZEROS_LEN = len(_ZEROS)


def _scrub_v2_records(out: bytearray, pos: int, end: int) -> None:
    # The hot loop of pcapng redaction (one pass per record of every Produce request
    # and Fetch response): the timestamp and offset deltas are skipped without
    # decoding and one-byte varints return early: 2.5 -> 1.95 ms per MiB of 1 KiB records.
    while pos < end:
        length, pos = _read_varint(out, pos)
        stop = pos + length
        pos += 1                                   # attributes
        while out[pos] & 0x80:                     # timestamp delta
            pos += 1
        pos += 1
        while out[pos] & 0x80:                     # offset delta
            pos += 1
        pos += 1
        pos = _zero_varbytes(out, pos)             # key
        pos = _zero_varbytes(out, pos)             # value
        count, pos = _read_varint(out, pos)
        for _ in range(max(count, 0)):
            n, pos = _read_varint(out, pos)        # header key: kept
            pos += max(n, 0)
            pos = _zero_varbytes(out, pos)         # header value
        if pos != stop:
            raise DecodeError("record framing")


def _zero_varbytes(out: bytearray, pos: int) -> int:
    n, pos = _read_varint(out, pos)
    if n > 0:
        out[pos:pos + n] = _ZEROS[:n] if n <= _ZEROS_LEN else bytes(n)
        pos += n
    return pos


def _scrub_legacy(out: bytearray, pos: int, size: int, magic: int) -> None:
    start = pos + _LEGACY_KEY_POS.get(magic, 18)
    end = pos + size
    p = start
    try:
        for _ in range(2):                         # key, value
            n, = _I32.unpack_from(out, p)
            p += 4
            if n > 0:
                if p + n > end:
                    raise ValueError
                out[p:p + n] = bytes(n)
                p += n
    except (struct.error, ValueError):
        out[start:end] = bytes(end - start)
