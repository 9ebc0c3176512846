"""What a TLS section's files hold: read together, checked, handed to OpenSSL.

Every file one side names is read in one go into a ``Snapshot`` (contents and a digest):
what is checked is exactly what is loaded, and a change shows as a new digest however
the file was replaced (rewritten, renamed over, or Kubernetes swapping a Secret volume's
``..data`` symlink: paths are resolved at each read). The certificate chain and key are
parsed with ``cryptography`` -- PEM (the key possibly encrypted, its password from a
file) or a PKCS#12 keystore -- and checked to belong together, so a failure names its
cause in words rather than as an OpenSSL reason code. The ssl module loads a chain and
key only from a file path, so they reach it through an anonymous in-memory file.

No sockets and no event loop: the loader is called from config validation (at start)
and from ``tls_reload`` (in a worker thread).
"""

from __future__ import annotations

import hashlib
import os
import ssl
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

PEM = serialization.Encoding.PEM
# A password file holds the password, perhaps followed by the newline `echo` or an editor
# adds; only that is taken off (a password may end in spaces).
LINE_ENDINGS = "\r\n"


class TLSFilesError(ValueError):
    """A TLS section's files cannot be used; the message names the setting and why."""


@dataclass(frozen=True)
class Snapshot:
    """The contents of every file a TLS section names, read at one moment."""
    files: Mapping[str, bytes]          # setting name (cert_file, ...) -> contents
    unreadable: Mapping[str, str]       # setting name -> why it could not be read
    digest: str                         # of all of the above: equal digests, equal files


