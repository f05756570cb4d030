"""Containment: how a job's processes are told apart from everything else (docs/containment.md).

(Over 500 lines: the backends, where the cgroups come from, the spawn shim, the stop target,
the sweep and the recovery share the one cgroup model and are read together.)

Two backends behind one interface, chosen once per process (:func:`choose_for_agent` for node
and worker, :func:`choose_for_exec` for ``fleet-trio exec``):

* ``marker`` (:class:`MarkerContainment`): today's sweep. A job's escaped processes are found
  by the marker in their environment (``RC_JOB_ID``, ``FLEET_JOB_ID``, ``FLEET_TRIO_SWEEP``).
  A process that strips its marker is not found: ``clean`` means "no *marked* process remains".
* ``cgroup`` (:class:`CgroupContainment`): every supervised process runs in its own cgroup v2
  (``<jobs dir>/<job>``); the kernel tracks every descendant whatever it does to its session,
  group, environment or ``argv[0]``. A stop is SIGTERM to every process of the cgroup, the
  grace, then ``cgroup.kill`` (kernels before 5.14: SIGKILL to each pid until it is empty);
  the job is over when ``cgroup.events`` says ``populated 0`` (watched with ``epoll``, not
  polled), then the cgroup is removed.

**In the cgroup before exec.** The child is spawned through a tiny ``/bin/sh`` shim that writes
``0`` (itself) to the job cgroup's ``cgroup.procs`` and then ``exec``\\ s the command (the
shell's ``echo`` is a builtin: no fork happens outside the cgroup). Python's ``preexec_fn``
(unsafe with threads, and it turns vfork into fork) and ``clone3(CLONE_INTO_CGROUP)`` through
ctypes (unsafe: no at-fork handlers) were not used. The shim keeps the job's environment as
given: ``PWD`` and ``IFS`` (which a shell sets) are put back as they were, and an environment
holding names a shell drops (not identifiers) is passed through ``env -i`` instead (one exec
more). The executable is checked before the spawn, so a missing or non-executable command
is still a start error, as without the shim. ``scripts/bench/spawn.py`` measures the cost.

Everything here that touches the cgroup file system is a plain system call on a pseudo file
system (no disk), made inline like the supervisor's ``/proc`` reads.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import select
import shlex
import signal
import stat
from collections.abc import Mapping
from typing import Literal, Protocol

import attrs
import trio

from fleet_trio.errors import errno_text

log = logging.getLogger(__name__)

Mode = Literal["auto", "cgroup", "marker"]
MODES: tuple[str, ...] = ("auto", "cgroup", "marker")

SH = "/bin/sh"
ENV = "/usr/bin/env"
AGENT_LEAF = "agent"
JOBS_DIR = "jobs"
EXIT_SHIM = 125
"""The exit status of a shim that could not enter the job's cgroup (the job never ran)."""

KILL_WAIT = 2.0
"""Seconds a killed cgroup gets to become empty before what is left is reported."""

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class ContainmentError(Exception):
    """The cgroup backend cannot be had; the message is one line naming what is missing."""


# -- where the cgroups are ------------------------------------------------------------------------


def cgroup2_mount(mountinfo: str) -> tuple[str, str] | None:
    """``(mount point, root inside the hierarchy)`` of the first cgroup v2 mount in a
    ``/proc/self/mountinfo`` text (unified: ``/sys/fs/cgroup``; hybrid: often
    ``/sys/fs/cgroup/unified``), or ``None``."""
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and tail and tail[0] == "cgroup2":
            return _unescape(fields[4]), _unescape(fields[3])
    return None


