"""SNI routing (``routing: sni``): the server name a client sends in its TLS handshake picks
the node its connection goes to, every node on the one listener's port.

The handshake's callback (``on_server_name``) notes the route on the connection, or
refuses the name before kproxy's certificate is sent; the connection's handler then asks
``routed`` for its relay policy (one per node served, so made-up names cannot grow the
``listener`` label). Which names mean which node, and which nodes are served, is the
directory's (``directory.py``); this class acts on its answers and logs refusals within
a budget.
"""

from __future__ import annotations

import logging
import ssl
from typing import Callable

from ..certs.sni import BOOTSTRAP
from ..config import Config
from ..observers.contract import Hook, Observer
from .directory import BrokerDirectory, NameCheck
from .log_budget import LogBudget
from .own_requests import OwnRequests
from .relay import RelayPolicy, notify_hook

log = logging.getLogger("kproxy.server")      # the proxy's log lines, as before this module

# Refused server names (SNI routing) are logged like decode failures: each name once per
# interval, at most this many names per interval (a scanner trying names cannot flood the
# log); kproxy_sni_refused_total counts every refusal.
SNI_LOG_INTERVAL_S = 60.0
SNI_LOG_NAMES_PER_INTERVAL = 5
ROUTE_ATTRIBUTE = "kproxy_route"  # set on each handshake's SSLObject: BOOTSTRAP or a node id


class SniRouting:
    """The routes of one proxy's connections by TLS server name (inert without ``routing: sni``)."""

    def __init__(self, config: Config, directory: BrokerDirectory, own_requests: OwnRequests,
                 observers: list[Observer], policy_for: Callable[[str, int | None], RelayPolicy]):
        """``policy_for(name, node_id)``: the relay policy of a node's connections."""
        self.config = config
        self.sni_names = config.sni_names                  # None unless routing = "sni"
        self.directory = directory
        self.own_requests = own_requests
        self.observers = observers
        self._policy_for = policy_for
        self._sni_log = LogBudget(SNI_LOG_INTERVAL_S, SNI_LOG_NAMES_PER_INTERVAL)
        self._sni_policies: dict[object, RelayPolicy] = {}  # BOOTSTRAP / node id -> policy

    def on_server_name(self, ssl_object, server_name: str | None, _context) -> int | None:
        """The handshake's SNI callback: note the route on the connection, or refuse it."""
        check = self.directory.check_server_name(server_name)
        if check.refusal is None and self.unserved(check.route) and not self.own_requests.would_learn():
            # Asking the cluster again now would be skipped (asked within the interval): the
            # handshake could only end in the refusal the handler would give after it.
            check = self.directory.unserved_refusal(server_name, check.route)
        if check.refusal is not None:
            self.refuse_name(server_name, check)
            return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME
        setattr(ssl_object, ROUTE_ATTRIBUTE, check.route)
        return None

    def unserved(self, route) -> bool:
        """Whether a gateway's SNI route names a node kproxy does not serve (now)."""
        return self.directory.unserved(route)

    def refuse_unserved(self, server_name: str | None, node_id: int) -> None:
        self.refuse_name(server_name, self.directory.unserved_refusal(server_name, node_id))

    def refuse_name(self, server_name: str | bytes | None, check: NameCheck) -> None:
        """Count and log (within a budget) a server name SNI routing refuses."""
        notify_hook(self.observers, Hook.SNI_REFUSED, check.refusal.value)
        said = check.said
        unlogged = self._sni_log.admit(server_name)
        if unlogged is not None:
            log.warning("refusing a TLS connection: %s (the same again within %gs is not logged%s; "
                        "see kproxy_sni_refused_total)", said, SNI_LOG_INTERVAL_S,
                        f"; {unlogged} earlier refusals were not logged" if unlogged else "")

    def route_of(self, client) -> object:
        """The SNI route the handshake noted (BOOTSTRAP or a node id); None if none."""
        return getattr(client.get_extra_info("ssl_object"), ROUTE_ATTRIBUTE, None)

    def routed(self, policy: RelayPolicy, client) -> RelayPolicy | None:
        """The policy for one accepted connection: the listener's, or (SNI gateway) the
        one its server name picked. None if it has no route (never expected) or names a
        node kproxy does not serve: a policy (and a ``listener`` label) per node served only."""
        if self.sni_names is None or self.config.mode == "sidecar":
            return policy
        route = self.route_of(client)
        if route is None or self.unserved(route):
            return None
        if route == BOOTSTRAP:
            return policy
        if route not in self._sni_policies:
            self._sni_policies[route] = self._policy_for(f"broker-{route}", route)
        return self._sni_policies[route]

    def forget(self, node_id: int) -> None:
        """The node left the cluster: its policy goes (a new one if it comes back)."""
        self._sni_policies.pop(node_id, None)
