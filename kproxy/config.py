"""kproxy's configuration: one frozen object, from a file, env vars and flags.

Precedence: defaults < config file (TOML or YAML) < ``KPROXY_*`` env vars <
command-line flags. Every key is validated at start; a bad one fails with a
single line naming the key and why (``ConfigError``), never later at run time.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import difflib
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from .protocol.framer import DEFAULT_MAX_FRAME_SIZE
from .settings_file import SettingsFileError, read_settings_file
from .spelling import SUGGESTION_CUTOFF, did_you_mean
from .telemetry_settings import TelemetryOffer, TelemetryOfferError

if TYPE_CHECKING:
    from .observers.audit import AuditConfig
    from .observers.capture import CaptureConfig
    from .policy import Policy

HostPort = tuple[str, int]

MODES = ("gateway", "sidecar")
# ports: a port per broker (the broker_port_* rules); sni: every node on the listen
# port, told apart by the TLS server name (sni_host_template, sni_bootstrap_host).
ROUTINGS = ("ports", "sni")
PORT_RULES = ("offset", "sequential", "map", "fixed")   # fixed: every node at the listen port
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
ENV_PREFIX = "KPROXY_"
# PROXY protocol on the Kafka listeners: off, or the header versions taken (any: v1 or v2).
PROXY_PROTOCOLS = {"off": frozenset(), "v1": frozenset({1}), "v2": frozenset({2}), "any": frozenset({1, 2})}
# Who may send a PROXY header unless proxy_protocol_trusted_cidrs says otherwise: this host
# only (a balancer beside kproxy). A header is a claim about who the client is; trusting it
# from any peer lets every client that reaches the port pick its own address. The networks a
# real balancer connects from (an NLB's subnets, a cluster's node range) differ per site and
# cannot be guessed, and a private-network default would trust every pod or VM in them:
# peers outside are refused (and logged, naming this setting) until it names them.
DEFAULT_PROXY_PROTOCOL_TRUSTED = ("127.0.0.0/8", "::1/128")
# KPROXY_* variables that are not settings but are read by other parts of kproxy (the
# embedded brokers' jar cache) or by its tests and tools; no warning names these.
OTHER_ENV_VARS = frozenset({"KPROXY_CACHE_DIR", "KPROXY_SKIP_BROKER_TESTS", "KPROXY_REPORT_SCREENSHOT",
                            "KPROXY_LIVE_SCREENSHOT", "KPROXY_LIVE_WORKERS_SCREENSHOT",
                            "KPROXY_ENTRY",       # benchmarks/bench_hostile_memory.py: how to start kproxy
                            "KPROXY_KAFKA_CLASS_ARCHIVES"})   # kproxy.embedded: "0" starts Kafka JVMs without one
# Hosts that mean "every interface" to bind(), and "this machine" to a client told them:
# never an address to advertise (Kafka refuses them in advertised.listeners too).
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})

# Kafka clients close idle connections after connections.max.idle.ms (9 min by
# default); the proxy waits a little longer so it is never the one that cuts first.
DEFAULT_IDLE_TIMEOUT_S = 600.0
# A sidecar or small gateway rarely sees more; a runaway client hits this first.
DEFAULT_MAX_CONNECTIONS = 10_000
# In-flight requests get this long to finish on SIGTERM (Kubernetes' default grace is 30 s).
DEFAULT_SHUTDOWN_TIMEOUT_S = 25.0
# Upstream connect attempts give up after this; the client then sees its connection close.
DEFAULT_CONNECT_TIMEOUT_S = 10.0
# Broker nodes kproxy serves at once (a listener, a port and some state each): far more
# than real clusters have, few enough that a broker answer naming thousands of nodes
# (hostile, or broken) cannot take every file descriptor or port.
DEFAULT_MAX_BROKERS = 1_024
# Distinct client_id/topic label values per metric before the rest fold into "other": enough
# for a real fleet, small enough that a client inventing ids cannot explode the series count.
DEFAULT_METRICS_LABEL_CAP = 100
# The admin token guards capture control: shorter ones can be guessed (16 random
# characters of base64 are 96 bits; `openssl rand -hex 32` gives 64 characters).
MIN_ADMIN_TOKEN_CHARS = 16
# Worker processes (``kproxy run --workers N``): one per core is the useful most; past this
# a typo (1000 for 10) would fork the machine to its knees before anyone noticed.
MAX_WORKERS = 64


class ConfigError(ValueError):
    """A configuration value is missing or wrong; the message names the key."""


def parse_host_port(text: str, key: str) -> HostPort:
    host, sep, port = str(text).strip().rpartition(":")
    if not sep or not host:
        raise ConfigError(f"{key}: expected HOST:PORT, got {text!r}")
    host = host.strip("[]")                      # [::1]:9092
    try:
        number = int(port)
    except ValueError:
        raise ConfigError(f"{key}: port must be a number, got {port!r}") from None
    if not 0 <= number <= 65535:
        raise ConfigError(f"{key}: port must be 0-65535, got {number}")
    return host, number


def show_address(host: str, port: int) -> str:
    """HOST:PORT as a user writes it: an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# kproxy's own certificate and key come from either PEM files (cert_file and key_file; the
