"""Every table of ``kproxy analyze`` against a plain-Python computation over the same rows.

The capture is synthetic (a realistic mix, seeded) so every column, group
and error kind occurs; ``test_live.py`` does the same over real traffic.
Tables are read back from the Parquet the job wrote, with pyarrow, not Spark.
"""

from __future__ import annotations

import json

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from kproxy.pipeline import Options, TABLE_NAMES, analyze, job, load_capture
from kproxy.pipeline.synthetic import synthetic_table
from kproxy.pipeline.tables import PERCENTILE_ACCURACY, SHORT_LIVED_CONNECTION_S
from kproxy.protocol import is_removed
from tests.pipeline import reference as ref
from tests.pipeline.conftest import SYNTHETIC_OPTIONS

WINDOW_S = SYNTHETIC_OPTIONS.window_seconds


@pytest.fixture(scope="module")
def analysed(synthetic_analysis, synthetic_capture):
    rows = ds.dataset(str(synthetic_capture), format="parquet").to_table().to_pylist()
    return synthetic_analysis, rows


def table(result, name):
    return pq.read_table(result.tables[name]).to_pylist()


def test_every_table_and_summary_written(analysed):
    result, rows = analysed
    assert set(result.tables) == set(TABLE_NAMES)
    summary = json.load(open(f"{result.out}/summary.json"))
    assert summary == result.summary
    assert summary["pairs"] == len(rows)
    assert summary["client_ids"] == len({r["client_id"] for r in rows})
    assert summary["proxies"] == sorted({r["proxy_instance"] for r in rows})
    assert summary["connections"] == len({ref.conn_key(r) for r in rows})
    times = sorted(ref.utc(r["time"]) for r in rows)
    assert summary["span_seconds"] == pytest.approx((times[-1] - times[0]).total_seconds())
    assert summary["first_time"] == times[0].isoformat().replace("+00:00", "Z")


def test_api_latency_matches(analysed):
    result, rows = analysed
    expected = ref.api_latency(rows)
    got = {(r["api_name"], r["api_key"], r["api_version"]): r for r in table(result, "api_latency")}
    assert set(got) == set(expected)
    for key, e in expected.items():
        g = got[key]
        for column in ("requests", "answered", "long_polls", "request_bytes", "response_bytes",
                       "error_pairs", "throttled"):
            assert g[column] == e[column], (key, column)
        assert g["latency_max_ms"] == (max(e["latencies"]) if e["latencies"] else None)
        for p, column in ((0.5, "latency_p50_ms"), (0.95, "latency_p95_ms"), (0.99, "latency_p99_ms")):
            ref.assert_percentile(e["latencies"], p, g[column], PERCENTILE_ACCURACY)
        ref.assert_percentile(e["long_poll_latencies"], 0.99, g["long_poll_p99_ms"], PERCENTILE_ACCURACY)
        ref.assert_percentile(e["throttles"], 0.5, g["throttle_p50_ms"], PERCENTILE_ACCURACY)
    fetch = [g for k, g in got.items() if k[0] == "Fetch"][0]
    assert fetch["long_polls"] > 0 and fetch["latency_p99_ms"] < fetch["long_poll_p50_ms"]


def test_api_errors_match(analysed):
    result, rows = analysed
    got = {(r["api_name"], r["api_version"], r["error"]): r["pairs"] for r in table(result, "api_errors")}
    assert got == dict(ref.api_errors(rows)) and got


def test_series_match(analysed):
    result, rows = analysed
    expected = ref.series(rows, WINDOW_S)
    got = {(ref.utc(r["window_start"]), r["api_name"]): r for r in table(result, "series")}
    assert set(got) == set(expected)
    for key, e in expected.items():
        assert got[key]["requests"] == e["requests"]
        assert got[key]["error_pairs"] == e["error_pairs"]
        assert got[key]["request_bytes"] == e["request_bytes"]
        assert got[key]["rate_per_s"] == pytest.approx(e["requests"] / WINDOW_S)
        ref.assert_percentile(e["latencies"], 0.99, got[key]["latency_p99_ms"], PERCENTILE_ACCURACY)


def test_anomalies_find_the_latency_spike(analysed):
    """The synthetic capture hides a 40x Produce latency spike at 70 % of its span."""
    result, rows = analysed
    found = [a for a in table(result, "anomalies") if a["metric"] == "latency_p99_ms"]
    assert any(a["api_name"] == "Produce" for a in found)
    spike = max((a for a in found if a["api_name"] == "Produce"), key=lambda a: a["score"])
    times = sorted(ref.utc(r["time"]) for r in rows)
    at = (ref.utc(spike["window_start"]) - times[0]).total_seconds() / (times[-1] - times[0]).total_seconds()
    assert 0.6 < at < 0.75
    assert spike["value"] > 2 * spike["baseline"] and "baseline" in spike["evidence"]


