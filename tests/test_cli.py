"""The command line as a user meets it, in ``kproxy`` processes: --version, help for bare
commands, ``run --help``, one error style and exit status for every command, capture tools
refusing what is no capture, and the start-up block naming every listener."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import kproxy
from kproxy import cli
from kproxy.config import ENV_PREFIX
from tests.proxy.harness import http_status, silent_port

REPO = Path(__file__).resolve().parents[1]
COMMAND_TIMEOUT_S = 60          # an interpreter start and imports on a busy machine
START_TIMEOUT_S = 60            # until the start-up block is logged
# An address of TEST-NET-1 (RFC 5737): assigned to no host, so binding it fails.
NOT_THIS_HOST = "192.0.2.1"


def kproxy_cmd(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    return subprocess.run([sys.executable, "-m", "kproxy", *args], capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT_S, cwd=cwd,
                          env={**base, "PYTHONPATH": str(REPO), **(env or {})})


def one_error_line(result: subprocess.CompletedProcess, command: str) -> str:
    """The stderr of a command that failed with exactly one line, ``kproxy <command>: error: ...``."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"kproxy {command}: error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def flat(text: str) -> str:
    return " ".join(text.split())          # argparse wraps help text anywhere


# ---------------------------------------------------------------- version and help

def test_version_prints_the_package_version():
    result = kproxy_cmd("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"kproxy {kproxy.__version__}"
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", kproxy.__version__)


@pytest.mark.parametrize("args, commands", [
    ((), ("run", "capture", "analyze", "demo")),
    (("capture",), ("show", "stats")),
])
def test_a_bare_command_group_prints_its_help_and_exits_2(args, commands):
    result = kproxy_cmd(*args)
    assert result.returncode == 2
    assert result.stderr.startswith(f"usage: kproxy {' '.join(args)}".rstrip() + " ")
    for command in commands:
        assert re.search(rf"^\s+{command}\s+\S", result.stderr, re.M), result.stderr
    assert "required" not in result.stderr          # argparse's "arguments are required: ..."


def test_run_help_has_a_description_choices_defaults_env_vars_and_the_file_only_settings():
    result = kproxy_cmd("run", "--help")
    assert result.returncode == 0, result.stderr
    text = flat(result.stdout)
    assert "Run kproxy in front of Kafka brokers" in text
    for flag, choices in (("--mode", "{gateway,sidecar}"), ("--routing", "{ports,sni}"),
                          ("--broker-port-rule", "{offset,sequential,map,fixed}"),
                          ("--log-level", "{DEBUG,INFO,WARNING,ERROR}")):
        assert f"{flag} {choices}" in text
    for flag, (key, _) in cli.RUN_FLAGS.items():
        assert re.search(rf"{flag} .*?\(default: [^;]+; env {ENV_PREFIX}{key.upper()}\)", text), flag
    assert "(default: gateway; env KPROXY_MODE)" in text
    assert "(default: 127.0.0.1:9644; env KPROXY_ADMIN_LISTEN)" in text
    epilog = text[text.index("Settings with no flag"):]
    for key in ("tls_server", "tls_client", "capture", "metrics_client_id_label", "admin_token_file"):
        assert key in epilog
    assert 'README.md, "Settings reference"' in epilog


# ---------------------------------------------------------------- errors: usage, config, input

def test_the_wildcard_listen_address_without_advertised_host_is_refused():
    result = kproxy_cmd("run", "--upstream", "broker:9092", "--listen", "0.0.0.0:9092")
    assert result.returncode == 2
    assert one_error_line(result, "run") == (
        "kproxy run: error: advertised_host: listen is 0.0.0.0, which clients cannot connect to; set "
        "advertised_host (--advertised-host, KPROXY_ADVERTISED_HOST) to the name or address clients "
        "reach kproxy at")
    result = kproxy_cmd("run", "--upstream", "broker:9092", env={"KPROXY_LISTEN": "[::]:9092"})
    assert result.returncode == 2 and "advertised_host: listen is ::," in one_error_line(result, "run")


def test_two_listeners_on_one_port_are_refused_before_anything_binds():
    result = kproxy_cmd("run", "--upstream", "broker:9092", "--listen", "0.0.0.0:9092",
                        "--advertised-host", "kafka.example.com", "--admin-listen", "127.0.0.1:9092")
    assert result.returncode == 2
    line = one_error_line(result, "run")
    assert "admin_listen: 127.0.0.1:9092 overlaps listen (0.0.0.0:9092)" in line


@pytest.mark.parametrize("args, command", [
    (["run", "--upstream", "b:1", "--no-such-flag"], "run"),
    (["run", "--upstream"], "run"),
    (["capture", "show"], "capture show"),
    (["capture", "stats", "x", "--top", "many"], "capture stats"),
    (["demo", "--port", "x"], "demo"),
    (["no-such-command"], ""),
])
def test_usage_errors_name_the_command_and_exit_2(args, command):
    result = kproxy_cmd(*args)
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]        # argparse prints the usage first
    assert last.startswith(" ".join(["kproxy", command]).strip() + ": error: "), result.stderr


