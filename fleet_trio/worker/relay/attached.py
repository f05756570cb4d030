"""The relay's job runner: :func:`run_attached` (worker-protocol.md §8.2, §7.2 row "relay
dial failure"; worker-process.md §8.1 and §8.5). The package docstring tells every path.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import attrs
import trio

from fleet_trio.proc.pty import PtySession, PtyStartError, start_pty
from fleet_trio.proc.run import run
from fleet_trio.proc.sinks import NullSink, Sink, TeeSink
from fleet_trio.proc.spec import JobSpec, Result
from fleet_trio.proc.stop import StopToken
from fleet_trio.worker.client import Assignment
from fleet_trio.worker.relay.frames import DataFrame, Frame, FrameError, FrameReader
from fleet_trio.worker.relay.streams import (
    OPEN_TIMEOUT,
    READ_CHUNK,
    InStream,
    OutStream,
    RelayError,
    open_in_stream,
    open_out_stream,
)

log = logging.getLogger(__name__)

MODES = ("tty", "pipe")
DRAIN_TIMEOUT = 2.0
"""Seconds the PTY output copy gets to reach EOF after the process ended (§8.2)."""

T = TypeVar("T")


async def _open_half(
    mode: str,
    stop: StopToken,
    open_timeout: float,
    what: str,
    opener: Callable[[], Awaitable[T]],
) -> T | Result:
    """The stream, or the job's ``Result`` for a failure (§7.2) or a stop meanwhile."""
    err = ""
    with trio.CancelScope(deadline=stop.deadline) as scope:
        link = StopToken(parent=stop, on_set=scope.cancel)  # a set stop cancels the opening
        try:
            with trio.fail_after(open_timeout):
                return await opener()
        except trio.TooSlowError:
            err = f"no answer within {open_timeout:g}s"
        except RelayError as exc:
            err = str(exc)
        finally:
            del link
    if scope.cancelled_caught or stop.is_set():
        return Result(exit_code=-1, killed=True, reason="cancelled")
    return Result(exit_code=-1, err=f"attach {mode} stdio: {what}: {err}")


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

    opening = functools.partial(_open_half, mode, stop, open_timeout)
    out = await opening("open output stream", lambda: open_out_stream(base_url, token, job_id))
    if isinstance(out, Result):
        return out
    try:
        inp = await opening("open input stream", lambda: open_in_stream(base_url, token, job_id))
        if isinstance(inp, Result):
            return inp
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


__all__ = ["DRAIN_TIMEOUT", "MODES", "run_attached"]
