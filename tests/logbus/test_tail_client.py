"""``fleet-trio tail``, the client: every way it can fail ends in one line and exit 2, fast,
and it reconnects only once a stream was established."""

from __future__ import annotations

import base64
import functools
import hashlib
import json
from collections.abc import Awaitable, Callable

import pytest
import trio
from trio_websocket import WebSocketRequest, serve_websocket

from fleet_trio.logbus.bus import End, Output
from fleet_trio.logbus.tail import dumps, encode_event
from fleet_trio.sim.fleet import free_port
from tests.helpers import read_head, run_tail_cli


async def tail_against(
    handler: Callable[[WebSocketRequest], Awaitable[None]],
    job_id: str,
    *options: str,
    scheme: str = "ws",
) -> trio.CompletedProcess[bytes]:
    """``fleet-trio tail OPTIONS --url <a websocket server running handler> JOB_ID``."""
    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_websocket, handler, "127.0.0.1", 0, None)
        r = await run_tail_cli(*options, "--url", f"{scheme}://127.0.0.1:{server.port}", job_id)
        nursery.cancel_scope.cancel()
    return r


WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def assert_one_error_line(stderr: bytes, text: str) -> None:
    lines = stderr.decode().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("fleet-trio tail: error: "), lines
    assert text in lines[0], lines
    assert b"Traceback" not in stderr


async def test_node_not_there_fails_fast_without_retrying() -> None:
    port = free_port()
    start = trio.current_time()
    usage = await run_tail_cli("--from", "later", "j")  # the same start-up, no network
    startup = trio.current_time() - start
    assert usage.returncode == 2
    start = trio.current_time()
    r = await run_tail_cli("--url", f"http://127.0.0.1:{port}", "j")
    # <= 5 s in total on an idle machine; the interpreter's start-up (slow under load) aside
    assert trio.current_time() - start - startup < 5.0
    assert r.returncode == 2
    assert_one_error_line(r.stderr, f"cannot connect to ws://127.0.0.1:{port}: Connection refused")


async def test_wrong_urls_are_one_line() -> None:
    for url, text in [
        ("ftp://example", "want ws://, wss://, http:// or https://"),
        ("http://127.0.0.1:99999", "Port out of range"),
        ("http://", "no host"),
    ]:
        r = await run_tail_cli("--url", url, "j")
        assert r.returncode == 2, (url, r.stderr)
        assert_one_error_line(r.stderr, text)
    r = await run_tail_cli("--url", "no-such-host.invalid", "j")  # a name that does not resolve
    assert r.returncode == 2
    assert_one_error_line(r.stderr, "cannot connect to ws://no-such-host.invalid: ")


async def test_http_error_statuses_are_one_line() -> None:
    async def handler(request: WebSocketRequest) -> None:
        if "/fleet/jobs/auth/" in request.path:
            body = json.dumps({"status": "error", "error": "unauthorized"}).encode()
            await request.reject(401, body=body)
        else:
            await request.reject(404, body=b"404 page\nnot found")

    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_websocket, handler, "127.0.0.1", 0, None)
        url = f"http://127.0.0.1:{server.port}"
        unauthorized = await run_tail_cli("--url", url, "auth")
        missing = await run_tail_cli("--url", url, "other")
        nursery.cancel_scope.cancel()
    assert unauthorized.returncode == 2 and missing.returncode == 2
    assert_one_error_line(unauthorized.stderr, "refused: HTTP 401 (unauthorized)")
    assert_one_error_line(missing.stderr, "refused: HTTP 404 (404 page not found)")


