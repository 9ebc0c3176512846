"""Capture control on a running kproxy's admin listener: real traffic, and what an attacker tries.

Every attack from issue 10 (item 1) is sent to the real admin listener of a real Runtime:
a capture directory of /etc, ``..``, an absolute path outside ``capture_root``, a symbolic
link; a size cap aimed at someone else's ``app-*.jsonl``; sizes of 2^61; record data without
the operator's consent; and all of it without the admin token, or with a wrong one.
"""

from __future__ import annotations

import errno
import glob
import json
import logging
import os
import secrets
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from kproxy import config as kconfig
from kproxy.observers.capture.files import FileSet, directory_in_root, open_directory
from tests.proxy.harness import KproxyProcess, ProxyThread
from tests.proxy.wire import API_VERSIONS, API_VERSIONS_FIELDS, RawClient

TOKEN = secrets.token_hex(24)


def call(url: str, body: dict | bytes | None = None, token: str | None = TOKEN,
         authorization: str | None = None) -> tuple[int, dict | str]:
    """GET (no body) or POST; the JSON answer, or its text when it is not JSON."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    if authorization is not None:
        request.add_header("Authorization", authorization)
    elif token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def proxy_without_broker(**settings) -> ProxyThread:
    """A real kproxy whose upstream is unreachable: the admin listener is all these tests need."""
    return ProxyThread(upstream="127.0.0.1:1", **settings)


def tree(directory: Path) -> set[str]:
    return {str(p.relative_to(directory)) for p in directory.rglob("*")} if directory.exists() else set()


@pytest.fixture
def root(tmp_path) -> Path:
    path = tmp_path / "root"
    path.mkdir()
    return path


@pytest.fixture
def admin(root):
    with proxy_without_broker(capture_root=str(root), admin_token=TOKEN) as proxy:
        yield proxy.admin_url


# ---------------------------------------------------------------- with real traffic

def test_capture_over_the_admin_listener(kafka_cluster, tmp_path):
    from kafka import KafkaProducer

    capture_dir = tmp_path / "capture"
    with ProxyThread(upstream=kafka_cluster.bootstrap_servers,
                     capture={"directory": str(capture_dir), "formats": "jsonl,parquet"},
                     admin_token=TOKEN) as proxy:
        admin = proxy.admin_url
        assert call(admin + "/capture")[1]["state"] == "off"
        status, body = call(admin + "/capture/start", {"formats": ["jsonl", "parquet", "pcapng"],
                                                       "filter": {"apis": ["Produce", "Metadata"]}})
        assert status == 200 and body["active"], body
        assert call(admin + "/capture/start", {})[0] == 409            # already running
        producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, client_id="admin-cap")
        topic = f"adm-{uuid.uuid4().hex[:6]}"
        for i in range(10):
            producer.send(topic, value=b"m%d" % i)
        producer.flush()
        producer.close()
        status, body = call(admin + "/capture/stop", {})
        assert status == 200 and not body["active"]
        with urllib.request.urlopen(admin + "/metrics", timeout=10) as r:
            metrics = r.read().decode()
        assert call(admin + "/capture/start", {"formats": ["pdf"]})[0] == 400
    files = sorted(Path(capture_dir).iterdir())
    assert {f.suffix for f in files} == {".jsonl", ".parquet", ".pcapng"}
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in files)
    rows = [json.loads(line) for f in files if f.suffix == ".jsonl" for line in f.read_text().splitlines()]
    assert rows and {r["api_name"] for r in rows} <= {"Produce", "Metadata"}
    assert any(r["api_name"] == "Produce" and topic in r["topics"] for r in rows)
    written = [line for line in metrics.splitlines() if line.startswith("kproxy_capture_rows_written_total ")]
    assert written and float(written[0].split()[1]) >= len(rows) > 0


# A request answered within this on an idle broker, however loaded the machine is: a
# liveness bound (the proxy still serves others), not a latency target.
CANARY_BOUND_S = 2.0
HOSTILE_CLIENT_ID = "a" * 10_000 + "!"


def test_a_client_id_cannot_make_a_capture_filter_freeze_the_proxy(kafka_cluster, root, tmp_path):
    """``(a+)+$`` backtracks exponentially in Python's ``re`` on a long run of 'a' that ends
    otherwise; with RE2 it is linear, and only a client_id's first characters are looked at.
    kproxy runs in a process of its own: frozen, it would hold the test's interpreter lock."""
    with KproxyProcess(tmp_path, upstream=kafka_cluster.bootstrap_servers, capture_root=str(root),
                       admin_token=TOKEN, shutdown_timeout=5.0) as proxy:
        status, body = call(proxy.admin_url + "/capture/start",
                            {"formats": ["jsonl"], "filter": {"client_id_regex": "(a+)+$"}})
        assert status == 200, body
        stop = threading.Event()
        hostile_answers = []
        hostile_errors = []

        def attack():
            client = RawClient(proxy.bootstrap, client_id=HOSTILE_CLIENT_ID)
            try:
                while not stop.is_set():
                    hostile_answers.append(client.roundtrip(API_VERSIONS, 3, **API_VERSIONS_FIELDS))
            except OSError as exc:
                hostile_errors.append(exc)
            finally:
                client.close()

        attacker = threading.Thread(target=attack, daemon=True)
        attacker.start()
        try:
            wait_for_answers = time.monotonic() + CANARY_BOUND_S * 5
            while not hostile_answers and not hostile_errors and time.monotonic() < wait_for_answers:
                time.sleep(0.05)
            canary = RawClient(proxy.bootstrap, client_id="aaa")
            canary.sock.settimeout(CANARY_BOUND_S)
            other = RawClient(proxy.bootstrap, client_id="bbb")
            for _ in range(20):
                started = time.monotonic()
                assert canary.roundtrip(API_VERSIONS, 3, **API_VERSIONS_FIELDS).body.error_code == 0
                assert time.monotonic() - started < CANARY_BOUND_S
                other.roundtrip(API_VERSIONS, 3, **API_VERSIONS_FIELDS)
            canary.close()
            other.close()
        finally:
            stop.set()
            attacker.join(CANARY_BOUND_S * 5)
        assert hostile_answers and not hostile_errors, hostile_errors
        assert call(proxy.admin_url + "/capture/stop", {})[0] == 200
    rows = [json.loads(line) for f in root.glob("*.jsonl") for line in f.read_text().splitlines()]
    # Kept: the canary, and the hostile client (its first 256 characters are all 'a').
    assert {r["client_id"] for r in rows} == {"aaa", HOSTILE_CLIENT_ID}
    assert sum(r["client_id"] == "aaa" for r in rows) == 20


