#!/usr/bin/env python3
"""Generate ``kproxy/protocol/_schema.py`` from Apache Kafka's own message definitions.

Kafka ships its wire schema as JSON (``common/message/*.json``) inside the
``org.apache.kafka:kafka-clients`` jar. Kafka 4.0 dropped many old versions
(KIP-896) that clients in the field still speak, so we read two release lines:
the last 3.x (which still has them) and the newest 4.x, and merge them per
version: a version the 4.x line defines comes from 4.x, a version only 3.x
defines comes from 3.x. The merged field tree is then verified against both
sources, version by version, so a merge mistake fails generation instead of
silently mis-decoding traffic. The difference between the two lines is kept
too (``REMOVED_VERSIONS``): the request versions Kafka 4.0 removed.

Only facts are kept (names, types, version ranges, tags, defaults, error
codes); no descriptive text. Output is deterministic: sorted keys, stable
field order.

Usage:
    python tools/generate_schema.py           # regenerate the module
    python tools/generate_schema.py --check   # exit 1 if the committed module is stale
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

OLD_LINE = "3.9.2"  # last 3.x release: still defines the versions KIP-896 removed
NEW_LINE = "4.4.0"  # newest released 4.x
SLF4J = "org.slf4j:slf4j-api:1.7.36"  # Errors logs through slf4j; needed only to load the class

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "kproxy" / "protocol" / "_schema.py"
CACHE = Path(os.environ.get("KPROXY_CACHE_DIR", Path.home() / ".cache" / "kproxy")) / "schema-jars"

PRIMITIVES = {"bool", "int8", "int16", "uint16", "int32", "uint32", "int64", "float64",
              "string", "bytes", "records", "uuid"}

ERROR_TABLE_JAVA = """
public class ErrorTable {
    public static void main(String[] args) {
        for (org.apache.kafka.common.protocol.Errors e : org.apache.kafka.common.protocol.Errors.values()) {
            boolean retriable = e.exception() instanceof org.apache.kafka.common.errors.RetriableException;
            System.out.println(e.code() + " " + e.name() + " " + retriable);
        }
    }
}
"""


# ---------------------------------------------------------------- fetching

def fetch_jar(coordinate: str) -> Path:
    """Download one artifact from Maven Central (via mvn) into the cache."""
    group, artifact, version = coordinate.split(":")
    jar = CACHE / f"{artifact}-{version}.jar"
    if not jar.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mvn", "-q", "-B", "dependency:copy", f"-Dartifact={coordinate}",
             f"-DoutputDirectory={CACHE}"],
            check=True, capture_output=True)
    return jar


def read_definitions(jar: Path) -> dict[tuple[int, str], dict]:
    """Request/response definitions in a kafka-clients jar, keyed by (api key, kind)."""
    found = {}
    with zipfile.ZipFile(jar) as zf:
        for name in sorted(zf.namelist()):
            if not (name.startswith("common/message/") and name.endswith(".json")):
                continue
            text = zf.read(name).decode("utf-8")
            text = re.sub(r"^\s*//.*$", "", text, flags=re.M)  # license header comments
            spec = json.loads(text)
            if spec["type"] in ("request", "response"):
                found[(spec["apiKey"], spec["type"])] = spec
    return found


def read_error_table(jar: Path) -> list[tuple[int, str, bool]]:
    """(code, NAME, retriable) for every Kafka error, from the Errors enum itself."""
    slf4j = fetch_jar(SLF4J)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "ErrorTable.java"
        src.write_text(ERROR_TABLE_JAVA)
        out = subprocess.run(["java", "-cp", f"{jar}{os.pathsep}{slf4j}", str(src)],
                             check=True, capture_output=True, text=True).stdout
    table = []
    for line in out.splitlines():
        code, name, retriable = line.split()
        table.append((int(code), name, retriable == "true"))
    return sorted(table)


# ---------------------------------------------------------------- model

def parse_versions(text: str | None, valid: range) -> frozenset[int]:
    """Kafka version spec ("3+", "0-4", "7", "none") as a set, limited to valid versions."""
    if text is None or text == "none":
        return frozenset()
    if text.endswith("+"):
        lo, hi = int(text[:-1]), max(valid, default=-1)
    elif "-" in text:
        lo, hi = (int(x) for x in text.split("-"))
    else:
        lo = hi = int(text)
    return frozenset(v for v in valid if lo <= v <= hi)


def valid_range(text: str) -> range:
    if text == "none":
        return range(0)
    lo, _, hi = text.partition("-")
    return range(int(lo), int(hi or lo) + 1)


def snake(name: str) -> str:
    """PascalCase field name → snake_case attribute ("ThrottleTimeMs" → "throttle_time_ms")."""
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s)
    return s.lower()


@dataclass
class Field:
    name: str
    type: str                     # primitive, "[]primitive", "Struct" or "[]Struct"
    versions: frozenset[int]
    nullable: frozenset[int]
    tag: int | None
    tagged: frozenset[int]
    default: object
    children: list["Field"] | None = None   # struct fields (inline or common)

    @property
    def struct_name(self) -> str | None:
        base = self.type[2:] if self.type.startswith("[]") else self.type
        return None if base in PRIMITIVES else base


def parse_default(raw, ftype: str, nullable: bool):
    base = ftype
    if raw is None:
        if ftype.startswith("[]") or base not in PRIMITIVES:
            return None
        return {"bool": False, "string": "", "bytes": b"", "records": None,
                "uuid": bytes(16), "float64": 0.0}.get(base, 0)
    if raw == "null":
        return None
    if not isinstance(raw, str):            # a few definitions use JSON numbers/booleans
        raw = str(raw).lower()
    if base == "bool":
        return raw == "true"
    if base == "float64":
        return float(raw)
    if base in ("int8", "int16", "uint16", "int32", "uint32", "int64"):
        return int(raw, 0)
    if base == "string":
        return raw
    raise ValueError(f"unexpected default {raw!r} for type {ftype}")


def parse_fields(specs: list[dict], valid: range, common: dict[str, list[dict]]) -> list[Field]:
    fields = []
    for spec in specs:
        ftype = spec["type"]
        if "flexibleVersions" in spec:
            raise ValueError(f"field-level flexibleVersions outside headers: {spec['name']}")
        versions = parse_versions(spec["versions"], valid)
        nullable = parse_versions(spec.get("nullableVersions"), valid)
        f = Field(name=spec["name"], type=ftype, versions=versions,
                  nullable=nullable, tag=spec.get("tag"),
                  tagged=parse_versions(spec.get("taggedVersions"), valid),
                  default=None)
        f.default = parse_default(spec.get("default"), ftype, bool(nullable))
        sname = f.struct_name
        if sname is not None:
            child_specs = spec.get("fields", common.get(sname))
            if child_specs is None:
                raise ValueError(f"struct {sname} has no definition")
            f.children = parse_fields(child_specs, valid, common)
        fields.append(f)
    return fields


@dataclass
class Message:
    name: str
    valid: frozenset[int]
    flexible: frozenset[int]
    fields: list[Field] = field(default_factory=list)


def parse_message(spec: dict) -> Message:
    valid = valid_range(spec["validVersions"])
    common = {cs["name"]: cs["fields"] for cs in spec.get("commonStructs", [])}
    return Message(name=spec["name"], valid=frozenset(valid),
                   flexible=parse_versions(spec.get("flexibleVersions"), valid),
                   fields=parse_fields(spec.get("fields", []), valid, common))


# ---------------------------------------------------------------- merging

def restrict(fields: list[Field], keep: frozenset[int]) -> list[Field]:
    """The fields (recursively) as they exist in the given versions only."""
    out = []
    for f in fields:
        versions = f.versions & keep
        if not versions:
            continue
        out.append(Field(f.name, f.type, versions, f.nullable & keep, f.tag, f.tagged & keep,
                         f.default, restrict(f.children, keep) if f.children is not None else None))
    return out


def merge_fields(new: list[Field], old: list[Field], where: str) -> list[Field]:
    """Union of two disjoint-version field lists, keeping the newer line's order."""
    old_by_name = {f.name: f for f in old}
    merged: list[Field] = []
    for f in new:
        o = old_by_name.pop(f.name, None)
        if o is None:
            merged.append(f)
            continue
        if o.type != f.type or (o.tag != f.tag and o.tagged and f.tagged):
            raise ValueError(f"{where}.{f.name}: type/tag differs between lines")
        children = None
        if f.children is not None:
            children = merge_fields(f.children, o.children or [], f"{where}.{f.name}")
        merged.append(Field(f.name, f.type, f.versions | o.versions, f.nullable | o.nullable,
                            f.tag if f.tag is not None else o.tag, f.tagged | o.tagged,
                            f.default, children))
    # Fields only the old line has: place each after its predecessor in the old order.
    for f in old:
        if f.name not in old_by_name:
            continue
        idx = old.index(f)
        pos = 0
        for prev in reversed(old[:idx]):
            names = [m.name for m in merged]
            if prev.name in names:
                pos = names.index(prev.name) + 1
                break
        merged.insert(pos, f)
    return merged


