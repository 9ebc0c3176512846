"""TLS files reloaded while kproxy runs: rotations reach new handshakes, open connections
keep theirs, broken files keep the old certificate, SIGHUP reloads at once; PKCS#12
keystores and encrypted keys; every TLS setting without a config file.

Certificates come from the test CA (``tests/proxy/certs.py``); files are laid out and
swapped as the kubelet does for a mounted Secret (``SecretVolume``)."""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from cryptography import x509
from prometheus_client.parser import text_string_to_metric_families

from kproxy import config as config_module
from kproxy.proxy import tls_reload
from tests.observers.metrics import sample, scrape
from tests.proxy.certs import SNI_DOMAIN, PKI, Identity, encrypted_key, issue_server, pkcs12_keystore
from tests.proxy.harness import REPO, ConfluentTraffic, KproxyProcess, ProxyThread, free_ports, wait_for
from tests.proxy.wire import create_topic
from tests.protocol.frames import framed

HANDSHAKE_TIMEOUT_S = 30.0     # a TLS handshake and an answer on a busy 2-core machine
# How often the test proxies read their files, and how long a change must hold: short, so a
# test waits a second rather than POLL_INTERVAL_S (what is tested is that it happens at all).
TEST_POLL_S, TEST_SETTLE_S = 0.2, 0.1
RELOAD_TIMEOUT_S = 30.0        # a poll, the settle and a reload in a thread, on a busy machine
TRAFFIC_TIMEOUT_S = 90.0
PROGRESS = 50                  # messages acknowledged and consumed between the steps
PASSWORD = "s3cret pass"       # with a space: the password file's content is taken as is
API_VERSIONS_V0 = b"\x00\x12\x00\x00\x00\x00\x00\x01\xff\xff"   # key 18, v0, correlation 1, no client id
START_TIMEOUT_S = 60.0         # `kproxy run`: an interpreter start and imports on a busy machine
# Handshakes per check with two workers: the kernel spreads connections between them, so
# several make it all but certain that both answer.
HANDSHAKES_PER_CHECK = 8


class SecretVolume:
    """A directory as the kubelet mounts a Secret: each file a symlink ``name -> ..data/name``,
    ``..data`` a symlink to a timestamped directory; ``update`` writes a new directory and
    swaps ``..data`` in one rename, so a reader sees all old files or all new ones."""

    def __init__(self, root: Path, files: dict[str, bytes]):
        self.root = root
        root.mkdir(parents=True)
        self._write(files)
        for name in files:
            (root / name).symlink_to(Path("..data") / name)

    def _write(self, files: dict[str, bytes]) -> None:
        version = self.root / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{uuid.uuid4().hex[:8]}"
        version.mkdir()
        for name, data in files.items():
            (version / name).write_bytes(data)
        staged = self.root / "..data_tmp"
        staged.symlink_to(version.name)
        os.replace(staged, self.root / "..data")

    def update(self, files: dict[str, bytes]) -> None:
        self._write(files)

    def __getitem__(self, name: str) -> str:
        return str(self.root / name)


def pem_files(identity: Identity) -> dict[str, bytes]:
    return {"tls.crt": identity.cert.read_bytes(), "tls.key": identity.key.read_bytes()}


def serial_of(identity: Identity) -> int:
    return x509.load_pem_x509_certificate(identity.cert.read_bytes()).serial_number


def not_after_of(identity: Identity) -> float:
    return x509.load_pem_x509_certificate(identity.cert.read_bytes()).not_valid_after_utc.timestamp()


class TLSConnection:
    """A client's own TLS connection to kproxy: the certificate it was shown, and
    ApiVersions answers over it for as long as it stays open."""

    def __init__(self, address: tuple[str, int], pki: PKI):
        context = ssl.create_default_context(cafile=str(pki.ca))
        raw = socket.create_connection(address, timeout=HANDSHAKE_TIMEOUT_S)
        self.conn = context.wrap_socket(raw, server_hostname=address[0])
        self.serial = x509.load_der_x509_certificate(self.conn.getpeercert(binary_form=True)).serial_number

    def api_versions(self) -> bytes:
        """One ApiVersions round trip: the response frame."""
        self.conn.sendall(framed(API_VERSIONS_V0))
        answer = b""
        while len(answer) < 4 or len(answer) < 4 + int.from_bytes(answer[:4], "big"):
            more = self.conn.recv(65536)
            assert more, "kproxy closed the connection"
            answer += more
        return answer

    def close(self) -> None:
        self.conn.close()