def test_the_size_cap_deletes_only_files_this_capture_wrote(kafka_cluster, root):
    """The issue's attack: prefix "app" and a tiny cap against someone's app-*.jsonl."""
    from kafka import KafkaProducer

    theirs = {root / "app-20000101T000000-000001.jsonl": b'{"theirs": 1}\n' * 4000,
              root / "app-20000101T000000-000002.parquet": b"PAR1" * 4000,
              root / "app-20000101T000000-000003.pcapng": b"\n" * 16000}
    for path, data in theirs.items():
        path.write_bytes(data)
        os.utime(path, (946684800, 946684800))           # older than anything the capture writes
    with ProxyThread(upstream=kafka_cluster.bootstrap_servers,
                     capture_root=str(root), admin_token=TOKEN) as proxy:
        formats = ["jsonl", "pcapng"]      # Parquet's footer alone passes 4 KiB: its size is approximate
        status, body = call(proxy.admin_url + "/capture/start",
                            {"prefix": "app", "formats": formats, "rotate_bytes": 4096,
                             "max_total_bytes": 4096 * len(formats)})
        assert status == 200, body
        producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, client_id="cap-victim",
                                 linger_ms=0, batch_size=1)
        topic = f"cap-{uuid.uuid4().hex[:6]}"
        for i in range(150):
            producer.send(topic, value=b"v" * 200).get(timeout=30)    # one Produce each: many rows
        producer.close()
        status, body = call(proxy.admin_url + "/capture/stop", {})
        assert status == 200
    assert body["counters"]["files_deleted"] > 0, "the cap never ran: the test proves nothing"
    for path, data in theirs.items():
        assert path.read_bytes() == data, f"{path.name} was not this capture's to delete"
    ours = [p for p in root.iterdir() if p not in theirs]
    assert ours and all(p.name.startswith("app-") for p in ours)
    assert sum(p.stat().st_size for p in ours) <= 4096 * len(formats), [(p.name, p.stat().st_size) for p in ours]


