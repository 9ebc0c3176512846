"""Who a connection authenticated as, read from its SASL exchange (sans-I/O).

SASL PLAIN and SCRAM name the user in the client's first message; that name
is not a secret, the rest is. ``username`` reads the name and nothing after
it: for PLAIN (``authzid NUL authcid NUL password``, RFC 4616) it stops at the
second NUL, so the password is never decoded or kept; for SCRAM
(``gs2-header n=user,r=nonce...``, RFC 5802) the proof comes in a later
message, which is never looked at. Other mechanisms (OAUTHBEARER carries a
bearer token, GSSAPI a Kerberos ticket) give no name here.

``SaslPrincipal`` follows one connection's SaslHandshake and SaslAuthenticate
pairs and names the principal once the broker has accepted the whole
exchange (a wrong password names nobody). SaslHandshake v0's raw tokens are
never exposed by the tracker, so such connections stay unnamed.
"""

from __future__ import annotations

from .api_keys import ApiKey

# SaslAuthenticate rounds until the broker has checked the client's credentials.
AUTHENTICATE_ROUNDS = {"PLAIN": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2}
# Kafka caps user names nowhere; a longer one is cut (it becomes a label and a column).
MAX_USERNAME_CHARS = 256


def username(mechanism: str | None, first_message) -> str | None:
    """The user a PLAIN or SCRAM client-first message names; None if it names none."""
    if not first_message:
        return None
    data = bytes(first_message[:MAX_USERNAME_CHARS * 4 + 1024])   # the name is near the start
    if mechanism == "PLAIN":
        return _plain_authcid(data)
    if mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        return _scram_user(data)
    return None


def _plain_authcid(data: bytes) -> str | None:
    first = data.find(b"\0")
    if first < 0:
        return None
    second = data.find(b"\0", first + 1)
    if second < 0:                       # no password separator: not a PLAIN message
        return None
    return _text(data[first + 1:second])


def _scram_user(data: bytes) -> str | None:
    # gs2-header: cbind-flag "," [authzid] ","  then  "n=" saslname "," "r=" nonce ...
    parts = data.split(b",", 3)
    if len(parts) < 4 or parts[0][:1] not in (b"n", b"y", b"p"):
        return None
    attribute = parts[2]
    if not attribute.startswith(b"n="):
        return None
    name = _text(attribute[2:])
    if name is None or not parts[3].startswith(b"r="):
        return None
    # saslname escapes "," as "=2C" and "=" as "=3D"; any other "=" is malformed.
    out, i = [], 0
    while i < len(name):
        if name[i] == "=":
            code = name[i + 1:i + 3]
            if code == "2C":
                out.append(",")
            elif code == "3D":
                out.append("=")
            else:
                return None
            i += 3
        else:
            out.append(name[i])
            i += 1
    return "".join(out) or None


def _text(raw: bytes) -> str | None:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text[:MAX_USERNAME_CHARS] or None


class SaslPrincipal:
    """One connection's SASL state: feed it request/response body pairs of SaslHandshake and
    SaslAuthenticate (``observe``); ``principal`` is the user the broker accepted."""

    __slots__ = ("principal", "_mechanism", "_candidate", "_rounds")

    def __init__(self):
        self.principal: str | None = None
        self._mechanism: str | None = None
        self._candidate: str | None = None
        self._rounds = 0

    def observe(self, api_key: int, request_body, response_body) -> bool:
        """Follow one pair; True when it completed an exchange and named the principal."""
        failed = getattr(response_body, "error_code", 0) != 0
        if api_key == ApiKey.SASL_HANDSHAKE:
            self._mechanism = None if failed else getattr(request_body, "mechanism", None)
            self._candidate, self._rounds = None, 0
            return False
        if api_key != ApiKey.SASL_AUTHENTICATE or self._mechanism is None:
            return False
        if failed:                               # wrong password, unknown user: nobody
            self._mechanism = self._candidate = None
            return False
        if self._rounds == 0:
            self._candidate = username(self._mechanism, getattr(request_body, "auth_bytes", None))
        self._rounds += 1
        if self._rounds < AUTHENTICATE_ROUNDS.get(self._mechanism, 0) or self._candidate is None:
            return False
        self.principal = self._candidate
        self._mechanism = self._candidate = None
        return True
