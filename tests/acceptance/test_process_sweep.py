"""worker-process.md §11, S — the RC_JOB_ID sweep (items 21–24, 26–30). Real processes.

Item 25 needs the whole worker against a fake controller and lives with the worker tests.
Every process a test starts carries a fresh job id; the ``job_id`` fixture SIGKILLs whatever
still carries it at teardown. "Gone" means ``/proc/<pid>/stat`` is missing or shows ``Z``
(an escapee reparented to a PID 1 that does not reap stays a zombie).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from fleet_trio.proc import BufferSink, JobSpec, Result, SweepReport
from fleet_trio.proc.procfs import (
    MarkerScan,
    ancestor_set,
    pid_alive,
    read_proc_stat,
    scan_job_marker,
)
from fleet_trio.proc.run import run
from fleet_trio.proc.sweep import sweep_job_survivors
from tests.helpers import gone_within, quiet_for, wait_until

ESCAPEE = (
    "setsid sh -c 'echo $$ > {pidfile}; exec sleep 300' >/dev/null 2>&1 & "
    "while [ ! -s {pidfile} ]; do sleep 0.01; done; exit 0"
)
DOUBLE_FORK = (
    "( setsid sh -c 'echo $$ > {pidfile}; exec sleep 300' >/dev/null 2>&1 & ) ; "
    "while [ ! -s {pidfile} ]; do sleep 0.01; done; exit 0"
)


def marked_pids(job_id: str) -> tuple[int, ...]:
    """Live processes (outside our ancestry) whose RC_JOB_ID equals ``job_id``."""
    return scan_job_marker(job_id, ancestor_set(os.getpid())).pids


async def kill_marked(job_id: str) -> None:
    def none_left() -> bool:
        pids = marked_pids(job_id)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        return not pids

    await wait_until(none_left, timeout=5, interval=0.02, what=f"no process marked {job_id}")


@pytest.fixture
async def job_id() -> AsyncIterator[str]:
    jid = f"sweep-test-{uuid.uuid4()}"
    try:
        yield jid
    finally:
        with trio.move_on_after(5, shield=True):
            await kill_marked(jid)
            await kill_marked(jid + "-later")
            await kill_marked(jid[:-3])


def marked_env(value: str) -> dict[str, str]:
    return {**os.environ, "RC_JOB_ID": value}


def read_pid(pidfile: Path) -> int:
    return int(pidfile.read_text().strip())


async def start_escapee(job: str, pidfile: Path, shape: str = ESCAPEE) -> int:
    """Run the escapee job shell (not through ``run``) and return the escaped pid."""
    await trio.run_process(["sh", "-c", shape.format(pidfile=pidfile)], env=marked_env(job))
    return read_pid(pidfile)


async def run_escapee_job(job: str, pidfile: Path, *, sweep: bool) -> tuple[Result, int]:
    spec = JobSpec(
        command=["sh", "-c", ESCAPEE.format(pidfile=pidfile)],
        env={"RC_JOB_ID": job},
        sweep_job_id=job if sweep else "",
    )
    result = await run(spec, BufferSink())
    return result, read_pid(pidfile)


async def test_process_021_escapee_survives_without_sweep(job_id: str, tmp_path: Path) -> None:
    with trio.fail_after(20):
        res, pid = await run_escapee_job(job_id, tmp_path / "pid", sweep=False)
        assert res.err is None
        assert res.exit_code == 0
        assert pid_alive(pid)
        st = read_proc_stat(pid)
        assert st is not None
        assert st.pgid == st.sid == pid


async def test_process_022_sweep_reaps_a_setsid_escapee(job_id: str, tmp_path: Path) -> None:
    with trio.fail_after(20):
        res, pid = await run_escapee_job(job_id, tmp_path / "pid", sweep=True)
        assert res.err is None
        assert res.exit_code == 0
        assert pid in res.sweep.found
        assert res.sweep.remaining == ()
        assert not pid_alive(pid)  # gone (or a zombie) when run returns


async def test_process_023_successful_job_with_a_detached_survivor_is_still_successful(
    job_id: str, tmp_path: Path
) -> None:
    with trio.fail_after(20):
        res, _pid = await run_escapee_job(job_id, tmp_path / "pid", sweep=True)
        assert res.killed is False
        assert res.reason == ""
        assert res.exit_code == 0
        assert res.err is None
        assert res.sweep.found


async def test_process_024_sweep_leaves_other_jobs_alone(job_id: str, tmp_path: Path) -> None:
    with trio.fail_after(20):
        later = await trio.lowlevel.open_process(
            ["sleep", "300"], env=marked_env(job_id + "-later"), process_group=0
        )
        prefix = await trio.lowlevel.open_process(
            ["sleep", "300"], env=marked_env(job_id[:-3]), process_group=0
        )
        try:
            res, pid = await run_escapee_job(job_id, tmp_path / "pid", sweep=True)
            assert not pid_alive(pid)
            assert pid_alive(later.pid)
            assert pid_alive(prefix.pid)
            found = res.sweep.found
            assert later.pid not in found
            assert prefix.pid not in found
        finally:
            for p in (later, prefix):
                p.kill()
                await p.wait()


async def test_process_026_sweep_never_kills_itself_or_its_ancestors(job_id: str) -> None:
    with trio.fail_after(20):
        shell = await trio.lowlevel.open_process(
            ["sh", "-c", "sleep 300 & echo $!; wait"],
            env=marked_env(job_id),
            stdout=subprocess.PIPE,
            process_group=0,
        )
        victim = await trio.lowlevel.open_process(
            ["sleep", "300"], env=marked_env(job_id), start_new_session=True
        )
        try:
            assert shell.stdout is not None
            line = b""
            while not line.endswith(b"\n"):
                line += await shell.stdout.receive_some(64)
            me = int(line)  # the marked child plays the worker ("self")
            rep = await sweep_job_survivors(job_id, me)
            assert pid_alive(me)
            assert pid_alive(shell.pid)
            assert me not in rep.found
            assert shell.pid not in rep.found
            assert victim.pid in rep.found
            assert not pid_alive(victim.pid)
            assert rep.remaining == ()
        finally:
            shell.kill()
            await shell.wait()
            await victim.wait()


@asynccontextmanager
async def term_ignoring_loop(job_id: str, body: str) -> AsyncIterator[trio.Process]:
    """A shell marked with ``job_id``, in a session of its own, that ignores SIGTERM and runs
    ``body`` in a loop; SIGKILLed and reaped at the end of the block."""
    loop = await trio.lowlevel.open_process(
        ["sh", "-c", f'trap "" TERM; while :; do {body}; done'],
        env=marked_env(job_id),
        start_new_session=True,
    )
    try:
        # a SIGTERM that came before the trap would kill the shell at once (seen under load):
        # the loop's first child shows the trap is set
        await wait_until(lambda: len(marked_pids(job_id)) >= 2, what="the loop runs")
        yield loop
    finally:
        loop.kill()
        with trio.CancelScope(shield=True):
            await loop.wait()


async def test_process_027_sweep_escalates_to_sigkill_when_sigterm_is_ignored(
    job_id: str,
) -> None:
    with trio.fail_after(20):
        async with term_ignoring_loop(job_id, "sleep 0.05") as loop:
            start = trio.current_time()
            rep = await sweep_job_survivors(job_id, os.getpid())
            elapsed = trio.current_time() - start
            assert loop.pid in rep.found
            assert elapsed >= 2.0
            assert not pid_alive(loop.pid)
            assert rep.remaining == ()
            # Its forked children are gone too (a child killed mid-exit may still read for a
            # moment; wait on the fact, bounded).
            await wait_until(lambda: marked_pids(job_id) == (), what="no marked process left")


@pytest.mark.skipif(os.geteuid() == 0, reason="non-root only: root can read every environ")
async def test_process_028_sweep_does_not_claim_a_clean_box_when_blind() -> None:
    with trio.fail_after(20):
        rep = await sweep_job_survivors(f"fresh-{uuid.uuid4()}", os.getpid())
    assert rep.scanned is True
    assert rep.found == ()
    assert rep.blind is True
    assert rep.clean() is False


async def test_process_029_sweep_with_no_job_id_sweeps_nothing(job_id: str) -> None:
    with trio.fail_after(20):
        empty = await trio.lowlevel.open_process(
            ["sleep", "300"], env=marked_env(""), process_group=0
        )
        plain_env = {k: v for k, v in os.environ.items() if k != "RC_JOB_ID"}
        plain = await trio.lowlevel.open_process(["sleep", "300"], env=plain_env, process_group=0)
        try:
            rep = await sweep_job_survivors("", os.getpid())
            assert rep.found == ()
            assert rep.scanned is False
            assert rep == SweepReport()
            await quiet_for(0.05, reason="the sweep with no job id signalled nothing")
            assert pid_alive(empty.pid)
            assert pid_alive(plain.pid)
        finally:
            for p in (empty, plain):
                p.kill()
                await p.wait()


def test_process_030_sweep_report_clean() -> None:
    assert SweepReport(scanned=True, blind=False, remaining=()).clean() is True
    assert SweepReport(scanned=True, blind=False, remaining=(), found=(7,)).clean() is True
    assert SweepReport(scanned=True, blind=True, remaining=()).clean() is False
    assert SweepReport(scanned=True, blind=False, remaining=(7,)).clean() is False
    assert SweepReport(scanned=False, blind=False, remaining=()).clean() is False
    assert SweepReport().clean() is False


# ------------------------------------------------------------------ beyond the checklist


async def test_sweep_reaps_a_double_fork_escapee(job_id: str, tmp_path: Path) -> None:
    with trio.fail_after(20):
        pid = await start_escapee(job_id, tmp_path / "pid", DOUBLE_FORK)
        st = read_proc_stat(pid)
        assert st is not None and st.sid == pid  # left our session
        assert pid_alive(pid)
        rep = await sweep_job_survivors(job_id, os.getpid())
        assert pid in rep.found
        assert rep.remaining == ()
        assert rep.clean()
        assert not pid_alive(pid)


async def test_sweep_kills_escapees_forked_while_it_runs(job_id: str) -> None:
    """A TERM-ignoring setsid'd loop forks a marked, TERM-ignoring ``sleep 300`` every 10 ms
    for the whole sweep: every one of them is gone at the end and nothing remains."""
    with trio.fail_after(20):
        async with term_ignoring_loop(job_id, "sleep 300 & sleep 0.01") as loop:
            await wait_until(lambda: not (len(marked_pids(job_id)) < 5))
            rep = await sweep_job_survivors(job_id, os.getpid(), grace=0.3)
            assert loop.pid in rep.found
            assert rep.remaining == ()
            assert rep.clean()
            assert not pid_alive(loop.pid)
            assert marked_pids(job_id) == ()


async def test_sweep_matches_the_exact_id_only(job_id: str) -> None:
    with trio.fail_after(20):
        procs = [
            await trio.lowlevel.open_process(["sleep", "300"], env=marked_env(value))
            for value in (job_id, job_id + "-later", job_id[:-3], "x" + job_id)
        ]
        try:
            rep = await sweep_job_survivors(job_id, os.getpid())
            assert rep.found == (procs[0].pid,)
            assert not pid_alive(procs[0].pid)
            assert all(pid_alive(p.pid) for p in procs[1:])
        finally:
            for p in procs:
                p.kill()
                await p.wait()


async def test_sweep_for_a_fresh_id_is_one_scan() -> None:
    calls: list[MarkerScan] = []

    def counting(job: str, protected: frozenset[int]) -> MarkerScan:
        res = scan_job_marker(job, protected)
        calls.append(res)
        return res

    with trio.fail_after(20):
        rep = await sweep_job_survivors(f"fresh-{uuid.uuid4()}", os.getpid(), scan=counting)
    assert rep.scanned is True
    assert rep.found == ()
    assert rep.remaining == ()
    assert len(calls) == 1
    if os.geteuid() == 0:
        assert rep.clean()


async def test_sweep_runs_python_children_too(job_id: str) -> None:
    """A marked escapee that is a Python interpreter (not a shell) is found and killed."""
    with trio.fail_after(20):
        child = await trio.lowlevel.open_process(
            [sys.executable, "-c", "import time; time.sleep(300)"],
            env=marked_env(job_id),
            start_new_session=True,
        )
        try:
            rep = await sweep_job_survivors(job_id, os.getpid())
            assert rep.found == (child.pid,)
            assert await gone_within(child.pid, 1)
        finally:
            child.kill()
            await child.wait()


async def test_sweep_catches_a_process_right_after_spawn(job_id: str) -> None:
    """``open_process`` returns while the child is still inside ``execve``, when its environ
    reads empty for a moment; the sweep must find it anyway."""
    with trio.fail_after(20):
        for _ in range(20):
            child = await trio.lowlevel.open_process(
                ["sleep", "300"], env=marked_env(job_id), start_new_session=True
            )
            try:
                rep = await sweep_job_survivors(job_id, os.getpid())
                assert rep.found == (child.pid,)
            finally:
                child.kill()
                await child.wait()


# ------------------------------------------------------------------------ sweep honesty

HONESTY_RUNS = 200
HONESTY_BATCH = 4
# The escapee drops its marker and re-execs: a scan may see it with the marker (then it must be
# signalled and verified gone) or only after the exec (then the sweep cannot attribute it).
UNMARKING = (
    "setsid sh -c 'sleep {delay}; unset RC_JOB_ID; exec sleep {nap}' >/dev/null 2>&1 & exit 0"
)
UNMARK_DELAYS = ("0", "0", "0.01", "0.05")
"""How long the escapee keeps its marker: the issue's case (``sleep 0``) in most runs, and a few
that keep it long enough for a loaded machine's sweep to see it (so the case is exercised)."""