# ---------------------------------------------------------------- the admin token

def test_capture_routes_need_the_admin_token(admin, root):
    for url, body in ((admin + "/capture/start", {}), (admin + "/capture/stop", {}), (admin + "/capture", None)):
        for auth in (dict(token=None), dict(token="wrong-" + TOKEN), dict(token=TOKEN[:-1]),
                     dict(authorization=f"Basic {TOKEN}"), dict(authorization="Bearer"),
                     dict(authorization=f"bearer  {TOKEN}x")):
            status, answer = call(url, body, **auth)
            assert status == 401, (url, auth, status, answer)
            assert "admin token" in answer["error"]
    assert tree(root) == set(), "a refused start wrote files"
    request = urllib.request.Request(admin + "/capture/start", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.headers["WWW-Authenticate"].startswith("Bearer")
    # Probes and the scrape stay open.
    for path in ("/metrics", "/healthz"):
        with urllib.request.urlopen(admin + path, timeout=10) as r:
            assert r.status == 200
    assert call(admin + "/readyz", token=None)[0] == 503                  # upstream down, not 401
    # The right token, any case of the scheme word.
    assert call(admin + "/capture")[1]["state"] == "off"
    status, body = call(admin + "/capture/start", {"formats": ["jsonl"]},
                        authorization=f"bearer {TOKEN}")
    assert status == 200 and body["active"], body
    assert call(admin + "/capture/stop", {})[0] == 200


def test_without_a_configured_token_capture_control_is_refused(root):
    with proxy_without_broker(capture_root=str(root)) as proxy:
        for url, body in ((proxy.admin_url + "/capture/start", {}), (proxy.admin_url + "/capture", None)):
            status, answer = call(url, body)
            assert status == 403 and "no admin token is configured" in answer["error"], answer
        assert proxy.runtime.admin.refused == 2
        assert not proxy.runtime.capture.active
    assert tree(root) == set()


def test_neither_token_nor_what_callers_send_is_logged_or_shown(root, caplog):
    wrong = "guess-" + secrets.token_hex(12)
    with caplog.at_level(logging.DEBUG):
        with proxy_without_broker(capture_root=str(root), admin_token=TOKEN) as proxy:
            for _ in range(5):
                assert call(proxy.admin_url + "/capture/start", {}, token=wrong)[0] == 401
            status, body = call(proxy.admin_url + "/capture/start", {"formats": ["jsonl"]})
            assert status == 200
            status, body = call(proxy.admin_url + "/capture/stop", {})
            config_text = repr(proxy.config)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert TOKEN not in logged and wrong not in logged
    assert TOKEN not in json.dumps(body) and TOKEN not in config_text
    refusals = [r for r in caplog.records if r.name == "kproxy.admin"]
    assert len(refusals) == 1, "refusals are logged once per interval, not once each"
    assert "refused POST /capture/start from 127.0.0.1" in refusals[0].getMessage()


# ---------------------------------------------------------------- where captures may go

OUTSIDE = "OUTSIDE"      # stands for tmp_path / "outside" in the cases below


@pytest.mark.parametrize("directory,why", [
    ("/etc", "outside capture_root"),
    ("/root", "outside capture_root"),
    ("../outside", "'..' is not allowed"),
    ("sub/../../outside", "'..' is not allowed"),
    ("../../../../../../../../tmp", "'..' is not allowed"),
    (OUTSIDE, "outside capture_root"),
    ("link", "is a symbolic link"),
    ("link/deeper", "is a symbolic link"),
    ("sub/link", "is a symbolic link"),
])
def test_capture_directories_outside_the_root_are_refused(admin, root, tmp_path, directory, why):
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "link").symlink_to(outside)
    (root / "sub").mkdir()
    (root / "sub" / "link").symlink_to(outside)
    directory = str(outside) if directory == OUTSIDE else directory
    prefix = f"attack-{uuid.uuid4().hex[:8]}"
    etc_before = set(os.listdir("/etc"))
    try:
        status, body = call(admin + "/capture/start", {"directory": directory, "prefix": prefix})
        assert status == 400 and why in body["error"], body
        assert body["error"].startswith("capture.directory: ")
        assert not list(outside.iterdir()) and tree(root) == {"link", "sub", "sub/link"}
        assert set(os.listdir("/etc")) == etc_before
        assert call(admin + "/capture")[1]["state"] == "off"
    finally:                               # never leave an attack's files behind, fix or no fix
        for leftover in glob.glob(f"/etc/{prefix}-*") + glob.glob(f"/root/{prefix}-*"):
            os.unlink(leftover)


