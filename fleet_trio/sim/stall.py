"""Fault injection: a websocket tail client that stops reading (a peer that must not be able
to hold a shutdown).

It connects with a tiny receive buffer, sends the websocket upgrade, reads the 101 answer and
then never reads again. :func:`server_send_queue` reads the server side's unsent bytes from
``/proc/net/tcp`` (the fact a test waits on: the server is blocked writing to this client).
"""

from __future__ import annotations

import base64
import os
import socket

import trio


class StalledTailClient:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    @property
    def local_port(self) -> int:
        port: int = self.sock.getsockname()[1]
        return port

    def close(self) -> None:
        self.sock.close()


__all__ = ["StalledTailClient", "open_stalled_tail", "server_send_queue", "wait_server_blocked"]


def open_stalled_tail(
    host: str, port: int, path: str, headers: dict[str, str] | None = None
) -> StalledTailClient:
    """Blocking (run it in a thread): connect, upgrade, read the answer's head, stop reading."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect((host, port))
    key = base64.b64encode(os.urandom(16)).decode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    sock.sendall(
        (
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"{extra}\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        byte = sock.recv(1)  # one byte at a time: nothing past the head is consumed
        if not byte:
            raise ConnectionError(f"closed during the upgrade: {head!r}")
        head += byte
    if not head.startswith(b"HTTP/1.1 101"):
        raise ConnectionError(f"upgrade refused: {head!r}")
    return StalledTailClient(sock)


def server_send_queue(server_port: int, client_port: int) -> int:
    """Bytes the server side of this connection has queued and the client has not taken."""
    best = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except FileNotFoundError:
            continue
        for row in rows:
            fields = row.split()
            local, remote, queues = fields[1], fields[2], fields[4]
            if (
                int(local.rsplit(":", 1)[1], 16) == server_port
                and int(remote.rsplit(":", 1)[1], 16) == client_port
            ):
                best = max(best, int(queues.split(":")[0], 16))
    return best


async def wait_server_blocked(
    client: StalledTailClient, server_port: int, at_least: int = 1
) -> None:
    """Until the server has ``at_least`` unsent bytes for this client, unchanged across three
    reads: the client's window is closed and the server cannot send (with more to send than
    the buffers hold, its writes are blocked). The send buffer's size varies with the
    kernel's memory pressure, so any stable, non-empty queue counts."""
    seen: list[int] = []
    while True:
        seen = [*seen[-2:], server_send_queue(server_port, client.local_port)]
        if len(seen) == 3 and seen[0] >= at_least and len(set(seen)) == 1:
            return
        await trio.sleep(0.2)
