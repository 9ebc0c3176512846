"""The questions, one function each: a prepared capture DataFrame in, a table out.

Every function takes the frame ``source.prepare`` returns (one row per
request/response pair) and returns a DataFrame; nothing is collected to the
driver and no Python runs per row (Spark SQL functions only), so each table
scales with the cluster. A notebook user calls them directly::

    from kproxy.pipeline import load_capture, tables
    inputs, pairs = load_capture(spark, ["/var/lib/kproxy/capture"])
    tables.api_latency(pairs).show()

Percentiles are ``percentile_approx`` with ``PERCENTILE_ACCURACY``: the value
returned for percentile p has a rank within ``n / PERCENTILE_ACCURACY`` of
``p * n`` among the n values (Spark's guarantee), i.e. at most 0.01 % of the
rows away from the exact percentile.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from ..protocol import schema as kafka_schema
from ..protocol.client_telemetry import NODE_REQUEST_LATENCY_AVG, RECORD_QUEUE_TIME_AVG, REQUEST_LATENCY_AVG

# Shared by the job and the report (which shows what the job collected):
REPORT_ROWS = 200                 # rows of one table the report (and summary) collect, at most
WORST_P99_MIN_REQUESTS = 20       # an API needs this many pairs before its p99 can be "the worst"
PERCENTILE_ACCURACY = 10_000        # Spark's default; rank error <= n / 10,000
# Anomalies: a window is compared with its own API's series. It stands out when it
# exceeds the series' median by ANOMALY_SPREADS robust spreads (1.4826 x median
# absolute deviation, a standard deviation for normal data) AND by ANOMALY_MIN_RATIO
# times the median, so a flat series with a tiny spread does not flag noise.
ANOMALY_SPREADS = 5.0
ANOMALY_MIN_RATIO = 2.0
ANOMALY_MIN_WINDOWS = 5             # fewer windows give no baseline worth comparing with
ANOMALY_MIN_REQUESTS = 20           # a p99 or an error rate of a handful of pairs says little
ANOMALY_MIN_LATENCY_SPREAD_MS = 1.0     # floors for the spread: loopback series can be flat
ANOMALY_MIN_ERROR_RATE_SPREAD = 0.01
MAD_TO_SIGMA = 1.4826
SHORT_LIVED_CONNECTION_S = 10.0     # a connection gone within this is churn, not a session

PRODUCE_APIS = ("Produce",)
FETCH_APIS = ("Fetch", "ShareFetch")
CLASSIC_GROUP_APIS = ("JoinGroup", "SyncGroup", "Heartbeat", "LeaveGroup", "OffsetCommit",
                      "TxnOffsetCommit", "OffsetFetch")
HEARTBEAT_GROUP_APIS = ("ConsumerGroupHeartbeat", "ShareGroupHeartbeat", "StreamsGroupHeartbeat")
# Errors that make a member rejoin (classic) or re-heartbeat from scratch (KIP-848).
REBALANCE_ERRORS = ("REBALANCE_IN_PROGRESS", "UNKNOWN_MEMBER_ID", "ILLEGAL_GENERATION",
                    "MEMBER_ID_REQUIRED", "FENCED_INSTANCE_ID", "UNRELEASED_INSTANCE_ID",
                    "GROUP_MAX_SIZE_REACHED", "FENCED_MEMBER_EPOCH", "STALE_MEMBER_EPOCH",
                    "UNKNOWN_SUBSCRIPTION_ID")
# Not counted: NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE send a member looking for its
# coordinator (a fresh broker answers them while it loads groups), not back into a rebalance.


def _ordered(table: DataFrame, *columns) -> DataFrame:
    """``table`` sorted in a single partition, for ``DataFrame.transform``.

    Tables are aggregates (a row per API, client, window...), small enough for one
    task; a global ``orderBy`` would cost each of them a sampling job first (Spark's
    range partitioning), which for most captures took longer than the sort itself.
    ``coalesce``, not ``repartition``: the table's last aggregation then merges its
    partial results in that one task, instead of a shuffle (a stage, and under
    adaptive execution a job) moving its few rows into one partition.
    """
    return table.coalesce(1).sortWithinPartitions(*columns)


def _count_if(condition) -> F.Column:
    return F.sum(F.when(condition, 1).otherwise(0))


def _distinct(column) -> F.Column:
    """How many distinct non-null values of ``column`` a group holds, beside other aggregates.

    ``countDistinct`` among other aggregates makes Spark copy every input row once per
    distinct column plus once for the rest (its Expand) and aggregate twice; a set per group
    is one pass. The sets here are small (connections of a client or proxy, members of a
    group). Cast to a long, as ``countDistinct`` returns.
    """
    return F.size(F.collect_set(column)).cast("long")


def _stored_produce() -> F.Column:
    """A Produce whose records the broker kept: answered without error, or acks=0 (no answer).

    A Produce answered with an error (NOT_LEADER_OR_FOLLOWER after a leader move, ...)
    is retried by the client, so its records would otherwise count twice.
    """
    return F.col("api_name").isin(*PRODUCE_APIS) & ~F.col("has_error") & (F.col("outcome") != "unanswered")


def _latency():
    """Latency of pairs that were not empty long-polls (those wait by design)."""
    return F.when(~F.col("long_poll"), F.col("latency_ms"))


def _api_version_label() -> F.Column:
    return F.concat(F.col("api_name"), F.lit(" v"), F.col("api_version").cast("string"))


def _seconds_between(later: str, earlier: str) -> F.Column:
    return (F.unix_micros(later) - F.unix_micros(earlier)) / 1e6


# ------------------------------------------------------------------ 1. per API and version

def api_latency(pairs: DataFrame) -> DataFrame:
    """Per API and version: requests, latency percentiles, long-polls, bytes, errors, throttling."""
    answered = F.col("outcome") == "response"
    throttle = F.when(F.col("throttled"), F.col("throttle_ms"))
    long_poll = F.when(F.col("long_poll"), F.col("latency_ms"))
    return (pairs.groupBy("api_name", "api_key", "api_version")
            .agg(F.count("*").alias("requests"),
                 _count_if(answered).alias("answered"),
                 F.percentile_approx(_latency(), [0.5, 0.95, 0.99], PERCENTILE_ACCURACY).alias("q"),
                 F.max(_latency()).alias("latency_max_ms"),
                 _count_if(F.col("long_poll")).alias("long_polls"),
                 F.percentile_approx(long_poll, [0.5, 0.99], PERCENTILE_ACCURACY).alias("lq"),
                 F.sum("request_size").alias("request_bytes"),
                 F.sum(F.coalesce("response_size", F.lit(0))).alias("response_bytes"),
                 _count_if(F.col("has_error")).alias("error_pairs"),
                 _count_if(F.col("throttled")).alias("throttled"),
                 F.percentile_approx(throttle, [0.5, 0.99], PERCENTILE_ACCURACY).alias("tq"),
                 F.max(throttle).alias("throttle_max_ms"))
            .select("api_name", "api_key", "api_version", "requests", "answered",
                    F.col("q")[0].alias("latency_p50_ms"), F.col("q")[1].alias("latency_p95_ms"),
                    F.col("q")[2].alias("latency_p99_ms"), "latency_max_ms",
                    "long_polls", F.col("lq")[0].alias("long_poll_p50_ms"),
                    F.col("lq")[1].alias("long_poll_p99_ms"),
                    "request_bytes", "response_bytes", "error_pairs",
                    (F.col("error_pairs") / F.col("answered")).alias("error_rate"),
                    "throttled", (F.col("throttled") / F.col("answered")).alias("throttled_share"),
                    F.col("tq")[0].alias("throttle_p50_ms"), F.col("tq")[1].alias("throttle_p99_ms"),
                    "throttle_max_ms")
            .transform(_ordered, "api_key", "api_version"))


def api_errors(pairs: DataFrame) -> DataFrame:
    """Per API, version and error name: pairs whose response carried it, and their share."""
    totals = (pairs.where(F.col("outcome") == "response")
              .groupBy("api_name", "api_version").agg(F.count("*").alias("answered")))
    return _errors_of_answered(pairs, totals)


def errors_of_latency(pairs: DataFrame, latency: DataFrame) -> DataFrame:
    """``api_errors`` with its answered totals from the ``api_latency`` table (the job has
    it written already): one aggregation of the pairs fewer. ``api_key`` follows from
    ``api_name``, so a sum over it is the same total."""
    totals = latency.groupBy("api_name", "api_version").agg(F.sum("answered").alias("answered"))
    return _errors_of_answered(pairs, totals)


def _errors_of_answered(pairs: DataFrame, totals: DataFrame) -> DataFrame:
    errors = (pairs.where(F.col("has_error"))
              .select("api_name", "api_version", F.explode("errors").alias("error"))
              .groupBy("api_name", "api_version", "error").agg(F.count("*").alias("pairs")))
    return (errors.join(totals, ["api_name", "api_version"])
            .withColumn("share", F.col("pairs") / F.col("answered"))
            .transform(_ordered, F.desc("pairs"), "api_name", "api_version", "error"))


# ------------------------------------------------------------------ 2. time series and anomalies

SERIES_KEY = ("window_start", "api_name")     # one row of ``series`` per window and API


def series(pairs: DataFrame, window_seconds: int) -> DataFrame:
    """Per time window and API: rate, p99 latency, bytes, errors, throttling."""
    return series_unordered(pairs, window_seconds).transform(_ordered, *SERIES_KEY)


def series_unordered(pairs: DataFrame, window_seconds: int) -> DataFrame:
    """``series`` without its final sort, which a streaming aggregation cannot run (``follow``)."""
    return (pairs.groupBy(F.window("time", f"{window_seconds} seconds").alias("w"), "api_name")
            .agg(F.count("*").alias("requests"),
                 F.percentile_approx(_latency(), 0.99, PERCENTILE_ACCURACY).alias("latency_p99_ms"),
                 F.sum("request_size").alias("request_bytes"),
                 F.sum(F.coalesce("response_size", F.lit(0))).alias("response_bytes"),
                 _count_if(F.col("outcome") == "response").alias("answered"),
                 _count_if(F.col("has_error")).alias("error_pairs"),
                 _count_if(F.col("throttled")).alias("throttled"),
                 F.max("throttle_ms").alias("throttle_max_ms"))
            .select(F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"),
                    "api_name", "requests", (F.col("requests") / window_seconds).alias("rate_per_s"),
                    "latency_p99_ms", "request_bytes", "response_bytes", "error_pairs",
                    (F.col("error_pairs") / F.col("answered")).alias("error_rate"),
                    "throttled", "throttle_max_ms"))


def anomalies(series_table: DataFrame) -> DataFrame:
    """Windows whose p99 latency or error rate stands far above their API's own baseline."""
    metrics = [("latency_p99_ms", ANOMALY_MIN_LATENCY_SPREAD_MS, "%.1f ms"),
               ("error_rate", ANOMALY_MIN_ERROR_RATE_SPREAD, "%.3f")]
    found = None
    busy = series_table.where(F.col("requests") >= ANOMALY_MIN_REQUESTS)
    per_api = Window.partitionBy("api_name")
    for metric, floor, fmt in metrics:
        values = (busy.where(F.col(metric).isNotNull())
                  .select("window_start", "api_name", "requests", F.col(metric).alias("value"))
                  .withColumn("baseline", F.median("value").over(per_api))
                  .withColumn("windows", F.count("*").over(per_api)))
        values = (values.withColumn("spread", MAD_TO_SIGMA * F.median(
                      F.abs(F.col("value") - F.col("baseline"))).over(per_api))
                  .withColumn("spread", F.greatest("spread", F.lit(floor),
                                                   F.col("baseline") * 0.1)))
        flagged = (values.where((F.col("windows") >= ANOMALY_MIN_WINDOWS)
                                & (F.col("value") > F.col("baseline") + ANOMALY_SPREADS * F.col("spread"))
                                & (F.col("value") >= ANOMALY_MIN_RATIO * F.col("baseline")))
                   .select("window_start", "api_name", F.lit(metric).alias("metric"), "value",
                           "baseline", "spread",
                           ((F.col("value") - F.col("baseline")) / F.col("spread")).alias("score"),
                           "requests",
                           F.format_string(f"{metric} {fmt} vs baseline {fmt} (spread {fmt}) over "
                                           "%d windows; %d requests in this window",
                                           "value", "baseline", "spread", "windows",
                                           "requests").alias("evidence")))
        found = flagged if found is None else found.unionByName(flagged)
    return found.transform(_ordered, F.desc("score"))


