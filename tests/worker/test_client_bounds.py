"""The controller client against a controller that trickles, floods or breaks its answers.

Every request/response exchange is bounded as a whole (connect, send, the full body), as Go's
``Client.Timeout`` bounds it; every answer body is read with a cap; no httpx error leaves a
request as anything but a :class:`ControllerError`. The controllers here are raw trio socket
servers on 127.0.0.1 speaking just enough HTTP/1.1.
"""

from __future__ import annotations

import gzip
import logging
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import attrs
import httpx
import pytest
import trio
import trio.testing

from fleet_trio.worker.client import (
    MAX_ANSWER_BYTES,
    MAX_ERROR_BODY,
    ControllerClient,
    ControllerError,
    PollAnswer,
    Registration,
    Timings,
)
from fleet_trio.worker.worker import Worker, serve_worker
from tests.helpers import FAST, FAST_CLIENT, config, read_head, scenario_pause, wait_until

Handler = Callable[[trio.SocketStream, bytes], Awaitable[None]]

HEAD_200 = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
FLOOD_CAP = 64 << 20
"""A flooding server stops after this much (so a client without a cap cannot eat the
machine); a client with one has closed the connection long before."""


class Flood:
    """What a flooding handler saw: the bytes it got out before the client hung up."""

    def __init__(self) -> None:
        self.sent = 0
        self.hung_up = trio.Event()

    async def chunked(self, stream: trio.SocketStream, head: bytes) -> None:
        """``head`` (status line and headers, no blank line), then an endless chunked body."""
        block = b"x" * 65536
        chunk = b"%x\r\n" % len(block) + block + b"\r\n"
        try:
            await stream.send_all(head + b"Transfer-Encoding: chunked\r\n\r\n")
            while self.sent < FLOOD_CAP:
                await stream.send_all(chunk)
                self.sent += len(block)
            await stream.send_all(b"0\r\n\r\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.hung_up.set()


def _serving(handler: Handler) -> Callable[[trio.SocketStream], Awaitable[None]]:
    async def serve(stream: trio.SocketStream) -> None:
        async with stream:
            head = await read_head(stream)
            await handler(stream, head)

    return serve


@asynccontextmanager
async def raw_controller(
    handler: Handler, timings: Timings | None = None
) -> AsyncIterator[ControllerClient]:
    """A client on a raw server that hands every request (its head) to ``handler``."""
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, _serving(handler), 0)
        port = listeners[0].socket.getsockname()[1]
        client = ControllerClient(f"http://127.0.0.1:{port}", "t", timings=timings)
        async with client:
            yield client
        nursery.cancel_scope.cancel()


async def trickle(stream: trio.SocketStream, head: bytes) -> None:
    """A 200 whose 200-byte body comes one byte every 5 s after a valid-looking start."""
    start = b'{"worker_id":"w1"'
    try:
        await stream.send_all(HEAD_200 + b"Content-Length: 200\r\n\r\n" + start)
        for _ in range(200 - len(start)):
            await scenario_pause(5, why="the controller trickles its answer")
            await stream.send_all(b" ")
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


# --- one deadline for the whole exchange (Go's Client.Timeout) ---------------------------------


