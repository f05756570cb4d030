"""A process whose main thread called ``pthread_exit`` while its other threads run on.

Its ``stat`` says ``Z`` and its own ``environ`` reads empty (the leader's memory is gone), yet
the process runs, holds whatever it held, and can be killed through its pid. Every reader of
``/proc`` that decides "gone" or "not ours" must see it as alive and read its marker through
a thread that still runs (``/proc/<pid>/task/<tid>/environ``). Real processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from fleet_trio.proc import BufferSink, JobSpec
from fleet_trio.proc.procfs import (
    PF_EXITING,
    PF_KTHREAD,
    Ident,
    MarkerScan,
    ProcStat,
    ancestor_set,
    ident_alive,
    other_threads_live,
    pid_alive,
    read_proc_stat,
    scan_job_marker,
    scan_live_procs,
    stat_live,
)
from fleet_trio.proc.run import run
from tests.helpers import wait_until

LEADER_EXITS = """
import ctypes, os, sys, threading, time
threading.Thread(target=time.sleep, args=(300,), daemon=False).start()
ctypes.CDLL(None).pthread_exit(None)
"""
"""The main thread leaves; a thread sleeps on (the process lives 300 s)."""

ESCAPES_THEN_LEADER_EXITS = """
import os, sys, time
pidfile = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    os.execv(sys.executable, [sys.executable, "-c", sys.argv[2], pidfile])
while not os.path.exists(pidfile):
    time.sleep(0.01)
pid = int(open(pidfile).read())
while open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
    time.sleep(0.01)
"""
"""The job: a child leaves the group (``setsid``), writes its pid, and its main thread
exits; the job ends once the child's ``stat`` shows ``Z``."""

ESCAPEE_BODY = """
import ctypes, os, sys, threading, time
threading.Thread(target=time.sleep, args=(300,), daemon=False).start()
tmp = sys.argv[1] + ".tmp"
with open(tmp, "w") as f:
    f.write(str(os.getpid()))
os.rename(tmp, sys.argv[1])
ctypes.CDLL(None).pthread_exit(None)
"""


def is_zombie_state(pid: int) -> bool:
    st = read_proc_stat(pid)
    return st is not None and st.state == "Z"


@asynccontextmanager
async def leader_exited(marker: str, value: str) -> AsyncIterator[trio.Process]:
    """A process carrying ``marker=value`` whose main thread has exited while a thread runs
    on (its ``stat`` shows ``Z``); SIGKILLed and reaped at exit."""
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-c", LEADER_EXITS],
        env={**os.environ, marker: value},
        start_new_session=True,
    )
    try:
        await wait_until(lambda: is_zombie_state(proc.pid), what="the main thread's exit")
        yield proc
    finally:
        proc.kill()
        await proc.wait()


@pytest.fixture
async def job_id() -> AsyncIterator[str]:
    jid = f"zombie-leader-{uuid.uuid4()}"
    yield jid
    # whatever still carries the id, killed through its pid (the whole thread group)
    for pid in scan_job_marker(jid, ancestor_set(os.getpid())).pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def test_a_leader_that_left_its_threads_running_is_alive_and_found(job_id: str) -> None:
    with trio.fail_after(20):
        async with leader_exited("RC_JOB_ID", job_id) as proc:
            assert other_threads_live(proc.pid)
            st = read_proc_stat(proc.pid)
            assert st is not None
            assert pid_alive(proc.pid)
            assert ident_alive(Ident(proc.pid, st.start))
            assert proc.pid in scan_live_procs(lambda s: s.pid == proc.pid)[0]
            found = await trio.to_thread.run_sync(
                scan_job_marker, job_id, ancestor_set(os.getpid())
            )
            assert found.pids == (proc.pid,)
    assert not pid_alive(proc.pid)


