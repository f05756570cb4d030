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

import functools
import logging
import time

import attrs
import trio

from fleet_trio.proc.procfs import (
    EMPTY_ENVIRON_RECHECK,
    PROC,
    ProcStat,
    ScanFn,
    has_job_env,
    pause_since,
    read_proc_file,
    scan_live_procs,
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


def survivors_from_previous_run(self_pid: int, scan: ScanFn = scan_live_procs) -> tuple[bool, bool]:
    """``(checked, found)``: is a live process other than ``self_pid`` carrying ``RC_JOB_ID``?

    Only the worker's own pid is excluded (not its ancestors, §15 Q10). An empty marker value is
    not a survivor; a process that exited meanwhile is neither a survivor nor an error; an
    environment that cannot be read makes the scan *blind* and a blind scan that found nothing
    checks nothing. An environ that read empty is read once more after the scan (a process in
    the middle of ``execve`` reads empty for a moment).
    """
    blind = False
    empties: list[int] = []
    last_empty = [0.0]

    def carries_marker(st: ProcStat) -> bool:
        nonlocal blind
        if st.pid == self_pid:
            return False
        marked, err = has_job_env(st.pid)
        if err is not None:
            blind = True
            return False
        if not marked and _environ_reads_empty(st.pid):
            empties.append(st.pid)
            last_empty[0] = time.monotonic()
        return marked

    pids, scanned = scan(carries_marker, True)
    if not scanned:
        log.info("survivor check: /proc could not be listed; could not determine leftovers")
        return False, False
    if not pids:
        # An environ that read empty: a kernel thread, a zombie, an exiting process — or one
        # caught in the middle of execve, which shows its marker again a moment later.
        if empties:
            pause_since(last_empty[0], EMPTY_ENVIRON_RECHECK)
        for pid in empties:
            marked, err = has_job_env(pid)
            if err is not None:
                blind = True
            elif marked:
                pids.append(pid)
                break
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


def _environ_reads_empty(pid: int) -> bool:
    try:
        return read_proc_file(f"{PROC}/{pid}/environ") == b""
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
    "PROC_STAT_PATH",
    "RecoveryProof",
    "boot_id",
    "gather_recovery_proof",
    "isolated_pid_namespace",
    "read_boot_id",
    "recovery_proof_for",
    "survivors_from_previous_run",
]
