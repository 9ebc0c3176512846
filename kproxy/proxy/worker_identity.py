"""Which worker this process is (``kproxy run --workers``), and the ids it hands out.

Workers share the listening ports; captures and the supervisor's live page merge what
they all saw. So ids (a connection's, a live pair's) must be unique across the workers,
and the supervisor must find the worker that handed one out: worker ``index`` of
``workers`` hands out index+1, index+1+workers, ... (alone: 1, 2, 3, ...).
"""

from __future__ import annotations

import itertools
from typing import Iterator

# Set once, by ``run_as_worker``, before the event loop starts.
_worker_processes = 1
_worker_index = 0
# The ids of this process's connections (``ConnectionInfo.id``); replaced by ``run_as_worker``.
connection_ids: Iterator[int] = itertools.count(1)


def run_as_worker(index: int, workers: int) -> None:
    """This process is worker ``index`` of ``workers`` behind the same ports: its connection
    ids come from ``worker_ids()`` (unique across the workers, so captures merged from all
    of them keep connections apart)."""
    global connection_ids, _worker_processes, _worker_index
    _worker_processes, _worker_index = workers, index
    connection_ids = worker_ids()


def worker_ids() -> Iterator[int]:
    """Ids this process hands out (connections, the live page's pairs): 1, 2, 3, ... alone;
    index+1, index+1+workers, ... as worker ``index``, so ``id_owner`` finds the worker."""
    return itertools.count(_worker_index + 1, _worker_processes)


def id_owner(some_id: int, workers: int) -> int:
    """The index of the worker that handed out ``some_id`` (see ``worker_ids``)."""
    return (some_id - 1) % workers
