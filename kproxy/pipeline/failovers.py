"""``failovers`` and ``leader_changes``: what partition leader changes cost each client.

``failovers`` applies the rules of ``protocol.failover`` (which the live observer
runs answer by answer) to capture schema v4's ``partition_answers``, in Spark SQL
(no Python runs per row, so executors need nothing but Spark): per client and
partition, in the order answers arrived, a failover starts at an answer with a
leadership error (``LEADER_ERRORS``) and ends at the next answer without error;
the errors in between are counted, the first KIP-951 hint kept, and the client's
Metadata answers in between counted. ``tests/pipeline/test_failovers_audit.py``
feeds the same pairs to the observer and to this table and compares them.

``leader_changes``: each partition's leader as Metadata answers and KIP-951 hints
named it, a row wherever the leader differs from the one named before (by epoch
when both carry one).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from ..protocol.failover import (LEADER_ERRORS, NO_ERROR, RECOVERED_BY_HINT, RECOVERED_BY_METADATA,
                                 RECOVERED_BY_RETRY)

# A client, as the live observer names one (all its connections together).
CLIENT_COLUMNS = ("client_id", "client_software_name", "client_software_version", "principal", "client_host")
ANSWER_APIS = ("Produce", "Fetch")
METADATA_API = "Metadata"


def _answers(pairs: DataFrame) -> DataFrame:
    return (pairs.where(F.col("outcome") == "response")
            .select(*CLIENT_COLUMNS, "api_name", "node_id", "partition_answers",
                    F.unix_micros("time").alias("sent"), F.unix_micros("end_time").alias("answered")))


def failovers(pairs: DataFrame) -> DataFrame:
    """Per client and partition leader change: the first failure, the first success after it,
    failed requests and their errors, the hint and Metadata answers, the recovery time."""
    answers = _answers(pairs)
    parts = (answers.where(F.col("api_name").isin(*ANSWER_APIS) & F.col("partition_answers").isNotNull())
             .select(*CLIENT_COLUMNS, F.col("api_name").alias("api"), "node_id", "sent", "answered",
                     F.explode("partition_answers").alias("a"))
             .select(*CLIENT_COLUMNS, "api", "node_id", "sent", "answered", F.col("a.topic").alias("topic"),
                     F.col("a.partition").alias("partition"), F.col("a.error").alias("error"),
                     F.col("a.leader_id").alias("leader_id"), F.col("a.leader_epoch").alias("leader_epoch")))
    key = [*CLIENT_COLUMNS, "topic", "partition"]
    order = Window.partitionBy(*key).orderBy("answered", "sent")
    ok = F.col("error") == NO_ERROR
    leader_error = F.col("error").isin(*sorted(LEADER_ERRORS))
    # An episode: the answers after one answer without error, up to and including the next.
    episodes = (parts.withColumn("ord", F.row_number().over(order))
                .withColumn("episode", F.coalesce(F.sum(F.when(ok, 1).otherwise(0)).over(
                    order.rowsBetween(Window.unboundedPreceding, -1)), F.lit(0))))
    first_fail = F.min(F.when(leader_error, F.col("ord"))).over(Window.partitionBy(*key, "episode"))
    episodes = episodes.withColumn("first_fail", first_fail).where(F.col("first_fail").isNotNull()
                                                                   & (F.col("ord") >= F.col("first_fail")))
    at_fail = F.when(F.col("ord") == F.col("first_fail"), F.col("ord"))
    at_ok = F.when(ok, F.col("ord"))
    failed_error = F.when(~ok, F.col("error"))
    ended = (episodes.groupBy(*key, "episode")
             .agg(F.min_by("api", at_fail).alias("api"), F.min_by("node_id", at_fail).alias("old_leader"),
                  F.min_by("sent", at_fail).alias("first_failure_us"),
                  F.min_by("answered", at_fail).alias("failed_at_us"),
                  F.max_by("node_id", at_ok).alias("new_leader"), F.max_by("sent", at_ok).alias("retry_us"),
                  F.max_by("answered", at_ok).alias("recovered_us"), F.max(ok).alias("ended"),
                  F.collect_list(failed_error).alias("failed_errors"),
                  F.min_by(F.struct("leader_id", "leader_epoch"),
                           F.when(leader_error & F.col("leader_id").isNotNull(), F.col("ord"))).alias("hint"))
             .where(F.col("ended")))
    metadata = (answers.where(F.col("api_name") == METADATA_API)
                .select(*(F.col(c).alias(f"m_{c}") for c in CLIENT_COLUMNS), F.col("answered").alias("m_at")))
    between = [ended[c].eqNullSafe(metadata[f"m_{c}"]) for c in CLIENT_COLUMNS] + [
        metadata["m_at"] > ended["failed_at_us"], metadata["m_at"] < ended["recovered_us"]]
    counted = (ended.join(metadata, between, "left")
               .groupBy(*key, "episode")
               .agg(*(F.first(c).alias(c) for c in ("api", "old_leader", "new_leader", "first_failure_us",
                                                    "retry_us", "recovered_us", "failed_errors", "hint")),
                    F.count("m_at").alias("metadata_requests"), F.min("m_at").alias("metadata_first")))
    distinct = F.array_distinct("failed_errors")
    counts = F.transform(distinct, lambda e: F.size(F.filter("failed_errors", lambda x: x == e)))
    # (error, count), most frequent first, then by name (as the live observer orders them)
    ranked = F.array_sort(F.arrays_zip(distinct.alias("error"), counts.alias("n")),
                          lambda a, b: F.when(a["n"] != b["n"], b["n"] - a["n"])
                          .otherwise(F.when(a["error"] < b["error"], -1)
                                     .when(a["error"] > b["error"], 1).otherwise(0)))
    how = (F.when(F.col("metadata_first") <= F.col("retry_us"), F.lit(RECOVERED_BY_METADATA))
           .when(F.col("hint.leader_id") == F.col("new_leader"), F.lit(RECOVERED_BY_HINT))
           .otherwise(F.lit(RECOVERED_BY_RETRY)))
    return (counted.select(
        *key, "api", "old_leader", "new_leader",
        F.timestamp_micros("first_failure_us").alias("first_failure"),
        F.timestamp_micros("recovered_us").alias("recovered"),
        (F.greatest(F.col("recovered_us") - F.col("first_failure_us"), F.lit(0)) / 1e6).alias("recovery_seconds"),
        F.size("failed_errors").alias("failed_requests"),
        F.transform(ranked, lambda p: p["error"]).alias("errors"),
        F.transform(ranked, lambda p: p["n"]).alias("error_counts"),
        F.col("hint.leader_id").alias("hint_leader"), F.col("hint.leader_epoch").alias("hint_epoch"),
        F.col("metadata_requests").cast("int").alias("metadata_requests"), how.alias("recovered_by"))
        .orderBy("first_failure", "client_id", "topic", "partition"))


def leader_changes(pairs: DataFrame) -> DataFrame:
    """Per partition: each time an answer named a leader other than the one named before."""
    named = (pairs.where(F.col("api_name").isin(*ANSWER_APIS, METADATA_API)
                         & F.col("partition_answers").isNotNull())
             .select("end_time", "api_name", F.explode("partition_answers").alias("a"))
             .where(F.col("a.leader_id").isNotNull())
             .select(F.col("end_time").alias("time"), F.col("a.topic").alias("topic"),
                     F.col("a.partition").alias("partition"), F.col("a.leader_id").alias("leader"),
                     F.col("a.leader_epoch").alias("epoch"),
                     F.when(F.col("api_name") == METADATA_API, F.lit("metadata"))
                     .otherwise(F.lit("hint")).alias("source")))
    # The newest leader named so far: by epoch where answers carry one, else by time.
    order = Window.partitionBy("topic", "partition").orderBy(F.coalesce("epoch", F.lit(-1)), "time")
    previous = F.lag("leader").over(order)
    return (named.withColumn("old_leader", previous)
            .where(F.col("old_leader").isNotNull() & (F.col("old_leader") != F.col("leader")))
            .groupBy("topic", "partition", "old_leader", F.col("leader").alias("new_leader"), "epoch")
            .agg(F.min("time").alias("first_named"), F.min_by("source", "time").alias("first_named_by"),
                 F.count("*").alias("answers"))
            .orderBy("first_named", "topic", "partition"))