def served_serial(address: tuple[str, int], pki: PKI) -> int:
    """The serial of the certificate a new handshake is shown (after a full round trip)."""
    connection = TLSConnection(address, pki)
    try:
        assert connection.api_versions()[4:8] == b"\x00\x00\x00\x01"     # its correlation id
        return connection.serial
    finally:
        connection.close()


@pytest.fixture
def fast_polls(monkeypatch):
    monkeypatch.setattr(tls_reload, "POLL_INTERVAL_S", TEST_POLL_S)
    monkeypatch.setattr(tls_reload, "SETTLE_S", TEST_SETTLE_S)


def tls_messages(caplog, level=logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "kproxy.tls" and r.levelno == level]


# ---------------------------------------------------------------- rotation, live

def test_a_rotation_reaches_new_handshakes_while_clients_keep_their_connections(
        kafka_cluster, pki, tmp_path, fast_polls, kproxy_log):
    """confluent-kafka produces and consumes over TLS through kproxy while its certificate
    is rotated as Kubernetes rotates a mounted Secret: a new handshake is shown the new
    certificate, every connection open before keeps going (none reopened), a connection of
    our own still answers and was shown the old one, and every message arrives."""
    new = issue_server(tmp_path / "rotated", "server-rotated", pki)
    volume = SecretVolume(tmp_path / "secret", pem_files(pki.server))
    topic = create_topic(kafka_cluster.bootstrap_servers)
    with ProxyThread(upstream=kafka_cluster.bootstrap_servers,
                     tls_server={"cert_file": volume["tls.crt"], "key_file": volume["tls.key"]}) as proxy:
        address = proxy.runtime.proxy.bootstrap_address
        assert served_serial(address, pki) == serial_of(pki.server)
        held = TLSConnection(address, pki)
        traffic = ConfluentTraffic(proxy.bootstrap, topic, TRAFFIC_TIMEOUT_S)
        traffic.settings = {"security.protocol": "SSL", "ssl.ca.location": str(pki.ca),
                            "ssl.endpoint.identification.algorithm": "https"}
        traffic.start()
        try:
            traffic.wait_for_progress(PROGRESS, "before the rotation")
            before = {relay.info.id for relay in list(proxy.runtime.proxy.relays) if relay.info}
            volume.update(pem_files(new))
            wait_for(lambda: served_serial(address, pki) == serial_of(new), RELOAD_TIMEOUT_S,
                     "a new handshake to be shown the rotated certificate")
            traffic.wait_for_progress(PROGRESS, "after the rotation")
            after = {relay.info.id for relay in list(proxy.runtime.proxy.relays) if relay.info}
        finally:
            traffic.finish()
        assert before and before <= after, f"connections {sorted(before - after)} were closed"
        assert len(held.api_versions()) > 8 and held.serial == serial_of(pki.server)
        held.close()
        assert not traffic.delivery_errors, traffic.delivery_errors[:3]
        assert traffic.delivered == set(range(traffic.produced))
        m = scrape(proxy)
        assert sample(m, "kproxy_tls_reloads_total", side="server", outcome="success") == 1
        assert sample(m, "kproxy_tls_reloads_total", side="server", outcome="failure") == 0
        assert sample(m, "kproxy_tls_certificate_expiry_timestamp_seconds", side="server") == \
            pytest.approx(not_after_of(new))
    reloaded = [m for m in tls_messages(kproxy_log) if "reloaded (files changed)" in m]
    assert len(reloaded) == 1 and f"serial {serial_of(new):x}" in reloaded[0]