def cmdline_pids(token: bytes) -> list[int]:
    """Live processes whose command line contains ``token``."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if token in f.read():
                    out.append(int(name))
        except OSError:
            continue
    return out


def alive_with(pid: int, token: bytes) -> bool:
    """``pid`` is alive and is still our escapee (its command line holds ``token``)."""
    if not pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return token in f.read()
    except OSError:
        return False


async def test_sweep_never_reports_an_alive_pid_as_reaped() -> None:
    """Issue 13 acceptance: the unmarking escapee, 200 runs, never an alive pid as reaped."""
    nap = f"4001.{uuid.uuid4().int % 10**6:06d}"
    token = b"sleep\0" + nap.encode()
    lies: list[tuple[int, SweepReport]] = []
    attributed = 0

    async def one(i: int) -> None:
        nonlocal attributed
        job = f"honest-{uuid.uuid4()}"
        spec = JobSpec(
            command=["sh", "-c", UNMARKING.format(nap=nap, delay=UNMARK_DELAYS[i % 4])],
            env={"RC_JOB_ID": job},
            sweep_job_id=job,
        )
        res = await run(spec, BufferSink())
        rep = res.sweep
        assert res.exit_code == 0 and rep.scanned
        if rep.found:
            attributed += 1
        for pid in rep.found:
            if pid not in rep.remaining and alive_with(pid, token):
                lies.append((pid, rep))
        if rep.remaining:
            assert not rep.clean()

    try:
        with trio.fail_after(120):
            for start in range(0, HONESTY_RUNS, HONESTY_BATCH):
                async with trio.open_nursery() as nursery:
                    for i in range(start, min(start + HONESTY_BATCH, HONESTY_RUNS)):
                        nursery.start_soon(one, i)
    finally:
        for pid in cmdline_pids(token):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    assert lies == []
    assert attributed > 0  # the case was exercised: some runs saw the marked escapee
