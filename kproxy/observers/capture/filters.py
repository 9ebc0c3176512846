"""Which traffic a capture keeps.

Filters run in two places, chosen by cost:

- On the event loop thread, per event, before anything is queued (must be
  O(1)): the client address (decided once per connection and cached), the
  API, the client_id (read from the request header without decoding the
  body) and sampling.

The client_id is chosen by the client, so matching it must cost a bounded
time whatever it holds: ``client_id_regex`` is compiled with RE2 (linear in
the text, no backtracking; patterns RE2 cannot run in linear time, such as
backreferences and lookaround, are refused when the filter is set), its
compiled size is capped, and only the first ``MATCHED_CLIENT_ID_CHARS``
characters of a client_id are matched. Globs are Python's ``fnmatch``, which
translates ``*`` into atomic groups (no backtracking across stars).
- On the writer thread, after decoding: topics (they need the body).

Sampling is a hash of (connection id, correlation id), so a request and its
response are always kept or dropped together, and a given pair gets the same
decision in every output format.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
import socket
import struct
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from ...patterns import MATCHED_CHARS, PatternError, compile_pattern
from ...protocol import schema

_I16 = struct.Struct(">h")
_MASK64 = (1 << 64) - 1
_CONTROLLED_SHUTDOWN = 7

# Filters match at most this many characters of a client_id: the match runs on the event
# loop for every request (``kproxy.patterns``).
MATCHED_CLIENT_ID_CHARS = MATCHED_CHARS


def compile_regex(pattern: str, key: str) -> Callable[[str], Any]:
    """An operator's pattern as RE2's ``search`` (``kproxy.patterns``); ValueError naming ``key``."""
    try:
        return compile_pattern(pattern)
    except PatternError as exc:
        raise ValueError(f"{key}: {exc}") from None


def sample_hash(connection_id: int, correlation_id: int) -> float:
    """A deterministic value in [0, 1) for a (connection, correlation id) pair (splitmix64)."""
    x = (connection_id * 0x9E3779B97F4A7C15 + (correlation_id & 0xFFFFFFFF) * 0xC2B2AE3D27D4EB4F
         + 0x165667B19E3779F9) & _MASK64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _MASK64
    x ^= x >> 31
    return x / 18446744073709551616.0


def _client_id_span(frame) -> tuple[int, int] | None:
    """Where a request frame's client_id lies (start, length), from the header alone."""
    try:
        api_key, api_version = struct.unpack_from(">hh", frame, 0)
        if api_key == _CONTROLLED_SHUTDOWN and api_version == 0:
            return None                      # request header v0: no client_id
        n, = _I16.unpack_from(frame, 8)
    except (struct.error, TypeError):
        return None
    return None if n < 0 else (10, n)


def header_client_id(frame) -> str | None:
    """The client_id of a request frame, read from the header alone (no body decoding)."""
    span = _client_id_span(frame)
    return None if span is None else str(frame[span[0]:span[0] + span[1]], "utf-8", "surrogateescape")


def matched_client_id(frame) -> str:
    """What filters match of a request's client_id: its first ``MATCHED_CLIENT_ID_CHARS``
    characters, invalid UTF-8 as U+FFFD (RE2 takes valid text only); "" when it has none."""
    span = _client_id_span(frame)
    if span is None:
        return ""
    # 4 bytes is the longest UTF-8 character: enough bytes for the characters kept.
    start, n = span
    return str(frame[start:start + min(n, 4 * MATCHED_CLIENT_ID_CHARS)], "utf-8",
               "replace")[:MATCHED_CLIENT_ID_CHARS]


@dataclass(frozen=True)
class CaptureFilter:
    """What to keep. Empty means everything.

    ``apis``: API names (``"Produce"``) or keys; ``client_id``: a glob
    (``"billing-*"``); ``client_id_regex``: a regular expression in RE2 syntax, searched;
    ``clients``: client addresses as CIDR (``10.0.0.0/8``), IP or host name
    (resolved when the capture starts); ``topics``: topic names or globs (a
    pair is kept if its request or response names a matching topic; topic
    ids are resolved from Metadata responses seen); ``sample``: the fraction
    of request/response pairs kept (0 < sample <= 1).
    """

    apis: tuple[str, ...] = ()
    client_id: str | None = None
    client_id_regex: str | None = None
    clients: tuple[str, ...] = ()
    topics: tuple[str, ...] = ()
    sample: float = 1.0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, key: str = "capture.filter") -> "CaptureFilter":
        """From plain config/JSON values; raises ValueError naming the key."""
        if data is None:
            return cls()
        if isinstance(data, CaptureFilter):
            return data
        if not isinstance(data, Mapping):
            raise ValueError(f"{key}: expected a table/object, got {type(data).__name__}")
        known = {"apis", "client_id", "client_id_regex", "clients", "topics", "sample"}
        unknown = set(data) - known
        if unknown:
            from ...spelling import did_you_mean
            name = sorted(unknown)[0]
            suggestion = did_you_mean(str(name), known) or f" (one of {', '.join(sorted(known))})"
            raise ValueError(f"{key}.{name}: unknown setting{suggestion}")
        values: dict[str, Any] = {}
        for name in ("apis", "clients", "topics"):
            if data.get(name) is not None:
                values[name] = _str_tuple(data[name], f"{key}.{name}")
        for name in ("client_id", "client_id_regex"):
            if data.get(name) is not None:
                values[name] = str(data[name])
        if data.get("sample") is not None:
            try:
                values["sample"] = float(data["sample"])
            except (TypeError, ValueError):
                raise ValueError(f"{key}.sample: expected a number, got {data['sample']!r}") from None
        result = cls(**values)
        result.validate(key)
        return result

    def validate(self, key: str = "capture.filter") -> None:
        if not 0.0 < self.sample <= 1.0:
            raise ValueError(f"{key}.sample: must be > 0 and <= 1, got {self.sample}")
        _api_keys(self.apis, f"{key}.apis")
        if self.client_id_regex is not None:
            compile_regex(self.client_id_regex, f"{key}.client_id_regex")
        for entry in self.clients:
            _parse_client(entry, f"{key}.clients", resolve=False)

    def to_dict(self) -> dict[str, Any]:
        return {"apis": list(self.apis), "client_id": self.client_id,
                "client_id_regex": self.client_id_regex, "clients": list(self.clients),
                "topics": list(self.topics), "sample": self.sample}

    @property
    def is_empty(self) -> bool:
        return self == CaptureFilter()

    def compile(self) -> "CompiledFilter":
        return CompiledFilter(self)


