"""The HTTP server's descriptors (issue 25 item 4), piece by piece: a client's EOF, the header
timeout, the keep-alive timeout after a response, and the accept loop's back-off. Each also
pins a hypercorn internal the server relies on (``TCPServer._read_data``, ``_idle_timeout``,
the ``Updated`` events): a hypercorn that changes them fails here. The whole, on real processes
under ``ulimit -n 64``, is test_descriptors.py."""

from __future__ import annotations

import errno
import functools
import logging
import math
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing
from hypercorn.config import Config as HypercornConfig
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from quart_trio import QuartTrio

from fleet_trio.nursery.accept import AcceptBackoff, accept_failure_reason, accept_loop
from fleet_trio.nursery.httpserve import Connections, serve_http_bounded
from tests.helpers import quiet_for, wait_until

PING = b"GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def _app(release: trio.Event | None = None) -> QuartTrio:
    app = QuartTrio(__name__)

    @app.route("/ping")
    async def ping() -> str:
        return "pong"

    @app.route("/held")
    async def held() -> str:
        # answers when the test says so (after the server has seen the client's EOF)
        if release is not None:
            await release.wait()
        return "pong"

    return app


def _config(keep_alive: float = 120.0) -> HypercornConfig:
    hc = HypercornConfig()
    hc.bind = ["127.0.0.1:0"]
    hc.keep_alive_timeout = keep_alive
    hc.read_timeout = 120
    hc.accesslog = None
    hc.errorlog = None
    return hc


@asynccontextmanager
async def _server(
    conns: Connections, keep_alive: float = 120.0, release: trio.Event | None = None
) -> AsyncIterator[int]:
    async with trio.open_nursery() as nursery:
        serve = functools.partial(
            serve_http_bounded, _app(release), _config(keep_alive), connections=conns
        )
        urls = await nursery.start(serve)
        yield int(urls[0].rsplit(":", 1)[1])
        nursery.cancel_scope.cancel()


async def _closed_by_server(stream: trio.SocketStream) -> bool:
    """Read until EOF (what the server sent before its close is dropped)."""
    while await stream.receive_some(65536):
        pass
    return True


async def _answer(stream: trio.SocketStream) -> bytes:
    data = b""
    while not data.endswith(b"pong"):
        chunk = await stream.receive_some(65536)
        assert chunk, data
        data += chunk
    return data


async def test_a_client_that_closes_before_a_request_is_let_go_at_once() -> None:
    # before: the connection (and its descriptor) lived until the 120 s keep-alive timer
    conns = Connections(write_timeout=30.0, header_timeout=100.0)
    with trio.fail_after(30):
        async with _server(conns) as port:
            for _ in range(20):
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                await stream.aclose()
            await wait_until(lambda: not conns.live, timeout=10, what="every connection ended")
            assert conns.header_timeouts == 0


async def test_a_client_that_closes_after_its_answer_is_let_go_at_once() -> None:
    conns = Connections(write_timeout=30.0, header_timeout=100.0)
    with trio.fail_after(30):
        async with _server(conns) as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(PING)
            assert (await _answer(stream)).startswith(b"HTTP/1.1 200")
            await wait_until(lambda: len(conns.live) == 1, what="the connection kept alive")
            await stream.aclose()
            await wait_until(lambda: not conns.live, timeout=10, what="the connection ended")


@pytest.mark.parametrize("sent", [b"", b"GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\n"])
async def test_a_connection_without_a_whole_request_head_is_closed_at_the_header_timeout(
    sent: bytes,
) -> None:
    conns = Connections(write_timeout=30.0, header_timeout=0.5)
    with trio.fail_after(30):
        async with _server(conns) as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                began = trio.current_time()
                await stream.send_all(sent)
                assert await _closed_by_server(stream)
                took = trio.current_time() - began
            assert 0.5 <= took < 10, took  # not the 120 s keep-alive timeout
            assert conns.header_timeouts == 1


