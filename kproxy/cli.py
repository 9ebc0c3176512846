"""Command line: ``kproxy demo`` (and, with the proxy issue, ``kproxy run``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import secrets
import signal
import sys
import threading
import time
from collections import Counter

from .protocol import error_name
from .protocol.connection import ResponseReceived
from .protocol.walk import error_codes

DEMO_TOPIC = "kproxy-demo"
DEMO_BATCH = 20               # messages produced (and consumed) per traffic round
DEMO_ROUND_PAUSE_S = 3.0      # slow enough to read the decoded lines as they scroll
DEMO_CLIENT_CLOSE_S = 15.0    # a consumer's final commit and leave-group fit well within this
# A fresh broker elects the group coordinator and the topic's leader in a few seconds;
# on a busy machine it can take several times that. Past these the demo says what is missing.
DEMO_READY_TIMEOUT_S = 60.0   # topic created and the consumer's partitions assigned
DEMO_CONSUME_TIMEOUT_S = 10.0 # a round's messages back through kproxy
DEMO_POLL_MS = 500
DEMO_CAPTURE_ROOT = "/tmp/kproxy-capture"   # the demo's captures go here and nowhere else
# How the demo's closing summary words the common close reasons (others: the reason itself).
DEMO_CLOSED_BY = {"client_closed": "by the client", "broker_closed": "by the broker",
                  "shutdown": "by kproxy stopping", "cancelled": "by kproxy stopping"}


def say(line: str) -> None:
    """Print one whole line with one write: the event loop and the traffic thread both print."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class DemoPrinter:
    """The demo's observer: one line per request/response pair. Connections are counted
    rather than logged (the demo leaves kproxy's per-connection lines out), and
    ``summary`` sums them up when the demo stops."""

    def __init__(self):
        self.opened = 0
        self.closed: Counter[str] = Counter()

    def __call__(self, info, events) -> None:
        for event in events:
            if not isinstance(event, ResponseReceived):
                continue
            request = event.request_event
            decoded = request.request
            client = decoded.client_id if decoded else "?"
            response = event.response
            if response is None:
                errors = ["<undecodable>"]
            else:
                errors = [error_name(code) for code in error_codes(
                    "response", event.api_key, response.body_version or event.api_version, response.body)]
            say(f"conn={info.id:<3} {request.api_name:<18} v{request.api_version:<2} "
                f"corr={event.correlation_id:<5} client={client:<22} "
                f"req={request.size:>6}B resp={event.size:>7}B "
                f"latency={event.latency * 1000:8.2f}ms"
                + (f" errors={','.join(sorted(set(errors)))}" if errors else ""))

    def connection_opened(self, info) -> None:
        self.opened += 1

    def connection_closed(self, info, reason: str | None = None, in_flight: int | None = None) -> None:
        from .observers.metrics import close_reason_label   # as the metrics fold the relay's text
        label = close_reason_label(reason or "other")
        self.closed[DEMO_CLOSED_BY.get(label, label.replace("_", " "))] += 1

    def summary(self) -> str:
        closed = ", ".join(f"{n} {how}" for how, n in self.closed.most_common())
        return f"kproxy relayed {self.opened} client connections" + (f" (closed: {closed})" if closed else "")


