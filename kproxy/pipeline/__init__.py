"""The analysis pipeline: capture files in, answers out, on Spark (PySpark).

It reads the capture schema (``kproxy.observers.capture``) and never the proxy:
it runs wherever the capture files are, on a laptop or a cluster.

- ``source``: capture paths (files, directories, globs, Hadoop URIs) → checked
  inputs → one prepared DataFrame of request/response pairs (v1 and v2 files).
- ``tables``: one function per question, DataFrame in, DataFrame out, Spark SQL
  only (no Python per row, nothing collected): per API latency/errors/throttle,
  time series and anomalies, clients and software inventory, upgrade readiness
  (KIP-896), topics and who produces/consumes them, consumer groups and
  rebalances, slowest pairs, connection churn.
- ``scan``: the prepared pairs narrowed once for every table, cached where that
  pays (small Parquet captures in memory, JSONL on disk).
- ``job``: runs them all, writes ``tables/<name>/`` Parquet and ``summary.json``;
  ``report``: ``report.html`` (self-contained, plots embedded) and ``plots/*.png``.
- ``load``: ``load_capture``, the entry that reads the source its paths name
  (capture files, a topic, a bucket).
- ``kafka_source`` / ``s3_source``: shipped rows in a topic, uploaded files in a bucket
  (``kafka_jars`` / ``s3_jars``: their jars, fetched by Maven into kproxy's cache).
- ``follow``: the Structured Streaming variant over a directory being written.
- ``cli``: ``kproxy analyze``; ``submit.py``: the file to hand to ``spark-submit``.
"""

_EXPORTS = {"TABLE_NAMES": "job", "Options": "job", "Result": "job", "analyze": "job",
            "InputError": "source", "load_capture": "load", "resolve_inputs": "source"}


def __getattr__(name):
    """Exports load on first use, so ``kproxy run`` never imports PySpark."""
    if name not in _EXPORTS:
        raise AttributeError(name)
    import importlib
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)


__all__ = ["InputError", "Options", "Result", "TABLE_NAMES", "analyze", "load_capture", "resolve_inputs"]