def _unescape(field: str) -> str:
    """mountinfo's octal escapes (``\\040`` for a space)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def own_cgroup(proc_cgroup: str) -> str | None:
    """Our cgroup v2 path (``0::/path`` in ``/proc/self/cgroup``), or ``None``."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def own_cgroup_dir() -> str:
    """The directory of our own cgroup v2; raises :class:`ContainmentError` (one line)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            mount = cgroup2_mount(f.read())
        with open("/proc/self/cgroup", encoding="utf-8", errors="surrogateescape") as f:
            path = own_cgroup(f.read())
    except OSError as exc:
        raise ContainmentError(f"cannot read /proc/self: {exc}") from None
    if mount is None:
        raise ContainmentError("no cgroup v2 hierarchy is mounted (see /proc/self/mountinfo)")
    if path is None:
        raise ContainmentError("this process is in no cgroup v2 (no 0:: line in /proc/self/cgroup)")
    point, root = mount
    if root != "/" and (path == root or path.startswith(root.rstrip("/") + "/")):
        path = path[len(root.rstrip("/")) :] or "/"
    elif root != "/":
        raise ContainmentError(f"our cgroup {path} is outside the mounted cgroup v2 ({root})")
    return os.path.normpath(point + path)


def is_host_root(directory: str) -> bool:
    """The hierarchy's root cgroup has no ``cgroup.events`` (a cgroup namespace's root has)."""
    return not os.path.exists(os.path.join(directory, "cgroup.events"))


def check_writable(directory: str) -> None:
    """Raise :class:`ContainmentError` unless we may make cgroups in ``directory``."""
    if not os.path.isdir(directory) or not os.path.exists(os.path.join(directory, "cgroup.procs")):
        raise ContainmentError(f"{directory} is not a cgroup v2 directory")
    if not os.access(directory, os.W_OK) or not os.access(
        os.path.join(directory, "cgroup.procs"), os.W_OK
    ):
        raise ContainmentError(
            f"cgroup {directory} is not delegated to us (not writable; under systemd: Delegate=yes)"
        )


def cgroup_name(key: str) -> str:
    """A cgroup directory name for ``key`` (a job id): no ``/``, no dot names, bounded."""
    name = _SAFE.sub("_", key)[:120].lstrip(".")
    return name or "job"


# -- accounting -----------------------------------------------------------------------------------


@attrs.frozen
class CgroupUsage:
    """What a job used, read from its cgroup at its end (docs/containment.md, "Accounting").
    ``cpu.stat`` is there without any controller; ``memory.peak`` and ``memory.events``
    only where the memory controller is enabled for the job's cgroup (else ``None``)."""

    cpu_usec: int
    user_usec: int
    system_usec: int
    memory_peak: int | None = None
    oom_kills: int | None = None

    @property
    def cpu_seconds(self) -> float:
        return self.cpu_usec / 1e6

    def text(self) -> str:
        """One line for a job log: ``cpu 1.50 s (user 1.00 s, system 0.50 s)`` and, where
        known, ``, memory peak N bytes, oom kills N``."""
        text = (
            f"cpu {self.cpu_usec / 1e6:.2f} s (user {self.user_usec / 1e6:.2f} s,"
            f" system {self.system_usec / 1e6:.2f} s)"
        )
        if self.memory_peak is not None:
            text += f", memory peak {self.memory_peak} bytes"
        if self.oom_kills is not None:
            text += f", oom kills {self.oom_kills}"
        return text


def read_usage(path: str) -> CgroupUsage | None:
    """The usage of the cgroup at ``path`` (``None``: its ``cpu.stat`` cannot be read)."""
    try:
        stats = _keyed(os.path.join(path, "cpu.stat"))
    except (OSError, ValueError):
        return None
    try:
        with open(os.path.join(path, "memory.peak"), "rb") as f:
            peak: int | None = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        peak = None
    try:
        oom: int | None = _keyed(os.path.join(path, "memory.events")).get("oom_kill", 0)
    except (OSError, ValueError):
        oom = None
    return CgroupUsage(
        cpu_usec=stats.get("usage_usec", 0),
        user_usec=stats.get("user_usec", 0),
        system_usec=stats.get("system_usec", 0),
        memory_peak=peak,
        oom_kills=oom,
    )


