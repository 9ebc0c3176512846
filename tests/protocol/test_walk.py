"""The compiled error walks (``walk.error_codes``) against a plain recursive walk of the schema."""

import itertools

from kproxy.protocol import Struct, schema
from kproxy.protocol._codec import _in
from kproxy.protocol import walk
from kproxy.protocol.walk import _is_error_field, error_codes, error_walker


def present(rows, version):
    return [f for f in rows if _in(f.versions, version)]


def struct_name(spec, f):
    base = f.type[2:] if f.type.startswith("[]") else f.type
    return base if base in spec.structs else None


def body_with_codes(spec, rows, version, numbers):
    """A body with every error field set (some to 0), every list of structs two long, and
    some structs and lists null."""
    fields = {}
    for f in present(rows, version):
        name = struct_name(spec, f)
        if _is_error_field(f.name, f.type):
            fields[f.name] = next(numbers) % 5
        elif name is None:
            fields[f.name] = 0
        elif next(numbers) % 7 == 0:
            fields[f.name] = None
        elif f.type.startswith("[]"):
            fields[f.name] = [body_with_codes(spec, spec.structs[name], version, numbers) for _ in range(2)]
        else:
            fields[f.name] = body_with_codes(spec, spec.structs[name], version, numbers)
    return Struct(**fields)


def reference_codes(spec, rows, version, obj, out):
    """A struct's own codes in field order, then its children's, depth first."""
    for f in present(rows, version):
        if _is_error_field(f.name, f.type) and getattr(obj, f.name):
            out.append(getattr(obj, f.name))
    for f in present(rows, version):
        name, value = struct_name(spec, f), getattr(obj, f.name, None)
        if name is not None and value is not None:
            for item in (value if f.type.startswith("[]") else [value]):
                reference_codes(spec, spec.structs[name], version, item, out)
    return out


def test_every_message_version_walks_as_the_plain_recursive_walk():
    numbers, walked = itertools.count(1), 0
    for kind, table in (("request", schema.REQUESTS), ("response", schema.RESPONSES)):
        for api_key, spec in table.items():
            for version in range(spec.versions[0], spec.versions[1] + 1):
                body = body_with_codes(spec, spec.fields, version, numbers)
                expected = reference_codes(spec, spec.fields, version, body, [])
                assert error_codes(kind, api_key, version, body) == expected, (spec.name, version)
                walked += bool(expected)
    assert walked > 100


def test_versions_and_apis_the_schema_does_not_define_are_walked_as_nothing_and_not_kept():
    """A peer may name any of 65,536 versions and API keys: asking about them must not grow
    the walkers kept (one per (message, version) the schema defines)."""
    produce = Struct(responses=[Struct(partition_responses=[Struct(error_code=6)])])
    assert error_codes("response", 0, 10, produce) == [6]
    kept = len(walk._WALKERS)
    for version in range(1000, 1100):
        assert error_walker("response", 0, version) is None
        assert error_codes("response", 0, version, produce) == []
        assert error_walker("request", 30000 + version, 0) is None
    assert len(walk._WALKERS) == kept
