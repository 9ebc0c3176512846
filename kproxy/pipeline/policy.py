"""The ``policy_violations`` table: a rules file judged on the capture (``kproxy analyze --policy``).

The same rules, the same judgement as kproxy makes live (``kproxy.policy``), on capture
rows: one row per (rule, client id, client software), labelled as the live metric
``kproxy_policy_violations_total`` labels them, so the two can be compared.

Rules that read a request's body (acks, fetch bounds, CreateTopics settings, group ids)
need the bodies, which JSONL captures keep and Parquet captures do not; idempotence
needs the batches' producer ids, which no capture keeps (a live-only rule). On a capture
without bodies those rules find nothing; ``judged_without_bodies`` says which they are.
"""

from __future__ import annotations

import json

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..policy import Policy, Subject
from ..policy.rules import parse_policy
from .source import Inputs, read_capture

# Capture columns the rules read (``request``: JSONL only, the decoded body as text).
_COLUMNS = ("time", "client_host", "client_port", "client_id", "api_key", "api_name", "api_version",
            "client_software_name", "client_software_version", "compression")
# Checks that read a request's body (nothing to judge on a capture without bodies).
BODY_CHECKS = frozenset({"acks_all", "create_topics", "topic_names", "fetch_bounds", "group_names"})
LIVE_ONLY_CHECKS = frozenset({"idempotent"})      # producer ids are not captured
_HITS = T.StructType([T.StructField(name, kind) for name, kind in (
    ("rule", T.StringType()), ("client_id", T.StringType()), ("client_software", T.StringType()),
    ("time", T.TimestampType()), ("client", T.StringType()), ("api", T.StringType()),
    ("api_version", T.IntegerType()), ("reason", T.StringType()))])


def judged_without_bodies(policy: Policy) -> list[str]:
    """The rules a capture without request bodies (Parquet) cannot judge."""
    return [r.name for r in policy.rules if r.check in BODY_CHECKS | LIVE_ONLY_CHECKS]


def software_label(name: str | None, version: str | None) -> str:
    """The client software as the live metric labels it ("" when unknown)."""
    return f"{name} {version}" if name else ""


def judge_rows(policy: Policy, rows):
    """Violations of capture rows: (rule, client_id, client_software, time, client, api,
    api_version, reason) per rule a row breaks."""
    for row in rows:
        body = None
        text = row["request"] if "request" in row else None
        if text:
            try:
                body = json.loads(text)
            except ValueError:
                body = None
        produce = row["api_key"] == 0
        subject = Subject(row["api_key"], row["api_version"], row["client_id"],
                          (row["client_software_name"], row["client_software_version"]), body,
                          codecs=list(row["compression"] or ()) if produce and body is None else None)
        for violation in policy.violations(subject):
            yield (violation.rule.name, row["client_id"] or "",
                   software_label(row["client_software_name"], row["client_software_version"]),
                   row["time"], f"{row['client_host']}:{row['client_port']}", row["api_name"],
                   row["api_version"], violation.reason)


def policy_violations(spark, inputs: Inputs, policy: Policy, since=None, until=None) -> DataFrame:
    """Per (rule, client id, client software): violations, first and last time, an example."""
    raw = read_capture(spark, inputs) if inputs.format == "parquet" else _with_bodies(spark, inputs)
    raw = raw.where(F.col("capture_version").isNotNull())
    if since is not None:
        raw = raw.where(F.col("time") >= F.lit(since))
    if until is not None:
        raw = raw.where(F.col("time") < F.lit(until))
    columns = [*_COLUMNS, *(["request"] if "request" in raw.columns else [])]
    data, source = policy.data, policy.source

    def judge(rows):
        mine = parse_policy(data, source)        # compiled patterns do not pickle: parsed here
        return judge_rows(mine, (row.asDict() for row in rows))

    hits = spark.createDataFrame(raw.select(*columns).rdd.mapPartitions(judge), _HITS)
    enforced = [r.name for r in policy.rules if r.enforce]
    example = F.min_by(F.struct("api", "api_version", "client", "reason"), "time")
    return (hits.groupBy("rule", "client_id", "client_software")
            .agg(F.count("*").alias("violations"), F.min("time").alias("first_time"),
                 F.max("time").alias("last_time"), example.alias("example"))
            .select("rule", "client_id", "client_software", "violations", "first_time", "last_time",
                    F.col("example.api").alias("example_api"),
                    F.col("example.api_version").alias("example_api_version"),
                    F.col("example.client").alias("example_client"),
                    F.col("example.reason").alias("example_reason"),
                    F.col("rule").isin(*enforced).alias("enforced") if enforced
                    else F.lit(False).alias("enforced"))
            # A few rows (rules x violators): sorted in one partition, without the sampling
            # job a global orderBy costs (the report reads the first rows).
            .coalesce(1).sortWithinPartitions(F.col("violations").desc(), "rule", "client_id"))


def _with_bodies(spark, inputs: Inputs) -> DataFrame:
    """JSONL rows with the decoded request kept as its JSON text (a string column of the
    schema reads an object as its text)."""
    from .source import _TIME_COLUMNS, spark_schema
    schema = spark_schema(for_json=True).add("request", T.StringType())
    df = (spark.read.schema(schema).option("mode", "PERMISSIVE")
          .option("pathGlobFilter", "*.jsonl*").json(list(inputs.files)))
    for name in _TIME_COLUMNS:
        df = df.withColumn(name, F.col(name).cast("timestamp"))
    return df