def merge_message(new: Message | None, old: Message | None, where: str) -> Message:
    if new is None or not new.valid:
        return old
    if old is None:
        return new
    old_only = old.valid - new.valid
    if old.flexible & old_only and min(old.flexible) != min(new.flexible | old.flexible):
        raise ValueError(f"{where}: flexible versions disagree")
    fields = merge_fields(new.fields, restrict(old.fields, old_only), where)
    return Message(new.name, new.valid | old_only, new.flexible | (old.flexible & old_only), fields)


def projection(fields: list[Field], v: int):
    """What the wire looks like at version v: comparable across sources."""
    out = []
    for f in fields:
        if v not in f.versions:
            continue
        out.append((f.name, f.type, v in f.nullable, f.tag if v in f.tagged else None,
                    projection(f.children, v) if f.children is not None else None))
    return out


def verify(merged: Message, new: Message | None, old: Message | None, where: str) -> None:
    for v in sorted(merged.valid):
        source = new if new is not None and v in new.valid else old
        if projection(merged.fields, v) != projection(source.fields, v):
            raise ValueError(f"{where} v{v}: merged schema differs from its source")
        if (v in merged.flexible) != (v in source.flexible):
            raise ValueError(f"{where} v{v}: flexibility differs from its source")


# ---------------------------------------------------------------- output