async def test_keep_alive_after_an_answer_keeps_its_own_timeout() -> None:
    conns = Connections(write_timeout=30.0, header_timeout=0.2)
    with trio.fail_after(30):
        async with _server(conns, keep_alive=3.0) as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(PING)
                await _answer(stream)
                await quiet_for(1.0, reason="five header timeouts pass on an idle keep-alive")
                assert len(conns.live) == 1
                await stream.send_all(PING)  # the kept-alive connection still serves
                await _answer(stream)
                began = trio.current_time()
                assert await _closed_by_server(stream)
                assert 2.5 <= trio.current_time() - began < 20  # the keep-alive timeout
            assert conns.header_timeouts == 0


@pytest.mark.parametrize("when", ["keep-alive wait", "racing the answer's end"])
async def test_the_next_request_head_has_the_header_timeout_from_its_first_byte(
    when: str,
) -> None:
    conns = Connections(write_timeout=30.0, header_timeout=0.5)
    with trio.fail_after(30):
        async with _server(conns, keep_alive=100.0) as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(PING)
                await _answer(stream)
                if when == "keep-alive wait":
                    (conn,) = conns.live
                    await wait_until(
                        lambda: conn.idle_scope is not None and not conn.awaiting_head,
                        what="the keep-alive timer running",
                    )
                await stream.send_all(b"GET /ping HTTP/1.1\r\n")  # and never the rest
                began = trio.current_time()
                assert await _closed_by_server(stream)
                assert trio.current_time() - began < 10  # not the 100 s keep-alive
            assert conns.header_timeouts == 1


async def _read_to_eof(stream: trio.SocketStream) -> bytes:
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    return data


@pytest.mark.parametrize("requests", [1, 3])
async def test_a_client_that_half_closes_after_its_requests_still_gets_every_answer(
    requests: int,
) -> None:
    # ``shutdown(SHUT_WR)`` after whole requests (``curl`` with stdin closed, ``nc -N``, a
    # proxy): the EOF says "no more requests", not "gone". Before: the EOF was handed to the
    # app as a disconnect, the app was cancelled and the answer cut (headers and no body, or
    # nothing at all; for a dispatch: the job taken, its ack lost).
    conns = Connections(write_timeout=30.0, header_timeout=100.0)
    release = trio.Event()
    held = b"GET /held HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with trio.fail_after(30):
        async with _server(conns, release=release) as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(PING * (requests - 1) + held)
                await wait_until(lambda: conns.live, what="the connection accepted")
                (conn,) = conns.live
                await stream.send_eof()
                await wait_until(
                    lambda: conn.reading_done, what="the server seeing the client's EOF"
                )
                release.set()
                data = await _read_to_eof(stream)  # the server closes after the answers
            assert data.count(b"HTTP/1.1 200") == requests, data
            assert data.count(b"pong") == requests, data
            await wait_until(lambda: not conns.live, timeout=10, what="the connection ended")
            assert conns.header_timeouts == 0


async def test_a_client_that_resets_with_requests_still_queued_is_let_go() -> None:
    # Pipelined requests, then a reset (RST) before the first answer is written: that write
    # fails, and the read loop (paused by hypercorn until the answer is complete, with the
    # next requests buffered) was never woken: the connection, its task and its descriptor
    # stayed for ever (22 of 60 such clients in a 300-client run against a node).
    conns = Connections(write_timeout=30.0, header_timeout=100.0)
    release = trio.Event()
    held = b"GET /held HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with trio.fail_after(30):
        async with _server(conns, release=release) as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(held + PING + PING)
            await wait_until(lambda: conns.live, what="the connection accepted")
            (conn,) = conns.live
            await wait_until(lambda: conn.requests == 1, what="the first request taken")
            linger = struct.pack("ii", 1, 0)  # close with a reset
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
            stream.socket.close()
            release.set()  # the answer's write meets the reset
            await wait_until(lambda: not conns.live, timeout=10, what="the connection ended")
            assert conns.header_timeouts == 0


# -- the accept loop --------------------------------------------------------------------------


class _Listener(trio.abc.Listener[trio.SocketStream]):
    """A listener whose accepts fail with ``EMFILE`` while ``full`` is set."""

    def __init__(self) -> None:
        self.full = True
        self.tries = 0
        self.accepted: trio.MemorySendChannel[None]
        self.accepted, self.accepted_rx = trio.open_memory_channel[None](math.inf)

    async def accept(self) -> trio.SocketStream:
        await trio.lowlevel.checkpoint()
        self.tries += 1
        if self.full:
            raise OSError(errno.EMFILE, "Too many open files")
        await trio.sleep_forever()
        raise AssertionError  # pragma: no cover

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