# key may be encrypted, its password in key_password_file) or a PKCS#12 keystore
# (keystore_file; its password in keystore_password_file). Every file is re-read when it
# changes and on SIGHUP (proxy/tls_reload.py).
@dataclass(frozen=True)
class TLSServer:
    """TLS that kproxy terminates for clients."""
    cert_file: str | None = None             # PEM: the certificate, then any intermediates
    key_file: str | None = None              # PEM (PKCS#8, PKCS#1 or SEC1), encrypted or not
    client_ca_file: str | None = None        # set to require and verify client certificates
    key_password_file: str | None = None     # the password of an encrypted key_file
    keystore_file: str | None = None         # PKCS#12: key and chain, instead of cert/key_file
    keystore_password_file: str | None = None


@dataclass(frozen=True)
class TLSClient:
    """TLS that kproxy originates to brokers."""
    ca_file: str | None = None               # None: the system trust store
    cert_file: str | None = None             # client certificate for mTLS brokers
    key_file: str | None = None
    check_hostname: bool = True
    key_password_file: str | None = None
    keystore_file: str | None = None         # PKCS#12, instead of cert_file/key_file
    keystore_password_file: str | None = None


# Each TLS setting also as a flat key, ``tls_server_cert_file`` (flag --tls-server-cert-file,
# env KPROXY_TLS_SERVER_CERT_FILE), so TLS needs no config file; a flat key overrides the
# table's. tls_client_enabled = true turns TLS to brokers on with nothing else set (the
# system trust store); false turns it off.
TLS_SECTIONS: dict[str, type] = {"tls_server": TLSServer, "tls_client": TLSClient}
TLS_FLAT_KEYS: dict[str, tuple[str, str]] = {      # flat key -> (section, setting)
    f"{section}_{f.name}": (section, f.name)
    for section, cls in TLS_SECTIONS.items() for f in dataclasses.fields(cls)}
TLS_CLIENT_ENABLED = "tls_client_enabled"


