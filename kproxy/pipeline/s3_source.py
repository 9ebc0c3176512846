"""Capture files in S3-compatible object storage: ``s3a://bucket/prefix`` (or ``s3://``).

kproxies with a ``capture.s3`` table upload each closed capture file as
``<prefix>/<proxy instance>/<file name>`` (``observers/capture/s3_upload.py``).
Spark reads them with Hadoop's S3A file system (its jars: ``s3_jars``); ``s3://`` is
taken as ``s3a://``. The files under the prefix are listed through the same file
system, at any depth, so a fleet's files are found and one format is chosen as for a
local directory (Parquet when there is any, else JSONL; pcapng is left alone), and
``--since`` leaves out files by their names; the tables cannot tell a bucket from a
directory.

Where and as whom, from the environment the AWS tools read (what the Spark
configuration already sets, ``spark.hadoop.fs.s3a.*``, wins):

- ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``: an S3-compatible server (then
  path-style requests, which such servers expect);
- ``AWS_REGION`` or ``AWS_DEFAULT_REGION`` (``us-east-1`` for such a server if unset);
- ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` (``AWS_SESSION_TOKEN``), else the AWS
  SDK's default chain: profiles (``AWS_PROFILE``), web identity, container and
  instance credentials.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from typing import Mapping
from urllib.parse import urlparse

from .source import FORMATS, InputError, Inputs, format_of, prune_before

SCHEMES = ("s3", "s3a")
# A server other than AWS, without a region of its own: signatures still name one.
DEFAULT_REGION = "us-east-1"
# The AWS SDK's own chain (environment, profiles, web identity, container, instance), after
# keys given here: S3A's default chain has no profiles.
_CREDENTIAL_PROVIDERS = ("org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider,"
                         "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider,"
                         "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider")


def is_s3(path: str) -> bool:
    return urlparse(path).scheme in SCHEMES


def s3a_uri(path: str) -> str:
    """``s3://b/p`` or ``s3a://b/p/`` → ``s3a://b/p``; InputError without a bucket."""
    url = urlparse(path)
    if url.scheme not in SCHEMES or not url.netloc:
        raise InputError(f"{path}: expected s3a://BUCKET[/PREFIX] (or s3://)")
    return f"s3a://{url.netloc}{url.path}".rstrip("/")


def check_paths(paths: list[str]) -> list[str]:
    """Every path an s3a:// URI (a bucket cannot be mixed with local files): the URIs."""
    if not all(is_s3(path) for path in paths):
        raise InputError("mix of s3:// URIs and other paths: give one kind per run")
    return [s3a_uri(path) for path in paths]


@dataclass(frozen=True)
class S3Settings:
    """Where the store is and the keys to it, as the environment says (None: not said)."""
    endpoint_url: str | None = None
    region: str | None = None
    access_key: str | None = None
    secret_key: str | None = None
    session_token: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "S3Settings":
        def get(*names: str) -> str | None:
            return next((environ[n] for n in names if environ.get(n)), None)
        return cls(get("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"), get("AWS_REGION", "AWS_DEFAULT_REGION"),
                   get("AWS_ACCESS_KEY_ID"), get("AWS_SECRET_ACCESS_KEY"), get("AWS_SESSION_TOKEN"))

    def hadoop(self) -> dict[str, str]:
        """Hadoop settings (``fs.s3a.*``) for these."""
        out = {"fs.s3a.aws.credentials.provider": _CREDENTIAL_PROVIDERS}
        if self.endpoint_url:
            out.update({"fs.s3a.endpoint": self.endpoint_url, "fs.s3a.path.style.access": "true",
                        "fs.s3a.endpoint.region": self.region or DEFAULT_REGION})
        elif self.region:
            out["fs.s3a.endpoint.region"] = self.region
        if self.access_key and self.secret_key:
            out.update({"fs.s3a.access.key": self.access_key, "fs.s3a.secret.key": self.secret_key})
            if self.session_token:
                out["fs.s3a.session.token"] = self.session_token
        return out


def configure(spark, settings: S3Settings | None = None) -> None:
    """Give Spark's Hadoop configuration the S3A settings its own configuration leaves unset."""
    settings = settings if settings is not None else S3Settings.from_env()
    conf = spark.sparkContext.getConf()
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in settings.hadoop().items():
        if not conf.contains(f"spark.hadoop.{key}"):
            hadoop.set(key, value)


def list_files(spark, uri: str) -> list[str]:
    """Every file under ``uri`` (an object, or a prefix at any depth), via Hadoop's S3A."""
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(uri)
    from py4j.protocol import Py4JJavaError
    try:
        fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
        status = fs.getFileStatus(path)
        if status.isFile():
            return [status.getPath().toString()]
        found, listing = [], fs.listFiles(path, True)
        while listing.hasNext():
            found.append(listing.next().getPath().toString())
        return found
    except Py4JJavaError as exc:
        error = exc.java_exception
        if error.getClass().getName() == "java.io.FileNotFoundException":
            raise InputError(f"no such object or prefix: {uri}") from None
        raise InputError(f"{uri}: {error.getClass().getSimpleName()}: {error.getMessage()}") from None


def resolve(spark, paths: list[str], fmt: str = "auto", since: dt.datetime | None = None) -> Inputs:
    """The capture files under the URIs, of one format, as ``source.resolve_inputs`` does for files."""
    if fmt not in ("auto", *FORMATS):
        raise InputError(f"--format must be auto, parquet or jsonl, got {fmt!r}")
    configure(spark)
    found = [f for uri in check_paths(paths) for f in list_files(spark, uri)]
    by_format = {f: sorted(p for p in found if format_of(p) == f) for f in FORMATS}
    if fmt == "auto":
        fmt = "parquet" if by_format["parquet"] else "jsonl"
    files = by_format[fmt]
    if not files:
        wanted = "capture files (.parquet or .jsonl)" if not found else f"{fmt} capture files"
        raise InputError(f"no {wanted} under {' '.join(paths)}")
    skipped = tuple(f"{len(v)} {k} files (the {fmt} files hold the same pairs)"
                    for k, v in by_format.items() if k != fmt and v)
    kept, pruned = prune_before(files, since) if since is not None else (files, 0)
    return Inputs(tuple(kept), fmt, skipped, pruned)
