"""The block of INFO lines ``kproxy run`` logs once it serves: every listener and what
clients are told, mode, routing, TLS on each side, PROXY protocol, the admin token,
capture, the audit trail.

An operator reads it to check the deployment does what they meant (and to find the
admin page when its port was chosen by the OS), so it names bound addresses, not
configured ones. Built from typed values only; the runtime (one process) and the
workers' supervisor each log it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import Config, HostPort, show_address

ADMIN_PATHS = "/metrics, /live/, /healthz, /readyz, /capture"
PROBE_PATHS = "/healthz, /readyz"


@dataclass(frozen=True)
class Bound:
    """What is listening, as bound (ports the OS picked filled in)."""
    bootstrap: HostPort
    admin: HostPort | None
    probes: HostPort | None
    capture_active: bool
    workers: int = 1


def _addr(address: HostPort) -> str:
    return show_address(*address[:2])


def _url(address: HostPort) -> str:
    return f"http://{_addr(address)}"


def _brokers(c: Config, bound: Bound) -> str:
    """Where clients reach each broker node through kproxy."""
    if c.routing == "sni":
        names = c.sni_names
        return (f"by TLS server name on port {bound.bootstrap[1]}: {names.template} "
                f"(bootstrap name {names.bootstrap})"
                + ("; this sidecar serves its own broker's name only" if c.mode == "sidecar" else ""))
    if c.mode == "sidecar":
        where = {"fixed": f"port {c.listen[1]} (the listen port)", "offset": f"port {c.port_base} + node id",
                 "map": "ports by node " + ", ".join(f"{n}={p}" for n, p in sorted(c.broker_port_map.items()))
                        + f" (others: {c.port_base} + node id)"}[c.broker_port_rule]
        return (f"advertised as {c.advertised_host_template} at {where}; this sidecar serves its own "
                f"broker ({_addr(c.upstreams[0])}), the others' sidecars the rest")
    host, told = bound.bootstrap[0], c.public_host
    if c.port_base == 0 and c.broker_port_rule != "map":
        ports = "a port the OS picks per node"
    elif c.broker_port_rule == "offset":
        ports = f"port {c.port_base} + node id"
    elif c.broker_port_rule == "sequential":
        ports = f"ports from {c.port_base} up, in the order nodes are discovered"
    else:
        ports = ("ports by node " + ", ".join(f"{n}={p}" for n, p in sorted(c.broker_port_map.items()))
                 + f" (others: {c.port_base} + node id)")
    return f"{ports} on {host}, told {told}; a listener opens as each node is discovered"


def _tls(c: Config) -> str:
    server, client = c.tls_server, c.tls_client
    if server is None:
        clients = "off"
    else:
        clients = f"on (certificate {server.cert_file or server.keystore_file}" + (
            f"; client certificates required, CA {server.client_ca_file})" if server.client_ca_file else ")")
    if client is None:
        brokers = "off"
    else:
        brokers = (f"on (CA {client.ca_file or 'the system trust store'}"
                   + (f"; client certificate {client.cert_file or client.keystore_file}"
                      if client.cert_file or client.keystore_file else "")
                   + ("" if client.check_hostname else "; host names NOT checked") + ")")
    reload = "; files re-read when they change and on SIGHUP" if server or client else ""
    return f"clients {clients}; brokers {brokers}{reload}"


def _audit(c: Config) -> str:
    where = ([f"file {c.audit.path}"] if c.audit.path else []) + (["the kproxy.audit log"] if c.audit.log else [])
    return "cluster changes to " + " and ".join(where) if where else "off"


def _policy(c: Config) -> str:
    if c.policy is None:
        return "off"
    enforced = [r.name for r in c.policy.rules if r.enforce]
    return (f"{len(c.policy.rules)} rules from {c.policy_file}; "
            + (f"enforced: {', '.join(enforced)} (the rest a dry run)" if enforced else "a dry run (none enforced)"))


def _proxy_protocol(c: Config) -> str:
    if not c.proxy_protocol_versions:
        return "off"
    return (f"{c.proxy_protocol} on every Kafka listener, from "
            + ",".join(map(str, c.proxy_protocol_trusted_cidrs)) + " only")


def _capture(c: Config, bound: Bound) -> str:
    if bound.capture_active and c.capture is not None:
        return f"on (capture_autostart) into {c.capture.directory}, formats {','.join(c.capture.formats)}"
    if c.capture_root is None:
        return "off; cannot be started (no capture_root)"
    if c.admin_token is None or bound.admin is None:
        return "off; cannot be started over HTTP (needs the admin listener and an admin token)"
    return f"off; POST /capture/start on the admin listener writes under {c.capture_root}"


def lines(c: Config, bound: Bound) -> list[str]:
    """The block, one log line each; the first names the version, mode and upstream."""
    from . import __version__
    routing = "by TLS server name (sni)" if c.routing == "sni" else "a port per broker (ports)"
    if c.mode == "sidecar" and c.routing == "ports":
        routing = f"ports ({c.broker_port_rule} rule)"
    out = [f"kproxy {__version__} serving: {c.mode} mode, routing {routing}, upstream "
           + ",".join(_addr(u) for u in c.upstreams)
           + (f", {bound.workers} worker processes" if bound.workers > 1 else "")]
    told = c.sni_names.bootstrap if c.routing == "sni" else c.public_host
    out.append(f"  kafka bootstrap  {_addr(bound.bootstrap)} (clients told {show_address(told, bound.bootstrap[1])})")
    out.append(f"  kafka brokers    {_brokers(c, bound)}")
    if bound.admin is None:
        out.append("  admin            off (admin_listen)")
    else:
        token = "admin token set" if c.admin_token else "no admin token (capture control and live data refused)"
        out.append(f"  admin            {_url(bound.admin)} ({ADMIN_PATHS}); {token}")
    out.append(f"  probes           {_url(bound.probes) + ' (' + PROBE_PATHS + ')' if bound.probes else 'off'}")
    out.append(f"  TLS              {_tls(c)}")
    out.append(f"  PROXY protocol   {_proxy_protocol(c)}")
    out.append(f"  capture          {_capture(c, bound)}")
    out.append(f"  audit            {_audit(c)}")
    out.append(f"  policy           {_policy(c)}")
    return out
