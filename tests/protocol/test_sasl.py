"""User names from SASL first messages, and the principal a connection authenticated as."""

import pytest

from kproxy.protocol import Struct
from kproxy.protocol.sasl import MAX_USERNAME_CHARS, SaslPrincipal, username


@pytest.mark.parametrize("message, expected", [
    (b"\0alice\0s3cret", "alice"),
    (b"admin\0alice\0s3cret", "alice"),                  # authzid is who to act as; authcid logs in
    (b"\0al\xc3\xafce\0pw", "al\u00efce"),
    (b"\0alice", None),                                  # no password separator
    (b"alice", None),
    (b"\0\0pw", None),
    (b"\0\xff\xfe\0pw", None),                           # not UTF-8
    (b"", None),
])
def test_plain_takes_the_authcid(message, expected):
    assert username("PLAIN", message) == expected


def test_plain_never_returns_password_bytes():
    secret = "p@ss\0word-with-nul"
    name = username("PLAIN", b"\0bob\0" + secret.encode())
    assert name == "bob" and "p@ss" not in name


@pytest.mark.parametrize("message, expected", [
    (b"n,,n=alice,r=fyko+d2lbbFgONRv9qkxdawL", "alice"),
    (b"n,a=admin,n=alice,r=abc", "alice"),
    (b"y,,n=alice,r=abc", "alice"),
    (b"p=tls-unique,,n=alice,r=abc", "alice"),
    (b"n,,n=a=2Cb=3Dc,r=abc", "a,b=c"),                  # RFC 5802 escapes
    (b"n,,n=a=2cb,r=abc", None),                         # only =2C and =3D are escapes
    (b"n,,n=a=,r=abc", None),
    (b"n,,r=abc,n=alice", None),                         # attribute order is fixed
    (b"n,,n=alice", None),                               # no nonce
    (b"n,,n=,r=abc", None),
    (b"c=biws,r=abc,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=", None),   # a client-final message
    (b"x,,n=alice,r=abc", None),
])
def test_scram_client_first_names_the_user(message, expected):
    assert username("SCRAM-SHA-512", message) == expected
    assert username("SCRAM-SHA-256", message) == expected


def test_other_mechanisms_name_nobody():
    assert username("OAUTHBEARER", b"n,,\x01auth=Bearer eyJhbGciOi\x01\x01") is None
    assert username("GSSAPI", b"\0alice\0pw") is None
    assert username(None, b"\0alice\0pw") is None


def test_long_names_are_cut():
    assert username("PLAIN", b"\0" + b"u" * 300 + b"\0pw") == "u" * MAX_USERNAME_CHARS
    assert username("SCRAM-SHA-256", b"n,,n=" + b"u" * 300 + b",r=abc") == "u" * MAX_USERNAME_CHARS


def pairs(principal, mechanism, rounds, errors=()):
    """Feed a handshake and ``rounds`` authenticate pairs (round i fails if i in errors)."""
    principal.observe(17, Struct(mechanism=mechanism), Struct(error_code=0))
    named = False
    first = {"PLAIN": b"\0carol\0pw", "SCRAM-SHA-512": b"n,,n=carol,r=nonce"}.get(mechanism, b"tok")
    for i in range(rounds):
        message = first if i == 0 else b"c=biws,r=nonce,p=proof"
        named = principal.observe(36, Struct(auth_bytes=message), Struct(error_code=58 if i in errors else 0))
    return named


def test_principal_is_named_only_when_the_broker_accepts_the_exchange():
    p = SaslPrincipal()
    assert not pairs(p, "SCRAM-SHA-512", 1) and p.principal is None      # halfway: not yet
    assert pairs(p, "SCRAM-SHA-512", 2) and p.principal == "carol"
    q = SaslPrincipal()
    assert not pairs(q, "SCRAM-SHA-512", 2, errors={1}) and q.principal is None   # wrong password
    r = SaslPrincipal()
    assert pairs(r, "PLAIN", 1) and r.principal == "carol"
    s = SaslPrincipal()
    assert not pairs(s, "OAUTHBEARER", 1) and s.principal is None
    t = SaslPrincipal()                                    # handshake refused: nothing follows
    t.observe(17, Struct(mechanism="PLAIN"), Struct(error_code=33))
    assert not t.observe(36, Struct(auth_bytes=b"\0carol\0pw"), Struct(error_code=0))
    assert t.principal is None
