"""Which responses carry broker addresses, and rewriting them.

A client must never learn an upstream broker address, or its next
connection bypasses the proxy. The table below lists every response whose
schema holds a node's host and port (found by scanning the generated schema
for host/port fields; ``tests/proxy/test_rewrite.py`` re-checks that scan so a new
Kafka release cannot add one silently). Streams' application ``Endpoint``
and ACL ``host`` fields are not broker addresses and stay untouched.

Nor may a client learn a kproxy address nobody listens on: ``withhold_nodes``
takes the brokers whose listener kproxy cannot bind out of the same responses.

Pure functions over decoded bodies: no I/O, so the rules are tested without sockets.
"""

from __future__ import annotations

from typing import Callable, Collection, Iterator

from ..protocol import Response, Struct, schema
from ..protocol.api_keys import ApiKey

# (node_id, upstream host, upstream port) -> (host, port) to advertise, or None to keep.
AddressMapper = Callable[[int, str, int], "tuple[str, int] | None"]

NodeAddress = tuple[int, Struct]      # node id, and the struct holding its host/port


def _brokers(body: Struct, version: int) -> Iterator[NodeAddress]:
    for broker in body.brokers:
        yield broker.node_id, broker


def _find_coordinator(body: Struct, version: int) -> Iterator[NodeAddress]:
    if version < 4:
        if body.node_id >= 0:                      # -1 with an error code: nothing to rewrite
            yield body.node_id, body
        return
    for coordinator in body.coordinators:
        if coordinator.node_id >= 0:
            yield coordinator.node_id, coordinator


def _describe_cluster(body: Struct, version: int) -> Iterator[NodeAddress]:
    for broker in body.brokers:
        yield broker.broker_id, broker


def _node_endpoints(body: Struct, version: int) -> Iterator[NodeAddress]:
    for endpoint in body.node_endpoints or ():
        yield endpoint.node_id, endpoint


def _describe_quorum(body: Struct, version: int) -> Iterator[NodeAddress]:
    for node in body.nodes or ():
        for listener in node.listeners:
            yield node.node_id, listener


def _raft_leader(body: Struct, version: int) -> Iterator[NodeAddress]:
    leader = body.current_leader
    if leader is not None and leader.leader_id >= 0 and leader.host:
        yield leader.leader_id, leader


# api key -> (first version with addresses, walker)
ADDRESS_BEARING: dict[int, tuple[int, Callable[[Struct, int], Iterator[NodeAddress]]]] = {
    0: (10, _node_endpoints),      # Produce: KIP-951 tagged NodeEndpoints
    1: (16, _node_endpoints),      # Fetch: KIP-951 tagged NodeEndpoints
    3: (0, _brokers),              # Metadata
    10: (0, _find_coordinator),    # FindCoordinator: top-level (v0-3) or batched (v4+)
    52: (1, _node_endpoints),      # Vote (KRaft)
    53: (1, _node_endpoints),      # BeginQuorumEpoch (KRaft)
    54: (1, _node_endpoints),      # EndQuorumEpoch (KRaft)
    55: (2, _describe_quorum),     # DescribeQuorum: per-node listeners
    59: (1, _node_endpoints),      # FetchSnapshot (KRaft)
    60: (0, _describe_cluster),    # DescribeCluster (brokers, or controllers for endpoint type 2)
    78: (0, _node_endpoints),      # ShareFetch
    79: (0, _node_endpoints),      # ShareAcknowledge
    82: (0, _raft_leader),         # UpdateRaftVoter: current leader
}

# Answers whose only addresses are KIP-951 node endpoints, which brokers add only after a
# partition's leader moved: Produce and Fetch, at line rate. Their partial decode
# (``ResponseReceived.partial``) keeps the endpoints, so it tells whether there is anything
# to rewrite before the answer is decoded whole.
ENDPOINTS_ONLY_KEYS = frozenset({ApiKey.PRODUCE, ApiKey.FETCH})


def carries_addresses(api_key: int, api_version: int) -> bool:
    """Whether a response to this request may hold broker addresses (so must be decoded first)."""
    entry = ADDRESS_BEARING.get(api_key)
    return entry is not None and api_version >= entry[0]


def node_addresses(api_key: int, api_version: int, body: Struct) -> list[tuple[int, str, int]]:
    """Every (node_id, host, port) a decoded response body hands to the client."""
    entry = ADDRESS_BEARING.get(api_key)
    if entry is None or api_version < entry[0]:
        return []
    return [(node_id, s.host, s.port) for node_id, s in entry[1](body, api_version)]


def rewrite_addresses(api_key: int, api_version: int, response: Response,
                      mapper: AddressMapper) -> bool:
    """Replace node addresses in a decoded response in place; True if anything changed."""
    entry = ADDRESS_BEARING.get(api_key)
    if entry is None or api_version < entry[0] or response.is_opaque:
        return False
    changed = False
    for node_id, holder in entry[1](response.body, api_version):
        new = mapper(node_id, holder.host, holder.port)
        if new is not None and (holder.host, holder.port) != new:
            holder.host, holder.port = new
            changed = True
    return changed


