"""Ports picked ahead (for listeners that must be told their port before they bind) can
collide with no port the OS picks and never repeat within a run.

The old way (bind port 0, read the port, close, hand it on) handed out ports from the
kernel's ephemeral range, which the kernel gives to the next port-0 bind of any process:
a test run saw kproxy's OS-chosen listener take the port just picked for a broker
listener. These tests fail for that way in principle: its ports lie inside the range.
"""

from __future__ import annotations

import contextlib
import socket

import pytest

from kproxy.embedded._support import (
    FIRST_PICKED_PORT,
    MAX_PORT,
    EmbeddedBrokerError,
    PortAllocator,
    ephemeral_port_range,
    free_ports,
)

# Enough picks to cover every suite's use many times over (a run uses a few hundred).
MANY = 2000
# Port-0 binds held open at once while checking they avoid what was picked ahead.
OS_CHOSEN = 200


def _in_ephemeral(port: int, ephemeral: tuple[int, int]) -> bool:
    return ephemeral[0] <= port <= ephemeral[1]


def test_picked_ports_are_outside_the_ephemeral_range_and_never_repeat():
    ephemeral = ephemeral_port_range()
    picked = [port for _ in range(MANY // 4) for port in free_ports(4)]
    assert not [p for p in picked if _in_ephemeral(p, ephemeral)]
    assert len(set(picked)) == len(picked)
    assert all(FIRST_PICKED_PORT <= p <= MAX_PORT for p in picked)


def test_no_os_chosen_port_lands_on_a_picked_port():
    picked = set(free_ports(50))
    with contextlib.ExitStack() as stack:
        chosen = []
        for _ in range(OS_CHOSEN):
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            chosen.append(sock.getsockname()[1])
    assert not picked.intersection(chosen)


def test_the_range_comes_from_the_kernel():
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = map(int, f.read().split())
    assert ephemeral_port_range() == (low, high)


def test_ranges_skip_the_ephemeral_range_given():
    allocator = PortAllocator(ephemeral=(20000, 50000), pid=1)
    assert allocator.ranges == [range(FIRST_PICKED_PORT, 20000), range(50001, MAX_PORT + 1)]
    picked = allocator.take(300)
    assert not [p for p in picked if 20000 <= p <= 50000]


def test_consecutive_ports_are_a_run():
    first, *rest = free_ports(4, consecutive=True)
    assert rest == [first + 1, first + 2, first + 3]


def test_neighbouring_pids_start_far_apart():
    """Parallel runs on one machine (pids a few apart) walk different stretches."""
    a, b = (PortAllocator(ephemeral=(32768, 60999), pid=pid).take(1)[0] for pid in (4000, 4001))
    assert abs(a - b) > 1000


def test_a_port_in_use_is_skipped_and_none_is_handed_out_twice():
    """Only 65534 and 65535 lie outside this range: one taken by a listener here."""
    listener = socket.socket()
    try:
        listener.bind(("127.0.0.1", MAX_PORT - 1))
    except OSError:
        pytest.skip(f"port {MAX_PORT - 1} is in use on this machine")
    with listener:
        listener.listen()
        allocator = PortAllocator(ephemeral=(FIRST_PICKED_PORT, MAX_PORT - 2), pid=0)
        assert allocator.take(1) == [MAX_PORT]
        with pytest.raises(EmbeddedBrokerError):
            allocator.take(1)
