"""One local SparkSession for every pipeline test (starting one costs seconds).

Settings from DESIGN.md that keep Spark quick on two cores: ``local[2]``, no UI,
no console progress bar, two shuffle partitions, UTC, loopback only; and a C1-only JIT. Tests that
use it get the ``spark`` marker, so ``pytest -m "not spark"`` leaves them out.
Spark's Kafka connector (``kproxy.pipeline.kafka_jars``, fetched by setup.sh) and
Hadoop's S3A (``s3_jars``) are on its class path, for the tests that read shipped
capture rows from a topic or uploaded files from s3proxy;
``tests/proxy/test_capture_shipping.py`` imports this fixture, so there is still
one session.
"""

from __future__ import annotations

import os
import sys

import pytest

from kproxy.pipeline.cli import LOG4J_CONFIG
from kproxy.pipeline.job import Options
from kproxy.pipeline.synthetic import write_synthetic

# The one whole job over ``synthetic_capture`` (test_tables checks its tables, test_report
# renders its report in Chromium): five-minute windows, the 15 slowest pairs, with the report.
SYNTHETIC_OPTIONS = Options(window_seconds=300, top=15)

# C1 only: the tests run many small, different queries, so the driver's code is compiled
# often and run little; it cut the JVM's CPU over test_tables.py from 98 to 70 s.
DRIVER_JIT = "-XX:TieredStopAtLevel=1"


def pytest_collection_modifyitems(items):
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark():
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)     # Python workers: this venv's interpreter
    from pyspark.sql import SparkSession
    from kproxy.pipeline.kafka_jars import connector_jars
    from kproxy.pipeline.s3_jars import s3a_jars
    session = (SparkSession.builder.master("local[2]").appName("kproxy-tests")
               .config("spark.jars", ",".join(connector_jars() + s3a_jars()))
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.extraJavaOptions",
                       f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG} {DRIVER_JIT}")
               .getOrCreate())
    yield session
    session.stop()


@pytest.fixture(scope="session")
def synthetic_capture(tmp_path_factory):
    """A directory of synthetic capture Parquet files (20,000 pairs, 4 files)."""
    directory = tmp_path_factory.mktemp("synthetic-capture")
    write_synthetic(str(directory), 20_000, files=4, seed=7)
    return directory


@pytest.fixture(scope="session")
def synthetic_analysis(spark, synthetic_capture, tmp_path_factory):
    """``analyze`` of ``synthetic_capture`` with SYNTHETIC_OPTIONS, run once for the session: a
    whole job costs ten seconds, and the tables and the report are checked by separate tests."""
    from kproxy.pipeline import analyze
    out = tmp_path_factory.mktemp("synthetic-analysis")
    return analyze(spark, [str(synthetic_capture)], str(out), SYNTHETIC_OPTIONS)
