"""Work connections line up faster than it can be done, shared out a little per loop turn.

A client that pipelines thousands of tiny requests (and never reads the answers) makes
thousands of events for the observers. Each such connection used to get its own step of
up to 1 ms every turn of the event loop (ten of them: ~10 ms a turn, and up to 1,140
events in one turn counted in ``tests/proxy/test_fairness.py``), and an ordinary client
beside them waited several such turns per request (p99 231 ms on a quiet machine). Here
that work waits in one queue per event loop, served in turn, at most ``DEFERRED_EVENTS_PER_TURN`` events and ``DEFERRED_WORK_PER_TURN_S`` per
turn *for all such connections together*, so a turn costs the ordinary clients about the
same whether one connection pipelines or a hundred do. While a connection has work
waiting, the relay reads neither of its sockets (as Kafka mutes a connection while it
works on its request): what waits is bounded by one read of each side, and a connection
waits at most for the others' such work before its own begins.

Served first come, first done (not a step each in rotation): connections then finish
one at a time and are read again one at a time; a rotation would finish them all in
the same turn, and their next reads (~0.4 ms each) would come together.

When nothing else is ready the loop turns again at once, so deferred work still gets
nearly all of an otherwise idle process.

Used by ``relay`` alone; no sockets here.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import deque
from typing import Protocol

# Events handed to observers in one step of one connection, between looks at the clock: an
# ApiVersions answer costs the metrics ~0.15 ms, most events a few µs.
EVENTS_PER_STEP = 8
# Deferred events per loop turn, all connections together: on a quiet machine ~1 ms of
# requests' events, ~10 ms at worst of capped ApiVersions answers (which the time limit
# below cuts short). A count, not only a time, so the bound holds whatever the load.
DEFERRED_EVENTS_PER_TURN = 64
# ... and a turn's deferred work stops once it has taken this long (checked after each
# step). An ordinary request needs two to three turns (its read, the broker's answer): at
# 2 ms a turn, ten pipelining clients add ~5 ms to it, not 50.
DEFERRED_WORK_PER_TURN_S = 0.002


class Deferred(Protocol):
    def step(self, most: int) -> bool:
        """Do at most ``most`` events of work; True while more is left."""


class FairShare:
    """The loop's queue of connections with deferred work, served in order of arrival.

    ``defer(worker)`` once when a worker's work begins; the share calls its ``step`` until it
    says nothing is left (a closed connection just says so)."""

    def __init__(self):
        self._waiting: deque[Deferred] = deque()
        self._scheduled = False

    def __len__(self) -> int:
        return len(self._waiting)

    def defer(self, worker: Deferred) -> None:
        self._waiting.append(worker)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._turn)

    def _turn(self) -> None:
        waiting = self._waiting
        clock = time.perf_counter
        ends = clock() + DEFERRED_WORK_PER_TURN_S
        left = DEFERRED_EVENTS_PER_TURN
        while waiting and left:
            most = min(EVENTS_PER_STEP, left)
            left -= most
            if not waiting[0].step(most):
                waiting.popleft()
            if clock() > ends:
                break
        if waiting:
            asyncio.get_running_loop().call_soon(self._turn)
        else:
            self._scheduled = False


_shares: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # event loop -> its FairShare


def loop_fair_share() -> FairShare:
    """The event loop's share, common to all its listeners."""
    loop = asyncio.get_running_loop()
    share = _shares.get(loop)
    if share is None:
        share = _shares[loop] = FairShare()
    return share
