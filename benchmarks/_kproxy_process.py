#!/usr/bin/env python3
"""``kproxy run`` as the benchmarks launch it: its own process, optionally over a slow disk.

    python benchmarks/_kproxy_process.py [--slow-disk-ms N] [--without-live-view] run --config ...

``bench_proxy.kproxy_process`` runs it through ``tests/kproxy_process.py``'s
``KproxyProcess``, the one harness tests and benchmarks share.

``--slow-disk-ms`` makes every capture file write sleep first (the sleep releases
the GIL, like a write blocked in the kernel), so a capture writer cannot keep up
with the traffic: what is then measured is the relay's side of the bargain
(filter, enqueue, drop and count, never wait). Everything after the option is
passed to kproxy's own command line unchanged. ``BENCH_PROFILE_OUT`` in the environment:
a CPU profile of the process (``_cpu_profile.py``). ``--without-live-view`` takes the live
page's observer out of the relay's observer list: the "before" of its no-viewer cost.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def slow_down_capture_writes(delay_s: float) -> None:
    from kproxy.observers.capture.files import RotatingSink

    original = RotatingSink.before_write

    def slow_before_write(self, nbytes):
        time.sleep(delay_s)
        return original(self, nbytes)

    RotatingSink.before_write = slow_before_write


def without_live_view() -> None:
    from kproxy import runtime

    original = runtime.Runtime.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.proxy.observers.remove(self.live)

    runtime.Runtime.__init__ = init


def main(argv: list[str]) -> int:
    if argv[:1] == ["--slow-disk-ms"]:
        slow_down_capture_writes(float(argv[1]) / 1000)
        argv = argv[2:]
    if argv[:1] == ["--without-live-view"]:
        without_live_view()
        argv = argv[1:]
    from benchmarks import _cpu_profile
    _cpu_profile.start_if_asked()
    from kproxy.cli import main as kproxy_main
    return kproxy_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