@pytest.mark.parametrize("breakage, reason", [
    ("garbage key", "tls_server.key_file: holds no PEM private key"),
    ("another certificate's key", "tls_server.key_file: the private key does not belong to the certificate"),
    ("truncated certificate", "tls_server.cert_file: holds no PEM certificate"),
])
def test_a_broken_rotation_keeps_the_old_certificate_and_says_why(
        kafka_cluster, pki, tmp_path, fast_polls, kproxy_log, breakage, reason):
    """Broken files are not loaded: handshakes keep getting the old certificate, one WARNING
    names the setting and the cause (however many polls see the same files), the failure is
    counted; files fixed later are loaded."""
    new = issue_server(tmp_path / "rotated", "server-rotated", pki)
    volume = SecretVolume(tmp_path / "secret", pem_files(pki.server))
    broken = {"garbage key": {**pem_files(new), "tls.key": b"-----BEGIN PRIVATE KEY-----\nnot a key\n"},
              "another certificate's key": {**pem_files(new), "tls.key": pki.client.key.read_bytes()},
              "truncated certificate": {**pem_files(new), "tls.crt": new.cert.read_bytes()[:200]}}[breakage]
    with ProxyThread(upstream=kafka_cluster.bootstrap_servers,
                     tls_server={"cert_file": volume["tls.crt"], "key_file": volume["tls.key"]}) as proxy:
        address = proxy.runtime.proxy.bootstrap_address
        volume.update(broken)
        wait_for(lambda: tls_messages(kproxy_log, logging.WARNING), RELOAD_TIMEOUT_S, "the failed reload's warning")
        time.sleep(TEST_POLL_S * 10)                # ten more polls of the same broken files
        warnings = tls_messages(kproxy_log, logging.WARNING)
        assert len(warnings) == 1 and reason in warnings[0], warnings
        assert f"still using the certificate CN=server serial {serial_of(pki.server):x}" in warnings[0]
        assert served_serial(address, pki) == serial_of(pki.server)
        m = scrape(proxy)
        assert sample(m, "kproxy_tls_reloads_total", side="server", outcome="failure") == 1
        assert sample(m, "kproxy_tls_certificate_expiry_timestamp_seconds", side="server") == \
            pytest.approx(not_after_of(pki.server))
        volume.update(pem_files(new))
        wait_for(lambda: served_serial(address, pki) == serial_of(new), RELOAD_TIMEOUT_S,
                 "the fixed files to be loaded")


def sni_serial(address: tuple[str, int], pki: PKI, server_name: str) -> int | str:
    """The serial a handshake naming ``server_name`` is shown, or the error that ended it."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    raw = socket.create_connection(address, timeout=HANDSHAKE_TIMEOUT_S)
    try:
        with context.wrap_socket(raw, server_hostname=server_name) as conn:
            return x509.load_der_x509_certificate(conn.getpeercert(binary_form=True)).serial_number
    except (ssl.SSLError, ConnectionResetError) as exc:
        return repr(exc)
    finally:
        raw.close()


def test_sni_routing_serves_the_rotated_certificate_and_still_refuses_unknown_names(
        pki, tmp_path, fast_polls, kproxy_log):
    """With routing = "sni" the one handshake callback both routes and moves the handshake
    to the newest certificate: after a rotation the names are served the new one, unknown
    names are still refused, and a new certificate that misses the advertised names is
    warned about."""
    sni_domain = SNI_DOMAIN
    new = issue_server(tmp_path / "rotated", "sni-rotated", pki, san=f"DNS:*.{sni_domain}")
    volume = SecretVolume(tmp_path / "secret", pem_files(pki.sni))
    bootstrap = f"bootstrap.{sni_domain}"
    with ProxyThread(upstream="127.0.0.1:9", routing="sni", sni_host_template=f"broker-{{node_id}}.{sni_domain}",
                     sni_bootstrap_host=bootstrap,
                     tls_server={"cert_file": volume["tls.crt"], "key_file": volume["tls.key"]}) as proxy:
        address = proxy.runtime.proxy.bootstrap_address
        assert sni_serial(address, pki, bootstrap) == serial_of(pki.sni)
        volume.update(pem_files(new))
        wait_for(lambda: sni_serial(address, pki, bootstrap) == serial_of(new), RELOAD_TIMEOUT_S,
                 "the rotated certificate for the bootstrap name")
        assert sni_serial(address, pki, f"broker-7.{sni_domain}") == serial_of(new)
        assert "SSLError" in str(sni_serial(address, pki, f"other.{sni_domain}"))
        assert not [m for m in tls_messages(kproxy_log, logging.WARNING)]
        volume.update(pem_files(pki.server))                 # for 127.0.0.1/localhost only
        wait_for(lambda: [r for r in kproxy_log.records if f"is not valid for {bootstrap}" in r.getMessage()],
                 RELOAD_TIMEOUT_S, "the warning that the new certificate misses the bootstrap name")


def mtls_answer(address: tuple[str, int], pki: PKI, identity: Identity) -> str:
    """"answered" if kproxy answers ApiVersions over TLS presenting ``identity``, else the error."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.load_cert_chain(identity.cert, identity.key)
    raw = socket.create_connection(address, timeout=HANDSHAKE_TIMEOUT_S)
    try:
        with context.wrap_socket(raw, server_hostname=address[0]) as conn:
            conn.sendall(framed(API_VERSIONS_V0))    # TLS 1.3: a refused certificate shows on the read
            return "answered" if len(conn.recv(65536)) > 8 else "closed"
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError) as exc:
        return repr(exc)
    finally:
        raw.close()


