"""The audit trail when the broker never answers: the change may have happened, so it is
still written, as ``unanswered``, once the connection closes (a wedged broker: ``silent_port``;
the client's close is passed on and kproxy waits for the broker, so here the connection ends
when kproxy shuts down, which also shows that stopping writes what the connections left).
"""

from __future__ import annotations

import json
import time

from kproxy.protocol import API_KEYS
from tests.proxy.harness import ProxyThread, silent_port
from tests.proxy.wire import CLIENT_ID, RawClient


def test_a_change_the_broker_never_answers_is_audited_as_unanswered(tmp_path):
    path = tmp_path / "audit.jsonl"
    with silent_port() as broker, ProxyThread(upstream=f"{broker[0]}:{broker[1]}", shutdown_timeout=0.5,
                                              audit_file=str(path)) as proxy:
        client = RawClient(proxy.bootstrap)
        client.send_request(API_KEYS["DeleteGroups"], 2, groups_names=["payments", "billing"])
        client.send_request(API_KEYS["Heartbeat"], 4, group_id="payments", generation_id=1,
                            member_id="m", group_instance_id=None)
        time.sleep(0.5)                       # kproxy has read both (nothing will answer them)
        client.sock.close()
        assert path.read_text() == ""         # still open: it may yet be answered
        audit = proxy.runtime.audit
    assert audit.events == {("DeleteGroups", "unanswered"): 1}
    (event,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert (event["api"], event["api_version"], event["outcome"]) == ("DeleteGroups", 2, "unanswered")
    assert event["request"] == {"groups_names": ["payments", "billing"]}
    assert (event["results"], event["latency_ms"], event["principal"]) == ([], None, "ANONYMOUS")
    assert event["client_id"] == CLIENT_ID and event["client_address"] == f"127.0.0.1:{client.port}"
