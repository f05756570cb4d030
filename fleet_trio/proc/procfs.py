"""Primitives over Linux ``/proc`` (worker-process.md §2.9, §3.4).

"Found nothing" (``scanned=True`` with no pids) and "could not look" (``scanned=False``) are
opposite answers and are never merged. A zombie (state ``Z``) is never evidence of life.
Every function that scans takes the scan as a parameter so tests can substitute a fake
namespace.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

import attrs

PROC = "/proc"
JOB_ENV_KEY = b"RC_JOB_ID="


@attrs.frozen
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` that supervision needs."""

    pid: int
    state: str = "S"
    ppid: int = 0
    pgid: int = 0
    sid: int = 0


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
    return ProcStat(pid=pid, state=state, ppid=ppid, pgid=pgid, sid=sid)


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
        if st is None or st.state == "Z":
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
    """``(pids, scanned)``: every live process matching ``predicate``."""
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
        with open(f"{PROC}/{pid}/environ", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return "", None
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ESRCH):
            return "", None
        return "", exc
    return env_marker_value(data), None


def has_job_env(pid: int) -> tuple[bool, OSError | None]:
    """Whether the process carries a non-empty ``RC_JOB_ID`` (same error rule)."""
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


def pid_alive(pid: int) -> bool:
    """``/proc/<pid>/stat`` exists and the state is not ``Z``."""
    st = read_proc_stat(pid)
    return st is not None and st.state != "Z"


__all__ = [
    "JOB_ENV_KEY",
    "PROC",
    "Predicate",
    "ProcStat",
    "ScanFn",
    "ancestor_set",
    "env_marker_value",
    "group_alive",
    "has_job_env",
    "job_env_id",
    "list_pids",
    "live_proc_exists",
    "live_proc_pids",
    "parse_proc_stat",
    "pid_alive",
    "read_proc_stat",
    "scan_live_procs",
    "session_alive",
    "session_pgids",
]
