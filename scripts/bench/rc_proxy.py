"""A timestamping HTTP/1.1 proxy in front of a real rc controller, for ``worker_hold.py --go``.

A worker talks to the proxy as if it were the controller; each of its connections gets one
kept-alive connection to the controller. Every request is read whole and forwarded in one
send; every answer is read whole and written back in **one** send (headers and body
together) on sockets with ``TCP_NODELAY``: an answer written in two segments with Nagle's
algorithm on costs a keep-alive client a ~40 ms delayed ACK, which is what an earlier
measurement of the Go worker paid without knowing it.

It records, by job ID, when the assignment left (the poll answer that hands the job out has
been written to the worker) and when the terminal status report arrived (read whole from the
worker, before it is forwarded). Only the worker protocol's bounded exchanges go through it
(E1–E7); the open-ended tty streams (E8, E9) are not used by ``true`` jobs.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket

import attrs
import h11
import trio

TERMINAL = frozenset({"succeeded", "failed", "killed", "lost"})
MAX_BODY = 4 * 1024 * 1024
_STATUS = re.compile(r"^/v1/jobs/([^/?]+)/status$")
_ASSIGNMENTS = re.compile(r"^/v1/workers/[^/?]+/assignments(\?.*)?$")


def assignment_ids(target: str, status: int, body: bytes) -> list[str]:
    """The job IDs a poll answer (E4: ``GET /v1/workers/{id}/assignments``, 200) hands out;
    ``[]`` for any other answer or a body that is not the expected JSON."""
    if status != 200 or not _ASSIGNMENTS.match(target):
        return []
    try:
        doc = json.loads(body)
    except ValueError:
        return []
    items = doc.get("assignments") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        return []
    return [str(a["job_id"]) for a in items if isinstance(a, dict) and "job_id" in a]


def terminal_job(method: str, target: str, body: bytes) -> str | None:
    """The job ID of a terminal status report (E5 with a terminal ``state``), else None."""
    m = _STATUS.match(target)
    if method != "POST" or m is None:
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    if isinstance(doc, dict) and doc.get("state") in TERMINAL:
        return m.group(1)
    return None


@attrs.define
class Stamps:
    """What a proxy saw, in ``trio.current_time()`` seconds."""

    assigned: dict[str, float] = attrs.Factory(dict)
    terminal: dict[str, float] = attrs.Factory(dict)
    polls: int = 0

    def hold_ms(self, job_id: str) -> float:
        return (self.terminal[job_id] - self.assigned[job_id]) * 1000.0


def _nodelay(stream: trio.SocketStream) -> None:
    stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)


async def _read_message(conn: h11.Connection, stream: trio.SocketStream) -> tuple[object, bytes]:
    """The next request or response on ``conn`` and its whole body; (None, b"") at EOF."""
    head: object = None
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(65536)
            conn.receive_data(data)
            continue
        if isinstance(event, h11.ConnectionClosed):
            return None, b""
        if isinstance(event, h11.Request | h11.Response):
            head = event
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_BODY:
                raise ValueError("message body over the proxy's bound")
        elif isinstance(event, h11.EndOfMessage):
            return head, bytes(body)


def _framed(
    headers: list[tuple[bytes, bytes]], body: bytes, *, bodiless: bool = False
) -> list[tuple[bytes, bytes]]:
    """``headers`` with the body's framing replaced by its length (the body is sent whole);
    ``bodiless``: a 204 or 304 answer, which carries no framing at all."""
    kept = [
        (k, v)
        for k, v in headers
        if k.lower() not in (b"content-length", b"transfer-encoding", b"connection")
    ]
    return kept if bodiless else [*kept, (b"content-length", str(len(body)).encode())]


async def _handle(client: trio.SocketStream, upstream_port: int, stamps: Stamps) -> None:
    _nodelay(client)
    upstream = await trio.open_tcp_stream("127.0.0.1", upstream_port)
    _nodelay(upstream)
    down = h11.Connection(h11.SERVER)
    up = h11.Connection(h11.CLIENT)
    async with client, upstream:
        while True:
            req, body = await _read_message(down, client)
            if req is None:
                return
            assert isinstance(req, h11.Request)
            method, target = req.method.decode(), req.target.decode()
            job = terminal_job(method, target, body)
            if job is not None:
                stamps.terminal.setdefault(job, trio.current_time())
            if _ASSIGNMENTS.match(target):
                stamps.polls += 1
            out = (
                up.send(
                    h11.Request(
                        method=req.method,
                        target=req.target,
                        headers=_framed(list(req.headers), body),
                    )
                )
                or b""
            )
            if body:
                out += up.send(h11.Data(data=body)) or b""
            out += up.send(h11.EndOfMessage()) or b""
            await upstream.send_all(out)
            resp, rbody = await _read_message(up, upstream)
            if resp is None:
                return
            assert isinstance(resp, h11.Response)
            out = (
                down.send(
                    h11.Response(
                        status_code=resp.status_code,
                        headers=_framed(
                            list(resp.headers), rbody, bodiless=resp.status_code in (204, 304)
                        ),
                        reason=resp.reason,
                    )
                )
                or b""
            )
            if rbody:
                out += down.send(h11.Data(data=rbody)) or b""
            out += down.send(h11.EndOfMessage()) or b""
            await client.send_all(out)  # headers and body in one send
            sent = trio.current_time()
            for j in assignment_ids(target, resp.status_code, rbody):
                stamps.assigned.setdefault(j, sent)
            if down.our_state is h11.MUST_CLOSE or up.our_state is h11.MUST_CLOSE:
                return
            down.start_next_cycle()
            up.start_next_cycle()


async def serve_proxy(
    upstream_port: int,
    stamps: Stamps,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on a loopback port (given to ``task_status.started``) and proxy every
    connection to the controller on ``upstream_port``, recording into ``stamps``."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]

    async def handler(stream: trio.SocketStream) -> None:
        # one connection's fault ends that connection; the worker reconnects
        with contextlib.suppress(OSError, trio.BrokenResourceError, h11.ProtocolError, ValueError):
            await _handle(stream, upstream_port, stamps)

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handler, listeners)
        task_status.started(port)