@dataclass(frozen=True)
class Material:
    """One side's checked TLS material, ready for an SSL context."""
    chain: tuple[x509.Certificate, ...]  # leaf first; empty: no certificate of kproxy's own
    key: Any | None                     # the leaf's private key (cryptography's key object)
    ca_pem: str | None                  # trusted CA certificates, PEM text
    digest: str                         # the snapshot's

    @property
    def leaf(self) -> x509.Certificate | None:
        return self.chain[0] if self.chain else None

    @property
    def not_after(self) -> float | None:
        """When the certificate expires (Unix time); None without one."""
        return self.leaf.not_valid_after_utc.timestamp() if self.chain else None

    def describe(self) -> str:
        """The certificate as an operator recognises it, for log lines."""
        leaf = self.leaf
        if leaf is None:
            return "no certificate of its own"
        expires = datetime.fromtimestamp(self.not_after, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"certificate {leaf.subject.rfc4514_string()} serial {leaf.serial_number:x} expires {expires}"

    def dns_names(self) -> list[str]:
        """The names the certificate is for: its DNS SANs, else its common name."""
        leaf = self.leaf
        if leaf is None:
            return []
        try:
            sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            names = sans.get_values_for_type(x509.DNSName)
        except x509.ExtensionNotFound:
            names = []
        return names or [a.value for a in leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]


def file_settings(tls) -> dict[str, str]:
    """setting name -> path, for every file the section names."""
    return {name: path for name, path in vars(tls).items() if name.endswith("_file") and path is not None}


def check_settings(key: str, tls) -> None:
    """Which files go together (independent of their contents)."""
    pem = tls.cert_file is not None or tls.key_file is not None
    if tls.keystore_file is not None and pem:
        raise TLSFilesError(f"{key}.keystore_file: give either a keystore or cert_file and key_file, not both")
    if (tls.cert_file is None) != (tls.key_file is None):
        given, missing = ("cert_file", "key_file") if tls.key_file is None else ("key_file", "cert_file")
        raise TLSFilesError(f"{key}.{missing}: required with {key}.{given}")
    if key == "tls_server" and tls.cert_file is None and tls.keystore_file is None:
        raise TLSFilesError(f"{key}: needs kproxy's certificate: cert_file and key_file, or keystore_file")
    if tls.key_password_file is not None and tls.key_file is None:
        raise TLSFilesError(f"{key}.key_password_file: only with {key}.key_file (a keystore's is "
                            f"keystore_password_file)")
    if tls.keystore_password_file is not None and tls.keystore_file is None:
        raise TLSFilesError(f"{key}.keystore_password_file: only with {key}.keystore_file")


def read(tls) -> Snapshot:
    """Read every file the section names, now."""
    files, unreadable = {}, {}
    digest = hashlib.sha256()
    for name, path in sorted(file_settings(tls).items()):
        try:
            files[name] = data = Path(path).read_bytes()
        except OSError as exc:
            unreadable[name] = f"cannot read {path!r}: {exc.strerror or exc}"
            data = b"\0unreadable\0" + unreadable[name].encode()
        digest.update(name.encode() + b"\0" + len(data).to_bytes(8, "big") + data)
    return Snapshot(files, unreadable, digest.hexdigest())


def load(key: str, tls, snapshot: Snapshot | None = None) -> Material:
    """The section's material from its files (read now, unless a snapshot is given);
    TLSFilesError naming the setting if it cannot be used."""
    snap = snapshot or read(tls)
    if snap.unreadable:
        name, why = sorted(snap.unreadable.items())[0]
        raise TLSFilesError(f"{key}.{name}: {why}")
    files = snap.files
    chain: tuple[x509.Certificate, ...] = ()
    private_key = None
    if "keystore_file" in files:
        password = _password(key, "keystore_password_file", files)
        try:
            private_key, leaf, extra = pkcs12.load_key_and_certificates(files["keystore_file"], password)
        except ValueError as exc:
            hint = "" if password is not None else " (set keystore_password_file if it has a password)"
            raise TLSFilesError(f"{key}.keystore_file: not a PKCS#12 keystore this password opens: "
                                f"{exc}{hint}") from None
        if private_key is None or leaf is None:
            raise TLSFilesError(f"{key}.keystore_file: the keystore holds no private key with its certificate")
        chain = (leaf, *extra)
        _check_pair(key, "keystore_file", leaf, private_key)
    elif "cert_file" in files:
        chain = tuple(_certificates(key, "cert_file", files["cert_file"]))
        private_key = _private_key(key, files["key_file"], _password(key, "key_password_file", files))
        _check_pair(key, "key_file", chain[0], private_key)
    ca_name = next((n for n in ("ca_file", "client_ca_file") if n in files), None)
    ca_pem = None
    if ca_name is not None:
        ca_pem = "".join(c.public_bytes(PEM).decode() for c in _certificates(key, ca_name, files[ca_name]))
    return Material(chain, private_key, ca_pem, snap.digest)


def _password(key: str, name: str, files: Mapping[str, bytes]) -> bytes | None:
    if name not in files:
        return None
    password = files[name].decode("utf-8", "surrogateescape").rstrip(LINE_ENDINGS)
    if not password:
        raise TLSFilesError(f"{key}.{name}: the file is empty")
    return password.encode("utf-8", "surrogateescape")


def _certificates(key: str, name: str, data: bytes) -> list[x509.Certificate]:
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise TLSFilesError(f"{key}.{name}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)") from None
    return certificates


def _private_key(key: str, data: bytes, password: bytes | None):
    try:
        return serialization.load_pem_private_key(data, password)
    except TypeError as exc:
        if password is not None and "not encrypted" in str(exc):
            return _private_key(key, data, None)      # a password to spare: not an error
        raise TLSFilesError(f"{key}.key_file: the key is encrypted; give its password in "
                            f"{key}.key_password_file") from None
    except ValueError:
        if password is not None and b"ENCRYPTED" in data:
            raise TLSFilesError(f"{key}.key_password_file: not the password of {key}.key_file") from None
        raise TLSFilesError(f"{key}.key_file: holds no PEM private key (or a damaged one)") from None
    except Exception as exc:           # noqa: BLE001 - e.g. an unsupported key type: one line
        raise TLSFilesError(f"{key}.key_file: cannot use the key: {exc}") from None


def _check_pair(key: str, name: str, leaf: x509.Certificate, private_key) -> None:
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    if private_key.public_key().public_bytes(serialization.Encoding.DER, spki) != \
            leaf.public_key().public_bytes(serialization.Encoding.DER, spki):
        raise TLSFilesError(f"{key}.{name}: the private key does not belong to the certificate "
                            f"({leaf.subject.rfc4514_string()}, serial {leaf.serial_number:x}); "
                            f"half of a rotation, or mixed-up files")


def load_identity(ctx: ssl.SSLContext, material: Material) -> None:
    """Give ``ctx`` the material's chain and key (the ssl module reads them only from a
    file: an anonymous in-memory one, so the key never touches a disk)."""
    if material.leaf is None:
        return
    pem = material.key.private_bytes(PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()) \
        + b"".join(c.public_bytes(PEM) for c in material.chain)
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("kproxy-tls", os.MFD_CLOEXEC)
        try:
            with open(fd, "wb", closefd=False) as f:
                f.write(pem)
            ctx.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="kproxy-tls-") as directory:   # private (0700)
        path = Path(directory) / "chain.pem"
        path.write_bytes(pem)
        ctx.load_cert_chain(str(path))