# ------------------------------------------------------------------ 3. clients

def clients(pairs: DataFrame) -> DataFrame:
    """Per client_id and client address: traffic, records, errors, API versions used."""
    return (pairs.groupBy("client_id", "client_host")
            .agg(_distinct("conn_key").alias("connections"),
                 F.count("*").alias("requests"),
                 F.sum("request_size").alias("request_bytes"),
                 F.sum(F.coalesce("response_size", F.lit(0))).alias("response_bytes"),
                 F.sum(F.when(_stored_produce(), F.col("record_count"))).alias("records_produced"),
                 F.sum(F.when(F.col("api_name").isin(*FETCH_APIS), F.col("record_count"))
                       ).alias("records_fetched"),
                 _count_if(F.col("has_error")).alias("error_pairs"),
                 F.array_sort(F.collect_set(_api_version_label())).alias("api_versions"),
                 F.array_sort(F.collect_set(F.concat_ws(" ", "client_software_name",
                                                        "client_software_version"))).alias("software"),
                 F.array_sort(F.collect_set("proxy_instance")).alias("proxies"),
                 F.min("time").alias("first_seen"), F.max("time").alias("last_seen"))
            .withColumn("records_produced", F.coalesce("records_produced", F.lit(0)))
            .withColumn("records_fetched", F.coalesce("records_fetched", F.lit(0)))
            .transform(_ordered, F.desc("requests"), "client_id", "client_host"))