async def test_accept_out_of_descriptors_backs_off_with_one_warning_per_interval(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="fleet_trio.nursery.httpserve")
    listener = _Listener()
    conns = Connections(write_timeout=30.0)

    async def never(stream: trio.SocketStream) -> None:
        raise AssertionError("nothing is accepted")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            accept_loop,
            listener,  # type: ignore[arg-type]
            never,
            nursery,
            conns,
        )
        await trio.sleep(25.5)
        # about 1 try per second at the longest wait, not the 10 per second of before
        assert 25 <= listener.tries <= 35, listener.tries
        records = [r for r in caplog.records if r.name == "fleet_trio.nursery.httpserve"]
        assert [r.levelname for r in records] == ["WARNING"] * 3
        assert all(r.exc_info is None for r in records)
        assert "EMFILE" in records[0].getMessage()
        assert "more failed accepts since the last warning" in records[1].getMessage()
        # a connection of this server closes: the loop tries again at once
        tries = listener.tries
        listener.full = False
        conns.connection_closed()
        closed_at = trio.current_time()
        await trio.testing.wait_all_tasks_blocked()
        assert listener.tries == tries + 1
        assert trio.current_time() == closed_at  # at once, not after the back-off
        nursery.cancel_scope.cancel()


def test_accept_failure_reason_names_the_errno_and_the_limit() -> None:
    assert accept_failure_reason(errno.EMFILE).startswith("EMFILE (too many open files; ")
    assert "descriptor limit" in accept_failure_reason(errno.EMFILE)
    assert accept_failure_reason(errno.ENFILE).startswith("ENFILE (")


def test_backoff_doubles_to_its_ceiling_and_resets_on_success() -> None:
    b = AcceptBackoff(first=0.1, most=1.0, warn_every=10.0)
    delays = [b.failed(float(i), "EMFILE")[0] for i in range(6)]
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    line = b.accepted(6.0)
    assert line == "accepting connections again (6 failed accepts over 6.0s)"
    assert b.failed(7.0, "EMFILE")[0] == 0.1
    assert b.accepted(7.5) is None  # this episode gave no warning: no line either


class BackoffMachine(RuleBasedStateMachine):
    """Over any sequence of failures and successes: every failure is in exactly one warning
    line's count (or still unreported), warnings are at least ``warn_every`` apart, and the
    wait stays within ``[first, most]``."""

    def __init__(self) -> None:
        super().__init__()
        self.b = AcceptBackoff(first=0.1, most=1.0, warn_every=10.0)
        self.now = 0.0
        self.failures = 0
        self.reported = 0
        self.warnings: list[float] = []
        self.last_delay = 0.0

    @rule(dt=st.floats(min_value=0.0, max_value=15.0))
    def fail(self, dt: float) -> None:
        self.now += dt
        self.failures += 1
        delay, line = self.b.failed(self.now, "EMFILE")
        assert 0.1 <= delay <= 1.0
        assert delay == 0.1 or delay >= self.last_delay
        self.last_delay = delay
        if line is not None:
            self.warnings.append(self.now)
            self.reported += 1
            if "more failed accepts" in line:
                self.reported += int(line.rsplit("(", 1)[1].split()[0])

    @rule(dt=st.floats(min_value=0.0, max_value=15.0))
    def accept(self, dt: float) -> None:
        self.now += dt
        self.b.accepted(self.now)
        self.last_delay = 0.0
        assert self.b.delay == 0.0

    @invariant()
    def every_failure_counted_once(self) -> None:
        assert self.reported + self.b.unreported == self.failures

    @invariant()
    def warnings_spaced(self) -> None:
        gaps = [b - a for a, b in zip(self.warnings, self.warnings[1:], strict=False)]
        assert all(gap >= 10.0 for gap in gaps)


TestBackoffMachine = BackoffMachine.TestCase
