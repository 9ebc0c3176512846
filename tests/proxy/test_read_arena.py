"""The relay's shared read buffer: bytes still visible to anyone are never overwritten."""

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
    kept = [read(arena, bytes([i]) * 20_000) for i in range(40)]    # ~800 KB: several buffers
    for i, data in enumerate(kept):
        assert bytes(data) == bytes([i]) * 20_000
    assert len({id(d.obj) for d in kept}) > 1                       # fresh buffers were started


def test_every_read_gets_at_least_the_minimum_room():
    arena = ReadArena()
    kept = []
    for _ in range(20):
        room = arena.room()
        assert MIN_READ_ROOM <= len(room) <= READ_CHUNK
        del room
        kept.append(read(arena, b"x" * 30_000))
