"""A relay that never brings the bytes into user space: ``splice(2)`` from socket to pipe
to socket, a thread per direction of each connection.

``python _splice_relay.py LISTEN_PORT UPSTREAM_PORT`` (loopback). The least CPU any relay
can spend on this kernel: the pages move by reference. For ``bench_peers.py``'s floor.
"""

import fcntl
import os
import socket
import sys
import threading

F_SETPIPE_SZ = 1031                  # fcntl.F_SETPIPE_SZ, named since Python 3.10 on Linux only
PIPE_BYTES = 1024 * 1024             # the default /proc/sys/fs/pipe-max-size


def pump(source: socket.socket, sink: socket.socket) -> None:
    read_end, write_end = os.pipe()
    try:
        fcntl.fcntl(write_end, F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:
        pass                         # a smaller pipe: more calls, the same bytes
    try:
        while True:
            moved = os.splice(source.fileno(), write_end, PIPE_BYTES)
            if moved == 0:
                break
            while moved:
                moved -= os.splice(read_end, sink.fileno(), moved)
    except OSError:
        pass
    for sock in (source, sink):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    os.close(read_end)
    os.close(write_end)


def serve(listen: int, upstream: int) -> None:
    server = socket.create_server(("127.0.0.1", listen))
    while True:
        client, _ = server.accept()
        broker = socket.create_connection(("127.0.0.1", upstream))
        for sock in (client, broker):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=pump, args=(client, broker), daemon=True).start()
        threading.Thread(target=pump, args=(broker, client), daemon=True).start()


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
