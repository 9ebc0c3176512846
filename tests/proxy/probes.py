"""An HTTP GET as the probe tests make it: (status, text) within the time a probe's caller waits."""

from __future__ import annotations

from tests.proxy.harness import http_status

PROBE_ANSWER_TIMEOUT_S = 10.0


def get(url: str) -> tuple[int, str]:
    return http_status(url, PROBE_ANSWER_TIMEOUT_S)
