"""Write deadlines of the task tree's HTTP server (issue 13 item 2): a client that does not take
its bytes is dropped, never waited on (plain hypercorn waits for it for ever). The server's
cancel with a stalled client is shown on the real processes in test_stalled_tail_shutdown.py."""

from __future__ import annotations

import functools

import trio
from hypercorn.config import Config as HypercornConfig
from quart import websocket
from quart_trio import QuartTrio

from fleet_trio.nursery.httpserve import Connections, serve_http_bounded
from fleet_trio.sim.stall import open_stalled_tail, wait_server_blocked
from tests.helpers import wait_until


def _app(ended: trio.Event) -> QuartTrio:
    app = QuartTrio(__name__)

    @app.websocket("/flood")
    async def flood() -> None:
        await websocket.accept()
        try:
            while True:
                await websocket.send("x" * 65536)
                await trio.lowlevel.checkpoint()  # as a tail subscription does between frames
        finally:
            ended.set()

    return app


def _config() -> HypercornConfig:
    hc = HypercornConfig()
    hc.bind = ["127.0.0.1:0"]
    hc.accesslog = None
    hc.errorlog = None
    return hc


async def test_a_client_that_stops_reading_is_dropped_at_the_write_deadline() -> None:
    ended = trio.Event()
    conns = Connections(write_timeout=2.0)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(
                functools.partial(serve_http_bounded, _app(ended), _config(), connections=conns)
            )
            port = int(urls[0].rsplit(":", 1)[1])
            client = await trio.to_thread.run_sync(open_stalled_tail, "127.0.0.1", port, "/flood")
            try:
                await wait_server_blocked(client, port)
                await ended.wait()  # the handler was cancelled: its client was dropped
                assert conns.dropped == 1
                await wait_until(lambda: not conns.live, what="the connection's task ended")
            finally:
                client.close()
            nursery.cancel_scope.cancel()


class _BusyStream:
    """A socket stream whose writer is hypercorn's close path: ``send_eof`` runs outside the
    connection's send lock, so a frame written meanwhile finds the stream busy."""

    def __init__(self) -> None:
        self.closed = False

    async def send_all(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        raise trio.BusyResourceError("another task is currently sending data on this SocketStream")

    async def aclose(self) -> None:
        self.closed = True
        await trio.lowlevel.checkpoint()


class _Protocol:
    def __init__(self) -> None:
        self.events: list[object] = []

    async def handle(self, event: object) -> None:
        self.events.append(event)
        await trio.lowlevel.checkpoint()


async def test_a_write_racing_the_close_is_a_closed_connection_not_an_error() -> None:
    # The end of a tail: the client's close frame makes hypercorn close the connection
    # (send_eof, outside the send lock) while the handler writes its own close frame. That
    # write must end the connection quietly, as a broken one does, not raise out of the
    # handler (which logged "Exception on websocket" with a traceback).
    from hypercorn.events import Closed, RawData

    from fleet_trio.nursery.httpserve import BoundedConnection

    conn = BoundedConnection(
        None,  # type: ignore[arg-type]
        _config(),
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        _BusyStream(),
        connections=Connections(write_timeout=5.0),
    )
    protocol = _Protocol()
    conn.protocol = protocol  # type: ignore[assignment]
    with trio.fail_after(5):
        await conn.protocol_send(RawData(data=b"\x88\x02\x03\xe8"))
    assert [type(e) for e in protocol.events] == [Closed]


async def _read_to_eof(port: int, request: bytes) -> tuple[bytes, float]:
    """Send ``request`` on a fresh connection, read until the server closes; the answer and how
    long the close took after the answer began."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        data = b""
        first = None
        while chunk := await stream.receive_some(65536):
            data += chunk
            if first is None:
                first = trio.current_time()
        assert first is not None
        return data, trio.current_time() - first


async def test_connection_close_and_http_1_0_are_closed_after_the_answer() -> None:
    """A request with ``Connection: close`` (or HTTP/1.0) got its answer, then the connection
    stayed open until the 120 s read timeout: the close ran in the request's task, which the
    app cancels, so ``send_eof`` raised ``Cancelled`` and the socket was never closed (a
    client reading to EOF hung, and each such client held a descriptor for two minutes)."""
    app = QuartTrio(__name__)

    @app.route("/ping")
    async def ping() -> str:
        return "pong"

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(functools.partial(serve_http_bounded, app, _config()))
            port = int(urls[0].rsplit(":", 1)[1])
            for request in (
                b"GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
                b"GET /ping HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n",
            ):
                data, close_after = await _read_to_eof(port, request)
                assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"pong"), data
                assert close_after < 5.0, close_after
            nursery.cancel_scope.cancel()