@dataclass(frozen=True)
class Config:
    upstreams: tuple[HostPort, ...]
    listen: HostPort = ("127.0.0.1", 9092)
    admin_listen: HostPort | None = ("127.0.0.1", 9644)
    # /healthz and /readyz only, answered by a process of their own so that neither a
    # scrape storm on the admin port nor a busy event loop (or a garbage collection holding
    # the interpreter lock) delays them (see probes/probes.py).
    # Off unless set; the deploy files set 0.0.0.0:9645 and point the probes at it.
    probe_listen: HostPort | None = None
    mode: str = "gateway"
    # Host clients use to reach kproxy; gateway default: the listen host.
    advertised_host: str | None = None
    # How broker listener ports are chosen (gateway) / advertised (sidecar).
    broker_port_rule: str = "offset"
    broker_port_base: int | None = None      # default: listen port + 1; 0: the OS picks (gateway)
    broker_port_map: Mapping[int, int] = field(default_factory=dict)
    # Sidecar: the address every node is advertised at; {node_id} and {host} are substituted.
    advertised_host_template: str = "{host}"
    # How clients reach a node: "ports" (one port each) or "sni" (one TLS port, a name each).
    routing: str = "ports"
    sni_host_template: str | None = None     # sni: e.g. "broker-{node_id}.kafka.example.com"
    sni_bootstrap_host: str | None = None    # sni: e.g. "bootstrap.kafka.example.com"
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_brokers: int = DEFAULT_MAX_BROKERS
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT_S
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S
    cap_api_versions: bool = True
    topic_id_lookup: bool = True               # ask the broker for topic ids no answer named
    tls_server: TLSServer | None = None
    tls_client: TLSClient | None = None
    log_level: str = "INFO"
    # Opt-in metric labels; each keeps its first metrics_label_cap values, the rest fold into "other".
    metrics_client_id_label: bool = False
    metrics_topic_label: bool = False
    metrics_group_label: bool = False          # consumer group metrics per group (else totals)
    metrics_principal_label: bool = False      # requests/bytes per authenticated principal and API
    metrics_label_cap: int = DEFAULT_METRICS_LABEL_CAP
    # Decode the metrics clients push (KIP-714 PushTelemetry) into kproxy_client_metric,
    # per client instance (at most metrics_label_cap of them), and the live page.
    client_telemetry: bool = False
    # KIP-714 offered by kproxy itself where the broker does not (the telemetry_offer table:
    # enabled, metrics, push_interval_ms, clients); off by default.
    telemetry_offer: "TelemetryOffer" = field(default_factory=lambda: _telemetry_offer({}))
    # Capture settings (directory, formats, filters, rotation; see README "Traffic capture"):
    # defaults for captures started through the admin listener, and for capture_autostart.
    capture: CaptureConfig | None = None
    capture_autostart: bool = False
    # This kproxy's name in capture rows (proxy_instance), so captures merged from many
    # sidecars stay apart; the host name (a pod's name in Kubernetes) unless set.
    instance_name: str = field(default_factory=socket.gethostname)
    # Worker processes sharing the listener ports (SO_REUSEPORT) behind one supervisor;
    # 1: one process, no supervisor. max_connections and the buffer budget are divided among them.
    workers: int = 1
    # Captures are written only under this directory, resolved once here: a directory
    # from the admin listener or the capture table must lie inside it (no '..', no
    # symbolic links below it). Default: the capture table's directory; neither set:
    # captures cannot be started.
    capture_root: str | None = None
    # Record keys, values and header values reach capture files only if the operator
    # sets this (file or env); a request to the admin listener alone cannot.
    capture_allow_record_data: bool = False
    # The bearer token GET /capture and POST /capture/start|stop require, read from
    # admin_token_file (e.g. a mounted Secret) or the KPROXY_ADMIN_TOKEN env var. Never
    # logged, never in repr. Unset: capture control over HTTP is refused.
    admin_token_file: str | None = None
    admin_token: str | None = field(default=None, repr=False)
    # PROXY protocol (HAProxy's v1/v2) on every Kafka listener (bootstrap, per-broker, SNI):
    # off, v1, v2 or any. On, each connection must start with a header, from a peer in
    # proxy_protocol_trusted_cidrs, and the client address it names is the one reported.
    proxy_protocol: str = "off"
    proxy_protocol_trusted_cidrs: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = tuple(
        ipaddress.ip_network(n) for n in DEFAULT_PROXY_PROTOCOL_TRUSTED)
    # The audit trail of cluster changes (see observers/audit): the ``audit`` table (path,
    # rotate_bytes, keep, log, queue_max_items) or ``audit_file`` (its path alone). Without a
    # path, events still go to the kproxy.audit logger (``audit.log``, on by default).
    audit: "AuditConfig" = field(default_factory=lambda: _default_audit())
    # Policy rules (see kproxy/policy): a TOML or YAML file, read once at start into ``policy``.
    # Judged on every request (dry run); rules marked enforce = true are also enforced.
    policy_file: str | None = None
    policy: "Policy | None" = field(default=None, repr=False)

    @property
    def proxy_protocol_versions(self) -> frozenset[int]:
        """The PROXY header versions the Kafka listeners take (empty: the feature is off)."""
        return PROXY_PROTOCOLS[self.proxy_protocol]

    @property
    def port_base(self) -> int:
        return self.broker_port_base if self.broker_port_base is not None else self.listen[1] + 1

    @property
    def public_host(self) -> str:
        return self.advertised_host or self.listen[0]

    @property
    def sni_names(self):
        """routing = "sni": the NodeNames (validated at build); None otherwise."""
        if self.routing != "sni":
            return None
        from .certs.sni import NodeNames
        return NodeNames.parse(self.sni_host_template, self.sni_bootstrap_host)


_SCALARS: dict[str, type] = {
    "mode": str, "advertised_host": str, "broker_port_rule": str, "broker_port_base": int,
    "advertised_host_template": str, "routing": str, "sni_host_template": str,
    "sni_bootstrap_host": str, "max_frame_size": int, "max_connections": int, "max_brokers": int,
    "idle_timeout": float, "connect_timeout": float, "shutdown_timeout": float,
    "cap_api_versions": bool, "topic_id_lookup": bool, "log_level": str, "metrics_client_id_label": bool,
    "metrics_topic_label": bool, "metrics_group_label": bool, "metrics_principal_label": bool,
    "metrics_label_cap": int, "capture_autostart": bool, "client_telemetry": bool,
    "instance_name": str,
    "capture_root": str, "capture_allow_record_data": bool, "admin_token_file": str,
    "admin_token": str, "workers": int, "proxy_protocol": str, "policy_file": str,
}
_KNOWN = set(_SCALARS) | {"upstreams", "upstream", "listen", "admin_listen", "probe_listen", "broker_port_map",
                          "tls_server", "tls_client", "capture", "proxy_protocol_trusted_cidrs",
                          "audit", "audit_file", "telemetry_offer"} | set(TLS_FLAT_KEYS) | {TLS_CLIENT_ENABLED}


