"""The ApiKey table names every API of the generated schema, by Kafka's own numbers."""

import re

from kproxy.protocol import API_KEYS
from kproxy.protocol.api_keys import ApiKey


def upper_snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).upper()


def test_the_table_and_the_schema_name_the_same_keys():
    assert {upper_snake(name): key for name, key in API_KEYS.items()} == {k.name: k.value for k in ApiKey}
    assert ApiKey.PRODUCE == 0 and ApiKey.API_VERSIONS == 18 and ApiKey.SASL_AUTHENTICATE == 36
    assert {ApiKey.FETCH: "x"}.get(1) == "x"          # a member hashes as its number
