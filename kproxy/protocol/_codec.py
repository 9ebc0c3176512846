"""Schema-driven struct codecs, compiled once per (message, version).

The schema is data; decoding it field by field through the schema rows on
every frame would be slow. Instead, the first time a (message, version) is
seen, its rows are turned into a flat list of small reader/writer closures:
runs of fixed-width fields collapse into one precompiled ``struct.Struct``,
arrays of fixed-width primitives decode in one ``unpack_from``, and tagged
fields are looked up in a per-struct table. Compiled codecs are cached.

Decoding is strict wherever leniency would break byte-identical re-encoding
(non-minimal varints, booleans other than 0/1, presence bytes other than
-1/1, trailing bytes), and lossless elsewhere: strings decode with
``surrogateescape``, unknown tagged fields are kept raw, and the order of
tagged fields as received is remembered.
"""

from __future__ import annotations

import base64
import struct
from typing import Any, Callable

from .errors import DecodeError
from .schema import FieldSpec, MessageSpec

Reader = Callable[[Any, int], tuple[Any, int]]   # (buffer, pos) -> (value, new pos)
Writer = Callable[[Any, bytearray], None]        # (value, out) -> None

FIXED = {"int8": "b", "int16": "h", "uint16": "H", "int32": "i", "uint32": "I",
         "int64": "q", "float64": "d"}
MAX_VARINT_BYTES = 5     # an unsigned 32-bit varint never needs more
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I8 = struct.Struct(">b")


class Uuid(bytes):
    """A Kafka UUID: 16 raw bytes, shown the way Kafka shows it (URL-safe base64)."""

    __slots__ = ()

    def __str__(self) -> str:
        return base64.urlsafe_b64encode(self).rstrip(b"=").decode("ascii")

    def __repr__(self) -> str:
        return f"Uuid({str(self)!r})"

    @classmethod
    def parse(cls, text: str) -> "Uuid":
        return cls(base64.urlsafe_b64decode(text + "=="))


ZERO_UUID = Uuid(bytes(16))