def _pushed(name: str) -> F.Column:
    """The mean of a pushed metric's data points (one, or one per node) in a PushTelemetry row."""
    values = F.transform(F.filter("telemetry_metrics", lambda m: m["name"] == name), lambda m: m["value"])
    return F.when(F.size(values) > 0, F.aggregate(values, F.lit(0.0), lambda a, v: a + v) / F.size(values))


def latency_split(pairs: DataFrame) -> DataFrame:
    """Per producer (client instance, KIP-714): where a Produce's time goes. The record queue
    time and request latency the client pushed (ms, averaged over its pushes), beside the
    Produce latency kproxy measured for the same client (client_id and address) within the
    same windows (from one push to the next): ``network_ms`` (request minus broker) is the
    network and kproxy, ``queue_share`` the client's queue out of queue plus request."""
    request = F.coalesce(F.when(_pushed(REQUEST_LATENCY_AVG) > 0, _pushed(REQUEST_LATENCY_AVG)),
                         _pushed(NODE_REQUEST_LATENCY_AVG))
    by_instance = Window.partitionBy("client_instance_id").orderBy("time")
    pushes = (pairs.filter((F.col("api_name") == "PushTelemetry") & ~F.col("has_error")
                           & F.col("telemetry_metrics").isNotNull())
              .select("client_instance_id", "client_id", "client_host", "client_software_name",
                      "client_software_version", F.col("time").alias("push_time"),
                      F.lag("time").over(by_instance).alias("window_start"),
                      _pushed(RECORD_QUEUE_TIME_AVG).alias("queue_ms"), request.alias("request_ms"))
              .filter(F.col("queue_ms").isNotNull()))
    produced = (pairs.filter(F.col("api_name").isin(*PRODUCE_APIS) & F.col("latency_ms").isNotNull())
                .select(F.col("client_id").alias("p_client_id"), F.col("client_host").alias("p_host"),
                        F.col("time").alias("p_time"), "latency_ms"))
    joined = pushes.join(produced, (F.col("p_client_id").eqNullSafe(F.col("client_id")))
                         & (F.col("p_host") == F.col("client_host")) & F.col("window_start").isNotNull()
                         & (F.col("p_time") > F.col("window_start")) & (F.col("p_time") <= F.col("push_time")),
                         "left")
    per_push = (joined.groupBy("client_instance_id", "push_time")
                .agg(*(F.first(c).alias(c) for c in ("client_id", "client_host", "client_software_name",
                                                    "client_software_version", "queue_ms", "request_ms")),
                     F.sum("latency_ms").alias("broker_total_ms"), F.count("latency_ms").alias("produce_pairs")))
    return (per_push.groupBy("client_instance_id")
            .agg(F.first("client_id").alias("client_id"), F.first("client_host").alias("client_host"),
                 F.max("client_software_name").alias("client_software_name"),
                 F.max("client_software_version").alias("client_software_version"),
                 F.count("*").alias("pushes"), F.avg("queue_ms").alias("queue_ms"),
                 F.avg("request_ms").alias("request_ms"),
                 (F.sum("broker_total_ms") / F.sum("produce_pairs")).alias("broker_ms"),
                 F.sum("produce_pairs").alias("produce_pairs"),
                 F.min("push_time").alias("first_push"), F.max("push_time").alias("last_push"))
            .withColumn("network_ms", F.greatest(F.col("request_ms") - F.col("broker_ms"), F.lit(0.0)))
            .withColumn("queue_share", F.col("queue_ms") / (F.col("queue_ms") + F.col("request_ms")))
            .orderBy(F.desc("queue_ms"), "client_instance_id"))


