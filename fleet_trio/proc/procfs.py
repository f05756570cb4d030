"""Primitives over Linux ``/proc`` (worker-process.md §2.9, §3.4).

(Over 500 lines: one reader of ``/proc`` for every caller, so that the "found nothing" versus
"could not look" rule below lives in one place.)

"Found nothing" (``scanned=True`` with no pids) and "could not look" (``scanned=False``) are
opposite answers and are never merged. A zombie (state ``Z``) is never evidence of life.
Every function that scans takes the scan as a parameter so tests can substitute a fake
namespace.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Callable, Collection

import attrs

PROC = "/proc"
PF_KTHREAD = 0x00200000
"""A kernel thread (``stat`` flags): its environment is empty for good and it never carries a
job's marker, so an empty read from one is not doubtful."""
PF_EXITING = 0x4
"""Set by the kernel at the start of ``do_exit``, before the process closes its files: a
process can hold no pipe any more yet not be a zombie yet. Such a process is not a straggler."""
JOB_ENV_KEY = b"RC_JOB_ID="


@attrs.frozen
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` that supervision needs."""

    pid: int
    state: str = "S"
    ppid: int = 0
    pgid: int = 0
    sid: int = 0
    flags: int = attrs.field(default=0, eq=False)
    """The kernel's per-task flags (``stat`` field 9); see :data:`PF_EXITING`."""
    start: int = attrs.field(default=0, eq=False)
    """When the process started, in clock ticks after boot (``stat`` field 22): with the pid,
    the process's identity (a reused pid has another start time)."""

    @property
    def exiting(self) -> bool:
        """The process has begun to exit (it is closing its files; a zombie a moment later).
        Not said of a zombie: a leader whose main thread exited carries the flag while its
        other threads run on (:func:`stat_live`)."""
        return bool(self.flags & PF_EXITING) and self.state != "Z"


Predicate = Callable[[ProcStat], bool]
ScanFn = Callable[[Predicate, bool], tuple[list[int], bool]]
"""``scan(predicate, stop_at_first) -> (pids, scanned)``."""


def parse_proc_stat(data: bytes) -> ProcStat | None:
    """Parse the text of ``/proc/<pid>/stat``; ``None`` when it is malformed.

    ``comm`` is parenthesised and may itself contain spaces and parentheses, so the pid is the
    text before the first ``(`` and the other fields follow the last ``)``.
    """
    open_at = data.find(b"(")
    close_at = data.rfind(b")")
    if open_at < 0 or close_at < open_at:
        return None
    rest = data[close_at + 1 :]
    if not rest.startswith(b" "):
        return None
    fields = rest[1:].split()
    if len(fields) < 4:
        return None
    try:
        pid = int(data[:open_at].strip())
        ppid = int(fields[1])
        pgid = int(fields[2])
        sid = int(fields[3])
    except ValueError:
        return None
    state = fields[0][:1].decode("ascii", errors="replace")
    flags = _int_field(fields, 6)
    start = _int_field(fields, 19)
    return ProcStat(pid=pid, state=state, ppid=ppid, pgid=pgid, sid=sid, flags=flags, start=start)


def _int_field(fields: list[bytes], index: int) -> int:
    if len(fields) <= index:
        return 0
    try:
        return int(fields[index])
    except ValueError:
        return 0


def read_proc_stat(pid: int) -> ProcStat | None:
    """Read and parse one process's stat; ``None`` when it is gone or unreadable."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return parse_proc_stat(data)


def list_pids() -> list[int] | None:
    """The numeric entries of ``/proc``; ``None`` when ``/proc`` cannot be listed."""
    try:
        names = os.listdir(PROC)
    except OSError:
        return None
    return [int(n) for n in names if n.isdigit()]


def scan_live_procs(predicate: Predicate, stop_at_first: bool = False) -> tuple[list[int], bool]:
    """Live (non-zombie) processes matching ``predicate``: ``(pids, scanned)``."""
    pids = list_pids()
    if pids is None:
        return [], False
    out: list[int] = []
    for pid in pids:
        st = read_proc_stat(pid)
        if st is None or not stat_live(st):
            continue
        if predicate(st):
            out.append(pid)
            if stop_at_first:
                break
    return out, True


def live_proc_exists(predicate: Predicate, scan: ScanFn = scan_live_procs) -> tuple[bool, bool]:
    """``(live, scanned)``: is there a live process matching ``predicate``?"""
    pids, scanned = scan(predicate, True)
    return bool(pids), scanned


def live_proc_pids(predicate: Predicate, scan: ScanFn = scan_live_procs) -> tuple[list[int], bool]:
    """``(pids, scanned)``: every live process matching ``predicate`` (worker-process.md §2.9)."""
    return scan(predicate, False)


def env_marker_value(environ: bytes, key: bytes = JOB_ENV_KEY) -> str:
    """The first non-empty ``RC_JOB_ID=`` value in a NUL-separated environment block."""
    if key not in environ:
        return ""
    for entry in environ.split(b"\0"):
        if entry.startswith(key) and len(entry) > len(key):
            return entry[len(key) :].decode("utf-8", errors="surrogateescape")
    return ""


def job_env_id(pid: int) -> tuple[str, OSError | None]:
    """``(value, error)`` of the process's ``RC_JOB_ID``.

    A process that is gone (ENOENT, ESRCH) holds nothing: ``("", None)``. Any other read
    error (realistically EACCES on someone else's process) is returned.
    """
    try:
        data = read_environ(pid)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ESRCH):
            return "", None
        return "", exc
    return env_marker_value(data), None


def has_job_env(pid: int) -> tuple[bool, OSError | None]:
    """Whether the process carries a non-empty ``RC_JOB_ID`` (same error rule; §3.4)."""
    value, err = job_env_id(pid)
    return bool(value), err


def group_alive(pgid: int, scan: ScanFn = scan_live_procs) -> bool:
    """Does the process group have a live (non-zombie) member?

    ``kill(-pgid, 0)`` failing is the fast negative. It succeeds for a group holding only
    zombies, so a ``/proc`` scan decides; if ``/proc`` cannot be listed the answer is True
    (cannot tell: err towards killing).
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    live, scanned = live_proc_exists(lambda st: st.pgid == pgid, scan)
    return live or not scanned


def group_settling(pgid: int, scan: ScanFn = scan_live_procs) -> bool:
    """Every live member of the group has already begun to exit (``PF_EXITING``).

    Closes the window between a process closing its pipes (the job's completion) and its
    becoming a zombie: such members are leaving by themselves and are not stragglers.
    """
    exiting = True

    def member(st: ProcStat) -> bool:
        nonlocal exiting
        if st.pgid != pgid:
            return False
        exiting = exiting and st.exiting
        return True

    pids, scanned = scan(member, False)
    return scanned and bool(pids) and exiting


def session_pgids(sid: int) -> tuple[set[int], bool]:
    """Every distinct pgid in the session, zombies included: ``(pgids, scanned)``."""
    pids = list_pids()
    if pids is None:
        return set(), False
    out: set[int] = set()
    for pid in pids:
        st = read_proc_stat(pid)
        if st is not None and st.sid == sid:
            out.add(st.pgid)
    return out, True


def session_alive(sid: int, scan: ScanFn = scan_live_procs) -> bool:
    """Any live process in the session. Unlistable ``/proc`` reads as not alive (§2.8)."""
    live, _scanned = live_proc_exists(lambda st: st.sid == sid, scan)
    return live


def ancestor_set(self_pid: int) -> set[int]:
    """``self_pid`` and its ppid chain; stops at an unreadable stat, ppid ≤ 0 or a repeat."""
    out: set[int] = set()
    pid = self_pid
    while pid > 0 and pid not in out:
        out.add(pid)
        st = read_proc_stat(pid)
        if st is None:
            break
        pid = st.ppid
    return out


def other_threads_live(pid: int | str, proc: str = PROC) -> bool:
    """Does the thread group of ``pid`` hold a running task besides its leader (one that is
    neither a zombie nor exiting)? A leader that called ``pthread_exit`` shows ``Z`` in
    ``stat`` while its other threads run on: not exited. A process that is exiting as a whole
    (``exit_group``: its leader is ``Z`` first while its other threads free its memory, all of
    them ``PF_EXITING``) is not."""
    try:
        tids = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        return False
    leader = str(pid)
    for tid in tids:
        if tid == leader:
            continue
        try:
            st = parse_proc_stat(read_proc_file(f"{proc}/{pid}/task/{tid}/stat"))
        except OSError:
            continue
        if st is None:
            return True  # unparsable: cannot tell, so never claim it gone
        if st.state in ("Z", "X") or st.flags & PF_EXITING:
            continue
        if not _sigkill_pending(f"{proc}/{pid}/task/{tid}/status"):
            return True
    return False


def _sigkill_pending(status_path: str) -> bool:
    """The thread has SIGKILL pending (``SigPnd``): an ``exit_group`` sent it, and it exits as
    soon as it runs (a thread off its CPU, or inside a driver call, shows no ``PF_EXITING``
    yet). Unreadable: not known to be leaving."""
    try:
        data = read_proc_file(status_path)
    except OSError:
        return False
    at = data.find(b"\nSigPnd:")
    if at < 0:
        return False
    try:
        mask = int(data[at + 8 : data.index(b"\n", at + 1)].strip(), 16)
    except ValueError:
        return False
    return bool(mask & (1 << (signal.SIGKILL - 1)))


def stat_live(st: ProcStat, proc: str = PROC) -> bool:
    """``st`` is a live process: not a zombie, or a zombie *leader* whose other threads run
    on (:func:`other_threads_live`: its main thread called ``pthread_exit``; the process runs,
    holds what it held, and dies by a signal to its pid). Every "gone" decision goes through
    here."""
    return st.state != "Z" or other_threads_live(st.pid, proc)


def pid_alive(pid: int) -> bool:
    """``/proc/<pid>/stat`` exists and :func:`stat_live` says so."""
    st = read_proc_stat(pid)
    return st is not None and stat_live(st)


_UNREADABLE_LEADER_ERRNOS = (errno.ESRCH, errno.EACCES, errno.EPERM)
"""How ``/proc/<pid>/environ`` of a leader whose main thread exited fails: ESRCH, or EACCES
for a reader that is not root (the file then belongs to root)."""


def read_environ(pid: int | str, proc: str = PROC) -> bytes:
    """``/proc/<pid>/environ``; may raise ``OSError``. A leader whose main thread has exited
    cannot be read there (ESRCH, or EACCES when not root; empty on some kernels) while its
    other threads run on: then the environment is read through one of them
    (``task/<tid>/environ``: the same memory, still owned by the process's user)."""
    try:
        data = read_proc_file(f"{proc}/{pid}/environ")
    except OSError as exc:
        leader_gone = exc.errno in _UNREADABLE_LEADER_ERRNOS and _zombie_leader(proc, pid)
        if leader_gone and (data := thread_environ(pid, proc)):
            return data
        raise
    if not data and _zombie_leader(proc, pid):
        return thread_environ(pid, proc)
    return data


def _stat_at(proc: str, pid: int | str) -> ProcStat | None:
    """``<proc>/<pid>/stat`` parsed; ``None`` when it cannot be read."""
    try:
        return parse_proc_stat(read_proc_file(f"{proc}/{pid}/stat"))
    except OSError:
        return None


def _zombie_leader(proc: str, pid: int | str) -> bool:
    """``pid``'s ``stat`` says ``Z`` while other threads of its group run on."""
    st = _stat_at(proc, pid)
    return st is not None and st.state == "Z" and other_threads_live(pid, proc)


def thread_environ(pid: int | str, proc: str = PROC) -> bytes:
    """The environment of ``pid``'s thread group read through a thread other than the leader;
    ``b""`` when no such thread is left. A thread that cannot be read for another reason than
    being gone (EACCES) raises that error when no thread could be read: the caller is blind,
    not told "gone"."""
    try:
        tids = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        return b""
    error: OSError | None = None
    for tid in tids:
        if tid == str(pid):
            continue
        try:
            if data := read_proc_file(f"{proc}/{pid}/task/{tid}/environ"):
                return data
        except OSError as exc:
            if exc.errno not in _GONE_ERRNOS:
                error = exc
    if error is not None:
        raise error
    return b""


# ----------------------------------------------------------------------------------------------
# The sweep's marker scan (worker-process.md §3.3 step 3, §3.4).

ENVIRON_CHUNK = 32768
"""First read size for ``/proc/<pid>/environ``; a block this long is read on to EOF."""

MARKER_MAX_LISTINGS = 16
"""How many times one marker scan lists ``/proc`` while looking for processes forked mid-walk."""

EMPTY_ENVIRON_RECHECK = 0.002
"""Seconds after an environ read empty before it is read once more (a process caught inside
``execve`` reads empty until the kernel has copied its environment onto the new stack)."""

_GONE_ERRNOS = (errno.ENOENT, errno.ESRCH)


def pause_since(started: float, seconds: float) -> None:
    """Block (this is thread-side code) until ``seconds`` have passed since ``started``
    (a ``time.monotonic()`` value)."""
    left = started + seconds - time.monotonic()
    if left > 0:
        time.sleep(left)


@attrs.frozen(order=True)
class Ident:
    """One process's identity: its pid and its start time (``ProcStat.start``).

    ``start == 0`` means "not known" (a scan that could not read it): the pid alone then.
    A pid that has been reused carries another start time, so it is another ``Ident``.
    """

    pid: int
    start: int = 0


@attrs.frozen
class MarkerScan:
    """One sweep scan: live processes whose ``RC_JOB_ID`` equals a job id exactly.

    ``scanned`` is False when ``/proc`` could not be listed (then nothing else is meaningful).
    ``blind`` means at least one live process's environment could not be read. ``settled``
    means the scan accounted for every process forked while it walked ``/proc`` (see
    :func:`scan_job_marker`); an unsettled scan that found nothing proves nothing.
    """

    scanned: bool
    pids: tuple[int, ...] = ()
    blind: bool = False
    settled: bool = True
    starts: tuple[int, ...] = attrs.field(default=(), eq=False)
    """The start time of each of ``pids`` (same order) as the scan read it; missing: 0."""

    def idents(self) -> tuple[Ident, ...]:
        """The matches as identities (pid + start time)."""
        starts = self.starts
        return tuple(
            Ident(pid, starts[i] if i < len(starts) else 0) for i, pid in enumerate(self.pids)
        )


def read_proc_file(path: str) -> bytes:
    """Read a whole ``/proc`` file with plain syscalls (no buffered-file object); may raise."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, ENVIRON_CHUNK)
        if len(data) < ENVIRON_CHUNK:
            return data
        chunks = [data]
        while chunk := os.read(fd, ENVIRON_CHUNK):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _live_stat(proc: str, name: str) -> ProcStat | None:
    """``/proc/<name>/stat`` when it is readable and :func:`stat_live`; else ``None``."""
    try:
        data = read_proc_file(f"{proc}/{name}/stat")
    except OSError:
        return None
    st = parse_proc_stat(data)
    return st if st is not None and stat_live(st, proc) else None


def _list_pid_names(proc: str) -> list[str] | None:
    """The all-digit entries of ``proc`` as strings; ``None`` when it cannot be listed."""
    try:
        names = os.listdir(proc)
    except OSError:
        return None
    return [n for n in names if n.isdigit()]


def _proc_is_ours(proc: str) -> bool:
    """``proc`` is mounted for our own pid namespace (``<proc>/self`` names our pid)."""
    try:
        return os.readlink(f"{proc}/self") == str(os.getpid())
    except OSError:
        return False


def _last_pid(proc: str) -> int | None:
    """The last pid allocated in the reader's pid namespace (``/proc/loadavg``, last field)."""
    try:
        return int(read_proc_file(f"{proc}/loadavg").split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def forks_since_boot(proc: str = PROC) -> int | None:
    """The host's process and thread creations since boot (``/proc/stat``'s ``processes``
    line, every pid namespace counted, never wrapping); ``None`` when it cannot be read.

    Two reads that differ by exactly one around a spawn prove that the spawn was the only
    fork or clone in between, anywhere on the host (see :func:`~fleet_trio.proc.sweep.
    sweep_job_survivors`' ``forks_before``)."""
    try:
        data = read_proc_file(f"{proc}/stat")
    except OSError:
        return None
    at = data.find(b"\nprocesses ")
    if at < 0:
        return None
    try:
        return int(data[at + 11 : data.index(b"\n", at + 1)])
    except ValueError:
        return None


def scan_job_marker(
    job_id: str,
    protected: Collection[int] = frozenset(),
    *,
    proc: str = PROC,
    max_listings: int = MARKER_MAX_LISTINGS,
    recheck: float = EMPTY_ENVIRON_RECHECK,
    key: bytes = JOB_ENV_KEY,
) -> MarkerScan:
    """Every live process outside ``protected`` whose ``RC_JOB_ID`` (or another marker:
    ``key`` is ``b"NAME="``) equals ``job_id``.

    Blocking (walks all of ``/proc``): run it in a thread.

    **Reads.** The same answer as a ``scan_live_procs`` walk with a :func:`job_env_id`
    predicate, at about one read per process: ``environ`` is read first, ``stat`` only when it
    decides something — after a match (the process may have become a zombie since) or after a
    read error (a zombie or a process that is gone is not *blind*). Protected pids are not read.

    **Empty environments.** A kernel thread (told apart by its ``stat`` flags, and passed
    over), a zombie and an exiting process read as an empty environ for good; so, for a
    moment, does a process inside ``execve`` (between the switch to
    its new memory and the kernel copying the environment onto its new stack), which is alive
    and carries its marker again a moment later. Every empty one is read once more, at least
    ``recheck`` seconds after the last empty read.

    **Forks during the walk.** A process forked after ``/proc`` was listed is not in the
    listing. Its parent was listed and read: if it was alive then, it either carried the marker
    (a match: the sweep re-scans anyway) or did not (nor does the child). If it was not (zombie,
    gone, read as empty), it forked before that read. So after a round of reads:

    * if nothing read was doubtful (gone, a zombie, empty, matched-then-dead) and no pid was
      allocated in our pid namespace since just before the listing (``/proc/loadavg``'s last
      pid is unchanged; only trusted when ``proc`` is our own namespace's), no process was
      forked during the walk: the scan is ``settled``;
    * otherwise ``/proc`` is listed again and the pids not yet read are read (a new round),
      until a listing brings nothing new (``settled``) or ``max_listings`` is reached.

    A settled scan that found nothing means nothing carrying the marker was alive at its end
    (pid reuse within one scan, and an ``execve`` stalled for longer than ``recheck``, aside).
    """
    target = key + job_id.encode("utf-8", errors="surrogateescape")
    ours = _proc_is_ours(proc)
    mark = _last_pid(proc) if ours else None
    listed = _list_pid_names(proc)
    if listed is None:
        return MarkerScan(scanned=False, settled=False)
    seen = {str(pid) for pid in protected}
    matches: list[tuple[int, int]] = []
    blind = False
    batch = [name for name in listed if name not in seen]
    listings = 1
    while True:
        seen.update(batch)
        empties: list[str] = []
        round_blind, doubt, last_empty = _marker_batch(
            proc, batch, target, job_id, matches, empties, key
        )
        if empties:
            pause_since(last_empty, recheck)
            again_blind, _doubt, _t = _marker_batch(
                proc, empties, target, job_id, matches, None, key
            )
            round_blind |= again_blind
        blind |= round_blind
        if not doubt and mark is not None and _last_pid(proc) == mark:
            return _marker_scan(matches, blind, settled=True)
        if listings >= max_listings:
            return _marker_scan(matches, blind, settled=False)
        mark = _last_pid(proc) if ours else None
        again = _list_pid_names(proc)
        listings += 1
        if again is None:
            return _marker_scan(matches, blind, settled=False)
        batch = [name for name in again if name not in seen]
        if not batch:
            return _marker_scan(matches, blind, settled=True)


def _marker_scan(matches: list[tuple[int, int]], blind: bool, *, settled: bool) -> MarkerScan:
    return MarkerScan(
        scanned=True,
        pids=tuple(pid for pid, _start in matches),
        blind=blind,
        settled=settled,
        starts=tuple(start for _pid, start in matches),
    )


def _marker_batch(
    proc: str,
    names: list[str],
    target: bytes,
    job_id: str,
    matches: list[tuple[int, int]],
    empties: list[str] | None,
    key: bytes = JOB_ENV_KEY,
) -> tuple[bool, bool, float]:
    """Read the environ of each of ``names``; append the live exact matches to ``matches``.

    Names whose environ reads empty go to ``empties`` (when given; else they only count as
    doubtful). Returns ``(blind, doubt, last_empty)``: some live process's environ could not
    be read; some process read was gone, a zombie, or matched and then died; the
    ``time.monotonic()`` of the last empty read (0.0 if none).
    """
    blind = doubt = False
    last_empty = 0.0
    open_, read, close = os.open, os.read, os.close
    flags = os.O_RDONLY | os.O_CLOEXEC
    for name in names:
        try:
            fd = open_(f"{proc}/{name}/environ", flags)
            try:
                data = read(fd, ENVIRON_CHUNK)
                if len(data) >= ENVIRON_CHUNK:
                    chunks = [data]
                    while chunk := read(fd, ENVIRON_CHUNK):
                        chunks.append(chunk)
                    data = b"".join(chunks)
            finally:
                close(fd)
        except OSError as exc:
            st = None if exc.errno == errno.ENOENT else _stat_at(proc, name)
            if st is None:  # gone
                doubt = True
                continue
            if st.flags & PF_KTHREAD:
                continue  # a kernel thread (ESRCH here on some kernels): never the job's
            if st.state == "Z" and other_threads_live(name, proc):
                try:  # a leader gone, its threads running on (ESRCH, or EACCES if not root)
                    data = thread_environ(name, proc)
                except OSError:
                    blind = True
                    continue
                if not data:  # its threads went meanwhile
                    doubt = True
                    continue
            elif exc.errno == errno.ESRCH or st.state == "Z" or st.flags & PF_EXITING:
                doubt = True  # gone, or leaving (its files turn root's: EACCES when not root)
                continue
            else:
                blind = True  # alive and unreadable (EACCES: not ours to read)
                continue
        if not data:
            st = _live_stat(proc, name)
            if st is not None and st.flags & PF_KTHREAD:
                continue  # a kernel thread: never the job's, never a late fork of it
            if st is not None and st.state == "Z":
                try:  # a leader gone, its threads running on
                    data = thread_environ(name, proc)
                except OSError:
                    blind = True
                    continue
            if not data:
                doubt = True
                if empties is not None:
                    empties.append(name)
                    last_empty = time.monotonic()
                continue
        if target in data and env_marker_value(data, key) == job_id:
            st = _live_stat(proc, name)
            if st is not None:
                matches.append((int(name), st.start))
            else:
                doubt = True
    return blind, doubt, last_empty


# ----------------------------------------------------------------------------------------------
# Identity: a process is its pid plus its start time.


def ident_alive(ident: Ident, proc: str = PROC) -> bool:
    """``ident`` is still the same live process: its stat is readable, not a zombie, and (when
    known) its start time is unchanged. A stat that cannot be read for a reason other than
    "gone" counts as alive (cannot tell: never claim a process gone without seeing it)."""
    try:
        data = read_proc_file(f"{proc}/{ident.pid}/stat")
    except OSError as exc:
        return exc.errno not in _GONE_ERRNOS
    st = parse_proc_stat(data)
    if st is None:
        return True
    if not stat_live(st, proc):
        return False
    return ident.start == 0 or st.start == ident.start


def idents_alive(idents: Collection[Ident], proc: str = PROC) -> frozenset[Ident]:
    """The subset of ``idents`` that :func:`ident_alive` finds still alive (blocking)."""
    return frozenset(ident for ident in idents if ident_alive(ident, proc))


def signal_ident(ident: Ident, sig: int) -> bool:
    """Send ``sig`` to ``ident`` only if the pid still names that process; True if sent.

    With ``pidfd_open`` the process is pinned first and its start time checked after, so a pid
    reused at any moment is never signalled; without it (old kernels) the start time is
    checked just before ``kill(2)``. Gone, reused, zombie or not ours: False, never raises.
    """
    pidfd = -1
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is not None:
        try:
            pidfd = pidfd_open(ident.pid)
        except OSError as exc:
            if exc.errno != errno.ENOSYS:
                return False
    try:
        if not ident_alive(ident):
            return False
        try:
            if pidfd >= 0:
                signal.pidfd_send_signal(pidfd, sig)
            else:
                os.kill(ident.pid, sig)
        except OSError:
            return False
        return True
    finally:
        if pidfd >= 0:
            os.close(pidfd)


__all__ = [
    "EMPTY_ENVIRON_RECHECK",
    "ENVIRON_CHUNK",
    "JOB_ENV_KEY",
    "MARKER_MAX_LISTINGS",
    "PF_EXITING",
    "PF_KTHREAD",
    "PROC",
    "Ident",
    "MarkerScan",
    "Predicate",
    "ProcStat",
    "ScanFn",
    "ancestor_set",
    "env_marker_value",
    "forks_since_boot",
    "group_alive",
    "group_settling",
    "has_job_env",
    "ident_alive",
    "idents_alive",
    "job_env_id",
    "list_pids",
    "live_proc_exists",
    "live_proc_pids",
    "other_threads_live",
    "parse_proc_stat",
    "pause_since",
    "pid_alive",
    "read_environ",
    "read_proc_file",
    "read_proc_stat",
    "scan_job_marker",
    "scan_live_procs",
    "session_alive",
    "session_pgids",
    "signal_ident",
    "stat_live",
    "thread_environ",
]