def test_a_rotated_client_ca_decides_new_handshakes(kafka_cluster, pki, tmp_path, fast_polls, kproxy_log):
    """mTLS: the CA client certificates must chain to is reloaded too: a client refused while
    kproxy trusts another CA is accepted once the CA file holds its CA (no restart)."""
    volume = SecretVolume(tmp_path / "secret", {**pem_files(pki.server), "ca.crt": pki.other_ca.read_bytes()})
    with ProxyThread(upstream=kafka_cluster.bootstrap_servers,
                     tls_server={"cert_file": volume["tls.crt"], "key_file": volume["tls.key"],
                                 "client_ca_file": volume["ca.crt"]}) as proxy:
        address = proxy.runtime.proxy.bootstrap_address
        assert "SSLError" in mtls_answer(address, pki, pki.client)
        assert mtls_answer(address, pki, pki.stranger) == "answered"        # other_ca's client
        volume.update({**pem_files(pki.server), "ca.crt": pki.ca.read_bytes()})
        wait_for(lambda: mtls_answer(address, pki, pki.client) == "answered", RELOAD_TIMEOUT_S,
                 "the client to be accepted under the rotated CA")
        assert "SSLError" in mtls_answer(address, pki, pki.stranger)


# ---------------------------------------------------------------- keystores, passwords

@pytest.fixture
def password_file(tmp_path) -> Path:
    path = tmp_path / "password"
    path.write_text(PASSWORD + "\n")          # as `echo` writes it: the newline is not the password's
    return path


@pytest.mark.parametrize("kind", ["pkcs12", "encrypted_pem"])
def test_keystores_and_encrypted_keys_serve_clients(kafka_cluster, pki, tmp_path, password_file, kind,
                                                    kproxy_log):
    """A PKCS#12 keystore, or an encrypted PEM key, each with its password from a file: a
    real client produces and consumes through kproxy over TLS."""
    if kind == "pkcs12":
        tls = {"keystore_file": str(pkcs12_keystore(pki.server, tmp_path / "server.p12", password_file)),
               "keystore_password_file": str(password_file)}
    else:
        key = encrypted_key(pki.server, tmp_path / "server-encrypted.key", password_file)
        assert b"ENCRYPTED PRIVATE KEY" in key.read_bytes()
        tls = {"cert_file": str(pki.server.cert), "key_file": str(key), "key_password_file": str(password_file)}
    topic = create_topic(kafka_cluster.bootstrap_servers)
    with ProxyThread(upstream=kafka_cluster.bootstrap_servers, tls_server=tls) as proxy:
        assert served_serial(proxy.runtime.proxy.bootstrap_address, pki) == serial_of(pki.server)
        traffic = ConfluentTraffic(proxy.bootstrap, topic, TRAFFIC_TIMEOUT_S)
        traffic.settings = {"security.protocol": "SSL", "ssl.ca.location": str(pki.ca)}
        traffic.start()
        try:
            traffic.wait_for_progress(PROGRESS, f"with a {kind} key")
        finally:
            traffic.finish()
        assert not traffic.delivery_errors and traffic.delivered == set(range(traffic.produced))


