"""The pipeline's questions answered again in plain Python over the same rows.

Independent of Spark and of ``kproxy.pipeline.tables``: written from the
documented meaning of each table, so the two implementations check each
other. ``rows`` are capture rows as dicts (pyarrow ``to_pylist``).
"""

from __future__ import annotations

import bisect
import datetime as dt
import math
from collections import Counter, defaultdict

FETCHES = ("Fetch", "ShareFetch")


def utc(value):
    """Datetimes compared as aware UTC (Parquet readers differ on naive vs aware)."""
    if value is None:
        return None
    return value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value.astimezone(dt.timezone.utc)


def is_long_poll(r) -> bool:
    return r["outcome"] == "response" and r["api_name"] in FETCHES and not (r["record_count"] or 0)


def conn_key(r):
    return (r["proxy_instance"], utc(r["connection_start"]), r["connection_id"])


def end_time(r):
    return utc(r["time"]) + dt.timedelta(microseconds=int((r["latency_ms"] or 0.0) * 1000))


def assert_percentile(values, p, got, accuracy):
    """``got`` is one of ``values`` and its rank is within Spark's bound n/accuracy of p*n."""
    if not values:
        assert got is None
        return
    ordered = sorted(values)
    n = len(ordered)
    assert got in ordered, (got, p)
    low = bisect.bisect_left(ordered, got) + 1           # ranks (1-based) that hold this value
    high = bisect.bisect_right(ordered, got)
    target = p * n
    slack = math.ceil(n / accuracy) + 1
    assert low - slack <= target <= high + slack, (p, got, low, high, target, n)


def stored_produce(r) -> bool:
    """A Produce the broker kept: no error in its answer and not left unanswered."""
    return r["api_name"] == "Produce" and not r["error_count"] and r["outcome"] != "unanswered"


def api_latency(rows):
    out = {}
    for r in rows:
        k = (r["api_name"], r["api_key"], r["api_version"])
        a = out.setdefault(k, dict(requests=0, answered=0, long_polls=0, request_bytes=0,
                                   response_bytes=0, error_pairs=0, throttled=0,
                                   latencies=[], long_poll_latencies=[], throttles=[]))
        a["requests"] += 1
        a["answered"] += r["outcome"] == "response"
        a["request_bytes"] += r["request_size"]
        a["response_bytes"] += r["response_size"] or 0
        a["error_pairs"] += r["error_count"] > 0
        if (r["throttle_ms"] or 0) > 0:
            a["throttled"] += 1
            a["throttles"].append(r["throttle_ms"])
        if r["latency_ms"] is not None:
            if is_long_poll(r):
                a["long_polls"] += 1
                a["long_poll_latencies"].append(r["latency_ms"])
            else:
                a["latencies"].append(r["latency_ms"])
    return out


def api_errors(rows):
    counts = Counter()
    for r in rows:
        if r["error_count"] > 0:
            for e in r["errors"]:
                counts[(r["api_name"], r["api_version"], e)] += 1
    return counts


def series(rows, window_seconds):
    out = defaultdict(lambda: dict(requests=0, error_pairs=0, latencies=[], request_bytes=0))
    for r in rows:
        t = utc(r["time"])
        start = dt.datetime.fromtimestamp(int(t.timestamp()) // window_seconds * window_seconds,
                                          dt.timezone.utc)
        s = out[(start, r["api_name"])]
        s["requests"] += 1
        s["error_pairs"] += r["error_count"] > 0
        s["request_bytes"] += r["request_size"]
        if r["latency_ms"] is not None and not is_long_poll(r):
            s["latencies"].append(r["latency_ms"])
    return out


def clients(rows):
    out = {}
    for r in rows:
        c = out.setdefault((r["client_id"], r["client_host"]), dict(
            requests=0, connections=set(), records_produced=0, records_fetched=0, error_pairs=0,
            api_versions=set(), request_bytes=0))
        c["requests"] += 1
        c["connections"].add(conn_key(r))
        c["request_bytes"] += r["request_size"]
        c["error_pairs"] += r["error_count"] > 0
        c["api_versions"].add(f"{r['api_name']} v{r['api_version']}")
        if stored_produce(r):
            c["records_produced"] += r["record_count"] or 0
        elif r["api_name"] in FETCHES:
            c["records_fetched"] += r["record_count"] or 0
    return out


def topic_clients(rows):
    out = Counter()
    for r in rows:
        role = "producer" if r["api_name"] == "Produce" else "consumer" if r["api_name"] in FETCHES else None
        if role is None or r["topic_records"] is None:
            continue
        kept = role == "consumer" or stored_produce(r)
        for t in r["topic_records"]:
            out[(t["topic"], role, r["client_id"], "records")] += t["record_count"] if kept else 0
            out[(t["topic"], role, r["client_id"], "bytes")] += t["record_bytes"] if kept else 0
            out[(t["topic"], role, r["client_id"], "rejected_records")] += 0 if kept else t["record_count"]
    return out


def generations(rows):
    """Classic groups: {(group, generation): (first JoinGroup time, last SyncGroup answer time)}."""
    joins, syncs = {}, {}
    for r in rows:
        if r["group_id"] in (None, "") or r["outcome"] != "response" or r["error_count"]:
            continue
        g = r["generation"]
        if g is None or g < 0:
            continue
        key = (r["group_id"], g)
        if r["api_name"] == "JoinGroup":
            joins[key] = min(joins.get(key, utc(r["time"])), utc(r["time"]))
        elif r["api_name"] == "SyncGroup":
            syncs[key] = max(syncs.get(key, end_time(r)), end_time(r))
    return {k: (v, syncs.get(k)) for k, v in joins.items()}


def removed_pairs(rows, is_removed):
    return Counter((r["client_id"], r["api_name"], r["api_version"]) for r in rows
                   if is_removed(r["api_key"], r["api_version"]))


def connections(rows):
    """{conn_key: (client_id, opened, last active, requests)}."""
    out = {}
    for r in rows:
        k = conn_key(r)
        opened = utc(r["connection_start"]) or utc(r["time"])
        c = out.get(k)
        if c is None:
            out[k] = [r["client_id"], opened, end_time(r), 1]
        else:
            c[0] = max(c[0], r["client_id"]) if c[0] is not None and r["client_id"] is not None else (c[0] or r["client_id"])
            c[1] = min(c[1], opened)
            c[2] = max(c[2], end_time(r))
            c[3] += 1
    return out


def instances(rows):
    """Per proxy_instance: pairs, connections, clients, error pairs, non-long-poll latencies, bytes."""
    out = {}
    for r in rows:
        e = out.setdefault(r["proxy_instance"], {"requests": 0, "connections": set(), "clients": set(),
                                                 "error_pairs": 0, "latencies": [], "request_bytes": 0})
        e["requests"] += 1
        e["connections"].add(conn_key(r))
        e["clients"].add((r["client_id"], r["client_host"]))
        e["error_pairs"] += bool(r["error_count"])
        e["request_bytes"] += r["request_size"]
        if r["latency_ms"] is not None and not is_long_poll(r):
            e["latencies"].append(r["latency_ms"])
    return out
