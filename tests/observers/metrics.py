"""What the metrics tests share: simulated clients fed to the observer, and scrapes of a running kproxy's /metrics."""

from __future__ import annotations

import itertools
import time
import urllib.request
import uuid

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kproxy.observers.contract import CLIENT_CLOSED
from kproxy.protocol import API_KEYS, Request, Response, encode_request, encode_response, new_body
from kproxy.protocol.connection import Connection
from kproxy.observers.contract import ConnectionInfo
from tests.protocol.frames import framed

_ids = itertools.count(1)


class Clock:
    now = 100.0

    def __call__(self):
        return self.now


class Client:
    """One client connection seen by the metrics observer."""

    def __init__(self, metrics, clock, listener="bootstrap"):
        self.metrics, self.clock = metrics, clock
        self.conn = Connection(clock=clock)
        self.info = ConnectionInfo(id=next(_ids), client=("127.0.0.1", 5000), listener=listener,
                                   upstream=("127.0.0.1", 9092), node_id=None)
        self.correlation = itertools.count()
        metrics.connection_opened(self.info)

    def send(self, api, version, **fields):
        api_key = API_KEYS[api]
        self.pending = (api_key, version, next(self.correlation))
        frame = encode_request(Request(api_key, version, self.pending[2], "app",
                                       new_body("request", api_key, version, **fields)))
        self.metrics(self.info, self.conn.receive_client(framed(frame)))

    def answer(self, wait=0.0, **fields):
        self.clock.now += wait
        api_key, version, correlation_id = self.pending
        frame = encode_response(Response(correlation_id, new_body("response", api_key, version, **fields)),
                                api_key, version)
        self.metrics(self.info, self.conn.receive_broker(framed(frame)))

    def call(self, api, version, request=None, response=None, wait=0.0):
        self.send(api, version, **(request or {}))
        self.answer(wait, **(response or {}))

    def close(self):
        self.metrics.connection_closed(self.info, reason=CLIENT_CLOSED)


def samples(m, name):
    """{labels tuple: value} of one metric family's samples named exactly ``name``."""
    text = generate_latest(m.registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def value(m, name, **labels):
    return m.registry.get_sample_value(name, labels) or 0.0


# ---------------------------------------------------------------- a running kproxy's /metrics

def scrape(proxy) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(proxy.admin_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def sample(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


WAIT_S = 60.0


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def scrape_until(check, what: str, proxy=None, timeout: float = WAIT_S, poll=None):
    """Scrape until ``check(samples)`` holds; ``poll()`` keeps clients alive in between."""
    deadline = time.monotonic() + timeout
    while True:
        if poll is not None:
            poll()
        m = scrape(proxy)
        if check(m):
            return m
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)
