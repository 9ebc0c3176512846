"""Partial decoding of Produce and Fetch (and ApiVersions answers): only the fields observers
and rewriting read.

Produce requests and Fetch answers carry megabytes of records in a handful of
partitions, and pass at line rate; the metrics read a few fields of them (each
partition's records, log end offsets and error code, the throttle time), the
address rewriting only whether they name node endpoints (KIP-951). Decoding
them whole makes a struct per partition with every field, and the strings,
UUIDs and lists nobody reads.

A partial reader is the whole reader (``_codec``) compiled for one (message,
version) with the fields not in ``SKIMMED`` skipped: checked exactly as the
whole reader checks them, but not kept (no str, bytes, UUID, list or struct is
made for them). So:

- a frame that decodes partially decodes whole (a frame the partial reader
  refuses is decoded whole to say why), and
- every field the partial body has, it has with the value the whole body has
  (``tests/protocol/test_skim.py`` checks both on generated and mutated frames).

A field is kept when ``SKIMMED`` names it (structs named there are kept whole),
when it is an error code (``walk.error_codes`` then finds every one), or when
it holds such a field (it is then kept with only those). Tagged fields that are
present are always decoded whole: they are rare, and that keeps their checks.
"""

from __future__ import annotations

from . import schema
from .api_keys import ApiKey
from ._codec import StructCodec, _Compiler, _in, message_codec
from .messages import Request, Response, decode_request, decode_response
from .walk import _is_error_field

# (kind, api key) -> the fields a partial body keeps (names as in ``protocol/_schema.py``; a
# name counts in every struct of the message that has it). Read by ``observers.metrics`` and
# by the address rewriting (``node_endpoints``).
SKIMMED: dict[tuple[str, int], frozenset[str]] = {
    ("request", ApiKey.PRODUCE): frozenset({
        "name", "topic_id",                         # the topic (v13+: by id)
        "records",
        "acks"}),                                   # policy rules (kproxy.policy)
    ("response", ApiKey.PRODUCE): frozenset({"throttle_time_ms", "node_endpoints",
                                             # which partition failed, and the leader hint (failovers)
                                             "name", "topic_id", "index", "current_leader"}),
    ("request", ApiKey.FETCH): frozenset({              # a consumer's positions (consumer lag)
        "replica_id", "replica_state", "isolation_level", "session_epoch",
        "topic", "topic_id", "partition", "fetch_offset", "forgotten_topics_data",
        "max_wait_ms", "max_bytes"}),                # policy rules (kproxy.policy)
    ("response", ApiKey.FETCH): frozenset({
        "throttle_time_ms", "topic", "topic_id", "partition_index", "high_watermark",
        "last_stable_offset", "records", "node_endpoints", "current_leader"}),
    # ~80 API entries nobody but the rewriting (which decodes whole) reads: decoding them for
    # the metrics took ~0.9 ms an answer, and a client may ask as often as it likes.
    ("response", ApiKey.API_VERSIONS): frozenset({"throttle_time_ms"}),
}
# Plain ints: looked up per event (an IntEnum member compares slower than an int).
SKIMMED_REQUESTS = frozenset(int(key) for kind, key in SKIMMED if kind == "request")
SKIMMED_RESPONSES = frozenset(int(key) for kind, key in SKIMMED if kind == "response")


class _PartialCompiler(_Compiler):
    """Compiles readers that keep only ``keep`` (and what leads to it); see the module docstring."""

    def __init__(self, spec: schema.MessageSpec, version: int, keep: frozenset[str]):
        super().__init__(spec, version)
        self.keep = keep
        self.whole = _Compiler(spec, version)       # for kept-by-name structs and tagged fields
        self.skippers: dict[str, object] = {}
        self.holds: dict[str, bool] = {}

    def _present(self, rows) -> tuple[list, list]:
        v = self.version
        present = [f for f in rows if _in(f.versions, v)]
        return ([f for f in present if not _in(f.tagged, v)], [f for f in present if _in(f.tagged, v)])

    def kept(self, f) -> bool:
        if f.name in self.keep or _is_error_field(f.name, f.type):
            return True
        base = f.type[2:] if f.type.startswith("[]") else f.type
        return base in self.spec.structs and self.holds_kept(base)

    def holds_kept(self, name: str) -> bool:
        if name not in self.holds:
            self.holds[name] = False             # a struct that contains itself ends here
            regular, _ = self._present(self.spec.structs[name])
            self.holds[name] = any(self.kept(f) for f in regular)
        return self.holds[name]

    def _tag_table(self, tagged) -> dict:
        return {f.tag: (f.name, self.whole.reader(f), None) for f in tagged}

    def struct(self, name: str, rows) -> StructCodec:
        codec = self.cache.get(name)
        if codec is None:
            regular, tagged = self._present(rows)
            defaults = self.whole.struct(name, rows).defaults
            skipped = frozenset(f.name for f in regular if not self.kept(f))
            read = self.generated_reader(name, regular, self._tag_table(tagged), defaults, skipped)
            codec = self.cache[name] = StructCodec(name, read, None, defaults)
        return codec

    def skip_reader(self, name: str):
        reader = self.skippers.get(name)
        if reader is None:
            rows = self.spec.structs[name]
            regular, tagged = self._present(rows)
            reader = self.skippers[name] = self.generated_reader(
                name, regular, self._tag_table(tagged), self.whole.struct(name, rows).defaults, build=False)
        return reader

    def field_source(self, f, target: str, ns: dict) -> list[str]:
        if f.name in self.keep:                     # named: read whole, nested structs too
            return self.whole.field_source(f, target, ns)
        return super().field_source(f, target, ns)


_PARTIAL: dict[tuple[int, str, int], StructCodec] = {}


def partial_codec(spec: schema.MessageSpec, version: int) -> StructCodec:
    """The partial codec of a message in ``SKIMMED`` (the whole one for any other), cached:
    one lookup per frame (the decoders reach here only for versions the schema has)."""
    key = (spec.api_key, spec.kind, version)
    codec = _PARTIAL.get(key)
    if codec is None:
        keep = SKIMMED.get((spec.kind, spec.api_key))
        codec = _PARTIAL[key] = message_codec(spec, version) if keep is None else \
            _PartialCompiler(spec, version, keep).struct(spec.name, spec.fields)
    return codec


def skim_request(frame) -> Request:
    """``decode_request`` with a partial body for Produce and Fetch. Raises only DecodeError."""
    return decode_request(frame, partial_codec)


def skim_response(frame, api_key: int, api_version: int) -> Response:
    """``decode_response`` with a partial body for Produce and Fetch. Raises only DecodeError."""
    return decode_response(frame, api_key, api_version, partial_codec)
