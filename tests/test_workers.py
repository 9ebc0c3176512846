"""Several workers, the parts without processes: the metrics merge rule, each worker's share
of the limits and of a capture, and the settings refused with workers > 1."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kproxy import config as config_module
from kproxy.config import ConfigError
from kproxy.observers.metrics import ExpositionMerger
from kproxy.observers.capture import CaptureConfig
from kproxy.workers import become_worker, capture_settings, worker_config


def exposition(requests: float, bucket_low: float, bucket_all: float, latency_sum: float,
               connections: float, capture_active: float, cpu: float) -> str:
    return f"""# HELP kproxy_requests_total Requests
# TYPE kproxy_requests_total counter
kproxy_requests_total{{api="Produce"}} {requests}
kproxy_requests_total{{api="Fetch"}} 1.0
# HELP kproxy_request_latency_seconds Latency
# TYPE kproxy_request_latency_seconds histogram
kproxy_request_latency_seconds_bucket{{api="Produce",le="0.001"}} {bucket_low}
kproxy_request_latency_seconds_bucket{{api="Produce",le="+Inf"}} {bucket_all}
kproxy_request_latency_seconds_count{{api="Produce"}} {bucket_all}
kproxy_request_latency_seconds_sum{{api="Produce"}} {latency_sum}
# HELP kproxy_connections_open Open
# TYPE kproxy_connections_open gauge
kproxy_connections_open{{listener="bootstrap"}} {connections}
# HELP kproxy_capture_active Capturing
# TYPE kproxy_capture_active gauge
kproxy_capture_active {capture_active}
# HELP kproxy_build_info Build
# TYPE kproxy_build_info gauge
kproxy_build_info{{version="0.1.0"}} 1.0
# HELP process_cpu_seconds_total CPU
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total {cpu}
"""


def samples(text: bytes) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text.decode()) for s in family.samples}


def test_merge_sums_counts_takes_the_highest_of_facts_and_keeps_process_series_per_worker():
    merged = samples(ExpositionMerger().merge({
        (0, 100): exposition(5, 3, 5, 0.004, 2, 1, 1.5),
        (1, 101): exposition(7, 1, 7, 0.020, 3, 1, 2.5)}))
    produce = (("api", "Produce"),)
    assert merged[("kproxy_requests_total", produce)] == 12
    assert merged[("kproxy_requests_total", (("api", "Fetch"),))] == 2
    assert merged[("kproxy_request_latency_seconds_bucket", (("api", "Produce"), ("le", "0.001")))] == 4
    assert merged[("kproxy_request_latency_seconds_bucket", (("api", "Produce"), ("le", "+Inf")))] == 12
    assert merged[("kproxy_request_latency_seconds_count", produce)] == 12
    assert merged[("kproxy_request_latency_seconds_sum", produce)] == pytest.approx(0.024)
    assert merged[("kproxy_connections_open", (("listener", "bootstrap"),))] == 5
    assert merged[("kproxy_capture_active", ())] == 1
    assert merged[("kproxy_build_info", (("version", "0.1.0"),))] == 1
    assert merged[("process_cpu_seconds_total", (("worker", "0"),))] == 1.5
    assert merged[("process_cpu_seconds_total", (("worker", "1"),))] == 2.5
    assert ("process_cpu_seconds_total", ()) not in merged


def test_a_certificate_expiry_merges_to_the_soonest_any_worker_serves():
    """Each worker reloads its certificate itself: the one still serving the older one
    expires first, and that is what an alert must see."""
    def expiry(server: float, client: float) -> str:
        return ("# HELP kproxy_tls_certificate_expiry_timestamp_seconds Expiry\n"
                "# TYPE kproxy_tls_certificate_expiry_timestamp_seconds gauge\n"
                f'kproxy_tls_certificate_expiry_timestamp_seconds{{side="server"}} {server}\n'
                f'kproxy_tls_certificate_expiry_timestamp_seconds{{side="client"}} {client}\n')
    merged = samples(ExpositionMerger().merge({(0, 100): expiry(2e9, 1.5e9), (1, 101): expiry(1.8e9, 1.9e9)}))
    name = "kproxy_tls_certificate_expiry_timestamp_seconds"
    assert merged[(name, (("side", "server"),))] == 1.8e9
    assert merged[(name, (("side", "client"),))] == 1.5e9


def test_a_replaced_worker_keeps_what_it_counted_so_sums_never_go_back():
    merger = ExpositionMerger()
    old = exposition(7, 1, 7, 0.5, 3, 0, 1.0)
    merger.merge({(0, 100): exposition(5, 3, 5, 0.5, 2, 0, 1.0), (1, 101): old})
    merger.retire((1, 101))                   # worker 1 died; its successor starts from zero
    merged = samples(merger.merge({(0, 100): exposition(6, 3, 6, 0.5, 2, 0, 1.0),
                                   (1, 102): exposition(1, 1, 1, 0.1, 1, 0, 0.1),
                                   (1, 101): old}))      # a scrape in flight at the death: ignored
    assert merged[("kproxy_requests_total", (("api", "Produce"),))] == 6 + 7 + 1
    assert merged[("kproxy_request_latency_seconds_count", (("api", "Produce"),))] == 6 + 7 + 1
    assert merged[("kproxy_connections_open", (("listener", "bootstrap"),))] == 2 + 1   # gauges: now only
    assert merged[("process_cpu_seconds_total", (("worker", "1"),))] == 0.1


def test_a_real_exposition_merges_into_valid_text():
    """kproxy's own registry, twice: the merged text parses, and every counter doubles."""
    from prometheus_client import generate_latest
    from kproxy.observers.metrics import Metrics
    text = generate_latest(Metrics().registry).decode()
    one, two = samples(text.encode()), samples(ExpositionMerger().merge({(0, 1): text, (1, 2): text}))
    assert two[("kproxy_requests_total", (("api", "Produce"),))] == 2 * one[("kproxy_requests_total", (("api", "Produce"),))]
    assert len(two) > len(one)                # process_* and python_* series once per worker


