"""worker-process.md §11, R — recovery and boot id (items 112–122, 125, 126).

Items 123, 124 and 127 need the worker's registration and config and live with the worker
tests. Fake scans stand in for ``scan_live_procs`` where the spec says so; the marker itself is
always read from the real ``/proc``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from fleet_trio.proc.procfs import (
    Predicate,
    ProcStat,
    ScanFn,
    has_job_env,
    job_env_id,
    pid_alive,
    read_proc_stat,
)
from fleet_trio.proc.recovery import (
    RecoveryProof,
    boot_id,
    gather_recovery_proof,
    isolated_pid_namespace,
    read_boot_id,
    recovery_proof_for,
    survivors_from_previous_run,
)
from tests.helpers import (
    DEAD_BEEF,
    FakeScan,
    marked_env,
    marker_ready,
    start_marked,
    stop,
    wait_until,
)

# -------------------------------------------------------------------------------- isolation


def test_process_112_isolated_when_pid_one_is_alone_in_its_namespace() -> None:
    assert isolated_pid_namespace(1, FakeScan(ProcStat(pid=1, state="S"))) is True


def test_process_113_not_isolated_when_something_else_is_alive() -> None:
    scan = FakeScan(ProcStat(pid=1, state="S"), ProcStat(pid=42, state="S"))
    assert isolated_pid_namespace(1, scan) is False


def test_process_114_not_isolated_when_not_pid_one() -> None:
    scan = FakeScan(ProcStat(pid=4242, state="S"))
    assert isolated_pid_namespace(4242, scan) is False
    assert scan.calls == 0


def test_process_115_not_isolated_when_proc_could_not_be_read() -> None:
    assert isolated_pid_namespace(1, FakeScan(scanned=False)) is False


def test_zombie_company_does_not_break_isolation() -> None:
    scan = FakeScan(ProcStat(pid=1, state="S"), ProcStat(pid=77, state="Z"))
    assert isolated_pid_namespace(1, scan) is True


# ------------------------------------------------------------------------------- survivors


async def test_process_116_survivor_check_finds_a_live_job_process() -> None:
    with trio.fail_after(10):
        proc = await start_marked(DEAD_BEEF)
        try:
            await marker_ready(proc.pid, DEAD_BEEF)
            result = await trio.to_thread.run_sync(survivors_from_previous_run, os.getpid())
            assert result == (True, True)
        finally:
            await stop(proc)


async def test_process_117_survivor_check_is_clean_once_the_job_process_is_gone() -> None:
    with trio.fail_after(10):
        proc = await start_marked(DEAD_BEEF)
        await stop(proc)  # killed and reaped
        scan = FakeScan(ProcStat(pid=proc.pid, state="S"))
        assert survivors_from_previous_run(os.getpid(), scan) == (True, False)


async def test_process_118_survivor_check_ignores_the_workers_own_process() -> None:
    with trio.fail_after(10):
        proc = await start_marked(DEAD_BEEF)
        try:
            await marker_ready(proc.pid, DEAD_BEEF)
            scan = FakeScan(ProcStat(pid=proc.pid, state="S"))
            assert survivors_from_previous_run(proc.pid, scan) == (True, False)
            # The same process seen by anyone else is a survivor.
            assert survivors_from_previous_run(os.getpid(), scan) == (True, True)
        finally:
            await stop(proc)


@pytest.mark.skipif(os.geteuid() == 0, reason="non-root only: root can read every environ")
def test_process_119_survivor_check_proves_nothing_when_a_process_cannot_be_inspected() -> None:
    assert survivors_from_previous_run(os.getpid(), FakeScan(ProcStat(pid=1))) == (False, False)


def test_process_120_survivor_check_proves_nothing_when_proc_could_not_be_read() -> None:
    scan = FakeScan(scanned=False)
    assert survivors_from_previous_run(os.getpid(), scan) == (False, False)


async def test_process_121_empty_job_id_is_not_a_survivor() -> None:
    with trio.fail_after(10):
        proc = await start_marked("")
        try:
            assert pid_alive(proc.pid)
            assert has_job_env(proc.pid) == (False, None)
            scan = FakeScan(ProcStat(pid=proc.pid))
            assert survivors_from_previous_run(os.getpid(), scan) == (True, False)
        finally:
            await stop(proc)


async def test_process_122_exited_process_is_neither_survivor_nor_error() -> None:
    with trio.fail_after(10):
        proc = await trio.lowlevel.open_process(["true"], env=marked_env(DEAD_BEEF))
        await proc.wait()
        assert has_job_env(proc.pid) == (False, None)


async def test_a_zombie_is_not_a_survivor() -> None:
    with trio.fail_after(10):
        proc = await start_marked(DEAD_BEEF, "true")
        try:
            await wait_until(lambda: not pid_alive(proc.pid))
            scan = FakeScan(ProcStat(pid=proc.pid, state="S"))  # even a scan that misses the Z
            assert survivors_from_previous_run(os.getpid(), scan) == (True, False)
        finally:
            await proc.wait()


def test_blind_survivor_check_claims_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root reads every environ, so the error is injected: an unreadable marker is blindness."""
    from fleet_trio.proc import recovery

    def unreadable(pid: int) -> tuple[bytes | None, OSError | None]:
        return None, PermissionError(13, "Permission denied")

    monkeypatch.setattr(recovery, "_read_environ", unreadable)
    assert survivors_from_previous_run(os.getpid(), FakeScan(ProcStat(pid=5))) == (False, False)
    proof = recovery_proof_for(os.getpid(), scan=FakeScan(ProcStat(pid=5)))
    assert proof == RecoveryProof()
    assert not proof.proves()


