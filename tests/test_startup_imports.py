"""What a fresh ``kproxy run`` loads: libraries only some requests need come in at first use.

Checked by module name in a fresh interpreter, so the test is deterministic; what it is
worth in resident memory is measured by benchmarks/bench_peers.py ("RSS fresh").
"""

import subprocess
import sys
import textwrap

# Not needed until a record batch is decompressed or its CRC checked (a capture, or the
# live page showing record data), a capture writes Parquet, or ``kproxy analyze`` runs.
# python-snappy is not listed: prometheus_client's exposition imports it itself.
LOADED_AT_FIRST_USE = ("crc32c", "lz4", "zstandard", "pyarrow", "pyspark", "matplotlib",
                       "kproxy.observers.capture.parquet", "kproxy.pipeline.job",
                       "cryptography",                       # only with TLS configured
                       "google.protobuf", "opentelemetry")   # the first client telemetry push

# The start of ``kproxy run``: the command line (every subcommand's parser), the config,
# the runtime and its observers, without opening a socket.
START = textwrap.dedent("""
    import contextlib, io, sys
    from kproxy import cli, config
    from kproxy.runtime import Runtime
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        cli.main(["--help"])
    runtime = Runtime(config.load(overrides={"upstream": "127.0.0.1:9092",
                                             "admin_listen": "127.0.0.1:0"}))
    watched = %r
    print(sorted(m for m in watched if m in sys.modules))
""" % (LOADED_AT_FIRST_USE,))


def run_fresh(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_fresh_run_loads_no_codec_library_capture_writer_or_pipeline():
    assert run_fresh(START).splitlines() == ["[]"]


def test_the_first_batch_that_needs_a_codec_library_still_decodes():
    code = START + textwrap.dedent("""
        from kproxy.protocol.errors import DecodeError
        from kproxy.protocol.record_encoder import build_batch
        from kproxy.protocol.records import Record, split_batches
        sent = [Record(0, 1_700_000_000_000, b"k", b"v" * 100, ())]
        # A corrupt payload before any library is loaded: the error classes load then.
        gzip = bytearray(build_batch(sent, "gzip"))
        gzip[61:63] = b"\\0\\0"                      # the gzip magic, first payload bytes
        try:
            split_batches(bytes(gzip))[0][0].records()
        except DecodeError as exc:
            print("corrupt:", "corrupt gzip payload" in str(exc))
        for codec in ("snappy", "lz4", "zstd"):
            (batch,), _ = split_batches(build_batch(sent, codec))
            batch.verify_crc()
            print(codec, [(r.key, r.value) for r in batch.records()] == [(b"k", b"v" * 100)])
    """)
    assert run_fresh(code).splitlines() == [
        "[]", "corrupt: True", "snappy True", "lz4 True", "zstd True"]