async def test_dropped_mid_stream_then_gone_gives_up_after_retries() -> None:
    """Established once, then the node goes away: reconnects (bounded), then one error line."""
    log = b"hello\n"
    stop = trio.Event()

    async def handler(request: WebSocketRequest) -> None:
        ws = await request.accept()
        for msg in encode_event(Output("stdout", 0, log, 1.0)):
            await ws.send_message(dumps(msg))
        stop.set()
        await ws.aclose(1001)

    async def serve_until_stopped(task_status: trio.TaskStatus[int]) -> None:
        async with trio.open_nursery() as inner:
            server = await inner.start(serve_websocket, handler, "127.0.0.1", 0, None)
            task_status.started(server.port)
            await stop.wait()
            inner.cancel_scope.cancel()  # nobody listens any more

    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_until_stopped)
        r = await run_tail_cli("--url", f"http://127.0.0.1:{port}", "--retries", "2", "j")
    assert r.returncode == 2
    assert r.stdout == log
    assert r.stderr.count(b"reconnecting from 6") == 2
    last = r.stderr.decode().splitlines()[-1]
    assert last.startswith("fleet-trio tail: error: giving up after 2 reconnection attempt(s)")
    assert b"Traceback" not in r.stderr


async def _raw_ws_server(
    stream: trio.SocketStream, frames_after_close: bytes, sent: list[bytes]
) -> None:
    """A hand-written websocket server: sends ``error``, then, once the client's Close
    arrives, ``frames_after_close`` (a Ping while the client is closing)."""
    request = await read_head(stream)
    if b"\r\n\r\n" not in request:
        return
    key = next(
        line.split(b":", 1)[1].strip()
        for line in request.split(b"\r\n")
        if line.lower().startswith(b"sec-websocket-key:")
    )
    accept = base64.b64encode(hashlib.sha1(key + WS_GUID).digest())
    await stream.send_all(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n"
    )
    payload = dumps({"type": "error", "message": "unknown job"}).encode()
    await stream.send_all(b"\x81" + bytes([len(payload)]) + payload)
    got = await stream.receive_some()  # the client's Close frame (opcode 8, masked)
    sent.append(got)
    await stream.send_all(frames_after_close)
    with trio.move_on_after(1):
        await stream.receive_some()
    await stream.aclose()


@pytest.mark.slow
async def test_a_ping_during_the_close_handshake_is_no_traceback() -> None:
    """The server pings while our close is under way (the LocalProtocolError: Event Pong …
    LOCAL_CLOSING seen once in 11 runs): still one line, exit 2."""
    ping, close = b"\x89\x00", b"\x88\x02\x11\x94"  # Ping (empty); Close 4500
    for frames in (ping + close, ping, close):
        sent: list[bytes] = []
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                trio.serve_tcp,
                functools.partial(_raw_ws_server, frames_after_close=frames, sent=sent),
                0,
            )
            port = listeners[0].socket.getsockname()[1]
            r = await run_tail_cli("--url", f"http://127.0.0.1:{port}", "gone")
            nursery.cancel_scope.cancel()
        assert sent and sent[0][:1] == b"\x88", (sent, r.stderr)  # the client began its close
        assert r.returncode == 2, r.stderr
        assert_one_error_line(r.stderr, "error: unknown job")


@pytest.mark.parametrize(
    ("scheme", "end", "code"),
    [
        ("http", End("done", 0, "", 12), 0),
        ("ws", End("error", 3, "boom", 12), 3),
    ],
)
async def test_reconnects_from_the_last_offset_and_the_end_code_wins(
    scheme: str, end: End, code: int
) -> None:
    """A server that drops the first connection mid-log (going away, no end): the client
    reconnects from the offset it had, and the end's exit code is its own."""
    seen: list[str] = []
    log = b"hello\nworld\n"
    assert end.offset == len(log)

    async def handler(request: WebSocketRequest) -> None:
        seen.append(request.path)
        ws = await request.accept()
        if len(seen) == 1:
            for msg in encode_event(Output("stdout", 0, log[:6], 1.0)):
                await ws.send_message(dumps(msg))
            await ws.aclose(1001)
            return
        start = int(request.path.split("from=")[1].split("&")[0])
        for ev in (Output("stdout", start, log[start:], 2.0), end):
            for msg in encode_event(ev):
                await ws.send_message(dumps(msg))
        await ws.aclose()

    r = await tail_against(handler, "job-1", scheme=scheme)
    assert r.returncode == code, r.stderr
    assert r.stdout == log
    assert seen[0].startswith("/fleet/jobs/job-1/tail?from=start")
    assert "from=6" in seen[1]
    assert b"reconnecting from 6" in r.stderr
    assert b"Traceback" not in r.stderr


