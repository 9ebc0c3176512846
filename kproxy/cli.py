"""Command line: ``kproxy run|capture|analyze|demo``.

Every command reports an error as one line, ``kproxy <command>: error: ...``, and
exits 2 for a usage, config or input error, 1 for a failure while running.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import secrets
import signal
import sys
import textwrap
import threading
import time
from collections import Counter

from .observers.contract import CloseCause
from .protocol import error_name
from .protocol.events import ResponseReceived
from .protocol.walk import error_codes

# Exit statuses of every command: a usage, config or input error (argparse's own choice
# for usage errors), or a failure while running.
USAGE_ERROR = 2
RUNTIME_ERROR = 1

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

    def connection_closed(self, info, reason: CloseCause, in_flight: int | None = None) -> None:
        label = reason.label
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
    from .embedded.kafka import LIGHT_BROKER_JVM_ARGS, KafkaCluster
    from .allocator import tune_allocator
    from .runtime import Runtime

    tune_allocator()
    # SIGTERM stops the demo as Ctrl-C does: the loop cancels this task (asyncio's runner
    # does that for SIGINT), so clients, kproxy and the broker stop in order, and the
    # analysis still runs.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
    say("starting a local Apache Kafka broker (KRaft) ...")
    cluster = KafkaCluster(1, jvm_args=LIGHT_BROKER_JVM_ARGS)      # a demo's traffic is light
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
        runtime = Runtime(config, observers=[printer], announce=False)   # the demo says it below
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
    "--upstream": ("upstream", "the upstream broker(s), any of the cluster's"),
    "--listen": ("listen", "the bootstrap (gateway) or only (sidecar) listener"),
    "--admin-listen": ("admin_listen", "/metrics, /healthz, /readyz, the live page, capture control"),
    "--probe-listen": ("probe_listen", "/healthz and /readyz alone, answered by a process of their own"),
    "--mode": ("mode", "gateway: in front of a whole cluster; sidecar: beside one broker"),
    "--advertised-host": ("advertised_host", "host clients use to reach kproxy (gateway)"),
    "--advertised-host-template": ("advertised_host_template", "sidecar: e.g. 'kafka-{node_id}.svc'"),
    "--routing": ("routing", "ports (a port per broker) or sni (one TLS port, a name per broker)"),
    "--sni-host-template": ("sni_host_template", "sni: e.g. 'broker-{node_id}.kafka.example.com'"),
    "--sni-bootstrap-host": ("sni_bootstrap_host", "sni: e.g. 'bootstrap.kafka.example.com'"),
    "--broker-port-rule": ("broker_port_rule", "how broker ports are chosen (gateway) or advertised (sidecar)"),
    "--broker-port-base": ("broker_port_base", "first broker port (0: the OS picks)"),
    "--broker-port-map": ("broker_port_map", "NODE=PORT,... for the map rule"),
    "--max-frame-size": ("max_frame_size", "largest frame accepted, bytes"),
    "--max-connections": ("max_connections", "client connections at once"),
    "--max-brokers": ("max_brokers", "broker nodes served at once; more are left out of answers"),
    "--idle-timeout": ("idle_timeout", "seconds before an idle connection is closed"),
    "--connect-timeout": ("connect_timeout", "seconds to reach a broker before giving up"),
    "--shutdown-timeout": ("shutdown_timeout", "seconds in-flight requests get on SIGTERM"),
    "--log-level": ("log_level", "how much kproxy logs"),
    "--instance-name": ("instance_name", "this kproxy's name in capture rows"),
    "--audit-file": ("audit_file", "JSON Lines file of the audit trail (cluster changes), rotated"),
    "--policy-file": ("policy_file", "policy rules (TOML/YAML) judged on every request; rules marked enforce are refused"),
    "--workers": ("workers", "worker processes sharing the listener ports (1: one process)"),
    "--proxy-protocol": ("proxy_protocol", "the Kafka listeners take connections only with a PROXY "
                                           "protocol header of this version (behind a load balancer)"),
    "--proxy-protocol-trusted-cidrs": ("proxy_protocol_trusted_cidrs",
                                       "the networks whose peers may send a PROXY header; others are refused"),
    # TLS: files, re-read when they change and on SIGHUP (flag/env beat the config file's tables)
    "--tls-server-cert-file": ("tls_server_cert_file", "TLS to clients: kproxy's certificate chain (PEM)"),
    "--tls-server-key-file": ("tls_server_key_file", "TLS to clients: its private key (PEM)"),
    "--tls-server-key-password-file": ("tls_server_key_password_file",
                                       "file holding the password of an encrypted key file"),
    "--tls-server-keystore-file": ("tls_server_keystore_file",
                                   "TLS to clients: a PKCS#12 keystore instead of the cert/key files"),
    "--tls-server-keystore-password-file": ("tls_server_keystore_password_file",
                                            "file holding the keystore's password"),
    "--tls-server-client-ca-file": ("tls_server_client_ca_file",
                                    "CA certificates (PEM) client certificates must chain to (mTLS)"),
    "--tls-client-ca-file": ("tls_client_ca_file", "TLS to brokers: CA certificates (PEM) to trust "
                                                   "(default: the system's)"),
    "--tls-client-cert-file": ("tls_client_cert_file", "TLS to brokers: kproxy's client certificate (PEM)"),
    "--tls-client-key-file": ("tls_client_key_file", "TLS to brokers: its private key (PEM)"),
    "--tls-client-key-password-file": ("tls_client_key_password_file",
                                       "file holding the password of an encrypted key file"),
    "--tls-client-keystore-file": ("tls_client_keystore_file",
                                   "TLS to brokers: a PKCS#12 keystore instead of the cert/key files"),
    "--tls-client-keystore-password-file": ("tls_client_keystore_password_file",
                                            "file holding the keystore's password"),
}
# Switches (store_true): flag -> (config key, value it sets, help)
RUN_SWITCHES = {
    "--tls-client": ("tls_client_enabled", True,
                     "TLS to brokers, even with no other --tls-client-* setting (system trust store)"),
    "--tls-client-no-check-hostname": ("tls_client_check_hostname", False,
                                       "TLS to brokers: do not check the broker's name in its certificate"),
}

# Defaults that are not a plain value of Config's (computed, or absent), as --help says them.
DEFAULT_TEXT = {
    "upstream": "none, required",
    "probe_listen": "off",
    "advertised_host": "the listen host, so required when that is 0.0.0.0 or ::",
    "broker_port_base": "listen port + 1",
    "broker_port_map": "none",
    "instance_name": "the host name",
    "sni_host_template": "none", "sni_bootstrap_host": "none",
}
RUN_DESCRIPTION = """\
Run kproxy in front of Kafka brokers. Clients connect to kproxy, which forwards every
byte, gives clients its own addresses for the brokers, and decodes the traffic for
metrics, capture and the live page.