def removed_request_versions(old_defs: dict, new_defs: dict) -> dict[int, tuple[int, int]]:
    """Request versions the old line defines and the new line does not: what Kafka 4.0 removed.

    Decided from the definitions' ``validVersions``, which is what KIP-896
    changed. Not from what a broker advertises: Kafka 4.x's ApiVersions answer
    still lists Produce 0-13 although its definition says 3-13, because older
    librdkafka turns compression off unless Produce v0 is advertised
    (KAFKA-18659); the broker rejects Produce 0-2 all the same.

    APIs whose new definition has no versions (LeaderAndIsr, StopReplica,
    UpdateMetadata, ControlledShutdown: inter-broker, ZooKeeper mode only) lose
    all their versions; they went with ZooKeeper in 4.0. A version the old line
    marks unstable (``latestVersionUnstable``: the early-access share-group v0
    of 3.9) was never released, so it was never removed either. The new line
    decides what stays: JoinGroup 0-1, dropped in 4.0.0 and restored in 4.0.1
    (KAFKA-19444), is not in the table.
    """
    removed = {}
    for (api_key, kind), old_spec in sorted(old_defs.items()):
        if kind != "request":
            continue
        stable = set(valid_range(old_spec["validVersions"]))
        if old_spec.get("latestVersionUnstable") and stable:
            stable.discard(max(stable))
        new_spec = new_defs.get((api_key, kind))
        kept = set(valid_range(new_spec["validVersions"])) if new_spec else set()
        gone = frozenset(stable - kept)
        if gone:
            removed[api_key] = span(gone, f"{old_spec['name']} removed versions")
    return removed



def span(versions: frozenset[int], where: str) -> tuple[int, int] | None:
    if not versions:
        return None
    lo, hi = min(versions), max(versions)
    if len(versions) != hi - lo + 1:
        raise ValueError(f"{where}: non-contiguous versions {sorted(versions)}")
    return (lo, hi)


def emit_fields(fields: list[Field], structs: dict, where: str) -> tuple:
    rows = []
    seen = set()
    for f in fields:
        attr = snake(f.name)
        if attr in seen:
            raise ValueError(f"{where}: duplicate attribute {attr}")
        seen.add(attr)
        sname = f.struct_name
        ftype = f.type
        if sname is not None:
            key = sname
            body = emit_fields(f.children, structs, f"{where}.{f.name}")
            if key in structs and structs[key] != body:
                key = f"{sname}@{where}.{f.name}"   # same struct name, different shape
            structs[key] = body
            ftype = ("[]" if f.type.startswith("[]") else "") + key
        rows.append((attr, ftype, span(f.versions, f"{where}.{f.name}"),
                     span(f.nullable, f"{where}.{f.name} nullable"),
                     f.tag if f.tagged else None,
                     span(f.tagged, f"{where}.{f.name} tagged"), f.default))
    return tuple(rows)