NO_NODE = -1                      # Kafka's "no node" id (and port) in leader and coordinator fields
LEADER_NOT_AVAILABLE = 5          # retriable: clients refresh metadata and try again
COORDINATOR_NOT_AVAILABLE = 15    # retriable: clients ask FindCoordinator again


def _drop_brokers(body: Struct, unserved: Collection[int], id_field: str) -> bool:
    kept = [b for b in body.brokers if getattr(b, id_field) not in unserved]
    changed = len(kept) != len(body.brokers)
    body.brokers = kept
    # In KRaft the controller id clients see is any broker (requests to it are forwarded).
    if getattr(body, "controller_id", NO_NODE) in unserved:     # Metadata v1+, DescribeCluster
        body.controller_id = min((getattr(b, id_field) for b in kept), default=NO_NODE)
        changed = True
    return changed


def _withhold_metadata(body: Struct, version: int, unserved: Collection[int]) -> bool:
    """Metadata: drop the brokers; partitions they lead have no leader (LEADER_NOT_AVAILABLE)."""
    changed = _drop_brokers(body, unserved, "node_id")
    for topic in body.topics or ():
        for partition in topic.partitions or ():
            if partition.leader_id in unserved:
                partition.leader_id = NO_NODE
                if partition.error_code == 0:
                    partition.error_code = LEADER_NOT_AVAILABLE
                changed = True
    return changed


def _withhold_describe_cluster(body: Struct, version: int, unserved: Collection[int]) -> bool:
    return _drop_brokers(body, unserved, "broker_id")


def _withhold_coordinator(body: Struct, version: int, unserved: Collection[int]) -> bool:
    """FindCoordinator: an unserved coordinator becomes COORDINATOR_NOT_AVAILABLE."""
    holders = [body] if version < 4 else body.coordinators
    changed = False
    for holder in holders:
        if holder.node_id in unserved:
            holder.node_id, holder.host, holder.port = NO_NODE, "", NO_NODE
            holder.error_code = COORDINATOR_NOT_AVAILABLE
            if hasattr(holder, "error_message"):               # v1+
                holder.error_message = "kproxy is not yet listening for this coordinator"
            changed = True
    return changed


def _withhold_endpoints(body: Struct, version: int, unserved: Collection[int]) -> bool:
    """KIP-951 leader hints: drop the endpoints; a hint naming such a node becomes "no hint"."""
    endpoints = body.node_endpoints or ()
    kept = [e for e in endpoints if e.node_id not in unserved]
    changed = len(kept) != len(endpoints)
    if changed:
        body.node_endpoints = kept
    for topic in body.responses or ():
        partitions = getattr(topic, "partition_responses", None) or getattr(topic, "partitions", None)
        for partition in partitions or ():
            leader = getattr(partition, "current_leader", None)
            if leader is not None and leader.leader_id in unserved:
                leader.leader_id, leader.leader_epoch = NO_NODE, NO_NODE
                changed = True
    return changed


# api key -> how to take unserved nodes out of its response (broker addresses only:
# the KRaft quorum APIs carry controller addresses, for which kproxy opens no listener)
WITHHOLDERS: dict[int, Callable[[Struct, int, Collection[int]], bool]] = {
    0: _withhold_endpoints, 1: _withhold_endpoints, 3: _withhold_metadata,
    10: _withhold_coordinator, 60: _withhold_describe_cluster, 78: _withhold_endpoints,
    79: _withhold_endpoints,
}


def withhold_nodes(api_key: int, api_version: int, response: Response,
                   unserved: Collection[int]) -> bool:
    """Take nodes kproxy cannot serve out of a decoded response, in place; True if changed.

    A client handed an address nobody listens on fails on it until its next metadata
    refresh, and again after it. What is left instead is what Kafka itself answers
    while a leader or coordinator moves (no leader, COORDINATOR_NOT_AVAILABLE, no
    hint), which every client retries; the brokers kproxy does serve keep working.
    """
    withhold = WITHHOLDERS.get(api_key)
    if withhold is None or not unserved or response.is_opaque \
            or api_version < ADDRESS_BEARING[api_key][0]:
        return False
    return withhold(response.body, api_version, unserved)


def cap_api_versions(response: Response, drop_unknown: bool = True) -> bool:
    """Limit an ApiVersions response to the versions kproxy can decode; True if changed.

    A client and broker that are both newer than kproxy would otherwise agree
    on a version whose addresses kproxy cannot rewrite. API keys kproxy does
    not know at all are removed (``drop_unknown``) for the same reason.
    """
    if response.is_opaque or not hasattr(response.body, "api_keys"):
        return False
    kept = []
    changed = False
    for entry in response.body.api_keys:
        known = schema.version_range(entry.api_key)
        if known is None:
            if drop_unknown:
                changed = True
                continue
        elif entry.max_version > known[1] or entry.min_version < known[0]:
            lo, hi = max(entry.min_version, known[0]), min(entry.max_version, known[1])
            if lo > hi:                                # no overlap: the API is unusable through kproxy
                changed = True
                continue
            entry.min_version, entry.max_version = lo, hi
            changed = True
        kept.append(entry)
    if changed:
        response.body.api_keys = kept
    return changed