@pytest.mark.parametrize("directory,expected", [
    (None, "."), (".", "."), ("team-a/today", "team-a/today"), ("ROOT/abs", "abs"),
])
def test_capture_directories_inside_the_root_are_accepted(admin, root, directory, expected):
    settings = {"formats": ["jsonl"]}
    if directory is not None:
        settings["directory"] = directory.replace("ROOT", str(root))
    status, body = call(admin + "/capture/start", settings)
    assert status == 200, body
    assert call(admin + "/capture/stop", {})[0] == 200
    target = (root / expected).resolve()
    assert body["config"]["directory"] == str(target)
    (written,) = target.glob("kproxy-capture-*.jsonl")
    assert written.stat().st_mode & 0o777 == 0o600
    for parent in written.parents:
        if parent == root:
            break
        assert parent.stat().st_mode & 0o777 == 0o700


def test_a_symbolic_link_swapped_in_after_the_check_is_not_followed(tmp_path):
    """directory_in_root runs before the files exist; creation itself must refuse a link."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    checked = directory_in_root(str(root), "later/deeper")
    (root / "later").symlink_to(outside)                  # the race: after the check
    with pytest.raises(OSError) as refused:
        FileSet(checked, "x", 4096, 60.0, 8192, counters=None)
    assert refused.value.errno == errno.ELOOP and "symbolic link" in str(refused.value)
    assert not list(outside.iterdir())
    with pytest.raises(OSError):
        open_directory(str(root / "later"))


# ---------------------------------------------------------------- bounds

@pytest.mark.parametrize("body,message", [
    ({"rotate_bytes": 2 ** 61}, "capture.rotate_bytes: must be at most 17179869184 (16 GiB), got 2305843009213693952"),
    ({"max_total_bytes": 2 ** 62}, "capture.max_total_bytes: must be at most 4398046511104 (4 TiB)"),
    ({"rotate_bytes": 2 ** 61, "max_total_bytes": 2 ** 62}, "capture.rotate_bytes: must be at most"),
    ({"prefix": "app", "rotate_bytes": 1, "max_total_bytes": 1}, "capture.rotate_bytes: must be at least 4096"),
    ({"rotate_bytes": 4096, "max_total_bytes": 2 ** 40}, "capture.max_total_bytes: at most 250000 x rotate_bytes"),
    ({"queue_max_bytes": 2 ** 40}, "capture.queue_max_bytes: must be at most 1073741824 (1 GiB)"),
    ({"queue_max_items": 10 ** 9}, "capture.queue_max_items: must be at most"),
    ({"parquet_batch_rows": 10 ** 9}, "capture.parquet_batch_rows: must be at most"),
    ({"rotate_seconds": 10 ** 9}, "capture.rotate_seconds: must be at most"),
    ({"rotate_bytes": "9999999GiB"}, "capture.rotate_bytes: must be at most"),
    (b'{"rotate_bytes": 1e999}', "capture.rotate_bytes: expected a finite number"),
    (b'{"max_total_bytes": Infinity}', "capture.max_total_bytes: expected a finite number"),
    (b'{"rotate_seconds": NaN}', "capture.rotate_seconds: expected a finite number"),
    (b'{"writer_cpu_share": NaN}', "capture.writer_cpu_share: expected a finite number"),
    ({"prefix": "../app"}, "capture.prefix:"),
    ({"prefix": "a" * 101}, "capture.prefix:"),
    # Patterns RE2 cannot match in linear time, and one too large to run on every request.
    ({"filter": {"client_id_regex": r"(a)\1"}}, "capture.filter.client_id_regex: invalid escape"),
    ({"filter": {"client_id_regex": "(?=a)b"}}, "capture.filter.client_id_regex: invalid perl operator"),
    ({"filter": {"client_id_regex": "(.{0,50}){20}z"}}, "capture.filter.client_id_regex: too large"),
])
def test_absurd_capture_settings_get_a_clear_400(admin, root, body, message):
    status, answer = call(admin + "/capture/start", body)
    assert status == 400, answer
    assert answer["error"].startswith(message), answer["error"]
    assert "\n" not in answer["error"]
    assert tree(root) == set()


# ---------------------------------------------------------------- record data

def test_record_data_needs_the_operator_setting(root):
    with proxy_without_broker(capture_root=str(root), admin_token=TOKEN) as proxy:
        status, body = call(proxy.admin_url + "/capture/start", {"include_record_data": True})
        assert status == 403 and "capture_allow_record_data" in body["error"], body
        assert not proxy.runtime.capture.active
    assert tree(root) == set()
    with proxy_without_broker(capture_root=str(root), admin_token=TOKEN,
                              capture_allow_record_data=True) as proxy:
        status, body = call(proxy.admin_url + "/capture/start", {"include_record_data": True})
        assert status == 200 and body["config"]["include_record_data"] is True, body
        call(proxy.admin_url + "/capture/stop", {})
    # The capture table (operator's file) is bound by the same rule.
    with pytest.raises(kconfig.ConfigError, match="capture.include_record_data: needs capture_allow_record_data"):
        kconfig.build({"upstream": "b:1", "capture": {"directory": str(root), "include_record_data": True}})


# ---------------------------------------------------------------- the settings themselves

def test_admin_token_settings(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    assert kconfig.build({"upstream": "b:1", "admin_token_file": str(token_file)}).admin_token == TOKEN
    assert kconfig.load(environ={"KPROXY_UPSTREAM": "b:1", "KPROXY_ADMIN_TOKEN": TOKEN}).admin_token == TOKEN
    assert kconfig.build({"upstream": "b:1"}).admin_token is None
    config_file = tmp_path / "kproxy.toml"
    config_file.write_text(f'upstream = "b:1"\nadmin_token = "{TOKEN}"\n')
    bad = [
        ({"admin_token_file": str(tmp_path / "missing")}, "admin_token_file: cannot read"),
        ({"admin_token_file": str(token_file), "admin_token": TOKEN}, "not both"),
        ({"admin_token": "short"}, "admin_token: the token must be at least 16 characters"),
        ({"admin_token": "with spaces in the token"}, "printable ASCII without spaces"),
    ]
    for settings, message in bad:
        with pytest.raises(kconfig.ConfigError, match=message) as refused:
            kconfig.build({"upstream": "b:1", **settings})
        assert TOKEN not in str(refused.value)
    with pytest.raises(kconfig.ConfigError, match="admin_token: not in the config file") as refused:
        kconfig.load(config_file, environ={})
    assert TOKEN not in str(refused.value)


def test_capture_root_settings(tmp_path, monkeypatch):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real)
    # The root is resolved once; the table's directory is taken under it.
    config = kconfig.build({"upstream": "b:1", "capture_root": str(tmp_path / "alias"),
                            "capture": {"directory": "team-a"}})
    assert config.capture_root == str(real) and config.capture.directory == str(real / "team-a")
    config = kconfig.build({"upstream": "b:1", "capture_root": str(tmp_path / "alias"),
                            "capture": {"directory": str(tmp_path / "alias" / "b")}})
    assert config.capture.directory == str(real / "b")
    # Without capture_root, the table's directory is the root.
    config = kconfig.build({"upstream": "b:1", "capture": {"directory": str(tmp_path / "alias")}})
    assert config.capture_root == config.capture.directory == str(real)
    monkeypatch.chdir(tmp_path)           # a relative table directory: relative to the process's cwd
    config = kconfig.build({"upstream": "b:1", "capture": {"directory": "alias"}})
    assert config.capture_root == config.capture.directory == str(real)
    assert kconfig.build({"upstream": "b:1"}).capture_root is None
    for table, message in (({"directory": "/etc"}, "outside capture_root"),
                           ({"directory": "../x"}, "'..' is not allowed"),
                           ({"directory": "a", "rotate_bytes": 2 ** 61}, "capture.rotate_bytes: must be at most")):
        with pytest.raises(kconfig.ConfigError, match=message):
            kconfig.build({"upstream": "b:1", "capture_root": str(real), "capture": table})


def test_no_capture_root_means_no_capture(tmp_path):
    with proxy_without_broker(admin_token=TOKEN) as proxy:
        status, body = call(proxy.admin_url + "/capture/start", {"directory": str(tmp_path)})
        assert status == 403 and "no capture_root is configured" in body["error"], body
    assert list(tmp_path.iterdir()) == []