def _keyed(path: str) -> dict[str, int]:
    with open(path, "rb") as f:
        return {k.decode(): int(v) for k, v in (line.split()[:2] for line in f if line.strip())}


# -- one job's cgroup ---------------------------------------------------------------------------


class JobCgroup:
    """One job's cgroup: its processes, its kill, its emptiness, its removal.

    ``escaped`` records, in order, the pids that a stop found in the cgroup outside the
    leader's group or session (see :class:`CgroupTarget`): the sweep report lists them.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock_fd = -1
        """``exec``'s job cgroups: the cgroup open with an exclusive ``flock`` while its exec
        lives (:func:`reap_stale_exec_cgroups` takes only a cgroup whose lock is free)."""
        self.escaped: dict[int, None] = {}
        self._report: tuple[int, int] | None = None
        self.usage: CgroupUsage | None = None
        """What the job used, read just before the cgroup was removed (:meth:`remove`)."""

    # The shim's report: a pipe that only a shim which could not enter the cgroup writes to
    # (the shell's own error line, by the path /proc/<our pid>/fd/<write end>, so the job never
    # inherits it). Empty: the shim entered, whatever the job's exit status is.
    def report_path(self) -> str:
        """The path a failing shim writes its error to (the pipe is made on first use)."""
        if self._report is None:
            self._report = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        return f"/proc/{os.getpid()}/fd/{self._report[1]}"

    def entry_error(self) -> str | None:
        """The errno text of a shim that could not enter the cgroup (``None``: it entered, or
        there was no shim); the report pipe is closed. Call once the shim has exited."""
        if self._report is None:
            return None
        r, w = self._report
        self._report = None
        try:
            data = os.read(r, 4096)
        except OSError:
            data = b""
        finally:
            os.close(r)
            os.close(w)
        if not data:
            return None
        return shell_errno_text(data.decode("utf-8", "replace"))

    def close_report(self) -> None:
        """Close the report pipe unread (the spawn failed)."""
        if self._report is not None:
            for fd in self._report:
                os.close(fd)
            self._report = None

    @property
    def procs_file(self) -> str:
        return os.path.join(self.path, "cgroup.procs")

    def subtree(self) -> list[str]:
        """The cgroup and every cgroup the job made inside it, deepest first (a job owns its
        subtree and may make cgroups there: ``cgroup.procs`` lists a cgroup's own processes
        only, ``rmdir`` needs the children gone)."""
        found: list[str] = []
        for directory, subdirs, _files in os.walk(self.path):
            found.extend(os.path.join(directory, d) for d in subdirs)
        found.sort(key=lambda p: p.count("/"), reverse=True)
        return [*found, self.path]

    def procs(self) -> list[int] | None:
        """The pids in the cgroup and in every cgroup below it (zombies not yet reaped
        included); ``None``: the job's own ``cgroup.procs`` is unreadable."""
        pids: list[int] = []
        for directory in reversed(self.subtree()):
            try:
                with open(os.path.join(directory, "cgroup.procs"), "rb") as f:
                    pids.extend(int(x) for x in f.read().split())
            except (OSError, ValueError):
                if directory == self.path:
                    return None
        return pids

    def populated(self) -> bool | None:
        """``cgroup.events``' ``populated``; ``None`` when it cannot be read."""
        try:
            with open(os.path.join(self.path, "cgroup.events"), "rb") as f:
                return _populated(f.read())
        except OSError:
            return None

    def signal_all(self, sig: int) -> bool:
        """Send ``sig`` to every process in the cgroup; True iff one was delivered."""
        delivered = False
        for pid in self.procs() or ():
            try:
                os.kill(pid, sig)
            except OSError:
                continue
            delivered = True
        return delivered

    def kill(self) -> bool:
        """SIGKILL everything in the cgroup: ``cgroup.kill`` (Linux ≥ 5.14), else SIGKILL to
        each pid listed (the caller waits for ``populated 0`` and repeats while it is not)."""
        try:
            fd = os.open(os.path.join(self.path, "cgroup.kill"), os.O_WRONLY)
        except FileNotFoundError:
            return self.signal_all(signal.SIGKILL)
        except OSError:
            return False
        try:
            os.write(fd, b"1")
        except OSError:
            return False
        finally:
            os.close(fd)
        return True

    async def wait_empty(self, bound: float) -> bool:
        """Wait up to ``bound`` seconds for ``populated 0``: True once empty.

        Watched, not polled: ``cgroup.events`` raises ``EPOLLPRI`` when it changes; trio waits
        on a private ``epoll`` descriptor holding it. A kernel that does not notify (it always
        does since 4.5) is still looked at every :data:`KILL_WAIT`/4 s.
        """
        try:
            fd = os.open(os.path.join(self.path, "cgroup.events"), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return self.procs() == []
        ep = select.epoll()
        try:
            ep.register(fd, select.EPOLLPRI)
            with trio.move_on_after(bound):
                while True:
                    try:
                        data = os.pread(fd, 256, 0)
                    except OSError:
                        return self.procs() == []
                    if not _populated(data):
                        return True
                    with trio.move_on_after(KILL_WAIT / 4):
                        await trio.lowlevel.wait_readable(ep.fileno())
                    ep.poll(0)
            return self.populated() is False
        finally:
            ep.close()
            os.close(fd)

    def remove(self) -> bool:
        """``rmdir`` the cgroup (it must be empty); True when it is gone. Its usage is read
        first (:attr:`usage`), while it can be."""
        usage = read_usage(self.path)
        if usage is not None:
            self.usage = usage
        for directory in self.subtree():  # the job's own sub-cgroups first
            try:
                os.rmdir(directory)
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.warning("cgroup %s not removed: %s", directory, errno_text(exc.errno or 0))
                self.unlock()
                return False
        self.unlock()
        return True

    def lock(self) -> bool:
        """Take the cgroup's ``flock`` (held until :meth:`unlock` or the process's end, a
        ``kill -9`` included); False when another process holds it."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self.lock_fd = fd
        return True

    def unlock(self) -> None:
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1


def shell_errno_text(line: str) -> str:
    """The errno text (Go's lower case) in a shell's ``cannot create FILE: TEXT`` line; the
    line's last part as it is when the text is no ``strerror`` (another locale)."""
    text = line.strip().rsplit(": ", 1)[-1]
    if text == "Directory nonexistent":  # dash's own words for ENOENT on a redirection
        return errno_text(errno.ENOENT)
    for number in errno.errorcode:
        if os.strerror(number) == text:
            return errno_text(number)
    return text


def _populated(events: bytes) -> bool:
    for line in events.splitlines():
        key, _, value = line.partition(b" ")
        if key == b"populated":
            return value.strip() != b"0"
    return True


@attrs.frozen
class CgroupTarget:
    """A stop's target under the cgroup backend: the whole cgroup gets each signal (SIGKILL:
    ``cgroup.kill``); ``alive``/``settling`` (the straggler reap after a clean exit) stay the
    leader's group or session, as with the marker backend. Processes of the cgroup outside
    that group or session are recorded in :attr:`JobCgroup.escaped` for the sweep report."""

    inner: object  # the group or session Target
    cgroup: JobCgroup
    leader: int
    session: bool = False

    def _note_escaped(self) -> None:
        for pid in self.cgroup.procs() or ():
            if pid == self.leader or pid in self.cgroup.escaped:
                continue
            try:
                owner = os.getsid(pid) if self.session else os.getpgid(pid)
            except OSError:
                continue
            if owner != self.leader:
                self.cgroup.escaped[pid] = None

    def signal(self, sig: int) -> bool:
        self._note_escaped()
        delivered: bool = self.inner.signal(sig)  # type: ignore[attr-defined]
        if sig == signal.SIGKILL:
            return self.cgroup.kill() or delivered
        return self.cgroup.signal_all(sig) or delivered

    def alive(self) -> bool:
        return bool(self.inner.alive())  # type: ignore[attr-defined]

    def settling(self) -> bool:
        return bool(self.inner.settling())  # type: ignore[attr-defined]


# -- the backends -------------------------------------------------------------------------------


class Containment(Protocol):
    name: str
    """``"cgroup"`` or ``"marker"``."""
    reason: str
    """Why this backend (logged once at start)."""


@attrs.frozen
class MarkerContainment:
    """Today's sweep by environment marker (the default where no cgroup can be had)."""

    reason: str = "configured"
    name: str = "marker"


@attrs.frozen
class CgroupContainment:
    """Job cgroups are made in ``jobs_dir`` (``<delegated cgroup>/jobs`` for node and worker)."""

    jobs_dir: str
    reason: str = "configured"
    prefix: str = ""
    """Put before every job cgroup's name (``exec``: ``fleet-trio-exec-<pid>-``)."""
    previous: bool = False
    """``jobs_dir`` was there before this start: a previous run used the cgroup backend here
    (its job cgroups are what :func:`recover_leftovers` kills)."""
    name: str = "cgroup"
    lock_fd: int = attrs.field(default=-1, eq=False, repr=False)
    """node and worker: ``jobs_dir`` open with an exclusive ``flock`` for the process's
    life, so no second agent uses (and recovers, killing its jobs) the same ``jobs/``."""

    def release(self) -> None:
        """Give ``jobs_dir`` up (the process's end does; tests that start twice call it)."""
        if self.lock_fd >= 0:
            os.close(self.lock_fd)

    def create(self, key: str) -> JobCgroup:
        """Make the job's cgroup (``<jobs_dir>/<prefix><key>``; ``~N`` appended while the
        name is taken: a previous run's survivors). Raises ``OSError``."""
        base = self.prefix + cgroup_name(key)
        for n in range(1, 1000):
            path = os.path.join(self.jobs_dir, base if n == 1 else f"{base}~{n}")
            try:
                os.mkdir(path)
            except FileExistsError:
                continue
            cg = JobCgroup(path)
            if self.prefix:  # exec's: held while this exec lives (reap_stale_exec_cgroups)
                cg.lock()
            return cg
        raise OSError(errno.EEXIST, f"no free cgroup name for {key}")

    def leftovers(self) -> list[JobCgroup]:
        """The job cgroups present in ``jobs_dir`` (with ``prefix``): a crashed run's."""
        try:
            names = sorted(os.listdir(self.jobs_dir))
        except OSError:
            return []
        return [
            JobCgroup(os.path.join(self.jobs_dir, name))
            for name in names
            if name.startswith(self.prefix)
            and os.path.isfile(os.path.join(self.jobs_dir, name, "cgroup.procs"))
        ]


AnyContainment = MarkerContainment | CgroupContainment


def choose_for_agent(
    mode: str, *, base: str = "", move_self: bool | None = None, dry_run: bool = False
) -> AnyContainment:
    """The backend for node or worker. ``base``: the delegated cgroup to use (default: our
    own). Our own cgroup is used only when it is not the host's root cgroup; then this process
    moves into ``<own>/agent`` (a leaf) so ``<own>/jobs`` may hold the job cgroups beside it.
    ``mode == "cgroup"`` raises :class:`ContainmentError` (one line) when it cannot be had;
    ``auto`` falls back to the marker backend and says why in ``reason``. ``dry_run``
    (``--check``): decide only; nothing is made and nothing moves."""
    if mode == "marker":
        return MarkerContainment(reason="configured")
    try:
        own = own_cgroup_dir() if not base else ""
        directory = base or own
        if not base and is_host_root(directory):
            raise ContainmentError(
                f"our cgroup ({directory}) is the host's root cgroup, not one delegated to us"
                " (under systemd: Delegate=yes; or set cgroup_base)"
            )
        check_writable(directory)
        jobs = os.path.join(directory, JOBS_DIR)
        previous = os.path.isdir(jobs)
        lock_fd = -1
        if not dry_run:
            os.makedirs(jobs, exist_ok=True)
            lock_fd = _lock_jobs_dir(jobs)  # before the recovery could touch another's jobs
        if not dry_run and (move_self if move_self is not None else not base):
            leaf = os.path.join(directory, AGENT_LEAF)
            os.makedirs(leaf, exist_ok=True)
            with open(os.path.join(leaf, "cgroup.procs"), "w") as f:
                f.write("0")
    except (ContainmentError, OSError) as exc:
        text = str(exc) if isinstance(exc, ContainmentError) else _oserror_text(exc)
        if mode == "cgroup":
            raise ContainmentError(f"containment: cgroup: {text}") from None
        return MarkerContainment(reason=f"auto: no cgroup ({text})")
    why = "configured" if mode == "cgroup" else f"auto: {directory} is delegated to us"
    return CgroupContainment(jobs_dir=jobs, reason=why, previous=previous, lock_fd=lock_fd)


def _lock_jobs_dir(jobs: str) -> int:
    """``jobs`` open with an exclusive ``flock`` (held until the process ends: a ``kill -9``
    gives it back). Another node or worker holding it: :class:`ContainmentError` — two agents
    in one delegated cgroup would each take the other's job cgroups for a crashed run's."""
    fd = os.open(jobs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ContainmentError(
            f"{jobs} is in use by another fleet-trio node or worker (give each its own "
            "delegated cgroup: its own systemd unit, or cgroup_base)"
        ) from None
    except OSError:
        os.close(fd)
        raise
    return fd


def choose_for_exec(mode: str, *, base: str = "") -> AnyContainment:
    """The backend for ``fleet-trio exec``: the job cgroup is ``fleet-trio-exec-<pid>-<job>``
    in ``base`` (default: our own cgroup, the host's root included: the name is ours alone and
    the cgroup is always removed). ``exec`` does not move itself."""
    if mode == "marker":
        return MarkerContainment(reason="configured")
    try:
        directory = base or own_cgroup_dir()
        check_writable(directory)
    except ContainmentError as exc:
        if mode == "cgroup":
            raise ContainmentError(f"--containment cgroup: {exc}") from None
        return MarkerContainment(reason=f"auto: no cgroup ({exc})")
    why = "configured" if mode == "cgroup" else f"auto: {directory} is writable"
    prefix = f"{EXEC_PREFIX}{os.getpid()}-"
    return CgroupContainment(jobs_dir=directory, reason=why, prefix=prefix)


def _oserror_text(exc: OSError) -> str:
    text = errno_text(exc.errno) if exc.errno is not None else str(exc)
    return f"{exc.filename}: {text}" if exc.filename else text


# -- the spawn shim -----------------------------------------------------------------------------


def shim_argv(cgroup: JobCgroup, argv: list[str], env: Mapping[str, str] | None) -> list[str]:
    """The argv that runs ``argv`` inside ``cgroup`` from before its exec (see the module)."""
    environ = os.environ if env is None else env
    fixups = []
    if "PWD" in environ:
        fixups.append(f"PWD={shlex.quote(environ['PWD'])}")
    else:
        fixups.append("unset PWD")
    if "IFS" in environ:
        fixups.append(f"IFS={shlex.quote(environ['IFS'])}")
    # On failure, the write is tried once more with the shell's error line into the report
    # pipe (JobCgroup.entry_error); the common path opens nothing but cgroup.procs.
    enter = (
        f'echo 0 2>/dev/null >"$0" || '
        f'{{ echo 0 2>{shlex.quote(cgroup.report_path())} >"$0" || exit {EXIT_SHIM}; }}'
    )
    script = f"{enter}; " + "; ".join(fixups) + '; exec "$@"'
    if all(_IDENT.match(name) for name in environ):
        return [SH, "-c", script, cgroup.procs_file, *argv]
    # names a shell drops: the environment goes through env -i, on the command line
    assignments = [f"{k}={v}" for k, v in environ.items()]
    script = f'{enter}; exec "$@"'
    return [SH, "-c", script, cgroup.procs_file, ENV, "-i", "--", *assignments, *argv]


def shim_env(env: Mapping[str, str] | None) -> dict[str, str] | None:
    """The environment to spawn :func:`shim_argv`'s argv with: ``env`` itself, or none at all
    when the shim passes it on ``env -i``'s command line (names a shell drops): passed twice,
    an environment that fits ``ARG_MAX`` once would fail the start with ``E2BIG``."""
    environ = os.environ if env is None else env
    if all(_IDENT.match(name) for name in environ):
        return None if env is None else dict(env)
    return {}


BINFMT_MISC = "/proc/sys/fs/binfmt_misc"


def exec_check(path: str) -> OSError | None:
    """What ``execve(path)`` would refuse before running anything (the shim would otherwise
    report it as an exit status, or run it differently): missing, not a regular file, not
    executable, and a file whose first bytes are neither ``#!`` nor an ELF header (the kernel's
    ``ENOEXEC``, which the shim's ``exec`` would answer by running it as a shell script).
    Unless :func:`binfmt_misc_active`: a format registered there may run it."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return exc
    if not stat.S_ISREG(st.st_mode) or not os.access(path, os.X_OK):
        return PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None  # execute-only: the kernel alone may read it
    try:
        head = os.read(fd, 4)
    except OSError:
        return None
    finally:
        os.close(fd)
    if head[:2] == b"#!" or head == b"\x7fELF" or binfmt_misc_active():
        return None
    return OSError(errno.ENOEXEC, os.strerror(errno.ENOEXEC), path)


def binfmt_misc_active() -> bool:
    """Are extra executable formats registered (``binfmt_misc`` enabled, an entry present)?
    Then a file without ``#!`` or ELF header is left to the kernel."""
    try:
        with open(os.path.join(BINFMT_MISC, "status"), "rb") as f:
            if f.read().strip() != b"enabled":
                return False
        return any(n not in ("status", "register") for n in os.listdir(BINFMT_MISC))
    except OSError:
        return False


# -- the sweep under the cgroup backend ---------------------------------------------------------


async def sweep_cgroup(
    cgroup: JobCgroup, *, grace: float, kill_bound: float, leader: int
) -> tuple[tuple[int, ...], tuple[int, ...], bool]:
    """After the leader is reaped: ``(found, remaining, scanned)``.

    ``found``: every pid that a stop saw outside the leader's group or session
    (:attr:`JobCgroup.escaped`) plus every pid still in the cgroup now (they outlived the
    leader). Those still there get SIGTERM, up to ``grace`` to go, then ``cgroup.kill`` and up
    to ``kill_bound``; ``remaining``: the pids that survived SIGKILL. The cgroup is removed
    once empty. Cancellation: supervisors call it shielded; every wait is bounded.
    """
    now = cgroup.procs()
    if now is None:
        return tuple(cgroup.escaped), (), False
    found = dict(cgroup.escaped)
    for pid in now:
        if pid != leader:
            found[pid] = None
    if now and [p for p in now if p != leader]:
        log.info("cgroup %s: %d process(es) outlived the job: %s", cgroup.path, len(now), now)
        cgroup.signal_all(signal.SIGTERM)
        if not await cgroup.wait_empty(grace):
            cgroup.kill()
            if not await cgroup.wait_empty(kill_bound):
                cgroup.kill()  # a pre-5.14 kernel: the pids forked meanwhile
                await cgroup.wait_empty(kill_bound)
    elif now:
        await cgroup.wait_empty(kill_bound)  # the leader's zombie: reaped by now
    left = cgroup.procs() or []
    remaining = tuple(p for p in left if p != leader)
    if not left:
        cgroup.remove()
    return tuple(found), remaining, True


async def recover_leftovers(containment: CgroupContainment) -> list[str]:
    """Kill and remove a crashed run's job cgroups; one log text per cgroup found."""
    lines: list[str] = []
    for cg in containment.leftovers():
        pids = cg.procs() or []
        if pids:
            cg.kill()
            emptied = await cg.wait_empty(KILL_WAIT)
            if not emptied:
                cg.kill()
                emptied = await cg.wait_empty(KILL_WAIT)
        removed = cg.remove()
        name = os.path.basename(cg.path)
        killed = f"killed {len(pids)} process(es) {pids}" if pids else "empty"
        lines.append(f"job cgroup {name}: {killed}, {'removed' if removed else 'NOT removed'}")
    return lines


EXEC_PREFIX = "fleet-trio-exec-"


def stale_exec_cgroups(jobs_dir: str) -> list[JobCgroup]:
    """``exec``'s job cgroups in ``jobs_dir`` whose exec is gone, each locked for the caller.
    Stale only when its exec's pid is gone from this pid namespace *and* nobody holds its lock
    (an exec in another pid namespace, or one that reused the pid, holds it). Only cgroupfs is
    read (memory, no disk)."""
    try:
        names = sorted(os.listdir(jobs_dir))
    except OSError:
        return []
    found = []
    for name in names:
        pid_text = name[len(EXEC_PREFIX) :].split("-", 1)[0]
        if not name.startswith(EXEC_PREFIX) or not pid_text.isdigit():
            continue
        if int(pid_text) == os.getpid() or os.path.exists(f"/proc/{pid_text}"):
            continue
        cg = JobCgroup(os.path.join(jobs_dir, name))
        if os.path.isfile(cg.procs_file) and cg.lock():
            found.append(cg)
    return found


async def reap_stale_exec_cgroups(containment: CgroupContainment) -> list[str]:
    """The cgroups of ``exec`` runs killed with ``kill -9`` (nothing else removes them),
    with what still ran in them: killed and removed; one text per cgroup."""
    lines: list[str] = []
    for cg in stale_exec_cgroups(containment.jobs_dir):
        pids = cg.procs() or []
        if pids:
            cg.kill()
            if not await cg.wait_empty(KILL_WAIT):
                cg.kill()
                await cg.wait_empty(KILL_WAIT)
        removed = cg.remove()
        killed = f"killed {len(pids)} process(es) {pids}" if pids else "empty"
        name = os.path.basename(cg.path)
        lines.append(
            f"cgroup {name} of an exec that is gone: {killed}, "
            f"{'removed' if removed else 'NOT removed'}"
        )
    return lines


def describe(containment: AnyContainment) -> str:
    """One line for the startup log and ``--check``."""
    if isinstance(containment, CgroupContainment):
        return f"containment: cgroup ({containment.reason}; job cgroups in {containment.jobs_dir})"
    return f"containment: marker ({containment.reason})"


__all__ = [
    "EXEC_PREFIX",
    "MODES",
    "AnyContainment",
    "CgroupContainment",
    "CgroupTarget",
    "CgroupUsage",
    "Containment",
    "ContainmentError",
    "JobCgroup",
    "MarkerContainment",
    "cgroup2_mount",
    "cgroup_name",
    "choose_for_agent",
    "choose_for_exec",
    "describe",
    "exec_check",
    "own_cgroup",
    "own_cgroup_dir",
    "read_usage",
    "reap_stale_exec_cgroups",
    "recover_leftovers",
    "shell_errno_text",
    "shim_argv",
    "shim_env",
    "stale_exec_cgroups",
    "sweep_cgroup",
]
