"""``run(spec, sink, stop) -> Result``: one supervised process group (worker-process.md §2).

The child leads a new process group in the worker's session. It "finished" only when the
leader has been reaped **and** every output pipe is at EOF (Go's ``cmd.Wait``). A stop request
(the caller's :class:`StopToken`, or the watchdog) takes the cancellation path: SIGTERM the
group, wait the grace, SIGKILL, reap stragglers. Every path ends in a ``Result``; nothing is
ever left running on purpose.

Trio cancellation of the calling task (program shutdown) is turned into the same cancellation
path, run inside a shielded scope, and ``Cancelled`` is re-raised once the group is gone.

Deliberate deviation (§15 Q1, option b): on the cancellation path, after SIGKILL the wait for
pipe EOF is bounded by :data:`STRAGGLER_WAIT`; a ``setsid``'d process that still holds our
stdout then no longer keeps ``run`` (and the device) forever: the read ends are closed, the
straggler reap and the RC_JOB_ID sweep still run. The natural-exit path keeps waiting for EOF
while anything in the job's own process group is alive.

Second deliberate deviation, for swept jobs only (``sweep_job_id`` set): when the leader has
exited and the group is empty but the pipes are still open, only escapees hold them; after
:data:`ESCAPED_EOF_WAIT` the run lets the pipes go and completes, so the sweep can kill the
escapees (rc would wait for them to exit on their own, and never sweep).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import stat
import subprocess
from collections.abc import AsyncIterator, Callable

import attrs
import trio

from fleet_trio.durations import signal_text
from fleet_trio.errors import errno_text
from fleet_trio.proc.sinks import Sink
from fleet_trio.proc.spec import JobSpec, Result
from fleet_trio.proc.stop import StopToken
from fleet_trio.proc.sweep import sweep_job_survivors
from fleet_trio.proc.target import GroupTarget, Target
from fleet_trio.proc.watchdog import WATCHDOG_TICK, Watchdog

log = logging.getLogger(__name__)

STRAGGLER_WAIT = 2.0
"""Seconds to wait for stragglers to go after SIGKILL (and, on cancel, for pipe EOF)."""
STRAGGLER_POLL = 0.02
"""Seconds between two straggler checks."""
ESCAPED_EOF_WAIT = 2.0
"""Seconds a swept job's pipes may stay open once only processes outside its group hold them."""
ESCAPE_POLL_MAX = 1.0
"""Longest pause between two checks of the group while the leader is gone but pipes are open."""
RACE_YIELDS = 200
"""Scheduler yields allowed for a completion to be observed before signalling."""
READ_CHUNK = 65536
"""The most one pump read takes (the default pipe capacity)."""
PIPE_SIZE = 1 << 20
"""The capacity a pump asks for (Linux ``F_SETPIPE_SZ``) once a read finds its pipe full: a
job writing faster than its output is consumed then fills a larger buffer, and each read
carries up to this much, so far fewer wake-ups per byte. Only fast writers get it, because
an unprivileged user's pipe buffers count against ``/proc/sys/fs/pipe-user-pages-soft``.
Best effort: a refusal (that limit, ``pipe-max-size``, another OS) keeps the default."""

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


def look_path(name: str, path: str | None = None) -> str | None:
    """Go's ``exec.LookPath``: the first regular-ish, executable ``name`` on ``path``."""
    for directory in (path if path is not None else os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        try:
            st = os.stat(candidate)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) and st.st_mode & 0o111:
            return candidate
    return None


def resolve_argv(
    command: tuple[str, ...], env: dict[str, str] | None = None
) -> tuple[list[str], str | None]:
    """Resolve a bare command name against the *worker's* PATH (as Go does).

    Popen resolves a bare name against the PATH of the environment it is given. When the job's
    own ``env`` does not set PATH, that is the worker's PATH, and the lookup is left to the
    spawn (one less walk over PATH per job); a job that sets its own PATH is resolved here.
    """
    argv = list(command)
    name = argv[0]
    if "/" in name or not (env and "PATH" in env):
        return argv, None
    found = look_path(name, os.environ.get("PATH", os.defpath))
    if found is None:
        return argv, f'exec: "{name}": executable file not found in $PATH'
    argv[0] = found
    return argv, None