def per_connection(pairs: DataFrame) -> DataFrame:
    """One row per proxied connection (client, software, times, requests, versions).

    A connection's software is its latest row's: each row carries the connection's
    software as of that pair (its latest ApiVersions v3+ the broker accepted, Kafka's
    rule; ``kproxy.protocol.client_software``), so a later ApiVersions replaces an earlier."""
    named = F.col("client_software_name").isNotNull() | F.col("client_software_version").isNotNull()
    software = F.max_by(F.struct(F.col("client_software_name").alias("name"),
                                 F.col("client_software_version").alias("version")),
                        F.when(named, F.col("time")))
    return (pairs.groupBy("conn_key")
            .agg(F.max("client_id").alias("client_id"), F.max("client_host").alias("client_host"),
                 F.max("proxy_instance").alias("proxy_instance"),
                 software.alias("software"),
                 F.min(F.coalesce("connection_start", "time")).alias("opened"),
                 F.max("end_time").alias("last_active"),
                 F.count("*").alias("requests"),
                 F.collect_set(_api_version_label()).alias("api_versions"))
            .select("conn_key", "client_id", "client_host", "proxy_instance",
                    F.col("software.name").alias("client_software_name"),
                    F.col("software.version").alias("client_software_version"),
                    "opened", "last_active", "requests", "api_versions")
            .withColumn("lifetime_s", _seconds_between("last_active", "opened")))


