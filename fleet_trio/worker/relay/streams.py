"""The relay's two streams, each an HTTP/1.1 exchange driven by h11 over a Trio stream (one
connection each, never reused; worker-protocol.md §3.8, E8/E9).

:func:`open_out_stream` (E8, ``POST /v1/jobs/{id}/tty/out``) sends the request head with
``Transfer-Encoding: chunked`` and reads the response head while the body is still open: the
controller answers ``200`` before it reads the body (full duplex; a client that finishes the
body first would deadlock). Each :meth:`OutStream.send` is one chunk, flushed at once;
:meth:`OutStream.aclose` ends the body (the terminating chunk tells the controller the session
is over), waits (bounded) for the end of the response, then closes the socket.
:func:`open_in_stream` (E9, ``GET /v1/jobs/{id}/tty/in``) returns an :class:`InStream`, a
``trio.abc.ReceiveStream`` over the response body; its end is an ordinary stdin EOF. Any
answer but ``200`` (404 unknown job, 409 half already connected, 401/403/500) or a transport
failure raises :class:`RelayError`.
"""

from __future__ import annotations

import contextlib
import http
import logging
import ssl
from urllib.parse import urlsplit

import attrs
import h11
import trio

from fleet_trio.inputs import InputError, loads_json
from fleet_trio.worker.relay.frames import MAX_FRAME_LINE

log = logging.getLogger(__name__)

OPEN_TIMEOUT = 30.0
"""Seconds allowed to connect and get the response head of one half (the reference has none)."""
CLOSE_TIMEOUT = 2.0
"""Seconds allowed to end a stream's body and close it, in a shielded ``finally``."""
READ_CHUNK = 65536
MAX_ERROR_BODY = 64 * 1024
OCTET_STREAM = "application/octet-stream"


class RelayError(Exception):
    """A relay half could not be opened, or its connection broke."""


_TRANSPORT_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError)


@attrs.frozen
class _Endpoint:
    host: str
    port: int
    tls: bool
    prefix: str
    authority: str


def _endpoint(base_url: str) -> _Endpoint:
    url = base_url.strip()
    if url.endswith("/") and url.strip("/"):
        url = url[:-1]
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RelayError(f"unsupported controller URL {base_url!r}")
    tls = parts.scheme == "https"
    try:
        port = parts.port or (443 if tls else 80)
    except ValueError as exc:
        raise RelayError(f"bad controller URL {base_url!r}: {exc}") from None
    return _Endpoint(parts.hostname, port, tls, parts.path, parts.netloc)


