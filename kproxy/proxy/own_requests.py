"""Requests kproxy sends to the brokers on its own behalf (not a client's, not relayed).

Two questions kproxy asks the cluster itself, each on a short connection of its
own (TLS as configured for upstreams), to the configured upstreams in turn:

- where are the brokers? (SNI routing) A client may name a node kproxy has not yet
  seen in any response; a Metadata request for no topics answers it.
  ``learn_brokers`` asks at most once per ``DISCOVERY_MIN_INTERVAL_S`` however many
  clients wait, and logs failures within a budget.
- does a broker answer? (``/readyz``) An ApiVersions round trip, which a stopped or
  wedged broker fails even when something still accepts TCP on its port.
  ``upstream_ready`` shares one check between concurrent probes and caches it.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from typing import Callable

from ..config import Config
from ..protocol.api_keys import ApiKey
from ..protocol import DecodeError, Request, decode_response, encode_request, new_body
from .log_budget import LogBudget
from ..readiness import READINESS_CACHE_S, READINESS_TIMEOUT_S
from .relay import HostPort
from .rewrite import node_addresses

log = logging.getLogger("kproxy.server")

OWN_CLIENT_ID = "kproxy"           # client_id of the requests kproxy itself sends upstream
# Discovery: a Metadata request for no topics at a version every Kafka from 2.4 to 4.x
# answers (4.0 removed only v0-3), at most once per interval however many clients wait.
DISCOVERY_METADATA_VERSION = 9
DISCOVERY_MIN_INTERVAL_S = 1.0
# A failed discovery is logged once per interval, with how many failures were not.
DISCOVERY_LOG_INTERVAL_S = 60.0
# /readyz asks an upstream for ApiVersions (v0: every broker answers it, before any SASL),
# within readiness.READINESS_TIMEOUT_S, and keeps the answer readiness.READINESS_CACHE_S.
READINESS_API_VERSIONS_VERSION = 0
# What a failed request of kproxy's own can raise: the broker is unreachable, slow,
# hung up, speaks TLS differently, or answered something that does not decode.
_ASK_FAILURES = (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ssl.SSLError,
                 DecodeError, ValueError)

# (node id, upstream host, upstream port) -> None: what a discovered broker is handed to.
Learn = Callable[[int, str, int], object]


def _failure(host: str, port: int, exc: BaseException) -> str:
    return f"{host}:{port}: {str(exc) or type(exc).__name__}"      # timeouts have no text


class OwnRequests:
    """kproxy's own questions to its upstreams. ``candidates()`` lists the upstreams to
    try, in the order to try them (the proxy's bootstrap rotation)."""

    def __init__(self, config: Config, candidates: Callable[[], list[HostPort]],
                 client_ssl: Callable[[], ssl.SSLContext | None]):
        self.config = config
        self.candidates = candidates
        self.client_ssl = client_ssl
        self._discovery_lock = asyncio.Lock()
        self._discovered_at = float("-inf")
        self._discovery_log = LogBudget(DISCOVERY_LOG_INTERVAL_S, 1)
        self._readiness: tuple[float, tuple[bool, str]] | None = None   # (when, result)
        self._readiness_check: asyncio.Future | None = None

    async def ask(self, host: str, port: int, api_key: int, version: int, body):
        """One request of kproxy's own to an upstream, on a connection of its own (TLS as
        configured), and its decoded response."""
        c = self.config
        kwargs = {}
        context = self.client_ssl()               # the newest (TLS files are reloaded)
        if context is not None:
            kwargs = {"ssl": context,
                      "server_hostname": host if c.tls_client.check_hostname else None}
        reader, writer = await asyncio.open_connection(host, port, **kwargs)
        try:
            frame = encode_request(Request(api_key, version, 1, OWN_CLIENT_ID, body))
            writer.write(len(frame).to_bytes(4, "big") + frame)
            size = int.from_bytes(await reader.readexactly(4), "big", signed=True)
            if not 0 < size <= c.max_frame_size:
                raise ValueError(f"a response of {size} bytes")
            return decode_response(await reader.readexactly(size), api_key, version)
        finally:
            writer.close()

    # ------------------------------------------------------------ discovery

    def would_learn(self) -> bool:
        """Whether ``learn_brokers`` called now would ask the cluster (or wait for an asking
        under way), rather than return at once: nothing asked within the interval."""
        return (self._discovery_lock.locked()
                or time.monotonic() - self._discovered_at >= DISCOVERY_MIN_INTERVAL_S)

    async def learn_brokers(self, learn: Learn) -> None:
        """Hand every broker's address (from a Metadata request of kproxy's own) to ``learn``."""
        async with self._discovery_lock:
            if time.monotonic() - self._discovered_at < DISCOVERY_MIN_INTERVAL_S:
                return
            self._discovered_at = time.monotonic()
            errors = []
            for host, port in self.candidates():
                try:
                    brokers = await asyncio.wait_for(self._metadata_brokers(host, port),
                                                     self.config.connect_timeout)
                except _ASK_FAILURES as exc:
                    errors.append(_failure(host, port, exc))
                    continue
                for node_id, broker_host, broker_port in brokers:
                    learn(node_id, broker_host, broker_port)
                return
            unlogged = self._discovery_log.admit("discovery")
            if unlogged is not None:
                log.warning("cannot ask the cluster where its brokers are (%s); a client naming a "
                            "node kproxy has not seen in a response is refused until it has (not "
                            "logged again within %gs%s)", "; ".join(errors), DISCOVERY_LOG_INTERVAL_S,
                            f"; {unlogged} earlier failures were not logged" if unlogged else "")

    async def _metadata_brokers(self, host: str, port: int) -> list[tuple[int, str, int]]:
        version = DISCOVERY_METADATA_VERSION
        response = await self.ask(host, port, ApiKey.METADATA, version,
                                  new_body("request", ApiKey.METADATA, version, topics=[]))
        return node_addresses(ApiKey.METADATA, version, response.body)

    # ------------------------------------------------------------ readiness

    async def upstream_ready(self) -> tuple[bool, str]:
        """Whether a broker answers (for /readyz): an ApiVersions round trip to the first
        upstream that answers. Probes share one check at a time, and its result for
        ``READINESS_CACHE_S``: a probe storm costs the brokers nothing extra."""
        cached = self.cached_readiness()
        if cached is not None:
            return cached
        if self._readiness_check is None or self._readiness_check.done():
            self._readiness_check = asyncio.ensure_future(self._check_upstreams())
        # Shielded: a probe that gives up does not cancel the check the others await.
        return await asyncio.shield(self._readiness_check)

    def cached_readiness(self) -> tuple[bool, str] | None:
        """The last check's result while it is fresh, else None."""
        readiness = self._readiness
        if readiness is not None and time.monotonic() - readiness[0] < READINESS_CACHE_S:
            return readiness[1]
        return None

    @property
    def last_readiness(self) -> tuple[float, tuple[bool, str]] | None:
        """(when, result) of the last check however old (``time.monotonic()``), or None:
        what the event loop posts to the probe board."""
        return self._readiness

    async def _check_upstreams(self) -> tuple[bool, str]:
        errors = []
        version = READINESS_API_VERSIONS_VERSION
        for host, port in self.candidates():
            try:
                response = await asyncio.wait_for(
                    self.ask(host, port, ApiKey.API_VERSIONS, version,
                             new_body("request", ApiKey.API_VERSIONS, version)),
                    READINESS_TIMEOUT_S)
            except _ASK_FAILURES as exc:
                errors.append(_failure(host, port, exc))
                continue
            code = response.body.error_code
            if code != 0:
                errors.append(f"{host}:{port}: ApiVersions answered with error {code}")
                continue
            result = True, f"{host}:{port} answers ApiVersions"
            break
        else:
            result = False, "; ".join(errors) or "no upstream address known"
        self._readiness = (time.monotonic(), result)
        return result
