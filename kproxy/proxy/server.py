"""The proxy: what its listeners do with a connection, limits and shutdown. It composes
the parts that hold the rest: which nodes are served at which addresses is the broker
directory's (``directory.py``, pure); the listening sockets (binding, bind retries,
per-node listeners, the open-file plan) are ``listeners.py``'s; the routes of TLS
connections by server name ``sni_routing.py``'s; what held answers become (rewritten
addresses, capped ApiVersions) ``answer_rewriting.py``'s.

Two deployment modes share one mechanism, the address mapper that every
address-bearing response goes through:

- gateway: a bootstrap listener plus one listener per upstream broker,
  opened the moment a response first names that broker (so the rewritten
  address already accepts connections when the client gets it) and closed
  when Metadata stops listing it. Ports follow the configured rule; port
  base 0 lets the OS pick each one (bind first, advertise what was bound).
  A listener that cannot be bound (port taken, privileged, address gone) is
  retried with backoff, and until it is bound its node is left out of every
  response (``rewrite.withhold_nodes``): clients are never handed an address
  nobody serves. ``/readyz`` is 503 meanwhile, with the reason.
- sidecar: one listener in front of the local broker; every node is
  advertised at a templated host and a rule-derived port, so the sidecars
  of all brokers hand out the same addresses without talking to each other.

Routing ``sni`` (either mode) replaces the ports with names: every node is
advertised at ``sni_host_template``'s name for it, on the one TLS listener's
port, and the server name each client sends in its handshake picks the node
(``sni.NodeNames.route``); the bootstrap name picks any upstream, an unknown
name (or none) ends the handshake before kproxy's certificate is sent, with a
log line within a budget and ``kproxy_sni_refused_total``. (OpenSSL queues an
``unrecognized_name`` alert, but asyncio closes without flushing it: clients
see the connection closed during the handshake.) No broker listener is ever
opened, so nothing is withheld; a node that joins the cluster is reachable at
its name the moment a response names it, and a name kproxy's certificate does
not cover is logged once. A broker name of a node kproxy does not serve (the
cluster's Metadata, asked at most once a second, does not list it) is refused
too, counted as ``unknown_node``: in the handshake when kproxy asked within
the second, else right after it once the answer is in. Only nodes served get a
route and a ``listener`` label, so made-up names cannot grow ``/metrics``.
A sidecar checks the name and always reaches its
own broker (DNS or the load balancer sends each name to its sidecar); once it
knows its broker's node id (Metadata lists the node at the sidecar's upstream
address) it also refuses other nodes' names, which would otherwise reach the
wrong broker.

What kproxy asks the cluster itself (where the brokers are, for SNI; whether one
answers, for ``/readyz``) lives in ``own_requests``. TLS certificates, keys and CAs
are reloaded when their files change or on SIGHUP (``tls_reload``): listeners keep
one SSL context, whose handshake callback moves each new handshake to the newest.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import socket
import ssl
import time
from typing import Iterable

from ..config import Config
from ..observers.contract import SHUTTING_DOWN, CloseCause, CloseKind, Hook
from ..protocol.events import RequestReceived, ResponseReceived
from ..protocol.tls_failures import HANDSHAKE_FAILURES, SNI_CALLBACK_REFUSAL
from .log_budget import LogBudget
from .own_requests import READINESS_TIMEOUT_S, OwnRequests
from .topic_names import TopicNameLookup
from .proxy_protocol import HeaderGate, serve_proxied
from .policy_answers import PolicyAnswers
from .relay import (unreachable_log_budget, HostPort, Observer, Relay, RelayPolicy, notify_hook, run_relay,
                    serve_relays)
from . import telemetry_offer
from .directory import BrokerDirectory, NameCheck, Refusal
from .answer_rewriting import AnswerRewriter
from .listeners import LISTEN_BACKLOG, Listeners
from .sni_routing import SniRouting
from . import undecodable_sni
from .tls import client_context, server_context

log = logging.getLogger("kproxy.server")

IDLE_CHECK_INTERVAL_S = 5.0       # how often idle connections are looked for
SHUTDOWN_POLL_S = 0.05            # how often shutdown checks for in-flight requests
CLOSE_GRACE_S = 2.0               # closed sockets' handlers finish in milliseconds; this is slack
# Decode failures are logged once per (direction, api, version) kind per interval, and at
# most this many kinds per interval: a client sending random api keys can neither flood the
# log nor, by using up a budget, silence it for good. What is not logged is counted in the
# next line that is, and metrics count every failure.
DECODE_LOG_INTERVAL_S = 60.0
DECODE_LOG_KINDS_PER_INTERVAL = 10
# Connections closed for a misconfiguration (TLS or HTTP on a Kafka port, ...): one WARNING per
# (cause, client host) per interval, at most this many per interval; each close also has its
# INFO line, and kproxy_connections_closed_total{reason} counts them all.
MISCONFIGURATION_LOG_INTERVAL_S = 60.0
MISCONFIGURATION_LOG_KINDS_PER_INTERVAL = 20
# Connections refused for a limit (max_connections, open files) come in bursts: each limit
# is logged once a minute with how many were not; all are counted in
# kproxy_connections_closed_total{reason}.
REFUSAL_LOG_INTERVAL_S = 60.0
REFUSAL_LOG_KINDS_PER_INTERVAL = 2


class Proxy:
    """A running kproxy: call ``start()``, then ``stop()`` (graceful) when done."""

    def __init__(self, config: Config, observers: Iterable[Observer] = (),
                 policy_refused: dict[str, int] | None = None):
        """``policy_refused``: where requests refused by enforced policy rules are counted, by rule."""
        self.config = config
        self.policy_refused = policy_refused if policy_refused is not None else {}
        self.observers: list[Observer] = [*observers, self._log_decode_failures, MisconfigurationLog()]
        # Client telemetry offered by kproxy itself (telemetry_offer.py), when enabled.
        self.telemetry_offer = (telemetry_offer.TelemetryAnswers(config.telemetry_offer)
                                if config.telemetry_offer.enabled else None)
        if self.telemetry_offer is not None:
            self.observers.insert(0, self.telemetry_offer)
        self.relays: set[Relay] = set()
        # Which nodes are served and at which addresses (pure); asks the listeners for a node's.
        self.directory = BrokerDirectory(config)
        self.advertise = self.directory.advertise                  # the address mappers
        self.advertise_controller = self.directory.advertise_controller
        self.port_for = self.directory.port_for
        self.broker_addresses = self.directory.broker_addresses
        self.listening = Listeners(config, self.directory, self.observers, self._open_server, self._policy)
        self.directory.open_listener = self.listening.ensure_broker_listener
        # What held answers become: addresses rewritten, ApiVersions capped (answer_rewriting.py).
        self.rewriter = AnswerRewriter(config, self.directory, self.telemetry_offer, self._brokers_listed)
        self.hold, self.transform = self.rewriter.hold, self.rewriter.transform
        self._bootstrap_cycle = itertools.cycle(range(len(config.upstreams)))
        self.sni_names = config.sni_names                  # None unless routing = "sni"
        self._tls_log = LogBudget(MISCONFIGURATION_LOG_INTERVAL_S, MISCONFIGURATION_LOG_KINDS_PER_INTERVAL)
        self._load_tls()
        self._tls_watches: list[asyncio.Task] = []
        # PROXY protocol (off: None, and listeners accept straight into the relay).
        self._header_gate = HeaderGate(
            config.proxy_protocol_versions, config.proxy_protocol_trusted_cidrs, self.observers,
            lambda: self._server_ssl, self._connection_limit) if config.proxy_protocol_versions else None
        # Discovery (SNI) and readiness: requests of kproxy's own to the upstreams.
        self.own_requests = OwnRequests(config, self._bootstrap_candidates, self._upstream_ssl)
        # Which node a TLS connection goes to by its server name (inert unless routing = "sni").
        self.sni = SniRouting(config, self.directory, self.own_requests, self.observers, self._policy)
        # Names for topic ids no relayed answer named (sidecars: Fetch v13+ before any Metadata).
        self.topic_names = TopicNameLookup(self.own_requests, self.observers) if config.topic_id_lookup else None
        if self.topic_names is not None:
            self.observers.append(self.topic_names)
        self._reaper: asyncio.Task | None = None
        self._decode_log = LogBudget(DECODE_LOG_INTERVAL_S, DECODE_LOG_KINDS_PER_INTERVAL)
        self._unreachable_log = unreachable_log_budget()    # one for all listeners
        self._refusal_log = LogBudget(REFUSAL_LOG_INTERVAL_S, REFUSAL_LOG_KINDS_PER_INTERVAL)
        self.rejected_connections = 0
        self._closed_traffic = {"from_client": 0, "to_broker": 0, "from_broker": 0, "to_client": 0}
        self.started = False
        self.stopping = False

    # ------------------------------------------------------------ the directory's state

    @property
    def upstream_of(self) -> dict[int, HostPort]:
        """node id -> real broker address (the directory's; tests and benchmarks set it)."""
        return self.directory.upstream_of

    @property
    def bound_ports(self) -> dict[int, int]:
        return self.directory.bound_ports

    @property
    def local_node(self) -> int | None:
        return self.directory.local_node

    # ------------------------------------------------------------ TLS

    def _load_tls(self) -> None:
        """TLS contexts, rebuilt when their files change (tls_reload): listeners keep
        _server_ssl for good, and its SNI callback moves each handshake to the newest."""
        config = self.config
        self._server_ssl: ssl.SSLContext | None = None
        self.server_tls = self.client_tls = None
        if config.tls_server is not None or config.tls_client is not None:
            from .tls_reload import ReloadingContext     # cryptography: only with TLS (~16 MB)
        if config.tls_server is not None:
            self.server_tls = ReloadingContext("server", "tls_server", config.tls_server,
                                               self._new_server_context, self.observers)
            self._server_ssl = self.server_tls.current
            if self.sni_names is not None:
                self.directory.certificate_names = self.server_tls.material.dns_names()
                self.server_tls.on_change(
                    lambda material: self.directory.certificate_changed(material.dns_names()))
        if config.tls_client is not None:
            self.client_tls = ReloadingContext("client", "tls_client", config.tls_client,
                                               functools.partial(client_context, config.tls_client),
                                               self.observers)

    def _new_server_context(self, material) -> ssl.SSLContext:
        """The listeners' context the first time (every handshake starts in it, and its
        callbacks watch them all); a plain one for each reload, which handshakes move to."""
        if self._server_ssl is None:
            return server_context(self.config.tls_server, material, self._client_hello,
                                  self._tls_handshake_failed)
        return server_context(self.config.tls_server, material)

    def _client_hello(self, ssl_object, server_name: str | None, context) -> int | None:
        """Every client handshake, before kproxy's certificate is chosen: SNI routing's
        check, then the newest certificate (a reload) for this handshake."""
        if self.sni_names is not None:
            refusal = self.sni.on_server_name(ssl_object, server_name, context)
            if refusal is not None:
                return refusal
        newest = self.server_tls.current
        if newest is not context:
            ssl_object.context = newest
        return None

    def _upstream_ssl(self) -> ssl.SSLContext | None:
        """The context a new upstream connection uses (the newest), None without TLS."""
        return self.client_tls.current if self.client_tls is not None else None

    def reload_tls(self, why: str = "SIGHUP") -> None:
        """Reload every TLS side's files now (SIGHUP); failures keep the old ones."""
        sides = [t for t in (self.server_tls, self.client_tls) if t is not None and t.files]
        if not sides:
            log.info("%s: no TLS files to reload", why)
        loop = asyncio.get_running_loop()
        self._tls_watches = [task for task in self._tls_watches if not task.done()]
        for tls in sides:
            self._tls_watches.append(loop.create_task(tls.reload(why)))

    # ------------------------------------------------------------ SNI routing (sni_routing.py)

    def _undecodable_server_name(self, raw: bytes) -> None:
        """A ClientHello's server name that is not ASCII (Python's ssl failed the handshake
        before ``_client_hello`` ran): an unknown name to SNI routing, else a failed handshake."""
        if self.sni_names is None:
            self._tls_handshake_failed("other", "server name not ASCII")
            return
        self.sni.refuse_name(raw, NameCheck(None, Refusal.UNKNOWN_NAME,
                                            f"server name {raw!r} is not ASCII, so no name kproxy serves"))

    async def upstream_ready(self) -> tuple[bool, str]:
        """Whether a broker answers an ApiVersions round trip (for /readyz; cached, shared).

        A gateway routing by ports that knows no broker yet asks the cluster for them
        first and opens their listeners: replicas behind one Service (a client that
        bootstrapped through one may reach a broker's port on another) then serve every
        broker's port from their first ready answer, not only once a client's Metadata
        has passed through them. A cluster that answers only after SASL keeps the old
        way: a replica learns the brokers from its first client's Metadata.
        """
        ready = self.own_requests.upstream_ready()
        if self.config.mode == "gateway" and self.sni_names is None and not self.upstream_of:
            _, answer = await asyncio.gather(self._learn_brokers_for_readiness(), ready)
            return answer
        return await ready

    async def _learn_brokers_for_readiness(self) -> None:
        """Learn the brokers within the readiness check's own time limit (beside it)."""
        try:
            await asyncio.wait_for(self.own_requests.learn_brokers(self.advertise), READINESS_TIMEOUT_S)
        except asyncio.TimeoutError:
            pass                # the readiness answer says why the cluster does not answer

    # ------------------------------------------------------------ listeners

    def _policy(self, name: str, node_id: int | None) -> RelayPolicy:
        c = self.config
        if node_id is None:
            upstreams = self._bootstrap_candidates
        else:
            def upstreams(node_id=node_id):
                address = self.upstream_of.get(node_id)
                return [address] if address else []
        return RelayPolicy(
            name=name, node_id=node_id, upstreams=upstreams, observers=self.observers,
            hold=self.hold, transform=self.transform, max_frame_size=c.max_frame_size,
            local_answers=self._local_answers(),
            connect_timeout=c.connect_timeout, upstream_ssl=self._upstream_ssl if c.tls_client else None,
            upstream_check_hostname=c.tls_client.check_hostname if c.tls_client else True,
            unreachable_log=self._unreachable_log)

    def _local_answers(self):
        """Per connection, what kproxy answers itself (None: nothing, the relay's fast path):
        refusals of enforced policy rules first, then the telemetry it offers."""
        policy, offer = self.config.policy, self.telemetry_offer
        enforcing = policy is not None and policy.enforcing
        if not enforcing and offer is None:
            return None

        def per_connection() -> list:
            answerers = [PolicyAnswers(policy, self.policy_refused)] if enforcing else []
            return answerers + [offer] if offer is not None else answerers
        return per_connection

    def _bootstrap_candidates(self) -> list[HostPort]:
        """Every configured upstream, starting with the next in turn (spreads bootstrap load)."""
        ups = self.config.upstreams
        first = next(self._bootstrap_cycle)
        return [ups[(first + i) % len(ups)] for i in range(len(ups))]

    def _handler(self, listener_policy: RelayPolicy):
        async def handle(client):
            route = self.sni.route_of(client) if self.sni_names is not None else None
            # A node kproxy does not serve yet: the cluster is asked below; meanwhile the
            # connection counts (limits, shutdown) under the listener's name.
            learning = self.sni.unserved(route)
            policy = listener_policy if learning else self.sni.routed(listener_policy, client)
            if policy is None:
                log.error("refusing a connection on %s: its TLS handshake chose no route",
                          listener_policy.name)
                client.close()
                return
            if self.stopping:                # accepted just before the listener closed
                notify_hook(self.observers, Hook.CONNECTION_REFUSED, policy.name, SHUTTING_DOWN)
                client.close()
                return
            limit = self._connection_limit()
            if limit is not None:
                self.rejected_connections += 1
                unlogged = self._refusal_log.admit(limit)
                if unlogged is not None:
                    peer = client.get_extra_info("peername")
                    log.warning("refusing connection from %s on %s: %s (the same again within %gs "
                                "is not logged%s)", peer, policy.name, limit, REFUSAL_LOG_INTERVAL_S,
                                f"; {unlogged} earlier refusals were not logged" if unlogged else "")
                notify_hook(self.observers, Hook.CONNECTION_REFUSED, policy.name, limit)
                client.close()
                return
            relay = Relay(task=asyncio.current_task())
            self.relays.add(relay)
            try:
                if learning:
                    try:
                        await self.own_requests.learn_brokers(self.advertise)
                    except asyncio.CancelledError:      # shutdown: end normally, not cancelled
                        client.close()
                        return
                    policy = self.sni.routed(listener_policy, client)
                    if policy is None:                  # still not a node kproxy serves
                        self.sni.refuse_unserved(self.sni_names.name_of(route), route)
                        client.close()
                        return
                await run_relay(relay, policy, client)
            finally:
                self.relays.discard(relay)
                closed = self._closed_traffic
                closed["from_client"] += relay.bytes_from_client
                closed["to_broker"] += relay.bytes_from_client
                closed["from_broker"] += relay.bytes_from_broker
                closed["to_client"] += relay.bytes_to_client
        return handle

    async def _open_server(self, policy: RelayPolicy, sock: socket.socket) -> asyncio.Server:
        """A listener's bound socket served with ``policy``'s handler (``Listeners`` calls it)."""
        if self._header_gate is not None:       # the header first, then TLS (if any)
            return await serve_proxied(self._header_gate, policy.name, self._handler(policy), sock,
                                       LISTEN_BACKLOG)
        return await serve_relays(self._handler(policy), sock=sock,
                                  ssl=self._server_ssl, backlog=LISTEN_BACKLOG)

    @property
    def listeners(self) -> dict[str, asyncio.Server]:
        """Listeners by name: "bootstrap" (or the sidecar's) and "broker-<id>"."""
        return self.listening.servers

    @property
    def unbound(self) -> dict:
        """node id -> its broker listener that cannot be bound (yet): ``UnboundListener``."""
        return self.listening.unbound

    def unbound_reasons(self) -> list[str]:
        """One line per broker listener that cannot be bound now (for /readyz)."""
        return self.listening.unbound_reasons()

    def _brokers_listed(self, present: set[int]) -> None:
        """A Metadata answer lists every broker: the directory stops serving the others, and
        (gateway) their listeners are closed."""
        for node_id in self.directory.brokers_listed(present):
            self.sni.forget(node_id)
        if present and self.config.mode == "gateway":
            self.listening.nodes_left(present)

    def traffic(self) -> dict[str, int]:
        """Cumulative bytes each way (closed connections plus live ones), for metrics."""
        totals = dict(self._closed_traffic)
        for relay in list(self.relays):
            totals["from_client"] += relay.bytes_from_client
            totals["to_broker"] += relay.bytes_from_client       # forwarded unchanged
            totals["from_broker"] += relay.bytes_from_broker
            totals["to_client"] += relay.bytes_to_client
        return totals

    def in_flight(self) -> int:
        return sum(relay.in_flight for relay in list(self.relays))

    @property
    def bootstrap_address(self) -> HostPort:
        return self.listening.bootstrap_address

    # ------------------------------------------------------------ lifecycle

    def _connection_limit(self) -> CloseCause | None:
        """Why one more connection cannot be taken now, if it cannot (those still sending
        a PROXY protocol header count too: each holds a socket)."""
        taken = len(self.relays) + (len(self._header_gate.pending) if self._header_gate is not None else 0)
        if taken >= self.config.max_connections:
            return CloseCause(CloseKind.MAX_CONNECTIONS, f"max_connections ({self.config.max_connections}) reached")
        fd_connections = self.listening.fd_connections
        if fd_connections is not None and taken >= fd_connections:
            return CloseCause(CloseKind.FD_LIMIT, (
                f"the open file limit ({self.listening.fd_limit}) leaves room for {fd_connections} "
                f"proxied connections (two sockets each); raise it (ulimit -n, LimitNOFILE)"))
        return None

    async def start(self) -> None:
        c = self.config
        self.listening.plan_file_descriptors()
        if c.mode == "sidecar":
            local = c.upstreams[0]              # the sidecar's one listener reaches its own broker
            policy = self._policy("sidecar", None)
            policy.upstreams = lambda: [local]
        else:
            policy = self._policy("bootstrap", None)
        await self.listening.open_bootstrap(policy)
        self._reaper = asyncio.get_running_loop().create_task(self._reap_idle())
        if self.server_tls is not None:
            undecodable_sni.watch(asyncio.get_running_loop(), self._undecodable_server_name)
        self._tls_watches += [asyncio.get_running_loop().create_task(tls.watch())
                              for tls in (self.server_tls, self.client_tls) if tls is not None and tls.files]
        self.started = True
        log.info("kproxy %s listening on %s:%d, upstream %s", c.mode, *self.bootstrap_address,
                 ",".join(f"{h}:{p}" for h, p in c.upstreams))
        if self._header_gate is not None:
            log.info("%s", self._header_gate.describe())
        if self.sni_names is not None:
            self.directory.check_certificate_covers(self.sni_names.bootstrap)
            log.info("routing by TLS server name: %s%s and %s (node 1), all on port %d",
                     self.sni_names.bootstrap, "" if c.mode == "gateway" else " (this sidecar's broker)",
                     self.sni_names.name_of(1), self.bootstrap_address[1])

    async def _reap_idle(self) -> None:
        timeout = self.config.idle_timeout
        if timeout <= 0:
            return
        while True:
            await asyncio.sleep(min(IDLE_CHECK_INTERVAL_S, timeout / 2))
            now = time.monotonic()
            for relay in list(self.relays):
                if now - relay.last_active > timeout and relay.in_flight == 0:
                    relay.close(CloseCause(CloseKind.IDLE_TIMEOUT, f"idle for more than {timeout:g}s"))

    async def stop(self) -> None:
        """Stop accepting and taking new requests; close each connection once its in-flight
        requests are answered (all of them by ``shutdown_timeout``).

        New requests are not read: a consumer long-polls back to back, so waiting for a
        moment with nothing in flight anywhere would always run into the timeout.
        """
        self.stopping = True
        self.listening.close()
        if self._header_gate is not None:
            self._header_gate.close_all()
        for relay in list(self.relays):
            relay.stop_reading_requests()
        deadline = time.monotonic() + self.config.shutdown_timeout
        while self.relays and time.monotonic() < deadline:
            for relay in list(self.relays):
                if relay.in_flight == 0:
                    relay.close(SHUTTING_DOWN)
            await asyncio.sleep(SHUTDOWN_POLL_S)
        for relay in list(self.relays):
            relay.close(SHUTTING_DOWN)
        if self._reaper is not None:
            self._reaper.cancel()
        if self.topic_names is not None:
            await self.topic_names.stop()
        undecodable_sni.unwatch(asyncio.get_running_loop())
        for task in self._tls_watches:
            task.cancel()
        tasks = [r.task for r in self.relays if r.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_GRACE_S)
        await self.listening.wait_closed(CLOSE_GRACE_S)
        log.info("kproxy stopped")

    # ------------------------------------------------------------ logging

    def _tls_handshake_failed(self, cause: str, error) -> None:
        """A client's TLS handshake failed (before any handler: no address is known here)."""
        if getattr(error, "reason", None) == SNI_CALLBACK_REFUSAL:
            return                                  # refused by SNI routing, said there
        notify_hook(self.observers, Hook.TLS_HANDSHAKE_FAILED, cause)
        unlogged = self._tls_log.admit(cause)
        if unlogged is not None:
            log.warning("TLS handshake with a client failed: %s (%s)%s", HANDSHAKE_FAILURES[cause],
                        getattr(error, "reason", None) or error,
                        f" ({unlogged} earlier failures were not logged)" if unlogged else "")

    def _log_decode_failures(self, info, events) -> None:
        """Decode failures, logged within ``self._decode_log``'s budget (names are looked up
        for a failure only: every pair passes here)."""
        for event in events:
            cls = event.__class__
            if (cls is not ResponseReceived and cls is not RequestReceived) or event.tally is not None \
                    or event.partial is not None:
                continue                  # tally, partial: read already (by the metrics), or decodes
            error = event.decode_error
            if error is None:             # streamed: not decoded
                continue
            if cls is ResponseReceived:
                direction, name = "response", event.request_event.api_name
            else:
                direction, name = "request", event.api_name
            unlogged = self._decode_log.admit((direction, event.api_key, event.api_version))
            if unlogged is None:
                continue
            log.warning("cannot decode %s v%d %s: %s (the same again within %gs is not logged%s; "
                        "see kproxy_decode_failures_total)", name, event.api_version, direction,
                        error, DECODE_LOG_INTERVAL_S,
                        f"; {unlogged} earlier failures were not logged" if unlogged else "")


class MisconfigurationLog:
    """An observer: closes whose reason names a misconfiguration get a WARNING that says
    what is wrong and how to fix it (the reason is that sentence), within a LogBudget."""

    takes_events = False        # lifecycle hooks only: the relay does not call it per read

    def __init__(self, clock=time.monotonic):
        self.budget = LogBudget(MISCONFIGURATION_LOG_INTERVAL_S, MISCONFIGURATION_LOG_KINDS_PER_INTERVAL, clock)

    def connection_closed(self, info, reason: CloseCause, in_flight: int = 0) -> None:
        if not reason.kind.misconfiguration:
            return
        unlogged = self.budget.admit((reason.kind, info.client[0]))
        if unlogged is not None:
            log.warning("%s:%d on %s: %s%s", *info.client, info.listener, reason,
                        f" ({unlogged} earlier misconfigured connections were not logged)" if unlogged else "")
