"""Fault injection on a network link: a loopback TCP proxy that can be broken on purpose.

Put a :class:`FaultyLink` between any client and server of the fleet (dispatcher → node,
worker → controller, tail client → node) and point the client at ``link.url``. Then, from the
test or the chaos schedule: add latency, answer the next connections with an HTTP 5xx, drop
them, leave them half-open, cut every open connection, heal, or retarget the link at a backend
that restarted on a new port. Every decision is recorded in ``link.events``.

Faults act on **new connections** (except ``latency``, which applies to every chunk sent
upstream, and ``drop_all``). HTTP clients such as httpx keep connections alive and reuse
them, so a fault set while a client holds a pooled connection is not seen until the client
opens a new one: call :meth:`FaultyLink.drop_all` to force every client to reconnect.
"""

from __future__ import annotations

import contextlib
import functools
import http
import json
import socket
import struct
from collections.abc import Callable

import attrs
import trio

_READ = 65536


@attrs.define(eq=False)
class _Conn:
    number: int
    client: trio.SocketStream
    scope: trio.CancelScope
    half_open: bool = False


class FaultyLink:
    """A TCP proxy from ``url`` to ``target_host:target_port`` with injectable faults.

    Run it with :func:`serve_link`. Precedence for a new connection: an active half-open
    window, then pending drops, then pending HTTP failures, then normal forwarding.
    """

    def __init__(self, target_host: str, target_port: int, *, name: str = "") -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.name = name
        self.port = 0
        self.url = ""
        self.events: list[tuple[float, str]] = []
        self.connections = 0
        self.delayed = 0
        """Chunks forwarded upstream after a :meth:`latency` wait, all connections together."""
        self._latency = 0.0
        self._fail: list[int] = []
        self._drops = 0
        self._half_open_until: float | None = None
        self._open: set[_Conn] = set()

    def __repr__(self) -> str:
        return (
            f"FaultyLink({self.name or '-'} {self.url or 'not serving'} -> "
            f"{self.target_host}:{self.target_port})"
        )

    def _event(self, what: str) -> None:
        try:
            now = trio.current_time()
        except RuntimeError:  # configured outside trio.run
            now = 0.0
        self.events.append((now, what))

    # ------------------------------------------------------------------ faults

    def latency(self, seconds: float) -> None:
        """Delay each chunk forwarded upstream (client → target) by ``seconds`` (0 clears)."""
        if seconds < 0:
            raise ValueError("latency must be >= 0")
        self._latency = seconds
        self._event(f"latency {seconds:g}s")

    def fail_http(self, status: int = 503, count: int = 1) -> None:
        """The next ``count`` new connections get a canned ``HTTP/1.1 <status>`` answer
        (``Connection: close``, body ``{"error": "injected"}``) and are closed."""
        if not 100 <= status <= 599:
            raise ValueError(f"status {status} is not an HTTP status")
        self._fail.extend([status] * count)
        self._event(f"fail_http {status} x{count}")

    def drop(self, count: int = 1) -> None:
        """The next ``count`` new connections are accepted and closed at once."""
        self._drops += count
        self._event(f"drop x{count}")

    def drop_all(self) -> None:
        """Abort every open connection now (RST to the client)."""
        conns = list(self._open)
        for conn in conns:
            _abort(conn.client)
            conn.scope.cancel()
        self._event(f"drop_all {len(conns)}")

    def half_open(self, seconds: float) -> None:
        """For ``seconds``: new connections are accepted and read, never answered or forwarded
        (a client sees its read time out). A connection caught in the window stays held after
        it, until the client gives up, :meth:`heal` or :meth:`drop_all`."""
        self._half_open_until = trio.current_time() + seconds
        self._event(f"half_open {seconds:g}s")

    def heal(self) -> None:
        """Clear every pending fault and the latency; connections held half-open are closed."""
        self._latency = 0.0
        self._fail.clear()
        self._drops = 0
        self._half_open_until = None
        held = [c for c in self._open if c.half_open]
        for conn in held:
            conn.scope.cancel()
        self._event("heal")

    def retarget(self, host: str, port: int) -> None:
        """Forward new connections to ``host:port`` (open ones keep their old backend)."""
        self.target_host, self.target_port = host, port
        self._event(f"retarget {host}:{port}")

    @property
    def open_connections(self) -> int:
        return len(self._open)

    # ------------------------------------------------------------------ serving

    async def _handle(self, client: trio.SocketStream) -> None:
        self.connections += 1
        number = self.connections
        conn = _Conn(number, client, trio.CancelScope())
        self._open.add(conn)
        try:
            async with client:
                with conn.scope:
                    await self._serve_conn(conn)
        finally:
            self._open.discard(conn)

    async def _serve_conn(self, conn: _Conn) -> None:
        n, client = conn.number, conn.client
        now = trio.current_time()
        if self._half_open_until is not None and now < self._half_open_until:
            conn.half_open = True
            self._event(f"#{n} half-open")
            await _discard(client)
            return
        if self._drops > 0:
            self._drops -= 1
            self._event(f"#{n} dropped")
            return
        if self._fail:
            status = self._fail.pop(0)
            self._event(f"#{n} answered {status}")
            await _canned(client, status)
            return
        try:
            upstream = await trio.open_tcp_stream(self.target_host, self.target_port)
        except OSError as exc:
            self._event(f"#{n} upstream {self.target_host}:{self.target_port} failed: {exc}")
            return
        self._event(f"#{n} forwarded to {self.target_host}:{self.target_port}")
        async with upstream:
            await splice(client, upstream, conn.scope, lambda: self._latency, self._delayed)

    def _delayed(self, seconds: float) -> None:
        self.delayed += 1