@pytest.mark.parametrize("tls, message", [
    ({"keystore_file": "p12"}, "tls_server.keystore_file: not a PKCS#12 keystore this password opens"),
    ({"keystore_file": "p12", "keystore_password_file": "wrong"},
     "tls_server.keystore_file: not a PKCS#12 keystore this password opens"),
    ({"cert_file": "cert", "key_file": "encrypted"}, "tls_server.key_file: the key is encrypted; give its "
                                                     "password in tls_server.key_password_file"),
    ({"cert_file": "cert", "key_file": "encrypted", "key_password_file": "wrong"},
     "tls_server.key_password_file: not the password of tls_server.key_file"),
    ({"cert_file": "cert"}, "tls_server.key_file: required with tls_server.cert_file"),
    ({"cert_file": "cert", "key_file": "key", "keystore_file": "p12"},
     "tls_server.keystore_file: give either a keystore or cert_file and key_file, not both"),
    ({"client_ca_file": "cert"}, "tls_server: needs kproxy's certificate"),
    ({"cert_file": "cert", "key_file": "key", "key_password_file": "empty"},
     "tls_server.key_password_file: the file is empty"),
])
def test_unusable_tls_files_are_config_errors_naming_the_setting(pki, tmp_path, password_file, tls, message):
    wrong = tmp_path / "wrong"
    wrong.write_text("not it")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    paths = {"p12": pkcs12_keystore(pki.server, tmp_path / "s.p12", password_file),
             "encrypted": encrypted_key(pki.server, tmp_path / "e.key", password_file),
             "cert": pki.server.cert, "key": pki.server.key, "wrong": wrong, "empty": empty}
    with pytest.raises(config_module.ConfigError) as raised:
        config_module.build({"upstream": "kafka:9092", "tls_server": {k: str(paths[v]) for k, v in tls.items()}})
    assert str(raised.value).startswith(message), raised.value


# ---------------------------------------------------------------- no config file

def test_every_tls_setting_has_a_flag_and_an_env_var_over_the_file_table(pki, tmp_path):
    """Flat keys (env KPROXY_TLS_*, flags --tls-*) fill or override the config file's tables."""
    from kproxy.cli import RUN_FLAGS, RUN_SWITCHES
    flagged = {key for key, _ in RUN_FLAGS.values()} | {key for key, _, _ in RUN_SWITCHES.values()}
    assert set(config_module.TLS_FLAT_KEYS) | {config_module.TLS_CLIENT_ENABLED} <= flagged
    env = config_module.from_env({"KPROXY_TLS_SERVER_CERT_FILE": str(pki.server.cert),
                                  "KPROXY_TLS_SERVER_KEY_FILE": str(pki.server.key),
                                  "KPROXY_TLS_CLIENT_CA_FILE": str(pki.ca),
                                  "KPROXY_TLS_CLIENT_CHECK_HOSTNAME": "false"})
    file_layer = {"tls_server": {"cert_file": "/not/used.pem", "key_file": "/not/used.key",
                                 "client_ca_file": str(pki.ca)}}
    config = config_module.build({"upstream": "kafka:9092"}, file_layer, env,
                                 {"tls_client_cert_file": str(pki.client.cert),
                                  "tls_client_key_file": str(pki.client.key)})
    assert config.tls_server == config_module.TLSServer(cert_file=str(pki.server.cert), key_file=str(pki.server.key),
                                                        client_ca_file=str(pki.ca))
    assert config.tls_client == config_module.TLSClient(ca_file=str(pki.ca), cert_file=str(pki.client.cert),
                                                        key_file=str(pki.client.key), check_hostname=False)
    enabled = config_module.build({"upstream": "kafka:9092", "tls_client_enabled": "true"})
    assert enabled.tls_client == config_module.TLSClient()          # the system trust store
    assert config_module.build({"upstream": "kafka:9092", "tls_client": {"ca_file": str(pki.ca)},
                                "tls_client_enabled": False}).tls_client is None
    with pytest.raises(config_module.ConfigError, match="tls_client_enabled: false, but tls_client_ca_file"):
        config_module.build({"upstream": "kafka:9092", "tls_client_enabled": "false",
                             "tls_client_ca_file": str(pki.ca)})


