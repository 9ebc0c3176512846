"""Topic ids named across proxies: rows that carry an id where another row knows the name.

Kafka 4 clients name topics by id in Fetch (v13+) and Produce (v13). A sidecar that never
relayed a Metadata answer naming the topic (and could not ask its broker) writes the id
in ``topics`` and ``topic_records``, while other sidecars' rows carry the name: a topic
table would split one topic in two. Every row lists the ids it named with their names in
``topic_ids`` (Metadata answers, and ids its proxy resolved); ``resolve_topic_ids`` takes
that map from all the rows read together and puts the names where the ids were.

Batch only: the map is collected first (one pass over one small column). ``kproxy
analyze --follow`` leaves ids as the rows carry them.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

# Ids mapped at most (the map is a literal in the query plan): above the topics of most
# clusters; past it the rows stay as written.
MAX_MAPPED_IDS = 10_000


def id_names(rows: DataFrame) -> dict[str, str]:
    """topic id -> name, from every row's ``topic_ids`` (one name per id: ids are never reused)."""
    pairs = (rows.where(F.col("topic_ids").isNotNull())
             .select(F.explode("topic_ids").alias("p"))
             .where(F.col("p.topic_id").isNotNull() & F.col("p.topic").isNotNull())
             .groupBy(F.col("p.topic_id").alias("topic_id"))
             .agg(F.min(F.col("p.topic")).alias("topic"))
             .limit(MAX_MAPPED_IDS + 1)
             .collect())
    if len(pairs) > MAX_MAPPED_IDS:
        return {}
    return {r["topic_id"]: r["topic"] for r in pairs}


def resolve_topic_ids(rows: DataFrame) -> DataFrame:
    """The rows with ids in ``topics`` and ``topic_records`` replaced by the names any row
    gives them (duplicates that makes in ``topics`` dropped); ``topic_ids`` dropped."""
    names = id_names(rows)
    rows = rows.drop("topic_ids")
    if not names:
        return rows
    mapping = F.create_map(*(F.lit(x) for pair in sorted(names.items()) for x in pair))

    def named(value):
        return F.coalesce(F.try_element_at(mapping, value), value)

    return (rows.withColumn("topics", F.array_distinct(F.transform("topics", named)))
            .withColumn("topic_records", F.transform(
                "topic_records", lambda t: t.withField("topic", named(t["topic"])))))
