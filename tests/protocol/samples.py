"""Populated sample messages built from the schema itself, for round-trip and fuzz tests.

Every field present at a version gets a non-default value (so tagged fields
are actually written), arrays get ``width`` elements, nullable fields are
null in some places, and values exercise edges (negative numbers, non-ASCII
text, empty strings).
"""

from __future__ import annotations

import random
import uuid as _uuid

from kproxy.protocol import Struct, Uuid, schema
from kproxy.protocol._codec import FIXED, _in

RANGES = {"int8": (-128, 127), "int16": (-32768, 32767), "uint16": (0, 65535),
          "int32": (-2**31, 2**31 - 1), "uint32": (0, 2**32 - 1), "int64": (-2**63, 2**63 - 1)}
TEXTS = ["", "topic-a", "ünïcødé-✓", "x" * 300]


def every_message():
    """(kind, api_key, version) for every message version in the schema."""
    for key in sorted(schema.REQUESTS):
        for kind, spec in (("request", schema.REQUESTS[key]), ("response", schema.RESPONSES[key])):
            for v in range(spec.versions[0], spec.versions[1] + 1):
                yield kind, key, v


def sample_body(kind: str, api_key: int, version: int, seed: int = 0, width: int = 2) -> Struct:
    spec = (schema.REQUESTS if kind == "request" else schema.RESPONSES)[api_key]
    rng = random.Random(f"{kind}/{api_key}/{version}/{seed}")
    return _struct(spec, spec.fields, version, rng, width, depth=0)


def _struct(spec, rows, version, rng, width, depth):
    values = {}
    for f in rows:
        if not _in(f.versions, version):
            continue
        values[f.name] = _value(spec, f, version, rng, width, depth)
    return Struct(**values)


def _value(spec, f, version, rng, width, depth):
    nullable = _in(f.nullable, version)
    if nullable and rng.random() < 0.25:
        return None
    t = f.type
    if t.startswith("[]"):
        element = t[2:]
        n = rng.randint(0, width) if depth > 1 else width
        return [_scalar(spec, element, version, rng, width, depth + 1, False) for _ in range(n)]
    return _scalar(spec, t, version, rng, width, depth, nullable)


def _scalar(spec, t, version, rng, width, depth, nullable):
    if t in RANGES:
        lo, hi = RANGES[t]
        return rng.choice([lo, hi, -1 if lo < 0 else 1, rng.randint(lo, hi)])
    if t == "float64":
        return rng.choice([0.5, -1e300, 3.141592653589793])
    if t == "bool":
        return rng.random() < 0.5
    if t == "string":
        return rng.choice(TEXTS)
    if t == "bytes":
        return rng.randbytes(rng.randint(0, 40))
    if t == "records":
        return rng.randbytes(rng.randint(0, 80))
    if t == "uuid":
        return Uuid(_uuid.UUID(int=rng.getrandbits(128)).bytes)
    return _struct(spec, spec.structs[t], version, rng, width, depth + 1)