class _Conn:
    """One h11 client connection over a Trio stream."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(our_role=h11.CLIENT, max_incomplete_event_size=MAX_FRAME_LINE)

    async def send(self, event: h11.Event) -> None:
        data = self.h11.send(event)
        if data:
            await self.stream.send_all(data)

    async def next_event(self) -> h11.Event | type[h11.PAUSED]:
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event  # type: ignore[return-value]
            data = await self.stream.receive_some(READ_CHUNK)
            self.h11.receive_data(bytes(data))

    async def aclose(self) -> None:
        """Close the socket: shielded and bounded, safe in ``finally``."""
        with trio.move_on_after(CLOSE_TIMEOUT, shield=True):
            with contextlib.suppress(*_TRANSPORT_ERRORS):
                await self.stream.aclose()


async def _error_detail(conn: _Conn, response: h11.Response) -> str:
    """``404 Not Found: job not found``: the status and the JSON ``message`` (or the text)."""
    status = response.status_code
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = response.reason.decode("latin-1")
    body = bytearray()
    with trio.move_on_after(CLOSE_TIMEOUT):
        try:
            while len(body) < MAX_ERROR_BODY:
                event = await conn.next_event()
                if isinstance(event, h11.Data):
                    body += event.data
                else:
                    break
        except _TRANSPORT_ERRORS:
            pass
    text = bytes(body[:MAX_ERROR_BODY]).decode("utf-8", errors="replace").strip()
    try:
        obj = loads_json(text, max_depth=8, go_text=True)
    except InputError:
        obj = None
    if isinstance(obj, dict) and isinstance(obj.get("message"), str):
        text = obj["message"]
    return f"{status} {phrase}: {text}" if text else f"{status} {phrase}"


async def _open(
    base_url: str, token: str, method: str, path: str, *, chunked: bool
) -> tuple[_Conn, h11.Response]:
    """Connect, send the request head (and, without a body, its end), read the response head.

    Raises :class:`RelayError` unless the answer is ``200``; nothing is left open then.
    """
    ep = _endpoint(base_url)
    try:
        if ep.tls:
            stream: trio.abc.Stream = await trio.open_ssl_over_tcp_stream(
                ep.host, ep.port, ssl_context=ssl.create_default_context(), https_compatible=True
            )
        else:
            stream = await trio.open_tcp_stream(ep.host, ep.port)
    except OSError as exc:
        raise RelayError(f"dial tcp {ep.host}:{ep.port}: {exc}") from None
    conn = _Conn(stream)
    ok = False
    try:
        headers = [("Host", ep.authority), ("Authorization", f"Bearer {token}")]
        if chunked:
            headers += [("Content-Type", OCTET_STREAM), ("Transfer-Encoding", "chunked")]
        try:
            await conn.send(h11.Request(method=method, target=ep.prefix + path, headers=headers))
            if not chunked:
                await conn.send(h11.EndOfMessage())
            while True:
                event = await conn.next_event()
                if isinstance(event, h11.InformationalResponse):
                    continue
                if isinstance(event, h11.Response):
                    break
                raise RelayError("the controller closed the connection without an answer")
        except _TRANSPORT_ERRORS as exc:
            raise RelayError(f"{method} {ep.prefix + path}: {exc or type(exc).__name__}") from None
        if event.status_code != 200:
            raise RelayError(await _error_detail(conn, event))
        ok = True
        return conn, event
    finally:
        if not ok:
            await conn.aclose()


class OutStream:
    """The E8 request body: the job's output, streamed up as chunks."""

    def __init__(self, conn: _Conn) -> None:
        self._conn = conn
        self._busy = False
        self._broken = False
        self._closed = False
        self.sent = 0

    @property
    def broken(self) -> bool:
        return self._broken

    async def send(self, data: bytes) -> None:
        """One chunk, flushed at once; blocks while the controller applies back-pressure.

        Raises :class:`RelayError` once the connection is broken or closed.
        """
        if self._closed or self._broken:
            raise RelayError("the output stream is closed")
        if not data:
            await trio.lowlevel.checkpoint()
            return
        self._busy = True  # stays set if cancelled mid-write: then aclose() must not end it
        try:
            await self._conn.send(h11.Data(data=data))
        except _TRANSPORT_ERRORS as exc:
            self._broken = True
            raise RelayError(f"output stream: {exc or type(exc).__name__}") from None
        self._busy = False
        self.sent += len(data)

    async def aclose(self) -> None:
        """End the body (the session is over), wait briefly for the answer's end, close.

        Shielded and bounded (safe in ``finally``); idempotent. A stream broken or interrupted
        mid-write is only closed (the controller sees the connection drop).
        """
        if self._closed:
            return
        self._closed = True
        try:
            if not (self._busy or self._broken):
                with trio.move_on_after(CLOSE_TIMEOUT, shield=True):
                    try:
                        await self._conn.send(h11.EndOfMessage())
                        while True:
                            event = await self._conn.next_event()
                            if isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                                break
                    except _TRANSPORT_ERRORS:
                        pass
        finally:
            await self._conn.aclose()


class InStream(trio.abc.ReceiveStream):
    """The E9 response body (the operator's input) as a receive stream; ``b""`` at its end.

    A broken connection raises ``trio.BrokenResourceError`` (what ``run``'s stdin copy
    expects); after :meth:`aclose`, ``trio.ClosedResourceError``.
    """

    def __init__(self, conn: _Conn) -> None:
        self._conn = conn
        self._pending = b""
        self._eof = False
        self._closed = False

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._closed:
            raise trio.ClosedResourceError("the input stream is closed")
        limit = READ_CHUNK if max_bytes is None else max_bytes
        if self._pending:
            await trio.lowlevel.checkpoint()
            data, self._pending = self._pending[:limit], self._pending[limit:]
            return data
        if self._eof:
            await trio.lowlevel.checkpoint()
            return b""
        while True:
            try:
                event = await self._conn.next_event()
            except _TRANSPORT_ERRORS as exc:
                raise trio.BrokenResourceError(f"input stream: {exc}") from exc
            if isinstance(event, h11.Data):
                if not event.data:
                    continue
                data = bytes(event.data)
                data, self._pending = data[:limit], data[limit:]
                return data
            self._eof = True  # EndOfMessage or ConnectionClosed: stdin EOF
            return b""

    async def aclose(self) -> None:
        """Close the connection (shielded, bounded; idempotent)."""
        if self._closed:
            return
        self._closed = True
        await self._conn.aclose()


def _job_path(job_id: str, half: str) -> str:
    return f"/v1/jobs/{job_id}/tty/{half}"


async def open_out_stream(base_url: str, token: str, job_id: str) -> OutStream:
    """E8: ``POST …/tty/out`` with a chunked body; returns once the ``200`` head arrived."""
    conn, _ = await _open(base_url, token, "POST", _job_path(job_id, "out"), chunked=True)
    return OutStream(conn)


async def open_in_stream(base_url: str, token: str, job_id: str) -> InStream:
    """E9: ``GET …/tty/in``; returns once the ``200`` head arrived."""
    conn, _ = await _open(base_url, token, "GET", _job_path(job_id, "in"), chunked=False)
    return InStream(conn)


__all__ = [
    "CLOSE_TIMEOUT",
    "OPEN_TIMEOUT",
    "InStream",
    "OutStream",
    "RelayError",
    "open_in_stream",
    "open_out_stream",
]