Settings come from, lowest first: defaults, the config file (--config), KPROXY_*
environment variables, these flags."""
SETTINGS_REFERENCE = 'README.md, "Settings reference"'


# How --help names each flag's value (argparse's default is the flag's name in capitals).
METAVARS = {"upstream": "HOST:PORT[,...]", "listen": "HOST:PORT", "admin_listen": "HOST:PORT|off",
            "probe_listen": "HOST:PORT|off", "advertised_host": "HOST", "advertised_host_template": "TEMPLATE",
            "sni_host_template": "TEMPLATE", "sni_bootstrap_host": "HOST", "broker_port_base": "PORT",
            "broker_port_map": "NODE=PORT[,...]", "max_frame_size": "BYTES", "max_connections": "N",
            "max_brokers": "N", "idle_timeout": "SECONDS", "connect_timeout": "SECONDS",
            "shutdown_timeout": "SECONDS", "instance_name": "NAME", "workers": "N",
            "proxy_protocol_trusted_cidrs": "CIDR[,...]"}


def _choices(key: str) -> tuple[str, ...] | None:
    from . import config as config_module
    return {"mode": config_module.MODES, "routing": config_module.ROUTINGS,
            "broker_port_rule": config_module.PORT_RULES, "log_level": config_module.LOG_LEVELS,
            "proxy_protocol": tuple(config_module.PROXY_PROTOCOLS)}.get(key)


def _default(key: str) -> str:
    """A setting's default as a user writes it, from Config's own field defaults."""
    from . import config as config_module
    if key in DEFAULT_TEXT:
        return DEFAULT_TEXT[key]
    value = {f.name: f.default for f in dataclasses.fields(config_module.Config)}.get(key, dataclasses.MISSING)
    if value is dataclasses.MISSING:                  # computed, or a flag for part of a table
        return "none"
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):    # HostPort
        return config_module.show_address(*value)
    if isinstance(value, tuple):                      # a list setting, e.g. networks
        return ",".join(map(str, value))
    return "off" if value is None else str(value)


def _run_epilog() -> str:
    from . import config as config_module
    flagged = ({key for key, _ in RUN_FLAGS.values()} | {key for key, _, _ in RUN_SWITCHES.values()}
               | {"upstreams", "cap_api_versions"})
    rest = sorted(config_module.setting_names() - flagged)
    return (textwrap.fill("Settings with no flag, set in the config file or as KPROXY_<NAME> "
                          "environment variables (admin_token: the environment only; tables such "
                          "as tls_server: the config file): " + ", ".join(rest) + ".", 88)
            + "\n\n" + textwrap.fill(f"Every setting, TLS and capture included, is described in "
                                      f"{SETTINGS_REFERENCE}.", 88))


def _add_run_parser(sub) -> argparse.ArgumentParser:
    from .config import ENV_PREFIX
    run = sub.add_parser("run", help="run the proxy", description=RUN_DESCRIPTION, epilog=_run_epilog(),
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--config", metavar="FILE", help="TOML (.toml) or YAML (.yaml, .yml) config file")
    for flag, (key, help_text) in RUN_FLAGS.items():
        choices = _choices(key)
        metavar = "FILE" if key.endswith("_file") else METAVARS.get(key)
        run.add_argument(flag, dest=key, metavar="{%s}" % ",".join(choices) if choices else metavar,
                         help=f"{help_text} (default: {_default(key)}; env {ENV_PREFIX}{key.upper()})"
                         .replace("%", "%%"))
    for flag, (key, value, help_text) in RUN_SWITCHES.items():
        run.add_argument(flag, dest=key, action="store_true",
                         help=f"{help_text} (env {ENV_PREFIX}{key.upper()}={str(value).lower()})")
    run.add_argument("--no-cap-api-versions", action="store_true",
                     help="pass ApiVersions through uncapped (clients may pick versions kproxy cannot "
                          f"rewrite; env {ENV_PREFIX}CAP_API_VERSIONS=false)")
    return run


def fail(command: str, message: str, status: int) -> int:
    """Every command's error line: ``kproxy <command>: error: ...``; the exit status back."""
    print(f"kproxy {command}: error: {message}", file=sys.stderr)
    return status


