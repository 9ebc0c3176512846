"""The checks a rule may name: what each reads of a request, its options, the error it answers.

Each check is a small class: the APIs it looks at (``APIS``, None: every request), the
error a broker would give for it (``ERROR``: the answer when the rule is enforced), the
options it takes (``OPTIONS``, parsed in ``__init__``, a bad one raising ``PolicyError``
that names where), and ``__call__(subject)``: why a request breaks it, or None.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping

from ..patterns import MATCHED_CHARS, PatternError, compile_pattern
from ..protocol import API_KEYS, api_name, is_removed
from ..protocol.schema import ERROR_NAMES
from .subject import Subject, field as get, items

ERROR_CODES = {name: code for code, name in ERROR_NAMES.items()}
# A leading dotted number in a software version ("2.16.1-rdkafka-2.16.0" -> 2.16.1).
_VERSION_NUMBER = re.compile(r"\d+(?:\.\d+)*")


class PolicyError(ValueError):
    """A rules file that cannot be used; the message names the file, rule and key."""


def option_error(where: str, message: str) -> PolicyError:
    """The error for a bad option: ``where`` names the file, rule and key."""
    return PolicyError(f"{where}: {message}")


def _pattern(options: Mapping, key: str, where: str, required: bool = True) -> Callable[[str], Any] | None:
    value = options.get(key)
    if value is None:
        if required:
            raise option_error(f"{where}.{key}", "required (an RE2 pattern)")
        return None
    if not isinstance(value, str):
        raise option_error(f"{where}.{key}", f"expected an RE2 pattern, got {value!r}")
    try:
        return compile_pattern(value)
    except PatternError as exc:
        raise option_error(f"{where}.{key}", str(exc)) from None


def _whole(options: Mapping, key: str, where: str) -> int | None:
    value = options.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise option_error(f"{where}.{key}", f"expected a whole number, got {value!r}")
    return value


def _bounds(options: Mapping, key: str, where: str) -> tuple[float | None, float | None] | None:
    """``key = {min = A, max = B}`` (either may be left out)."""
    value = options.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping) or not value or set(value) - {"min", "max"}:
        raise option_error(f"{where}.{key}", f"expected a table with min and/or max, got {value!r}")
    out = []
    for bound in ("min", "max"):
        number = value.get(bound)
        if number is not None and (isinstance(number, bool) or not isinstance(number, (int, float))):
            raise option_error(f"{where}.{key}.{bound}", f"expected a number, got {number!r}")
        out.append(number)
    return out[0], out[1]


def _outside(value: float, bounds: tuple[float | None, float | None]) -> str | None:
    low, high = bounds
    if low is not None and value < low:
        return f"below {low:g}"
    if high is not None and value > high:
        return f"above {high:g}"
    return None


def _name(value: str | None) -> str:
    return (value or "")[:MATCHED_CHARS]


def version_number(text: str | None) -> tuple[int, ...] | None:
    """The leading dotted number of a software version, as a tuple; None if it has none."""
    found = _VERSION_NUMBER.match(text or "")
    return tuple(int(part) for part in found.group().split(".")) if found else None


# Each check: the APIs it looks at (None: every request), the error a broker would give for
# it (the answer when enforced), its options, and a call that returns why a request breaks
# it (None: it does not).

class Check:
    APIS: frozenset[int] | None = None
    ERROR = "POLICY_VIOLATION"
    OPTIONS: tuple[str, ...] = ()

    def __init__(self, options: Mapping, where: str):
        pass

    def __call__(self, subject: Subject) -> str | None:
        raise NotImplementedError


PRODUCE, FETCH, CREATE_TOPICS = API_KEYS["Produce"], API_KEYS["Fetch"], API_KEYS["CreateTopics"]
GROUP_JOINS = frozenset(API_KEYS[name] for name in
                        ("JoinGroup", "ConsumerGroupHeartbeat", "ShareGroupHeartbeat", "StreamsGroupHeartbeat")
                        if name in API_KEYS)
ACKS_ALL = -1


class AcksAll(Check):
    """Produce with acks=all (-1): acks=1 loses acknowledged records when a leader fails."""
    APIS = frozenset({PRODUCE})
    ERROR = "INVALID_REQUIRED_ACKS"

    def __call__(self, subject: Subject) -> str | None:
        acks = get(subject.body, "acks")
        return None if acks is None or acks == ACKS_ALL else f"acks={acks}"


class Idempotent(Check):
    """Produce batches carry a producer id (enable.idempotence)."""
    APIS = frozenset({PRODUCE})

    def __call__(self, subject: Subject) -> str | None:
        return "batches without a producer id" if subject.idempotent() is False else None


class Compressed(Check):
    """Produce batches are compressed (optionally: with one of ``codecs``)."""
    APIS = frozenset({PRODUCE})
    OPTIONS = ("codecs",)

    def __init__(self, options: Mapping, where: str):
        codecs = options.get("codecs")
        if codecs is not None and (not isinstance(codecs, list) or not all(isinstance(c, str) for c in codecs)):
            raise option_error(f"{where}.codecs", f"expected a list of codec names, got {codecs!r}")
        self.codecs = frozenset(codecs) if codecs else None

    def __call__(self, subject: Subject) -> str | None:
        codecs = subject.codecs()
        if "none" in codecs:
            return "uncompressed batches"
        if self.codecs is not None and codecs - self.codecs:
            return f"compressed with {', '.join(sorted(codecs - self.codecs))}"
        return None


class ClientSoftwareVersion(Check):
    """Client software (as named in ApiVersions v3+) at least a version, per software name."""
    OPTIONS = ("min_versions",)

    def __init__(self, options: Mapping, where: str):
        table = options.get("min_versions")
        if not isinstance(table, Mapping) or not table:
            raise option_error(f"{where}.min_versions", "required: a table of software name = minimum version")
        self.minimum: dict[str, tuple[tuple[int, ...], str]] = {}
        for name, text in table.items():
            number = version_number(str(text))
            if number is None:
                raise option_error(f"{where}.min_versions.{name}", f"expected a version like 2.3.0, got {text!r}")
            self.minimum[str(name)] = (number, str(text))

    def __call__(self, subject: Subject) -> str | None:
        name, version = subject.software
        wanted = self.minimum.get(name or "")
        if wanted is None:
            return None
        number = version_number(version)
        if number is not None and number < wanted[0]:
            return f"{name} {version} older than {wanted[1]}"
        return None


class RemovedApiVersions(Check):
    """No request versions Kafka 4.0 removed (KIP-896): a 4.x broker closes on them."""
    ERROR = "UNSUPPORTED_VERSION"

    def __call__(self, subject: Subject) -> str | None:
        if is_removed(subject.api_key, subject.api_version):
            return f"{api_name(subject.api_key)} v{subject.api_version} (removed in Kafka 4.0)"
        return None


class ClientId(Check):
    """A client id, matching ``pattern`` if given."""
    OPTIONS = ("pattern",)

    def __init__(self, options: Mapping, where: str):
        self.match = _pattern(options, "pattern", where, required=False)

    def __call__(self, subject: Subject) -> str | None:
        if not subject.client_id:
            return "no client id"
        if self.match is not None and not self.match(_name(subject.client_id)):
            return f"client id {subject.client_id!r} does not match"
        return None


class TopicNames(Check):
    """Topics created (CreateTopics) with names matching ``pattern``."""
    APIS = frozenset({CREATE_TOPICS})
    OPTIONS = ("pattern",)

    def __init__(self, options: Mapping, where: str):
        self.match = _pattern(options, "pattern", where)

    def __call__(self, subject: Subject) -> str | None:
        bad = [get(t, "name") for t in items(subject.body, "topics") if not self.match(_name(get(t, "name")))]
        return f"topic name {', '.join(map(repr, bad))} does not match" if bad else None


class CreateTopicSettings(Check):
    """Topics created with at least a replication factor and partitions, configs within bounds.
    A replication factor or partition count left to the broker's default (-1) breaks the
    minimum unless ``allow_broker_default`` (kproxy cannot see the broker's default)."""
    APIS = frozenset({CREATE_TOPICS})
    OPTIONS = ("min_replication_factor", "min_partitions", "max_partitions", "allow_broker_default", "configs")

    def __init__(self, options: Mapping, where: str):
        self.min_replication = _whole(options, "min_replication_factor", where)
        self.partitions = (_whole(options, "min_partitions", where), _whole(options, "max_partitions", where))
        allow = options.get("allow_broker_default", False)
        if not isinstance(allow, bool):
            raise option_error(f"{where}.allow_broker_default", f"expected true or false, got {allow!r}")
        self.allow_default = allow
        configs = options.get("configs") or {}
        if not isinstance(configs, Mapping):
            raise option_error(f"{where}.configs", "expected a table of config name = {min, max}")
        self.configs = {str(name): _bounds(configs, name, f"{where}.configs") for name in configs}
        if self.min_replication is None and self.partitions == (None, None) and not self.configs:
            raise option_error(where, "names no bound (min_replication_factor, min_partitions, "
                               "max_partitions or configs)")

    def __call__(self, subject: Subject) -> str | None:
        for topic in items(subject.body, "topics"):
            why = self._topic(topic)
            if why is not None:
                return f"topic {get(topic, 'name')!r}: {why}"
        return None

    def _topic(self, topic) -> str | None:
        replication = get(topic, "replication_factor")
        assignments = items(topic, "assignments")
        if assignments:                       # explicit replica lists: their length
            replication = len(items(assignments[0], "broker_ids"))
        partitions = len(assignments) if assignments else get(topic, "num_partitions")
        if self.min_replication is not None and replication is not None:
            if replication == -1 and not self.allow_default:
                return "replication factor left to the broker's default"
            if replication != -1 and replication < self.min_replication:
                return f"replication factor {replication} below {self.min_replication}"
        if partitions is not None and self.partitions != (None, None):
            if partitions == -1:
                if not self.allow_default and self.partitions[0] is not None:
                    return "partitions left to the broker's default"
            else:
                outside = _outside(partitions, self.partitions)
                if outside is not None:
                    return f"{partitions} partitions, {outside}"
        given = {get(c, "name"): get(c, "value") for c in items(topic, "configs")}
        for name, bounds in self.configs.items():
            value = given.get(name)
            if value is None:
                continue
            try:
                number = float(value)
            except ValueError:
                return f"{name}={value!r} is not a number"
            outside = _outside(number, bounds)
            if outside is not None:
                return f"{name}={value} {outside}"
        return None


class FetchBounds(Check):
    """Fetch requests' max_wait_ms and max_bytes within bounds."""
    APIS = frozenset({FETCH})
    OPTIONS = ("max_wait_ms", "max_bytes")

    def __init__(self, options: Mapping, where: str):
        self.bounds = {key: b for key in self.OPTIONS if (b := _bounds(options, key, where)) is not None}
        if not self.bounds:
            raise option_error(where, "names no bound (max_wait_ms or max_bytes)")

    def __call__(self, subject: Subject) -> str | None:
        for key, bounds in self.bounds.items():
            value = get(subject.body, key)
            if value is None:
                continue
            outside = _outside(value, bounds)
            if outside is not None:
                return f"{key}={value} {outside}"
        return None


class GroupNames(Check):
    """Consumer groups joined (JoinGroup, the KIP-848 heartbeats) with ids matching ``pattern``."""
    APIS = GROUP_JOINS
    ERROR = "INVALID_GROUP_ID"
    OPTIONS = ("pattern",)

    def __init__(self, options: Mapping, where: str):
        self.match = _pattern(options, "pattern", where)

    def __call__(self, subject: Subject) -> str | None:
        group = get(subject.body, "group_id")
        if group is None or self.match(_name(group)):
            return None
        return f"group {group!r} does not match"


CHECKS: dict[str, type[Check]] = {
    "acks_all": AcksAll,
    "idempotent": Idempotent,
    "compressed": Compressed,
    "client_software": ClientSoftwareVersion,
    "removed_api_versions": RemovedApiVersions,
    "client_id": ClientId,
    "topic_names": TopicNames,
    "create_topics": CreateTopicSettings,
    "fetch_bounds": FetchBounds,
    "group_names": GroupNames,
}
