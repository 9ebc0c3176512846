"""The framer: one direction's byte stream cut into Kafka frames (int32 size, then
the frame), with as few copies as the reads allow; ``_Framer`` says how.
"""

from __future__ import annotations

import struct
from typing import Callable

from .errors import FrameTooLarge
from .sniff import wrong_protocol

# Kafka's own default for socket.request.max.bytes; a larger frame means a
# broken or hostile peer, and buffering it would let one connection eat memory.
DEFAULT_MAX_FRAME_SIZE = 100 * 1024 * 1024
# Frames at least this big are copied once, from the reads they arrived in (or not at
# all, when one read brought them whole) and forwarded without joining them to their
# size prefix; smaller ones are joined, which saves a write (and a TLS record).
ZERO_COPY_FRAME_BYTES = 64 * 1024
SIZE = struct.Struct(">i")


class StreamedFrame:
    """What ``_Framer.feed`` gives for a frame it streamed: its first bytes and its length."""

    __slots__ = ("head", "length")

    def __init__(self, head, length: int):
        self.head = head            # the frame's first bytes (no size prefix)
        self.length = length        # the whole frame's length (no size prefix)


class _Framer:
    """Splits one direction's byte stream into frames (without the size prefix).

    Frames are cut from the reads in place: a large one (``ZERO_COPY_FRAME_BYTES``
    and up) that one read brought whole is a view of that read, not a copy; one
    that spans reads is kept as views of them and joined once, when complete
    (growing a bytearray to MBs a read at a time moves and copies it again and
    again). Small frames are copied out (a view would keep a whole read buffer
    alive for a few bytes), and the beginning of one that a read cut is kept in
    a bytearray until the next read completes it. Copying each read of a large
    frame before gathering it cost a second copy of every byte: ~15 % of
    kproxy's CPU relaying 1 MiB Produce requests.

    Better still, when ``assemble(size, start)`` gives a buffer for it, a large
    frame that spans reads is assembled there, and ``room()`` offers its free
    part for the next read to land in: nothing is copied but the start that
    arrived with the read before, and not even that when the buffer given is
    the one that read landed in, with the frame placed where its start already
    is. The caller decides (it knows the memory budget, and can hand out a
    buffer used before, saving its zero fill).

    A large frame can instead be streamed (``stream``): its first bytes are kept,
    the rest only counted, and ``feed`` gives a ``StreamedFrame`` when it ends.
    Frames that big are gathered, never assembled: the decision comes once their
    header is in, and a buffer allocated whole would be wasted.
    """

    __slots__ = ("buffer", "max_frame_size", "direction", "assemble", "gather_from", "_parts",
                 "_missing", "_gathered", "_framed", "_frame", "_base", "_total", "_filled", "_skipped",
                 "_streaming", "decided", "head_tried")

    def __init__(self, max_frame_size: int, direction: str,
                 assemble: Callable[[int, memoryview], tuple[bytearray, int] | None] | None = None,
                 gather_from: int = ZERO_COPY_FRAME_BYTES):
        self.buffer = bytearray()            # the start of a small frame cut by a read
        self.max_frame_size = max_frame_size
        self.direction = direction
        self.assemble = assemble             # (frame bytes with size prefix, its start) -> (buffer, offset) or None
        self.gather_from = gather_from       # incomplete frames this big are large (assembled or gathered)
        self._frame: bytearray | None = None   # where the large frame is assembled, size prefix first
        self._base = 0                       # ... from this offset of it
        self._total = 0                      # its bytes (the buffer may be longer)
        self._filled = 0                     # bytes of it that arrived
        self._parts: list | None = None      # views of a large frame's reads, size prefix first
        self._missing = 0                    # bytes that frame still lacks
        self._gathered = 0                   # bytes of it in _parts
        self._framed = False                 # a frame has started: the peer speaks Kafka
        self._skipped = 0                    # bytes of the large frame passed without keeping (streamed)
        self._streaming = False              # that frame is streamed
        self.decided = False                 # whether to stream that frame has been decided
        self.head_tried = 0                  # its bytes when its header was last read

    def feed(self, data) -> list:
        """Complete frames in ``data`` (and what came before): ``bytes`` or ``memoryview``.

        ``data`` may be kept by reference until its frame is complete, and large
        frames are views of it: callers must not change it afterwards (bytes from
        a socket read never change; the relay's read arena never reuses a buffer
        that anything still refers to).
        """
        frames: list = []
        view = memoryview(data)
        while view:
            if self._frame is not None:
                view = self._fill(view, frames)
            elif self._parts is not None:
                view = self._gather(view, frames)
            elif self.buffer:
                view = self._complete_buffered(view, frames)
            else:
                view = self._frame_in_place(view, frames)
        return frames

    def _size(self, data, pos: int) -> int:
        """The size prefix at ``pos``; raises FrameTooLarge (or WrongProtocol) if impossible."""
        size, = SIZE.unpack_from(data, pos)
        if size < 0 or size > self.max_frame_size:
            wrong = None if self._framed else wrong_protocol(self.direction, data[pos:pos + 4])
            if wrong is not None:
                raise wrong
            raise FrameTooLarge(f"{self.direction} frame of {size} bytes "
                                f"(maximum {self.max_frame_size})")
        self._framed = True
        return size

    def room(self) -> memoryview | None:
        """The free part of the frame being assembled (a read may land there), or None."""
        frame = self._frame
        return None if frame is None else memoryview(frame)[self._base + self._filled:self._base + self._total]

    def fills_in_place(self, data) -> bool:
        """Whether ``data`` was read into ``room()`` without completing the frame; if so it
        is counted, and there is nothing else to do (no frame ends, no byte moves)."""
        frame = self._frame
        if frame is None or data.__class__ is not memoryview or data.obj is not frame:
            return False
        filled = self._filled + len(data)
        if filled >= self._total:
            return False
        self._filled = filled
        return True

    def filled_in_place(self, nbytes: int) -> bool:
        """``fills_in_place`` for ``nbytes`` known to have been read into ``room()``."""
        filled = self._filled + nbytes
        if filled >= self._total:
            return False
        self._filled = filled
        return True

    @property
    def reserved(self) -> int:
        """Bytes of the buffer the frame is being assembled in beyond those that arrived:
        the whole buffer is kept alive until the frame completes, not only the frame's part."""
        return 0 if self._frame is None else len(self._frame) - self._filled

    def _large(self, start, size: int) -> None:
        """A large frame (size prefix included in ``start``, its beginning) spans reads:
        assemble it in a buffer of its own if allowed, else gather views of the reads."""
        total = 4 + size
        given = self.assemble(total, start) if self.assemble is not None else None
        if given is not None:
            frame, base = given
            if memoryview(start).obj is not frame:     # else the start was read where it belongs
                frame[base:base + len(start)] = start
            self._frame, self._base, self._total, self._filled = frame, base, total, len(start)
            return
        self._parts = [_kept(start)]
        self._gathered = len(start)
        self._missing = total - len(start)

    def _fill(self, view: memoryview, frames: list) -> memoryview | None:
        """More of the frame being assembled: landed in place (a read into ``room()``), or
        copied in; what follows it, if it ends here."""
        frame = self._frame
        filled = self._filled
        total = self._total
        base = self._base
        take = min(len(view), total - filled)
        if view.obj is not frame:                # in place, it already is where it belongs
            frame[base + filled:base + filled + take] = view[:take]
        filled += take
        if filled < total:
            self._filled = filled
            return None
        frames.append(memoryview(frame)[base + 4:base + total])
        self._frame = None
        self._filled = self._total = self._base = 0
        self.decided = False
        self.head_tried = 0
        return view[take:]

    def _gather(self, view: memoryview, frames: list) -> memoryview | None:
        """More of the large frame in progress (kept, or only counted when streamed); what
        follows it, if it ends here."""
        missing = self._missing
        if len(view) < missing:
            self._missing = missing - len(view)
            if self._streaming:
                self._skipped += len(view)
            else:
                self._parts.append(_kept(view))
                self._gathered += len(view)
            return None
        if self._streaming:
            frames.append(StreamedFrame(memoryview(self._parts[0])[4:], self.frame_length))
        else:
            self._parts.append(view[:missing])
            frames.append(memoryview(b"".join(self._parts))[4:])
        self._parts = None
        self._missing = self._gathered = self._skipped = 0
        self.decided = self._streaming = False
        self.head_tried = 0
        return view[missing:]

    def _complete_buffered(self, view: memoryview, frames: list) -> memoryview | None:
        """Continue the small frame (or size prefix) an earlier read cut; what is left."""
        buf = self.buffer
        if len(buf) < 4:
            take = 4 - len(buf)
            buf += view[:take]
            view = view[take:]
            if len(buf) < 4:
                return None
        size = self._size(buf, 0)
        if size >= self.gather_from:            # a large frame whose size prefix was cut
            self._large(bytes(buf), size)
            del buf[:]
            return view
        take = 4 + size - len(buf)
        buf += view[:take]
        if len(buf) < 4 + size:
            return None
        frames.append(memoryview(buf)[4:])       # handed over whole: no copy
        self.buffer = bytearray()
        return view[take:]

    def _frame_in_place(self, view: memoryview, frames: list) -> None:
        """Frames starting at the beginning of ``view``, which is all consumed."""
        pos = 0
        end = len(view)
        while end - pos >= 4:
            size = self._size(view, pos)
            stop = pos + 4 + size
            if stop > end:
                if size >= self.gather_from:          # the rest comes in later reads
                    self._large(view[pos:end], size)
                    return None
                break
            frames.append(view[pos + 4:stop] if size >= ZERO_COPY_FRAME_BYTES
                          else bytes(view[pos + 4:stop]))
            pos = stop
        if pos < end:
            self.buffer += view[pos:end]
        return None

    def assembly(self) -> tuple[bytearray, int, int] | None:
        """The frame being assembled in a buffer of its own: (buffer, base, its bytes); None
        when there is none."""
        frame = self._frame
        return None if frame is None else (frame, self._base, self._total)

    @property
    def filled(self) -> int:
        """Bytes of the frame being assembled that arrived (size prefix included)."""
        return self._filled

    @property
    def large(self) -> bool:
        """A large frame is in progress (assembled, gathered or streamed)."""
        return self._parts is not None or self._frame is not None

    @property
    def gathering(self) -> bool:
        """A large incomplete frame is being kept whole (assembled or gathered, not streamed)."""
        return self._frame is not None or (self._parts is not None and not self._streaming)

    @property
    def frame_length(self) -> int:
        """The length of the large incomplete frame (size prefix excluded)."""
        if self._frame is not None:
            return self._total - 4
        return self._gathered + self._skipped + self._missing - 4

    def stream(self, keep: int) -> None:
        """Keep only the first ``keep`` bytes (size prefix included, fewer than it has)
        of the large incomplete frame, which is gathered (never assembled: see the class);
        pass the rest, now and to come, without keeping it."""
        head = self.buffered_bytes(0, keep)
        self._skipped = self._gathered - keep
        self._parts = [head]
        self._gathered = keep
        self._streaming = self.decided = True

    @property
    def missing(self) -> int:
        """Bytes the incomplete frame still lacks (0 between frames, or before its size is in)."""
        if self._frame is not None:
            return self._total - self._filled
        if self._parts is not None:
            return self._missing
        buf = self.buffer
        return 4 + SIZE.unpack_from(buf, 0)[0] - len(buf) if len(buf) >= 4 else 0

    @property
    def buffered(self) -> int:
        """Bytes held of the incomplete frame at the end of the stream so far."""
        return len(self.buffer) + self._gathered + self._filled

    @property
    def progress(self) -> int:
        """Bytes of that frame received so far, held or streamed (size prefix included)."""
        return len(self.buffer) + self._gathered + self._skipped + self._filled

    def buffered_bytes(self, start: int = 0, end: int | None = None) -> bytes:
        """Those bytes (``start`` to ``end``), size prefix included."""
        if self._frame is not None:
            stop = self._filled if end is None else min(end, self._filled)
            return bytes(memoryview(self._frame)[self._base + start:self._base + stop])
        if self._parts is None:
            return bytes(self.buffer[start:end])
        if end is not None and end <= len(self._parts[0]):     # no need to join megabytes
            return bytes(self._parts[0][start:end])
        return b"".join(self._parts)[start:end]


# A piece of a frame in progress that is a view of a buffer more than this many times its
# size is copied rather than kept as a view: reads land in a buffer shared by all of an event
# loop's connections, and a view keeps the whole of it alive (a client dribbling its frame a
# little per read could hold a MiB of memory per byte it sent).
VIEW_MAX_OVERHEAD = 2


def _kept(piece):
    """``piece`` (bytes or a memoryview of a read) as it may be kept until its frame ends."""
    view = memoryview(piece)
    return bytes(view) if len(view) * VIEW_MAX_OVERHEAD < len(view.obj) else piece