def _run(args) -> int:
    from . import config as config_module
    from .allocator import tune_allocator
    from .runtime import Runtime

    overrides = {key: getattr(args, key) for key, _ in RUN_FLAGS.values()}
    if args.no_cap_api_versions:
        overrides["cap_api_versions"] = False
    for key, value, _ in RUN_SWITCHES.values():
        if getattr(args, key):
            overrides[key] = value
    try:
        config = config_module.load(args.config, overrides=overrides)
    except config_module.ConfigError as exc:
        return fail("run", str(exc), USAGE_ERROR)
    logging.getLogger().setLevel(config.log_level.upper())
    for warning in config_module.unknown_env(os.environ):
        logging.getLogger("kproxy.config").warning(warning)
    if config.workers > 1:
        from . import workers
        return workers.run(config)
    tune_allocator()
    runtime = Runtime(config)
    try:
        import uvloop
        uvloop.run(runtime.run_until_signalled())
    except OSError as exc:
        return fail("run", f"cannot start: {exc}", RUNTIME_ERROR)
    return 0


def _add_demo_parser(sub) -> argparse.ArgumentParser:
    demo = sub.add_parser("demo", help="start a local broker, run traffic through kproxy, print it decoded",
                          description="Start a local Apache Kafka broker (needs Java), put kproxy in "
                                      "front of it, run a producer and a consumer through it and print "
                                      "each request/response pair decoded. Ctrl-C stops it all.")
    demo.add_argument("--port", type=int, default=0, help="listen port (default: one the OS picks)")
    demo.add_argument("--admin-port", type=int, default=0,
                      help="admin listen port (default: one the OS picks)")
    demo.add_argument("--broker-port-base", type=int, default=0,
                      help="broker listener port = base + node id (default: one the OS picks)")
    demo.add_argument("--duration", type=float, default=0, help="stop after this many seconds")
    demo.add_argument("--analyze", action="store_true",
                      help="capture the run (Parquet) and analyse it with Spark when the demo stops")
    return demo


def _help(parser: argparse.ArgumentParser):
    """A command group run without its command: its help, as a usage error."""
    def show(_args) -> int:
        parser.print_help(sys.stderr)
        return USAGE_ERROR
    return show


def parser() -> argparse.ArgumentParser:
    from . import __version__
    from .observers.capture import cli as capture_cli
    from .pipeline import cli as analyze_cli      # argparse only: Spark loads when analyze runs
    top = argparse.ArgumentParser(prog="kproxy", description="A transparent, protocol-decoding Kafka proxy.",
                                  epilog="`kproxy COMMAND --help` describes each command.")
    top.add_argument("--version", action="version", version=f"kproxy {__version__}")
    # command_parser: each command's parser notes itself on what it parses (the innermost
    # wins), so that an error found after parsing is that command's ("kproxy run: error:").
    top.set_defaults(func=_help(top), command_parser=top)
    sub = top.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    run = _add_run_parser(sub)
    run.set_defaults(func=_run, command_parser=run)
    capture = capture_cli.add_arguments(sub)
    capture.set_defaults(func=_help(capture), command_parser=capture)     # `kproxy capture`: its help
    analyze_cli.add_arguments(sub)
    demo = _add_demo_parser(sub)
    demo.set_defaults(func=_demo_main, command_parser=demo)
    return top


def _demo_main(args) -> int:
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
        return fail("demo", f"cannot start the demo: {exc}", RUNTIME_ERROR)


def main(argv: list[str] | None = None) -> int:
    # argparse leaves arguments no command knows to the top parser, which would report them
    # as "kproxy: error:"; the command they were given to reports them instead.
    args, unknown = parser().parse_known_args(argv)
    if unknown:
        args.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)
    # matplotlib (the analysis report) logs building its font cache, once, at INFO.
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    if args.command == "analyze":
        from .pipeline import cli as analyze_cli
        return analyze_cli.run(args, args.master)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