async def test_a_trickled_registration_answer_times_out_at_the_request_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Each byte comes well within httpx's per-read timeout, so only a bound on the whole
    exchange ends it: 2 minutes (the reference's), not the 15 the trickle would take."""
    async with raw_controller(trickle) as client:
        started = trio.current_time()
        with trio.fail_after(2000), pytest.raises(ControllerError) as info:
            await client.register(Registration("h"))
        took = trio.current_time() - started
    assert 120 <= took < 125
    assert "no complete answer within 2m0s" in str(info.value)
    assert info.value.status is None  # the same path as a transport failure: retried


async def test_trickled_heartbeat_and_poll_answers_are_bounded_too(
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with raw_controller(trickle) as client:
        started = trio.current_time()
        with trio.fail_after(2000):
            assert not await client.heartbeat("w1", ["j1"])
        assert 120 <= trio.current_time() - started < 125
        assert any(
            r.getMessage().startswith("heartbeat failed: ") and "within 2m0s" in r.getMessage()
            for r in caplog.records
        )
        started = trio.current_time()
        with trio.fail_after(2000), pytest.raises(ControllerError, match="within 2m30s"):
            await client.poll("w1", 30.0)  # the long poll's own wait on top of the 2 minutes
        assert 150 <= trio.current_time() - started < 155


async def test_the_bound_comes_from_the_timings(autojump_clock: trio.testing.MockClock) -> None:
    async with raw_controller(trickle, Timings(request_timeout=7.0)) as client:
        started = trio.current_time()
        with trio.fail_after(2000), pytest.raises(ControllerError, match="within 7s"):
            await client.register(Registration("h"))
        assert 7 <= trio.current_time() - started < 8


# --- answers read with a cap --------------------------------------------------------------------


@pytest.mark.parametrize("status", [200, 500])
async def test_an_endless_poll_answer_is_refused_and_the_connection_closed(status: int) -> None:
    flood = Flood()
    head = b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\n" % status

    async def handler(stream: trio.SocketStream, _: bytes) -> None:
        await flood.chunked(stream, head)

    with trio.fail_after(30):
        async with raw_controller(handler) as client:
            with pytest.raises(ControllerError) as info:
                await client.poll("w1", 0.1)
            await flood.hung_up.wait()  # the client closed the connection
    message = str(info.value)
    assert info.value.status == status
    assert message.isprintable() and len(message) < 400
    if status == 200:
        assert f"longer than {MAX_ANSWER_BYTES >> 20} MiB: refused, connection closed" in message
    else:
        assert message.startswith("poll: HTTP 500: xxx")
    # what the client read stayed near its cap (plus what the sockets buffer), not 64 MiB
    cap = MAX_ANSWER_BYTES if status == 200 else MAX_ERROR_BODY
    assert flood.sent < cap + (24 << 20)


async def test_an_endless_heartbeat_answer_does_not_stop_heartbeats() -> None:
    floods: list[Flood] = []

    async def handler(stream: trio.SocketStream, _: bytes) -> None:
        flood = Flood()
        floods.append(flood)
        await flood.chunked(stream, HEAD_200)

    with trio.fail_after(30):
        async with raw_controller(handler) as client:
            for _ in range(3):  # each answered (the status is all a heartbeat needs), none hangs
                assert await client.heartbeat("w1", [])
            for flood in floods:
                await flood.hung_up.wait()
    assert len(floods) == 3
    assert all(f.sent < MAX_ERROR_BODY + (24 << 20) for f in floods)


async def test_a_register_answer_over_the_cap_is_refused() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        pad = b" " * (MAX_ANSWER_BYTES + 1)
        return httpx.Response(200, content=b'{"worker_id":"w1"}' + pad)

    transport = httpx.MockTransport(handler)
    async with ControllerClient("http://ctrl", "t", transport=transport) as client:
        with pytest.raises(
            ControllerError, match=f"longer than {MAX_ANSWER_BYTES >> 20} MiB"
        ) as info:
            await client.register(Registration("h"))
    assert info.value.status == 200


async def test_error_bodies_are_cut_and_escaped_in_errors_and_log_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    huge = ("\x1b[2J" + "line\n" * 400_000).encode()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400 if request.url.path.endswith("/labels") else 500, content=huge)

    transport = httpx.MockTransport(handler)
    async with ControllerClient("http://ctrl", "t", transport=transport) as client:
        with pytest.raises(ControllerError) as info:
            await client.poll("w1", 0.1)
        assert not await client.push_labels("w1", Registration("h"))
    message = str(info.value)
    assert message.startswith("poll: HTTP 500: ")
    assert message.isprintable() and len(message) < 400
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("labels push")]
    assert line.startswith("labels push: HTTP 400 ")
    assert line.isprintable() and len(line) < 400


