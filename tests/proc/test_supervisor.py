"""The one supervisor (issue 13 items 3 and 4): pipe jobs and PTY sessions share it; limits
and stop deadlines are cancel-scope deadlines (nothing polls); a run cut by a caller's cancel
scope still yields its ``Result``. Real processes, each guarded by ``trio.fail_after``."""

from __future__ import annotations

import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from fleet_trio.proc import BufferSink, JobSpec, Result, StopToken
from fleet_trio.proc.procfs import ancestor_set, pid_alive, scan_job_marker
from fleet_trio.proc.pty import start_pty
from fleet_trio.proc.run import run
from fleet_trio.proc.supervisor import REASON_CANCELLED, Supervisor
from fleet_trio.proc.target import GroupTarget, SessionTarget


class StepCounter(trio.abc.Instrument):
    """Counts task steps (every wake-up of every task) while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if self.on:
            self.steps += 1


@pytest.fixture
async def steps() -> AsyncIterator[StepCounter]:
    counter = StepCounter()
    trio.lowlevel.add_instrument(counter)
    try:
        yield counter
    finally:
        trio.lowlevel.remove_instrument(counter)


async def test_armed_limits_do_not_poll(steps: StepCounter) -> None:
    """A silent 2 s job with both limits armed: the supervisor wakes for the end only, about
    12 task steps in all whatever the duration (the 100 ms watchdog it replaced made 34)."""
    spec = JobSpec(command=["sleep", "2"], max_runtime=60, idle_timeout=60)
    with trio.fail_after(10):
        steps.on = True
        res = await run(spec, BufferSink())
        steps.on = False
    assert (res.exit_code, res.killed) == (0, False)
    assert steps.steps < 20, steps.steps


class TimedSink(BufferSink):
    """Keeps the output and when its last chunk arrived."""

    last = 0.0

    async def write(self, data: bytes) -> None:
        self.last = trio.current_time()
        await super().write(data)


async def test_idle_deadline_moves_with_output_then_trips() -> None:
    """Output every 100 ms for ~2 s (longer than the 1.5 s idle limit; a gap of 1.4 s would
    have to come from a stalled machine), then silence: the limit trips only once the silence
    has lasted it, with the exact reason."""
    code = "for i in $(seq 20); do echo $i; sleep 0.1; done; sleep 30"
    spec = JobSpec(command=["sh", "-c", code], idle_timeout=1.5, grace_ceiling=0.5)
    sink = TimedSink()
    stops: list[float] = []
    with trio.fail_after(20):
        res = await run(spec, sink, on_spawn=lambda pid: stops.append(trio.current_time()))
    end = trio.current_time()
    assert res.killed and res.reason == "idle: no output for 1.5s"
    assert sink.getvalue().split() == [str(i).encode() for i in range(1, 21)]
    assert sink.last - stops[0] > 1.5  # output outlived one idle period: the deadline moved
    assert end - sink.last > 1.4  # and the limit tripped only after a (nearly) whole silent one


async def test_max_runtime_is_a_scope_deadline() -> None:
    spec = JobSpec(command=["sleep", "30"], max_runtime=0.3, grace_ceiling=0.5)
    start = trio.current_time()
    with trio.fail_after(10):
        res = await run(spec, BufferSink())
    assert res.killed and res.reason == "max_runtime exceeded (300ms)"
    assert trio.current_time() - start >= 0.3


async def test_a_stop_token_deadline_is_a_stop_with_a_result() -> None:
    stop = StopToken.after(0.2)
    with trio.fail_after(10):
        res = await run(JobSpec(command=["sleep", "30"], grace_ceiling=0.5), BufferSink(), stop)
    assert (res.killed, res.reason) == (True, REASON_CANCELLED)


async def test_a_run_cut_by_a_cancel_scope_records_its_result() -> None:
    """A caller's budget scope: the same teardown as a stop, the Result handed to ``record``,
    ``Cancelled`` caught by the caller's scope."""
    kept: list[Result] = []
    spawned: list[int] = []
    with trio.fail_after(10):
        with trio.move_on_after(0.2) as budget:
            await run(
                JobSpec(command=["sleep", "30"], grace_ceiling=0.5),
                BufferSink(),
                record=kept.append,
                on_spawn=spawned.append,
            )
            pytest.fail("run returned inside a cancelled scope")
    assert budget.cancelled_caught
    assert len(kept) == 1
    assert (kept[0].killed, kept[0].reason, kept[0].exit_code) == (True, REASON_CANCELLED, 143)
    assert not pid_alive(spawned[0])


