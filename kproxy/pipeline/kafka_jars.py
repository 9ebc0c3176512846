"""Spark's Kafka connector, fetched once from Maven Central into kproxy's cache.

``kproxy analyze kafka://...`` reads capture rows with Spark's own Kafka source
(``spark-sql-kafka-0-10``), which PySpark does not ship. Its jars are fetched
with Maven, the way ``kproxy.embedded`` fetches Kafka's, into
``~/.cache/kproxy/spark-kafka-<version>/`` (``KPROXY_CACHE_DIR``), under a lock,
and handed to the Spark kproxy starts as ``spark.jars``: no Ivy resolution at
each start, nothing fetched once cached (``scripts/setup.sh`` fetches them for
the test profile). Under ``spark-submit``, pass ``--packages`` yourself.
"""

from __future__ import annotations

from pathlib import Path

from ..embedded.kafka import default_cache_dir
from .maven_jars import MARKER, ConnectorError, fetched_jars, pom

# The connector release. PySpark 4.3.0 is on PyPI, but Spark 4.3.0's Maven artifacts are
# not on Maven Central; 4.2.0's connector was checked against PySpark 4.3.0 (batch and
# streaming reads, tests/proxy/test_capture_shipping.py). Scala 2.13, as PySpark 4's jars.
CONNECTOR_VERSION = "4.2.0"
SCALA_VERSION = "2.13"
# Of the connector's dependencies, those PySpark's own jars lack (Spark, Hadoop, Scala,
# lz4 and snappy are there already; a second copy of them on the class path would clash).
ARTIFACTS = ("spark-sql-kafka-0-10_2.13", "spark-token-provider-kafka-0-10_2.13", "kafka-clients",
             "commons-pool2")

__all__ = ["ConnectorError", "connector_home", "connector_jars", "is_fetched"]


def connector_home(cache_dir: Path | None = None) -> Path:
    return (cache_dir or default_cache_dir()) / f"spark-kafka-{CONNECTOR_VERSION}"


def is_fetched(cache_dir: Path | None = None) -> bool:
    return (connector_home(cache_dir) / MARKER).exists()


def connector_jars(cache_dir: Path | None = None) -> list[str]:
    """The connector's jar paths, fetched first if need be. Raises ConnectorError."""
    dependency = (f"    <dependency><groupId>org.apache.spark</groupId>\n"
                  f"      <artifactId>spark-sql-kafka-0-10_{SCALA_VERSION}</artifactId>"
                  f"<version>{CONNECTOR_VERSION}</version>\n    </dependency>")
    return fetched_jars(connector_home(cache_dir), "Spark's Kafka connector",
                        pom("spark-kafka-classpath", dependency),
                        [f"-DincludeArtifactIds={','.join(ARTIFACTS)}"])


if __name__ == "__main__":                           # scripts/setup.sh: python -m kproxy.pipeline.kafka_jars
    print("\n".join(connector_jars()))
