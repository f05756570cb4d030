"""Hypercorn inside the task tree, with write deadlines: no client can stall a shutdown.

Hypercorn writes every byte to a client inside a *shielded* cancel scope without a deadline
(``TCPServer.protocol_send``), so a client that stops reading — a ``fleet-trio tail`` piped
into a reader that sleeps, a half-open connection — blocks that write for ever, and with it the
connection's task, the server's nursery, the scope of the task tree that holds the server, and
the whole process's shutdown.

:func:`serve_http_bounded` serves an ASGI app as ``hypercorn.trio.serve`` does (plain TCP, the
app's lifespan), with one difference, in :class:`BoundedConnection`:

- every write to a client has a **write deadline** (``write_timeout``, 30 s by default: §2.1's
  write timeout). A client that has not taken the bytes by then is **dropped**: its socket is
  closed, the app sees the disconnect (a websocket handler is cancelled);
- when the server is cancelled (the tree's shutdown cancels its scope), every write still in
  progress and every later one is cut at once: the server's tasks end without waiting for any
  client. Whatever had to reach clients before the end (a tail's ``end`` frame) was sent in the
  shutdown step before the cancel (the tree's ``on_jobs_closed``), under that step's budget.

The bound this gives: a server scope closes within a scheduler pass or two of its cancel,
whatever its clients do. Tested with a real client that never reads
(``tests/nursery/test_stalled_tail_shutdown.py``).

Descriptors (no client can take the server's descriptors for long; docs/security.md
"Descriptors", ``tests/nursery/test_descriptors.py`` on real processes under ``ulimit -n 64``):

- a client's **EOF ends its connection at once** when no request is in flight: hypercorn keeps
  its idle timer running after the read loop ends, so a client that connected and closed held
  its descriptor for the whole keep-alive timeout (120 s);
- a **header timeout** (``header_timeout``, 5 s: §2.1's read-header): a connection whose first
  request head is not complete that long after the accept is closed; after a response, the
  keep-alive timeout (120 s) waits for the next request, and once its first bytes arrive the
  rest of its head has ``header_timeout`` (as Go's ``ReadHeaderTimeout`` and ``IdleTimeout``);
- **accept** is :func:`fleet_trio.nursery.accept.accept_loop`, not ``trio.serve_listeners``
  (which logs a traceback every 100 ms while the process is out of descriptors): it backs off
  and logs one WARNING per 10 s, waking at once when one of the server's connections closes.

Hypercorn internals relied on (read in hypercorn 0.18, ``TCPServer``): ``_read_data`` and
``_idle_timeout`` (both replaced), ``idle_task`` and the ``Updated`` events that restart and
stop it, and its ``h11.Connection`` at ``protocol.protocol.connection`` (for h11's public
``trailing_data``), and its ``HTTPStream`` at ``protocol.protocol.stream`` while a request
is answered (a half-closed client still gets its answers).
``tests/nursery/test_httpserve_descriptors.py`` covers each.

Both roles serve through :func:`serve_http` (a failed bind: the role's own start error).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol.http_stream import HTTPStream
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import AppWrapper, ConnectionState, LifespanState
from hypercorn.utils import repr_socket_addr, wrap_app

from fleet_trio.nursery.accept import accept_loop
from fleet_trio.nursery.peer import with_peer

log = logging.getLogger(__name__)

WRITE_TIMEOUT = 30.0
"""Seconds one write to a client may take before the client is dropped (§2.1 write: 30 s)."""
IDLE_TIMEOUT = 120.0
"""§2.1: an idle keep-alive connection is closed after 120 s."""
HEADER_TIMEOUT = 5.0
"""§2.1 read-header: seconds from a connection's accept (or from the first byte of a next
request on a kept-alive one) until its request head must be complete; else it is closed."""
TAIL_PING_INTERVAL = 30.0
"""Seconds between server pings on a tail websocket (keeps a silent client inside
``read_timeout``)."""


def hypercorn_config(listen: str) -> HypercornConfig:
    """Hypercorn settings for a listener on ``listen`` (both roles; node.md §2.1's mapping is
    ``fleet_trio.node.server.server_timeouts``)."""
    hc = HypercornConfig()
    hc.bind = [listen]
    hc.keep_alive_timeout = IDLE_TIMEOUT
    hc.read_timeout = int(IDLE_TIMEOUT)
    hc.graceful_timeout = 1.0
    # live log tail: a tail client never writes, and read_timeout applies to websocket reads
    # too; pinging makes the client answer (pong) well within it.
    hc.websocket_ping_interval = TAIL_PING_INTERVAL
    hc.accesslog = None
    hc.errorlog = None
    return hc


class Connections:
    """The live connections of one server and their write deadlines (no I/O)."""

    def __init__(self, write_timeout: float, header_timeout: float = HEADER_TIMEOUT) -> None:
        for name, value in (("write_timeout", write_timeout), ("header_timeout", header_timeout)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        self.write_timeout = write_timeout
        self.header_timeout = header_timeout
        self.header_timeouts = 0
        """Connections closed because their request head did not come in time."""
        self.freed = trio.Event()
        """Set (and replaced) each time a connection's descriptor is given back: an accept loop
        backing off for lack of descriptors retries at once."""
        self.drop_at = math.inf
        """``trio.current_time()`` from which every write is cut (set by :meth:`drop_all`)."""
        self.live: set[BoundedConnection] = set()
        self.dropped = 0
        """Clients dropped for a write that overran its deadline (or the drop)."""

    def write_deadline(self) -> float:
        return min(trio.current_time() + self.write_timeout, self.drop_at)

    def connection_closed(self) -> None:
        """A connection's socket is closed: wake an accept loop that waits for a descriptor."""
        self.freed.set()
        self.freed = trio.Event()

    def drop_all(self) -> None:
        """Cut every write in progress now, and every later one (the server is going)."""
        self.drop_at = trio.current_time()
        for conn in list(self.live):
            scope = conn.send_scope
            if scope is not None:
                scope.deadline = min(scope.deadline, self.drop_at)


