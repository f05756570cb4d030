"""Recovery on the host: the boot id and the leftover-process proof (worker-process.md §9).

Nothing about a running job is persisted: the marker is the environment. A restarted worker
proves "nothing of a previous run survived" either by being alone in its pid namespace or by a
``/proc`` scan that finds no live process carrying a non-empty ``RC_JOB_ID``. Every doubt
(``/proc`` not listable, an environment that cannot be read) yields **no claim**, never a
false "nothing survived".

The functions here are synchronous and walk ``/proc``; call them from
``trio.to_thread.run_sync`` (or use :func:`gather_recovery_proof`).
"""

from __future__ import annotations

import enum
import errno
import functools
import logging
import os
import time
from collections.abc import Callable

import attrs
import trio

from fleet_trio.proc.procfs import (
    EMPTY_ENVIRON_RECHECK,
    PROC,
    ProcStat,
    ScanFn,
    env_marker_value,
    list_pids,
    pause_since,
    read_environ,
    read_proc_file,
    read_proc_stat,
    scan_live_procs,
    stat_live,
)

log = logging.getLogger(__name__)

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
PROC_STAT_PATH = "/proc/stat"


@attrs.frozen
class RecoveryProof:
    """What a registering worker may claim about leftovers of a previous run (§9.3)."""

    isolated: bool = False
    survivors_checked: bool = False
    survivors_found: bool = False

    def proves(self) -> bool:
        """``isolated or (survivors_checked and not survivors_found)``."""
        return self.isolated or (self.survivors_checked and not self.survivors_found)

    def to_wire(self) -> dict[str, bool] | None:
        """The registration ``recovery`` field: only the true fields; ``None`` (omit) if none."""
        out = {
            name: True
            for name, value in (
                ("isolated", self.isolated),
                ("survivors_checked", self.survivors_checked),
                ("survivors_found", self.survivors_found),
            )
            if value
        }
        return out or None


def isolated_pid_namespace(self_pid: int, scan: ScanFn = scan_live_procs) -> bool:
    """The worker is PID 1 and no other live process exists in its namespace.

    ``self_pid != 1`` → False without scanning. PID 1 with company (a shared process namespace,
    an sshd) is not isolation; an unreadable ``/proc`` proves nothing.
    """
    if self_pid != 1:
        return False
    pids, scanned = scan(lambda st: st.pid != self_pid, True)
    return scanned and not pids


EXEC_SETTLE = 1.0
"""Seconds after its start during which an unmarked process that may not have finished its
``execve`` is doubtful: one whose environ reads empty, or one still running its parent's
program (between ``fork`` and ``execve`` a child's environ is its parent's, without the marker
the exec brings). A doubtful process is read again until it has settled or is this old."""
RECOVERY_MAX_LISTINGS = 8
"""How many more times the survivor check lists ``/proc`` while processes keep going away
under it before it claims nothing."""
EXEC_RECHECK = 0.005
"""Seconds between re-reads of doubtful processes."""
PF_KTHREAD = 0x00200000
"""A kernel thread (``stat`` flags): its environ reads empty for good."""


