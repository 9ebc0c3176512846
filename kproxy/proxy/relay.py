"""The I/O layer's first slice: accept clients, connect upstream, pump bytes both ways.

This module alone owns sockets. Bytes are forwarded as soon as they are
read; a copy goes to the sans-I/O ``Connection`` tracker, whose events are
handed to observers *after* the bytes are on their way. An observer that
raises is logged once and ignored: observation never breaks forwarding.

Backpressure comes from ``drain()``: a pump stops reading its side while the
other side's write buffer is above the transport's high-water mark.

Not yet here (the proxy issue): address rewriting, TLS, per-broker listeners,
limits beyond the frame size, graceful shutdown.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass
from typing import Callable, Iterable

from ..protocol.connection import DEFAULT_MAX_FRAME_SIZE, Connection, Event, FrameTooLarge

log = logging.getLogger("kproxy.relay")

READ_CHUNK = 64 * 1024           # one read per wake-up; large enough for Kafka's batch sizes
WRITE_HIGH_WATER = 1024 * 1024   # pause reading the other side above this much unsent data

Observer = Callable[["ConnectionInfo", Iterable[Event]], None]
_ids = itertools.count(1)


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """Who is talking: what observers need to attribute events."""
    id: int
    client: tuple[str, int]
    listener: tuple[str, int]
    upstream: tuple[str, int]


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                feed: Callable[[bytes], list[Event]], info: ConnectionInfo,
                observers: list[Observer], counts: dict, side: str) -> str:
    """Copy one direction until EOF; returns why it stopped."""
    while True:
        data = await reader.read(READ_CHUNK)
        if not data:
            writer.write_eof() if writer.can_write_eof() else None
            return f"{side} closed"
        writer.write(data)
        counts[side] += len(data)
        try:
            events = feed(data)
        except FrameTooLarge as exc:
            return str(exc)
        if events:
            for observer in observers:
                try:
                    observer(info, events)
                except Exception:                          # noqa: BLE001 - isolation is the point
                    if observer not in _failed_observers:
                        _failed_observers.add(observer)
                        log.exception("observer %r failed; further failures not logged", observer)
        await writer.drain()


_failed_observers: set = set()


async def relay_connection(client_reader, client_writer, upstream: tuple[str, int],
                           observers: list[Observer], max_frame_size: int) -> None:
    peer = client_writer.get_extra_info("peername")[:2]
    sock = client_writer.get_extra_info("sockname")[:2]
    info = ConnectionInfo(next(_ids), peer, sock, upstream)
    try:
        broker_reader, broker_writer = await asyncio.open_connection(*upstream)
    except OSError as exc:
        log.warning("conn=%d client=%s:%d upstream %s:%d unreachable: %s",
                    info.id, *peer, *upstream, exc)
        client_writer.close()
        return
    for w in (client_writer, broker_writer):
        w.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
    conn = Connection(max_frame_size=max_frame_size)
    counts = {"client": 0, "broker": 0}
    pumps = [asyncio.create_task(_pump(client_reader, broker_writer, conn.receive_client, info,
                                       observers, counts, "client")),
             asyncio.create_task(_pump(broker_reader, client_writer, conn.receive_broker, info,
                                       observers, counts, "broker"))]
    reason = "cancelled"
    try:
        done, _ = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        reason = next(iter(done)).result()
    except (ConnectionError, OSError) as exc:
        reason = f"socket error: {exc}"
    finally:
        for task in pumps:
            task.cancel()
        for w in (client_writer, broker_writer):
            w.close()
        log.info("conn=%d client=%s:%d closed (%s) bytes client->broker=%d broker->client=%d",
                 info.id, *peer, reason, counts["client"], counts["broker"])


async def start_relay(listen: tuple[str, int], upstream: tuple[str, int],
                      observers: list[Observer] = (),
                      max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> asyncio.Server:
    """Listen on ``listen`` and relay every client to ``upstream``."""
    observers = list(observers)

    async def handle(reader, writer):
        await relay_connection(reader, writer, upstream, observers, max_frame_size)

    return await asyncio.start_server(handle, *listen)