def client_inventory(pairs: DataFrame) -> DataFrame:
    """Client software (ApiVersions v3+, KIP-511) by name and version, with who runs it."""
    return inventory_of_connections(per_connection(pairs))


def inventory_of_connections(connections: DataFrame) -> DataFrame:
    """``client_inventory`` from ``per_connection`` rows (``follow`` keeps those current)."""
    return (connections
            .groupBy(F.coalesce("client_software_name", F.lit("unknown")).alias("client_software_name"),
                     F.coalesce("client_software_version", F.lit("unknown")).alias("client_software_version"),
                     "client_id", "client_host")
            .agg(F.count("*").alias("connections"), F.sum("requests").alias("requests"),
                 F.array_sort(F.array_distinct(F.flatten(F.collect_list("api_versions")))).alias("api_versions"),
                 F.min("opened").alias("first_seen"), F.max("last_active").alias("last_seen"))
            .transform(_ordered, "client_software_name", "client_software_version", "client_id",
                       "client_host"))


def removed_versions(spark) -> DataFrame:
    """(api_key, lowest, highest) request versions Kafka 4.0 removed (KIP-896), from the schema."""
    # Spark literals (a local relation in the JVM), not Python rows: executors need no Python.
    spans = [F.struct(F.lit(key).cast("short").alias("api_key"), F.lit(lo).cast("short").alias("removed_lo"),
                      F.lit(hi).cast("short").alias("removed_hi"))
             for key in sorted(kafka_schema.API_NAMES)
             if (span := kafka_schema.removed_versions(key)) is not None for lo, hi in [span]]
    return spark.range(1).select(F.explode(F.array(*spans)).alias("r")).select("r.*")