def survivors_from_previous_run(self_pid: int, scan: ScanFn = scan_live_procs) -> tuple[bool, bool]:
    """``(checked, found)``: is a live process other than ``self_pid`` carrying ``RC_JOB_ID``?

    Only the worker's own pid is excluded (not its ancestors, §15 Q10). An empty marker value is
    not a survivor; a process that exited meanwhile is neither a survivor nor an error; an
    environment that cannot be read makes the scan *blind* and a blind scan that found nothing
    checks nothing.

    A process is judged by its environ only once it has exec'd. An environ that read empty is
    read once more after the scan (a process in the middle of ``execve`` reads empty for a
    moment). A process younger than :data:`EXEC_SETTLE` whose environ still reads empty, or
    that still runs its parent's program (``/proc/PID/exe`` and the environ are its parent's:
    forked, not yet exec'd), is read again every :data:`EXEC_RECHECK` until it
    carries the marker (a survivor), has exec'd without it, is gone, or is older than
    :data:`EXEC_SETTLE` (a fork that never execs: judged by its environ). One still doubtful
    when the bound is spent makes the check blind.
    """
    blind = False
    doubtful: dict[int, ProcStat] = {}
    last_doubt = [0.0]
    judged: set[tuple[int, int]] = set()  # (pid, start): a pid may be reused meanwhile
    gone: list[int] = []

    def later_listings(judge: Callable[[ProcStat], bool]) -> tuple[list[int], bool]:
        """``(survivor pids, settled)``: list ``/proc`` again and judge the pids not judged
        yet, once, then again while the last round read a process as gone (or listed one gone
        by its ``stat``): a process that forked and exited may have left a child no listing
        saw. (The first walk cannot tell: a process gone before its ``stat`` was read is passed
        over silently.) Not settled after :data:`RECOVERY_MAX_LISTINGS` listings."""
        doubt = True
        zombies: set[tuple[int, int]] = set()
        for _ in range(RECOVERY_MAX_LISTINGS):
            if not doubt:
                return [], True
            listed = list_pids()
            if listed is None:
                return [], False
            doubt = False
            gone.clear()
            for pid in listed:
                if pid == self_pid:
                    continue
                st = read_proc_stat(pid)
                if st is None:
                    doubt = True
                    continue
                if not stat_live(st):
                    # exited: not a survivor. A child it forked before it exited is in the
                    # next listing, so one more listing after a new zombie settles it; one
                    # nobody reaps is not doubt again (it kept every check from settling).
                    # (A leader whose other threads still run is no zombie: judged below.)
                    if (pid, st.start) not in zombies:
                        zombies.add((pid, st.start))
                        doubt = True
                    continue
                if (pid, st.start) in judged:
                    continue
                if judge(st):
                    return [pid], True
            doubt = doubt or bool(gone)
        return [], not doubt

    def carries_marker(st: ProcStat) -> bool:
        nonlocal blind
        if st.pid == self_pid:
            return False
        judged.add((st.pid, st.start))
        verdict = _judge(st, first_look=True)
        if verdict is _Verdict.GONE:
            gone.append(st.pid)
        if verdict is _Verdict.BLIND:
            blind = True
        elif verdict is _Verdict.DOUBT:
            doubtful[st.pid] = st
            last_doubt[0] = time.monotonic()
        return verdict is _Verdict.MARKED

    pids, scanned = scan(carries_marker, True)
    if not scanned:
        log.info("survivor check: /proc could not be listed; could not determine leftovers")
        return False, False
    if not pids and scan is scan_live_procs:
        # one listing can miss a process that forks and exits between listings (its child
        # was not listed, the parent is gone when read): list again until nothing doubtful
        later, settled = later_listings(carries_marker)
        pids.extend(later)
        if not settled:
            log.info(
                "survivor check: /proc kept changing under %d listings; "
                "could not determine leftovers",
                RECOVERY_MAX_LISTINGS,
            )
            blind = True
    if not pids and doubtful:
        found, unsure = _settle_doubtful(doubtful, last_doubt[0])
        if found is not None:
            pids.append(found)
        blind = blind or unsure
    if pids:
        log.warning(
            "survivor check: a process from a previous run is alive (pid %d carries RC_JOB_ID)",
            pids[0],
        )
        return True, True
    if blind:
        log.info(
            "survivor check: a process's environment could not be read; "
            "could not determine leftovers"
        )
        return False, False
    return True, False


class _Verdict(enum.Enum):
    MARKED = "marked"
    CLEAN = "clean"
    GONE = "gone"
    DOUBT = "doubt"
    BLIND = "blind"


def _judge(st: ProcStat, *, first_look: bool) -> _Verdict:
    """One look at a live process. Whether it still runs its parent's program is decided
    *before* its environ is read, and the marker and emptiness come from one read, so an exec
    that completes meanwhile is never judged by a stale read."""
    unexeced = _unexeced_young(st)
    environ, err = _read_environ(st.pid)
    if err is not None:
        now = read_proc_stat(st.pid)  # a process leaving turns its files root's (EACCES)
        if now is None or not stat_live(now) or now.exiting:  # (a live Z leader is not)
            return _Verdict.GONE
        return _Verdict.BLIND
    if environ is None:  # gone: clean, but it may have forked before it went
        return _Verdict.GONE
    if env_marker_value(environ):
        return _Verdict.MARKED
    if unexeced:
        return _Verdict.DOUBT
    if not environ and (first_look or _young(st)):
        return _Verdict.DOUBT  # inside execve (or a kernel thread, a zombie: read once more)
    return _Verdict.CLEAN


def _read_environ(pid: int) -> tuple[bytes | None, OSError | None]:
    """``(environ, None)``; ``(None, None)`` when the process is gone; ``(None, error)`` when
    it cannot be read (realistically EACCES on someone else's process)."""
    try:
        return read_environ(pid), None
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ESRCH):
            return None, None
        return None, exc


