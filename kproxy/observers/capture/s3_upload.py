"""Capture files uploaded to S3-compatible object storage as each one is closed.

``S3Target`` is the operator's ``capture.s3`` table: a bucket, a key prefix, and
for a server other than AWS its endpoint URL. Every file a capture session
closes (rotation, stop) is uploaded as ``<prefix>/<proxy instance>/<file name>``:
the instance keeps a fleet's files apart (names restart their sequence in each
process), and ``kproxy analyze s3a://bucket/prefix`` reads the whole fleet.

``Uploader`` runs beside the writer thread, in a thread of its own, since an
upload of a 128 MiB file takes seconds and the writer must keep draining the
event-loop queue. The writer only hands it a path (``submit``, never waits);
paths waiting past ``queue_max_files`` are not uploaded and are counted. A file
is never deleted before it is uploaded; with ``delete_after_upload`` it is
deleted once it is. The local size cap (``max_total_bytes``) still rules the
disk: a file it deletes before its turn is counted as failed.

Why boto3 (the ``s3`` extra): the AWS credential chain operators expect
(environment, shared config and credentials files with profiles, SSO, web
identity for Kubernetes service accounts, container and instance metadata),
``AWS_ENDPOINT_URL``, retries, and multipart uploads of large files; none of it
worth writing again. Optional, since most kproxies keep files on their own disk.

Counted on the capture, each by one thread:

- ``files_uploaded`` / ``uploaded_bytes`` (uploader thread): files the store took.
- ``upload_failed`` (uploader thread): uploads the store refused or that failed
  after the client's retries, files gone before their turn, and files still
  waiting when the capture stopped and ``stop_timeout_seconds`` ran out. The
  files stay on disk.
- ``upload_dropped`` (writer thread): closed files not queued for upload because
  ``queue_max_files`` were waiting already (the store is slow or away).
"""

from __future__ import annotations

import logging
import math
import os
import queue
import re
import threading
import time
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

log = logging.getLogger("kproxy.capture")

# S3's own rule for bucket names (3-63 lower-case letters, digits, '.', '-').
BUCKET_PATTERN = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
# Key prefixes: printable, no leading slash (kept simple: what S3 and the s3a reader agree on).
PREFIX_PATTERN = re.compile(r"[A-Za-z0-9!_.*'()/=-]{0,512}")
# Characters of an instance name kept in its key segment; others become '_'.
_UNSAFE_KEY_CHARS = re.compile(r"[^A-Za-z0-9._-]")
# Closed files waiting for their upload. At the default rotate_bytes (128 MiB) that is
# 12 GiB of backlog, more than the default disk cap holds: the cap, not this, bounds it.
DEFAULT_QUEUE_FILES = 100
MAX_QUEUE_FILES = 100_000
# When the capture stops (kproxy shutting down), the last files get this long to upload:
# inside the capture's own stop timeout (30 s) and Kubernetes' 30 s grace.
DEFAULT_STOP_TIMEOUT_S = 20.0
MAX_STOP_TIMEOUT_S = 300.0
# The S3 client's own limits: a connection to an absent store fails in seconds, not
# minutes, and a failed request is tried this many times in all (botocore's "standard" mode).
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 60.0
MAX_ATTEMPTS = 3
# Parts of one large (multipart) upload sent at once: enough to fill a link to the store,
# few enough that the threads do not compete with the relay for the interpreter.
UPLOAD_THREADS = 4
# How often the idle upload thread looks whether the capture has stopped.
POLL_S = 0.5