# --- no httpx error escapes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        httpx.InvalidURL("bad"),
        httpx.StreamClosed(),
        httpx.DecodingError("bad gzip"),
        httpx.RemoteProtocolError("bad\r\nframe"),
        httpx.TooManyRedirects("loop"),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_every_httpx_error_is_a_controller_error(error: Exception) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise error

    transport = httpx.MockTransport(handler)
    async with ControllerClient("http://ctrl", "t", transport=transport) as client:
        with pytest.raises(ControllerError) as info:
            await client.register(Registration("h"))
        assert not await client.heartbeat("w1", [])
    assert type(error).__name__ in str(info.value)
    assert str(info.value).isprintable()


async def test_an_unusable_base_url_is_a_controller_error_not_an_internal_error() -> None:
    """The config loader refuses such a URL; a client built around the loader is still safe."""
    async with ControllerClient("http://[::1", "t") as client:
        with pytest.raises(ControllerError, match="InvalidURL"):
            await client.register(Registration("h"))


async def test_a_cut_answer_is_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="fleet_trio.worker.client")

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b"x" * (MAX_ERROR_BODY + 1))

    transport = httpx.MockTransport(handler)
    async with ControllerClient("http://ctrl", "t", transport=transport) as client:
        assert await client.heartbeat("w1", [])
    assert any("longer than the cap" in r.getMessage() for r in caplog.records)


# --- compressed answers: decoded within the cap -----------------------------------------------


def _gzip_answer(payload: bytes, encoding: str = "gzip") -> httpx.MockTransport:
    """A 200 whose body is ``payload`` gzipped, streamed in 64 KiB reads as from a socket."""
    packed = gzip.compress(payload)

    async def pieces() -> AsyncIterator[bytes]:
        for at in range(0, len(packed), 65536):
            yield packed[at : at + 65536]

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["Accept-Encoding"] == "gzip"  # the reference's header
        return httpx.Response(200, content=pieces(), headers={"Content-Encoding": encoding})

    return httpx.MockTransport(handler)


async def test_a_gzip_answer_is_decoded() -> None:
    transport = _gzip_answer(b'{"worker_id":"w1"}')
    async with ControllerClient("http://ctrl", "t", transport=transport) as client:
        assert await client.register(Registration("h")) == "w1"


async def test_a_gzip_bomb_is_cut_at_the_cap_without_inflating_it() -> None:
    """200 MiB of zeros packed into some 200 KiB: refused once the cap is out, and the decoder
    never holds much more than that (a whole 64 KiB read of a bomb inflates to ~64 MiB)."""
    transport = _gzip_answer(bytes(200 << 20))
    async with ControllerClient("http://ctrl", "t", transport=transport) as client:
        tracemalloc.start()
        try:
            with pytest.raises(ControllerError, match=f"longer than {MAX_ANSWER_BYTES >> 20} MiB"):
                await client.poll("w1", 0.1)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < 4 * MAX_ANSWER_BYTES  # the body, its copy, one read: not 64 MiB


@pytest.mark.parametrize("encoding", ["br", "deflate", "zstd", "gzip, gzip"])
async def test_an_encoding_not_asked_for_is_refused(encoding: str) -> None:
    transport = _gzip_answer(b'{"worker_id":"w1"}', encoding)
    async with ControllerClient("http://ctrl", "t", transport=transport) as client:
        with pytest.raises(ControllerError, match="DecodingError: unsupported Content-Encoding"):
            await client.register(Registration("h"))


@pytest.mark.parametrize(
    "sent", [b"not gzip", gzip.compress(b'{"worker_id":"w1"}')[:-9]], ids=["garbage", "truncated"]
)
async def test_a_broken_gzip_body_is_a_controller_error(sent: bytes) -> None:
    async def body() -> AsyncIterator[bytes]:
        yield sent

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body(), headers={"Content-Encoding": "gzip"})

    transport = httpx.MockTransport(handler)
    async with ControllerClient("http://ctrl", "t", transport=transport) as client:
        with pytest.raises(ControllerError, match="DecodingError: bad gzip body"):
            await client.register(Registration("h"))