def _demo_traffic(bootstrap: str, stop: threading.Event) -> None:
    """Real client traffic through the relay: create the topic, then produce and consume in rounds.

    kafka-python's own log lines are kept out of the demo (``main``); what they would
    report shows up here instead, as one line naming what did not work.
    """
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer  # test/demo dependency only
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    clients = []
    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="kproxy-demo-admin")
        try:
            admin.create_topics([NewTopic(DEMO_TOPIC, num_partitions=1, replication_factor=1)],
                                wait_for_metadata=True)
        except TopicAlreadyExistsError:
            pass
        finally:
            admin.close()
        producer = KafkaProducer(bootstrap_servers=bootstrap, client_id="kproxy-demo-producer",
                                 compression_type="gzip", linger_ms=5)
        clients.append(producer)
        consumer = KafkaConsumer(DEMO_TOPIC, bootstrap_servers=bootstrap, group_id="kproxy-demo",
                                 client_id="kproxy-demo-consumer", auto_offset_reset="earliest",
                                 session_timeout_ms=6000, heartbeat_interval_ms=1000)
        clients.append(consumer)
        deadline = time.monotonic() + DEMO_READY_TIMEOUT_S
        while not consumer.assignment() and not stop.is_set():
            if time.monotonic() > deadline:
                say(f"--- the consumer got no partition of {DEMO_TOPIC} within "
                    f"{DEMO_READY_TIMEOUT_S:g}s; stopping the traffic")
                return
            consumer.poll(timeout_ms=DEMO_POLL_MS)        # joins the group
        round_no = 0
        while not stop.is_set():
            round_no += 1
            sends = [producer.send(DEMO_TOPIC, key=b"k%d" % i,
                                   value=b"round %d message %d" % (round_no, i))
                     for i in range(DEMO_BATCH)]
            producer.flush()
            failed = [s.exception for s in sends if s.failed()]
            produced = DEMO_BATCH - len(failed)
            consumed = 0
            deadline = time.monotonic() + DEMO_CONSUME_TIMEOUT_S
            while consumed < produced and time.monotonic() < deadline:
                consumed += sum(len(batch) for batch in
                                consumer.poll(timeout_ms=DEMO_POLL_MS).values())
            say(f"--- round {round_no}: produced {produced}, consumed {consumed} through kproxy"
                + (f" ({len(failed)} sends failed: {failed[0]!r})" if failed else ""))
            stop.wait(DEMO_ROUND_PAUSE_S)
    except Exception as exc:          # noqa: BLE001 - one line that names it, not a traceback
        say(f"--- demo traffic stopped: {exc!r}")
    finally:
        for client in reversed(clients):
            client.close()


async def _demo(args) -> int:
    from . import config as config_module
    from .embedded.kafka import KafkaCluster
    from .allocator import tune_allocator
    from .runtime import Runtime

    tune_allocator()
    # SIGTERM stops the demo as Ctrl-C does: the loop cancels this task (asyncio's runner
    # does that for SIGINT), so clients, kproxy and the broker stop in order, and the
    # analysis still runs.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
    say("starting a local Apache Kafka broker (KRaft) ...")
    cluster = KafkaCluster(1)
    await asyncio.to_thread(cluster.start)
    try:
        # Port 0 everywhere unless asked otherwise: kproxy binds first and advertises
        # what it bound, so no other process can take a port between choosing and using it.
        admin_token = secrets.token_hex(16)          # this demo's own: capture control needs one
        settings = {
            "upstream": cluster.bootstrap_servers, "listen": f"127.0.0.1:{args.port}",
            "admin_listen": f"127.0.0.1:{args.admin_port}",
            "broker_port_base": args.broker_port_base,
            "capture_root": DEMO_CAPTURE_ROOT, "admin_token": admin_token}
        if args.analyze:                             # capture the whole run for the analysis
            settings.update(capture={"directory": args.capture_dir, "formats": ["parquet"]},
                            capture_autostart=True)
        config = config_module.build(settings)
        printer = DemoPrinter()
        runtime = Runtime(config, observers=[printer])
        await runtime.start()
        node = cluster.nodes[0]
        host, port = runtime.proxy.bootstrap_address
        say(f"broker (upstream)  {node.host}:{node.port}  (clients never see this address)\n"
            f"kproxy bootstrap   {host}:{port}  <- point bootstrap.servers here\n"
            f"live page          {runtime.admin_url}/   (admin token: {admin_token})\n"
            f"metrics            {runtime.admin_url}/metrics\n"
            f"health / ready     {runtime.admin_url}/healthz  {runtime.admin_url}/readyz\n"
            f"capture            curl -X POST -H 'Authorization: Bearer {admin_token}' "
            f"{runtime.admin_url}/capture/start   (then kproxy capture stats {DEMO_CAPTURE_ROOT})\n"
            f"One line per request/response pair follows; errors= names the Kafka error codes in a\n"
            f"response (a fresh broker answers the first coordinator requests with retriable ones).\n"
            + (f"capturing to       {args.capture_dir}  (analysed with Spark when the demo stops)\n"
               if args.analyze else "")
            + "Ctrl-C stops the demo and the broker.\n")
        stop = threading.Event()
        traffic = threading.Thread(target=_demo_traffic, args=(f"{host}:{port}", stop),
                                   name="demo-traffic", daemon=True)
        traffic.start()
        try:
            deadline = asyncio.get_running_loop().time() + args.duration if args.duration else None
            while traffic.is_alive() and (deadline is None or asyncio.get_running_loop().time() < deadline):
                await asyncio.sleep(0.2)
        except asyncio.CancelledError:            # Ctrl-C
            say("\nstopping: clients first, then kproxy, then the broker ...")
        finally:
            # Clients close (and commit) while kproxy and the broker are still up.
            stop.set()
            await asyncio.to_thread(traffic.join, DEMO_CLIENT_CLOSE_S)
            await runtime.stop()
            say(printer.summary())
    finally:
        await asyncio.to_thread(cluster.stop)
    say("demo stopped; broker stopped")
    return 0