def test_config_file_mistakes_name_the_file_line_and_key(tmp_path):
    misspelt = tmp_path / "kproxy.toml"
    misspelt.write_text('upstream = "b:1"\nmax_conections = 10\n')
    result = kproxy_cmd("run", "--config", str(misspelt))
    assert result.returncode == 2
    assert one_error_line(result, "run") == (f"kproxy run: error: config file {misspelt}: max_conections: "
                                             f"unknown setting (did you mean max_connections?)")
    broken = tmp_path / "kproxy.yaml"
    broken.write_text("upstream: b:1\nlisten: 127.0.0.1:9092\n  admin_listen: off\n")
    result = kproxy_cmd("run", "--config", str(broken))
    assert result.returncode == 2
    line = one_error_line(result, "run")
    assert f"config file {broken}, line 3, column " in line and "<unicode string>" not in line
    broken_toml = tmp_path / "broken.toml"
    broken_toml.write_text('upstream = "b:1"\nlisten = 127.0.0.1:9092\nmode = "gateway"\n')
    result = kproxy_cmd("run", "--config", str(broken_toml))
    assert result.returncode == 2
    assert re.search(rf"config file {re.escape(str(broken_toml))}: .*line 2", one_error_line(result, "run"))


def test_a_taken_or_foreign_admin_address_fails_at_start_naming_admin_listen():
    with silent_port() as (host, taken):
        result = kproxy_cmd("run", "--upstream", "127.0.0.1:1", "--listen", "127.0.0.1:0",
                            "--broker-port-base", "0", "--admin-listen", f"{host}:{taken}")
    assert result.returncode == 1
    line = [l for l in result.stderr.splitlines() if l.startswith("kproxy run: error: ")]
    assert line == [f"kproxy run: error: cannot start: admin_listen {host}:{taken}: address already in use"], \
        result.stderr
    result = kproxy_cmd("run", "--upstream", "127.0.0.1:1", "--listen", "127.0.0.1:0",
                        "--broker-port-base", "0", "--admin-listen", f"{NOT_THIS_HOST}:0")
    assert result.returncode == 1
    assert (f"kproxy run: error: cannot start: admin_listen {NOT_THIS_HOST}:0: cannot assign requested "
            f"address (not an address of this host)") in result.stderr.splitlines()
    result = kproxy_cmd("run", "--upstream", "127.0.0.1:1", "--admin-listen", "9644")
    assert result.returncode == 2
    assert one_error_line(result, "run") == "kproxy run: error: admin_listen: expected HOST:PORT, got '9644'"


# ---------------------------------------------------------------- capture tools

