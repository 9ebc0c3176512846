"""The broker directory: which nodes kproxy serves, and at which address clients reach each.

Pure (no sockets, no asyncio): ``server.Proxy`` owns the listeners and tells the
directory what happened to them (``listener_bound``, ``listener_failed``,
``listener_closed``); the directory answers what to advertise for a node an
answer names (``advertise``, ``advertise_controller``), which nodes to leave out
of that answer (``left_out``), and what a Metadata answer's broker list means for
the nodes served (``brokers_listed``). It asks for a broker listener through the
one callback it is given (``open_listener``), never opens one itself.

What it holds:

- the port rule (``port_for``): ``offset`` (base + node id), ``sequential``
  (first free from the base, in discovery order), ``map`` (``broker_port_map``,
  offset for the rest), ``fixed`` (the listen port: sidecars behind per-broker
  addresses); base 0 means the port each listener was bound to;
- sidecar addresses from ``advertised_host_template``;
- SNI routing: each node's name (``sni_address``), the name a handshake sends
  checked back to a route (``check_server_name``), the certificate's names;
- ``max_brokers`` and ports the rule cannot give (``serves``);
- the real broker address of each node (``upstream_of``), as answers taught it.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Callable

from ..certs.sni import BOOTSTRAP, certificate_covers
from ..config import Config
from ..observers.contract import HostPort
from .log_budget import LogBudget

# Same logger name as the listeners': operators filter kproxy's log by it, and the
# lines below were always the server's.
log = logging.getLogger("kproxy.server")

OS_CHOSEN_PORT = 0                # broker_port_base 0: the OS picks each broker listener's port
MAX_PORT = 65535
NO_PORT = 0                       # in the address of a node left out where no answer can drop it
# Nodes left out of answers (max_brokers reached, or no port for them): each node once
# per interval, at most this many per interval (one answer may name thousands).
LEFT_OUT_LOG_INTERVAL_S = 60.0
LEFT_OUT_LOG_NODES_PER_INTERVAL = 3


class Refusal(enum.Enum):
    """Why SNI routing refuses a server name (the value is ``kproxy_sni_refused_total``'s
    ``reason`` label)."""
    UNKNOWN_NAME = "unknown_name"
    NO_NAME = "no_name"
    OTHER_NODE = "other_node"
    UNKNOWN_NODE = "unknown_node"


@dataclass(frozen=True, slots=True)
class NameCheck:
    """What a handshake's server name routes to (``route``: BOOTSTRAP or a node id), or
    why it is refused (``refusal`` and the sentence logged for it)."""
    route: object = None
    refusal: Refusal | None = None
    said: str = ""


class BrokerDirectory:
    """Nodes served and their advertised addresses; fed by answers and listener events."""

    def __init__(self, config: Config, open_listener: Callable[[int], None] = lambda node_id: None,
                 certificate_names: list[str] | None = None):
        self.config = config
        self.sni_names = config.sni_names                  # None unless routing = "sni"
        self.open_listener = open_listener                 # gateway by ports: a node needs its listener
        self.upstream_of: dict[int, HostPort] = {}         # node id -> real broker address
        self.served_nodes: set[int] = set()                # at most max_brokers (see serves)
        self.broker_ports: dict[int, int] = {}             # node id -> port (sequential rule)
        self.bound_ports: dict[int, int] = {}              # node id -> port its listener is bound to
        self.withheld: set[int] = set()                    # nodes whose listener cannot be bound
        self.listen_port = config.listen[1]                # as bound, once started (0: OS-chosen)
        self.local_node: int | None = None                 # sidecar: its broker's node id, once known
        self.certificate_names = certificate_names         # SNI routing: what the certificate covers
        self._names_checked: set[int] = set()              # node ids whose name was checked against it
        self._left_out: set[int] = set()                   # nodes refused in the answer being rewritten
        self._left_out_log = LogBudget(LEFT_OUT_LOG_INTERVAL_S, LEFT_OUT_LOG_NODES_PER_INTERVAL)

    # ------------------------------------------------------------ ports and names

    def port_for(self, node_id: int, assign: bool = True) -> int:
        """The kproxy port a node is reached at, by the configured rule (``assign`` False:
        the one a node not given a port yet would get, without giving it)."""
        c = self.config
        if c.broker_port_rule == "map" and node_id in c.broker_port_map:
            return c.broker_port_map[node_id]
        if c.broker_port_rule == "fixed":
            return c.listen[1]
        if c.port_base == OS_CHOSEN_PORT:                  # 0 until its listener is bound
            return self.bound_ports.get(node_id, OS_CHOSEN_PORT)
        if c.broker_port_rule == "sequential":
            if node_id not in self.broker_ports:
                used = set(self.broker_ports.values())
                port = c.port_base
                while port in used:
                    port += 1
                if not assign:
                    return port
                self.broker_ports[node_id] = port
            return self.broker_ports[node_id]
        return c.port_base + node_id                       # "offset", and unmapped nodes

    def sni_address(self, node_id: int) -> HostPort:
        """SNI routing: the node's name, on the one listener's port (as bound)."""
        name = self.sni_names.name_of(node_id)
        if node_id not in self._names_checked:
            self._names_checked.add(node_id)
            self.check_certificate_covers(name)
        return name, self.listen_port

    def check_certificate_covers(self, name: str) -> None:
        """Warn once per name kproxy advertises that its certificate is not valid for."""
        known = self.certificate_names
        if known is None or certificate_covers(known, name):
            return
        tls = self.config.tls_server
        log.warning("kproxy's certificate (%s) is not valid for %s, a name it advertises (the "
                    "certificate names %s): clients that verify host names will refuse it; use "
                    "a wildcard *.%s or add the name to its SANs", tls.cert_file or tls.keystore_file,
                    name, ", ".join(known) or "nothing", name.split(".", 1)[1])

    def certificate_changed(self, names: list[str]) -> None:
        """SNI routing: a reloaded certificate is checked against the names advertised."""
        self.certificate_names = names
        self.check_certificate_covers(self.sni_names.bootstrap)
        for node_id in self._names_checked:
            self.check_certificate_covers(self.sni_names.name_of(node_id))

    def broker_addresses(self) -> dict[int, HostPort]:
        """node id -> the address clients are handed for it (gateway; bound listeners only)."""
        if self.sni_names is not None:
            return {node_id: self.sni_address(node_id) for node_id in list(self.upstream_of)}
        return {node_id: (self.config.public_host, port)
                for node_id, port in list(self.bound_ports.items())}

    # ------------------------------------------------------------ nodes served

    def serves(self, node_id: int) -> bool:
        """Whether kproxy serves a node an answer names: one it serves already, or a new one
        while it serves fewer than ``max_brokers`` and the port rule gives it a port. Every
        node served costs a listener, a port and some state, so a broker answer naming
        thousands (hostile, or broken) must not get them all. A node refused is left out of
        the answer (``left_out``), and logged within a budget."""
        if node_id in self.served_nodes:
            return True
        c = self.config
        if len(self.served_nodes) >= c.max_brokers:
            why = (f"kproxy serves max_brokers ({c.max_brokers}) nodes already; raise it if the "
                   f"cluster is that big")
        else:
            # The rule's port, where the rule gives one before a listener is bound.
            port = None if self.sni_names is not None or c.port_base == OS_CHOSEN_PORT \
                or c.broker_port_rule == "fixed" else self.port_for(node_id, assign=False)
            if port is not None and not 1 <= port <= MAX_PORT:
                why = (f"broker_port_rule {c.broker_port_rule} gives it port {port}, outside "
                       f"1-{MAX_PORT}: lower broker_port_base or map its port (broker_port_map)")
            else:
                self.served_nodes.add(node_id)
                return True
        self._leave_out(node_id, why)
        return False

    def _leave_out(self, node_id: int, why: str) -> None:
        """Leave a node out of the answer being rewritten, logged within a budget."""
        self._left_out.add(node_id)
        unlogged = self._left_out_log.admit(node_id)
        if unlogged is not None:
            log.warning("node %d is left out of what clients are told: %s%s", node_id, why,
                        f" ({unlogged} more left out since the last such line)" if unlogged else "")

    def begin_answer(self) -> None:
        """A new answer is being rewritten: forget the nodes left out of the last one."""
        self._left_out.clear()

    def left_out(self, controllers: bool) -> set[int]:
        """The nodes to withhold from the answer being rewritten: those refused in it, and
        (brokers' addresses only) those whose listener cannot be bound."""
        return set(self._left_out) if controllers else self.withheld | self._left_out

    def unserved(self, route) -> bool:
        """Whether a gateway's SNI route names a node kproxy does not serve (now)."""
        return isinstance(route, int) and self.config.mode == "gateway" and route not in self.upstream_of

    # ------------------------------------------------------------ the address mapper

    def advertise(self, node_id: int, host: str, port: int) -> HostPort:
        """The AddressMapper: learn the upstream address, return the one clients get."""
        c = self.config
        if not self.serves(node_id):
            return c.public_host, NO_PORT                   # left out of the answer
        if c.mode == "sidecar":
            if self.sni_names is not None:
                if self.local_node is None and (host.lower(), port) == (c.upstreams[0][0].lower(),
                                                                        c.upstreams[0][1]):
                    self.local_node = node_id
                    log.info("this sidecar's broker is node %d (Metadata lists it at %s:%d); other "
                             "nodes' names are refused here", node_id, host, port)
                return self.sni_address(node_id)
            return c.advertised_host_template.format(node_id=node_id, host=host), self.port_for(node_id)
        if self.upstream_of.get(node_id) != (host, port):
            self.upstream_of[node_id] = (host, port)
            log.info("node %d is at %s:%d", node_id, host, port)
        if self.sni_names is not None:
            return self.sni_address(node_id)               # served by the one listener already
        self.open_listener(node_id)
        return c.public_host, self.port_for(node_id)      # withheld later if it is not bound

    def advertise_controller(self, node_id: int, host: str, port: int) -> HostPort:
        """Like ``advertise`` for a controller's address, with nothing learnt or opened: the
        address of the broker of the same node id kproxy serves (combined mode), or none.
        A controller that is no broker kproxy serves is left out: DescribeCluster drops
        it, the KRaft quorum answers (which only report) give it port 0."""
        c = self.config
        if c.mode == "sidecar":
            return self.advertise(node_id, host, port)
        served = self.upstream_of if self.sni_names is not None else self.bound_ports
        if node_id not in served:
            self._leave_out(node_id, "no broker kproxy serves has its node id (a controller "
                                     "alone is not reachable through kproxy)")
            return c.public_host, NO_PORT                   # left out of the answer
        if self.sni_names is not None:
            return self.sni_address(node_id)
        return c.public_host, self.port_for(node_id)

    def brokers_listed(self, present: set[int]) -> set[int]:
        """A Metadata answer lists every broker: kproxy stops serving the others, so brokers
        replaced over time never use up ``max_brokers``. Returns the nodes whose upstream
        address it forgot (gateway only); the listeners are the caller's. An empty list is an error response, not a
        statement about the cluster."""
        if not present:
            return set()
        self.served_nodes &= present
        if self.config.mode != "gateway":
            return set()
        gone = {node_id for node_id in self.upstream_of if node_id not in present}
        for node_id in gone:
            del self.upstream_of[node_id]
        return gone

    # ------------------------------------------------------------ listener events

    def listener_bound(self, node_id: int, port: int) -> None:
        """The node's listener is bound to ``port``: advertise it, withhold it no more."""
        self.bound_ports[node_id] = port
        self.withheld.discard(node_id)

    def listener_failed(self, node_id: int) -> None:
        """The node's listener cannot be bound (yet): withhold it from answers."""
        self.withheld.add(node_id)

    def listener_closed(self, node_id: int) -> None:
        """The node's listener is closed, or no longer tried: it has no address."""
        self.bound_ports.pop(node_id, None)
        self.withheld.discard(node_id)

    # ------------------------------------------------------------ SNI routing

    def check_server_name(self, server_name: str | None) -> NameCheck:
        """The route a handshake's server name picks, or why it is refused (before asking
        the cluster: a node not served yet passes here, see ``unserved``)."""
        names = self.sni_names
        route = names.route(server_name)
        if route is None:
            if server_name:
                return NameCheck(None, Refusal.UNKNOWN_NAME,
                                 f"server name {server_name!r} is neither the bootstrap name "
                                 f"{names.bootstrap!r} nor a broker name like {names.name_of(1)!r}")
            return NameCheck(None, Refusal.NO_NAME, "no server name (SNI) was sent: clients "
                                                    "must connect by name, not address")
        if isinstance(route, int) and self.local_node not in (None, route):
            return NameCheck(route, Refusal.OTHER_NODE,
                             f"server name {server_name!r} is node {route}'s, but this sidecar's "
                             f"broker is node {self.local_node}: DNS or the load balancer sends it "
                             f"to the wrong sidecar")
        return NameCheck(route)

    @staticmethod
    def unserved_refusal(server_name: str | None, node_id: int) -> NameCheck:
        """The refusal of a name whose node kproxy does not serve."""
        return NameCheck(node_id, Refusal.UNKNOWN_NODE,
                         f"server name {server_name!r} names node {node_id}, which kproxy does not "
                         f"serve (the cluster's Metadata does not list it, or max_brokers is reached)")


__all__ = ["BOOTSTRAP", "BrokerDirectory", "NameCheck", "Refusal", "LEFT_OUT_LOG_INTERVAL_S",
           "LEFT_OUT_LOG_NODES_PER_INTERVAL", "MAX_PORT", "NO_PORT", "OS_CHOSEN_PORT"]