def emit_message(m: Message, where: str) -> tuple:
    structs: dict[str, tuple] = {}
    fields = emit_fields(m.fields, structs, where)
    return (span(m.valid, where), min(m.flexible) if m.flexible else None, fields,
            dict(sorted(structs.items())))


HEADER = '''\
# Generated by tools/generate_schema.py from Apache Kafka {old} and {new}
# message definitions (kafka-clients jars). DO NOT EDIT: regenerate instead.
"""Kafka's wire schema in kproxy's compact form (generated).

APIS maps api key -> (name, request, response). A message is
    ((min_version, max_version), first_flexible_version or None, fields, structs)
A field is
    (attribute, type, versions, nullable_versions, tag, tagged_versions, default)
where versions are inclusive (lo, hi) pairs or None, type is a primitive name,
"[]" + element type, or a key of the message's structs table (a struct's
fields, same row format). ERRORS maps error code -> (NAME, retriable).
REMOVED_VERSIONS maps api key -> (lo, hi): the request versions {old}
defines and {new} does not, i.e. what Kafka 4.0 removed (KIP-896); kproxy
still decodes them, a 4.x broker rejects them.
"""

SOURCE_VERSIONS = {sources!r}

'''


def generate() -> str:
    old_defs = read_definitions(fetch_jar(f"org.apache.kafka:kafka-clients:{OLD_LINE}"))
    new_jar = fetch_jar(f"org.apache.kafka:kafka-clients:{NEW_LINE}")
    new_defs = read_definitions(new_jar)
    apis = {}
    for api_key in sorted({k for k, _ in old_defs} | {k for k, _ in new_defs}):
        halves = []
        name = None
        for kind in ("request", "response"):
            where = f"{api_key}/{kind}"
            new = parse_message(new_defs[(api_key, kind)]) if (api_key, kind) in new_defs else None
            old = parse_message(old_defs[(api_key, kind)]) if (api_key, kind) in old_defs else None
            merged = merge_message(new, old, where)
            verify(merged, new if new and new.valid else None, old, where)
            halves.append(emit_message(merged, merged.name))
            name = name or merged.name.removesuffix("Request").removesuffix("Response")
        apis[api_key] = (name, halves[0], halves[1])
    errors = {code: (name, retriable) for code, name, retriable in read_error_table(new_jar)}
    out = HEADER.format(old=OLD_LINE, new=NEW_LINE, sources=(OLD_LINE, NEW_LINE))
    out += "APIS = {\n"
    for api_key, (name, request, response) in apis.items():
        out += f"    {api_key}: ({name!r},\n"
        out += render_message(request, "request") + render_message(response, "response") + "    ),\n"
    out += "}\n\nERRORS = {\n"
    out += "".join(f"    {code}: {entry!r},\n" for code, entry in errors.items())
    out += "}\n\n"
    out += ("# From the definitions, not from ApiVersions: a 4.x broker advertises Produce 0-13\n"
            "# (KAFKA-18659, for old librdkafka) yet rejects Produce 0-2.\n")
    out += "REMOVED_VERSIONS = {\n"
    out += "".join(f"    {api_key}: {versions!r},\n"
                   for api_key, versions in removed_request_versions(old_defs, new_defs).items())
    return out + "}\n"


def render_message(message: tuple, kind: str) -> str:
    """One message, one field per line: diffs between Kafka releases stay readable."""
    versions, flexible, fields, structs = message
    pad = " " * 8
    out = f"{pad}# {kind}\n{pad}({versions!r}, {flexible!r},\n"
    out += render_rows(fields, pad + " ") + f"{pad} {{\n"
    for name, rows in structs.items():
        out += f"{pad}  {name!r}:\n" + render_rows(rows, pad + "   ")
    return out + f"{pad} }}),\n"


def render_rows(rows: tuple, pad: str) -> str:
    if not rows:
        return f"{pad}(),\n"
    return f"{pad}(\n" + "".join(f"{pad} {row!r},\n" for row in rows) + f"{pad}),\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with the committed module instead of writing it")
    args = parser.parse_args()
    text = generate()
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT.relative_to(ROOT)} is stale: run tools/generate_schema.py", file=sys.stderr)
            return 1
        print(f"{OUTPUT.relative_to(ROOT)} is up to date")
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
