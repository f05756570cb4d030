"""The one process supervisor (worker-process.md §2.5, §2.8, §7, §8.4).

(Over 500 lines: one supervisor for pipe and PTY jobs: the waiter, the deadlines, the teardown and
the straggler check share one cancel-scope layout.)

Pipe jobs (:func:`fleet_trio.proc.run.run`, and through it hooks, probes and verify scripts)
and PTY sessions (:class:`fleet_trio.proc.pty.PtySession`) are supervised by the same
:class:`Supervisor`: the same reap, the same deadlines, the same teardown, the same straggler
reap and sweep. They differ only in their target (a process group, or every group of a
session), in what "completed" means (the leader reaped and every output pipe at EOF, or the
leader reaped alone) and in who reads the output (the supervisor, or the PTY's reader, which
calls :meth:`Supervisor.touch`).

**One task where one will do.** The supervising task (the caller's) reaps the leader itself;
there is no waiter task. A pipe job's output is read by one pump task per pipe, in a nursery,
*except* that the job's stdout (stderr merged or not) is read by the supervising task itself
when :func:`inline_pump` selects it: its sink declares ``never_blocks`` (the in-memory
buffers of :mod:`fleet_trio.proc.sinks`: hooks, probes, verify scripts, ``nvidia-smi``) and
the job is not swept. A run with stdout alone then starts no task and no nursery. A stop or a
deadline can never wait behind a write that does not block, and a read is only ever
cancelled before it reads, so both ways lose nothing and keep every behaviour below
(``tests/proc/test_supervise_paths.py`` runs the same checks on both).

**Deadlines are cancel scopes.** The main path waits for the end in one cancel scope whose
deadline is the earliest of: the stop tokens' deadlines (a pass budget handed down as a token),
``max_runtime`` counted from the spawn, and the idle limit counted from the last output byte.
Output does not touch the scope: it only records the time (:meth:`Supervisor.touch`, one store
per chunk); when the idle deadline is reached and output came meanwhile, the deadline moves on
to the last output plus the idle limit and the wait goes on; a reader with output waiting that
only lacked a scheduler turn reads it first (:meth:`Supervisor._late_read`). Nothing polls: the
main path wakes at an end, a stop, or a deadline. Limits are strict (§7): a limit trips at the
first instant *after* it, as :meth:`~fleet_trio.proc.watchdog.Watchdog.check` decides.

**A stop is a result, cancellation is shutdown.** A stop (the caller's :class:`StopToken`, a
linked follower's token, a limit) takes the cancellation path and returns a ``Result`` with its
reason. A trio cancellation of the supervising task (program shutdown, or a caller's budget
scope) runs the same teardown in a shielded scope, keeps the ``Result`` (:attr:`result`,
``record``) and re-raises ``Cancelled``.

The teardown (cancellation path): the race re-check, SIGTERM to the target with no liveness
probe first, the grace, SIGKILL (and, if the target could not be signalled, ``killpg`` of the
leader's group: a session whose ``/proc`` listing failed still loses its leader), the bounded
wait after SIGKILL (§15 Q1 (b)), the straggler reap, then the sweep when ``spec.sweep_job_id``
is set. Every wait in it is bounded by a cancel scope.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import os
import signal
import struct
import termios
from collections.abc import Callable, Sequence

import attrs
import trio

from fleet_trio.backoff import Backoff
from fleet_trio.durations import signal_text
from fleet_trio.proc.containment import EXIT_SHIM, JobCgroup, read_usage, sweep_cgroup
from fleet_trio.proc.limits import oom_result
from fleet_trio.proc.sinks import Sink
from fleet_trio.proc.spec import JobSpec, Result, SweepReport
from fleet_trio.proc.stop import StopToken
from fleet_trio.proc.sweep import SWEEP_GRACE, SWEEP_KILL_BOUND, sweep_job_survivors
from fleet_trio.proc.target import Target
from fleet_trio.proc.watchdog import Watchdog

log = logging.getLogger(__name__)

STRAGGLER_WAIT = 2.0
"""Seconds to wait for stragglers to go after SIGKILL (and, on cancel, for pipe EOF)."""
STRAGGLER_POLL = 0.02
"""Seconds between two straggler checks (a group has no event for "empty")."""
STRAGGLER_SETTLE = 0.05
"""Seconds a live, not-yet-exiting member gets to exit by itself before it is a straggler: a
process that closes its output just before it exits (coreutils' ``close_stdout`` at exit)
completes the job while it still runs in user space, for a moment."""
ESCAPED_EOF_WAIT = 2.0
"""Seconds a swept job's pipes may stay open once only processes outside its group hold them."""
ESCAPE_POLL_MAX = 1.0
"""Longest pause between two checks of the group while the leader is gone but pipes are open."""
RACE_YIELDS = 200
"""Scheduler yields allowed for a completion to be observed before signalling."""
READ_CHUNK = 65536
"""The most one pump read takes (the default pipe capacity)."""
_LATE_TURNS = 8
"""Scheduler turns an idle check gives a reader with output waiting before it judges."""

REASON_CANCELLED = "cancelled"
REASON_SURVIVORS = "cancelled; survivors remained after SIGKILL"
REASON_STRAGGLERS_REAPED = "stragglers reaped after exit"
REASON_STRAGGLERS_REMAINED = "stragglers remained after exit"


def finish(returncode: int | None) -> Result:
    """Map a wait status to a Result (§2.6). ``None``: the leader could not be reaped."""
    if returncode is None:
        return Result(exit_code=-1)
    if returncode < 0:
        signo = -returncode
        return Result(exit_code=128 + signo, killed=True, reason=f"signal: {signal_text(signo)}")
    return Result(exit_code=returncode)


class HelperScopes:
    """The cancel scopes of a supervisor's helper tasks (pumps, stdin relay, escape watch).

    Each helper runs in its own **shielded** scope, so a trio cancellation of the caller reaches
    only the main path, which tears the process down and then calls :meth:`stop`; a helper that
    starts after :meth:`stop` is cancelled at once.
    """

    def __init__(self) -> None:
        self._scopes: list[trio.CancelScope] = []
        self.stopped = False

    def scope(self) -> trio.CancelScope:
        scope = trio.CancelScope(shield=True)
        self._scopes.append(scope)
        if self.stopped:
            scope.cancel()
        return scope

    def stop(self) -> None:
        self.stopped = True
        for scope in self._scopes:
            scope.cancel()


@attrs.frozen
class Pump:
    """One output stream of a pipe job and where its bytes go."""

    stream: trio.abc.ReceiveStream
    sink: Sink


class Supervisor:
    """One supervised process group or session, from spawn to ``Result`` (see the module).

    ``pipes``: completion waits for every :class:`Pump` to reach EOF as well as for the leader
    (pipe jobs); without pumps it is the leader's reap alone (PTY sessions). ``started`` is the
    spawn time (the ``max_runtime`` clock), ``idle_from`` the start of the idle clock.
    ``grow`` (pipe jobs) gives a pump a larger read size once a read fills it.
    """

    def __init__(
        self,
        spec: JobSpec,
        proc: trio.Process,
        target: Target,
        *,
        stop: StopToken | None = None,
        started: float,
        idle_from: float,
        grow: Callable[[trio.abc.ReceiveStream], int] | None = None,
        forks_before: int | None = None,
        stoppable: bool = True,
        cgroup: JobCgroup | None = None,
        start_label: str = "start",
    ) -> None:
        self.spec = spec
        self.cgroup = cgroup
        """The job's cgroup (cgroup backend): swept and removed at the end, always."""
        self.start_label = start_label
        """How a start error begins (``start``; a PTY session's ``start pty``): a shim that
        could not enter the job's cgroup is one."""
        self.stoppable = stoppable
        """False: the owner will never call :meth:`request_stop` nor :meth:`link`; with no
        ``stop`` token and no limit, only a shutdown can then end the wait early, and the
        wait needs no cancel scope."""
        self.forks_before = forks_before
        """The host's fork counter just before the spawn (the sweep's shortcut), if read."""
        self.proc = proc
        self.target = target
        self.dog = Watchdog(started, spec.max_runtime, spec.idle_timeout)
        self.last_output = idle_from
        self.leader_done = trio.Event()
        self.completed = trio.Event()
        self.done = trio.Event()
        """Set once :attr:`result` is known (on every path, shutdown included)."""
        self.trip_reason: str | None = None
        self.result: Result | None = None
        self.helpers = HelperScopes()
        self._grow = grow
        self._open_pipes = 0
        self._pump_scopes: list[trio.CancelScope] = []
        self._inline: _Reader | None = None
        self._readers: list[_Reader] = []
        self._wait_scope: trio.CancelScope | None = None
        self._links: list[StopToken] = []
        self._unstoppable = not stoppable and stop is None
        # Set by the caller's token (as its child), a linked token, a limit or shutdown.
        self.internal = StopToken(parent=stop, on_set=self._on_stop)
        self._stop_deadline = self.internal.deadline

    # -- what the owner calls ---------------------------------------------------------------
    def touch(self) -> None:
        """Output was seen now: the idle clock restarts (the deadline moves when it is due)."""
        self.last_output = trio.current_time()

    def request_stop(self) -> None:
        """Take the cancellation path (``reason`` ``cancelled`` unless a limit tripped)."""
        if not self.stoppable:
            raise RuntimeError("this supervision was made without stop requests")
        self.internal.set()

    def link(self, stop: StopToken | None) -> StopToken | None:
        """Let another ``stop`` token stop this supervision: setting it, or its deadline
        passing, takes the cancellation path. The link is kept while the supervision runs (a
        parent holds its children weakly); returns it (``None`` for ``None``)."""
        if stop is None:
            return None
        if not self.stoppable:
            raise RuntimeError("this supervision was made without stop requests")
        link = StopToken(parent=stop, on_set=self.internal.set)
        self._links.append(link)
        if link.deadline < self._stop_deadline:
            self._stop_deadline = link.deadline
            if self._wait_scope is not None:
                self._wait_scope.deadline = min(self._wait_scope.deadline, link.deadline)
        return link

    def _stopped(self) -> bool:
        return self.internal.was_set

    def _on_stop(self) -> None:
        if self._wait_scope is not None:
            self._wait_scope.cancel()

    # -- supervision ------------------------------------------------------------------------
    async def supervise(
        self,
        pumps: Sequence[Pump] = (),
        stdin: tuple[trio.abc.ReceiveStream, trio.abc.SendStream] | None = None,
        *,
        record: Callable[[Result], None] | None = None,
    ) -> Result:
        """Supervise until the end and return the ``Result``; ``record`` (optional) gets it on
        every path, a shutdown included. Which pipes get a helper task: the module's "One task
        where one will do".

        Cancellation: a trio cancellation runs the teardown shielded (it is bounded: grace +
        the waits after SIGKILL + the sweep), keeps the ``Result`` in :attr:`result` (and hands
        it to ``record``), then re-raises ``Cancelled``.
        """
        self._open_pipes = len(pumps)
        shutdown: trio.Cancelled | None = None
        try:
            tasked = list(pumps)
            if inline_pump(pumps, self.spec):
                self._inline = _Reader(tasked.pop(), self._grow)
                self._readers.append(self._inline)
            if not tasked and stdin is None:  # no helper task to run (a PTY session too)
                shutdown = await self._main()
            else:
                async with trio.open_nursery() as nursery:
                    for pump in tasked:
                        nursery.start_soon(self._pump, pump)
                    if stdin is not None:
                        nursery.start_soon(self._relay, *stdin)
                    if pumps and self.spec.sweep_job_id:
                        nursery.start_soon(self._escape_watch)
                    shutdown = await self._main()
        finally:
            self.done.set()
            if record is not None and self.result is not None:
                record(self.result)  # on every path, however the nursery ends
        if shutdown is not None:
            # re-raised here, outside the nursery: bare rather than in a group
            try:
                raise shutdown
            finally:
                del shutdown
        assert self.result is not None
        return self.result

    async def _main(self) -> trio.Cancelled | None:
        """The supervising task: wait for the end and conclude; a shutdown's ``Cancelled``
        is returned (for :meth:`supervise` to re-raise) once the teardown is done."""
        shutdown: trio.Cancelled | None = None
        try:
            await self._wait_for_end()
        except trio.Cancelled as exc:
            # Shutdown (or a caller's budget scope): the same teardown as a stop, shielded
            # below. Every helper runs in its own shielded scope that _conclude cancels, so no
            # child brings a Cancelled of its own.
            shutdown = exc
            self.internal.set()
        if (
            shutdown is None
            and self.completed.is_set()
            and (not self.spec.sweep_job_id or self.cgroup is not None)
            and not self.target.alive()
            and self._cgroup_emptied()
        ):
            # The common end: completed, nothing left in the target, no sweep (or, under the
            # cgroup backend, a job cgroup already empty and removed: a clean sweep). Nothing
            # here waits (the straggler reap would find the target empty), so no shielded scope.
            self.result = finish(self.proc.returncode)
            if self.cgroup is not None and self.spec.sweep_job_id:
                sweep = SweepReport(scanned=True, scope="cgroup")
                self.result = attrs.evolve(self.result, sweep=sweep)
            self.result = self._cgroup_result(self.result)
            rest = self._release()
            if rest:
                with trio.CancelScope(shield=True):
                    for stream in rest:
                        await stream.aclose()
            return None
        with trio.CancelScope(shield=True):
            self.result = self._cgroup_result(await self._conclude())
        return shutdown

    def _cgroup_result(self, result: Result) -> Result:
        """A shim that could not enter the job's cgroup (it exits :data:`EXIT_SHIM` and says
        why in its report pipe, which nothing else writes to) is a start error: the job never
        ran. A job that exits 125 itself is not one (its shim entered: the pipe is empty)."""
        cgroup = self.cgroup
        if cgroup is None:
            return result
        entry = cgroup.entry_error()
        if entry is None or self.proc.returncode != EXIT_SHIM:
            usage = cgroup.usage or read_usage(cgroup.path)
            return result if usage is None else oom_result(result, usage, self.spec.limits)
        return Result(
            exit_code=-1, err=f"{self.start_label}: cgroup {cgroup.path}: cannot enter: {entry}"
        )

    def _cgroup_emptied(self) -> bool:
        """True without a job cgroup; with one: True iff it is empty (the leader reaped,
        nothing outlived it, no stop saw an escapee) and has just been removed."""
        cgroup = self.cgroup
        if cgroup is None:
            return True
        if cgroup.escaped or cgroup.procs() != []:
            return False
        return cgroup.remove()

    async def _wait_for_end(self) -> None:
        """Wait for the end, a stop, or a deadline; a limit that is due trips the stop. A stop
        (the internal token set) cancels the wait scope (:meth:`_on_stop`)."""
        while not self._stopped():
            deadline = min(self._stop_deadline, self.dog.deadline(self.last_output))
            if deadline == math.inf and self._unstoppable:
                # Nothing can stop this run but a shutdown: no token, no limit, no owner's
                # request. No scope to cancel, then.
                await self._until_completed()
                return
            with trio.CancelScope(deadline=deadline) as scope:
                self._wait_scope = scope
                try:
                    await self._until_completed()
                    return
                finally:
                    self._wait_scope = None
            if self._stopped():
                return
            now = trio.current_time()
            reason = self.dog.check(now, self.last_output)
            if reason is not None and self.dog.check(now, now) is None and await self._late_read():
                continue  # idle was due, but output waited for a reader's turn: not idle
            if reason is not None:
                self.trip_reason = reason
                self.internal.set()
            elif now >= self._stop_deadline:
                self.internal.set()  # a stop token's deadline (a budget) passed
            # else: output came since the idle deadline was set; the deadline moves on

    async def _late_read(self) -> bool:
        """The idle limit is due: let a reader that is behind only for want of a scheduler
        turn take what waits in its pipe first; True if any output was read.

        On a starved event loop the deadline and the pipe's readiness come due together, and
        the deadline can win: the job wrote in time, but nothing read it. A reader inside its
        sink's ``write`` is not late but held (a sink applying back-pressure), and rc's idle
        clock counts reads, not writes: that one still trips. Bounded: a few turns at most.

        Cancellation: a checkpoint (a shutdown is handled by the caller, as for the wait)."""
        before = self.last_output
        for _ in range(_LATE_TURNS):
            late = [r for r in self._readers if not r.eof and not r.writing and r.unread()]
            if not late:
                break
            if self._inline is not None and self._inline in late:
                await self._inline.read_ready(self)  # data waits: a read, never EOF
            else:
                await trio.lowlevel.checkpoint()
            if self.last_output != before:
                return True
        return self.last_output != before

    async def _until_completed(self) -> None:
        """Wait for the completion: the inline pipe (if any) at EOF, the leader reaped, then
        every helper-read pipe at EOF. Resumable: a cancellation loses no output (a read is
        cancelled only before it reads) and the next call goes on where this one stopped."""
        reader = self._inline
        if reader is not None and not reader.eof:
            await reader.drain(self)
            self._pipe_closed()
        if not self.leader_done.is_set():
            await self.proc.wait()
            self._leader_reaped()
        if not self.completed.is_set():
            await self.completed.wait()

    async def _poll_completed(self) -> bool:
        """Observe, without blocking, an end that has already happened."""
        if not self.leader_done.is_set() and self.proc.poll() is not None:
            self._leader_reaped()
        reader = self._inline
        if reader is not None and not reader.eof and await reader.read_ready(self):
            self._pipe_closed()
        return self.completed.is_set()

    # -- helper tasks -------------------------------------------------------------------------
    def _leader_reaped(self) -> None:
        self.leader_done.set()
        self._maybe_complete()

    def _pipe_closed(self) -> None:
        self._open_pipes -= 1
        self._maybe_complete()

    def _maybe_complete(self) -> None:
        if self.leader_done.is_set() and self._open_pipes == 0 and not self.completed.is_set():
            self.completed.set()

    async def _pump(self, pump: Pump) -> None:
        reader = _Reader(pump, self._grow)
        self._readers.append(reader)
        with self.helpers.scope() as scope:
            self._pump_scopes.append(scope)
            await reader.drain(self)
            self._pipe_closed()

    async def _relay(self, source: trio.abc.ReceiveStream, dest: trio.abc.SendStream) -> None:
        with self.helpers.scope():
            try:
                while True:
                    data = await source.receive_some(READ_CHUNK)
                    if not data:
                        break
                    await dest.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass  # the child closed stdin or exited: not an error
            finally:
                with trio.move_on_after(1, shield=True):
                    await dest.aclose()

    async def _escape_watch(self) -> None:
        """Swept pipe jobs only: end the wait for EOF when only escapees hold the pipes.

        Once the leader is reaped and the group holds no live process, whatever still holds
        the job's stdout/stderr left the group (``setsid``, a daemon). Waiting for it, as rc
        does, would keep the job running until the escapee exits and the sweep, which exists
        to kill it, would never run. After ``ESCAPED_EOF_WAIT`` the pipes are let go and the
        run completes; the sweep then finds the escapee by its marker.
        """
        with self.helpers.scope():
            await self.leader_done.wait()
            pauses = Backoff.exponential(0.02, ESCAPE_POLL_MAX)
            checks = 0
            while not self.completed.is_set():
                if not self.target.alive():
                    with trio.move_on_after(ESCAPED_EOF_WAIT):
                        await self.completed.wait()
                    if not self.completed.is_set() and not self.target.alive():
                        for scope in self._pump_scopes:
                            scope.cancel()
                        self.completed.set()
                        return
                await trio.sleep(pauses.delay(checks))
                checks += 1

    # -- the end ------------------------------------------------------------------------------
    async def _conclude(self) -> Result:
        if self.completed.is_set() or await self._completed_after_yields():
            result = await self._finish_clean()
        else:
            result = await self._finish_cancelled()
        for stream in self._release():
            await stream.aclose()
        if self.cgroup is not None:
            found, remaining, scanned = await sweep_cgroup(
                self.cgroup, grace=SWEEP_GRACE, kill_bound=SWEEP_KILL_BOUND, leader=self.proc.pid
            )
            report = SweepReport(
                scanned=scanned, found=found, remaining=remaining, blind=not scanned, scope="cgroup"
            )
            if self.spec.sweep_job_id or found:
                result = attrs.evolve(result, sweep=report)
        elif self.spec.sweep_job_id:
            report = await sweep_job_survivors(
                self.spec.sweep_job_id,
                os.getpid(),
                marker=self.spec.sweep_marker,
                # the fork-counter shortcut holds only once the leader itself is gone: one that
                # left the job's group (or sits in D state) outlives the group's SIGKILL
                forks_before=self.forks_before if self.proc.returncode is not None else None,
            )
            result = attrs.evolve(result, sweep=report)
        return result

    def _release(self) -> list[trio.abc.AsyncResource]:
        """Stop the helpers (stdin relay, pumps stuck behind an escaped holder) and close the
        pipes; the streams without a synchronous ``close`` are returned, still open."""
        self.helpers.stop()
        rest: list[trio.abc.AsyncResource] = []
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is None:
                continue
            close = getattr(stream, "close", None)
            if close is not None:
                close()  # a pipe's close does not block: no scheduler turn per stream
            else:
                rest.append(stream)
        return rest

    async def _completed_after_yields(self) -> bool:
        """The cancel-race re-check: never block; observe an exit that has already happened
        (the leader's, the inline pipe's EOF) and let the pump tasks observe theirs."""
        for _ in range(RACE_YIELDS):
            if await self._poll_completed():
                return True
            await trio.lowlevel.checkpoint()
        return await self._poll_completed()

    async def _finish_clean(self) -> Result:
        result = finish(self.proc.returncode)
        found, emptied = await reap_stragglers(self.target)
        if found:
            reason = REASON_STRAGGLERS_REAPED if emptied else REASON_STRAGGLERS_REMAINED
            result = attrs.evolve(result, killed=True, reason=reason)
        return result

    async def _finish_cancelled(self) -> Result:
        delivered = self.target.signal(signal.SIGTERM)  # unconditionally, no liveness probe
        with trio.move_on_after(self.spec.grace):
            await self._until_completed()  # the output is still read meanwhile
        if not self.completed.is_set():
            if not self.target.signal(signal.SIGKILL):
                # /proc unreadable or the target already empty: still make sure of the leader.
                with contextlib.suppress(OSError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
            with trio.move_on_after(STRAGGLER_WAIT):
                await self._until_completed()
            if not self.completed.is_set():
                # §15 Q1 (b): something outside the group holds our pipes; stop reading.
                for scope in self._pump_scopes:
                    scope.cancel()
                self._inline = None
                if not self.leader_done.is_set():
                    with trio.move_on_after(STRAGGLER_WAIT):
                        await self.proc.wait()
                        self.leader_done.set()
        result = finish(self.proc.returncode)
        found, emptied = await reap_stragglers(self.target)
        reason = REASON_SURVIVORS if found and not emptied else REASON_CANCELLED
        if delivered or found:
            result = attrs.evolve(result, killed=True, reason=reason)
        if self.trip_reason is not None:
            result = attrs.evolve(result, killed=True, reason=self.trip_reason)
        return result


def never_blocks(sink: Sink) -> bool:
    """Does ``sink`` declare that its ``write`` never awaits (a ``never_blocks`` attribute:
    the in-memory buffers of :mod:`fleet_trio.proc.sinks`)?"""
    return getattr(sink, "never_blocks", False) is True


def inline_pump(pumps: Sequence[Pump], spec: JobSpec) -> bool:
    """Is the last of ``pumps`` (a pipe job's stdout, stderr merged or not) read by the
    supervising task itself (see the module)? When it is a pipe stream (it has ``fileno``)
    into a sink that never blocks, and the job is not swept (the sweep's escape watch lets go
    of the pipes that escapees hold, which only pump tasks can)."""
    return (
        bool(pumps)
        and not spec.sweep_job_id
        and never_blocks(pumps[-1].sink)
        and hasattr(pumps[-1].stream, "fileno")
    )


class _Reader:
    """One output pipe being read into its sink (by a pump task, or inline)."""

    def __init__(self, pump: Pump, grow: Callable[[trio.abc.ReceiveStream], int] | None) -> None:
        self.stream = pump.stream
        self.sink = pump.sink
        self.size = READ_CHUNK
        self.grow = grow
        self.broken_sink = False
        self.eof = False
        self.writing = False
        """Inside the sink's ``write`` (a sink that applies back-pressure holds the reader)."""

    async def drain(self, sup: Supervisor) -> None:
        """Read until EOF (or until the stream is closed under us).

        Cancellation: only before a read (:func:`read_some`) or inside the sink's write; a
        later call resumes."""
        stream = self.stream
        while True:
            try:
                chunk = await read_some(stream, self.size)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                chunk = b""
            if not chunk:
                self.eof = True
                return
            await self._take(sup, chunk)

    async def read_ready(self, sup: Supervisor) -> bool:
        """One read that does not wait (the race re-check); True at EOF.

        Cancellation: not a checkpoint for an inline reader (its sink never blocks)."""
        try:
            chunk = os.read(self.stream.fileno(), self.size)  # type: ignore[attr-defined]
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        if not chunk:
            self.eof = True
            return True
        await self._take(sup, chunk)
        return False

    async def _take(self, sup: Supervisor, chunk: bytes | bytearray) -> None:
        if len(chunk) == self.size and self.grow is not None:
            self.size, self.grow = self.grow(self.stream), None  # a full pipe: a fast writer
        sup.last_output = trio.current_time()
        if self.broken_sink:
            return
        self.writing = True
        try:
            await self.sink.write(chunk if isinstance(chunk, bytes) else bytes(chunk))
        except Exception:
            # A broken sink must not strand the child on a full pipe: keep draining.
            log.exception("output sink failed; discarding the rest of this stream")
            self.broken_sink = True
        finally:
            self.writing = False

    def unread(self) -> int:
        """The bytes waiting in the pipe (``FIONREAD``); 0 once it is closed."""
        try:
            out = fcntl.ioctl(self.stream.fileno(), termios.FIONREAD, b"\0\0\0\0")  # type: ignore[attr-defined]
        except (OSError, ValueError, AttributeError):
            return 0
        return int(struct.unpack("i", out)[0])


async def read_some(stream: trio.abc.ReceiveStream, size: int) -> bytes | bytearray:
    """``stream.receive_some(size)`` with one scheduler turn per read instead of two, for a
    pipe (a stream with ``fileno``): trio's ``receive_some`` yields before every read and
    again in the wait when the pipe is empty; here a read that had to wait returns without a
    further yield (the wait was one), and only a read that found data at once yields after it
    (so a fast writer cannot starve the loop).

    Cancellation: seen before the read, never after it, so no data is lost to one.
    """
    fileno = getattr(stream, "fileno", None)
    if fileno is None:
        return await stream.receive_some(size)
    waited = False
    while True:
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            fd = fileno()
            data = os.read(fd, size)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(fd)
            waited = True
            continue
        except OSError as exc:  # closed under us (EBADF) or a broken pipe
            raise trio.ClosedResourceError("the pipe was closed") from exc
        if not waited:
            await trio.lowlevel.cancel_shielded_checkpoint()
        return data


def _look(target: Target) -> str:
    """``"gone"`` (no live member), ``"settling"`` (every live member is exiting) or ``"live"``.

    ``settling()`` is false both when a member is not exiting and when the last one became a
    zombie after ``alive()`` looked; a second ``alive()`` tells the two apart (without it, a
    member that finished exiting between the two looks was SIGKILLed and reported).
    """
    if not target.alive():
        return "gone"
    if target.settling():
        return "settling"
    return "live" if target.alive() else "gone"


async def reap_stragglers(target: Target) -> tuple[bool, bool]:
    """``(found, emptied)``: SIGKILL live members left in ``target`` and wait ≤ 2 s for them.

    Members that have already begun to exit (``PF_EXITING``: the job completed because they
    closed their pipes on the way out) are not stragglers: they get the same 2 s to become
    zombies by themselves, and only one that fails to is reported. A member that has not begun
    to exit gets :data:`STRAGGLER_SETTLE` first (it may have closed its output in user space
    just before exiting). Each wait is a cancel
    scope (``move_on_after``) around a 20 ms liveness check: a process group has no event for
    "empty".

    Cancellation: cancellable at every check; supervisors call it shielded.
    """
    state = _look(target)
    for waiting, limit, poll in (
        ("live", STRAGGLER_SETTLE, STRAGGLER_SETTLE / 10),
        ("settling", STRAGGLER_WAIT, STRAGGLER_POLL),
    ):
        with trio.move_on_after(limit):
            while state == waiting:
                await trio.sleep(poll)
                state = _look(target)
    if state == "gone":
        return False, True
    target.signal(signal.SIGKILL)
    with trio.move_on_after(STRAGGLER_WAIT):
        while True:
            if not target.alive():
                return True, True
            await trio.sleep(STRAGGLER_POLL)
    return True, not target.alive()


__all__ = [
    "ESCAPED_EOF_WAIT",
    "RACE_YIELDS",
    "REASON_CANCELLED",
    "REASON_STRAGGLERS_REAPED",
    "REASON_STRAGGLERS_REMAINED",
    "REASON_SURVIVORS",
    "STRAGGLER_POLL",
    "STRAGGLER_SETTLE",
    "STRAGGLER_WAIT",
    "HelperScopes",
    "Pump",
    "Supervisor",
    "finish",
    "read_some",
    "reap_stragglers",
]
