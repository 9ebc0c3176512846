"""``software_named`` on the ApiVersions pairs real clients and brokers exchanged (golden captures)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from kproxy.protocol import decode_request, decode_response
from kproxy.protocol.client_software import FIRST_NAMING_VERSION, software_named
from kproxy.protocol.events import RequestReceived, ResponseReceived

API_VERSIONS = 18
GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"


def _naming_pairs() -> list[tuple[str, dict]]:
    pairs = []
    for path in sorted(GOLDEN.glob("*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()][1:]
        pairs += [(path.name, p) for p in rows if p["api_key"] == API_VERSIONS
                  and p["api_version"] >= FIRST_NAMING_VERSION and p["response"] is not None]
    return pairs


def _events(pair: dict) -> ResponseReceived:
    request_frame = bytes.fromhex(pair["request"])
    request = RequestReceived(request_frame, API_VERSIONS, pair["api_version"],
                              int.from_bytes(request_frame[4:8], "big"), 1.0, True)
    return ResponseReceived(bytes.fromhex(pair["response"]), request, 1.001)


def test_names_the_software_from_the_skimmed_answer_without_decoding_it_whole():
    """A gateway's thousand clients each send one on connecting: the whole answer (~80 API
    ranges) is not decoded to read its error code."""
    pairs = _naming_pairs()
    assert len(pairs) >= 3, "the golden captures hold ApiVersions v3+ pairs of several clients"
    named = 0
    for name, pair in pairs:
        response = _events(pair)
        software = software_named(response)
        whole = decode_response(response.frame, API_VERSIONS, pair["api_version"])
        body = decode_request(response.request_event.frame).body
        if whole.body.error_code:
            assert software is None, name
        else:
            assert software is not None, name
            assert (software.name, software.version) == (body.client_software_name,
                                                          body.client_software_version), name
            named += 1
        assert response._response is None, f"{name}: the whole answer was decoded"
    assert named >= 3
