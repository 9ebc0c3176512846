"""Schema-compiled walks over decoded bodies (error codes), for observers.

A generic walk over every attribute of every struct costs more than
decoding; the schema already says which branches can hold an error code,
so each (message, version) gets a walker that visits only those.
"""

from __future__ import annotations

from typing import Callable

from ._codec import _in
from .schema import REQUESTS, RESPONSES, MessageSpec

Walker = Callable[[object, list], None]
_WALKERS: dict[tuple[str, int, int], Walker | None] = {}


def _is_error_field(name: str, ftype: str) -> bool:
    return ftype == "int16" and (name == "error_code" or name.endswith("_error_code"))


def _compile(spec: MessageSpec, version: int) -> Walker | None:
    cache: dict[str, Walker | None] = {}

    def struct(name: str, rows) -> Walker | None:
        if name in cache:
            return cache[name]
        present = [f for f in rows if _in(f.versions, version)]
        errors = tuple(f.name for f in present if _is_error_field(f.name, f.type))
        children = []
        for f in present:
            is_list = f.type.startswith("[]")
            base = f.type[2:] if is_list else f.type
            if base in spec.structs:
                sub = struct(base, spec.structs[base])
                if sub is not None:
                    children.append((f.name, is_list, sub))
        if not errors and not children:
            cache[name] = None
            return None
        children = tuple(children)

        def walk(obj, out: list) -> None:
            fields = obj.__dict__
            for attr in errors:
                code = fields.get(attr)
                if code:
                    out.append(code)
            for attr, is_list, sub in children:
                value = fields.get(attr)
                if value is None:
                    continue
                if is_list:
                    for item in value:
                        sub(item, out)
                else:
                    sub(value, out)
        cache[name] = walk
        return walk

    return struct(spec.name, spec.fields)


def error_walker(kind: str, api_key: int, version: int) -> Walker | None:
    """The walker of a (message, version): ``walker(body, out)`` appends every non-zero error
    code in ``body`` to ``out``; None when the message cannot hold one (or is unknown).
    Compiled once; callers that keep it skip ``error_codes``' lookup per body."""
    key = (kind, api_key, version)
    try:
        return _WALKERS[key]
    except KeyError:
        spec = (REQUESTS if kind == "request" else RESPONSES).get(api_key)
        walker = _WALKERS[key] = _compile(spec, version) if spec is not None and spec.has_version(version) else None
        return walker


def error_codes(kind: str, api_key: int, version: int, body) -> list[int]:
    """Every non-zero error code in a decoded body (top level, per partition, per resource)."""
    walker = error_walker(kind, api_key, version)
    found: list[int] = []
    if walker is not None:
        walker(body, found)
    return found