async def test_ctrl_c_while_following_is_130_without_traceback() -> None:
    import signal
    import subprocess
    import sys

    accepted = trio.Event()

    async def handler(request: WebSocketRequest) -> None:
        await request.accept()
        accepted.set()
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_websocket, handler, "127.0.0.1", 0, None)
        argv = [sys.executable, "-m", "fleet_trio", "tail", "--url"]
        argv += [f"ws://127.0.0.1:{server.port}", "quiet-job"]
        with trio.fail_after(30):
            proc = await trio.lowlevel.open_process(argv, stderr=subprocess.PIPE)
            await accepted.wait()
            proc.send_signal(signal.SIGINT)
            err = b""
            assert proc.stderr is not None
            async for chunk in proc.stderr:
                err += chunk
            code = await proc.wait()
        nursery.cancel_scope.cancel()
    assert code == 130, err
    assert b"Traceback" not in err


@pytest.mark.parametrize(
    "frames",
    [
        [(0, 0)],  # one message with nothing new
        [(0, 5), (5, 5)],  # the same ground walked again (0→5, then 5→10) on every connection
    ],
    ids=["nothing-new", "same-ground"],
)
async def test_a_server_that_makes_no_progress_is_given_up_on(
    frames: list[tuple[int, int]],
) -> None:
    """Only progress (passing the furthest offset reached) resets the reconnection count: a
    server that sends nothing new, or walks the same offsets, and drops the connection every
    time was reconnected to forever."""
    connections: list[int] = []

    async def handler(request: WebSocketRequest) -> None:
        connections.append(1)
        ws = await request.accept()
        for offset, nbytes in frames:
            msg = {"type": "skipped", "offset": offset, "bytes": nbytes}
            await ws.send_message(json.dumps(msg))
        await ws.aclose(1001)

    r = await tail_against(handler, "j", "--retries", "2")
    assert r.returncode == 2, r.stderr
    assert len(connections) == 3  # the first, then two reconnection attempts
    assert b"giving up after 2 reconnection attempt(s)" in r.stderr


async def test_the_end_reason_and_error_messages_cannot_drive_the_terminal() -> None:
    """A reason or an error message is text from the server (a worker's reason may hold hook
    output): escape sequences and newlines are shown escaped, on one line."""
    reason = "acquire hook failed: exit status 1\n\x1b[2Jforged line"

    async def handler(request: WebSocketRequest) -> None:
        ws = await request.accept()
        for msg in encode_event(End("error", 1, reason, 0)):
            await ws.send_message(dumps(msg))
        await ws.aclose()

    r = await tail_against(handler, "j")
    assert r.returncode == 1, r.stderr
    assert b"\x1b" not in r.stderr and r.stderr.count(b"\n") == 1
    assert b"ended error: acquire hook failed: exit status 1\\n\\x1b[2Jforged line" in r.stderr


@pytest.mark.parametrize(
    ("body", "shown"),
    [
        (b'{"error": 5}', b"refused: HTTP 403 (5)"),
        (b'{"error": "\\u001b]0;pwned\\u0007gone"}', b"refused: HTTP 403 (\\x1b]0;pwned\\x07gone)"),
    ],
)
async def test_a_refusal_body_is_shown_escaped_and_never_crashes(body: bytes, shown: bytes) -> None:
    async def handler(request: WebSocketRequest) -> None:
        await request.reject(403, body=body)

    r = await tail_against(handler, "j")
    assert r.returncode == 2, r.stderr
    assert_one_error_line(r.stderr, shown.decode())
    assert b"\x1b" not in r.stderr


async def test_a_close_reason_is_shown_escaped() -> None:
    async def handler(request: WebSocketRequest) -> None:
        ws = await request.accept()
        await ws.aclose(4000, "\x1b]0;pwned\x07\x1b[31mRED")

    r = await tail_against(handler, "j", "--retries", "0")
    assert r.returncode == 2, r.stderr
    assert b"\x1b" not in r.stderr and b"closed 4000 \\x1b]0;pwned" in r.stderr
