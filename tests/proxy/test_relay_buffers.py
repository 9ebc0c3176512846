"""The relay's buffers: the shared read arena never overwrites what anyone can see; the
buffer budget pauses holders of incomplete frames but always lets one proceed."""

from kproxy.observers.contract import SHUTTING_DOWN
from kproxy.proxy.memory import IN_PLACE_MIN_SHARE, MIN_READ_ROOM, READ_CHUNK, ReadArena
from kproxy.proxy.relay import PIPELINED_READ_BYTES


def read(arena: ReadArena, payload: bytes) -> memoryview:
    """What the event loop does for one read: ask for room, fill it, report the count."""
    room = arena.room()
    room[:len(payload)] = payload
    data = room[:len(payload)]
    del room
    arena.filled(len(payload))
    return data


def test_a_read_nobody_kept_is_overwritten_by_the_next():
    arena = ReadArena()
    first = read(arena, b"a" * 1000)
    address = first.obj
    del first
    second = read(arena, b"b" * 1000)
    assert second.obj is address and bytes(second[:1]) == b"b"     # same buffer, from the start


def test_a_kept_read_is_never_overwritten():
    arena = ReadArena()
    kept = [read(arena, bytes([i % 256]) * 20_000) for i in range(2 * READ_CHUNK // 20_000)]   # 2 buffers' worth
    for i, data in enumerate(kept):
        assert bytes(data) == bytes([i % 256]) * 20_000
    assert len({id(d.obj) for d in kept}) > 1                       # fresh buffers were started


def fill_almost(arena: ReadArena, byte: bytes) -> list[memoryview]:
    """Reads that leave too little room in the arena's buffer for another one."""
    first = read(arena, byte * READ_CHUNK)
    return [first, read(arena, byte * (len(first.obj) - READ_CHUNK - MIN_READ_ROOM + 1))]


def test_a_full_buffer_let_go_is_taken_again_rather_than_a_fresh_one():
    arena = ReadArena()
    first = fill_almost(arena, b"a")
    first_buffer = id(first[0].obj)
    assert id(first[1].obj) == first_buffer
    second = fill_almost(arena, b"b")                   # first is still held: another buffer
    assert id(second[0].obj) != first_buffer
    del first                                           # ... now nothing refers to the first one
    third = read(arena, b"c" * 1000)                    # second still held, too little room left
    assert id(third.obj) == first_buffer and bytes(second[0][:1]) == b"b"


def test_every_read_gets_at_least_the_minimum_room():
    arena = ReadArena()
    kept = []
    for _ in range(20):
        room = arena.room()
        assert MIN_READ_ROOM <= len(room) <= READ_CHUNK
        del room
        kept.append(read(arena, b"x" * 30_000))


# ---------------------------------------------------------------- the buffer budget

class Side:
    """What the budget needs of an Endpoint: its held bytes and pause/resume by reason."""

    def __init__(self):
        self.held = 0
        self.paused: set[str] = set()

    def pause(self, why):
        self.paused.add(why)

    def resume(self, why):
        self.paused.discard(why)


def test_over_the_budget_one_holder_is_still_read_and_the_rest_wait():
    from kproxy.proxy.memory import BufferBudget
    budget = BufferBudget(limit=100)
    a, b, c = Side(), Side(), Side()
    for side, held in ((a, 40), (b, 40), (c, 40)):
        budget.update(side, held)            # 120 > 100 on c's read: a and b are still read
    assert c.paused and not a.paused and not b.paused
    budget.update(a, 60)
    assert a.paused                          # b is still read
    budget.update(b, 70)
    assert not b.paused                      # the last one read keeps going: frames must finish
    budget.update(b, 0)                      # b's frame completed: 100 held, within the limit
    assert not a.paused and not c.paused


def test_when_no_holder_is_read_the_largest_waiting_one_goes_next():
    from kproxy.proxy.memory import BufferBudget
    budget = BufferBudget(limit=100)
    a, b, c = Side(), Side(), Side()
    budget.update(a, 90)
    budget.update(b, 50)                     # over: b waits, a is read
    budget.update(c, 70)                     # c waits too
    assert b.paused and c.paused and not a.paused
    budget.update(a, 0)                      # a done; 120 held still over: c (the most) goes
    assert not c.paused and b.paused
    budget.forget(c)                         # c's connection closed: 50 held, all go
    assert not b.paused


# ---------------------------------------------------------------- who needs whole frames

def test_large_frames_are_kept_whole_while_capture_runs_or_someone_watches(tmp_path):
    from kproxy.observers.capture import Capture, CaptureConfig
    from kproxy.observers.live import LiveView
    from kproxy.observers.metrics import Metrics
    from kproxy.proxy.relay import bodies_needed

    capture, live = Capture(), LiveView()
    needed = bodies_needed([Metrics(), capture, live])
    assert not needed()                       # nobody needs them: large frames are streamed
    capture.start(CaptureConfig(directory=str(tmp_path)))
    try:
        assert needed()
    finally:
        capture.stop()
    assert not needed()
    live.watch()
    assert needed()
    live.unwatch()
    assert not needed()

    class Broken:
        def __call__(self, info, events):
            pass

        def needs_bodies(self):
            raise RuntimeError("bug")

    assert bodies_needed([Broken()])()        # a failing hook keeps frames whole: the safe side


def test_a_large_frame_is_assembled_in_the_buffer_its_start_was_read_into():
    arena = ReadArena()
    read(arena, b"x" * 100)                             # an earlier read, let go
    start = read(arena, b"s" * 5000)                    # a frame of READ_CHUNK bytes begins
    buffer, base = arena.frame_buffer(READ_CHUNK, start)
    assert buffer is start.obj and bytes(buffer[base:base + 5000]) == b"s" * 5000
    other = read(arena, b"o" * 1000)                    # another connection's read: elsewhere
    assert other.obj is not buffer
    frame_buffer = id(buffer)
    del other, start, buffer                            # the frame was sent and let go
    kept = fill_almost(arena, b"k")                     # the buffer taken instead is full ...
    assert id(kept[0].obj) != frame_buffer
    assert id(read(arena, b"n" * 1000).obj) == frame_buffer   # ... so the frame's is reused


def test_a_frame_that_does_not_fit_where_its_start_lies_gets_a_buffer_of_its_own():
    arena = ReadArena()
    start = read(arena, b"s" * 5000)
    buffer, base = arena.frame_buffer(2 * READ_CHUNK, start)
    assert buffer is not start.obj and base == 0 and len(buffer) >= 2 * READ_CHUNK
    not_read_here = b"s" * 5000
    buffer, base = arena.frame_buffer(100_000, not_read_here)
    assert buffer is not start.obj and base == 0


# ---------------------------------------------------------------- a held answer read in place

class _Transport:
    """What an Endpoint needs of a transport; keeps what is written to it."""

    def __init__(self):
        self.written = bytearray()
        self.writes = 0

    def write(self, data):
        self.written += data
        self.writes += 1

    def writelines(self, chunks):            # one call, as a vectored send
        for chunk in chunks:
            self.written += chunk
        self.writes += 1

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 40000) if name == "peername" else default

    def set_write_buffer_limits(self, **kwargs):
        pass

    def get_write_buffer_size(self):         # everything written is sent at once
        return 0

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass

    def is_closing(self):
        return False

    def close(self):
        pass


def _read_into(endpoint, data: bytes) -> None:
    """What the event loop does for one read on ``endpoint``: room, fill, report."""
    room = endpoint.get_buffer(-1)
    room[:len(data)] = data
    del room
    endpoint.buffer_updated(len(data))


def _relayed(monkeypatch, scenario, observers=()) -> None:
    """Run ``scenario(relay, client, broker)`` (a coroutine function) on a relay of kproxy's
    proxy (address rewriting, its own observers and ``observers``) between fake transports."""
    import asyncio

    from kproxy import config as config_module
    from kproxy.proxy import relay as relay_module
    from kproxy.proxy.server import Proxy

    async def run():
        config = config_module.build({"upstream": "127.0.0.1:9", "listen": "127.0.0.1:0",
                                      "admin_listen": "127.0.0.1:0", "broker_port_base": 0})
        proxy = Proxy(config, observers)
        proxy.upstream_of[1] = ("127.0.0.1", 9)
        policy = proxy._policy("broker-1", 1)
        arena = relay_module.loop_read_arena()
        client = relay_module.Endpoint(arena, "client")
        client.connection_made(_Transport())
        broker = relay_module.Endpoint(arena, "broker")
        broker.connection_made(_Transport())

        async def connect(policy, arena):
            return ("127.0.0.1", 9), broker
        monkeypatch.setattr(relay_module, "_connect", connect)
        relay = relay_module.Relay()
        task = asyncio.get_running_loop().create_task(relay_module.run_relay(relay, policy, client))
        await asyncio.sleep(0)
        try:
            await scenario(relay, client, broker)
        finally:
            relay.close(SHUTTING_DOWN)
            await asyncio.sleep(0)
            task.cancel()

    asyncio.run(run())


def _in_reads(endpoint, frame: bytes, cuts: list[int], between) -> None:
    """``frame`` read by ``endpoint`` in pieces ending at ``cuts``; ``between()`` after each
    but the last."""
    start = 0
    for end in [*cuts, len(frame)]:
        _read_into(endpoint, frame[start:end])
        start = end
        if end < len(frame):
            between()


def test_a_held_answer_read_in_place_passes_its_records_as_they_come_and_the_budget_counts_it(monkeypatch):
    """A Fetch v16 answer (held: its tail may name node endpoints) of 600 KiB arrives in four
    reads: the three after the first land where it is assembled. Its records reach the client
    read by read (no partition names a new leader: ``fetch_cut``), its last bytes with the last
    read, and the client gets the answer exactly; meanwhile the budget counts the whole frame
    (what arrived as held, the rest of its buffer as reserved), and nothing once it is sent."""
    import struct

    from kproxy.protocol import Request, Response, Struct, encode_request, encode_response, new_body

    async def scenario(relay, client, broker):
        budget = relay.budget
        sent = 0
        # Twice: the second answer's reads must land in its own buffer, not after the first's.
        for correlation_id, fill, cuts in ((7, b"r", [100 * 1024, 300 * 1024, 500 * 1024]),
                                           (8, b"s", [4, 64 * 1024, 65 * 1024, 590 * 1024])):
            request = encode_request(Request(1, 16, correlation_id, "t",
                                             new_body("request", 1, 16, max_bytes=1 << 20)))
            broker.transport.written.clear()
            _read_into(client, struct.pack(">i", len(request)) + request)
            assert broker.transport.written[4:] == request
            partition = Struct(partition_index=0, high_watermark=10, records=fill * (600 * 1024))
            answer = encode_response(Response(correlation_id, new_body("response", 1, 16, responses=[
                Struct(partitions=[partition])])), 1, 16)
            frame = struct.pack(">i", len(answer)) + answer
            client.transport.written.clear()
            client.transport.writes = 0
            passed = []

            def between():
                passed.append(len(client.transport.written))
                # all of it accounted for, and the rest of the buffer it is assembled in
                assert len(frame) <= budget.held + budget.reserved <= IN_PLACE_MIN_SHARE * len(frame)
            _in_reads(broker, frame, cuts, between)
            # all that arrived, once the partition's header was in (not with the size prefix alone)
            assert passed == [cut if cut > 4 else 0 for cut in cuts]
            assert bytes(client.transport.written) == frame
            assert budget.held == budget.reserved == 0
            sent += len(frame)
            assert relay.bytes_from_broker == sent == relay.bytes_to_client

    _relayed(monkeypatch, scenario)


def test_a_fetch_answer_with_addresses_after_its_records_passed_closes_unleaked(monkeypatch):
    """Node endpoints in a Fetch answer no partition of which names a new leader (Kafka sends
    none then): its records passed before they showed, so it cannot be rewritten; the
    connection closes as a failed rewrite and the broker's address never reaches the client.
    With a partition naming the leader the answer is held whole and rewritten."""
    import struct

    from kproxy.observers.contract import CloseKind
    from kproxy.protocol import Request, Response, Struct, encode_request, encode_response, new_body

    def exchange(client, broker, correlation_id, error_code):
        request = encode_request(Request(1, 16, correlation_id, "t", new_body("request", 1, 16, max_bytes=1 << 20)))
        _read_into(client, struct.pack(">i", len(request)) + request)
        partitions = [Struct(partition_index=0, error_code=error_code, **(
                          {"current_leader": Struct(leader_id=1, leader_epoch=3)} if error_code else {})),
                      Struct(partition_index=1, high_watermark=10, records=b"r" * (300 * 1024))]
        answer = encode_response(Response(correlation_id, new_body("response", 1, 16, responses=[
            Struct(partitions=partitions)], node_endpoints=[Struct(node_id=1, host="broker-1.internal", port=9092)])),
            1, 16)
        _in_reads(broker, struct.pack(">i", len(answer)) + answer, [100 * 1024, 200 * 1024], lambda: None)

    async def rewritten(relay, client, broker):
        exchange(client, broker, 7, 6)                         # NOT_LEADER_OR_FOLLOWER
        assert relay.close_reason is None and b"r" * 1000 in client.transport.written
        assert b"broker-1.internal" not in client.transport.written

    async def leaked(relay, client, broker):
        exchange(client, broker, 7, 0)
        assert relay.close_reason.kind is CloseKind.REWRITE_FAILED
        assert b"r" * 1000 in client.transport.written            # the records had passed
        assert b"broker-1.internal" not in client.transport.written

    _relayed(monkeypatch, rewritten)
    _relayed(monkeypatch, leaked)


def test_a_large_request_read_in_place_is_forwarded_read_by_read_and_observed_once(monkeypatch):
    """A 600 KiB Produce request arrives in four reads, the last three landing where it is
    assembled: each goes to the broker at once, the observers hear of the request once
    (whole, when complete), and the budget counts the whole frame until then."""
    import struct

    from kproxy.protocol import Request, Struct, encode_request, new_body
    from kproxy.protocol.events import RequestReceived

    seen = []

    def observer(info, events):
        seen.extend(e for e in events if isinstance(e, RequestReceived))

    async def scenario(relay, client, broker):
        topic = Struct(name="t", partition_data=[Struct(index=0, records=b"p" * (600 * 1024))])
        request = encode_request(Request(0, 9, 3, "t", new_body("request", 0, 9, acks=1, topic_data=[topic])))
        frame = struct.pack(">i", len(request)) + request
        budget = relay.budget
        writes = []

        def between():
            writes.append(len(broker.transport.written))
            assert not seen
            assert len(frame) <= budget.held + budget.reserved <= IN_PLACE_MIN_SHARE * len(frame)
        # (a client's first read is offered PIPELINED_READ_BYTES: it may be tiny requests)
        cuts = [PIPELINED_READ_BYTES, 300 * 1024, 500 * 1024]
        _in_reads(client, frame, cuts, between)
        assert writes == cuts                                           # forwarded as read
        assert bytes(broker.transport.written) == frame
        assert [bytes(e.frame) for e in seen] == [request]
        assert budget.held == budget.reserved == 0
        assert relay.bytes_from_client == len(frame) and relay.tracker.in_flight == 1

    _relayed(monkeypatch, scenario, [observer])


def test_the_same_api_versions_answer_is_capped_once_and_each_copy_keeps_its_correlation_id(monkeypatch):
    """A capped ApiVersions answer is remembered by its bytes after the correlation id:
    the second copy is not decoded for the cap again, and each client gets the capped
    answer under its own correlation id."""
    import struct

    from kproxy.protocol import (Request, Response, Struct, decode_response, encode_request,
                                 encode_response, new_body, schema)
    from kproxy.protocol.events import ResponseReceived
    from kproxy.proxy import answer_rewriting, rewrite

    caps = []
    original = rewrite.cap_api_versions

    def counting(response, *args, **kwargs):
        caps.append(response.correlation_id)
        return original(response, *args, **kwargs)
    monkeypatch.setattr(answer_rewriting, "cap_api_versions", counting)
    produce_max = schema.version_range(0)[1]

    async def scenario(relay, client, broker):
        for correlation_id in (7, 8):
            request = encode_request(Request(18, 3, correlation_id, "t", new_body(
                "request", 18, 3, client_software_name="t", client_software_version="1")))
            _read_into(client, struct.pack(">i", len(request)) + request)
        for correlation_id in (7, 8):
            answer = encode_response(Response(correlation_id, new_body("response", 18, 3, api_keys=[
                Struct(api_key=0, min_version=0, max_version=produce_max + 5)])), 18, 3)
            _read_into(broker, struct.pack(">i", len(answer)) + answer)
        written = bytes(client.transport.written)
        answers = []
        while written:
            size, = struct.unpack_from(">i", written)
            answers.append(decode_response(written[4:4 + size], 18, 3))
            written = written[4 + size:]
        assert [a.correlation_id for a in answers] == [7, 8]
        assert [[(k.api_key, k.max_version) for k in a.body.api_keys] for a in answers] == \
            [[(0, produce_max)]] * 2
        assert caps == [7]                           # the second copy came from memory
        # Observers see each copy as the broker sent it, the first one too.
        assert [[(k.api_key, k.max_version) for k in e.response.body.api_keys] for e in seen] == \
            [[(0, produce_max + 5)]] * 2

    seen = []

    def observer(info, events):
        seen.extend(e for e in events if isinstance(e, ResponseReceived))

    _relayed(monkeypatch, scenario, [observer])


# ---------------------------------------------------------------- answers not taken

def test_the_unsent_ledger_counts_each_endpoint_once_and_visits_only_the_unsqueezed():
    from kproxy.proxy.unsent import UnsentAnswers
    ledger = UnsentAnswers()
    a, b, c = object(), object(), object()
    ledger.note(a, 100)
    ledger.note(b, 50)
    ledger.note(a, 30)                       # a's buffer drained some: counted as now, not added
    assert ledger.total == 80 and set(ledger.holders()) == {a, b}
    ledger.squeeze(a)
    ledger.note(c, 0)                        # nothing unsent: not a holder
    assert ledger.holders() == [b] and ledger.total == 80
    ledger.drained(a)                        # a's client took everything
    assert ledger.total == 50 and a not in ledger.squeezed and len(ledger) == 1
    ledger.drained(b)
    assert ledger.total == 0 and not ledger.holders()