async def test_record_gets_start_errors_too() -> None:
    kept: list[Result] = []
    res = await run(JobSpec(command=["/nonexistent/x"]), BufferSink(), record=kept.append)
    assert kept == [res] and res.err is not None


async def test_pipe_jobs_and_pty_sessions_share_the_supervisor() -> None:
    with trio.fail_after(10):
        session = await start_pty(JobSpec(command=["sh", "-c", "exit 3"]))
        async with session:
            sup = session._sup
            assert isinstance(sup, Supervisor)
            assert isinstance(sup.target, SessionTarget)
            res = await session.wait()
    assert res.exit_code == 3
    # and the pipe side builds the same class on a group target
    seen: list[Supervisor] = []
    orig = Supervisor.supervise

    async def spy(self: Supervisor, *a: object, **kw: object) -> Result:
        seen.append(self)
        return await orig(self, *a, **kw)  # type: ignore[arg-type]

    Supervisor.supervise = spy  # type: ignore[method-assign]
    try:
        await run(JobSpec(command=["true"]), BufferSink())
    finally:
        Supervisor.supervise = orig  # type: ignore[method-assign]
    assert len(seen) == 1 and isinstance(seen[0].target, GroupTarget)


async def test_pty_sweep_honours_the_marker_name(tmp_path: Path) -> None:
    """Drift fixed by the one supervisor: a PTY job's sweep used RC_JOB_ID whatever
    ``sweep_marker`` said (the node's jobs carry FLEET_JOB_ID)."""
    job = f"pty-marker-{uuid.uuid4()}"
    pidfile = tmp_path / "pid"
    code = (
        f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 300' >/dev/null 2>&1 </dev/null & "
        f"while [ ! -s {pidfile} ]; do sleep 0.01; done; exit 0"
    )
    spec = JobSpec(
        command=["sh", "-c", code],
        env={"FLEET_JOB_ID": job},
        sweep_job_id=job,
        sweep_marker="FLEET_JOB_ID",
    )
    try:
        with trio.fail_after(20):
            async with await start_pty(spec) as session:
                res = await session.wait()
        escapee = int(pidfile.read_text())
        assert escapee in res.sweep.found and res.sweep.remaining == ()
        assert not pid_alive(escapee)
    finally:
        scan = scan_job_marker(job, ancestor_set(os.getpid()), key=b"FLEET_JOB_ID=")
        for pid in scan.pids:
            os.kill(pid, signal.SIGKILL)


async def test_a_member_that_closes_its_output_just_before_exiting_is_no_straggler() -> None:
    """A process that closes stdout/stderr in user space and exits a moment later (as
    coreutils' ``close_stdout`` does) completes the job while it still runs: it must get a
    moment to exit by itself instead of being SIGKILLed and reported as a straggler."""
    code = "import os, time; os.close(1); os.close(2); time.sleep(0.01); os._exit(0)"
    child = f"{sys.executable} -c '{code}'"
    with trio.fail_after(20):
        for _ in range(5):
            res = await run(JobSpec(command=["sh", "-c", f"{child} & exit 0"]), BufferSink())
            assert (res.exit_code, res.killed, res.reason) == (0, False, "")


async def test_a_live_straggler_is_still_reaped_after_the_settle_moment() -> None:
    sink = BufferSink()
    script = "(exec sleep 300 >/dev/null 2>&1) & echo child:$!; exit 0"
    with trio.fail_after(15):
        res = await run(JobSpec(command=["sh", "-c", script]), sink)
    assert (res.killed, res.reason) == (True, "stragglers reaped after exit")
    pid = int(sink.text().split("child:")[1].split()[0])
    assert not pid_alive(pid)