def test_each_worker_gets_its_own_capture_files_and_a_share_of_the_disk_cap():
    defaults = CaptureConfig(directory="/captures", max_total_bytes=1_000_000_000)
    assert capture_settings({"formats": ["parquet"]}, defaults, 1, 4) == {
        "formats": ["parquet"], "prefix": "kproxy-capture-w1", "max_total_bytes": 250_000_000}
    assert capture_settings({"prefix": "audit", "max_total_bytes": 600}, None, 0, 2) == {
        "prefix": "audit-w0", "max_total_bytes": 300}
    assert capture_settings({"max_total_bytes": "lots"}, None, 0, 2)["max_total_bytes"] == "lots"


def test_worker_config_divides_the_limits_and_keeps_the_admin_port_private():
    config = config_module.build({"upstream": "b:9092", "listen": "0.0.0.0:9092", "workers": 3,
                                  "advertised_host": "kproxy.example.com",
                                  "max_connections": 3000})
    mine = worker_config(config, 2, "t" * 32)
    assert mine.max_connections == 1000
    assert mine.admin_listen == ("127.0.0.1", 0)
    assert mine.admin_token == "t" * 32
    assert mine.listen == config.listen and mine.workers == 3
    assert mine.audit.path is None                  # no audit file: only the log lines


def test_each_worker_writes_its_own_audit_file():
    config = config_module.build({"upstream": "b:9092", "listen": "0.0.0.0:9092", "workers": 2,
                                  "advertised_host": "kproxy.example.com",
                                  "audit": {"path": "/var/log/kproxy/audit.jsonl", "keep": 3}})
    assert [worker_config(config, i, "t" * 32).audit.path for i in range(2)] == \
        ["/var/log/kproxy/audit-w0.jsonl", "/var/log/kproxy/audit-w1.jsonl"]
    assert worker_config(config, 1, "t" * 32).audit.keep == 3


@pytest.mark.parametrize("settings, error", [
    ({"workers": 0}, "workers: must be 1-"),
    ({"workers": 2, "listen": "127.0.0.1:0", "broker_port_base": 9100}, "listen: with workers > 1"),
    ({"workers": 2, "broker_port_base": 0}, "broker_port_base: with workers > 1"),
    ({"workers": 2, "broker_port_rule": "sequential"}, "broker_port_rule: 'sequential'"),
    ({"workers": 4, "max_connections": 3}, "max_connections: divided among 4 workers"),
])
def test_settings_workers_cannot_share_are_refused_with_one_line(settings, error):
    with pytest.raises(ConfigError, match=error):
        config_module.build({"upstream": "b:9092", "listen": "127.0.0.1:9092", **settings})


def test_workers_from_the_environment():
    config = config_module.load(environ={"KPROXY_UPSTREAM": "b:9092", "KPROXY_WORKERS": "2"})
    assert config.workers == 2


def test_a_worker_gets_its_share_of_the_buffer_budget_and_connection_ids_apart(monkeypatch):
    from kproxy.proxy import memory, worker_identity
    for name in ("connection_ids", "_worker_processes", "_worker_index"):   # restored after the test
        monkeypatch.setattr(worker_identity, name, getattr(worker_identity, name))
    monkeypatch.setattr(memory, "_budget_shares", 1)
    monkeypatch.setattr(memory, "CONTAINER_MEMORY_LIMIT_FILES", ())
    become_worker(1, 4)
    assert memory.buffer_budget_limit() == memory.DEFAULT_BUFFER_BUDGET // 4
    ids = worker_identity.connection_ids
    assert [next(ids) for _ in range(3)] == [2, 6, 10]            # worker 1 of 4: never 1, 3, 4, 5 ...
    assert worker_identity.id_owner(10, 4) == 1


# A worker's body (``_serve``) with a real Runtime in a fresh interpreter: the pipe reports
# what the garbage collector froze once the worker serves, then stops it as SIGTERM would.
WORKER_SERVES = """
import asyncio, gc, os, signal
from kproxy import config
from kproxy.runtime import Runtime
from kproxy.workers import _serve

class Pipe:
    def __init__(self):
        self.read, self.write = os.pipe()
    def fileno(self):
        return self.read
    def send(self, message):
        print(message[0], gc.get_freeze_count(), flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

runtime = Runtime(config.load(overrides={"upstream": "127.0.0.1:1", "listen": "127.0.0.1:0",
                                         "broker_port_base": 0, "admin_listen": "127.0.0.1:0"}))
asyncio.run(_serve(runtime, Pipe()))
print("stopped", flush=True)
"""


def test_a_worker_freezes_its_start_up_objects_as_a_single_kproxy_does():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", WORKER_SERVES], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    serving, stopped = out.stdout.split("\n")[:2]
    assert serving.split()[0] == "serving" and int(serving.split()[1]) > 10_000    # the schema tables alone
    assert stopped == "stopped"