def _analyze_demo(capture_dir: str, out: str) -> int:
    """The demo's last step: the capture it made, through ``kproxy analyze`` as a user types it."""
    import subprocess
    say(f"\nanalysing the capture with Spark (Ctrl-C skips it):\n"
        f"  kproxy analyze {capture_dir} --out {out} --window 10s")
    return subprocess.call([sys.executable, "-m", "kproxy", "analyze", capture_dir, "--out", out,
                            "--window", "10s"])


RUN_FLAGS = {   # flag -> (config key, help)
    "--upstream": ("upstream", "HOST:PORT[,HOST:PORT...] of the upstream broker(s)"),
    "--listen": ("listen", "HOST:PORT for the bootstrap (gateway) or only (sidecar) listener"),
    "--admin-listen": ("admin_listen", "HOST:PORT for /metrics, /healthz, /readyz, capture ('off' to disable)"),
    "--probe-listen": ("probe_listen", "HOST:PORT for /healthz, /readyz alone, answered by a "
                                       "process of their own (default: off)"),
    "--mode": ("mode", "gateway or sidecar"),
    "--advertised-host": ("advertised_host", "host clients use to reach kproxy (gateway)"),
    "--advertised-host-template": ("advertised_host_template", "sidecar: e.g. 'kafka-{node_id}.svc'"),
    "--routing": ("routing", "ports (a port per broker) or sni (one TLS port, a name per broker)"),
    "--sni-host-template": ("sni_host_template", "sni: e.g. 'broker-{node_id}.kafka.example.com'"),
    "--sni-bootstrap-host": ("sni_bootstrap_host", "sni: e.g. 'bootstrap.kafka.example.com'"),
    "--broker-port-rule": ("broker_port_rule", "offset, sequential, map or fixed"),
    "--broker-port-base": ("broker_port_base", "first broker port (default: listen port + 1)"),
    "--broker-port-map": ("broker_port_map", "NODE=PORT,... for the map rule"),
    "--max-frame-size": ("max_frame_size", "largest frame accepted, bytes"),
    "--max-connections": ("max_connections", "client connections at once"),
    "--max-brokers": ("max_brokers", "broker nodes served at once; more are left out of answers"),
    "--idle-timeout": ("idle_timeout", "seconds before an idle connection is closed"),
    "--connect-timeout": ("connect_timeout", "seconds to reach a broker before giving up"),
    "--shutdown-timeout": ("shutdown_timeout", "seconds in-flight requests get on SIGTERM"),
    "--log-level": ("log_level", "DEBUG, INFO, WARNING or ERROR"),
    "--instance-name": ("instance_name", "this kproxy's name in capture rows (default: host name)"),
    "--audit-file": ("audit_file", "JSON Lines file of the audit trail (cluster changes), rotated"),
    "--workers": ("workers", "worker processes sharing the listener ports (default 1: one process)"),
    "--proxy-protocol": ("proxy_protocol", "off, v1, v2 or any: the Kafka listeners take connections "
                                           "only with a PROXY protocol header (behind a load balancer)"),
    "--proxy-protocol-trusted-cidrs": ("proxy_protocol_trusted_cidrs",
                                       "CIDR,...: the peers that may send a PROXY header "
                                       "(default 127.0.0.0/8,::1/128; others are refused)"),
}


