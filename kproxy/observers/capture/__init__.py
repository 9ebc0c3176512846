"""Traffic capture for debugging and offline analysis: JSON Lines, Parquet, pcapng.

An observer (``Capture``) fed the connection tracker's events. On the event
loop it only filters and enqueues; a writer thread decodes, redacts and
writes, so a slow or failing disk never slows traffic: a full queue drops
(and counts) events, a disk error stops the capture with one log line.

- ``capture.py``: the observer, its hooks (``__call__``, ``connection_closed``),
  control (``start``/``stop``/``status``) and counters.
- ``config.py`` / ``filters.py``: what to capture (APIs, client_id, client
  address, topics, sampling) and where (directory, prefix, rotation, cap).
- ``session.py``: the event-loop half; ``writer.py``: the writer thread.
- ``summary.py``: one row per request/response pair; ``redact.py``: secrets
  and record data never written, decompression bounded.
- ``jsonl.py``, ``parquet.py`` (schema in ``SCHEMA.md``), ``pcapng.py``:
  the formats; ``files.py``: where files may go (under ``capture_root``, no
  symbolic links), 0600 files, rotation, a size cap over this capture's files only.
- ``kafka_sink.py``: rows shipped to a Kafka topic; ``s3_upload.py``: closed files
  uploaded to S3-compatible storage, from a thread of its own.
- ``control.py``: admin-route helpers (root, record-data consent); ``cli.py``:
  ``kproxy capture show|stats``.
"""

from .capture import COUNTERS, Capture, CaptureError
from .config import FORMATS, CaptureConfig
from .filters import CaptureFilter
from .summary import SCHEMA_VERSION

__all__ = ["COUNTERS", "Capture", "CaptureConfig", "CaptureError", "CaptureFilter", "FORMATS",
           "SCHEMA_VERSION"]