class BoundedConnection(TCPServer):
    """Hypercorn's connection with a deadline on each write (see the module docstring)."""

    def __init__(
        self,
        app: AppWrapper,
        config: HypercornConfig,
        context: WorkerContext,
        state: LifespanState,
        stream: Any,
        *,
        connections: Connections,
    ) -> None:
        sock = getattr(stream, "socket", None)
        if sock is not None:  # each request's scope carries its connection (nursery/peer.py)
            app = with_peer(app, sock)
        super().__init__(app, config, context, state, stream)
        self.connections = connections
        self.send_scope: trio.CancelScope | None = None
        self.requests = 0
        """Request heads received on this connection."""
        self.reading_done = False
        """The client's side ended (EOF, reset, read timeout): no next request can come."""
        self.awaiting_head = True
        """The header timeout runs: no request yet, or bytes of a next one have come."""
        self.idle_scope: trio.CancelScope | None = None
        """The idle (or header) timer's scope while it runs."""
        self.answered = trio.Event()
        """Set when the request in flight has its whole answer (or the connection closes);
        replaced at each request head."""
        self.read_scope: trio.CancelScope | None = None
        """The read loop's scope: cancelled when a write to the client fails (the client is
        gone; the loop may be paused by hypercorn with next requests buffered)."""

    async def run(self) -> None:
        """Serve this connection until the client goes or the server is cancelled.

        Cancellation: ends the connection; a write in progress is cut (see
        :meth:`protocol_send`)."""
        self.connections.live.add(self)
        try:
            await super().run()
        finally:
            self.connections.live.discard(self)

    async def protocol_send(self, event: Event) -> None:
        """Write ``event`` to the client, under the write deadline.

        Cancellation: a write is shielded (a frame is never cut by an outside cancel and
        then continued) but never outlives its deadline, which the server's cancel moves to
        now: the client is then dropped."""
        if isinstance(event, Closed):
            self.answered.set()
            # The close comes from the request's task when the client asked for it
            # (``Connection: close``, HTTP/1.0), and the app cancels that task as it finishes:
            # unshielded, hypercorn's ``send_eof`` took the cancel and the socket stayed open
            # until the read timeout. Shielded, and bounded by the write deadline.
            with trio.CancelScope(shield=True, deadline=self.connections.write_deadline()):
                await super().protocol_send(event)
            with trio.CancelScope(shield=True):
                await self.stream.aclose()  # at once when the deadline cut the close short
            return
        if isinstance(event, Updated):
            if not event.idle:
                self.requests += 1  # a request head is complete: the header timer stops
                self.awaiting_head = False
                self.answered = trio.Event()
            else:
                self.answered.set()
                if self.reading_done:
                    return  # the client is done: no keep-alive wait for a next request
            # Shielded: the keep-alive restart comes from the request's task as the app
            # cancels it; unshielded, the restart took the cancel and no timer ran, so a
            # kept-alive connection lived until the read timeout. (Quick: a lock held only
            # around a ``nursery.start`` that starts at once.)
            with trio.CancelScope(shield=True):
                await super().protocol_send(event)
            return
        if not isinstance(event, RawData):
            await super().protocol_send(event)
            return
        async with self.send_lock:
            broken = False
            # Shielded as hypercorn's own (a cancel must not cut a frame in half and go on),
            # but with a deadline: past it the frame is cut and the client dropped.
            with trio.CancelScope(shield=True, deadline=self.connections.write_deadline()) as sc:
                self.send_scope = sc
                try:
                    await self.stream.send_all(event.data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    broken = True
                except trio.BusyResourceError:
                    # hypercorn's close (send_eof) writes outside the send lock: the
                    # connection is going (a tail's close frame racing the client's)
                    broken = True
                finally:
                    self.send_scope = None
            if sc.cancelled_caught:
                broken = True
                self.connections.dropped += 1
                log.warning("dropped a client that did not take its data in time")
                with trio.CancelScope(shield=True):
                    await self.stream.aclose()
        if broken:
            await self.protocol.handle(Closed())
            # The client is gone: a read loop that hypercorn paused until this answer was
            # complete (next requests buffered) would wait for ever, holding the descriptor.
            if self.read_scope is not None:
                self.read_scope.cancel()

    async def _read_data(self) -> None:
        """Hypercorn's read loop (``TCPServer._read_data``), plus: the first bytes of a next
        request on a kept-alive connection start its header timeout; when the client's side
        ends, the idle timer stops and is not restarted, so the connection (and its
        descriptor) ends as soon as no request is in flight, not at the keep-alive timeout.

        A write to the client that fails (a reset, a dropped client) ends the loop too.

        A client's EOF while an HTTP request is in flight is a half-close
        (``shutdown(SHUT_WR)`` after whole requests): the answers still go out, then the
        connection closes. (Hypercorn handed that EOF to the app as a disconnect at once: the
        app was cancelled and its answer cut.) A reset, a read timeout, or an EOF on a
        websocket end the connection at once.

        Cancellation: ends the loop (the connection's close follows in ``run``)."""
        with trio.CancelScope() as self.read_scope:
            while True:
                try:
                    with trio.fail_after(self.config.read_timeout or math.inf):
                        data = await self.stream.receive_some(MAX_RECV)
                except (trio.ClosedResourceError, trio.BrokenResourceError, trio.TooSlowError):
                    break
                idle = self.idle_scope
                if data and idle is not None and not self.awaiting_head:
                    # bytes of the next request after a keep-alive wait: its head has the
                    # header timeout from now
                    self.awaiting_head = True
                    header_by = trio.current_time() + self.connections.header_timeout
                    idle.deadline = min(idle.deadline, header_by)
                await self.protocol.handle(RawData(bytes(data)))
                if data == b"":
                    self.reading_done = True
                    if self.http_request_in_flight():
                        await self.answered.wait()
                    break
        self.read_scope = None
        self.reading_done = True
        await self.protocol.handle(Closed())
        await self.idle_task.stop()

    def http_request_in_flight(self) -> bool:
        """An HTTP (not websocket) request is being answered (hypercorn's ``H11Protocol``
        keeps it at ``protocol.protocol.stream`` until its answer is complete)."""
        stream = getattr(getattr(self.protocol, "protocol", None), "stream", None)
        return isinstance(stream, HTTPStream) and not self.answered.is_set()

    def next_request_buffered(self) -> bool:
        """Bytes the client sent are waiting to be parsed (h11's ``trailing_data``; hypercorn
        keeps its ``h11.Connection`` at ``protocol.protocol.connection``)."""
        h11_connection = getattr(getattr(self.protocol, "protocol", None), "connection", None)
        trailing = getattr(h11_connection, "trailing_data", None)
        return bool(trailing and trailing[0])

    async def _idle_timeout(self) -> None:
        """Hypercorn's idle timer (``TCPServer._idle_timeout``), with the header timeout until
        the first request head is complete and the keep-alive timeout after each response.
        At the end the connection is closed.

        Cancellation: the timer is stopped (a request came); its close is shielded."""
        if not self.requests:
            wait = self.connections.header_timeout
        elif self.next_request_buffered():
            # bytes of the next request came while the last one was still in flight
            self.awaiting_head = True
            wait = self.connections.header_timeout
        else:
            wait = float(self.config.keep_alive_timeout)
        try:
            with trio.move_on_after(wait) as scope:
                self.idle_scope = scope
                await self.context.terminated.wait()
        finally:
            self.idle_scope = None
        if scope.cancelled_caught and self.awaiting_head:
            self.connections.header_timeouts += 1
        with trio.CancelScope(shield=True):
            await self._initiate_server_close()


async def _drop_on_cancel(connections: Connections) -> None:
    """Sleeps in the connections' nursery; its cancel (the server's) cuts every write."""
    try:
        await trio.sleep_forever()
    finally:
        connections.drop_all()


async def serve_http_bounded(
    app: Any,
    config: HypercornConfig,
    *,
    write_timeout: float = WRITE_TIMEOUT,
    header_timeout: float = HEADER_TIMEOUT,
    connections: Connections | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the ASGI ``app`` on ``config.bind`` (plain TCP) until cancelled.

    ``header_timeout``: see :data:`HEADER_TIMEOUT` (both timeouts are ``connections``' when
    it is given). ``started`` with the bound URLs (``http://HOST:PORT``). A bind failure
    raises ``OSError`` before ``started``. TLS and QUIC are not served (``config`` must not
    ask for them).

    Cancellation: the cancel ends the server at once: the listeners close, every connection
    task is cancelled, and every write in progress to a client is cut (its client dropped)
    instead of waiting for the client. Nothing here waits on a peer once cancelled.
    """
    if config.ssl_enabled or config.quic_bind:
        raise ValueError("serve_http_bounded serves plain TCP only")
    if connections is None:
        connections = Connections(write_timeout, header_timeout)
    conns = connections
    asgi = wrap_app(app, config.wsgi_max_body_size, None)
    lifespan_state: LifespanState = {}
    lifespan = Lifespan(asgi, config, lifespan_state)
    context = WorkerContext(None)
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        sockets = config.create_sockets()
        listeners = []
        binds = []
        for sock in sockets.insecure_sockets:
            sock.listen(config.backlog)
            listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
            binds.append(f"http://{repr_socket_addr(sock.family, sock.getsockname())}")
        state = ConnectionState(lifespan_state.copy())

        async def handle(stream: Any) -> None:
            await BoundedConnection(asgi, config, context, state, stream, connections=conns).run()

        async with trio.open_nursery() as server_nursery:
            server_nursery.start_soon(_drop_on_cancel, conns, name="http write deadlines")
            task_status.started(binds)
            for listener in listeners:
                server_nursery.start_soon(
                    accept_loop, listener, handle, server_nursery, conns, name="http accept"
                )


async def serve_http(
    app: Any,
    hc: HypercornConfig,
    *,
    error: Callable[[str], Exception],
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """:func:`serve_http_bounded`, with a bind failure (``OSError``; ``OverflowError`` for a
    port out of 0-65535; also when hypercorn raises it inside its nurseries) raised as
    ``error("cannot listen on HOST:PORT: <reason>")``, before ``started``.

    Cancellation: as :func:`serve_http_bounded` (ends at once, writes in progress cut)."""
    try:
        await serve_http_bounded(app, hc, task_status=task_status)
    except (OSError, OverflowError) as exc:
        raise error(f"cannot listen on {', '.join(hc.bind)}: {exc}") from exc
    except BaseExceptionGroup as group:
        bind_errors, rest = group.split((OSError, OverflowError))
        if bind_errors is None or rest is not None:
            raise
        first: BaseException = bind_errors
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise error(f"cannot listen on {', '.join(hc.bind)}: {first}") from first


__all__ = [
    "HEADER_TIMEOUT",
    "IDLE_TIMEOUT",
    "TAIL_PING_INTERVAL",
    "WRITE_TIMEOUT",
    "BoundedConnection",
    "Connections",
    "hypercorn_config",
    "serve_http",
    "serve_http_bounded",
]