async def test_the_worker_logs_a_trickled_registration_and_retries(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The review's case end to end: before, registration hung (4+ minutes, no log line)."""
    attempts = 0

    async def handler(stream: trio.SocketStream, head: bytes) -> None:
        nonlocal attempts
        attempts += 1
        await trickle(stream, head)

    timings = attrs.evolve(FAST_CLIENT, request_timeout=0.5)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(trio.serve_tcp, _serving(handler), 0)
            port = listeners[0].socket.getsockname()[1]
            cfg = config(f"http://127.0.0.1:{port}", manual_clear=True)
            worker = Worker(cfg, timings=FAST, client_timings=timings)
            stopped = trio.Event()

            async def run() -> None:
                await serve_worker(worker)
                stopped.set()

            nursery.start_soon(run)
            await wait_until(lambda: attempts >= 2, timeout=20)
            worker.request_shutdown("test over")  # a registration in flight cannot hold it
            await stopped.wait()
            assert worker.registrations == 0
            nursery.cancel_scope.cancel()
    failed = [r.getMessage() for r in caplog.records if "registration with" in r.getMessage()]
    assert failed
    assert "(POST /v1/workers/register: no complete answer within 500ms)" in failed[0]
    assert "retrying in" in failed[0]


def _raw_gzip_answer(status: int, body: bytes) -> httpx.MockTransport:
    """A ``status`` answer marked gzip whose body is ``body`` as it is, streamed."""

    async def pieces() -> AsyncIterator[bytes]:
        if body:
            yield body

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=pieces(), headers={"Content-Encoding": "gzip"})

    return httpx.MockTransport(handler)


async def test_an_empty_body_marked_gzip_is_an_empty_body() -> None:
    """A compressing proxy may mark an empty answer gzip; Go's transport reads it as empty (a
    204 poll, a heartbeat's 200), not as a broken body."""
    async with ControllerClient("http://ctrl", "t", transport=_raw_gzip_answer(204, b"")) as c:
        assert await c.poll("w1", 0.1) == PollAnswer()
    async with ControllerClient("http://ctrl", "t", transport=_raw_gzip_answer(200, b"")) as c:
        assert await c.heartbeat("w1", [])


async def test_every_gzip_member_is_read_and_garbage_after_one_is_refused() -> None:
    """Go's gzip reader is multistream: a body of two members is their two payloads joined;
    bytes after a member that are no member fail the answer (Go: invalid header)."""
    two = gzip.compress(b'{"worker_id":') + gzip.compress(b'"w1"}')
    async with ControllerClient("http://ctrl", "t", transport=_raw_gzip_answer(200, two)) as c:
        assert await c.register(Registration("h")) == "w1"
    bad = gzip.compress(b'{"worker_id":"w1"}') + b"trailing junk"
    async with ControllerClient("http://ctrl", "t", transport=_raw_gzip_answer(200, bad)) as c:
        with pytest.raises(ControllerError, match="bad gzip body"):
            await c.register(Registration("h"))


async def test_a_log_chunk_on_a_slow_link_gets_a_request_calls_time(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Log chunks are request/response calls (§1.2: 2 min), not reports (5 s per attempt): a
    1 MiB chunk to a controller that takes it at 150 KB/s (about 7 s) never got through."""
    got: list[int] = []

    async def handler(stream: trio.SocketStream, head: bytes) -> None:
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        received = len(head.split(b"\r\n\r\n", 1)[1])
        while received < length:
            await scenario_pause(0.4, why="a link of some 150 KB/s")
            received += len(await stream.receive_some(65536))
        got.append(received)
        await stream.send_all(HEAD_200 + b"Content-Length: 0\r\n\r\n")

    async with raw_controller(handler) as client:
        started = trio.current_time()
        assert await client.send_log_chunk("j1", b"x" * (1 << 20))
        assert trio.current_time() - started > Timings().report_attempt_timeout
    assert got == [1 << 20]