def test_clients_match(analysed):
    result, rows = analysed
    expected = ref.clients(rows)
    got = {(r["client_id"], r["client_host"]): r for r in table(result, "clients")}
    assert set(got) == set(expected)
    for key, e in expected.items():
        g = got[key]
        assert g["requests"] == e["requests"]
        assert g["connections"] == len(e["connections"])
        assert g["records_produced"] == e["records_produced"]
        assert g["records_fetched"] == e["records_fetched"]
        assert g["error_pairs"] == e["error_pairs"]
        assert g["request_bytes"] == e["request_bytes"]
        assert set(g["api_versions"]) == e["api_versions"]


def test_instances_match(analysed):
    result, rows = analysed
    expected = ref.instances(rows)
    got = {r["proxy_instance"]: r for r in table(result, "instances")}
    assert set(got) == set(expected) and len(got) > 1
    for name, e in expected.items():
        g = got[name]
        assert (g["requests"], g["connections"], g["clients"], g["error_pairs"], g["request_bytes"]) == \
            (e["requests"], len(e["connections"]), len(e["clients"]), e["error_pairs"], e["request_bytes"])
        ref.assert_percentile(e["latencies"], 0.99, g["latency_p99_ms"], PERCENTILE_ACCURACY)


def test_client_inventory_and_upgrade_readiness(analysed):
    result, rows = analysed
    inventory = table(result, "client_inventory")
    per_software = {}
    for r in rows:
        name = r["client_software_name"] or "unknown"
        per_software.setdefault(name, set()).add(ref.conn_key(r))
    got = {}
    for r in inventory:
        got[r["client_software_name"]] = got.get(r["client_software_name"], 0) + r["connections"]
    assert got == {name: len(conns) for name, conns in per_software.items()}

    expected = ref.removed_pairs(rows, is_removed)
    readiness = table(result, "upgrade_readiness")
    assert {(r["client_id"], r["api_name"], r["api_version"]): r["requests"] for r in readiness} == dict(expected)
    assert expected and all(r["removed_versions"].startswith("v") for r in readiness)


def test_topics_match(analysed):
    result, rows = analysed
    expected = ref.topic_clients(rows)
    flows = table(result, "topic_clients")
    got = {}
    for r in flows:
        got[(r["topic"], r["role"], r["client_id"], "records")] = r["records"]
        got[(r["topic"], r["role"], r["client_id"], "bytes")] = r["bytes"]
        got[(r["topic"], r["role"], r["client_id"], "rejected_records")] = r["rejected_records"]
    assert got == dict(expected)
    topics = {r["topic"]: r for r in table(result, "topics")}
    for name, t in topics.items():
        assert t["produced_records"] == sum(v for k, v in expected.items()
                                            if k[0] == name and k[1] == "producer" and k[3] == "records")
        assert set(t["producers"]) == {k[2] for k in expected if k[0] == name and k[1] == "producer"}
        assert t["fetched_bytes"] == sum(v for k, v in expected.items()
                                         if k[0] == name and k[1] == "consumer" and k[3] == "bytes")
        assert set(t["consumers"]) == {k[2] for k in expected if k[0] == name and k[1] == "consumer"}
        assert t["pairs"] == sum(name in r["topics"] for r in rows)
    assert set(topics) == {name for r in rows for name in r["topics"] or ()}


def test_groups_and_rebalances_match(analysed):
    result, rows = analysed
    expected = ref.generations(rows)
    got = {(r["group_id"], r["generation"]): r for r in table(result, "rebalances")
           if r["protocol"] == "classic"}
    assert set(got) == set(expected)
    for key, (started, completed) in expected.items():
        assert ref.utc(got[key]["started"]) == started
        assert ref.utc(got[key]["completed"]) == completed
    groups = {r["group_id"]: r for r in table(result, "groups")}
    for group in {g for g, _ in expected}:
        classic = sum(1 for g, _ in expected if g == group)
        consumer = len({(r["generation"]) for r in rows if r["group_id"] == group
                        and r["api_name"] == "ConsumerGroupHeartbeat" and r["outcome"] == "response"
                        and not r["error_count"] and (r["generation"] or 0) > 0})
        assert groups[group]["rebalances"] == classic + consumer
        assert groups[group]["members_seen"] == len({r["member_id"] for r in rows
                                                     if r["group_id"] == group and r["member_id"]})
    # The other tables' figures per group, as ``groups`` gathers them.
    members = table(result, "group_members")
    rejoins = table(result, "group_errors")
    assert set(groups) == {r["group_id"] for r in rows if r["group_id"]}
    for group, g in groups.items():
        mine = [r for r in rows if r["group_id"] == group]
        assert g["commits"] == sum(r["api_name"] in ("OffsetCommit", "TxnOffsetCommit") for r in mine)
        assert sorted(g["client_ids"]) == sorted({r["client_id"] for r in mine if r["client_id"] is not None})
        assert (ref.utc(g["first_seen"]), ref.utc(g["last_seen"])) == (
            min(ref.utc(r["time"]) for r in mine), max(ref.utc(r["time"]) for r in mine))
        assert g["members_peak"] == max((m["members"] for m in members if m["group_id"] == group), default=0)
        assert g["rejoin_errors"] == sum(e["pairs"] for e in rejoins if e["group_id"] == group)


