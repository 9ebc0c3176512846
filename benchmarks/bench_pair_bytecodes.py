#!/usr/bin/env python3
"""Python bytecodes one Produce v10 pair costs in ``Relay.received`` (both sides), counted.

Deterministic where wall clock on a shared machine is not: fake transports, no sockets,
no observers unless asked, a tracer counting opcodes over 20 pairs after 50 to warm up.
The frames are ``bench_pair_latency.py``'s recording.

    python benchmarks/bench_pair_bytecodes.py                          # this tree
    python benchmarks/bench_pair_bytecodes.py --tree /path/to/other/tree
    python benchmarks/bench_pair_bytecodes.py --policy FILE [--observe] [--telemetry-offer]

``--policy``: with that rules file's refusals (if a rule enforces: every Produce is judged
before it is forwarded); ``--observe``: its dry-run observer as the only observer instead;
``--telemetry-offer``: kproxy offering client telemetry (to a broker that does not).
"""

from __future__ import annotations

import argparse
import gzip
import pickle
import struct
import sys
from pathlib import Path

FRAMES = Path(__file__).resolve().parent / "data" / "pair_frames.pkl.gz"
HERE = Path(__file__).resolve().parent.parent
WARM_UP, COUNTED = 50, 20
SIZE = struct.Struct(">i")


class _Transport:
    def write(self, data): pass
    def writelines(self, data): pass
    def pause_reading(self): pass
    def resume_reading(self): pass
    def is_closing(self): return False
    def get_write_buffer_size(self): return 0
    def get_extra_info(self, *args): return None
    def set_write_buffer_limits(self, high=None, low=None): pass
    def close(self): pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", default=str(HERE))
    parser.add_argument("--policy", metavar="FILE")
    parser.add_argument("--observe", action="store_true")
    parser.add_argument("--telemetry-offer", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, args.tree)
    from kproxy.protocol.connection import Connection
    from kproxy.proxy.relay import BufferBudget, ConnectionInfo, Endpoint, ReadArena, Relay

    request, answer = pickle.loads(gzip.decompress(FRAMES.read_bytes()))["produce"]
    request, answer = SIZE.pack(len(request)) + request, SIZE.pack(len(answer)) + answer
    arena = ReadArena()
    relay = Relay()
    client, broker = Endpoint(arena, "client"), Endpoint(arena, "broker")
    client.transport, broker.transport = _Transport(), _Transport()
    relay.client, relay.broker = client, broker
    relay.info = ConnectionInfo(1, ("127.0.0.1", 1), "broker-1", ("127.0.0.1", 2), 1)
    relay.budget = BufferBudget(1 << 30)
    relay.tracker = Connection()
    answerers = []                       # requests kproxy answers itself (local_requests)
    if args.policy:
        from kproxy.policy import load_policy
        policy = load_policy(args.policy)
        if args.observe:
            from kproxy.observers.policy import PolicyObserver
            relay.observers = [PolicyObserver(policy, 100)]
        elif policy.enforcing:
            from kproxy.proxy.policy_answers import PolicyAnswers
            answerers.append(PolicyAnswers(policy, {}))
    if args.telemetry_offer:
        from kproxy.proxy.telemetry_offer import TelemetryAnswers, TelemetryOffer
        offer = TelemetryAnswers(TelemetryOffer(enabled=True))
        offer.broker_offers = False      # as after a broker's ApiVersions answer without 71/72
        answerers.append(offer)
    if answerers:
        from kproxy.proxy.local_requests import ClientSplit
        relay.split = ClientSplit(answerers, relay.info)
    client.relay = broker.relay = relay

    def pair(correlation_id: int) -> None:
        ask, reply = bytearray(request), bytearray(answer)
        struct.pack_into(">i", ask, 8, correlation_id)
        struct.pack_into(">i", reply, 4, correlation_id)
        relay.received(client, memoryview(ask))
        relay.received(broker, memoryview(reply))

    for i in range(WARM_UP):
        pair(i)
    assert relay.close_reason is None, relay.close_reason
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        frame.f_trace_opcodes = True
        if event == "opcode":
            count += 1
        return tracer

    sys.settrace(tracer)
    for i in range(WARM_UP, WARM_UP + COUNTED):
        pair(i)
    sys.settrace(None)
    print(f"{count / COUNTED:.0f} bytecodes per Produce v10 pair")
    return 0


if __name__ == "__main__":
    sys.exit(main())
