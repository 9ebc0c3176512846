"""The failover observer fed a client's pairs as a relay feeds them: who the client is (SASL
user, ApiVersions software), the failover it ends, and the recovery-time histogram."""

from __future__ import annotations

import logging

from kproxy.observers.failover import Failovers
from kproxy.observers.metrics import Metrics
from tests.observers.captures import Link, produce_answer, produce_request, sasl_plain

NOT_LEADER = 6


def software(link, name: str, version: str, corr: int) -> None:
    link.exchange(18, 3, corr, dict(client_software_name=name, client_software_version=version),
                  dict(error_code=0, api_keys=[], throttle_time_ms=0))


def test_a_failover_is_told_with_its_client_and_observed_in_the_histogram(caplog):
    caplog.set_level(logging.INFO, logger="kproxy.failover")
    metrics = Metrics()
    observer = Failovers(on_failover=metrics.failover_recovered)
    old, new = (Link(observer, conn_id=i, node_id=i) for i in (1, 2))
    for link in (old, new):
        software(link, "franz-go", "1.18.0", 1)
        sasl_plain(link, "carol", first_corr=2)
    old.exchange(0, 10, 4, produce_request(partition=3), produce_answer(3, NOT_LEADER, (2, 8)))
    old.exchange(0, 10, 5, produce_request(partition=3), produce_answer(3, NOT_LEADER, (2, 8)))
    assert observer.recent()["failing_now"] == 1
    new.exchange(0, 10, 6, produce_request(partition=3), produce_answer(3))
    (told,) = observer.recent()["failovers"]
    assert (told["client_id"], told["software_name"], told["software_version"], told["principal"]) == \
        ("app-1", "franz-go", "1.18.0", "carol")
    assert (told["old_leader"], told["new_leader"], told["failed_requests"], told["recovered_by"]) == (1, 2, 2, "hint")
    assert observer.recent()["failing_now"] == 0
    counts = {s.labels["software"]: s.value for m in metrics.registry.collect()
              if m.name == "kproxy_failover_recovery_seconds" for s in m.samples if s.name.endswith("_count")}
    assert counts == {"franz-go": 1.0}
    (line,) = [r.getMessage() for r in caplog.records if r.name == "kproxy.failover"]
    assert "'app-1'" in line and "orders-3" in line and "leader 1 -> 2" in line and "by hint" in line