@dataclass(frozen=True)
class S3Target:
    """Where closed capture files are uploaded: ``capture.s3`` (config file or KPROXY_CAPTURE only)."""

    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None      # an S3-compatible server (MinIO, Ceph, s3proxy...); AWS if unset
    region: str | None = None            # else AWS_REGION / the profile's region
    path_style: bool | None = None       # bucket in the path, not the host name; default: with endpoint_url
    delete_after_upload: bool = False    # keep local files (the disk cap bounds them) unless asked
    queue_max_files: int = DEFAULT_QUEUE_FILES
    stop_timeout_seconds: float = DEFAULT_STOP_TIMEOUT_S

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, key: str = "capture.s3") -> None:
        if not isinstance(self.bucket, str) or not BUCKET_PATTERN.fullmatch(self.bucket) or ".." in self.bucket:
            raise ValueError(f"{key}.bucket: 3-63 lower-case letters, digits, '.' or '-', got {self.bucket!r}")
        if not isinstance(self.prefix, str) or not PREFIX_PATTERN.fullmatch(self.prefix) \
                or self.prefix.startswith("/") or "//" in self.prefix:
            raise ValueError(f"{key}.prefix: a key prefix without a leading '/' or '//', got {self.prefix!r}")
        if self.endpoint_url is not None and not re.fullmatch(r"https?://[^\s/]+/?", str(self.endpoint_url)):
            raise ValueError(f"{key}.endpoint_url: expected http(s)://HOST[:PORT], got {self.endpoint_url!r}")
        for name in ("path_style", "delete_after_upload"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"{key}.{name}: expected true or false, got {value!r}")
        for name, lowest, highest in (("queue_max_files", 1, MAX_QUEUE_FILES),
                                      ("stop_timeout_seconds", 0, MAX_STOP_TIMEOUT_S)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not lowest <= value <= highest:
                raise ValueError(f"{key}.{name}: expected a number from {lowest} to {highest}, got {value!r}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], key: str = "capture.s3") -> "S3Target":
        from ...spelling import check_table
        check_table(data, {f.name for f in fields(cls)}, key)
        if not data.get("bucket"):
            raise ValueError(f"{key}.bucket: required")
        values = {name: value for name, value in data.items() if value is not None}
        for name in ("path_style", "delete_after_upload"):
            if isinstance(values.get(name), str) and values[name].lower() in ("true", "false"):
                values[name] = values[name].lower() == "true"
        for name, kind in (("queue_max_files", int), ("stop_timeout_seconds", float)):
            if isinstance(values.get(name), str):
                try:
                    values[name] = kind(values[name])
                except ValueError:
                    pass                               # validate() names it
        if isinstance(values.get("prefix"), str):
            values["prefix"] = values["prefix"].strip("/")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def uri(self) -> str:
        """Where ``kproxy analyze`` reads the fleet's files: ``s3a://bucket/prefix``."""
        return f"s3a://{self.bucket}/{self.prefix}".rstrip("/")

    def object_key(self, instance: str, file_name: str) -> str:
        """``<prefix>/<instance>/<file name>``, the instance made safe for a key segment."""
        segment = _UNSAFE_KEY_CHARS.sub("_", instance).strip(".") or "_"
        return "/".join(part for part in (self.prefix, segment, file_name) if part)

    def client(self):
        """A boto3 S3 client for this target: the default credential chain, bounded retries."""
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise OSError("capture.s3 needs boto3: pip install 'kproxy-kafka[s3]'") from None
        path_style = self.path_style if self.path_style is not None else self.endpoint_url is not None
        config = Config(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S,
                        retries={"mode": "standard", "max_attempts": MAX_ATTEMPTS},
                        s3={"addressing_style": "path" if path_style else "auto"})
        try:
            return boto3.session.Session().client("s3", endpoint_url=self.endpoint_url,
                                                  region_name=self.region, config=config)
        except Exception as exc:          # noqa: BLE001 - botocore's errors for a bad profile or region
            raise OSError(f"capture.s3: {exc}") from None


class Uploader(threading.Thread):
    """Uploads the capture's closed files, one at a time, off the writer thread."""

    def __init__(self, target: S3Target, counters, instance: str):
        super().__init__(name="kproxy-capture-upload", daemon=True)
        self.target = target
        self.counters = counters
        self.instance = instance
        self.queue: queue.Queue = queue.Queue(maxsize=target.queue_max_files)
        self.deadline: float | None = None           # set by finish(): stop waiting for the store then
        self.client = None
        self.transfer = None                         # boto3's TransferConfig, made in the thread
        self._logged_failure = False

    def open(self) -> None:
        """Create the client (in the caller's thread, so a missing library fails start()) and start."""
        self.client = self.target.client()
        self.start()

    def submit(self, path: str) -> None:
        """A file was closed: queue it, never wait (writer thread)."""
        try:
            self.queue.put_nowait(path)
        except queue.Full:
            self.counters.upload_dropped += 1
            if self.counters.upload_dropped == 1:
                log.warning("capture: %d closed files already wait for upload to %s; %s stays local "
                            "(counted in upload_dropped; logged once)", self.target.queue_max_files,
                            self.target.uri, path)

    def finish(self) -> None:
        """The capture stopped: upload what is queued within stop_timeout_seconds, then stop."""
        if not self.is_alive():
            return
        self.deadline = time.monotonic() + self.target.stop_timeout_seconds
        self.join(self.target.stop_timeout_seconds + CONNECT_TIMEOUT_S)

    def run(self) -> None:
        from boto3.s3.transfer import TransferConfig
        self.transfer = TransferConfig(max_concurrency=UPLOAD_THREADS)
        while True:
            try:
                path = self.queue.get(timeout=POLL_S)
            except queue.Empty:
                if self.deadline is not None:        # stopped, and nothing left
                    return
                continue
            if self.deadline is not None and time.monotonic() > self.deadline:
                self._failed(path, "not uploaded before the capture stopped")
                continue
            self._upload(path)

    def _upload(self, path: str) -> None:
        key = self.target.object_key(self.instance, os.path.basename(path))
        try:
            size = os.path.getsize(path)
            self.client.upload_file(path, self.target.bucket, key, Config=self.transfer)
        except FileNotFoundError:
            self._failed(path, "deleted (by the disk cap) before its upload")
            return
        except Exception as exc:          # noqa: BLE001 - botocore/boto3 raise many types; never stop
            self._failed(path, str(exc))
            return
        self.counters.files_uploaded += 1
        self.counters.uploaded_bytes += size
        if self.target.delete_after_upload:
            try:
                os.unlink(path)
            except OSError:
                pass                                 # gone already, or the cap's to handle

    def _failed(self, path: str, why: str) -> None:
        self.counters.upload_failed += 1
        if not self._logged_failure:
            self._logged_failure = True
            log.warning("capture: %s not uploaded to %s (kept on disk; further failures are counted "
                        "in upload_failed, not logged): %s", path, self.target.uri, why)
