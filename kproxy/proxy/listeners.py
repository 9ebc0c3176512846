"""The proxy's listening sockets: binding, the bootstrap listener, one listener per broker
node (opened when the directory asks, retried with backoff while it cannot be bound,
closed when the node leaves), and the open-file plan that bounds how many connections
they may take.

Which node is served at which port is the directory's (``directory.py``); what a
listener does with a connection is the proxy's (``open_server``, given by ``Proxy``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import socket
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from ..config import Config
from ..observers.contract import Hook, Observer
from .directory import BrokerDirectory
from .relay import HostPort, RelayPolicy, notify_hook

log = logging.getLogger("kproxy.server")      # the proxy's log lines, as before this module

LISTEN_BACKLOG = 1024             # accept queue per listener; clients burst on rebalances
# A broker listener that cannot be bound is tried again after this, doubling each time up
# to the cap: a port freed by another process is picked up within BIND_RETRY_MAX_S, and
# one bind attempt per node every few seconds costs nothing.
BIND_RETRY_FIRST_S = 0.25
BIND_RETRY_MAX_S = 5.0
# Open files: kproxy raises its soft limit up to the hard one (at most this: a million is
# more connections than one event loop serves), keeps FD_HEADROOM descriptors for what
# else opens files later (broker listeners, capture files, admin connections, TLS), and
# counts two per proxied connection (the client's socket and the broker's).
MAX_OPEN_FILES = 1 << 20
FD_HEADROOM = 64
FDS_PER_CONNECTION = 2


@dataclass(eq=False)
class UnboundListener:
    """A broker listener kproxy wants open but cannot bind (yet); its node is withheld."""
    node_id: int
    address: HostPort
    error: OSError
    since: float = field(default_factory=time.monotonic)
    failures: int = 0
    causes_logged: set = field(default_factory=set)     # errnos already logged for this episode
    retry: asyncio.Task | None = None

    def reason(self) -> str:
        host, port = self.address
        return (f"broker-{self.node_id}: cannot listen on {host}:{port}: "
                f"{self.error.strerror or self.error} ({self.failures} attempts in "
                f"{time.monotonic() - self.since:.0f}s; node {self.node_id} is left out of "
                f"what clients are told until it can)")


class Listeners:
    """Every listening socket of one proxy, by name: "bootstrap" (or the sidecar's one)
    and "broker-<id>"; and the broker listeners that cannot be bound yet."""

    def __init__(self, config: Config, directory: BrokerDirectory, observers: list[Observer],
                 open_server: Callable[[RelayPolicy, socket.socket], Awaitable[asyncio.Server]],
                 policy_for: Callable[[str, int | None], RelayPolicy]):
        """``open_server(policy, sock)`` serves a bound socket with ``policy``'s handler;
        ``policy_for(name, node_id)`` is a broker listener's relay policy."""
        self.config = config
        self.directory = directory
        self.observers = observers
        self._open_server = open_server
        self._policy_for = policy_for
        self.servers: dict[str, asyncio.Server] = {}     # "bootstrap" / "broker-<id>"
        self.unbound: dict[int, UnboundListener] = {}    # node id -> listener that cannot bind
        self._opening: set[str] = set()
        self.fd_limit: int | None = None            # the soft open-file limit, once planned
        self.fd_connections: int | None = None      # proxied connections it leaves room for
        self.closing = False

    @property
    def bootstrap_address(self) -> HostPort:
        sock = self.servers["bootstrap"].sockets[0]
        return sock.getsockname()[:2]

    async def open_bootstrap(self, policy: RelayPolicy) -> None:
        """Bind and serve the configured listen address; an OSError naming it if it cannot."""
        c = self.config
        try:
            sock = self.bind(*c.listen)
        except OSError as exc:      # nothing is served yet: fail at start, naming the address
            raise OSError(f"listen {c.listen[0]}:{c.listen[1]}: "
                          f"{exc.strerror or exc}") from None
        self.directory.listen_port = sock.getsockname()[1]
        await self.serve("bootstrap", policy, sock)

    async def serve(self, name: str, policy: RelayPolicy, sock: socket.socket) -> None:
        server = await self._open_server(policy, sock)
        if self.closing:             # bound by a retry as shutdown began: never serve it
            server.close()
            return
        self.servers[name] = server

    def bind(self, host: str, port: int) -> socket.socket:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self.config.workers > 1:      # the kernel spreads connections among the workers
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            sock.listen(LISTEN_BACKLOG)
            sock.setblocking(False)
        except OSError:
            sock.close()                 # retried every few seconds: no descriptor may leak
            raise
        return sock

    def ensure_broker_listener(self, node_id: int) -> None:
        """Open node's listener now (bound synchronously so the address works at once).

        If it cannot be bound, a retry task owns it from then on: responses do not
        re-try (or re-log) it, they only withhold the node.
        """
        name = f"broker-{node_id}"
        if name in self.servers or name in self._opening or node_id in self.unbound:
            return
        self._try_bind(node_id)

    def _try_bind(self, node_id: int) -> bool:
        name = f"broker-{node_id}"
        address = (self.config.listen[0], self.directory.port_for(node_id))
        try:
            sock = self.bind(*address)
        except OSError as exc:
            self._bind_failed(node_id, address, exc)
            return False
        port = sock.getsockname()[1]
        self.directory.listener_bound(node_id, port)
        self._opening.add(name)
        task = asyncio.get_running_loop().create_task(
            self.serve(name, self._policy_for(name, node_id), sock))
        task.add_done_callback(lambda _t, name=name: self._opening.discard(name))
        failed = self.unbound.pop(node_id, None)
        if failed is None:
            log.info("listening for node %d on %s:%d", node_id, address[0], port)
        else:
            log.info("listening for node %d on %s:%d after %d failed attempts in %.1fs; "
                     "clients are told about it again", node_id, address[0], port,
                     failed.failures, time.monotonic() - failed.since)
        return True

    def _bind_failed(self, node_id: int, address: HostPort, exc: OSError) -> None:
        """Count every failure, log each cause once per episode, keep one retry task."""
        notify_hook(self.observers, Hook.LISTENER_BIND_FAILED, f"broker-{node_id}", exc)
        entry = self.unbound.get(node_id)
        if entry is None:
            entry = self.unbound[node_id] = UnboundListener(node_id, address, exc)
            entry.retry = asyncio.get_running_loop().create_task(self._retry_bind(entry))
            self.directory.listener_failed(node_id)
        entry.address, entry.error = address, exc
        entry.failures += 1
        if exc.errno not in entry.causes_logged:
            entry.causes_logged.add(exc.errno)
            log.warning("cannot listen for node %d on %s:%d: %s; node %d is left out of what "
                        "clients are told, and /readyz is 503, until it can (retrying every "
                        "%gs at most)", node_id, *address, exc.strerror or exc, node_id,
                        BIND_RETRY_MAX_S)

    async def _retry_bind(self, entry: UnboundListener) -> None:
        delay = BIND_RETRY_FIRST_S
        while True:
            await asyncio.sleep(delay)
            if self.closing or self.unbound.get(entry.node_id) is not entry:
                return
            if self._try_bind(entry.node_id):
                return
            delay = min(delay * 2, BIND_RETRY_MAX_S)

    def unbound_reasons(self) -> list[str]:
        """One line per broker listener that cannot be bound now (for /readyz)."""
        return [entry.reason() for entry in list(self.unbound.values())]

    def nodes_left(self, present: set[int]) -> None:
        """A Metadata answer listed only ``present``: close the other nodes' listeners, and
        stop trying to bind theirs."""
        for name in [n for n in self.servers if n.startswith("broker-")]:
            node_id = int(name.split("-", 1)[1])
            if node_id not in present:
                log.info("node %d left the cluster; closing its listener", node_id)
                self.servers.pop(name).close()
                self.directory.listener_closed(node_id)
        for node_id in [n for n in self.unbound if n not in present]:
            log.info("node %d left the cluster; no longer trying to listen for it", node_id)
            self.unbound.pop(node_id).retry.cancel()
            self.directory.listener_closed(node_id)

    def plan_file_descriptors(self) -> None:
        """Raise the soft open-file limit to the hard one, and stop taking connections while
        there are still descriptors left: at the limit the event loop drops new clients
        without a word (uvloop accepts and closes them), which nobody could diagnose."""
        try:
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            if hard == resource.RLIM_INFINITY or hard > soft:
                wanted = MAX_OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, MAX_OPEN_FILES)
                if wanted > soft:
                    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
                    soft = wanted
            in_use = len(os.listdir("/proc/self/fd"))
        except (OSError, ValueError):            # not Linux, or not allowed: keep max_connections
            return
        self.fd_limit = soft
        self.fd_connections = max(0, (soft - in_use - FD_HEADROOM) // FDS_PER_CONNECTION)
        if self.fd_connections < self.config.max_connections:
            # A warning when the limit, not max_connections, is what will refuse clients first
            # by far; a near miss (a hard limit of 20,000 against the default 10,000) is only
            # a debug line: nothing an operator needs to act on.
            level = logging.WARNING if self.fd_connections < self.config.max_connections // 2 \
                else logging.DEBUG
            log.log(level, "the open file limit (%d, %d in use) allows %d proxied connections, fewer "
                    "than max_connections (%d); raise it (ulimit -n, LimitNOFILE)", soft, in_use,
                    self.fd_connections, self.config.max_connections)

    def close(self) -> None:
        """Stop accepting: close every listener, stop retrying binds, serve none bound later."""
        self.closing = True
        for server in list(self.servers.values()):
            server.close()
        for entry in self.unbound.values():
            entry.retry.cancel()

    async def wait_closed(self, grace: float) -> None:
        """Wait, at most ``grace`` each, for the listeners closed by ``close`` to finish."""
        # A snapshot: a handler finishing meanwhile may still drop a broker's listener.
        for server in list(self.servers.values()):
            try:        # bounded: on newer Pythons wait_closed also waits for connections
                await asyncio.wait_for(server.wait_closed(), grace)
            except asyncio.TimeoutError:
                log.warning("a listener did not finish closing within %gs", grace)
        self.servers.clear()
