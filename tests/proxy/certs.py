"""Throw-away PKI for TLS tests, made with the ``openssl`` command-line tool.

One CA signs everything: a server certificate for 127.0.0.1/localhost (used by
the broker and by kproxy's client-facing listener), a wildcard certificate for
SNI routing's names, a certificate for another
name (an impostor that hostname verification must reject) and a client
certificate (for mutual TLS). A second, unrelated CA is there to sign a client
certificate that must *not* be accepted.

The ``openssl`` CLI makes them, as an operator would (kproxy reads them with the
``cryptography`` package: the tests check it against an independent maker); tests that
need certificates fail with a clear message where the command is missing.
Keys are unencrypted PKCS#8 PEM, which both Python and Kafka's PEM keystore
(KIP-651, ``ssl.keystore.type=PEM``) read.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

KEY_ALGORITHM = ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]   # fast to make
VALID_DAYS = "2"              # the files live for one test session
OPENSSL_TIMEOUT_S = 60.0      # each call takes milliseconds; a loaded machine gets slack


@dataclass(frozen=True)
class Identity:
    cert: Path                # this certificate alone (PEM)
    key: Path                 # its private key (PKCS#8 PEM, unencrypted)
    chain: Path               # key + certificate in one file: Kafka's PEM keystore layout


@dataclass(frozen=True)
class PKI:
    ca: Path                  # the trusted CA certificate
    ca_key: Path              # its key: tests issue more certificates (a rotation's)
    other_ca: Path            # an unrelated CA: trusting it instead must fail verification
    server: Identity          # SAN IP:127.0.0.1, DNS:localhost
    impostor: Identity        # signed by the CA, but for other.example only
    client: Identity          # clientAuth, signed by the CA
    stranger: Identity        # a client certificate from an untrusted CA
    sni: Identity             # wildcard *.kafka.kproxy.test (SNI routing's names)


def openssl_available() -> bool:
    return shutil.which("openssl") is not None


def _run(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True,
                   timeout=OPENSSL_TIMEOUT_S)


def _key(path: Path) -> Path:
    _run("genpkey", *KEY_ALGORITHM, "-out", path)
    return path


def _ca(directory: Path, name: str) -> tuple[Path, Path]:
    key = _key(directory / f"{name}.key")
    cert = directory / f"{name}.pem"
    _run("req", "-x509", "-new", "-key", key, "-out", cert, "-days", VALID_DAYS,
         "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return cert, key


def _issue(directory: Path, name: str, ca: tuple[Path, Path], extensions: str) -> Identity:
    key = _key(directory / f"{name}.key")
    csr = directory / f"{name}.csr"
    cert = directory / f"{name}.pem"
    ext = directory / f"{name}.ext"
    ext.write_text(extensions)
    _run("req", "-new", "-key", key, "-out", csr, "-subj", f"/CN={name}")
    _run("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
         "-out", cert, "-days", VALID_DAYS, "-extfile", ext)
    chain = directory / f"{name}-chain.pem"
    chain.write_text(key.read_text() + cert.read_text())
    return Identity(cert, key, chain)


SERVER_EXT = ("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n"
              "extendedKeyUsage=serverAuth\nsubjectAltName={san}\n")
SNI_DOMAIN = "kafka.kproxy.test"     # .test is reserved (RFC 2606): never a real name
CLIENT_EXT = ("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n"
              "extendedKeyUsage=clientAuth\n")


def make_pki(directory: Path) -> PKI:
    """Create every file under ``directory`` (about a second of openssl calls)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca(directory, "test-ca")
    other_ca = _ca(directory, "other-ca")
    return PKI(
        ca=ca[0],
        ca_key=ca[1],
        other_ca=other_ca[0],
        server=_issue(directory, "server", ca, SERVER_EXT.format(san="IP:127.0.0.1,DNS:localhost")),
        impostor=_issue(directory, "impostor", ca, SERVER_EXT.format(san="DNS:other.example")),
        client=_issue(directory, "client", ca, CLIENT_EXT),
        stranger=_issue(directory, "stranger", other_ca, CLIENT_EXT),
        sni=_issue(directory, "sni", ca, SERVER_EXT.format(san=f"DNS:*.{SNI_DOMAIN}")),
    )


def issue_server(directory: Path, name: str, pki: PKI, san: str = "IP:127.0.0.1,DNS:localhost") -> Identity:
    """Another server certificate from the test CA (a new serial): what a rotation brings."""
    directory.mkdir(parents=True, exist_ok=True)
    return _issue(directory, name, (pki.ca, pki.ca_key), SERVER_EXT.format(san=san))


def pkcs12_keystore(identity: Identity, path: Path, password_file: Path) -> Path:
    """``identity`` as a PKCS#12 keystore (what cert-manager's keystores.pkcs12 writes)."""
    _run("pkcs12", "-export", "-inkey", identity.key, "-in", identity.cert, "-out", path,
         "-passout", f"file:{password_file}")
    return path


def encrypted_key(identity: Identity, path: Path, password_file: Path) -> Path:
    """``identity``'s key as encrypted PKCS#8 PEM (-----BEGIN ENCRYPTED PRIVATE KEY-----)."""
    _run("pkey", "-in", identity.key, "-out", path, "-aes256", "-passout", f"file:{password_file}")
    return path