def setting_names() -> frozenset[str]:
    """Every key a config file, ``KPROXY_*`` variable or flag may set."""
    return frozenset(_KNOWN)


def _telemetry_offer(table: Any):
    """The telemetry_offer table (or JSON object from KPROXY_TELEMETRY_OFFER)."""
    if isinstance(table, str):
        try:
            import json
            table = json.loads(table)
        except ValueError as exc:
            raise ConfigError(f"telemetry_offer: not a JSON object: {exc}") from None
    if not isinstance(table, Mapping):
        raise ConfigError("telemetry_offer: expected a table of settings")
    try:
        return TelemetryOffer.from_mapping(table)
    except TelemetryOfferError as exc:
        raise ConfigError(str(exc)) from None


def _default_audit():
    from .observers.audit import AuditConfig
    return AuditConfig()


def _audit(table: Any, path: Any):
    """The audit table (or JSON object from KPROXY_AUDIT), with ``audit_file`` as its path."""
    from .observers.audit import AuditConfig
    if table is not None and not isinstance(table, (Mapping, str)):
        raise ConfigError("audit: expected a table of settings")
    merged: dict[str, Any] = {}
    try:
        if table is not None:
            merged.update(dataclasses.asdict(AuditConfig.from_value(table)))
        if path is not None:
            if table is not None and AuditConfig.from_value(table).path is not None:
                raise ConfigError("audit_file: set it or audit.path, not both")
            merged["path"] = str(path)
        return AuditConfig.from_value(merged)
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(str(exc).replace("audit.path", "audit_file" if path is not None else "audit.path")) \
            from None


def _policy(values: dict[str, Any]) -> None:
    """The rules file, read once (its errors name the file, the rule and the key)."""
    path = values.get("policy_file")
    if path:
        from .policy import PolicyError, load_policy
        try:
            values["policy"] = load_policy(path)
        except PolicyError as exc:
            raise ConfigError(str(exc)) from None


def _coerce(key: str, value: Any, kind: type) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: expected {kind.__name__}, got {value!r}") from None


def _tls_table(raw: dict[str, Any], key: str) -> Mapping[str, Any] | None:
    """A TLS section: its table (file) with the flat keys (env, flags, file) laid over it."""
    table = raw.pop(key, None)
    flat = {setting: raw.pop(name) for name, (section, setting) in TLS_FLAT_KEYS.items()
            if section == key and name in raw}
    if key == "tls_client" and TLS_CLIENT_ENABLED in raw:
        if not _coerce(TLS_CLIENT_ENABLED, raw.pop(TLS_CLIENT_ENABLED), bool):
            if flat:
                raise ConfigError(f"{TLS_CLIENT_ENABLED}: false, but tls_client_{sorted(flat)[0]} is set")
            return None
        table = table if table is not None else {}
    if not flat:
        return table
    if table is not None and not isinstance(table, Mapping):
        raise ConfigError(f"{key}: expected a table of settings")
    return {**(table or {}), **flat}


def _tls(key: str, value: Any, cls: type) -> Any:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: expected a table of settings")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(value) - set(fields)
    if unknown:
        name = sorted(unknown)[0]
        raise ConfigError(f"{key}.{name}: unknown setting{did_you_mean(name, fields)}")
    value = {name: _coerce(f"{key}.{name}", v, bool) if fields[name].type == "bool" else v
             for name, v in value.items()}
    try:
        tls = cls(**value)
    except TypeError as exc:
        raise ConfigError(f"{key}: {exc}") from None
    for name in fields:
        path = getattr(tls, name)
        if name.endswith("_file") and path is not None and not Path(path).is_file():
            raise ConfigError(f"{key}.{name}: no such file {path!r}")
    from .certs.tls_files import TLSFilesError, check_settings, load
    try:
        check_settings(key, tls)
        load(key, tls)                 # what the files hold, checked once at start as well
    except TLSFilesError as exc:
        raise ConfigError(str(exc)) from None
    return tls


def _capture(value: Any) -> Mapping[str, Any]:
    """The capture table (or JSON object from KPROXY_CAPTURE); ``_capture_root`` parses it."""
    if isinstance(value, str):                   # KPROXY_CAPTURE='{"directory": "/var/kproxy"}'
        import json
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ConfigError(f"capture: expected a JSON object ({exc})") from None
    if not isinstance(value, Mapping):
        raise ConfigError("capture: expected a table of settings")
    return value


