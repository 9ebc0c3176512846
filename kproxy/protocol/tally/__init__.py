"""Tallies: what the per-pair observers count of a Produce or Fetch pair, read straight from its frame.

Every Produce and Fetch pair passes the metrics (records and bytes per partition, the
answer's error codes and throttle time; for Fetch the consumer's positions and the
partition ends, for the lag), the failover observer (did a partition fail?) and, for
answers, the address check (does it name KIP-951 node endpoints?). The partial decode
(``skim``) gives them that, but builds a struct per topic and partition and a request
object on the way: about half of the metrics' time per pair. A tally reads the same
numbers in one pass over the frame and makes only the values handed on
(``ProduceTally``, ``ProduceAnswerTally``, ``FetchTally``, ``FetchAnswerTally``).

Common case only. A frame with anything unusual gets no tally (None) and its readers
fall back to the partial decode: a tagged field anywhere (the leader hints and node
endpoints that come after a leader moved, a follower's replica state, unknown tags), a
version past the newest layout written here, anything the strict reader would refuse.
So a tally exists only for a frame the strict reader accepts, and holds what it would
read (``tests/protocol/test_tally.py`` checks both on generated and mutated frames of
every version). The version thresholds are read from the schema's rows. One module per
API (``produce``, ``fetch``), their shared readers in ``_common``.
"""

from __future__ import annotations

from ._common import I16, MALFORMED
from .fetch import (FETCH, FIRST_VERSION as FETCH_FIRST_VERSION, NEWEST_LAYOUT as FETCH_NEWEST_LAYOUT,
                    FetchAnswerTally, FetchedPartition, FetchedTopic, FetchTally,
                    read_answer as _fetch_answer, read_request as _fetch_request)
from .produce import (PRODUCE, FIRST_VERSION as PRODUCE_FIRST_VERSION, NEWEST_LAYOUT as PRODUCE_NEWEST_LAYOUT,
                      ProduceAnswerTally, ProduceTally, TopicRecords,
                      read_answer as _produce_answer, read_request as _produce_request)

__all__ = ["TALLIED", "tally_request", "tally_response", "ProduceTally", "ProduceAnswerTally", "TopicRecords",
           "FetchTally", "FetchAnswerTally", "FetchedTopic", "FetchedPartition", "PRODUCE", "FETCH",
           "PRODUCE_NEWEST_LAYOUT", "FETCH_NEWEST_LAYOUT"]

TALLIED = frozenset({PRODUCE, FETCH})              # the API keys with tallies


def tally_request(frame) -> ProduceTally | FetchTally | None:
    """The tally of a Produce or Fetch request frame (after its size prefix), or None (see the module)."""
    try:
        return _produce_request(frame) if I16(frame, 0)[0] == PRODUCE else _fetch_request(frame)
    except MALFORMED:
        return None


def tally_response(frame, api_key: int, api_version: int) -> ProduceAnswerTally | FetchAnswerTally | None:
    """The tally of an answer to a Produce or Fetch request of ``api_version``, or None (see the module)."""
    try:
        if api_key == PRODUCE:
            return _produce_answer(frame, api_version) \
                if PRODUCE_FIRST_VERSION <= api_version <= PRODUCE_NEWEST_LAYOUT else None
        if api_key == FETCH:
            return _fetch_answer(frame, api_version) \
                if FETCH_FIRST_VERSION <= api_version <= FETCH_NEWEST_LAYOUT else None
        return None
    except MALFORMED:
        return None
