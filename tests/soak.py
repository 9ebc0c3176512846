"""Soak runs: the tests marked ``soak`` run only when asked, each for about the time given.

    .venv/bin/python -m pytest -m soak --soak-seconds 600       # each soak test: ~10 minutes

Without ``--soak-seconds`` they are deselected (the default suite stays short). The
property tests' soak versions run their property batch after batch (each batch new random
examples), the live ones keep clients, hostile peers and scrapes going for that long and
then check what kproxy kept: memory, file descriptors, its log.
"""

from __future__ import annotations

import time
from collections.abc import Callable

SOAK_OPTION = "--soak-seconds"
# A soak test's own timeout: its time, plus this for brokers to start and the checks after.
SOAK_TIMEOUT_MARGIN_S = 600


def run_for(seconds: float, property_test: Callable[[], None]) -> int:
    """Call a hypothesis test (each call: its ``max_examples`` new examples) until ``seconds``
    are spent, at least once; the number of calls. A failure raises at once, with the
    falsifying example, as in the default suite."""
    deadline = time.monotonic() + seconds
    batches = 0
    while batches == 0 or time.monotonic() < deadline:
        property_test()
        batches += 1
    return batches
