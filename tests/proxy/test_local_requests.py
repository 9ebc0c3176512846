"""The client byte split for requests kproxy answers itself: however the reads cut the
stream, the broker gets exactly the other frames' bytes, in order, and no byte of a local one."""

from __future__ import annotations

import random

import pytest

from kproxy.protocol import Request, Uuid, encode_request, new_body
from kproxy.protocol.connection import Connection
from kproxy.proxy.local_requests import ClientSplit, LocalRequest


class Local:
    def answers(self, api_key: int) -> bool:
        return api_key in (71, 72)

    def takes(self, info, request) -> bool:
        return True


def frame(api_key: int, version: int, corr: int, **fields) -> bytes:
    body = encode_request(Request(api_key, version, corr, "app", new_body("request", api_key, version, **fields)))
    return len(body).to_bytes(4, "big") + body


def stream() -> tuple[bytes, bytes, list[int]]:
    """A client's bytes, those the broker must get, and the local requests' correlation ids."""
    frames = [frame(18, 3, 1, client_software_name="app", client_software_version="1"),
              frame(71, 0, 2, client_instance_id=Uuid(bytes(16))),
              frame(3, 12, 3, topics=[]),
              frame(72, 0, 4, client_instance_id=Uuid(bytes(range(16))), subscription_id=1, terminating=False,
                    compression_type=0, metrics=bytes(3000)),
              frame(3, 12, 5, topics=[]),
              frame(72, 0, 6, client_instance_id=Uuid(bytes(range(16))), subscription_id=1, terminating=True,
                    compression_type=0, metrics=b"")]
    forwarded = b"".join(f for f in frames if f[4:6] not in (b"\x00\x47", b"\x00\x48"))
    return b"".join(frames), forwarded, [2, 4, 6]


@pytest.mark.parametrize("seed", range(12))
def test_any_read_boundaries(seed):
    data, forwarded, local_ids = stream()
    rng = random.Random(seed)
    conn, split = Connection(), ClientSplit([Local()])
    sent, local = bytearray(), []
    pos = 0
    while pos < len(data):
        step = rng.choice((1, 2, 5, 7, 64, 1000, len(data)))
        chunk = memoryview(data)[pos:pos + step]
        pos += len(chunk)
        for piece in split.split(chunk, conn.receive_client(chunk)):
            if piece.__class__ is LocalRequest:
                local.append(piece.event.correlation_id)
            else:
                sent += bytes(piece)
    assert bytes(sent) == forwarded
    assert local == local_ids


class RefusesOne:
    """A second feature on the same connection (as enforced policy rules are): it may answer
    Metadata and telemetry, and takes one Metadata request only."""

    def answers(self, api_key: int) -> bool:
        return api_key in (3, 71, 72)

    def takes(self, info, request) -> bool:
        return request.correlation_id == 5


@pytest.mark.parametrize("seed", range(4))
def test_the_first_of_several_answerers_that_takes_a_request_answers_it(seed):
    data, forwarded, _ = stream()
    refused = frame(3, 12, 5, topics=[])
    forwarded = forwarded.replace(refused, b"")
    rng = random.Random(seed)
    first, telemetry = RefusesOne(), Local()
    conn, split = Connection(), ClientSplit([first, telemetry])
    sent, local = bytearray(), []
    pos = 0
    while pos < len(data):
        chunk = memoryview(data)[pos:pos + rng.choice((1, 3, 64, len(data)))]
        pos += len(chunk)
        for piece in split.split(chunk, conn.receive_client(chunk)):
            if piece.__class__ is LocalRequest:
                local.append((piece.event.correlation_id, piece.by))
            else:
                sent += bytes(piece)
    assert bytes(sent) == forwarded
    assert local == [(2, telemetry), (4, telemetry), (5, first), (6, telemetry)]
