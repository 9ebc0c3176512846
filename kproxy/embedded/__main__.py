"""Command line for the embedded brokers: pre-fetch Kafka jars, or run a broker until Ctrl-C.

``fetch`` exists for setup scripts and CI, so the first test run does not spend its time
budget downloading; ``kafka`` and ``tansu`` give a developer (or the README demo) a broker
to point a proxy at without any other installation.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from kproxy.embedded._support import EmbeddedBrokerError
from kproxy.embedded.kafka import KAFKA_3_VERSION, KAFKA_4_VERSION, KafkaCluster, fetch_kafka
from kproxy.embedded.tansu import TansuBroker


def _wait_for_signal() -> None:
    """Block until SIGINT or SIGTERM, so either stops the brokers cleanly."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    stop.wait()


def _fetch(args: argparse.Namespace) -> int:
    for version in args.version or [KAFKA_4_VERSION, KAFKA_3_VERSION]:
        started = time.monotonic()
        home = fetch_kafka(version, args.cache_dir)
        print(f"Kafka {version}: {home} ({time.monotonic() - started:.1f} s)", flush=True)
    return 0


def _kafka(args: argparse.Namespace) -> int:
    with KafkaCluster(args.brokers, version=args.version, workdir=args.workdir, cache_dir=args.cache_dir) as cluster:
        print(f"Kafka {cluster.version}, {args.brokers} node(s), workdir {cluster.workdir}")
        for node in cluster.nodes:
            print(f"  node {node.node_id}: {node.host}:{node.port}  log {cluster.log_path(node.node_id)}")
        print(f"bootstrap servers: {cluster.bootstrap_servers}", flush=True)
        print("Ctrl-C to stop", flush=True)
        _wait_for_signal()
    return 0


def _tansu(args: argparse.Namespace) -> int:
    with TansuBroker(port=args.port) as broker:
        print(f"Tansu, log {broker.log_path}")
        print(f"bootstrap servers: {broker.bootstrap_servers}", flush=True)
        print("Ctrl-C to stop", flush=True)
        _wait_for_signal()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kproxy.embedded", description=__doc__)
    parser.add_argument("--cache-dir", type=Path, help="jar cache (default: $KPROXY_CACHE_DIR or ~/.cache/kproxy)")
    commands = parser.add_subparsers(dest="command", required=True)

    fetch = commands.add_parser("fetch", help="download Kafka jars from Maven Central")
    fetch.add_argument(
        "--version",
        action="append",
        help=f"Kafka version, repeatable (default: {KAFKA_4_VERSION} and {KAFKA_3_VERSION})",
    )
    fetch.set_defaults(run=_fetch)

    kafka = commands.add_parser("kafka", help="run a Kafka cluster on loopback until Ctrl-C")
    kafka.add_argument("--brokers", type=int, default=1, help="number of nodes (default: 1)")
    kafka.add_argument("--version", default=KAFKA_4_VERSION, help=f"Kafka version (default: {KAFKA_4_VERSION})")
    kafka.add_argument("--workdir", type=Path, help="keep data and logs here (default: a temporary directory)")
    kafka.set_defaults(run=_kafka)

    tansu = commands.add_parser("tansu", help="run an in-memory Tansu broker on loopback until Ctrl-C")
    tansu.add_argument("--port", type=int, help="listen port (default: a free one)")
    tansu.set_defaults(run=_tansu)

    args = parser.parse_args(argv)
    try:
        run: Callable[[argparse.Namespace], int] = args.run
        return run(args)
    except EmbeddedBrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
