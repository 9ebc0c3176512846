"""Schema-compiled walks over decoded bodies (error codes), for observers.

A generic walk over every attribute of every struct costs more than
decoding; the schema already says which branches can hold an error code,
so each (message, version) gets a walker that visits only those, compiled
to one straight-line function (every Produce and Fetch answer is walked).
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
    """Straight-line source for one (message, version): a loop per list on the way to an
    error code, none elsewhere, one call per body. Codes come out as a recursive walk finds
    them: a struct's own (in field order), then its children's (in field order)."""
    reaches: dict[str, bool] = {}

    def present(rows) -> list:
        return [f for f in rows if _in(f.versions, version)]

    def struct_of(f) -> str | None:
        base = f.type[2:] if f.type.startswith("[]") else f.type
        return base if base in spec.structs and holds_error(spec.structs[base], base) else None

    def holds_error(rows, name: str) -> bool:
        if name not in reaches:
            reaches[name] = any(_is_error_field(f.name, f.type) or struct_of(f) for f in present(rows))
        return reaches[name]

    if not holds_error(spec.fields, spec.name):
        return None
    lines = ["def walk(obj, out):"]
    depth = 0

    def emit(rows, obj: str, pad: str) -> None:
        nonlocal depth
        d, depth = depth, depth + 1
        lines.append(f"{pad}f{d} = {obj}.__dict__")
        for f in present(rows):
            if _is_error_field(f.name, f.type):
                lines.extend((f"{pad}c = f{d}.get({f.name!r})", f"{pad}if c:", f"{pad} out.append(c)"))
        for f in present(rows):
            name = struct_of(f)
            if name is None:
                continue
            lines.extend((f"{pad}v{d} = f{d}.get({f.name!r})", f"{pad}if v{d} is not None:"))
            if f.type.startswith("[]"):
                lines.append(f"{pad} for o{d} in v{d}:")
                emit(spec.structs[name], f"o{d}", pad + "  ")
            else:
                emit(spec.structs[name], f"v{d}", pad + " ")

    emit(spec.fields, "obj", " ")
    ns: dict = {}
    exec(compile("\n".join(lines), f"<kproxy {spec.name} v{version} error walk>", "exec"), ns)
    return ns["walk"]


def error_walker(kind: str, api_key: int, version: int) -> Walker | None:
    """The walker of a (message, version): ``walker(body, out)`` appends every non-zero error
    code in ``body`` to ``out``; None when the message cannot hold one (or is unknown).
    Compiled once per (message, version) the schema defines; callers that keep it skip
    ``error_codes``' lookup per body."""
    key = (kind, api_key, version)
    try:
        return _WALKERS[key]
    except KeyError:
        spec = (REQUESTS if kind == "request" else RESPONSES).get(api_key)
        if spec is None or not spec.has_version(version):
            return None                  # not cached: a peer may name any of 65,536 versions
        walker = _WALKERS[key] = _compile(spec, version)
        return walker


def error_codes(kind: str, api_key: int, version: int, body) -> list[int]:
    """Every non-zero error code in a decoded body (top level, per partition, per resource)."""
    walker = error_walker(kind, api_key, version)
    found: list[int] = []
    if walker is not None:
        walker(body, found)
    return found