async def test_the_sweep_kills_an_escapee_whose_main_thread_exited(
    job_id: str, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pid"
    spec = JobSpec(
        command=[sys.executable, "-c", ESCAPES_THEN_LEADER_EXITS, str(pidfile), ESCAPEE_BODY],
        env={"RC_JOB_ID": job_id},
        sweep_job_id=job_id,
    )
    with trio.fail_after(30):
        result = await run(spec, BufferSink())
        pid = int(pidfile.read_text())
        assert result.exit_code == 0 and result.err is None, result
        assert pid in result.sweep.found
        assert result.sweep.remaining == ()
        assert not other_threads_live(pid) and not pid_alive(pid)


async def test_the_node_recovery_scan_finds_a_leader_that_left_its_threads_running() -> None:
    """The node's restart sweep looks for its work tag; a tagged process whose main thread
    exited is found through its threads, like any live one."""
    from fleet_trio.node.recovery import TaggedScan

    tag = uuid.uuid4().hex[:12]
    value = f"node-a.{tag}/job-1"
    with trio.fail_after(20):
        async with leader_exited("FLEET_TRIO_SWEEP", value) as proc:
            scan = TaggedScan(tag, marker="FLEET_TRIO_SWEEP")
            found = await trio.to_thread.run_sync(scan, "", frozenset({os.getpid()}))
            assert found.pids == (proc.pid,)
            assert scan.values == {value: {proc.pid}}


async def test_vram_of_a_leader_that_left_its_threads_running_is_the_jobs(job_id: str) -> None:
    """GPU attribution walks a process's ancestry and reads its marker: a leader whose main
    thread exited still holds its VRAM and is still the job's."""
    from fleet_trio.gpu.sampler import attribute, read_process_view

    with trio.fail_after(20):
        async with leader_exited("RC_JOB_ID", job_id) as proc:
            view = read_process_view({proc.pid: 1 << 30}, "RC_JOB_ID")
            assert view.markers[proc.pid] == job_id
            assert attribute(view, proc.pid, None) == {proc.pid}  # its own process group
            assert attribute(view, 0, job_id) == {proc.pid}  # its marker


# -- the rules on a fake /proc: which zombie leader is alive, and how it is read --------------


def fake_stat(pid: int, state: str, flags: int = 0) -> bytes:
    """A ``stat`` line with ``flags`` (field 9) and a start time (field 22) of 1234."""
    fields = [state, "1", str(pid), str(pid), "0", "-1", str(flags)] + ["0"] * 12 + ["1234"]
    return f"{pid} (x) {' '.join(fields)}".encode()


def fake_process(
    proc: Path,
    pid: int,
    *,
    state: str,
    environ: bytes | None,
    threads: dict[int, tuple[str, int, bytes | None]] | None = None,
    flags: int = 0,
) -> None:
    """``<proc>/<pid>``; ``environ=None``: unreadable (a folder: an error other than "gone",
    as EACCES is for a reader that is not root); ``threads``: tid → (state, flags, environ)."""
    d = proc / str(pid)
    (d / "task" / str(pid)).mkdir(parents=True)
    (d / "stat").write_bytes(fake_stat(pid, state, flags))
    if environ is None:
        (d / "environ").mkdir()
    else:
        (d / "environ").write_bytes(environ)
    for tid, (tstate, tflags, tenv) in (threads or {}).items():
        t = d / "task" / str(tid)
        t.mkdir()
        (t / "stat").write_bytes(fake_stat(tid, tstate, tflags))
        if tenv is not None:
            (t / "environ").write_bytes(tenv)


def test_a_process_exiting_as_a_whole_is_not_alive(tmp_path: Path) -> None:
    """``exit_group``: the leader is ``Z`` first while its other threads free the process's
    memory, every one ``PF_EXITING``. That is a process leaving by itself (the supervisor's
    settling wait, not a straggler to kill), unlike a leader whose threads run on."""
    fake_process(tmp_path, 50, state="Z", environ=b"", threads={51: ("R", PF_EXITING, None)})
    fake_process(tmp_path, 60, state="Z", environ=b"", threads={61: ("S", 0, None)})
    fake_process(tmp_path, 70, state="Z", environ=b"", threads={71: ("Z", 0, None)})
    fake_process(tmp_path, 80, state="Z", environ=b"")
    assert other_threads_live(60, str(tmp_path))
    for pid in (50, 70, 80):
        assert not other_threads_live(pid, str(tmp_path)), pid
    dead = ProcStat(pid=50, state="Z", flags=PF_EXITING)
    assert not stat_live(dead, str(tmp_path)) and not dead.exiting


def test_an_unreadable_zombie_leader_is_read_through_its_thread(tmp_path: Path) -> None:
    """When the leader's own ``environ`` cannot be read (EACCES for a reader that is not root:
    the file then belongs to root), the running thread's is read: found, not blind."""
    marker = b"RC_JOB_ID=job-z\0PATH=/bin\0"
    fake_process(tmp_path, 50, state="Z", environ=None, threads={51: ("S", 0, marker)})
    scan = scan_job_marker("job-z", proc=str(tmp_path))
    assert scan.pids == (50,) and not scan.blind
    # its thread cannot be read either: blind, never "gone"
    fake_process(tmp_path, 60, state="Z", environ=None, threads={61: ("S", 0, None)})
    (tmp_path / "60" / "task" / "61" / "environ").mkdir()
    assert scan_job_marker("job-z", proc=str(tmp_path)).blind


def test_a_kernel_thread_is_passed_over_even_when_its_environ_fails(tmp_path: Path) -> None:
    """A kernel thread's ``environ`` fails on some kernels (ESRCH) and is root's (EACCES for
    others): it is never the job's, and must make the scan neither blind nor doubtful (a
    doubtful read costs every scan a second listing of ``/proc``)."""
    fake_process(tmp_path, 2, state="S", environ=None, flags=PF_KTHREAD)
    scan = scan_job_marker("job-k", proc=str(tmp_path))
    assert scan == MarkerScan(scanned=True, settled=True)


def test_a_thread_with_sigkill_pending_is_leaving(tmp_path: Path) -> None:
    """``exit_group`` sends SIGKILL to every other thread; one that has not run since (off its
    CPU, or inside a driver call) shows no ``PF_EXITING`` yet, only the pending SIGKILL."""
    fake_process(tmp_path, 50, state="Z", environ=b"", threads={51: ("R", 0, None)})
    (tmp_path / "50" / "task" / "51" / "status").write_text("Name:\tx\nSigPnd:\t0000000000000100\n")
    assert not other_threads_live(50, str(tmp_path))
    (tmp_path / "50" / "task" / "51" / "status").write_text("Name:\tx\nSigPnd:\t0000000000000002\n")
    assert other_threads_live(50, str(tmp_path))


def test_a_process_leaving_whose_environ_turned_unreadable_is_doubt_not_blind(
    tmp_path: Path,
) -> None:
    """A process that has released its memory on its way out has its files turned root's:
    a reader that is not root gets EACCES. It is leaving, not hidden: doubt, never blind."""
    fake_process(tmp_path, 40, state="R", environ=None, flags=PF_EXITING)
    scan = scan_job_marker("job-x", proc=str(tmp_path))
    assert not scan.blind and scan.pids == ()


def test_an_empty_leader_environ_and_an_unreadable_thread_is_blind(tmp_path: Path) -> None:
    """Where a zombie leader's environ reads empty (some kernels) and its running thread's
    cannot be read, the scan is blind; it does not raise."""
    fake_process(tmp_path, 50, state="Z", environ=b"", threads={51: ("S", 0, None)})
    (tmp_path / "50" / "task" / "51" / "environ").mkdir()
    assert scan_job_marker("job-y", proc=str(tmp_path)).blind
