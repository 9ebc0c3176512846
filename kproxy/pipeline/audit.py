"""``audit``: the audit trail recomputed from any capture (who changed what, from where).

The same requests as the live trail (``protocol.audited``): the admin APIs that
change cluster state, and OffsetCommit from outside a group (capture v2+ rows
with neither generation nor member id: an offset reset). One row per request,
with who sent it (principal, address, client id and software), the resources it
named (``topics``, ``group_id``), the errors of the answer and its outcome.

A capture row carries the answer's distinct error names and how many error codes
it held, not every resource's answer: ``outcome`` is ``ok`` without an error,
``error`` when there were at least as many errors as resources named (topics or
partitions, at least one), else ``partial``. Decoded requests (config values,
ACL bindings) are in JSONL captures' ``request`` bodies and in the live trail.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..protocol.audited import (AUDITED_API_NAMES, OFFSET_COMMIT_NAME, OUTCOME_ERROR, OUTCOME_OK,
                                OUTCOME_PARTIAL, OUTCOME_UNANSWERED)

ANONYMOUS = "ANONYMOUS"              # the live trail's name for an unauthenticated client
GROUP_COLUMNS_VERSION = 2            # capture rows carry generation and member_id from v2


def audited(pairs: DataFrame) -> F.Column:
    """The rows the live trail would have made an event of."""
    outside_commit = ((F.col("api_name") == OFFSET_COMMIT_NAME)
                      & (F.col("capture_version") >= GROUP_COLUMNS_VERSION)
                      & F.col("generation").isNull() & F.col("member_id").isNull())
    return F.col("api_name").isin(*AUDITED_API_NAMES) | outside_commit


def audit(pairs: DataFrame) -> DataFrame:
    """One row per audited request, in time order."""
    resources = F.greatest(F.size("topics"), F.col("partition_count"), F.lit(1))
    outcome = (F.when(F.col("outcome") == "unanswered", F.lit(OUTCOME_UNANSWERED))
               .when(F.col("error_count") == 0, F.lit(OUTCOME_OK))
               .when(F.col("error_count") >= resources, F.lit(OUTCOME_ERROR))
               .otherwise(F.lit(OUTCOME_PARTIAL)))
    return (pairs.where(audited(pairs))
            .select("time", "proxy_instance", F.coalesce("principal", F.lit(ANONYMOUS)).alias("principal"),
                    F.concat_ws(":", "client_host", F.col("client_port").cast("string")).alias("client_address"),
                    "client_id", "client_software_name", "client_software_version",
                    F.col("api_name").alias("api"), "api_version", "correlation_id",
                    "topics", "group_id", outcome.alias("outcome"), "errors", "latency_ms")
            .orderBy("time", "correlation_id"))
