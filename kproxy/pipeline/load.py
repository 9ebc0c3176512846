"""A capture read from where its paths say it is: capture files (``source``), rows shipped
to a Kafka topic (``kafka_source``), objects in a bucket (``s3_source``).

The one entry above the sources: each builds on ``source``'s pieces (``InputError``,
``Inputs``, the Spark schema), and ``source`` imports none of them back.
"""

from __future__ import annotations

import datetime as dt

from .source import prepare, read_capture, resolve_inputs


def load_capture(spark, paths: list[str], fmt: str = "auto", since: dt.datetime | None = None,
                 until: dt.datetime | None = None):
    """Resolve, check and read capture files (or a ``kafka://`` topic, or ``s3a://`` objects):
    (Inputs, prepared DataFrame)."""
    from .topic_ids import resolve_topic_ids
    if any(path.startswith("kafka://") for path in paths):
        from . import kafka_source
        inputs, raw = kafka_source.read(spark, paths)
        return inputs, prepare(raw, since, until)
    from . import s3_source
    if any(s3_source.is_s3(path) for path in paths):
        inputs = s3_source.resolve(spark, paths, fmt, since)    # listed through Spark's S3A
    else:
        inputs = resolve_inputs(paths, fmt, since)
    return inputs, prepare(resolve_topic_ids(read_capture(spark, inputs)), since, until)
