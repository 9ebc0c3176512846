"""Observers' interests: the relay calls an observer only for the APIs it takes now, every
observer for a batch that mixes APIs, and an interest changed takes effect at the next batch."""

import struct

from kproxy.observers.contract import NO_EVENTS, Interest
from kproxy.protocol import Request, Response, encode_request, encode_response, new_body
from kproxy.protocol.api_keys import ApiKey

from .test_relay_buffers import _read_into, _relayed

METADATA, API_VERSIONS = int(ApiKey.METADATA), int(ApiKey.API_VERSIONS)


class Recorder:
    """Keeps the (kind, API key) of each event it is given; ``interest`` as given."""

    def __init__(self, interest: Interest | None = None):
        if interest is not None:
            self.interest = interest
        self.seen: list[tuple[str, int]] = []

    def __call__(self, info, events):
        for event in events:
            request = getattr(event, "request_event", None)
            self.seen.append(("answer", request.api_key) if request is not None else ("ask", event.api_key))


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def _ask(key: int, version: int, correlation_id: int) -> bytes:
    return _frame(encode_request(Request(key, version, correlation_id, "c", new_body("request", key, version))))


def _answer(key: int, version: int, correlation_id: int) -> bytes:
    return _frame(encode_response(Response(correlation_id, new_body("response", key, version)), key, version))


def test_an_observer_is_called_only_for_the_apis_it_takes_until_it_takes_more(monkeypatch):
    metadata_only = Interest(frozenset({METADATA}))
    narrow, idle, everything = Recorder(metadata_only), Recorder(Interest(NO_EVENTS)), Recorder()

    async def scenario(relay, client, broker):
        for key, version, correlation_id in ((API_VERSIONS, 3, 1), (METADATA, 12, 2)):
            _read_into(client, _ask(key, version, correlation_id))
            _read_into(broker, _answer(key, version, correlation_id))
        assert everything.seen == [("ask", API_VERSIONS), ("answer", API_VERSIONS),
                                   ("ask", METADATA), ("answer", METADATA)]
        assert narrow.seen == [("ask", METADATA), ("answer", METADATA)]
        assert idle.seen == []
        metadata_only.set(None)                  # e.g. a page opens: everything from now on
        _read_into(client, _ask(API_VERSIONS, 3, 3))
        assert narrow.seen[-1] == ("ask", API_VERSIONS) and idle.seen == []
        # A read bringing two APIs' requests: one batch for every observer (each ignores the rest).
        metadata_only.set(frozenset({METADATA}))
        _read_into(broker, _answer(API_VERSIONS, 3, 3))
        _read_into(client, _ask(API_VERSIONS, 3, 4) + _ask(METADATA, 12, 5))
        assert idle.seen == [("ask", API_VERSIONS), ("ask", METADATA)]
        assert narrow.seen[-2:] == [("ask", API_VERSIONS), ("ask", METADATA)]
        assert everything.seen[-3:] == [("answer", API_VERSIONS), ("ask", API_VERSIONS), ("ask", METADATA)]

    _relayed(monkeypatch, scenario, [narrow, idle, everything])


def test_the_default_observers_take_what_they_read_and_no_more():
    """Idle capture and audit take nothing, the unwatched live view only ApiVersions (once it
    has each connection's first request), a started capture everything."""
    from kproxy import config as config_module
    from kproxy.observers.contract import ConnectionInfo
    from kproxy.runtime import Runtime

    runtime = Runtime(config_module.build({"upstream": "127.0.0.1:9", "listen": "127.0.0.1:0",
                                           "admin_listen": "127.0.0.1:0", "broker_port_base": 0}))
    assert runtime.capture.interest.api_keys == NO_EVENTS
    live = runtime.live
    assert live.interest.api_keys == {API_VERSIONS}
    info = ConnectionInfo(1, ("127.0.0.1", 1), "bootstrap", ("127.0.0.1", 9), None)
    live.connection_opened(info)
    assert live.interest.api_keys is None        # its client_id is in its first request
    live.connection_closed(info)
    assert live.interest.api_keys == {API_VERSIONS}
    live.watch()
    try:
        assert live.interest.api_keys is None
    finally:
        live.close()
    assert live.interest.api_keys == {API_VERSIONS}



def test_routes_kept_stay_bounded_whatever_api_keys_a_client_sends():
    from kproxy.proxy.event_routes import MAX_ROUTED_KEYS, EventRoutes
    from kproxy.protocol.events import RequestReceived
    taker = Recorder(Interest({METADATA}))
    routes = EventRoutes([taker])
    for key in range(5_000):
        event = RequestReceived(b"", key, 0, key, 0.0, True)
        assert routes.to([event]) == ([taker] if key == METADATA else [])
    assert len(routes._by_key) == MAX_ROUTED_KEYS