def _not_captures(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "notes.txt").write_text("hello\nthis is not a capture\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "object.json").write_text(json.dumps({"api_name": "Produce", "latency_ms": 3}) + "\n")
    (tmp_path / "array.jsonl").write_text("[1, 2, 3]\n")
    (tmp_path / "fake.parquet").write_bytes(b"PAR1 not really")
    (tmp_path / "binary.jsonl.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    (tmp_path / "c.pcapng").write_bytes(b"\x0a\x0d\x0d\x0a")
    return {"a plain text file": tmp_path / "notes.txt", "an empty directory": tmp_path / "empty",
            "arbitrary JSON": tmp_path / "object.json", "a JSON array": tmp_path / "array.jsonl",
            "a file that is no Parquet": tmp_path / "fake.parquet",
            "a broken gzip file": tmp_path / "binary.jsonl.gz", "a pcapng file": tmp_path / "c.pcapng",
            "a missing path": tmp_path / "missing"}


@pytest.mark.parametrize("tool", ["show", "stats"])
def test_capture_tools_refuse_what_is_no_capture_with_one_line(tool, tmp_path, capsys):
    inputs = _not_captures(tmp_path)
    # Each kind of input through the CLI's entry point in this process, ...
    for what, path in inputs.items():
        status = cli.main(["capture", tool, str(path)])
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert status == 2 and len(lines) == 1, (what, status, err)
        assert lines[0].startswith(f"kproxy capture {tool}: error: ") and str(path) in lines[0], (what, err)
        assert out == "", (what, out)
    # ... and one as a user runs it: the process's exit status and its only line.
    result = kproxy_cmd("capture", tool, str(inputs["a plain text file"]))
    assert result.returncode == 2 and result.stdout == ""
    assert one_error_line(result, f"capture {tool}") == (
        f"kproxy capture {tool}: error: {inputs['a plain text file']}, line 1: not a kproxy capture (not JSON)")


def test_capture_tools_still_read_a_real_capture(tmp_path):
    """The refusals above are not refusing everything: a capture kproxy wrote reads."""
    from kproxy.observers.capture import Capture, CaptureConfig
    from tests.observers.captures import Link, produce_request, produce_response
    capture = Capture()
    capture.start(CaptureConfig(directory=str(tmp_path), formats=("jsonl", "parquet")))
    link = Link(capture, conn_id=1, client=("10.0.0.1", 5000))
    link.exchange(0, 9, 1, produce_request("orders"), produce_response("orders"), client_id="billing")
    link.close(capture)
    capture.stop()
    for fmt in ("jsonl", "parquet"):
        result = kproxy_cmd("capture", "show", str(tmp_path), "--format", fmt)
        assert result.returncode == 0 and "Produce" in result.stdout and result.stderr == "", result.stderr


# ---------------------------------------------------------------- the start-up block and env warnings

def _log_until(process: subprocess.Popen, done: str) -> list[str]:
    """The process's stderr lines until one contains ``done`` (a thread reads them: a pipe
    read blocks)."""
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        for line in process.stderr:
            lines.append(line.rstrip("\n"))
            if done in line:
                seen.set()
    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not seen.wait(0.2):
        assert process.poll() is None and time.monotonic() < deadline, "\n".join(lines)
    return list(lines)


def test_the_start_up_block_names_every_listener_as_bound(tmp_path):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}, "PYTHONPATH": str(REPO),
           "KPROXY_UPSTREM": "typo:9092", "KPROXY_CACHE_DIR": str(tmp_path),
           "KPROXY_ADMIN_TOKEN": "t" * 32}
    process = subprocess.Popen(
        [sys.executable, "-m", "kproxy", "run", "--upstream", "127.0.0.1:1", "--listen", "127.0.0.1:0",
         "--broker-port-base", "0", "--admin-listen", "127.0.0.1:0", "--probe-listen", "127.0.0.1:0"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        log = _log_until(process, "  policy  ")            # the block's last line
        text = "\n".join(log)
        # An unknown KPROXY_* variable is a warning with a suggestion; kproxy's other ones are not.
        warnings = [line for line in log if " WARNING kproxy.config " in line]
        assert len(warnings) == 1, text
        assert warnings[0].endswith("KPROXY_UPSTREM is not a kproxy setting and is ignored "
                                    "(did you mean KPROXY_UPSTREAM?)")
        block = [line.split(" INFO kproxy ", 1)[1] for line in log if " INFO kproxy " in line]
        assert block[0].startswith(f"kproxy {kproxy.__version__} serving: gateway mode, routing a port "
                                   f"per broker (ports), upstream 127.0.0.1:1"), text
        fields = {line[2:19].strip(): line for line in block[1:]}       # "  admin            ..."
        assert set(fields) == {"kafka bootstrap", "kafka brokers", "admin", "probes", "TLS", "PROXY protocol",
                               "capture", "audit", "policy"}, text
        assert fields["audit"].endswith(" cluster changes to the kproxy.audit log"), text
        assert fields["PROXY protocol"].endswith(" off"), text
        bootstrap = re.search(r"kafka bootstrap  127\.0\.0\.1:(\d+) \(clients told 127\.0\.0\.1:\1\)",
                              fields["kafka bootstrap"])
        admin = re.search(r"(http://127\.0\.0\.1:\d+) \(", fields["admin"])
        probes = re.search(r"(http://127\.0\.0\.1:\d+) \(", fields["probes"])
        assert bootstrap and admin and probes, text
        assert "admin token set" in fields["admin"]
        assert fields["TLS"].endswith("clients off; brokers off")
        assert "off" in fields["capture"]
        # What the block names is what listens (each port was chosen by the OS).
        assert http_status(admin[1] + "/healthz")[0] == 200
        assert http_status(probes[1] + "/healthz")[0] == 200
        socket.create_connection(("127.0.0.1", int(bootstrap[1])), timeout=5).close()
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(COMMAND_TIMEOUT_S) == 0
