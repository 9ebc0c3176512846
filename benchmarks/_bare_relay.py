"""A relay that knows nothing of Kafka: forwards every read to the other side at once.

``python _bare_relay.py LISTEN_PORT UPSTREAM_PORT`` (loopback). One copy out of its read
buffer, as any relay that keeps nothing must make; backpressure as kproxy's (pause the
other side's reading while a write buffer is full). For ``bench_peers.py``'s floor: the
broker advertises its port, so it needs no address rewriting.
"""

import asyncio
import sys

import uvloop

READ_BYTES = 1024 * 1024
# One read buffer for every connection: each read is copied out of it before the event loop
# reads again, so nothing is kept in it between reads. A buffer per side (until session 12)
# made a gateway's 1,100 connections cost 2.2 GiB, which is no floor for anyone's RSS.
READ_BUFFER = memoryview(bytearray(READ_BYTES))


class Side(asyncio.BufferedProtocol):
    def __init__(self, peer=None):
        self.peer = peer
        self.buffer = READ_BUFFER
        self.early: list[bytes] = []             # read before the upstream connected

    def connection_made(self, transport):
        self.transport = transport

    def get_buffer(self, sizehint):
        return self.buffer

    def buffer_updated(self, nbytes):
        data = bytes(self.buffer[:nbytes])
        if self.peer is None:
            self.early.append(data)
        else:
            self.peer.transport.write(data)

    def pause_writing(self):
        self.peer.transport.pause_reading()

    def resume_writing(self):
        self.peer.transport.resume_reading()

    def connection_lost(self, exc):
        if self.peer is not None:
            self.peer.transport.close()


async def serve(listen: int, upstream: int) -> None:
    loop = asyncio.get_running_loop()

    def accepted():
        client = Side()

        async def connect():
            _, broker = await loop.create_connection(lambda: Side(client), "127.0.0.1", upstream)
            client.peer = broker
            for data in client.early:
                broker.transport.write(data)
        loop.create_task(connect())
        return client

    await loop.create_server(accepted, "127.0.0.1", listen)
    await asyncio.Event().wait()


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1]), int(sys.argv[2])))
