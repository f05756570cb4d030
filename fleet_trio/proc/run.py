"""``run(spec, sink, stop) -> Result``: one supervised process group (worker-process.md §2).

The child leads a new process group in the worker's session. It "finished" only when the
leader has been reaped **and** every output pipe is at EOF (Go's ``cmd.Wait``). Supervision is
the one :class:`~fleet_trio.proc.supervisor.Supervisor` that PTY sessions use too: a stop
request (the caller's :class:`StopToken`, or a limit reached: ``max_runtime``, idle) takes the
cancellation path: SIGTERM the group, wait the grace, SIGKILL, reap stragglers. Every path ends
in a ``Result``; nothing is ever left running on purpose. The limits are cancel-scope
deadlines, not polled. Trio cancellation takes the same path (see :func:`run`).

Deliberate deviation (§15 Q1, option b): on the cancellation path, after SIGKILL the wait for
pipe EOF is bounded by ``STRAGGLER_WAIT``; a ``setsid``'d process that still holds our
stdout then no longer keeps ``run`` (and the device) forever: the read ends are closed, the
straggler reap and the RC_JOB_ID sweep still run. The natural-exit path keeps waiting for EOF
while anything in the job's own process group is alive.

Second deliberate deviation, for swept jobs only (``sweep_job_id`` set): when the leader has
exited and the group is empty but the pipes are still open, only escapees hold them; after
``ESCAPED_EOF_WAIT`` the run lets the pipes go and completes, so the sweep can kill the
escapees (rc would wait for them to exit on their own, and never sweep). Both waits are
:mod:`~fleet_trio.proc.supervisor`'s.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import subprocess
from collections.abc import Callable

import trio

from fleet_trio.errors import errno_text
from fleet_trio.proc.containment import (
    CgroupContainment,
    CgroupTarget,
    JobCgroup,
    exec_check,
    shim_argv,
    shim_env,
)
from fleet_trio.proc.procfs import forks_since_boot
from fleet_trio.proc.sinks import Sink
from fleet_trio.proc.spec import JobSpec, Result
from fleet_trio.proc.stop import StopToken
from fleet_trio.proc.supervisor import READ_CHUNK, Pump, Supervisor
from fleet_trio.proc.target import GroupTarget, Target

log = logging.getLogger(__name__)

PIPE_SIZE = 1 << 20
"""The capacity a pump asks for (Linux ``F_SETPIPE_SZ``) once a read finds its pipe full: a
job writing faster than its output is consumed then fills a larger buffer, and each read
carries up to this much, so far fewer wake-ups per byte. Only fast writers get it, because
an unprivileged user's pipe buffers count against ``/proc/sys/fs/pipe-user-pages-soft``.
Best effort: a refusal (that limit, ``pipe-max-size``, another OS) keeps the default."""


def look_path(name: str, path: str | None = None) -> str | None:
    """Go's ``exec.LookPath``: the first regular-ish, executable ``name`` on ``path``."""
    for directory in (path if path is not None else os.defpath).split(os.pathsep):
        directory = directory or "."
        candidate = directory + name if directory.endswith("/") else f"{directory}/{name}"
        # Most PATH entries miss: access() tells so without an exception object per miss.
        if not os.access(candidate, os.F_OK):
            continue
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

    Popen resolves a bare name against the PATH of the environment it is given, so the lookup
    is always done here, in the parent: a ``stat`` per PATH entry is cheaper than Popen's walk,
    which tries an ``execve`` per entry in the child while the spawning thread waits on it
    (measured by ``scripts/bench/spawn.py``).
    """
    argv = list(command)
    name = argv[0]
    if "/" in name:
        return argv, None
    found = look_path(name, os.environ.get("PATH", os.defpath))
    if found is None:
        return argv, f'exec: "{name}": executable file not found in $PATH'
    if not found.startswith("/"):  # Go's ErrDot: an empty or relative PATH entry found it
        return argv, f'exec: "{name}": cannot run executable found relative to current directory'
    argv[0] = found
    return argv, None


def argument_error(spec: JobSpec) -> str | None:
    """Go's start error for text the kernel cannot take in the command, the environment or the
    working directory (``fork/exec NAME: invalid argument``), ``None`` when there is none: a
    NUL byte, text no file-system encoding takes (a lone surrogate outside
    ``surrogateescape``'s range; a Go string cannot hold one), or an environment name with
    ``=`` in it (Go would pass ``A=B=x`` on, which the child reads as ``A``; Python refuses
    the name). Checked before any lookup or spawn: Python raises ``ValueError`` there
    instead of an ``OSError``."""
    env = spec.env or {}
    texts = [*spec.command, *env.keys(), *env.values(), spec.cwd or ""]
    if any("\0" in text or not _encodable(text) for text in texts) or any("=" in k for k in env):
        name = spec.command[0]
        # never a raw NUL or an unencodable character in a log or a report
        shown = repr(name) if "\0" in name else name if _encodable(name) else ascii(name)
        return f"fork/exec {shown}: {errno_text(errno.EINVAL)}"
    return None


def _encodable(text: str) -> bool:
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        return False
    return True


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
    record: Callable[[Result], None] | None = None,
) -> Result:
    """Run ``spec`` as its own process group and return how it ended (§2.5).

    ``on_spawn(pid)`` is called once, right after a successful spawn, with the child's pid
    (which is also its process group id): the hook for per-job samplers.

    ``spawn_limiter`` bounds how many spawns (fork + exec, done in a worker thread) are in
    flight at once across the callers that share it; a burst of jobs then starts at the rate
    the machine forks instead of all at once, and the event loop stays free for its other
    work (the node's acks). Only the spawn is limited, not the run; a stop token set while
    the run waits for a slot still spawns and stops the child (E8), as without a limiter.

    ``record(result)`` is called once with the ``Result`` on every path that has one (start
    errors included), so a caller that bounds ``run`` with a cancel scope (a pass budget:
    ``with trio.move_on_at(deadline)``) still learns how the child ended.

    Cancellation: a cancellation before the spawn (while waiting for a ``spawn_limiter``
    slot) raises ``Cancelled`` with nothing spawned (no ``Result``); the spawn itself is
    shielded; after it, a cancellation tears the group down exactly like a stop (SIGTERM,
    grace, SIGKILL, straggler reap, sweep; shielded, so bounded by the grace plus a few
    seconds, not by the canceller), hands the ``Result`` to ``record`` and re-raises
    ``Cancelled``.
    """
    if not spec.command:
        return _recorded(Result(exit_code=-1, err="empty command"), record)
    if (bad := argument_error(spec)) is not None:
        return _recorded(Result(exit_code=-1, err=f"start: {bad}"), record)
    argv, lookup_error = resolve_argv(spec.command, spec.env)
    if lookup_error is not None:
        return _recorded(Result(exit_code=-1, err=f"start: {lookup_error}"), record)
    env = spec.environment()
    if (bad_exec := start_check(spec, argv)) is not None:
        return _recorded(Result(exit_code=-1, err=f"start: {bad_exec}"), record)
    idle_from = trio.current_time()  # the idle clock starts just before the spawn
    # Not shielded: a node shutting down does not start the jobs it has marked interrupted.
    if spawn_limiter is None:
        spawned = await _spawn(spec, argv, env)
    else:
        async with spawn_limiter:
            spawned = await _spawn(spec, argv, env)
    if isinstance(spawned, str):
        return _recorded(Result(exit_code=-1, err=f"start: {spawned}"), record)
    proc, forks_before, cgroup = spawned
    if on_spawn is not None:
        on_spawn(proc.pid)
    target: Target = GroupTarget(proc.pid)
    if cgroup is not None:
        target = CgroupTarget(target, cgroup, proc.pid)
    sup = Supervisor(
        spec,
        proc,
        target,
        cgroup=cgroup,
        stop=stop,
        started=trio.current_time(),
        idle_from=idle_from,
        grow=grow_pipe,
        forks_before=forks_before,
        stoppable=False,  # nobody else holds this supervisor: only ``stop`` stops it
    )
    assert proc.stdout is not None
    pumps = [Pump(proc.stdout, sink)]
    if spec.stderr_sink is not None:
        assert proc.stderr is not None
        pumps.insert(0, Pump(proc.stderr, spec.stderr_sink))
    stdin = None
    if spec.stdin_source is not None and proc.stdin is not None:
        stdin = (spec.stdin_source, proc.stdin)
    return await sup.supervise(pumps, stdin, record=record)


def cgroup_backend(spec: JobSpec) -> CgroupContainment | None:
    """The cgroup backend of ``spec``, if it has that one."""
    return spec.containment if isinstance(spec.containment, CgroupContainment) else None


def start_check(spec: JobSpec, argv: list[str]) -> str | None:
    """Under the cgroup backend the command is exec'd by the shim, not by the spawn: what
    ``execve`` would refuse is found here, so it is still a start error (with the same text).
    A bad working directory is left to the spawn, which reports it first, as Go does."""
    if cgroup_backend(spec) is None or (spec.cwd and not os.path.isdir(spec.cwd)):
        return None
    path = argv[0] if argv[0].startswith("/") else os.path.join(spec.cwd or ".", argv[0])
    exc = exec_check(path)
    return None if exc is None else spawn_error_text(exc, argv[0], spec.cwd)


def open_job_cgroup(spec: JobSpec) -> JobCgroup | str | None:
    """The job's new cgroup (``None`` under the marker backend), or the start error's text."""
    backend = cgroup_backend(spec)
    if backend is None:
        return None
    try:
        cgroup = backend.create(spec.cgroup_key or spec.sweep_job_id or "run")
    except OSError as exc:
        return f"cgroup {backend.jobs_dir}: {errno_text(exc.errno) if exc.errno else exc}"
    if spec.limits is not None and not spec.limits.empty:
        try:
            spec.limits.write(cgroup.path)  # before the shim enters it
        except OSError as exc:
            cgroup.remove()
            text = errno_text(exc.errno) if exc.errno else str(exc)
            return f"cgroup {exc.filename or cgroup.path}: cannot set limit: {text}"
    return cgroup


async def _spawn(
    spec: JobSpec, argv: list[str], env: dict[str, str] | None
) -> tuple[trio.Process, int | None, JobCgroup | None] | str:
    """Spawn the child; ``(process, host fork counter before, job cgroup)`` or the start
    error's text. Under the cgroup backend the child enters its cgroup before it execs
    (:func:`~fleet_trio.proc.containment.shim_argv`).

    Cancellation: shielded (a pre-cancelled caller still spawns, then takes the cancellation
    path, so a stop before the spawn is a "cancelled" Result, never an error: §2.3.4, E8)."""
    with trio.CancelScope(shield=True):
        opened = open_job_cgroup(spec)
        if isinstance(opened, str):
            return opened
        cgroup = opened
        # The sweep's shortcut: the host's fork counter just before the spawn (a /proc/stat
        # read, no blocking I/O).
        forks_before = forks_since_boot() if spec.sweep_job_id and cgroup is None else None
        try:
            proc = await trio.lowlevel.open_process(
                argv if cgroup is None else shim_argv(cgroup, argv, env),
                stdin=subprocess.PIPE if spec.stdin_source is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE if spec.stderr_sink is not None else subprocess.STDOUT,
                process_group=0,
                cwd=spec.cwd or None,
                env=env if cgroup is None else shim_env(env),
                close_fds=True,
                restore_signals=True,
            )
        except OSError as exc:
            if cgroup is not None:
                cgroup.close_report()
                cgroup.remove()
            return spawn_error_text(exc, argv[0], spec.cwd)
    return proc, forks_before, cgroup


def _recorded(result: Result, record: Callable[[Result], None] | None) -> Result:
    if record is not None:
        record(result)
    return result


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


__all__ = [
    "look_path",
    "resolve_argv",
    "run",
]