def test_survivor_check_reads_an_empty_environ_once_more(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process caught mid-``execve`` reads empty, then shows its marker: a survivor."""
    from fleet_trio.proc import recovery

    answers: list[tuple[bytes | None, OSError | None]] = [(b"", None), (b"RC_JOB_ID=x\0", None)]
    monkeypatch.setattr(recovery, "_read_environ", lambda pid: answers.pop(0))
    monkeypatch.setattr(recovery, "read_proc_stat", lambda pid: ProcStat(pid=pid))
    assert survivors_from_previous_run(os.getpid(), FakeScan(ProcStat(pid=5))) == (True, True)
    assert answers == []


def test_an_old_empty_environ_is_read_once_more_then_judged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kernel thread or a zombie-to-be reads empty for good: one more read, then clean."""
    from fleet_trio.proc import recovery

    reads: list[int] = []

    def empty(pid: int) -> tuple[bytes | None, OSError | None]:
        reads.append(pid)
        return b"", None

    monkeypatch.setattr(recovery, "_read_environ", empty)
    monkeypatch.setattr(recovery, "read_proc_stat", lambda pid: ProcStat(pid=pid))
    assert survivors_from_previous_run(os.getpid(), FakeScan(ProcStat(pid=5))) == (True, False)
    assert reads == [5, 5]


async def test_survivor_check_catches_a_process_right_after_spawn() -> None:
    """No waiting for the child's exec to finish: the check must still see it."""
    with trio.fail_after(20):
        for _ in range(20):
            proc = await start_marked(DEAD_BEEF)
            try:
                scan = real_scan(proc.pid)
                assert survivors_from_previous_run(os.getpid(), scan) == (True, True)
            finally:
                await stop(proc)


# A process between fork and exec still shows its parent's memory, so its environ is the
# parent's (no marker) although the job's marker arrives with the exec a moment later.
HELD_BEFORE_EXEC = """
import os, sys
child = os.fork()
if child == 0:
    os.read(0, 1)  # held between fork and exec until the test writes a byte
    os.execve(sys.argv[1], [sys.argv[1], "60"], dict(os.environ, RC_JOB_ID=sys.argv[2]))
print(child, flush=True)
os.waitpid(child, 0)
"""


def real_scan(*pids: int) -> FakeScan:
    """A scan over ``pids`` that reports their real ``/proc/PID/stat`` (ppid, start time)."""
    stats = [read_proc_stat(pid) for pid in pids]
    return FakeScan(*(st for st in stats if st is not None))


async def test_survivor_check_waits_for_a_process_held_between_fork_and_exec(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Deterministic: the child is held after ``fork`` (its environ is its parent's, without
    the marker) until the check's first read is done; it is released from inside the check's
    pause and the check waits until it has exec'd. The re-read must find the marker."""
    from fleet_trio.proc import recovery

    sleep_bin = shutil.which("sleep")
    assert sleep_bin is not None
    env = {k: v for k, v in os.environ.items() if k != "RC_JOB_ID"}
    with trio.fail_after(20):
        holder = await trio.lowlevel.open_process(
            [sys.executable, "-c", HELD_BEFORE_EXEC, sleep_bin, DEAD_BEEF],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            process_group=0,
        )
        try:
            assert holder.stdout is not None and holder.stdin is not None
            line = b""
            while not line.endswith(b"\n"):
                chunk = await holder.stdout.receive_some()
                assert chunk, "the holder exited before naming its child"
                line += chunk
            child = int(line)
            assert job_env_id(child) == ("", None)  # the parent's environment
            stdin_fd = holder.stdin.fileno()
            released: list[float] = []

            def release_then_pause(started: float, seconds: float) -> None:
                if not released:
                    released.append(started)
                    os.write(stdin_fd, b"x")
                    deadline = time.monotonic() + 10
                    while job_env_id(child) != (DEAD_BEEF, None):  # waits on the exec
                        assert time.monotonic() < deadline, "the held child never exec'd"
                        time.sleep(0.001)

            monkeypatch.setattr(recovery, "pause_since", release_then_pause)
            scan = real_scan(child)
            result = await trio.to_thread.run_sync(survivors_from_previous_run, os.getpid(), scan)
            assert released, "the check never doubted the unexec'd child"
            assert result == (True, True)
        finally:
            with trio.CancelScope(shield=True):
                with contextlib.suppress(OSError):
                    os.killpg(holder.pid, signal.SIGKILL)
                await holder.wait()


async def test_an_old_fork_that_never_execs_is_not_doubted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long-lived fork without exec (a pre-fork server's worker) is judged by its environ at
    once: doubt is only for processes younger than ``EXEC_SETTLE``."""
    from fleet_trio.proc import recovery

    monkeypatch.setattr(recovery, "EXEC_SETTLE", 0.0)
    with trio.fail_after(20):
        holder = await trio.lowlevel.open_process(
            [sys.executable, "-c", HELD_BEFORE_EXEC, "/nonexistent", DEAD_BEEF],
            env={k: v for k, v in os.environ.items() if k != "RC_JOB_ID"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            process_group=0,
        )
        try:
            assert holder.stdout is not None
            line = b""
            while not line.endswith(b"\n"):
                chunk = await holder.stdout.receive_some()
                assert chunk
                line += chunk
            child = int(line)
            pauses: list[float] = []
            monkeypatch.setattr(recovery, "pause_since", lambda s, t: pauses.append(t))
            result = survivors_from_previous_run(os.getpid(), real_scan(child))
            assert result == (True, False)
            assert pauses == []
        finally:
            with trio.CancelScope(shield=True):
                with contextlib.suppress(OSError):
                    os.killpg(holder.pid, signal.SIGKILL)
                await holder.wait()


def test_survivor_check_logs_at_the_spec_levels(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleet_trio.proc import recovery

    caplog.set_level(logging.DEBUG, logger="fleet_trio.proc.recovery")
    survivors_from_previous_run(os.getpid(), FakeScan(scanned=False))
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    caplog.clear()
    monkeypatch.setattr(recovery, "_read_environ", lambda pid: (b"RC_JOB_ID=x\0", None))
    survivors_from_previous_run(os.getpid(), FakeScan(ProcStat(pid=5)))
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    caplog.clear()
    recovery_proof_for(1, require_manual_clear=True, scan=FakeScan(ProcStat(pid=1)))
    assert [r.levelno for r in caplog.records] == [logging.INFO]


# ---------------------------------------------------------------------------- the proof


def test_process_125_require_manual_clear_suppresses_even_a_proven_isolation() -> None:
    alone = FakeScan(ProcStat(pid=1, state="S"))
    proof = recovery_proof_for(1, scan=alone)
    assert proof == RecoveryProof(isolated=True)
    assert proof.to_wire() == {"isolated": True}
    assert proof.proves()
    suppressed = recovery_proof_for(1, require_manual_clear=True, scan=alone)
    assert suppressed == RecoveryProof()
    assert not suppressed.proves()
    assert suppressed.to_wire() is None


def test_proof_from_the_survivor_check() -> None:
    only_me = FakeScan(ProcStat(pid=os.getpid()))
    proof = recovery_proof_for(os.getpid(), scan=only_me)
    assert proof == RecoveryProof(survivors_checked=True)
    assert proof.proves()
    assert proof.to_wire() == {"survivors_checked": True}
    assert recovery_proof_for(os.getpid(), scan=FakeScan(scanned=False)).to_wire() is None


@pytest.mark.parametrize(
    ("proof", "proves", "wire"),
    [
        (RecoveryProof(), False, None),
        (RecoveryProof(isolated=True), True, {"isolated": True}),
        (RecoveryProof(survivors_checked=True), True, {"survivors_checked": True}),
        (
            RecoveryProof(survivors_checked=True, survivors_found=True),
            False,
            {"survivors_checked": True, "survivors_found": True},
        ),
        (
            RecoveryProof(isolated=True, survivors_checked=True, survivors_found=True),
            True,
            {"isolated": True, "survivors_checked": True, "survivors_found": True},
        ),
        (RecoveryProof(survivors_found=True), False, {"survivors_found": True}),
    ],
)
def test_proves_and_wire(proof: RecoveryProof, proves: bool, wire: dict[str, bool] | None) -> None:
    assert proof.proves() is proves
    assert proof.to_wire() == wire


async def test_gather_recovery_proof_runs_in_a_thread() -> None:
    limiter = trio.CapacityLimiter(1)
    borrowed: list[int] = []

    def scan(predicate: Predicate, stop_at_first: bool) -> tuple[list[int], bool]:
        borrowed.append(limiter.borrowed_tokens)
        return [], True

    fake: ScanFn = scan
    proof = await gather_recovery_proof(4242, limiter=limiter, scan=fake)
    assert proof == RecoveryProof(survivors_checked=True)
    assert borrowed == [1]


# ------------------------------------------------------------------------------- boot id


def test_process_126_boot_id_is_stable_within_a_boot() -> None:
    first = boot_id()
    second = boot_id()
    assert first == second
    if first:
        assert "\n" not in first
        assert first == first.strip()


def test_boot_id_reads_the_kernel_value_trimmed(tmp_path: Path) -> None:
    path = tmp_path / "boot_id"
    path.write_text("0b6c1f2e-1111-2222-3333-444455556666\n")
    assert read_boot_id(str(path), str(tmp_path / "none")) == (
        "0b6c1f2e-1111-2222-3333-444455556666"
    )


def test_boot_id_falls_back_to_btime(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  1 2 3\nintr 5\nbtime 1700000000\nprocesses 9\n")
    assert read_boot_id(str(tmp_path / "none"), str(stat)) == "btime-1700000000"


def test_boot_id_is_empty_without_either(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  1 2 3\n")
    assert read_boot_id(str(tmp_path / "none"), str(stat)) == ""
    assert read_boot_id(str(tmp_path / "none"), str(tmp_path / "none")) == ""


def test_boot_id_matches_the_kernel() -> None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            expected = f.read().strip()
    except OSError:
        pytest.skip("no kernel boot id here")
    assert boot_id() == expected


def test_process_109_parse_proc_stat() -> None:
    from fleet_trio.proc.procfs import parse_proc_stat

    def fields(raw: bytes) -> tuple[int, str, int, int, int] | None:
        st = parse_proc_stat(raw)
        return None if st is None else (st.pid, st.state, st.ppid, st.pgid, st.sid)

    rest = b" 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 5 1000 200"
    assert fields(b"12345 (sh) S 1 12345 12345" + rest) == (12345, "S", 1, 12345, 12345)
    assert fields(b"999 (my (weird) cmd) S 100 200 300" + rest) == (999, "S", 100, 200, 300)
    assert fields(b"999 (sleep) Z 100 200 300" + rest) == (999, "Z", 100, 200, 300)
    assert fields(b"999 (sh) S 100") is None
    assert fields(b"(sh) S 100 200 300 34816 300") is None


HOPPER = """
import os, sys, time
end = time.time() + float(sys.argv[1])
if os.fork(): os._exit(0)
os.setsid()
while time.time() < end:
    if os.fork(): os._exit(0)  # the parent leaves, the child carries on: a new pid each time
    time.sleep(0.002)
os._exit(0)
"""

CHECKS = """
import json, os, signal, subprocess, sys, time
from fleet_trio.proc.recovery import survivors_from_previous_run
# This interpreter is the namespace's init: the hopper's exited parents are reparented to it,
# and it reaps them (as an init does), or thousands of zombies would slow every listing.
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
subprocess.run([sys.executable, "-c", sys.argv[1], "20"],
               env={**os.environ, "RC_JOB_ID": "old-job"}, check=True)
time.sleep(0.1)  # the hopper is under way (this is the child interpreter, not the test)
results, until = [], time.monotonic() + 15
while len(results) < 30 and time.monotonic() < until:  # bounded on a loaded machine
    results.append(survivors_from_previous_run(os.getpid()))
print(json.dumps(results))
"""


def _fresh_pid_namespace() -> list[str] | None:
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    probe = subprocess.run(
        [unshare, "-pf", "--mount-proc", "true"], capture_output=True, timeout=30, check=False
    )
    return [unshare, "-pf", "--mount-proc"] if probe.returncode == 0 else None


def test_survivor_check_catches_a_process_that_keeps_changing_its_pid() -> None:
    """A survivor that forks and exits in a loop is never at the pid a single listing saw: the
    check lists /proc again while processes go away under it, and claims nothing rather than
    "nothing survived" when /proc never settles. (One listing missed it in about 1 check in
    13.) In a fresh pid namespace, where the hopper is the only other process."""
    prefix = _fresh_pid_namespace()
    if prefix is None:
        pytest.skip("needs `unshare -pf --mount-proc` (root, a kernel that allows it)")
    done = subprocess.run(
        [*prefix, sys.executable, "-c", CHECKS, HOPPER],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = [tuple(r) for r in json.loads(done.stdout.splitlines()[-1])]
    assert (True, False) not in results, results  # never a false "nothing survived"
    assert (True, True) in results, results  # and not only "could not determine" either
