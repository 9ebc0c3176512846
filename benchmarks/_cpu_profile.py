"""A CPU profile of a benchmark's kproxy process: where its own CPU goes under a real load.

``_kproxy_process.py`` starts it when ``BENCH_PROFILE_OUT`` names a file (an environment
variable, so that ``bench_peers.py`` and ``bench_proxy.py`` runs need no new option: their
kproxy processes inherit it). At exit the process writes ``<file>.<pid>`` (``pstats``) and
``<file>.<pid>.gc.json`` (the garbage collector's runs and pauses, per generation).

cProfile is timed by the main thread's CPU clock, not the wall clock: on a loaded machine a
wall-clock profile charges the time the process waited for a core to whatever function was
running (a socket write that woke the broker, mostly), and points at the wrong code. The
calls' counts are exact; their times are inflated by the profiler itself (~1 us a call), so
compare functions within one profile, and the process's CPU without the profile.

    BENCH_PROFILE_OUT=/tmp/fleet.prof python benchmarks/bench_peers.py --scenarios fleet ...
    python -m pstats /tmp/fleet.prof.<pid>
"""

from __future__ import annotations

import atexit
import cProfile
import gc
import json
import os
import time

ENV = "BENCH_PROFILE_OUT"


def start_if_asked() -> None:
    out = os.environ.get(ENV)
    if not out:
        return
    out = f"{out}.{os.getpid()}"
    profile = cProfile.Profile(time.thread_time)
    pauses = _GcPauses()
    gc.callbacks.append(pauses)

    def dump() -> None:
        profile.disable()
        profile.dump_stats(out)
        with open(out + ".gc.json", "w") as f:
            json.dump(pauses.summary(), f, indent=1)

    atexit.register(dump)
    profile.enable()


class _GcPauses:
    """Collections and their pause per generation (a gc callback: called at start and stop)."""

    def __init__(self):
        self.started = 0.0
        self.runs = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.longest = [0.0, 0.0, 0.0]

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.started = time.perf_counter()
            return
        generation, took = info["generation"], time.perf_counter() - self.started
        self.runs[generation] += 1
        self.seconds[generation] += took
        self.longest[generation] = max(self.longest[generation], took)

    def summary(self) -> dict:
        return {"runs": self.runs, "seconds": self.seconds, "longest_s": self.longest,
                "thresholds": gc.get_threshold(), "tracked_objects": len(gc.get_objects())}
