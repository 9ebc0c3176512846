"""Answers written towards clients that have not taken them yet, counted across connections.

A client that sends requests and never reads leaves its answers in kproxy's transport write
buffer: up to ``WRITE_HIGH_WATER`` (then kproxy stops reading the broker for it) plus the
read that crossed it, about 2 MiB a connection; a thousand such clients, 2 GiB, outside what
``BufferBudget`` bounds (frames being assembled). This ledger puts them inside: the relay
tells it each client's unsent bytes after it writes; while frames held plus answers unsent
pass the budget's limit, every connection with answers unsent is *squeezed* (its client
transport paused until it has sent everything, which stops kproxy reading its broker), so
the total can pass the limit by at most the reads in progress. A client that reads gets its
answers and is read for again at once; one that never reads stays paused and costs what it
holds, no more.

Pure bookkeeping (no sockets): ``relay.py`` does the pausing.
"""

from __future__ import annotations


class UnsentAnswers:
    """Unsent answer bytes per client endpoint, as last seen (an over-estimate between looks:
    a buffer drains without telling), and which endpoints are squeezed."""

    def __init__(self):
        self.total = 0
        self._of: dict[object, int] = {}
        self.squeezed: set = set()
        self._loose: set = set()                 # holding some, not squeezed (what a squeeze visits)

    def note(self, endpoint, unsent: int) -> None:
        before = self._of.pop(endpoint, 0)
        self.total += unsent - before
        if unsent:
            self._of[endpoint] = unsent
            if endpoint not in self.squeezed:
                self._loose.add(endpoint)
        else:
            self._loose.discard(endpoint)

    def squeeze(self, endpoint) -> None:
        self.squeezed.add(endpoint)
        self._loose.discard(endpoint)

    def drained(self, endpoint) -> None:
        """Its client took everything (or the connection is gone): nothing counted, not squeezed."""
        self.note(endpoint, 0)
        self.squeezed.discard(endpoint)

    def holders(self) -> list:
        """Endpoints with answers unsent that are not squeezed yet."""
        return list(self._loose)

    def __len__(self) -> int:
        return len(self._of)