def _run(args) -> int:
    from . import config as config_module
    from .allocator import tune_allocator
    from .runtime import Runtime

    overrides = {key: getattr(args, key) for key, _ in RUN_FLAGS.values()}
    if args.no_cap_api_versions:
        overrides["cap_api_versions"] = False
    try:
        config = config_module.load(args.config, overrides=overrides)
    except config_module.ConfigError as exc:
        print(f"kproxy: config error: {exc}", file=sys.stderr)
        return 2
    logging.getLogger().setLevel(config.log_level.upper())
    if config.workers > 1:
        from . import workers
        return workers.run(config)
    tune_allocator()
    runtime = Runtime(config)
    try:
        import uvloop
        uvloop.run(runtime.run_until_signalled())
    except OSError as exc:
        print(f"kproxy: cannot start: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kproxy", description="A protocol-decoding Kafka proxy")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the proxy")
    run.add_argument("--config", help="TOML or YAML config file")
    for flag, (key, help_text) in RUN_FLAGS.items():
        run.add_argument(flag, dest=key, help=help_text)
    from .observers.capture import cli as capture_cli
    capture_cli.add_arguments(sub)
    from .pipeline import cli as analyze_cli      # argparse only: Spark loads when analyze runs
    analyze_cli.add_arguments(sub)
    run.add_argument("--no-cap-api-versions", action="store_true",
                     help="pass ApiVersions through uncapped (clients may pick versions kproxy cannot rewrite)")
    demo = sub.add_parser("demo", help="start a local broker, run traffic through kproxy, print it decoded")
    demo.add_argument("--port", type=int, default=0, help="listen port (default: one the OS picks)")
    demo.add_argument("--admin-port", type=int, default=0,
                      help="admin listen port (default: one the OS picks)")
    demo.add_argument("--broker-port-base", type=int, default=0,
                      help="broker listener port = base + node id (default: one the OS picks)")
    demo.add_argument("--duration", type=float, default=0, help="stop after this many seconds")
    demo.add_argument("--analyze", action="store_true",
                      help="capture the run (Parquet) and analyse it with Spark when the demo stops")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)
    # matplotlib (the analysis report) logs building its font cache, once, at INFO.
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    if args.command == "run":
        return _run(args)
    if args.command == "capture":
        return args.func(args)
    if args.command == "analyze":
        return analyze_cli.run(args, args.master)
    if args.command == "demo":
        # The demo's clients report problems in its own lines; kafka-python's log lines
        # (an ERROR while a topic is still being created, say) would only alarm a newcomer.
        logging.getLogger("kafka").setLevel(logging.CRITICAL + 1)
        # kproxy's INFO line per connection opened and closed would interleave with the
        # pair lines; the demo counts connections instead (DemoPrinter.summary). Its
        # warnings and errors still show.
        logging.getLogger("kproxy.relay").setLevel(logging.WARNING)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        args.capture_dir = f"{DEMO_CAPTURE_ROOT}/demo-{stamp}"
        # SIGTERM stops the demo as Ctrl-C does (clients, kproxy, then the broker), rather
        # than killing Python and leaving the broker's JVM running: while the event loop
        # runs, _demo cancels itself on it; before and after (the analysis), it interrupts.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            import uvloop
            status = uvloop.run(_demo(args))
            signal.signal(signal.SIGTERM, signal.default_int_handler)   # the loop reset it
            if args.analyze and status == 0:
                return _analyze_demo(args.capture_dir, f"/tmp/kproxy-analysis/demo-{stamp}")
            return status
        except KeyboardInterrupt:
            return 130
        except OSError as exc:            # e.g. --port is taken
            print(f"kproxy: cannot start the demo: {exc}", file=sys.stderr)
            return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