def spawn_error_text(exc: OSError, argv0: str, cwd: str) -> str:
    text = errno_text(exc.errno) if exc.errno is not None else str(exc)
    if cwd and exc.filename == cwd:
        # CPython reports a failed chdir in the child with the cwd as the filename.
        return f"chdir {cwd}: {text}"
    if "/" not in argv0 and isinstance(exc, FileNotFoundError):
        return f'exec: "{argv0}": executable file not found in $PATH'
    return f"fork/exec {argv0}: {text}"


async def run(
    spec: JobSpec,
    sink: Sink,
    stop: StopToken | None = None,
    *,
    on_spawn: Callable[[int], None] | None = None,
    spawn_limiter: trio.CapacityLimiter | None = None,
) -> Result:
    """Run ``spec`` as its own process group and return how it ended (§2.5).

    ``on_spawn(pid)`` is called once, right after a successful spawn, with the child's pid
    (which is also its process group id): the hook for per-job samplers.

    ``spawn_limiter`` bounds how many spawns (fork + exec, done in a worker thread) are in
    flight at once across the callers that share it; a burst of jobs then starts at the rate
    the machine forks instead of all at once, and the event loop stays free for its other
    work (the node's acks). Only the spawn is limited, not the run. A trio cancellation that
    arrives while the run waits for a slot raises ``Cancelled`` without spawning; a stop token
    set meanwhile still spawns and stops the child (E8), as without a limiter.
    """
    if not spec.command:
        return Result(exit_code=-1, err="empty command")
    argv, lookup_error = resolve_argv(spec.command, spec.env)
    if lookup_error is not None:
        return Result(exit_code=-1, err=f"start: {lookup_error}")
    env: dict[str, str] | None = None
    if spec.env:
        env = dict(os.environ)
        env.update(spec.env)
    split = spec.stderr_sink is not None
    sup = _Supervisor(spec, sink, stop if stop is not None else StopToken())
    # Waiting for a spawn slot is not shielded: a run cancelled while queued never spawns
    # (a node shutting down does not start the jobs it has already marked interrupted).
    async with _maybe(spawn_limiter):
        with trio.CancelScope(shield=True):
            # Shielded: a pre-cancelled caller still spawns, then takes the cancellation path,
            # so a stop before the spawn is a "cancelled" Result, never an error (§2.3.4, E8).
            try:
                proc = await trio.lowlevel.open_process(
                    argv,
                    stdin=subprocess.PIPE if spec.stdin_source is not None else subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE if split else subprocess.STDOUT,
                    process_group=0,
                    cwd=spec.cwd or None,
                    env=env,
                    close_fds=True,
                    restore_signals=True,
                )
            except OSError as exc:
                err = spawn_error_text(exc, argv[0], spec.cwd)
                return Result(exit_code=-1, err=f"start: {err}")
    if on_spawn is not None:
        on_spawn(proc.pid)
    return await sup.supervise(proc)


def grow_pipe(stream: trio.abc.ReceiveStream) -> int:
    """Ask for a :data:`PIPE_SIZE` buffer on the pipe behind ``stream``; the read size to use
    from now on (:data:`READ_CHUNK` when refused or not a pipe)."""
    setpipe = getattr(fcntl, "F_SETPIPE_SZ", None)
    fileno = getattr(stream, "fileno", None)
    if setpipe is None or fileno is None:
        return READ_CHUNK
    try:
        return max(READ_CHUNK, fcntl.fcntl(fileno(), setpipe, PIPE_SIZE))
    except OSError:
        return READ_CHUNK