def _str_tuple(value: Any, key: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [v for v in value.split(",")]
    if not isinstance(value, Iterable):
        raise ValueError(f"{key}: expected a list or a comma-separated string, got {value!r}")
    return tuple(str(v).strip() for v in value if str(v).strip())


def _api_keys(apis: Iterable[str | int], key: str) -> frozenset[int]:
    keys = set()
    lower = {name.lower(): k for name, k in schema.API_KEYS.items()}
    for api in apis:
        text = str(api).strip()
        if text.lstrip("-").isdigit():
            keys.add(int(text))
        elif text.lower() in lower:
            keys.add(lower[text.lower()])
        else:
            raise ValueError(f"{key}: unknown API {text!r} (use Kafka's names, e.g. Produce, Fetch, "
                             f"Metadata, or API keys)")
    return frozenset(keys)


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _parse_client(entry: str, key: str, resolve: bool) -> list[Network]:
    try:
        return [ipaddress.ip_network(entry, strict=False)]
    except ValueError:
        pass
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", entry):
        raise ValueError(f"{key}: {entry!r} is neither a CIDR, an IP address nor a host name")
    if not resolve:
        return []
    try:
        infos = socket.getaddrinfo(entry, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return []          # an unresolvable host matches nothing (and its literal name)
    return [ipaddress.ip_network(info[4][0].split("%")[0]) for info in infos]


def _address(host: str):
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


class CompiledFilter:
    """A CaptureFilter made fast: sets, compiled patterns, resolved networks."""

    def __init__(self, spec: CaptureFilter):
        spec.validate()
        self.spec = spec
        self.api_keys = _api_keys(spec.apis, "capture.filter.apis") or None
        patterns = []
        if spec.client_id is not None:
            patterns.append(re.compile(fnmatch.translate(spec.client_id)).match)
        if spec.client_id_regex is not None:
            patterns.append(compile_regex(spec.client_id_regex, "capture.filter.client_id_regex"))
        self.client_id_patterns = patterns or None
        self.networks: list[Network] = []
        self.client_names: set[str] = set()
        for entry in spec.clients:
            self.networks.extend(_parse_client(entry, "capture.filter.clients", resolve=True))
            self.client_names.add(entry.lower())
        self.has_clients = bool(spec.clients)
        self.sample = spec.sample if spec.sample < 1.0 else None
        self.topic_names = frozenset(t for t in spec.topics if not _is_glob(t))
        self.topic_globs = [re.compile(fnmatch.translate(t)).match for t in spec.topics if _is_glob(t)]
        self.has_topics = bool(spec.topics)

    # ------------------------------------------------------------ event loop thread (O(1))

    def connection_ok(self, info) -> bool:
        if not self.has_clients:
            return True
        host = info.client[0]
        if host.lower() in self.client_names:
            return True
        address = _address(host)
        if address is None:
            return False
        return any(address.version == net.version and address in net for net in self.networks)

    def request_ok(self, connection_id: int, request) -> bool:
        """``request``: a RequestReceived. API, client_id and sampling."""
        if self.api_keys is not None and request.api_key not in self.api_keys:
            return False
        if self.sample is not None and sample_hash(connection_id, request.correlation_id) >= self.sample:
            return False
        if self.client_id_patterns is not None:
            client_id = matched_client_id(request.frame)
            if not any(p(client_id) for p in self.client_id_patterns):
                return False
        return True

    # ------------------------------------------------------------ writer thread

    def topics_ok(self, topics: Iterable[str]) -> bool:
        if not self.has_topics:
            return True
        for topic in topics:
            if topic in self.topic_names or any(g(topic) for g in self.topic_globs):
                return True
        return False


def _is_glob(text: str) -> bool:
    return any(c in text for c in "*?[")
