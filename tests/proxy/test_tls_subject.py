"""A client certificate's subject written as Kafka names an mTLS principal (RFC 2253 order)."""

from kproxy.proxy.tls import certificate_subject


def test_subject_most_specific_first_with_kafkas_short_names():
    peercert = {"subject": ((("countryName", "DE"),), (("organizationName", "Example"),),
                            (("organizationalUnitName", "payments"),), (("commonName", "svc-orders"),))}
    assert certificate_subject(peercert) == "CN=svc-orders,OU=payments,O=Example,C=DE"


def test_special_characters_are_escaped_and_multi_valued_rdns_joined():
    peercert = {"subject": ((("organizationName", "Acme, Inc."),),
                            (("commonName", "a+b"), ("userId", "42")),
                            (("commonName", " #lead"),))}
    assert certificate_subject(peercert) == "CN=\\ #lead,CN=a\\+b+UID=42,O=Acme\\, Inc."


def test_no_certificate_no_principal():
    assert certificate_subject(None) is None
    assert certificate_subject({}) is None
    assert certificate_subject({"subject": ()}) is None
