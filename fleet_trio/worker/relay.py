"""The interactive relay, worker side: ``stdio: tty`` and ``stdio: pipe`` jobs.

worker-protocol.md §3.8 (E8/E9), §8.2 (relay modes), §7.2 (row "relay dial failure");
worker-process.md §8.1 and §8.5.

Three layers:

* **Frame codec** (§8.2 "Input frame format"). :func:`encode_data` / :func:`encode_resize`
  write one NDJSON line (``{"t":"d","b":"bHM="}``, ``{"t":"r","rows":48,"cols":180}``; ``b``
  omitted when empty, ``rows``/``cols`` omitted when 0). :class:`FrameReader` is incremental:
  it reassembles lines split across reads, skips blank lines and frames of an unknown ``t``,
  and raises :class:`FrameError` on malformed JSON, a wrongly typed field, bad base64, a
  size outside 0–65535 or a line over 1 MiB.

* **The two streams**, each an HTTP/1.1 exchange driven by h11 over a Trio stream (one
  connection each, never reused). :func:`open_out_stream` (E8, ``POST /v1/jobs/{id}/tty/out``)
  sends the request head with ``Transfer-Encoding: chunked`` and reads the response head
  while the body is still open: the controller answers ``200`` before it reads the body (full
  duplex; a client that finishes the body first would deadlock). Each
  :meth:`OutStream.send` is one chunk, flushed at once; :meth:`OutStream.aclose` ends the body
  (the terminating chunk tells the controller the session is over), waits (bounded) for the
  end of the response, then closes the socket. :func:`open_in_stream` (E9,
  ``GET /v1/jobs/{id}/tty/in``) returns an :class:`InStream`, a ``trio.abc.ReceiveStream``
  over the response body; its end is an ordinary stdin EOF. Any answer but ``200`` (404
  unknown job, 409 half already connected, 401/403/500) or a transport failure raises
  :class:`RelayError`.

* :func:`run_attached`: open E8, then E9 (the reference's order), then run the job:

  - ``tty``: :func:`~fleet_trio.proc.pty.start_pty`; PTY output → E8 body, raw; E9 frames →
    PTY input, resizes applied (a size with a 0 dimension is ignored, logged); malformed input
    ends input handling (logged), not the job; input EOF does nothing. After the process ends
    the output copy gets up to :data:`DRAIN_TIMEOUT` (2 s) to reach EOF, then the PTY is torn
    down and both streams closed. Nothing is written to the log endpoint.
  - ``pipe``: :func:`~fleet_trio.proc.run.run` with ``stdin_source`` = the E9 body (**raw
    bytes**, as §8.2 and worker-process §8.1 say: only tty input is framed), stdout → E8,
    byte-exact; E9 EOF closes the child's stdin; stderr → ``stderr_sink`` (the spec sends
    pipe-mode stderr to the log endpoint, E6: pass the job's log shipper; ``None`` discards
    it). ``run`` never waits for the stdin copy (worker-process §2.3.3).

  Failures to open a half return ``Result(exit_code=-1, err="attach <mode> stdio: open
  output stream: <detail>")`` (or ``open input stream``) and start nothing (§7.2). A stop
  (``rc kill``) while a half is being opened returns ``Result(exit_code=-1, killed=True,
  reason="cancelled")``, nothing started (cancellation is never an ``err``, worker-process
  §2.2). Opening is bounded by ``open_timeout``; the streams themselves have no timeout, and
  back-pressure (nobody reading the operator's side) is not an error.

Trio only, no threads. Program shutdown (Trio cancellation): the process is torn down by
``run``/``PtySession.wait`` (shielded), the helpers are cancelled, both streams are closed
in shielded, bounded ``finally`` blocks, and ``Cancelled`` propagates.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import http
import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import TypeVar
from urllib.parse import urlsplit

import attrs
import h11
import trio

from fleet_trio.inputs import InputError, loads_json
from fleet_trio.proc.pty import PtySession, PtyStartError, start_pty
from fleet_trio.proc.run import run
from fleet_trio.proc.sinks import NullSink, Sink, TeeSink
from fleet_trio.proc.spec import JobSpec, Result
from fleet_trio.proc.stop import StopToken
from fleet_trio.worker.client import Assignment

log = logging.getLogger(__name__)

MODES = ("tty", "pipe")
MAX_FRAME_LINE = 1 << 20
"""Longest input frame line (bytes, without the newline), §13."""
MAX_DIMENSION = 65535
OPEN_TIMEOUT = 30.0
"""Seconds allowed to connect and get the response head of one half (the reference has none)."""
DRAIN_TIMEOUT = 2.0
"""Seconds the PTY output copy gets to reach EOF after the process ended (§8.2)."""
CLOSE_TIMEOUT = 2.0
"""Seconds allowed to end a stream's body and close it, in a shielded ``finally``."""
READ_CHUNK = 65536
MAX_ERROR_BODY = 64 * 1024
OCTET_STREAM = "application/octet-stream"