class Struct:
    """A decoded Kafka struct: fields as snake_case attributes.

    Attributes starting with ``_`` are codec bookkeeping (tagged-field order
    and unknown tagged fields as received) and are not fields.
    """

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def fields(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k[0] != "_"}

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dicts/lists (bytes, UUIDs and records left as they are)."""
        return {k: _plain(v) for k, v in self.fields().items()}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Struct) and self.fields() == other.fields()

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.fields().items())
        return f"Struct({inner})"


def _plain(value: Any) -> Any:
    if isinstance(value, Struct):
        return value.to_dict()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _new_struct(fields: dict) -> Struct:
    obj = Struct.__new__(Struct)
    obj.__dict__ = fields
    return obj


# ------------------------------------------------------------ primitives

def read_uvarint(buf, pos: int) -> tuple[int, int]:
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    # Two and three bytes unrolled: the length of every records field (Produce, Fetch) of
    # 128 B to 2 MiB. Same checks as the loop below (the last byte may not be 0).
    b1 = buf[pos + 1]
    if b1 < 0x80:
        if b1 == 0:
            raise DecodeError("non-minimal varint")
        return (b & 0x7F) | (b1 << 7), pos + 2
    b2 = buf[pos + 2]
    if 0 < b2 < 0x80:
        return (b & 0x7F) | ((b1 & 0x7F) << 7) | (b2 << 14), pos + 3
    result = b & 0x7F
    shift = 7
    end = pos + MAX_VARINT_BYTES
    pos += 1
    while True:
        if pos >= end:
            raise DecodeError("varint longer than 5 bytes")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            if b == 0:
                raise DecodeError("non-minimal varint")
            if result > 0xFFFFFFFF:
                raise DecodeError("varint above 32 bits")   # Kafka's unsigned varints are 32-bit
            return result, pos
        shift += 7


def write_uvarint(value: int, out: bytearray) -> None:
    if value < 0 or value > 0xFFFFFFFF:
        raise ValueError(f"unsigned varint out of range: {value}")
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _length_checked(buf, pos: int, n: int) -> int:
    end = pos + n
    if end > len(buf):
        raise DecodeError(f"length {n} runs past the end of the frame")
    return end


def _text(buf, pos: int, end: int) -> str:
    return str(buf[pos:end], "utf-8", "surrogateescape")


def _encode_text(value: str) -> bytes:
    return value.encode("utf-8", "surrogateescape")


def _string_reader(flexible: bool, nullable: bool) -> Reader:
    if flexible:
        def read(buf, pos):
            n, pos = read_uvarint(buf, pos)
            if n == 0:
                if nullable:
                    return None, pos
                raise DecodeError("null in a non-nullable string")
            end = _length_checked(buf, pos, n - 1)
            return _text(buf, pos, end), end
    else:
        def read(buf, pos):
            n, = _I16.unpack_from(buf, pos)
            pos += 2
            if n < 0:
                if n == -1 and nullable:
                    return None, pos
                raise DecodeError(f"bad string length {n}")
            end = _length_checked(buf, pos, n)
            return _text(buf, pos, end), end
    return read


def _string_writer(flexible: bool) -> Writer:
    if flexible:
        def write(value, out):
            if value is None:
                out.append(0)
                return
            data = _encode_text(value)
            write_uvarint(len(data) + 1, out)
            out += data
    else:
        def write(value, out):
            if value is None:
                out += b"\xff\xff"
                return
            data = _encode_text(value)
            out += _I16.pack(len(data))
            out += data
    return write


def _bytes_reader(flexible: bool, nullable: bool, zero_copy: bool) -> Reader:
    """Bytes fields; ``records`` fields are returned as memoryview slices (no copy)."""
    def slice_of(buf, pos, end):
        if zero_copy:
            return memoryview(buf)[pos:end]
        return bytes(buf[pos:end])

    if flexible:
        def read(buf, pos):
            n, pos = read_uvarint(buf, pos)
            if n == 0:
                if nullable:
                    return None, pos
                raise DecodeError("null in non-nullable bytes")
            end = _length_checked(buf, pos, n - 1)
            return slice_of(buf, pos, end), end
    else:
        def read(buf, pos):
            n, = _I32.unpack_from(buf, pos)
            pos += 4
            if n < 0:
                if n == -1 and nullable:
                    return None, pos
                raise DecodeError(f"bad bytes length {n}")
            end = _length_checked(buf, pos, n)
            return slice_of(buf, pos, end), end
    return read


def _bytes_writer(flexible: bool) -> Writer:
    if flexible:
        def write(value, out):
            if value is None:
                out.append(0)
                return
            write_uvarint(len(value) + 1, out)
            out += value
    else:
        def write(value, out):
            if value is None:
                out += b"\xff\xff\xff\xff"
                return
            out += _I32.pack(len(value))
            out += value
    return write


def _read_bool(buf, pos):
    b = buf[pos]
    if b > 1:
        raise DecodeError(f"boolean byte {b}")
    return b == 1, pos + 1


def _write_bool(value, out):
    out.append(1 if value else 0)


def _read_uuid(buf, pos):
    end = _length_checked(buf, pos, 16)
    return Uuid(buf[pos:end]), end


def _write_uuid(value, out):
    if len(value) != 16:
        raise ValueError("a UUID is 16 bytes")
    out += value


def _fixed_reader(code: str) -> Reader:
    s = struct.Struct(">" + code)
    size = s.size
    unpack = s.unpack_from

    def read(buf, pos):
        return unpack(buf, pos)[0], pos + size
    return read


def _fixed_writer(code: str) -> Writer:
    pack = struct.Struct(">" + code).pack

    def write(value, out):
        out += pack(value)
    return write


def _array_length_reader(flexible: bool, nullable: bool):
    """Returns n (or -1 for null) and the new position; rejects absurd counts."""
    if flexible:
        def read(buf, pos):
            n, pos = read_uvarint(buf, pos)
            n -= 1
            if n < 0 and not nullable:
                raise DecodeError("null in a non-nullable array")
            if n > len(buf) - pos:
                raise DecodeError(f"array count {n} exceeds the bytes left")
            return n, pos
    else:
        def read(buf, pos):
            n, = _I32.unpack_from(buf, pos)
            pos += 4
            if n < 0 and not (n == -1 and nullable):
                raise DecodeError(f"bad array count {n}")
            if n > len(buf) - pos:
                raise DecodeError(f"array count {n} exceeds the bytes left")
            return n, pos
    return read


def _array_length_writer(flexible: bool) -> Writer:
    if flexible:
        def write(value, out):
            write_uvarint(0 if value is None else len(value) + 1, out)
    else:
        def write(value, out):
            out += _I32.pack(-1 if value is None else len(value))
    return write


FIXED_ARRAY_CACHE = 64   # precompiled unpackers for arrays up to this long (replica lists, ISRs)


def _fixed_array_unpacker(code: str) -> Callable[[int], Callable]:
    """count -> unpack_from for ``count`` values of ``code``; small counts are precompiled."""
    cache = [struct.Struct(f">{n}{code}").unpack_from for n in range(FIXED_ARRAY_CACHE)]

    def unpacker(count: int):
        if count < FIXED_ARRAY_CACHE:
            return cache[count]
        return struct.Struct(f">{count}{code}").unpack_from
    return unpacker


_FIXED_ARRAY_UNPACKERS = {code: _fixed_array_unpacker(code) for code in FIXED.values()}


# ------------------------------------------------------------ compiler

def _in(span: tuple[int, int] | None, version: int) -> bool:
    return span is not None and span[0] <= version <= span[1]


class StructCodec:
    """Reader and writer for one struct at one version."""

    __slots__ = ("name", "read", "write", "defaults")

    def __init__(self, name: str, read: Reader, write: Writer, defaults: dict):
        self.name = name
        self.read = read
        self.write = write
        self.defaults = defaults


class _Compiler:
    def __init__(self, spec: MessageSpec, version: int):
        self.spec = spec
        self.version = version
        self.flexible = spec.is_flexible(version)
        self.cache: dict[str, StructCodec] = {}

    def struct(self, name: str, rows: tuple[FieldSpec, ...]) -> StructCodec:
        if name in self.cache:
            return self.cache[name]
        v = self.version
        present = [f for f in rows if _in(f.versions, v)]
        regular = [f for f in present if not _in(f.tagged, v)]
        tagged = [f for f in present if _in(f.tagged, v)]
        defaults = {f.name: self.default(f) for f in present}

        tag_table = {f.tag: (f.name, self.reader(f), self.writer(f)) for f in tagged}
        read = self.generated_reader(name, regular, tag_table, defaults)
        write = self.generated_writer(name, regular, tag_table, defaults)
        codec = StructCodec(name, read, write, defaults)
        self.cache[name] = codec
        return codec

    # -------------------------------------------------------- generated readers

    def generated_reader(self, name: str, regular: list[FieldSpec], tag_table: dict,
                         defaults: dict, skipped: frozenset = frozenset(), build: bool = True) -> Reader:
        """Python source for one struct's reader, compiled once.

        Straight-line code with the common cases inlined (runs of fixed-width
        fields in one unpack, one-byte varints, strings) is several times faster
        than calling a closure per field; everything unusual calls the same
        helpers the closures use.

        Fields named in ``skipped`` are checked as strictly but not kept
        (``skip_source``); without ``build`` the reader keeps nothing and returns
        (None, pos). Both are for partial decoding (``skim``).
        """
        ns: dict[str, Any] = {
            "DecodeError": DecodeError, "struct_error": struct.error, "_new": _new_struct,
            "_uvarint": read_uvarint, "_I16": _I16.unpack_from, "_I32": _I32.unpack_from,
            "_I8": _I8.unpack_from, "_unpack": struct.unpack_from, "_Uuid": Uuid,
            "_read_tagged": _read_tagged, "_TAGS": tag_table, "_DEFAULTS": defaults,
            "_TAG_DEFAULTS": {n: defaults[n] for n, _, _ in tag_table.values()},
        }
        lines = ["def read(buf, pos):", " _f = None", " _n = len(buf)", " try:"]
        out_names = []
        flexible = self.flexible
        group: list[FieldSpec] = []

        def flush_group():
            if not group:
                return
            fmt = ">" + "".join(FIXED[f.type] for f in group)
            key = f"_S{len(ns)}"
            ns[key] = struct.Struct(fmt).unpack_from
            targets = "".join(f"v_{f.name}, " for f in group)
            lines.append(f"  _f = {group[0].name!r}")
            lines.append(f"  {targets}= {key}(buf, pos)")
            lines.append(f"  pos += {struct.calcsize(fmt)}")
            group.clear()

        for f in regular:
            kept = build and f.name not in skipped
            if kept:
                out_names.append(f.name)
            if f.type in FIXED:
                group.append(f)          # unpacked with its run either way: one call
                continue
            flush_group()
            lines.append(f"  _f = {f.name!r}")
            source = self.field_source(f, f"v_{f.name}", ns) if kept else self.skip_source(f, ns)
            lines.extend("  " + line for line in source)
        flush_group()
        items = ", ".join(f"{n!r}: v_{n}" for n in out_names)
        lines.append(f"  d = {{{items}}}" if build else "  d = {}")
        if flexible:
            lines.append("  _f = '<tagged fields>'")
            lines.append("  if buf[pos] == 0:")
            lines.append("   pos += 1")
            if tag_table and build:
                lines.append("   d.update(_TAG_DEFAULTS)")
            lines.append("  else:")
            lines.append("   pos = _read_tagged(buf, pos, d, _TAGS, _DEFAULTS)")
        lines += [
            " except DecodeError as exc:",
            f"  raise DecodeError(f'{name}.{{_f}}: {{exc}}') from None",
            " except (struct_error, IndexError) as exc:",
            f"  raise DecodeError(f'{name}.{{_f}} at byte {{pos}}: truncated ({{exc}})') from None",
            " return _new(d), pos" if build else " return None, pos",
        ]
        exec(compile("\n".join(lines), f"<kproxy {self.spec.name} v{self.version} {name}>", "exec"), ns)
        return ns["read"]

    def generated_writer(self, name: str, regular: list[FieldSpec], tag_table: dict,
                         defaults: dict) -> Writer:
        """Python source for one struct's writer, the mirror of ``generated_reader``.

        Missing attributes fall back to the field's default, so hand-built
        structs need only the fields they care about.
        """
        ns: dict[str, Any] = {"_wuv": write_uvarint, "_write_tagged": _write_tagged,
                              "_TAGS": tag_table, "_DEFAULTS": defaults,
                              "_I16P": _I16.pack, "_I32P": _I32.pack, "_pack": struct.pack}
        lines = ["def write(obj, out):", " v = obj.__dict__"]
        group: list[FieldSpec] = []

        def default_ref(f: FieldSpec) -> str:
            key = f"_D{len(ns)}"
            ns[key] = defaults[f.name]
            return key

        def flush_group():
            if not group:
                return
            key = f"_P{len(ns)}"
            ns[key] = struct.Struct(">" + "".join(FIXED[f.type] for f in group)).pack
            args = ", ".join(f"v.get({f.name!r}, {default_ref(f)})" for f in group)
            lines.append(f" out += {key}({args})")
            group.clear()

        for f in regular:
            if f.type in FIXED:
                group.append(f)
                continue
            flush_group()
            lines.append(f" x = v.get({f.name!r}, {default_ref(f)})")
            lines.extend(" " + line for line in self.field_write_source(f, "x", ns))
        flush_group()
        if self.flexible:
            tag_names = [n for n, _, _ in tag_table.values()]
            quiet = ["'_tag_order' not in v", "'_unknown_tags' not in v"]
            for tag_name in tag_names:
                key = f"_D{len(ns)}"
                ns[key] = defaults[tag_name]
                quiet.append(f"v.get({tag_name!r}, {key}) == {key}")
            lines.append(f" if {' and '.join(quiet)}: out.append(0)")
            lines.append(" else: _write_tagged(v, out, _TAGS, _DEFAULTS)")
        exec(compile("\n".join(lines), f"<kproxy {self.spec.name} v{self.version} {name} writer>",
                     "exec"), ns)
        return ns["write"]

    def field_write_source(self, f: FieldSpec, x: str, ns: dict) -> list[str]:
        """Lines that append field value ``x`` to ``out``."""
        t = f.type
        if t.startswith("[]"):
            element = t[2:]
            lines = self.length_write_source(f"len({x})", x, "array")
            code = FIXED.get(element)
            if code is not None:
                return lines + [f"if {x}: out += _pack(f'>{{len({x})}}{code}', *{x})"]
            key = f"_W{len(ns)}"
            ns[key] = self.scalar_writer(element, self.flexible, False)
            return lines + [f"if {x}:", f" for e in {x}: {key}(e, out)"]
        if t in ("string", "bytes", "records"):
            data = f"{x}.encode('utf-8', 'surrogateescape')" if t == "string" else x
            return ["if x is None:",
                    *[" " + line for line in self.null_write_source(t)],
                    "else:",
                    f" b = {data}",
                    *[" " + line for line in self.length_write_source("len(b)", "b", t)],
                    " out += b"]
        key = f"_W{len(ns)}"
        ns[key] = self.scalar_writer(t, self.flexible, self.nullable(f))
        return [f"{key}({x}, out)"]

    def null_write_source(self, t: str) -> list[str]:
        if self.flexible:
            return ["out.append(0)"]
        return ["out += b'\\xff\\xff'" if t == "string" else "out += b'\\xff\\xff\\xff\\xff'"]

    def length_write_source(self, length: str, value: str, what: str) -> list[str]:
        """Append a length: compact N+1 when flexible, else int16 (strings) / int32."""
        if self.flexible:
            null = [] if what != "array" else [f"if {value} is None: out.append(0)", "else:"]
            pad = " " if null else ""
            return null + [f"{pad}n = {length} + 1",
                           f"{pad}if n < 128: out.append(n)",
                           f"{pad}else: _wuv(n, out)"]
        pack = "_I16P" if what == "string" else "_I32P"
        if what == "array":
            return [f"out += _I32P(-1 if {value} is None else {length})"]
        return [f"out += {pack}({length})"]

    def field_source(self, f: FieldSpec, target: str, ns: dict) -> list[str]:
        """Lines that read field ``f`` into ``target`` and advance ``pos``."""
        t, flexible, nullable = f.type, self.flexible, self.nullable(f)
        if t.startswith("[]"):
            return self.array_source(t[2:], target, nullable, ns)
        return self.scalar_source(t, target, nullable, ns)

    def skip_source(self, f: FieldSpec, ns: dict) -> list[str]:
        """Lines that check field ``f`` as ``field_source`` reads it and advance ``pos``, keeping
        nothing: no str, bytes, UUID or list is made, nested structs go to ``skip_reader``."""
        t, nullable = f.type, self.nullable(f)
        if t.startswith("[]"):
            element = t[2:]
            lines = [*self.length_source("_c", nullable, "array"),
                     "if _c > _n - pos: raise DecodeError(f'array count {_c} exceeds the bytes left')"]
            code = FIXED.get(element)
            width = struct.calcsize('>' + code) if code is not None else self.fixed_width(element)
            if width is not None:
                return lines + ["if _c > 0:", f" pos += _c * {width}",
                                " if pos > _n: raise DecodeError('array runs past the end of the frame')"]
            key = f"_K{len(ns)}"
            ns[key] = self.skip_reader(element)
            return lines + ["for _ in range(_c):", f" _x, pos = {key}(buf, pos)"]
        if t in FIXED:
            return [f"pos += {struct.calcsize('>' + FIXED[t])}",
                    "if pos > _n: raise DecodeError('truncated')"]
        if t == "bool":
            return ["if buf[pos] > 1: raise DecodeError(f'boolean byte {buf[pos]}')", "pos += 1"]
        if t == "uuid":
            return ["if pos + 16 > _n: raise DecodeError('uuid runs past the end of the frame')", "pos += 16"]
        if t in ("string", "bytes", "records"):
            return [*self.length_source("_l", nullable, "string" if t == "string" else "bytes"),
                    "if _l > 0:", " pos += _l",
                    " if pos > _n: raise DecodeError(f'length {_l} runs past the end of the frame')"]
        key = f"_K{len(ns)}"
        ns[key] = self.skip_reader(t)
        if not nullable:
            return [f"_x, pos = {key}(buf, pos)"]
        return ["_m, = _I8(buf, pos)", "pos += 1",
                "if _m == 1:", f" _x, pos = {key}(buf, pos)",
                "elif _m != -1:", " raise DecodeError(f'struct presence byte {_m}')"]

    def fixed_width(self, name: str) -> int | None:
        """Bytes of struct ``name`` when all its fields are fixed-width numbers (any bytes are
        valid) and the version has no tag block per struct, so an array of them is skipped in
        one step (ApiVersions v0-2's ~80 entries: a step each cost the metrics ~0.1 ms an
        answer); else None."""
        if self.flexible or name not in self.spec.structs:
            return None
        fields = [f for f in self.spec.structs[name] if _in(f.versions, self.version)]
        if not fields or any(f.type not in FIXED for f in fields):
            return None
        return struct.calcsize(">" + "".join(FIXED[f.type] for f in fields))

    def skip_reader(self, name: str) -> Reader:
        """A reader for struct ``name`` that checks it and keeps nothing (here: the full reader)."""
        return self.struct(name, self.spec.structs[name]).read

    def length_source(self, target: str, nullable: bool, what: str) -> list[str]:
        """Read a compact (uvarint N+1) or classic length into ``target``; -1 means null."""
        if self.flexible:
            return [
                f"{target} = buf[pos]",
                f"if {target} < 128: pos += 1",
                f"else: {target}, pos = _uvarint(buf, pos)",
                f"{target} -= 1",
                *([] if nullable else [f"if {target} < 0: raise DecodeError('null in a non-nullable {what}')"]),
            ]
        unpack, size = ("_I16", 2) if what == "string" else ("_I32", 4)
        return [
            f"{target}, = {unpack}(buf, pos)",
            f"pos += {size}",
            f"if {target} < {0 if not nullable else -1}: raise DecodeError(f'bad {what} length {{{target}}}')",
        ]

    def scalar_source(self, t: str, target: str, nullable: bool, ns: dict) -> list[str]:
        if t in FIXED:
            key = f"_S{len(ns)}"
            ns[key] = struct.Struct(">" + FIXED[t]).unpack_from
            return [f"{target}, = {key}(buf, pos)", f"pos += {struct.calcsize('>' + FIXED[t])}"]
        if t == "bool":
            return [f"{target} = buf[pos]",
                    f"if {target} > 1: raise DecodeError(f'boolean byte {{{target}}}')",
                    f"{target} = {target} == 1", "pos += 1"]
        if t == "uuid":
            return ["if pos + 16 > _n: raise DecodeError('uuid runs past the end of the frame')",
                    f"{target} = _Uuid(buf[pos:pos + 16])", "pos += 16"]
        if t in ("string", "bytes", "records"):
            what = "string" if t == "string" else "bytes"
            if t == "string":
                value = "str(buf[pos:_e], 'utf-8', 'surrogateescape')"
            elif t == "records":
                value = "memoryview(buf)[pos:_e]"       # zero-copy: record payloads can be MBs
            else:
                value = "bytes(buf[pos:_e])"
            return [
                *self.length_source("_l", nullable, what),
                "if _l < 0:",
                f" {target} = None",
                "else:",
                " _e = pos + _l",
                f" if _e > _n: raise DecodeError(f'length {{_l}} runs past the end of the frame')",
                f" {target} = {value}",
                " pos = _e",
            ]
        key = f"_R{len(ns)}"
        ns[key] = self.struct(t, self.spec.structs[t]).read
        if not nullable:
            return [f"{target}, pos = {key}(buf, pos)"]
        return [
            "_m, = _I8(buf, pos)",
            "pos += 1",
            "if _m == -1:",
            f" {target} = None",
            "elif _m == 1:",
            f" {target}, pos = {key}(buf, pos)",
            "else:",
            " raise DecodeError(f'struct presence byte {_m}')",
        ]

    def array_source(self, element: str, target: str, nullable: bool, ns: dict) -> list[str]:
        lines = [*self.length_source("_c", nullable, "array"),
                 "if _c > _n - pos: raise DecodeError(f'array count {_c} exceeds the bytes left')",
                 "if _c < 0:", f" {target} = None", "else:"]
        code = FIXED.get(element)
        if code is not None:
            size = struct.calcsize(">" + code)
            key = f"_A{len(ns)}"
            ns[key] = _FIXED_ARRAY_UNPACKERS[code]
            lines += [f" {target} = list({key}(_c)(buf, pos))",
                      f" pos += _c * {size}"]
            return lines
        key = f"_E{len(ns)}"
        ns[key] = self.scalar_reader(element, self.flexible, False)
        lines += [f" {target} = []",
                  f" _a = {target}.append",
                  " for _ in range(_c):",
                  f"  _x, pos = {key}(buf, pos)",
                  "  _a(_x)"]
        return lines

    def default(self, f: FieldSpec):
        if f.type.startswith("[]"):
            return None if _in(f.nullable, self.version) and f.default is None else []
        if f.type == "uuid":
            return ZERO_UUID
        if f.type in self.spec.structs:
            if self.nullable(f):
                return None
            nested = self.struct(f.type, self.spec.structs[f.type]).defaults
            return _new_struct(dict(nested))    # shared, read-only: encode fallback and tag comparison
        return f.default

    def nullable(self, f: FieldSpec) -> bool:
        return _in(f.nullable, self.version)

    def reader(self, f: FieldSpec) -> Reader:
        t, flexible, nullable = f.type, self.flexible, self.nullable(f)
        if t.startswith("[]"):
            return self.array_reader(t[2:], flexible, nullable)
        return self.scalar_reader(t, flexible, nullable)

    def writer(self, f: FieldSpec) -> Writer:
        t, flexible = f.type, self.flexible
        if t.startswith("[]"):
            return self.array_writer(t[2:], flexible)
        return self.scalar_writer(t, flexible, self.nullable(f))

    def scalar_reader(self, t: str, flexible: bool, nullable: bool) -> Reader:
        if t in FIXED:
            return _fixed_reader(FIXED[t])
        if t == "string":
            return _string_reader(flexible, nullable)
        if t in ("bytes", "records"):
            return _bytes_reader(flexible, nullable, zero_copy=(t == "records"))
        if t == "bool":
            return _read_bool
        if t == "uuid":
            return _read_uuid
        inner = self.struct(t, self.spec.structs[t]).read
        if not nullable:
            return inner

        def read_nullable_struct(buf, pos):
            marker, = _I8.unpack_from(buf, pos)
            if marker == -1:
                return None, pos + 1
            if marker != 1:
                raise DecodeError(f"struct presence byte {marker}")
            return inner(buf, pos + 1)
        return read_nullable_struct

    def scalar_writer(self, t: str, flexible: bool, nullable: bool) -> Writer:
        if t in FIXED:
            return _fixed_writer(FIXED[t])
        if t == "string":
            return _string_writer(flexible)
        if t in ("bytes", "records"):
            return _bytes_writer(flexible)
        if t == "bool":
            return _write_bool
        if t == "uuid":
            return _write_uuid
        inner = self.struct(t, self.spec.structs[t]).write
        if not nullable:
            return inner

        def write_nullable_struct(value, out):
            if value is None:
                out.append(0xFF)
            else:
                out.append(1)
                inner(value, out)
        return write_nullable_struct

    def array_reader(self, element: str, flexible: bool, nullable: bool) -> Reader:
        read_len = _array_length_reader(flexible, nullable)
        code = FIXED.get(element)
        if code is not None:
            size = struct.calcsize(">" + code)

            def read_fixed_array(buf, pos):
                n, pos = read_len(buf, pos)
                if n < 0:
                    return None, pos
                return list(struct.unpack_from(f">{n}{code}", buf, pos)), pos + n * size
            return read_fixed_array
        item = self.scalar_reader(element, flexible, False)

        def read_array(buf, pos):
            n, pos = read_len(buf, pos)
            if n < 0:
                return None, pos
            items = []
            append = items.append
            for _ in range(n):
                value, pos = item(buf, pos)
                append(value)
            return items, pos
        return read_array

    def array_writer(self, element: str, flexible: bool) -> Writer:
        write_len = _array_length_writer(flexible)
        code = FIXED.get(element)
        if code is not None:
            def write_fixed_array(value, out):
                write_len(value, out)
                if value:
                    out += struct.pack(f">{len(value)}{code}", *value)
            return write_fixed_array
        item = self.scalar_writer(element, flexible, False)

        def write_array(value, out):
            write_len(value, out)
            if value:
                for v in value:
                    item(v, out)
        return write_array


def _read_tagged(buf, pos: int, d: dict, table: dict, defaults: dict) -> int:
    count, pos = read_uvarint(buf, pos)
    if count == 0:
        for name, _, _ in table.values():
            d[name] = defaults[name]
        return pos
    order = []
    unknown = None
    seen = set()
    for _ in range(count):
        tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        end = _length_checked(buf, pos, size)
        if tag in seen:
            raise DecodeError(f"tag {tag} repeated")
        seen.add(tag)
        order.append(tag)
        known = table.get(tag)
        if known is None:
            if unknown is None:
                unknown = {}
            unknown[tag] = bytes(buf[pos:end])
        else:
            value, after = known[1](buf, pos)
            if after != end:
                raise DecodeError(f"tagged field {known[0]} is {size} bytes but decoded {after - pos}")
            d[known[0]] = value
        pos = end
    for name, _, _ in table.values():
        if name not in d:
            d[name] = defaults[name]
    d["_tag_order"] = tuple(order)
    if unknown is not None:
        d["_unknown_tags"] = unknown
    return pos


def _write_tagged(values: dict, out: bytearray, table: dict, defaults: dict) -> None:
    """Tagged fields as received (same order, same set), else the non-default ones by tag."""
    order = values.get("_tag_order")
    unknown = values.get("_unknown_tags") or {}
    emit = []
    if order is not None:
        emit.extend(order)
    for tag, (name, _, _) in sorted(table.items()):
        if tag not in emit and values.get(name, defaults[name]) != defaults[name]:
            emit.append(tag)
    for tag in sorted(unknown):
        if tag not in emit:
            emit.append(tag)
    write_uvarint(len(emit), out)
    for tag in emit:
        known = table.get(tag)
        if known is not None:
            name, _, writer = known
            payload = bytearray()
            writer(values.get(name, defaults[name]), payload)
        elif tag in unknown:
            payload = unknown[tag]
        else:
            raise ValueError(f"tag {tag} was received but its value is gone")
        write_uvarint(tag, out)
        write_uvarint(len(payload), out)
        out += payload


_CODECS: dict[tuple[int, str, int], StructCodec] = {}


def message_codec(spec: MessageSpec, version: int) -> StructCodec:
    """The compiled codec for a message body at a version the spec has (cached)."""
    key = (spec.api_key, spec.kind, version)
    codec = _CODECS.get(key)
    if codec is None:
        codec = _Compiler(spec, version).struct(spec.name, spec.fields)
        _CODECS[key] = codec
    return codec