async def splice(
    client: trio.SocketStream,
    upstream: trio.SocketStream,
    scope: trio.CancelScope,
    latency: Callable[[], float] = lambda: 0.0,
    delayed: Callable[[float], None] | None = None,
) -> None:
    """Pump bytes both ways, each direction until its EOF; a broken side cancels ``scope``
    (the connection). Each chunk sent upstream waits ``latency()`` seconds first, then
    ``delayed(seconds)`` is told."""

    async def pump(src: trio.SocketStream, dst: trio.SocketStream, up: bool) -> None:
        try:
            async for data in src:
                wait = latency() if up else 0.0
                if wait > 0:
                    await trio.sleep(wait)
                    if delayed is not None:
                        delayed(wait)
                await dst.send_all(data)
            await dst.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump, client, upstream, True)
        nursery.start_soon(pump, upstream, client, False)


def _abort(stream: trio.SocketStream) -> None:
    """Make the next close send RST instead of FIN."""
    with contextlib.suppress(OSError):
        stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


async def _discard(stream: trio.SocketStream) -> None:
    """Read and drop everything until the peer closes (or the scope is cancelled)."""
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        async for _ in stream:
            pass


async def _canned(stream: trio.SocketStream, status: int) -> None:
    """Read the request head (briefly), answer ``status`` with ``Connection: close``."""
    buf = b""
    with trio.move_on_after(1.0):
        try:
            while b"\r\n\r\n" not in buf and len(buf) < _READ:
                data = await stream.receive_some(_READ)
                if not data:
                    break
                buf += data
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = "Injected"
    body = json.dumps({"error": "injected"}).encode()
    head = (
        f"HTTP/1.1 {status} {phrase}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    try:
        await stream.send_all(head + body)
        await stream.send_eof()
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        return
    # let the client read the answer and close first (closing with unread request bytes
    # would reset the connection under the answer)
    with trio.move_on_after(1.0):
        await _discard(stream)


async def serve_link(
    link: FaultyLink,
    *,
    port: int = 0,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``link`` on ``127.0.0.1:port`` until cancelled; ``started`` with ``link.url``."""
    listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
    link.port = listeners[0].socket.getsockname()[1]
    link.url = f"http://127.0.0.1:{link.port}"
    link._event(f"listening on {link.port}")
    async with trio.open_nursery() as nursery:
        serve = functools.partial(trio.serve_listeners, handler_nursery=nursery)
        await nursery.start(serve, link._handle, listeners)
        task_status.started(link.url)


__all__ = ["FaultyLink", "serve_link"]