def upgrade_readiness(pairs: DataFrame, removed: DataFrame) -> DataFrame:
    """Clients still sending request versions that Kafka 4.0 removed: they break on upgrade."""
    return (pairs.join(F.broadcast(removed), "api_key")
            .where(F.col("api_version").between(F.col("removed_lo"), F.col("removed_hi")))
            .groupBy("client_id", "client_host",
                     F.coalesce("client_software_name", F.lit("unknown")).alias("client_software_name"),
                     F.coalesce("client_software_version", F.lit("unknown")).alias("client_software_version"),
                     "api_name", "api_version")
            .agg(F.count("*").alias("requests"), F.first(F.concat(
                     F.lit("v"), F.col("removed_lo").cast("string"), F.lit("-v"),
                     F.col("removed_hi").cast("string"))).alias("removed_versions"),
                 F.min("time").alias("first_seen"), F.max("time").alias("last_seen"))
            .transform(_ordered, "client_id", "client_host", "api_name", "api_version"))


# ------------------------------------------------------------------ 4. topics

def topic_clients(pairs: DataFrame) -> DataFrame:
    """Per topic and client_id: records and bytes produced (role producer) or fetched (consumer).

    Produced records are those the broker kept; ``rejected_records`` were in Produce
    requests answered with an error or never answered (the client retries those).
    """
    role = (F.when(F.col("api_name").isin(*PRODUCE_APIS), F.lit("producer"))
            .when(F.col("api_name").isin(*FETCH_APIS), F.lit("consumer")))
    rejected = F.col("api_name").isin(*PRODUCE_APIS) & ~_stored_produce()
    return (pairs.where(F.col("topic_records").isNotNull())
            .select(role.alias("role"), "client_id", rejected.alias("rejected"),
                    F.explode("topic_records").alias("t"))
            .where(F.col("role").isNotNull())
            .groupBy(F.col("t.topic").alias("topic"), "role", "client_id")
            .agg(F.count("*").alias("requests"),
                 F.sum(F.when(~F.col("rejected"), F.col("t.record_count")).otherwise(0)).alias("records"),
                 F.sum(F.when(~F.col("rejected"), F.col("t.record_bytes")).otherwise(0)).alias("bytes"),
                 F.sum(F.when(F.col("rejected"), F.col("t.record_count")).otherwise(0)).alias("rejected_records"))
            .transform(_ordered, "topic", "role", F.desc("records"), "client_id"))


def topics(pairs: DataFrame, flows: DataFrame) -> DataFrame:
    """Per topic: records and bytes in and out, who produces, who consumes, pairs naming it.

    The topics the pairs name and the rows of ``flows`` are stacked (a named topic has no
    role) and aggregated once by topic, instead of two aggregations and a join; a topic
    only ``flows`` knows is left out, as that join left it out.
    """
    producer = F.col("role") == "producer"
    consumer = F.col("role") == "consumer"
    none = F.lit(None)
    named = pairs.select(F.explode("topics").alias("topic"), none.cast("string").alias("role"),
                         none.cast("string").alias("client_id"), none.cast("long").alias("records"),
                         none.cast("long").alias("bytes"))
    zero = F.lit(0).cast("long")
    return (named.unionByName(flows.select("topic", "role", "client_id", F.col("records").cast("long"),
                                           F.col("bytes").cast("long")))
            .groupBy("topic")
            .agg(_count_if(F.col("role").isNull()).alias("pairs"),
                 F.coalesce(F.sum(F.when(producer, F.col("records"))), zero).alias("produced_records"),
                 F.coalesce(F.sum(F.when(producer, F.col("bytes"))), zero).alias("produced_bytes"),
                 F.coalesce(F.sum(F.when(consumer, F.col("records"))), zero).alias("fetched_records"),
                 F.coalesce(F.sum(F.when(consumer, F.col("bytes"))), zero).alias("fetched_bytes"),
                 F.array_sort(F.collect_set(F.when(producer, F.col("client_id")))).alias("producers"),
                 F.array_sort(F.collect_set(F.when(consumer, F.col("client_id")))).alias("consumers"))
            .where(F.col("pairs") > 0)
            .transform(_ordered, F.desc("produced_records"), F.desc("fetched_records"), "topic"))


# ------------------------------------------------------------------ 5. consumer groups

def _group_pairs(pairs: DataFrame) -> DataFrame:
    return pairs.where(F.col("group_id").isNotNull() & (F.col("group_id") != ""))