def _parse_capture(table: Mapping[str, Any]) -> CaptureConfig:
    """The capture table, parsed by the capture module's own rules (it names the bad key)."""
    from .observers.capture import CaptureConfig
    try:
        return CaptureConfig.from_dict(table)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _capture_root(values: dict[str, Any]) -> None:
    """Resolve capture_root once (default: the capture table's directory), put the
    table's directory inside it (a relative one is taken under the root) and parse the
    table into the ``CaptureConfig`` everything else is given."""
    from .observers.capture.files import directory_in_root
    table = values.get("capture")
    configured = values.get("capture_root")
    derived = configured is None and table is not None and table.get("directory") is not None
    if derived:
        configured = str(table["directory"])
    if configured is None:
        if table is not None:                             # rows shipped only, or no directory (named)
            _check_record_data(values, _parse_capture(table))
        return
    if not configured.strip() or "\x00" in configured:
        raise ConfigError(f"capture_root: expected a directory path, got {configured!r}")
    configured = os.path.abspath(configured)
    root = values["capture_root"] = os.path.realpath(configured)
    if table is None:
        return
    directory = root if derived else str(table.get("directory") or root)
    if os.path.isabs(directory) and os.path.commonpath([os.path.normpath(directory), configured]) == configured:
        directory = os.path.relpath(os.path.normpath(directory), configured)   # as spelt in capture_root
    try:
        directory = directory_in_root(root, directory)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    _check_record_data(values, _parse_capture({**table, "directory": directory}))


def _check_record_data(values: dict[str, Any], capture: CaptureConfig) -> None:
    """Keep the parsed table, unless it asks for record data the operator did not allow."""
    if capture.include_record_data and not values.get("capture_allow_record_data"):
        raise ConfigError("capture.include_record_data: needs capture_allow_record_data = true as well "
                          "(record keys and values are captured only on that explicit setting)")
    values["capture"] = capture