def test_slowest_pairs_are_the_slowest(analysed):
    result, rows = analysed
    slowest = table(result, "slowest")
    candidates = sorted((r["latency_ms"] for r in rows
                         if r["latency_ms"] is not None and not ref.is_long_poll(r)), reverse=True)
    assert [r["latency_ms"] for r in slowest] == candidates[:SYNTHETIC_OPTIONS.top]


def test_connection_churn_matches(analysed):
    result, rows = analysed
    conns = ref.connections(rows)
    got = {(r["client_id"], r["client_host"], r["proxy_instance"]): r for r in table(result, "connections")}
    per_client = {}
    for key, (client_id, opened, last, _) in conns.items():
        host = next(r["client_host"] for r in rows if ref.conn_key(r) == key)
        entry = per_client.setdefault((client_id, host, key[0]), [0, 0, 0.0])
        lifetime = (last - opened).total_seconds()
        entry[0] += 1
        entry[1] += lifetime < SHORT_LIVED_CONNECTION_S
        entry[2] = max(entry[2], lifetime)
    assert set(got) == set(per_client)
    for key, (count, short, longest) in per_client.items():
        assert got[key]["connections"] == count
        assert got[key]["short_lived"] == short
        assert got[key]["lifetime_max_s"] == pytest.approx(longest, abs=1e-6)


def test_since_until_select_a_time_range(spark, synthetic_capture):
    """The range is applied where the capture is read (``load_capture``), before any table: the
    pairs every table then sees. (A whole job on the range would add ten seconds, not proof.)"""
    rows = ds.dataset(str(synthetic_capture), format="parquet").to_table().to_pylist()
    times = sorted(ref.utc(r["time"]) for r in rows)
    since, until = times[len(times) // 4], times[len(times) // 2]
    inputs, pairs = load_capture(spark, [str(synthetic_capture)], since=since, until=until)
    kept = [ref.utc(t) for (t,) in pairs.select("time").collect()]
    assert sorted(kept) == [t for t in times if since <= t < until]
    assert len(inputs.files) + inputs.pruned == 4          # a file left out by --since is counted


def test_unreadable_jsonl_lines_are_left_out_and_counted(spark, tmp_path):
    """A JSONL capture cut short (a crash mid-line) still analyses; the broken line is counted."""
    rows = synthetic_table(300, seed=3).to_pylist()
    path = tmp_path / "kproxy-capture-20261123T120000-000001.jsonl"
    with open(path, "w") as f:
        for r in rows:
            r = {k: (v.isoformat().replace("+00:00", "Z") if hasattr(v, "isoformat") else v) for k, v in r.items()}
            f.write(json.dumps(r) + "\n")
        f.write('{"capture_version": 2, "time": "2026-11-23T12:')          # the crash
    result = analyze(spark, [str(tmp_path)], str(tmp_path / "out"), Options(report=False))
    assert result.summary["unreadable_rows"] == 1
    assert result.summary["pairs"] == len(rows)
    assert sum(r["requests"] for r in table(result, "api_latency")) == len(rows)


def test_tables_read_per_table_equal_the_shared_cache(analysed, spark, synthetic_capture, tmp_path, monkeypatch):
    """The small capture above was analysed from pairs cached in memory; read from the
    files by each table, or rewritten once into large row groups (as larger captures are),
    every table comes out the same."""
    from kproxy.pipeline import scan
    result, _ = analysed
    assert scan.where_kept(scan_inputs(synthetic_capture)) is scan.Kept.MEMORY
    monkeypatch.setattr(scan, "MEMORY_SCAN_MAX_PAIRS", 0)
    # ... and compiled, with the session's shuffle partitions, as larger captures run: the
    # first run's queries were interpreted (job.SMALL_CAPTURE_SQL_SETTINGS).
    monkeypatch.setattr(job, "SMALL_CAPTURE_MAX_PAIRS", 0)
    for rows_per_group, kept in ((0, scan.Kept.FILES), (10**9, scan.Kept.COMPACTED)):
        monkeypatch.setattr(scan, "COMPACT_BELOW_ROWS_PER_GROUP", rows_per_group)
        assert scan.where_kept(scan_inputs(synthetic_capture)) is kept
        out = tmp_path / kept.name
        again = analyze(spark, [str(synthetic_capture)], str(out),
                        Options(window_seconds=WINDOW_S, top=15, report=False))
        for name in TABLE_NAMES:
            assert table(again, name) == table(result, name), (kept, name)
        assert spark.sparkContext._jsc.sc().getPersistentRDDs().isEmpty()  # the cache was released
    # The small capture's settings held for its run only (the session outlives it).
    assert spark.conf.get("spark.sql.codegen.factoryMode", None) is None
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"


def scan_inputs(capture):
    from kproxy.pipeline.source import resolve_inputs
    return resolve_inputs([str(capture)])