def rebalances(pairs: DataFrame) -> DataFrame:
    """One row per generation a group went through (its first formation included).

    Classic protocol: a JoinGroup round that gave out generation g, from its first
    JoinGroup request to the last SyncGroup answer for g (null if never seen).
    KIP-848 (ConsumerGroupHeartbeat): each member epoch the coordinator handed out,
    from the first member to reach it to the last (each member's first answer at it).
    """
    grouped = _group_pairs(pairs).where(F.col("outcome") == "response")
    ok = ~F.col("has_error") & F.col("generation").isNotNull() & (F.col("generation") >= 0)
    # JoinGroup and SyncGroup answers in one aggregation (not one each and a join): a
    # generation is a classic round when some JoinGroup gave it out.
    join = F.col("api_name") == "JoinGroup"
    classic = (grouped.where(F.col("api_name").isin("JoinGroup", "SyncGroup") & ok)
               .groupBy("group_id", "generation")
               .agg(_count_if(join).alias("joins"), F.min(F.when(join, F.col("time"))).alias("started"),
                    F.max(F.when(~join, F.col("end_time"))).alias("completed"),
                    _distinct(F.when(join, F.col("member_id"))).alias("members"))
               .where(F.col("joins") > 0)
               .select("group_id", F.lit("classic").alias("protocol"), "generation", "started",
                       "completed", "members"))
    reached = (grouped.where(F.col("api_name").isin(*HEARTBEAT_GROUP_APIS) & ok
                             & (F.col("generation") > 0))
               .groupBy("group_id", "generation", "member_id").agg(F.min("end_time").alias("at")))
    consumer = (reached.groupBy("group_id", "generation")
                .agg(F.min("at").alias("started"), F.max("at").alias("completed"),
                     F.count("*").alias("members"))
                .select("group_id", F.lit("consumer").alias("protocol"), "generation", "started",
                        "completed", "members"))
    return (classic.unionByName(consumer)
            .withColumn("duration_s", _seconds_between("completed", "started"))
            .transform(_ordered, "group_id", "started"))


def group_members(pairs: DataFrame, window_seconds: int) -> DataFrame:
    """Distinct members active per group and time window."""
    return (_group_pairs(pairs).where(F.col("member_id").isNotNull())
            .groupBy(F.window("time", f"{window_seconds} seconds").alias("w"), "group_id")
            .agg(F.countDistinct("member_id").alias("members"))
            .select(F.col("w.start").alias("window_start"), "group_id", "members")
            .transform(_ordered, "window_start", "group_id"))


def group_errors(pairs: DataFrame) -> DataFrame:
    """Errors in group API answers that force members to rejoin, per group, API and error."""
    return (_group_pairs(pairs).where(F.col("has_error"))
            .select("group_id", "api_name", "time", F.explode("errors").alias("error"))
            .where(F.col("error").isin(*REBALANCE_ERRORS))
            .groupBy("group_id", "api_name", "error")
            .agg(F.count("*").alias("pairs"), F.min("time").alias("first_seen"),
                 F.max("time").alias("last_seen"))
            .transform(_ordered, "group_id", F.desc("pairs")))


def groups(pairs: DataFrame, generations: DataFrame, members: DataFrame, errors: DataFrame) -> DataFrame:
    """Per group: protocol, members, rebalances and their durations, errors, commits.

    The group's pairs and the rows of the three tables are stacked (each source fills
    its own columns, the rest null) and aggregated once by group, instead of four
    aggregations and three joins: the other tables' groups are all groups of these pairs.
    """
    def stacked(df: DataFrame, source: str, **columns) -> DataFrame:
        return df.select("group_id", F.lit(source).alias("source"),
                         *(columns.get(name, F.lit(None)).cast(kind).alias(name)
                           for name, kind in _GROUP_STACK))

    stack = (stacked(_group_pairs(pairs), "pairs", member_id=F.col("member_id"), client_id=F.col("client_id"),
                     commit=F.col("api_name").isin("OffsetCommit", "TxnOffsetCommit"), time=F.col("time"))
             .unionByName(stacked(generations, "generations", protocol=F.col("protocol"),
                                  duration_s=F.col("duration_s")))
             .unionByName(stacked(members, "members", members=F.col("members")))
             .unionByName(stacked(errors, "errors", rejoin_errors=F.col("pairs"))))
    generation = F.col("source") == "generations"
    return (stack.groupBy("group_id")
            .agg(_count_if(F.col("source") == "pairs").alias("pairs"),
                 F.array_sort(F.collect_set("protocol")).alias("protocols"),
                 _distinct("member_id").alias("members_seen"),
                 F.coalesce(F.max("members"), F.lit(0).cast("long")).alias("members_peak"),
                 _count_if(generation).alias("rebalances"),
                 F.percentile_approx("duration_s", 0.5, PERCENTILE_ACCURACY).alias("rebalance_p50_s"),
                 F.max("duration_s").alias("rebalance_max_s"),
                 F.coalesce(F.sum("rejoin_errors"), F.lit(0).cast("long")).alias("rejoin_errors"),
                 _count_if(F.col("commit")).alias("commits"),
                 F.array_sort(F.collect_set("client_id")).alias("client_ids"),
                 F.min("time").alias("first_seen"), F.max("time").alias("last_seen"))
            .where(F.col("pairs") > 0)
            .drop("pairs")
            .transform(_ordered, F.desc("rebalances"), "group_id"))


