"""Which requests the audit trail records, and how an answer's outcome is named (no I/O).

Shared by the live audit (``observers.audit``) and ``kproxy analyze``'s ``audit``
table (``pipeline.audit``), which recomputes the trail from capture rows.

``AUDITED_APIS``: the requests a client sends to change cluster state (the admin
APIs that create, delete or alter something). ``OffsetCommit`` is audited only
when it comes from outside the group (``is_outside_commit``): generation -1 and
no member id, what ``kafka-consumer-groups --reset-offsets --execute`` (the admin
client's alterConsumerGroupOffsets) sends; a member's own commits are not.
Broker-to-broker and controller APIs (LeaderAndIsr, AlterPartition, Envelope, the
share-group state RPCs, ...) are left out: clients do not send them through a proxy.
"""

from __future__ import annotations

from .schema import API_KEYS

# Client APIs that change cluster state (names as in Kafka's message definitions).
AUDITED_API_NAMES = (
    "CreateTopics", "DeleteTopics", "CreatePartitions", "DeleteRecords",
    "AlterConfigs", "IncrementalAlterConfigs",
    "CreateAcls", "DeleteAcls",
    "OffsetDelete", "DeleteGroups", "AlterShareGroupOffsets", "DeleteShareGroupOffsets",
    "AlterPartitionReassignments", "AlterReplicaLogDirs", "ElectLeaders",
    "AlterClientQuotas", "AlterUserScramCredentials",
    "CreateDelegationToken", "RenewDelegationToken", "ExpireDelegationToken",
    "UpdateFeatures", "UnregisterBroker", "AddRaftVoter", "RemoveRaftVoter",
)
OFFSET_COMMIT_NAME = "OffsetCommit"
OFFSET_COMMIT_KEY = API_KEYS[OFFSET_COMMIT_NAME]
AUDITED_APIS = frozenset(API_KEYS[name] for name in AUDITED_API_NAMES if name in API_KEYS)
# What the observer looks at on the event loop (everything else passes with one set lookup).
WATCHED_APIS = AUDITED_APIS | {OFFSET_COMMIT_KEY}

# Kafka's "no generation" (OffsetCommit generation_id_or_member_epoch) of a commit
# made outside the group's membership.
NO_GENERATION = -1

OUTCOME_OK, OUTCOME_ERROR, OUTCOME_PARTIAL = "ok", "error", "partial"
# The connection closed before the broker answered: the change may or may not have happened.
OUTCOME_UNANSWERED = "unanswered"
OUTCOMES = (OUTCOME_OK, OUTCOME_ERROR, OUTCOME_PARTIAL, OUTCOME_UNANSWERED)


def is_outside_commit(body) -> bool:
    """An OffsetCommit from a client that is not a member of the group (an offset reset,
    or a consumer using assign() with a group id): no generation and no member id."""
    fields = body.__dict__
    return (fields.get("generation_id_or_member_epoch", NO_GENERATION) < 0
            and not fields.get("member_id"))


def outcome_of(failed: int, answered: int) -> str:
    """ok (no resource failed), error (every one), partial (some): ``failed`` of ``answered``
    per-resource answers carried an error."""
    if failed == 0:
        return OUTCOME_OK
    return OUTCOME_ERROR if failed >= answered else OUTCOME_PARTIAL