def _settle_doubtful(doubtful: dict[int, ProcStat], since: float) -> tuple[int | None, bool]:
    """Look again at the doubtful processes until each has settled: ``(survivor pid, blind)``.

    The first look comes :data:`EMPTY_ENVIRON_RECHECK` after ``since`` (every empty one is
    read once more); later rounds keep only the young doubtful ones, bounded by
    :data:`EXEC_SETTLE`.
    """
    deadline = time.monotonic() + EXEC_SETTLE + EMPTY_ENVIRON_RECHECK
    pending = dict(doubtful)
    pause_since(since, EMPTY_ENVIRON_RECHECK)
    blind = False
    while pending:
        still: dict[int, ProcStat] = {}
        for pid, first in pending.items():
            st = read_proc_stat(pid)
            if st is None or not stat_live(st) or st.exiting:
                continue  # gone, a zombie, exiting: nothing survives
            if first.start and st.start != first.start:
                continue  # the pid names another process now
            verdict = _judge(st, first_look=False)
            if verdict is _Verdict.MARKED:
                return pid, blind
            if verdict is _Verdict.BLIND:
                blind = True
            elif verdict is _Verdict.DOUBT:
                still[pid] = first
        pending = still
        if not pending:
            break
        if time.monotonic() >= deadline:
            log.info(
                "survivor check: pid %d had not settled its exec after %.1f s",
                next(iter(pending)),
                EXEC_SETTLE,
            )
            return None, True
        pause_since(time.monotonic(), EXEC_RECHECK)
    return None, blind


def _unexeced_young(st: ProcStat) -> bool:
    return _young(st) and _runs_parents_program(st)


def _young(st: ProcStat) -> bool:
    """Started less than :data:`EXEC_SETTLE` ago (and not a kernel thread). A start time of 0
    (unknown) is not young."""
    if st.start <= 0 or st.flags & PF_KTHREAD:
        return False
    try:
        now = time.clock_gettime(time.CLOCK_BOOTTIME)
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return False
    return now - st.start / ticks < EXEC_SETTLE


def _runs_parents_program(st: ProcStat) -> bool:
    """Forked, perhaps not exec'd yet: ``/proc/PID/exe`` names the same file as its parent's
    and its environ is byte for byte its parent's (a child that exec'd with an environment of
    its own, as a job does, differs)."""
    if st.ppid <= 0:
        return False
    try:
        if os.readlink(f"{PROC}/{st.pid}/exe") != os.readlink(f"{PROC}/{st.ppid}/exe"):
            return False
        return read_proc_file(f"{PROC}/{st.pid}/environ") == read_proc_file(
            f"{PROC}/{st.ppid}/environ"
        )
    except OSError:
        return False


def recovery_proof_for(
    self_pid: int, *, require_manual_clear: bool = False, scan: ScanFn = scan_live_procs
) -> RecoveryProof:
    """The claim sent at registration (§9.3); only meaningful while no job is supervised."""
    if require_manual_clear:
        log.info("recovery: require_manual_clear is set; claiming nothing")
        return RecoveryProof()
    if isolated_pid_namespace(self_pid, scan):
        log.info("recovery: alone in the pid namespace (isolated)")
        return RecoveryProof(isolated=True)
    checked, found = survivors_from_previous_run(self_pid, scan)
    return RecoveryProof(survivors_checked=checked, survivors_found=found)


async def gather_recovery_proof(
    self_pid: int,
    *,
    require_manual_clear: bool = False,
    limiter: trio.CapacityLimiter | None = None,
    scan: ScanFn = scan_live_procs,
) -> RecoveryProof:
    """:func:`recovery_proof_for` in a worker thread (its scans walk all of ``/proc``).

    Cancellation: the thread is not abandoned: a cancellation takes effect once the scan is
    done (a ``/proc`` walk, bounded), then raises ``Cancelled``; nothing is claimed.
    """

    def compute() -> RecoveryProof:
        return recovery_proof_for(self_pid, require_manual_clear=require_manual_clear, scan=scan)

    return await trio.to_thread.run_sync(compute, limiter=limiter)


def read_boot_id(boot_id_path: str = BOOT_ID_PATH, stat_path: str = PROC_STAT_PATH) -> str:
    """Uncached: the boot id trimmed; else ``btime-<value>`` from ``/proc/stat``; else ``""``."""
    try:
        with open(boot_id_path, "rb") as f:
            value = f.read().decode("utf-8", errors="replace").strip()
        if value:
            return value
    except OSError:
        pass
    try:
        with open(stat_path, "rb") as f:
            for raw in f:
                line = raw.decode("utf-8", errors="replace")
                if line.startswith("btime "):
                    btime = line[len("btime ") :].strip()
                    if btime:
                        return f"btime-{btime}"
    except OSError:
        pass
    return ""


@functools.cache
def boot_id() -> str:
    """This boot's identity, computed once per process (§9.1). ``""`` means no proof."""
    return read_boot_id()


__all__ = [
    "BOOT_ID_PATH",
    "EXEC_RECHECK",
    "EXEC_SETTLE",
    "PROC_STAT_PATH",
    "RecoveryProof",
    "boot_id",
    "gather_recovery_proof",
    "isolated_pid_namespace",
    "read_boot_id",
    "recovery_proof_for",
    "survivors_from_previous_run",
]
