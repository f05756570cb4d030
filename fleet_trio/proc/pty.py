"""PTY sessions: a job on a pseudo-terminal, supervised like ``run`` (worker-process.md §8).

:func:`start_pty` allocates a pseudo-terminal, sets its window (24×80 by default, §0.5) on the
slave **before** the child starts (a 0×0 window breaks vim/less/top, §8.2), and spawns the
command as the leader of a **new session** whose controlling terminal is the slave, on fds
0/1/2 (Go ``Setsid`` + ``Setctty``): ``sid == pgid == pid``.

How the controlling terminal is set: ``trio.lowlevel.open_process(..., stdin=stdout=stderr=slave,
start_new_session=True, preexec_fn=_acquire_controlling_tty)``. CPython's child calls
``setsid()`` before ``preexec_fn`` runs, so ``ioctl(0, TIOCSCTTY, 0)`` makes fd 0 (the slave)
the new session's controlling terminal (§14.4). The preexec function only makes that one
system call (``fcntl``/``termios`` are imported beforehand): it runs after ``fork()`` in a
process that may have other threads (Trio spawns from a worker thread, so the event loop never
blocks on the spawn). The spawn is shielded, as in ``run``: a caller cancelled meanwhile still
gets a session it must close (§2.3.4). The parent closes its copy of the slave at once, so the
master reads ``EIO`` once the last process holding the slave is gone. Same environment, cwd and
executable lookup as ``run`` (§2.3.2); ``stderr_sink``/``stdin_source`` are ignored (one
stream, §8.2).

The master is wrapped in :class:`trio.lowlevel.FdStream` (non-blocking). :meth:`PtySession.read`
maps ``EIO`` (Trio's ``BrokenResourceError`` caused by ``OSError(EIO)``) to EOF, ``b""``; any
read of ≥ 1 byte touches the idle clock, which starts when the session is created. Writes
(keystrokes) do not touch it, so a session nobody reads is abandoned and the idle watchdog
ends it (§7, §14.5 item 12).

Supervision (§2.5 with a **session target**, §2.8) is the one
:class:`~fleet_trio.proc.supervisor.Supervisor` that pipe jobs use, created with the session:
the max-runtime deadline counts from the spawn, the idle clock from session creation and
:meth:`PtySession.read` restarts it; the deadlines are cancel-scope deadlines. It runs inside
:meth:`PtySession.wait`, exactly once — concurrent and later callers get the same cached
``Result`` (§8.3). Completion is the leader's reap alone: there is no pipe to wait for (§8.4).
Then:

* clean exit → ``finish`` + straggler reap over the whole session: a shell that ``exit``\\ s
  while ``sleep 300 &`` runs yields ``killed=True``, ``reason="stragglers reaped after exit"``
  and the background job is SIGKILLed (§8.4, checklist 104);
* stop (the caller's :class:`StopToken`, :meth:`close`, or a watchdog trip) → the cancellation
  path: race re-check, SIGTERM every process group of the session, wait ``spec.grace``,
  SIGKILL them all (``killpg`` of the leader's group if none could be signalled), straggler
  reap; reason exactly ``cancelled`` (or the limit's
  ``idle: no output for …`` / ``max_runtime exceeded (…)``). An interactive shell ignores
  SIGTERM, so a cancelled session pays the full grace (§8.4).

How the session's groups are found: :class:`~fleet_trio.proc.target.SessionTarget` lists
``/proc`` and signals every distinct pgid among the processes whose session id equals the
leader's pid, zombies included (job control puts each background job in its own group inside
the session). A process that ``setsid``\\ s away (tmux, screen) leaves the session; only the
RC_JOB_ID sweep (``spec.sweep_job_id``) can catch it (§8.4 residual).

Cancellation, stops passed to :meth:`PtySession.wait` and :meth:`PtySession.close`: see
their docstrings. Use the session as an async context manager so it is always closed.

Start failures raise :class:`PtyStartError` carrying the ``Result`` to report
(``err="empty command"`` or ``"start pty: <detail>"``, §8.2); nothing is left running.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import struct
import subprocess
import termios

import trio

from fleet_trio.proc.containment import CgroupTarget, JobCgroup, shim_argv, shim_env
from fleet_trio.proc.run import (
    argument_error,
    open_job_cgroup,
    resolve_argv,
    spawn_error_text,
    start_check,
)
from fleet_trio.proc.spec import JobSpec, Result
from fleet_trio.proc.stop import StopToken
from fleet_trio.proc.supervisor import Supervisor
from fleet_trio.proc.target import SessionTarget, Target

log = logging.getLogger(__name__)

DEFAULT_ROWS = 24
DEFAULT_COLS = 80
READ_CHUNK = 65536
CLOSE_TIMEOUT = 1.0
"""Seconds allowed for closing the master in a shielded ``finally``."""


class PtyStartError(Exception):
    """The session could not be started; ``result`` is the ``Result`` to report (§8.2).

    ``result.err`` is ``"empty command"`` or ``"start pty: <detail>"``; nothing is running.
    """

    def __init__(self, result: Result) -> None:
        super().__init__(result.err)
        self.result = result


def _winsize(rows: int, cols: int) -> bytes:
    return struct.pack("HHHH", rows, cols, 0, 0)


def _acquire_controlling_tty() -> None:
    # Runs in the child after setsid(): make the slave (fd 0) the controlling terminal.
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


async def start_pty(
    spec: JobSpec,
    *,
    rows: int = DEFAULT_ROWS,
    cols: int = DEFAULT_COLS,
    spawn_limiter: trio.CapacityLimiter | None = None,
) -> PtySession:
    """Spawn ``spec.command`` on a new pseudo-terminal and return its session (§8.2).

    ``rows``/``cols`` set the window before the child starts; a non-positive dimension falls
    back to 24×80. ``spawn_limiter`` bounds concurrent spawns, as for ``run``. Raises
    :class:`PtyStartError` (``err="empty command"`` / ``"start pty: …"``) when nothing started.

    Cancellation: a cancellation while waiting for a ``spawn_limiter`` slot raises
    ``Cancelled`` with nothing spawned; the spawn itself is shielded, so a session that was
    spawned is always returned (the caller must close it, e.g. ``async with``).
    """
    if not spec.command:
        raise PtyStartError(Result(exit_code=-1, err="empty command"))
    if (bad := argument_error(spec)) is not None:
        raise PtyStartError(Result(exit_code=-1, err=f"start pty: {bad}"))
    argv, lookup_error = resolve_argv(spec.command, spec.env)
    if lookup_error is not None:
        raise PtyStartError(Result(exit_code=-1, err=f"start pty: {lookup_error}"))
    if rows <= 0 or cols <= 0:
        rows, cols = DEFAULT_ROWS, DEFAULT_COLS
    env = spec.environment()
    if (bad_exec := start_check(spec, argv)) is not None:
        raise PtyStartError(Result(exit_code=-1, err=f"start pty: {bad_exec}"))
    created = trio.current_time()  # the idle clock starts at session creation (§8.2)
    if spawn_limiter is not None:
        await spawn_limiter.acquire()
    try:
        with trio.CancelScope(shield=True):
            opened = open_job_cgroup(spec)
            if isinstance(opened, str):
                raise PtyStartError(Result(exit_code=-1, err=f"start pty: {opened}"))
            cgroup = opened
            try:
                shimmed = argv if cgroup is None else shim_argv(cgroup, argv, env)
                spawn_env = env if cgroup is None else shim_env(env)
                proc, master = await _spawn(shimmed, spec.cwd, spawn_env, rows, cols, shown=argv[0])
            except BaseException:
                if cgroup is not None:
                    cgroup.close_report()
                    cgroup.remove()
                raise
    finally:
        if spawn_limiter is not None:
            spawn_limiter.release()
    return PtySession(
        spec, proc, master, created=created, spawned=trio.current_time(), cgroup=cgroup
    )


async def _spawn(
    argv: list[str], cwd: str, env: dict[str, str] | None, rows: int, cols: int, *, shown: str
) -> tuple[trio.Process, int]:
    try:
        master, slave = os.openpty()
    except OSError as exc:
        raise PtyStartError(Result(exit_code=-1, err=f"start pty: {exc}")) from exc
    try:
        try:
            fcntl.ioctl(slave, termios.TIOCSWINSZ, _winsize(rows, cols))
        except OSError as exc:
            raise PtyStartError(Result(exit_code=-1, err=f"start pty: window size: {exc}")) from exc
        proc = await trio.lowlevel.open_process(
            argv,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            preexec_fn=_acquire_controlling_tty,
            cwd=cwd or None,
            env=env,
            close_fds=True,
            restore_signals=True,
        )
    except OSError as exc:
        os.close(master)
        err = spawn_error_text(exc, shown, cwd)
        raise PtyStartError(Result(exit_code=-1, err=f"start pty: {err}")) from exc
    except subprocess.SubprocessError as exc:  # the preexec function failed in the child
        os.close(master)
        raise PtyStartError(Result(exit_code=-1, err=f"start pty: {exc}")) from exc
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)
    return proc, master


class PtySession(trio.abc.AsyncResource):
    """One process tree on a pseudo-terminal (§8.3). Built by :func:`start_pty`; an async
    context manager that closes it (:meth:`close`) on exit."""

    def __init__(
        self,
        spec: JobSpec,
        proc: trio.Process,
        master_fd: int,
        *,
        created: float,
        spawned: float,
        cgroup: JobCgroup | None = None,
    ) -> None:
        self.spec = spec
        self._proc = proc
        self._master_fd = master_fd
        self._master = trio.lowlevel.FdStream(master_fd)
        target: Target = SessionTarget(proc.pid)
        if cgroup is not None:
            target = CgroupTarget(target, cgroup, proc.pid, session=True)
        self._sup = Supervisor(
            spec,
            proc,
            target,
            started=spawned,
            idle_from=created,
            cgroup=cgroup,
            start_label="start pty",
        )
        self._supervising = False
        self._closed = False

    @property
    def pid(self) -> int:
        """The leader's pid (also the session id and its process group id)."""
        return self._proc.pid

    @property
    def result(self) -> Result | None:
        """The cached ``Result`` once :meth:`wait` has concluded, else ``None``."""
        return self._sup.result

    # -- terminal I/O -----------------------------------------------------------------------
    async def read(self, max_bytes: int = READ_CHUNK) -> bytes:
        """Bytes from the terminal; ``b""`` at EOF (``EIO``: no slave left) or after close.

        Cancellation: a plain checkpoint; cancelling a read loses no bytes and does not stop
        the session (close it, or stop it through :meth:`wait`).
        """
        if self._closed:
            await trio.lowlevel.checkpoint()
            return b""
        try:
            data = await self._master.receive_some(max_bytes)
        except trio.ClosedResourceError:
            return b""
        except trio.BrokenResourceError as exc:
            cause = exc.__cause__
            if isinstance(cause, OSError) and cause.errno == errno.EIO:
                return b""
            raise
        if data:
            self._sup.touch()
        return data

    async def write(self, data: bytes) -> None:
        """Keystrokes to the process. Does not touch the idle clock.

        Writing to a session that has ended or been closed is not an error: the bytes are
        dropped (a relay keeps forwarding what a client types until it notices).

        Cancellation: a checkpoint; a cancelled write may have sent part of ``data``.
        """
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        try:
            await self._master.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            log.debug("pty %d: input dropped, the terminal is gone", self.pid)

    def resize(self, rows: int, cols: int) -> None:
        """Set the window (``TIOCSWINSZ`` on the master); the process sees it (``stty size``).

        A size with a zero (or negative) dimension is ignored with a warning: a client with
        no real terminal reports 0×0 (§8.5). A closed session ignores resizes. An ioctl
        failure raises ``OSError``.
        """
        if rows <= 0 or cols <= 0:
            log.warning("pty %d: ignoring resize to %dx%d", self.pid, rows, cols)
            return
        if self._closed:
            return
        fcntl.ioctl(self._master_fd, termios.TIOCSWINSZ, _winsize(rows, cols))

    # -- supervision ------------------------------------------------------------------------
    async def wait(self, stop: StopToken | None = None) -> Result:
        """Supervise the session until it ends and return how (§2.5, §8.3, §8.4).

        Runs once; concurrent and later callers get the same ``Result``. ``stop`` (set, or
        its deadline passed) takes the cancellation path, whichever caller passed it.

        Cancellation: cancelling the supervising caller (the first) tears the session down
        exactly like a stop (shielded, bounded by the grace plus a few seconds), caches the
        ``Result`` for the other callers and re-raises ``Cancelled``; cancelling a follower
        ends only its own wait.
        """
        sup = self._sup
        if sup.result is not None:
            await trio.lowlevel.checkpoint()
            return sup.result
        if self._supervising:
            return await self._follow(stop)
        self._supervising = True
        _link = sup.link(stop)  # kept referenced while this call waits
        return await sup.supervise()

    async def _follow(self, stop: StopToken | None) -> Result:
        """Another caller supervises: wait for its ``Result``, forwarding our ``stop``.

        A trio cancellation of a follower only ends this call; the supervising caller goes on.
        """
        _link = self._sup.link(stop)  # kept referenced while this call waits
        await self._sup.done.wait()
        if self._sup.result is None:
            raise RuntimeError("the PTY session's supervision failed")
        return self._sup.result

    # -- teardown ---------------------------------------------------------------------------
    async def close(self) -> None:
        """Stop the session, reap everything in it (even without a prior :meth:`wait`: closing
        the master alone would only SIGHUP the foreground group and leave a zombie, checklist
        105), then close the master (§8.3). Idempotent.

        Cancellation: the teardown runs even if the caller is cancelled (see :meth:`wait`);
        closing the master is shielded and bounded by ``CLOSE_TIMEOUT``.
        """
        self._sup.request_stop()
        try:
            await self.wait()
        finally:
            if not self._closed:
                self._closed = True
                with trio.move_on_after(CLOSE_TIMEOUT, shield=True):
                    await self._master.aclose()

    aclose = close  # trio.abc.AsyncResource: ``async with`` a session closes it


__all__ = ["DEFAULT_COLS", "DEFAULT_ROWS", "PtySession", "PtyStartError", "start_pty"]