class HelperScopes:
    """The cancel scopes of a supervisor's helper tasks (waiter, pumps, watchdog, stdin relay).

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


@contextlib.asynccontextmanager
async def _maybe(limiter: trio.CapacityLimiter | None) -> AsyncIterator[None]:
    if limiter is None:
        yield
    else:
        async with limiter:
            yield


class _Supervisor:
    """The per-run state shared by the waiter, the pumps, the watchdog and the main path.

    Helper tasks each run in their own shielded scope, so a trio cancellation of the caller
    reaches only the main path, which turns it into an internal stop, tears the group down
    (shielded) and re-raises. The helpers are cancelled by the main path when it is done.
    """

    def __init__(self, spec: JobSpec, sink: Sink, stop: StopToken) -> None:
        self.spec = spec
        self.sink = sink
        self.last_output = trio.current_time()  # the idle clock starts just before the spawn
        self.leader_done = trio.Event()
        self.completed = trio.Event()
        self.wake = trio.Event()
        # Set by the caller's token (as its child), by the watchdog, or by trio cancellation.
        self.internal = StopToken(parent=stop, on_set=self.wake.set)
        self.open_pipes = 0
        self.trip_reason: str | None = None
        self.helpers = HelperScopes()
        self.pump_scopes: list[trio.CancelScope] = []

    def _maybe_complete(self) -> None:
        if self.leader_done.is_set() and self.open_pipes == 0 and not self.completed.is_set():
            self.completed.set()
            self.wake.set()

    # -- helper tasks ---------------------------------------------------------------------
    async def _waiter(self, proc: trio.Process) -> None:
        with self.helpers.scope():
            await proc.wait()
            self.leader_done.set()
            self._maybe_complete()

    async def _pump(self, stream: trio.abc.ReceiveStream, sink: Sink) -> None:
        broken_sink = False
        size, grown = READ_CHUNK, False
        with self.helpers.scope() as scope:
            self.pump_scopes.append(scope)
            while True:
                try:
                    chunk = await stream.receive_some(size)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    chunk = b""
                if not chunk:
                    break
                if len(chunk) == size and not grown:  # the pipe was full: a fast writer
                    size, grown = grow_pipe(stream), True
                self.last_output = trio.current_time()
                if broken_sink:
                    continue
                try:
                    await sink.write(chunk if isinstance(chunk, bytes) else bytes(chunk))
                except Exception:
                    # A broken sink must not strand the child on a full pipe: keep draining.
                    log.exception("output sink failed; discarding the rest of this stream")
                    broken_sink = True
            self.open_pipes -= 1
            self._maybe_complete()

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

    async def _escape_watch(self, target: Target) -> None:
        """Swept jobs only: end the wait for EOF when only escapees hold the pipes.

        Once the leader is reaped and the group holds no live process, whatever still holds
        the job's stdout/stderr left the group (``setsid``, a daemon). Waiting for it, as rc
        does, would keep the job running until the escapee exits and the sweep, which exists
        to kill it, would never run. After ``ESCAPED_EOF_WAIT`` the pipes are let go and the
        run completes; the sweep then finds the escapee by its ``RC_JOB_ID``.
        """
        with self.helpers.scope():
            await self.leader_done.wait()
            pause = 0.02
            while not self.completed.is_set():
                if not target.alive():
                    with trio.move_on_after(ESCAPED_EOF_WAIT):
                        await self.completed.wait()
                    if not self.completed.is_set() and not target.alive():
                        for scope in self.pump_scopes:
                            scope.cancel()
                        self.completed.set()
                        self.wake.set()
                        return
                await trio.sleep(pause)
                pause = min(pause * 2, ESCAPE_POLL_MAX)

    async def _watchdog(self, dog: Watchdog) -> None:
        with self.helpers.scope():
            while not self.internal.was_set:
                await trio.sleep(WATCHDOG_TICK)
                reason = dog.check(trio.current_time(), self.last_output)
                if reason is not None:
                    self.trip_reason = reason
                    self.internal.set()
                    return

    # -- supervision ----------------------------------------------------------------------
    async def supervise(self, proc: trio.Process) -> Result:
        target = GroupTarget(proc.pid)
        dog = Watchdog(trio.current_time(), self.spec.max_runtime, self.spec.idle_timeout)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._waiter, proc)
            assert proc.stdout is not None
            self.open_pipes = 1
            if self.spec.stderr_sink is not None:
                assert proc.stderr is not None
                self.open_pipes = 2
                nursery.start_soon(self._pump, proc.stderr, self.spec.stderr_sink)
            nursery.start_soon(self._pump, proc.stdout, self.sink)
            if self.spec.stdin_source is not None and proc.stdin is not None:
                nursery.start_soon(self._relay, self.spec.stdin_source, proc.stdin)
            if dog.armed:
                nursery.start_soon(self._watchdog, dog)
            if self.spec.sweep_job_id:
                nursery.start_soon(self._escape_watch, target)
            try:
                with trio.move_on_at(self.internal.deadline):
                    await self.wake.wait()
            except trio.Cancelled:
                # Program shutdown: the same teardown as a stop, shielded, then go on.
                self.internal.set()
                with trio.CancelScope(shield=True):
                    await self._conclude(proc, target)
                raise
            with trio.CancelScope(shield=True):
                result = await self._conclude(proc, target)
        return result

    async def _conclude(self, proc: trio.Process, target: Target) -> Result:
        if self.completed.is_set() or await self._completed_after_yields():
            result = await self._finish_clean(proc, target)
        else:
            result = await self._finish_cancelled(proc, target)
        self.helpers.stop()  # stdin relay, watchdog, pumps stuck behind an escaped holder
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                await stream.aclose()
        if self.spec.sweep_job_id:
            report = await sweep_job_survivors(
                self.spec.sweep_job_id, os.getpid(), marker=self.spec.sweep_marker
            )
            result = attrs.evolve(result, sweep=report)
        return result

    async def _completed_after_yields(self) -> bool:
        """The cancel-race re-check: never block, allow the waiter to observe an exit."""
        for _ in range(RACE_YIELDS):
            if self.completed.is_set():
                return True
            await trio.lowlevel.checkpoint()
        return self.completed.is_set()

    async def _finish_clean(self, proc: trio.Process, target: Target) -> Result:
        result = finish(proc.returncode)
        found, emptied = await reap_stragglers(target)
        if found:
            reason = REASON_STRAGGLERS_REAPED if emptied else REASON_STRAGGLERS_REMAINED
            result = attrs.evolve(result, killed=True, reason=reason)
        return result

    async def _finish_cancelled(self, proc: trio.Process, target: Target) -> Result:
        delivered = target.signal(signal.SIGTERM)  # unconditionally, no liveness probe first
        with trio.move_on_after(self.spec.grace):
            await self.completed.wait()
        if not self.completed.is_set():
            target.signal(signal.SIGKILL)
            with trio.move_on_after(STRAGGLER_WAIT):
                await self.completed.wait()
            if not self.completed.is_set():
                # §15 Q1 (b): something outside the group holds our pipes; stop reading.
                for scope in self.pump_scopes:
                    scope.cancel()
                with trio.move_on_after(STRAGGLER_WAIT):
                    await self.leader_done.wait()
        result = finish(proc.returncode)
        found, emptied = await reap_stragglers(target)
        reason = REASON_SURVIVORS if found and not emptied else REASON_CANCELLED
        if delivered or found:
            result = attrs.evolve(result, killed=True, reason=reason)
        if self.trip_reason is not None:
            result = attrs.evolve(result, killed=True, reason=self.trip_reason)
        return result


async def reap_stragglers(target: Target) -> tuple[bool, bool]:
    """``(found, emptied)``: SIGKILL live members left in ``target`` and wait ≤ 2 s for them.

    Members that have already begun to exit (``PF_EXITING``: the job completed because they
    closed their pipes on the way out) are not stragglers: they get the same 2 s to become
    zombies by themselves, and only one that fails to is reported.
    """
    if not target.alive():
        return False, True
    deadline = trio.current_time() + STRAGGLER_WAIT
    if target.settling():
        while trio.current_time() < deadline:
            await trio.sleep(STRAGGLER_POLL)
            if not target.alive():
                return False, True
            if not target.settling():
                break
        deadline = trio.current_time() + STRAGGLER_WAIT
    target.signal(signal.SIGKILL)
    while True:
        if not target.alive():
            return True, True
        if trio.current_time() >= deadline:
            return True, False
        await trio.sleep(STRAGGLER_POLL)


__all__ = [
    "ESCAPED_EOF_WAIT",
    "REASON_CANCELLED",
    "REASON_STRAGGLERS_REAPED",
    "REASON_STRAGGLERS_REMAINED",
    "REASON_SURVIVORS",
    "STRAGGLER_POLL",
    "STRAGGLER_WAIT",
    "HelperScopes",
    "finish",
    "look_path",
    "reap_stragglers",
    "resolve_argv",
    "run",
]
