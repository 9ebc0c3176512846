"""The ``telemetry_offer`` table, parsed once: a section of the config (``config.py``) that
the proxy's offer (``proxy/telemetry_offer.py``) acts on.

Kept apart from the offer so that the config, below the proxy, parses it without importing
the proxy.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Mapping

DEFAULT_METRICS = ("org.apache.kafka.producer.", "org.apache.kafka.consumer.")
# Kafka's ClientMetrics interval.ms default is 5 minutes; a minute shows a latency split
# while it is still news. Kafka accepts 100 ms to 1 hour.
DEFAULT_PUSH_INTERVAL_MS = 60_000
PUSH_INTERVAL_RANGE_MS = (100, 3_600_000)


class TelemetryOfferError(ValueError):
    pass


@dataclass(frozen=True)
class TelemetryOffer:
    """The ``telemetry_offer`` table, parsed once."""
    enabled: bool = False
    metrics: tuple[str, ...] = DEFAULT_METRICS
    push_interval_ms: int = DEFAULT_PUSH_INTERVAL_MS
    clients: tuple[str, ...] = ("*",)

    @classmethod
    def from_mapping(cls, table: Mapping[str, Any]) -> "TelemetryOffer":
        unknown = set(table) - {"enabled", "metrics", "push_interval_ms", "clients"}
        if unknown:
            raise TelemetryOfferError(f"telemetry_offer: unknown setting {sorted(unknown)[0]!r}")
        enabled = table.get("enabled", False)
        if not isinstance(enabled, bool):
            raise TelemetryOfferError("telemetry_offer.enabled: expected true or false")
        interval = table.get("push_interval_ms", DEFAULT_PUSH_INTERVAL_MS)
        if isinstance(interval, bool) or not isinstance(interval, int) \
                or not PUSH_INTERVAL_RANGE_MS[0] <= interval <= PUSH_INTERVAL_RANGE_MS[1]:
            raise TelemetryOfferError(f"telemetry_offer.push_interval_ms: expected {PUSH_INTERVAL_RANGE_MS[0]}"
                                      f"-{PUSH_INTERVAL_RANGE_MS[1]}, got {interval!r}")
        lists = {}
        for key, default in (("metrics", DEFAULT_METRICS), ("clients", ("*",))):
            value = table.get(key, default)
            if isinstance(value, str):
                value = [part.strip() for part in value.split(",") if part.strip()]
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                raise TelemetryOfferError(f"telemetry_offer.{key}: expected a list of strings")
            lists[key] = tuple(value)
        return cls(enabled, lists["metrics"], interval, lists["clients"])

    @property
    def subscription_id(self) -> int:
        """Stable for the same subscription (a client re-asks when it changes)."""
        text = "\0".join((*self.metrics, str(self.push_interval_ms))).encode()
        return zlib.crc32(text) - (1 << 31)