# A `kproxy run` whose files are read only on SIGHUP (polling once an hour): a reload it logs
# can only be the signal's.
RUN_WITHOUT_POLLING = ("import sys; from kproxy.proxy import tls_reload; tls_reload.POLL_INTERVAL_S = 3600; "
                       "from kproxy.cli import main; sys.exit(main())")


def test_flags_and_env_without_a_config_file_and_sighup_reloads_at_once(kafka_cluster, pki, tmp_path):
    """`kproxy run` configured by flags and env vars alone serves a real client over TLS;
    SIGHUP reloads the rotated files at once (the process does not poll here) and says so."""
    from confluent_kafka import Producer
    new = issue_server(tmp_path / "rotated", "server-rotated", pki)
    volume = SecretVolume(tmp_path / "secret", pem_files(pki.server))
    log_path = tmp_path / "kproxy.log"
    env = {**os.environ, "PYTHONPATH": str(REPO), "KPROXY_TLS_SERVER_CERT_FILE": volume["tls.crt"]}
    args = [sys.executable, "-c", RUN_WITHOUT_POLLING, "run", "--upstream", kafka_cluster.bootstrap_servers,
            "--listen", "127.0.0.1:0", "--broker-port-base", "0", "--admin-listen", "off",
            "--tls-server-key-file", volume["tls.key"]]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(args, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        listening = wait_for(lambda: process.poll() is None and re.search(
            r"listening on 127\.0\.0\.1:(\d+)", log_path.read_text()), START_TIMEOUT_S, "kproxy to listen")
        address = ("127.0.0.1", int(listening.group(1)))
        assert served_serial(address, pki) == serial_of(pki.server)
        producer = Producer({"bootstrap.servers": f"127.0.0.1:{address[1]}", "security.protocol": "SSL",
                             "ssl.ca.location": str(pki.ca)})
        topic = create_topic(kafka_cluster.bootstrap_servers)
        results = []
        producer.produce(topic, b"over TLS set by flags", on_delivery=lambda err, msg: results.append(err))
        assert producer.flush(HANDSHAKE_TIMEOUT_S) == 0 and results == [None]
        volume.update(pem_files(new))
        time.sleep(TEST_POLL_S * 5)                 # polling is off here: nothing reloads by itself
        assert served_serial(address, pki) == serial_of(pki.server)
        process.send_signal(signal.SIGHUP)
        wait_for(lambda: "TLS server: reloaded (SIGHUP)" in log_path.read_text(), RELOAD_TIMEOUT_S,
                 "the SIGHUP reload's log line")
        assert served_serial(address, pki) == serial_of(new)
        assert process.poll() is None
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(60)
    assert code == 0, log_path.read_text()[-5000:]


def test_sighup_to_the_supervisor_reloads_every_worker(kafka_cluster, pki, tmp_path):
    """`kproxy run --workers 2`: SIGHUP to the supervisor reaches each worker, which
    reloads its own files; new handshakes, whichever worker takes them, see the new
    certificate, and the merged expiry is the new one's."""
    new = issue_server(tmp_path / "rotated", "server-rotated", pki)
    volume = SecretVolume(tmp_path / "secret", pem_files(pki.server))
    node_ids = [n.node_id for n in kafka_cluster.nodes]
    with KproxyProcess(tmp_path, upstream=kafka_cluster.bootstrap_servers, workers=2,
                       broker_port_rule="map", broker_port_map=dict(zip(node_ids, free_ports(len(node_ids)))),
                       tls_server_cert_file=volume["tls.crt"], tls_server_key_file=volume["tls.key"]) as kproxy:
        address = ("127.0.0.1", kproxy.listen_port)
        assert {served_serial(address, pki) for _ in range(HANDSHAKES_PER_CHECK)} == {serial_of(pki.server)}
        volume.update(pem_files(new))
        os.kill(kproxy.pid, signal.SIGHUP)
        for index in range(2):
            wait_for(lambda: f"[worker {index}] TLS server: reloaded (SIGHUP)" in kproxy.log_text(),
                     RELOAD_TIMEOUT_S, f"worker {index}'s SIGHUP reload")
        assert {served_serial(address, pki) for _ in range(HANDSHAKES_PER_CHECK)} == {serial_of(new)}
        expiry = metric_value(kproxy.admin_url, "kproxy_tls_certificate_expiry_timestamp_seconds",
                              side="server")
        assert expiry == pytest.approx(not_after_of(new))
    assert kproxy.returncode == 0


def metric_value(admin_url: str, name: str, **labels) -> float:
    with urllib.request.urlopen(admin_url + "/metrics", timeout=HANDSHAKE_TIMEOUT_S) as answer:
        text = answer.read().decode()
    return next(s.value for family in text_string_to_metric_families(text) for s in family.samples
                if s.name == name and s.labels == labels)


# ---------------------------------------------------------------- the broker side

class TestBrokerSide:
    def test_a_rotated_ca_and_a_pkcs12_client_keystore_reach_new_upstream_connections(
            self, tls_cluster, pki, tmp_path, password_file, fast_polls, kproxy_log):
        """kproxy -> broker mTLS with a PKCS#12 client keystore: while kproxy trusts the wrong
        CA, no upstream connection can be made; once the CA file is fixed, the next
        connection is (no restart), and a client produces through it."""
        from confluent_kafka import Producer
        from confluent_kafka.admin import AdminClient
        volume = SecretVolume(tmp_path / "broker-ca", {"ca.crt": pki.other_ca.read_bytes()})
        keystore = pkcs12_keystore(pki.client, tmp_path / "client.p12", password_file)
        with ProxyThread(upstream=tls_cluster.bootstrap_servers, tls_server=None,
                         tls_client={"ca_file": volume["ca.crt"], "keystore_file": str(keystore),
                                     "keystore_password_file": str(password_file)}) as proxy:
            assert not proxy.call(proxy.runtime.proxy.upstream_ready())[0]
            volume.update({"ca.crt": pki.ca.read_bytes()})
            wait_for(lambda: [m for m in tls_messages(kproxy_log) if "TLS client: reloaded" in m],
                     RELOAD_TIMEOUT_S, "the client side's reload")
            ready = wait_for(lambda: proxy.call(proxy.runtime.proxy.upstream_ready(), HANDSHAKE_TIMEOUT_S)[0]
                             or None, RELOAD_TIMEOUT_S, "an upstream connection with the new CA")
            assert ready
            admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
            topic = f"tls-client-{uuid.uuid4().hex[:8]}"
            from confluent_kafka.admin import NewTopic
            admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(HANDSHAKE_TIMEOUT_S)
            producer = Producer({"bootstrap.servers": proxy.bootstrap})
            results = []
            producer.produce(topic, b"through mTLS", on_delivery=lambda err, msg: results.append(err))
            assert producer.flush(HANDSHAKE_TIMEOUT_S) == 0 and results == [None]
            m = scrape(proxy)
            assert sample(m, "kproxy_tls_reloads_total", side="client", outcome="success") == 1
            assert sample(m, "kproxy_tls_certificate_expiry_timestamp_seconds", side="client") == \
                pytest.approx(not_after_of(pki.client))