def _admin_token(values: dict[str, Any]) -> None:
    """Read the admin token from admin_token_file, or take KPROXY_ADMIN_TOKEN's, and check
    it. Error messages never quote the token."""
    token, path = values.get("admin_token"), values.get("admin_token_file")
    key = "admin_token"
    if path is not None:
        if token is not None:
            raise ConfigError("admin_token_file: set it or KPROXY_ADMIN_TOKEN, not both")
        key = "admin_token_file"
        try:
            token = Path(path).read_bytes().decode("ascii")
        except OSError as exc:
            raise ConfigError(f"admin_token_file: cannot read {path!r}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"admin_token_file: {path!r} must hold the token as ASCII text") from None
    if token is None:
        return
    token = token.strip()
    if len(token) < MIN_ADMIN_TOKEN_CHARS:
        raise ConfigError(f"{key}: the token must be at least {MIN_ADMIN_TOKEN_CHARS} characters "
                          f"(it has {len(token)}); e.g. `openssl rand -hex 32`")
    if not all(0x21 <= ord(c) <= 0x7E for c in token):
        raise ConfigError(f"{key}: the token must be printable ASCII without spaces "
                          f"(it travels in an Authorization header)")
    values["admin_token"] = token


def _trusted_cidrs(value: Any) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """``"10.0.0.0/8,2001:db8::/32"`` (env, flags) or a list (file) into networks; a bare
    address is a network of one."""
    key = "proxy_protocol_trusted_cidrs"
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise ConfigError(f"{key}: expected a list of networks (CIDR), got {value!r}")
    networks = []
    for item in items:
        text = str(item).strip()
        if not text:
            continue
        try:
            networks.append(ipaddress.ip_network(text))
        except ValueError as exc:
            raise ConfigError(f"{key}: {exc} (write a network as 10.0.0.0/8 or 2001:db8::/32)") from None
    if not networks:
        raise ConfigError(f"{key}: empty, so every connection would be refused; name the networks "
                          f"your load balancers connect from")
    return tuple(networks)


def read_file(path: str | Path) -> dict[str, Any]:
    """A TOML (.toml) or YAML (.yaml/.yml) config file as a dict."""
    try:
        data = read_settings_file(path, "config")
    except SettingsFileError as exc:
        raise ConfigError(str(exc)) from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a table of settings at the top")
    for key in data:
        if key not in _KNOWN:
            raise ConfigError(f"config file {path}: {key}: unknown setting{did_you_mean(str(key), _KNOWN)}")
    return data


def from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """``KPROXY_UPSTREAM=broker:9092`` → ``{"upstream": "broker:9092"}``."""
    return {k[len(ENV_PREFIX):].lower(): v for k, v in environ.items()
            if k.startswith(ENV_PREFIX) and k[len(ENV_PREFIX):].lower() in _KNOWN}


def unknown_env(environ: Mapping[str, str]) -> list[str]:
    """One warning per ``KPROXY_*`` variable that is no setting (and none kproxy reads
    otherwise), with the setting it may have meant: a typo would otherwise be ignored."""
    known = {ENV_PREFIX + key.upper() for key in _KNOWN} | OTHER_ENV_VARS
    # Compared without the prefix, which every name shares and would make any two look alike.
    suffixes = {name[len(ENV_PREFIX):] for name in known}
    warnings = []
    for name in sorted(environ):
        if name.startswith(ENV_PREFIX) and name not in known:
            close = difflib.get_close_matches(name[len(ENV_PREFIX):], sorted(suffixes), n=1,
                                              cutoff=SUGGESTION_CUTOFF)
            warnings.append(f"{name} is not a kproxy setting and is ignored"
                            + (f" (did you mean {ENV_PREFIX}{close[0]}?)" if close else ""))
    return warnings


def build(*layers: Mapping[str, Any]) -> Config:
    """Merge layers (later wins) and validate into a Config."""
    raw: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if value is not None:
                raw[key] = value
    unknown = set(raw) - _KNOWN
    if unknown:
        key = sorted(unknown)[0]
        raise ConfigError(f"{key}: unknown setting{did_you_mean(key, _KNOWN)}")

    upstream = raw.pop("upstreams", None) or raw.pop("upstream", None)
    raw.pop("upstream", None)
    if not upstream:
        raise ConfigError("upstream: required (HOST:PORT of one or more brokers)")
    if isinstance(upstream, str):
        upstream = [u for u in upstream.split(",") if u.strip()]
    values: dict[str, Any] = {"upstreams": tuple(parse_host_port(u, "upstream") for u in upstream)}
    if "listen" in raw:
        values["listen"] = parse_host_port(raw.pop("listen"), "listen")
    for key in ("admin_listen", "probe_listen"):          # 'off' (or empty) disables either
        if key in raw:
            address = raw.pop(key)
            values[key] = None if str(address).lower() in ("", "none", "off") \
                else parse_host_port(address, key)
    if "broker_port_map" in raw:
        mapping = raw.pop("broker_port_map")
        if isinstance(mapping, str):      # "1=9101,2=9102" from env or flags
            mapping = dict(item.split("=", 1) for item in mapping.split(",") if item)
        try:
            values["broker_port_map"] = {int(k): int(v) for k, v in mapping.items()}
        except (ValueError, AttributeError):
            raise ConfigError("broker_port_map: expected NODE_ID=PORT pairs") from None
    if "capture" in raw:
        values["capture"] = _capture(raw.pop("capture"))
    if raw.get("proxy_protocol") is False:     # YAML 1.1 reads a bare `off` as false
        raw["proxy_protocol"] = "off"
    if "proxy_protocol" in raw:
        raw["proxy_protocol"] = str(raw["proxy_protocol"]).strip().lower()
    if "telemetry_offer" in raw:
        values["telemetry_offer"] = _telemetry_offer(raw.pop("telemetry_offer"))
    if "audit" in raw or "audit_file" in raw:
        values["audit"] = _audit(raw.pop("audit", None), raw.pop("audit_file", None))
    if "proxy_protocol_trusted_cidrs" in raw:
        values["proxy_protocol_trusted_cidrs"] = _trusted_cidrs(raw.pop("proxy_protocol_trusted_cidrs"))
    for key, cls in TLS_SECTIONS.items():
        values[key] = _tls(key, _tls_table(raw, key), cls)
    for key, value in raw.items():
        values[key] = _coerce(key, value, _SCALARS[key])
    _capture_root(values)
    _admin_token(values)
    _policy(values)
    config = Config(**values)
    _validate(config)
    return config


def _validate(c: Config) -> None:
    if c.mode not in MODES:
        raise ConfigError(f"mode: must be one of {', '.join(MODES)}, got {c.mode!r}")
    _validate_routing(c)
    if c.routing == "ports":
        _validate_ports(c)
    _validate_advertised(c)
    _validate_distinct_ports(c)
    for key in ("max_frame_size", "max_connections", "max_brokers", "metrics_label_cap"):
        if getattr(c, key) <= 0:
            raise ConfigError(f"{key}: must be positive, got {getattr(c, key)}")
    for key in ("idle_timeout", "connect_timeout", "shutdown_timeout"):
        if getattr(c, key) < 0:
            raise ConfigError(f"{key}: must not be negative, got {getattr(c, key)}")
    if not c.instance_name.strip():
        raise ConfigError("instance_name: must not be empty")
    if c.capture_autostart and c.capture is None:
        raise ConfigError("capture_autostart: needs a capture table (at least its directory)")
    _validate_workers(c)
    _validate_proxy_protocol(c)
    if c.log_level.upper() not in LOG_LEVELS:
        raise ConfigError(f"log_level: must be DEBUG, INFO, WARNING or ERROR, got {c.log_level!r}")


def _validate_advertised(c: Config) -> None:
    """Clients must be told an address they can connect to: never a wildcard, which is what
    the listen host is when kproxy binds every interface (the advertised host's default)."""
    try:
        rendered = c.advertised_host_template.format(node_id=0, host="h")
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(f"advertised_host_template: only {{node_id}} and {{host}} may be used ({exc})") \
            from None
    if c.routing == "sni":                     # nodes are advertised by sni_host_template
        return
    if c.mode == "sidecar":
        if rendered.strip("[]") in WILDCARD_HOSTS:
            raise ConfigError(f"advertised_host_template: {c.advertised_host_template!r} advertises "
                              f"{rendered}, which clients cannot connect to; give the name or address "
                              f"clients reach each broker's sidecar at, e.g. 'kafka-{{node_id}}.kafka.svc'")
        return
    if c.advertised_host is not None:
        if c.advertised_host.strip().strip("[]") in WILDCARD_HOSTS:
            raise ConfigError(f"advertised_host: {c.advertised_host!r} is not an address clients can "
                              f"connect to; give the name or address clients reach kproxy at")
        return
    if c.listen[0] in WILDCARD_HOSTS:
        raise ConfigError(f"advertised_host: listen is {c.listen[0]}, which clients cannot connect to; "
                          f"set advertised_host (--advertised-host, {ENV_PREFIX}ADVERTISED_HOST) to the "
                          f"name or address clients reach kproxy at")


def _binds_overlap(a: str, b: str) -> bool:
    """Two listen hosts that one port cannot serve twice: the same host, or a wildcard
    (every interface, both families for '::' on a dual-stack host) and anything."""
    return a.lower() == b.lower() or a in WILDCARD_HOSTS or b in WILDCARD_HOSTS


def _validate_distinct_ports(c: Config) -> None:
    """Every listener kproxy binds needs a port of its own (port 0: the OS picks distinct ones)."""
    binds: list[tuple[str, HostPort]] = [("listen", c.listen)]
    binds += [(key, getattr(c, key)) for key in ("admin_listen", "probe_listen") if getattr(c, key)]
    if c.mode == "gateway" and c.routing == "ports" and c.broker_port_rule == "map":
        binds += [(f"broker_port_map (node {node})", (c.listen[0], port))
                  for node, port in sorted(c.broker_port_map.items())]
    for i, (key, (host, port)) in enumerate(binds):
        for other, (other_host, other_port) in binds[:i]:
            if port != 0 and port == other_port and _binds_overlap(host, other_host):
                raise ConfigError(f"{key}: {show_address(host, port)} overlaps {other} "
                                  f"({show_address(other_host, other_port)}); each listener needs a port of its own")


def _validate_proxy_protocol(c: Config) -> None:
    if c.proxy_protocol not in PROXY_PROTOCOLS:
        raise ConfigError(f"proxy_protocol: must be one of {', '.join(PROXY_PROTOCOLS)}, "
                          f"got {c.proxy_protocol!r}")
    default = tuple(ipaddress.ip_network(n) for n in DEFAULT_PROXY_PROTOCOL_TRUSTED)
    if c.proxy_protocol == "off" and c.proxy_protocol_trusted_cidrs != default:
        raise ConfigError("proxy_protocol_trusted_cidrs: only used with proxy_protocol = v1, v2 or any")


def _validate_workers(c: Config) -> None:
    """Every worker binds the same ports, so they must be known before any worker starts."""
    if not 1 <= c.workers <= MAX_WORKERS:
        raise ConfigError(f"workers: must be 1-{MAX_WORKERS}, got {c.workers}")
    if c.workers == 1:
        return
    if c.listen[1] == 0:
        raise ConfigError("listen: with workers > 1 every worker binds the same port, so it must be "
                          "given, not 0 (chosen by the OS)")
    if c.routing == "ports" and c.mode == "gateway":
        if c.port_base == 0:
            raise ConfigError("broker_port_base: with workers > 1 every worker binds the same broker "
                              "ports, so they must be given, not 0 (chosen by the OS)")
        if c.broker_port_rule == "sequential":
            raise ConfigError("broker_port_rule: 'sequential' depends on discovery order, so workers "
                              "would disagree; use offset or map with workers > 1")
    if c.max_connections < c.workers:
        raise ConfigError(f"max_connections: divided among {c.workers} workers, so at least "
                          f"{c.workers}; got {c.max_connections}")
    if c.capture is not None:
        defaults = c.capture
        share = defaults.max_total_bytes // c.workers
        if share < defaults.rotate_bytes * len(defaults.formats):
            raise ConfigError(f"capture.max_total_bytes: divided among {c.workers} workers, each "
                              f"share ({share}) must be at least rotate_bytes x formats "
                              f"({defaults.rotate_bytes * len(defaults.formats)})")


def _validate_ports(c: Config) -> None:
    """The broker_port_* rules (routing = "ports")."""
    if c.broker_port_rule not in PORT_RULES:
        raise ConfigError(f"broker_port_rule: must be one of {', '.join(PORT_RULES)}, "
                          f"got {c.broker_port_rule!r}")
    if c.mode == "sidecar" and c.broker_port_rule == "sequential":
        raise ConfigError("broker_port_rule: 'sequential' depends on discovery order, so sibling "
                          "sidecars would disagree; use offset, map or fixed")
    if c.mode == "gateway" and c.broker_port_rule == "fixed":
        raise ConfigError("broker_port_rule: 'fixed' gives every broker the same port; "
                          "a gateway needs one port per broker")
    if c.broker_port_rule == "map" and not c.broker_port_map:
        raise ConfigError("broker_port_map: required when broker_port_rule is 'map'")
    if c.listen[1] == 0 and c.broker_port_base is None and c.broker_port_rule in ("offset", "sequential"):
        raise ConfigError("broker_port_base: required when the listen port is 0 (chosen by the OS); "
                          "0 lets the OS choose the broker ports too")
    if c.port_base == 0 and c.mode == "sidecar":
        raise ConfigError("broker_port_base: 0 (ports chosen by the OS) would make sibling sidecars "
                          "disagree; give a port")
    if not 0 <= c.port_base <= 65535:
        raise ConfigError(f"broker_port_base: must be 0-65535 (0: chosen by the OS), got {c.port_base}")
    for node, port in c.broker_port_map.items():
        if not 1 <= port <= 65535:
            raise ConfigError(f"broker_port_map: port for node {node} must be 1-65535, got {port}")


def _validate_routing(c: Config) -> None:
    if c.routing not in ROUTINGS:
        raise ConfigError(f"routing: must be one of {', '.join(ROUTINGS)}, got {c.routing!r}")
    if c.routing != "sni":
        for key in ("sni_host_template", "sni_bootstrap_host"):
            if getattr(c, key) is not None:
                raise ConfigError(f"{key}: only used with routing = 'sni'")
        return
    if c.tls_server is None:
        raise ConfigError("routing: 'sni' reads the server name from the TLS handshake, so it needs "
                          "tls_server (a certificate for every advertised name, or a wildcard)")
    for key in ("sni_host_template", "sni_bootstrap_host"):
        if not getattr(c, key):
            raise ConfigError(f"{key}: required when routing is 'sni' "
                              "(e.g. 'broker-{node_id}.kafka.example.com' and 'bootstrap.kafka.example.com')")
    if c.broker_port_base is not None or c.broker_port_map or c.broker_port_rule != "offset":
        raise ConfigError("broker_port_rule/base/map: not used with routing = 'sni' "
                          "(every node is advertised at the listen port)")
    if c.advertised_host is not None or c.advertised_host_template != "{host}":
        raise ConfigError("advertised_host/advertised_host_template: not used with routing = 'sni' "
                          "(nodes are advertised by sni_host_template)")
    if c.mode == "sidecar" and c.listen[1] == 0:
        raise ConfigError("listen: a sidecar with routing = 'sni' advertises its listen port for "
                          "every node, so sibling sidecars need the same fixed port, not 0")
    from .certs.sni import NodeNames
    try:
        NodeNames.parse(c.sni_host_template, c.sni_bootstrap_host)
    except ValueError as exc:
        key = "sni_bootstrap_host" if str(exc).startswith("bootstrap") else "sni_host_template"
        raise ConfigError(f"{key}: {exc}") from None


def load(path: str | Path | None = None, environ: Mapping[str, str] | None = None,
         overrides: Mapping[str, Any] | None = None) -> Config:
    """defaults < file < env < overrides (flags)."""
    file_layer = read_file(path) if path else {}
    if "admin_token" in file_layer:
        raise ConfigError("admin_token: not in the config file (config files are read by many); "
                          "use admin_token_file or the KPROXY_ADMIN_TOKEN env var")
    env_layer = from_env(os.environ if environ is None else environ)
    return build(file_layer, env_layer, overrides or {})