T = TypeVar("T")


# ============================================================================================
# Frame codec
# ============================================================================================


class FrameError(ValueError):
    """An input frame that cannot be decoded (malformed JSON, bad field, line too long)."""


@attrs.frozen
class DataFrame:
    """``{"t":"d","b":<base64>}``: keystrokes / bytes for the process."""

    data: bytes


@attrs.frozen
class ResizeFrame:
    """``{"t":"r","rows":R,"cols":C}``: a terminal window size (0 means "not given")."""

    rows: int
    cols: int


Frame = DataFrame | ResizeFrame


def _dump(obj: dict[str, object]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode("ascii") + b"\n"


def encode_data(data: bytes) -> bytes:
    """One data frame line, ``\\n``-terminated (``b"ls"`` → ``{"t":"d","b":"bHM="}``)."""
    obj: dict[str, object] = {"t": "d"}
    if data:
        obj["b"] = base64.b64encode(data).decode("ascii")
    return _dump(obj)


def encode_resize(rows: int, cols: int) -> bytes:
    """One resize frame line (``{"t":"r","rows":48,"cols":180}``); zero sizes are omitted."""
    for value in (rows, cols):
        if not 0 <= value <= MAX_DIMENSION:
            raise ValueError(f"terminal size out of range: {rows}x{cols}")
    obj: dict[str, object] = {"t": "r"}
    if rows:
        obj["rows"] = rows
    if cols:
        obj["cols"] = cols
    return _dump(obj)


def encode_frame(frame: Frame) -> bytes:
    if isinstance(frame, DataFrame):
        return encode_data(frame.data)
    return encode_resize(frame.rows, frame.cols)


def _dimension(obj: dict[str, object], key: str) -> int:
    value = obj.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise FrameError(f"frame field {key!r} is not an integer: {value!r}")
    if not 0 <= value <= MAX_DIMENSION:
        raise FrameError(f"frame field {key!r} out of range: {value}")
    return value


def decode_frame(line: bytes) -> Frame | None:
    """Decode one line. ``None`` for a blank line or an unknown ``t`` (skipped)."""
    text = line.strip()
    if not text:
        return None
    try:
        obj = loads_json(text, max_depth=8)  # controller input: depth-bounded, finite numbers
    except InputError as exc:
        raise FrameError(f"malformed frame: {exc}") from None
    if not isinstance(obj, dict):
        raise FrameError(f"frame is not a JSON object: {text[:64]!r}")
    kind = obj.get("t")
    if kind is not None and not isinstance(kind, str):
        raise FrameError(f"frame field 't' is not a string: {kind!r}")
    if kind == "d":
        b = obj.get("b")
        if b is None:
            return DataFrame(b"")
        if not isinstance(b, str):
            raise FrameError(f"frame field 'b' is not a string: {b!r}")
        try:
            return DataFrame(base64.b64decode(b, validate=True))
        except (binascii.Error, ValueError) as exc:
            raise FrameError(f"frame field 'b' is not base64: {exc}") from None
    if kind == "r":
        return ResizeFrame(_dimension(obj, "rows"), _dimension(obj, "cols"))
    log.debug("relay: skipping a frame of unknown type %r", kind)
    return None


class FrameReader:
    """Incremental NDJSON decoder: :meth:`feed` bytes as they arrive, :meth:`finish` at EOF.

    After a :class:`FrameError` the reader is unusable (input handling ends, §8.2).
    """

    def __init__(self, max_line: int = MAX_FRAME_LINE) -> None:
        self.max_line = max_line
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        frames: list[Frame] = []
        self._buf += data
        start = 0
        while True:
            end = self._buf.find(b"\n", start)
            if end < 0:
                break
            if end - start > self.max_line:
                raise FrameError(f"frame line longer than {self.max_line} bytes")
            frame = decode_frame(bytes(self._buf[start:end]))
            if frame is not None:
                frames.append(frame)
            start = end + 1
        del self._buf[:start]
        if len(self._buf) > self.max_line:
            raise FrameError(f"frame line longer than {self.max_line} bytes")
        return frames

    def finish(self) -> list[Frame]:
        """EOF: a last line without its newline still counts (as Go's ``bufio.Scanner``)."""
        rest, self._buf = bytes(self._buf), bytearray()
        frame = decode_frame(rest)
        return [] if frame is None else [frame]


# ============================================================================================
# HTTP/1.1 streams (h11 on Trio)
# ============================================================================================


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
        obj = loads_json(text, max_depth=8)
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


# ============================================================================================
# Running an attached job
# ============================================================================================


async def _open_half(
    mode: str,
    what: str,
    stop: StopToken,
    open_timeout: float,
    opener: Callable[[], Awaitable[T]],
) -> tuple[T | None, Result | None]:
    """``(stream, None)``, or ``(None, Result)`` for a failure (§7.2) or a stop meanwhile."""
    err = ""
    with trio.CancelScope(deadline=stop.deadline) as scope:
        link = StopToken(parent=stop, on_set=scope.cancel)  # a set stop cancels the opening
        try:
            with trio.fail_after(open_timeout):
                return await opener(), None
        except trio.TooSlowError:
            err = f"no answer within {open_timeout:g}s"
        except RelayError as exc:
            err = str(exc)
        finally:
            del link
    if scope.cancelled_caught or stop.is_set():
        return None, Result(exit_code=-1, killed=True, reason="cancelled")
    return None, Result(exit_code=-1, err=f"attach {mode} stdio: {what}: {err}")


async def run_attached(
    base_url: str,
    token: str,
    assignment: Assignment,
    spec: JobSpec,
    stop: StopToken | None = None,
    *,
    stderr_sink: Sink | None = None,
    output_sink: Sink | None = None,
    spawn_limiter: trio.CapacityLimiter | None = None,
    open_timeout: float = OPEN_TIMEOUT,
    drain_timeout: float = DRAIN_TIMEOUT,
) -> Result:
    """Run an assignment whose ``stdio`` is ``tty`` or ``pipe`` through the relay (§8.2).

    ``base_url``/``token``: the controller URL (a trailing ``/`` is dropped) and the worker
    token. ``spec``: the job as for ``run`` (its ``stdin_source``/``stderr_sink`` are
    replaced). ``stop``: the job's stop token (kill, watchdogs of the caller, shutdown drain).
    ``stderr_sink``: pipe mode only, where stderr goes (the log shipper; ``None`` discards).
    ``output_sink``: also gets what goes to the operator (PTY output, pipe stdout): the live
    log tail; it must not raise. Returns the job's ``Result``; see the module docstring for
    every path.
    """
    mode = assignment.stdio
    if mode not in MODES:
        raise ValueError(f"run_attached needs stdio tty or pipe, not {mode!r}")
    stop = stop if stop is not None else StopToken()
    job_id = assignment.job_id

    out, failure = await _open_half(
        mode,
        "open output stream",
        stop,
        open_timeout,
        lambda: open_out_stream(base_url, token, job_id),
    )
    if out is None:
        assert failure is not None
        return failure
    try:
        inp, failure = await _open_half(
            mode,
            "open input stream",
            stop,
            open_timeout,
            lambda: open_in_stream(base_url, token, job_id),
        )
        if inp is None:
            assert failure is not None
            return failure
        try:
            if mode == "tty":
                return await _run_tty(
                    job_id, out, inp, spec, stop, spawn_limiter, drain_timeout, output_sink
                )
            pipe_spec = attrs.evolve(
                spec,
                stdin_source=inp,
                stderr_sink=stderr_sink if stderr_sink is not None else NullSink(),
            )
            to_operator: Sink = _OutSink(job_id, out)
            if output_sink is not None:
                to_operator = TeeSink(to_operator, output_sink)
            return await run(pipe_spec, to_operator, stop, spawn_limiter=spawn_limiter)
        finally:
            await inp.aclose()
    finally:
        await out.aclose()


class _OutSink:
    """Pipe-mode stdout → E8. After a transport failure the rest is discarded (logged once)."""

    def __init__(self, job_id: str, out: OutStream) -> None:
        self.job_id = job_id
        self.out = out
        self.failed = False

    async def write(self, data: bytes) -> None:
        if self.failed:
            return
        try:
            await self.out.send(data)
        except RelayError as exc:
            self.failed = True
            log.warning("job %s: relay output lost, discarding the rest: %s", self.job_id, exc)


async def _run_tty(
    job_id: str,
    out: OutStream,
    inp: InStream,
    spec: JobSpec,
    stop: StopToken,
    spawn_limiter: trio.CapacityLimiter | None,
    drain_timeout: float,
    mirror: Sink | None = None,
) -> Result:
    try:
        session = await start_pty(spec, spawn_limiter=spawn_limiter)
    except PtyStartError as exc:
        return exc.result
    # Helpers run in their own shielded scopes, cancelled explicitly below, so a shutdown's
    # Cancelled reaches only the main path (which PtySession.wait turns into the teardown).
    out_scope = trio.CancelScope(shield=True)
    in_scope = trio.CancelScope(shield=True)
    output_done = trio.Event()
    shutdown: trio.Cancelled | None = None
    result: Result | None = None
    async with session, trio.open_nursery() as nursery:
        nursery.start_soon(_copy_output, job_id, session, out, output_done, out_scope, mirror)
        nursery.start_soon(_copy_input, job_id, session, inp, in_scope)
        try:
            result = await session.wait(stop)
            with trio.move_on_after(drain_timeout):
                await output_done.wait()
            if not output_done.is_set():
                log.warning("job %s: PTY output did not drain in %gs", job_id, drain_timeout)
        except trio.Cancelled as exc:
            shutdown = exc
        finally:
            out_scope.cancel()
            in_scope.cancel()
    if shutdown is not None:
        try:
            raise shutdown
        finally:
            del shutdown
    assert result is not None
    return result


async def _copy_output(
    job_id: str,
    session: PtySession,
    out: OutStream,
    done: trio.Event,
    scope: trio.CancelScope,
    mirror: Sink | None = None,
) -> None:
    """PTY → E8, raw, until EOF. A broken stream: keep draining (the child must not block).
    ``mirror`` gets every chunk too (the live log), whether or not the relay still works."""
    with scope:
        broken = False
        while True:
            try:
                data = await session.read()
            except (trio.BrokenResourceError, OSError) as exc:
                log.warning("job %s: PTY read failed: %s", job_id, exc)
                break
            if not data:
                break
            if mirror is not None:
                await mirror.write(data)
            if broken:
                continue
            try:
                await out.send(data)
            except RelayError as exc:
                broken = True
                log.warning("job %s: relay output lost, discarding the rest: %s", job_id, exc)
        done.set()


async def _copy_input(
    job_id: str, session: PtySession, inp: InStream, scope: trio.CancelScope
) -> None:
    """E9 frames → PTY. EOF, a broken stream or a malformed frame end input, not the job."""
    with scope:
        reader = FrameReader()
        try:
            while True:
                chunk = await inp.receive_some(READ_CHUNK)
                frames = reader.feed(chunk) if chunk else reader.finish()
                for frame in frames:
                    await _apply(job_id, session, frame)
                if not chunk:
                    log.debug("job %s: relay input ended", job_id)
                    return
        except FrameError as exc:
            log.warning("job %s: relay input ends on a malformed frame: %s", job_id, exc)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.warning("job %s: relay input stream broke: %s", job_id, exc)


async def _apply(job_id: str, session: PtySession, frame: Frame) -> None:
    if isinstance(frame, DataFrame):
        if frame.data:
            await session.write(frame.data)
        return
    if frame.rows == 0 or frame.cols == 0:
        log.warning("job %s: ignoring a %dx%d resize", job_id, frame.rows, frame.cols)
        return
    try:
        session.resize(frame.rows, frame.cols)
    except OSError as exc:
        log.warning("job %s: resize to %dx%d failed: %s", job_id, frame.rows, frame.cols, exc)


__all__ = [
    "CLOSE_TIMEOUT",
    "DRAIN_TIMEOUT",
    "MAX_FRAME_LINE",
    "MODES",
    "OPEN_TIMEOUT",
    "DataFrame",
    "Frame",
    "FrameError",
    "FrameReader",
    "InStream",
    "OutStream",
    "RelayError",
    "ResizeFrame",
    "decode_frame",
    "encode_data",
    "encode_frame",
    "encode_resize",
    "open_in_stream",
    "open_out_stream",
    "run_attached",
]