# The columns ``groups`` stacks its four sources in (name, Spark type).
_GROUP_STACK = (("member_id", "string"), ("client_id", "string"), ("commit", "boolean"),
                ("time", "timestamp"), ("protocol", "string"), ("duration_s", "double"),
                ("members", "long"), ("rejoin_errors", "long"))


# ------------------------------------------------------------------ 6. slow pairs, churn

def slowest(pairs: DataFrame, top: int) -> DataFrame:
    """The ``top`` slowest answered pairs (empty long-polls excluded: they wait by design)."""
    return (pairs.where(F.col("latency_ms").isNotNull() & ~F.col("long_poll"))
            .orderBy(F.desc("latency_ms"))
            .limit(top)
            .select("time", "proxy_instance", "connection_id", "client_host", "client_port",
                    "client_id", "api_name", "api_version", "correlation_id", "latency_ms",
                    "request_size", "response_size", "topics", "errors"))


def connections(pairs: DataFrame) -> DataFrame:
    """Connection churn per client: connections opened, lifetimes, short-lived ones."""
    return churn_of_connections(per_connection(pairs))


def churn_of_connections(connections: DataFrame) -> DataFrame:
    """``connections`` from ``per_connection`` rows (the job derives those once for two tables)."""
    return (connections
            .groupBy("client_id", "client_host", "proxy_instance")
            .agg(F.count("*").alias("connections"),
                 _count_if(F.col("lifetime_s") < SHORT_LIVED_CONNECTION_S).alias("short_lived"),
                 F.percentile_approx("lifetime_s", 0.5, PERCENTILE_ACCURACY).alias("lifetime_p50_s"),
                 F.max("lifetime_s").alias("lifetime_max_s"),
                 F.avg("requests").alias("requests_per_connection"),
                 F.min("opened").alias("first_opened"), F.max("opened").alias("last_opened"))
            .transform(_ordered, F.desc("connections"), "client_id", "client_host", "proxy_instance"))


# ------------------------------------------------------------------ per proxy instance

def instances(pairs: DataFrame) -> DataFrame:
    """Per kproxy instance (``proxy_instance``): which proxy of a fleet saw what, and how it went."""
    return (pairs.groupBy("proxy_instance")
            .agg(F.count("*").alias("requests"),
                 _distinct("conn_key").alias("connections"),
                 _distinct(F.struct("client_id", "client_host")).alias("clients"),   # a null client_id counts too
                 _count_if(F.col("has_error")).alias("error_pairs"),
                 F.percentile_approx(_latency(), [0.5, 0.99], PERCENTILE_ACCURACY).alias("q"),
                 F.sum("request_size").alias("request_bytes"),
                 F.sum(F.coalesce("response_size", F.lit(0))).alias("response_bytes"),
                 F.min("time").alias("first_seen"), F.max("time").alias("last_seen"))
            .select("proxy_instance", "requests", "connections", "clients", "error_pairs",
                    (F.col("error_pairs") / F.col("requests")).alias("error_rate"),
                    F.col("q")[0].alias("latency_p50_ms"), F.col("q")[1].alias("latency_p99_ms"),
                    "request_bytes", "response_bytes", "first_seen", "last_seen")
            .transform(_ordered, F.desc("requests"), "proxy_instance"))
