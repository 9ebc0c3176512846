"""What a leadership change cost each client, from the wire alone (sans-I/O).

Two parts, shared by the live observer (``observers.failover``) and ``kproxy analyze``
(``pipeline.failovers``), so both tell the same story from the same rules:

- ``partition_answers``: the per-partition answer of a Produce, Fetch or Metadata
  response: topic, partition, error name, and a leader with its epoch (Metadata:
  the partition's leader; Produce v10+ / Fetch v12+: the KIP-951 ``CurrentLeader``
  hint a broker adds to a NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH answer).
- ``FailoverTracker``: fed one client's answers in time order, it follows each
  partition from its first answer with a leadership error (``LEADER_ERRORS``) to
  the first answer without error, and returns a ``Failover`` for it: the node that
  failed and the one that answered, how many requests failed and with which
  errors, whether the broker gave a hint, whether the client asked for Metadata
  in between, and the recovery time (first success answered − first failure sent).

A client here is what ``ClientKey`` names (client id, software, principal, host):
a producer's connections to every broker are one client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, NamedTuple

from .api_keys import ApiKey
from .schema import error_name

PRODUCE_KEY, FETCH_KEY, METADATA_KEY = map(int, (ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.METADATA))   # plain ints
ANSWERING_APIS = frozenset({PRODUCE_KEY, FETCH_KEY})
# The APIs whose answers say something per partition about leadership.
PARTITION_APIS = ANSWERING_APIS | {METADATA_KEY}

# Answers that mean "this node does not (or no longer) lead the partition": the client
# must find the new leader (Kafka's InvalidMetadataException family for leadership).
LEADER_ERRORS = frozenset({"NOT_LEADER_OR_FOLLOWER", "FENCED_LEADER_EPOCH",
                           "LEADER_NOT_AVAILABLE", "UNKNOWN_LEADER_EPOCH"})
NO_ERROR = "NONE"
# Kafka's "no leader" in LeaderIdAndEpoch and Metadata (-1): not a hint.
NO_LEADER = -1

# How a client reached the new leader:
RECOVERED_BY_HINT = "hint"          # the KIP-951 hint named it, and no Metadata answer came first
RECOVERED_BY_METADATA = "metadata"  # a Metadata answer came between the failure and the retry
RECOVERED_BY_RETRY = "retry"        # neither: the client retried where it was (or guessed)
RECOVERED_BY = (RECOVERED_BY_HINT, RECOVERED_BY_METADATA, RECOVERED_BY_RETRY)

# Partitions one tracker follows in a failure at once, and leaders it remembers (a client
# naming more is not one whose failovers can be told apart; the oldest are forgotten).
MAX_PENDING = 10_000
MAX_LEADERS = 100_000


class PartitionAnswer(NamedTuple):
    """One partition of an answer; ``leader_id``/``leader_epoch`` None when not named."""
    topic: str
    partition: int
    error: str
    leader_id: int | None
    leader_epoch: int | None


class ClientKey(NamedTuple):
    """Who a failover happened to."""
    client_id: str | None
    software_name: str | None
    software_version: str | None
    principal: str | None
    host: str | None


@dataclass(frozen=True, slots=True)
class Failover:
    """One client's way through one partition's leadership change."""
    client: ClientKey
    topic: str
    partition: int
    api: str                         # Produce or Fetch: what the client was doing
    old_leader: int | None           # the node that answered with the first leadership error
    new_leader: int | None           # the node of the first answer without error
    first_failure: float             # when the first failed request was sent
    recovered: float                 # when the first successful answer came
    failed_requests: int             # requests answered with an error for this partition
    errors: tuple[tuple[str, int], ...]   # (error name, count), most frequent first
    hint_leader: int | None          # the KIP-951 hint of the first answer that gave one
    hint_epoch: int | None
    metadata_requests: int           # Metadata answers the client got in between
    recovered_by: str                # RECOVERED_BY

    @property
    def recovery_seconds(self) -> float:
        return max(self.recovered - self.first_failure, 0.0)

    def as_dict(self) -> dict:
        """JSON-able (the live page, tests)."""
        return {"client_id": self.client.client_id, "software_name": self.client.software_name,
                "software_version": self.client.software_version, "principal": self.client.principal,
                "client_host": self.client.host, "topic": self.topic, "partition": self.partition,
                "api": self.api, "old_leader": self.old_leader, "new_leader": self.new_leader,
                "first_failure": self.first_failure, "recovered": self.recovered,
                "recovery_seconds": self.recovery_seconds, "failed_requests": self.failed_requests,
                "errors": dict(self.errors), "hint_leader": self.hint_leader,
                "hint_epoch": self.hint_epoch, "metadata_requests": self.metadata_requests,
                "recovered_by": self.recovered_by}


# ---------------------------------------------------------------- answers from decoded bodies

def _topic(values: dict, names: dict[str, str]) -> str:
    for key in ("name", "topic"):
        text = values.get(key)
        if text:
            return text
    topic_id = values.get("topic_id")
    if topic_id is None:
        return ""
    text = str(topic_id)
    return names.get(text, text)


def _hint(values: dict) -> tuple[int | None, int | None]:
    leader = values.get("current_leader")
    if leader is None:
        return None, None
    fields = leader.__dict__
    leader_id = fields.get("leader_id", NO_LEADER)
    if leader_id is None or leader_id < 0:
        return None, None
    epoch = fields.get("leader_epoch")
    return leader_id, epoch if epoch is not None and epoch >= 0 else None


def partition_answers(api_key: int, body, names: dict[str, str] | None = None) -> list[PartitionAnswer]:
    """Per partition of a Produce, Fetch or Metadata response body (full or skimmed);
    ``names`` resolves topic ids (Produce v13+, Fetch v13+) and learns them from Metadata."""
    if body is None or api_key not in PARTITION_APIS:
        return []
    names = names if names is not None else {}
    fields = body.__dict__
    out: list[PartitionAnswer] = []
    if api_key == METADATA_KEY:
        for topic in fields.get("topics") or ():
            values = topic.__dict__
            name = values.get("name")
            topic_id = values.get("topic_id")
            if name and topic_id is not None and any(topic_id):
                names[str(topic_id)] = name
            name = name or _topic(values, names)
            for part in values.get("partitions") or ():
                p = part.__dict__
                leader = p.get("leader_id", NO_LEADER)
                epoch = p.get("leader_epoch")
                out.append(PartitionAnswer(name, p.get("partition_index", 0), error_name(p.get("error_code", 0)),
                                           leader if leader is not None and leader >= 0 else None,
                                           epoch if epoch is not None and epoch >= 0 else None))
        return out
    topics = fields.get("responses") or ()
    partitions_field = "partition_responses" if api_key == PRODUCE_KEY else "partitions"
    index_field = "index" if api_key == PRODUCE_KEY else "partition_index"
    for topic in topics:
        values = topic.__dict__
        name = _topic(values, names)
        for part in values.get(partitions_field) or ():
            p = part.__dict__
            leader, epoch = _hint(p)
            out.append(PartitionAnswer(name, p.get(index_field, 0), error_name(p.get("error_code", 0)),
                                       leader, epoch))
    return out


def any_error(api_key: int, body) -> bool:
    """Whether a Produce or Fetch answer carries a partition error (a cheap first look: most
    answers carry none, and then a client in no failover has nothing to follow)."""
    fields = body.__dict__
    partitions_field = "partition_responses" if api_key == PRODUCE_KEY else "partitions"
    for topic in fields.get("responses") or ():
        for part in topic.__dict__.get(partitions_field) or ():
            if part.__dict__.get("error_code"):
                return True
    return False


# ---------------------------------------------------------------- one client's failovers

class _Pending:
    __slots__ = ("api", "old_leader", "first_failure", "failed", "errors", "hint_leader",
                 "hint_epoch", "metadata", "metadata_first")

    def __init__(self, api: str, node_id: int | None, sent: float):
        self.api = api
        self.old_leader = node_id
        self.first_failure = sent
        self.failed = 0
        self.errors: dict[str, int] = {}
        self.hint_leader: int | None = None
        self.hint_epoch: int | None = None
        self.metadata = 0
        self.metadata_first: float | None = None     # answer time of the first Metadata since


class FailoverTracker:
    """Failovers of the clients it is fed, answer by answer in time order (per client).

    ``answer()`` takes a Produce or Fetch answer of one client from one node and returns
    the failovers it ended; ``metadata()`` notes a Metadata answer the client got.
    """

    def __init__(self):
        self._pending: dict[tuple[ClientKey, str, int], _Pending] = {}
        self._by_client: dict[ClientKey, set[tuple[str, int]]] = {}

    @property
    def pending(self) -> int:
        """Partitions some client is failing on now."""
        return len(self._pending)

    def failing(self, client: ClientKey) -> bool:
        """Whether some partition of this client is in a failover now."""
        return client in self._by_client

    def metadata(self, client: ClientKey, answered: float) -> None:
        for tp in self._by_client.get(client, ()):
            pending = self._pending[(client, *tp)]
            pending.metadata += 1
            if pending.metadata_first is None:
                pending.metadata_first = answered

    def answer(self, client: ClientKey, api: str, node_id: int | None, sent: float, answered: float,
               partitions: Iterable[PartitionAnswer]) -> list[Failover]:
        ended: list[Failover] = []
        pending_tps = self._by_client.get(client)
        for part in partitions:
            key = (client, part.topic, part.partition)
            pending = self._pending.get(key) if pending_tps else None
            if part.error in LEADER_ERRORS:
                if pending is None:
                    if len(self._pending) >= MAX_PENDING:
                        self._forget_oldest()
                    pending = self._pending[key] = _Pending(api, node_id, sent)
                    pending_tps = self._by_client.setdefault(client, set())
                    pending_tps.add((part.topic, part.partition))
                if pending.hint_leader is None and part.leader_id is not None:
                    pending.hint_leader, pending.hint_epoch = part.leader_id, part.leader_epoch
            if pending is None:
                continue
            if part.error != NO_ERROR:
                pending.failed += 1
                pending.errors[part.error] = pending.errors.get(part.error, 0) + 1
                continue
            ended.append(self._end(key, pending, node_id, sent, answered))
        return ended

    def _end(self, key, pending: _Pending, node_id: int | None, sent: float, answered: float) -> Failover:
        client, topic, partition = key
        del self._pending[key]
        tps = self._by_client[client]
        tps.discard((topic, partition))
        if not tps:
            del self._by_client[client]
        if pending.metadata_first is not None and pending.metadata_first <= sent:
            how = RECOVERED_BY_METADATA
        elif pending.hint_leader is not None and pending.hint_leader == node_id:
            how = RECOVERED_BY_HINT
        else:
            how = RECOVERED_BY_RETRY
        errors = tuple(sorted(pending.errors.items(), key=lambda e: (-e[1], e[0])))
        return Failover(client, topic, partition, pending.api, pending.old_leader, node_id,
                        pending.first_failure, answered, pending.failed, errors,
                        pending.hint_leader, pending.hint_epoch, pending.metadata, how)

    def _forget_oldest(self) -> None:
        key = next(iter(self._pending))
        del self._pending[key]
        client, topic, partition = key
        tps = self._by_client.get(client)
        if tps is not None:
            tps.discard((topic, partition))
            if not tps:
                del self._by_client[client]


class LeaderChange(NamedTuple):
    """A partition's leader as a newer epoch names it (Metadata, or a KIP-951 hint)."""
    topic: str
    partition: int
    old_leader: int | None
    new_leader: int
    epoch: int | None
    time: float
    source: str                      # "metadata" or "hint"


class LeaderBook:
    """The cluster's partition leaders as answers name them; ``learn`` returns the changes
    (a leader named with an epoch newer than the one known, or without epochs a different one)."""

    def __init__(self):
        self._leaders: dict[tuple[str, int], tuple[int, int | None]] = {}

    def learn(self, partitions: Iterable[PartitionAnswer], when: float, source: str) -> list[LeaderChange]:
        changes: list[LeaderChange] = []
        leaders = self._leaders
        for part in partitions:
            if part.leader_id is None:
                continue
            key = (part.topic, part.partition)
            known = leaders.get(key)
            if known is not None:
                old, epoch = known
                if part.leader_epoch is not None and epoch is not None:
                    if part.leader_epoch <= epoch:
                        continue
                elif part.leader_id == old:
                    continue
                if part.leader_id != old:
                    changes.append(LeaderChange(part.topic, part.partition, old, part.leader_id,
                                                part.leader_epoch, when, source))
            elif len(leaders) >= MAX_LEADERS:
                leaders.pop(next(iter(leaders)))
            leaders[key] = (part.leader_id, part.leader_epoch)
        return changes
