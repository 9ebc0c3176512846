"""The relay's buffers: the shared read arena never overwrites what anyone can see; the
buffer budget pauses holders of incomplete frames but always lets one proceed."""

from kproxy.proxy.relay import MIN_READ_ROOM, READ_CHUNK, ReadArena


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
    from kproxy.proxy.relay import BufferBudget
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
    from kproxy.proxy.relay import BufferBudget
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
    from kproxy.observers.capture import Capture
    from kproxy.observers.live import LiveView
    from kproxy.observers.metrics import Metrics
    from kproxy.proxy.relay import bodies_needed

    capture, live = Capture(), LiveView()
    needed = bodies_needed([Metrics(), capture, live])
    assert not needed()                       # nobody needs them: large frames are streamed
    capture.start({"directory": str(tmp_path)})
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
