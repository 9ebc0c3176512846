"""Hadoop's S3A file system (``s3a://``) for the Spark kproxy starts, fetched once from Maven Central.

PySpark bundles Hadoop's client (``hadoop-client-api``/``-runtime``) but not
``hadoop-aws``, which must be the same Hadoop release. ``hadoop-aws`` depends on the
AWS SDK v2 ``bundle`` jar (over 500 MB: every AWS service, shaded); S3A needs only
the S3 client and its transfer manager, so the bundle is left out and those modules
taken instead: about 12 MB of jars. Their own dependencies that PySpark already has
(Netty, Apache HttpClient, commons-codec/-logging, SLF4J) are left out too, as a second
copy on the class path would clash; so is WildFly OpenSSL (only for
``fs.s3a.ssl.channel.mode=openssl``). Fetched like the Kafka connector
(``maven_jars``) into ``~/.cache/kproxy/hadoop-aws-<version>/``; ``scripts/setup.sh``
fetches them for the test profile. Under ``spark-submit``, pass
``--packages org.apache.hadoop:hadoop-aws:<version>`` yourself.
"""

from __future__ import annotations

from pathlib import Path

from ..embedded.kafka import default_cache_dir
from .maven_jars import MARKER, ConnectorError, fetched_jars, pom

# PySpark 4.3.0's Hadoop (its jars/hadoop-client-api-3.5.0.jar) and the AWS SDK release
# that Hadoop 3.5.0 builds against (hadoop-project's aws-java-sdk-v2.version).
HADOOP_VERSION = "3.5.0"
AWS_SDK_VERSION = "2.35.4"
# PySpark's jars already hold these groups (other versions): not fetched.
PROVIDED_GROUPS = ("io.netty", "org.apache.httpcomponents", "commons-codec", "commons-logging", "org.slf4j",
                   "org.wildfly.openssl")

__all__ = ["ConnectorError", "home", "is_fetched", "s3a_jars"]


def home(cache_dir: Path | None = None) -> Path:
    return (cache_dir or default_cache_dir()) / f"hadoop-aws-{HADOOP_VERSION}"


def is_fetched(cache_dir: Path | None = None) -> bool:
    return (home(cache_dir) / MARKER).exists()


def check_hadoop() -> None:
    """ConnectorError unless PySpark's Hadoop is the release these jars are for."""
    import pyspark
    jars = Path(pyspark.__file__).parent / "jars"
    found = sorted(p.name for p in jars.glob("hadoop-client-api-*.jar"))
    if found and found[0] != f"hadoop-client-api-{HADOOP_VERSION}.jar":
        raise ConnectorError(f"s3a:// needs hadoop-aws of PySpark's Hadoop release ({found[0]}); kproxy "
                             f"fetches {HADOOP_VERSION}'s: install the pyspark version in constraints.txt")


def s3a_jars(cache_dir: Path | None = None) -> list[str]:
    """The S3A jar paths, fetched first if need be. Raises ConnectorError."""
    dependencies = f"""    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-aws</artifactId>
      <version>{HADOOP_VERSION}</version>
      <exclusions><exclusion><groupId>software.amazon.awssdk</groupId><artifactId>bundle</artifactId></exclusion>
      </exclusions>
    </dependency>
    <dependency><groupId>software.amazon.awssdk</groupId><artifactId>s3</artifactId>
      <version>{AWS_SDK_VERSION}</version></dependency>
    <dependency><groupId>software.amazon.awssdk</groupId><artifactId>s3-transfer-manager</artifactId>
      <version>{AWS_SDK_VERSION}</version></dependency>"""
    return fetched_jars(home(cache_dir), "Hadoop's S3A file system", pom("hadoop-aws-classpath", dependencies),
                        [f"-DexcludeGroupIds={','.join(PROVIDED_GROUPS)}"])


if __name__ == "__main__":                           # scripts/setup.sh: python -m kproxy.pipeline.s3_jars
    print("\n".join(s3a_jars()))
