"""worker-process.md §11, W — watchdogs (items 17–20). Real processes, real time."""

from __future__ import annotations

import trio

from fleet_trio.proc import BufferSink, JobSpec
from fleet_trio.proc.run import run


async def test_process_017_max_runtime_watchdog_kills_a_long_job() -> None:
    with trio.fail_after(10):
        res = await run(
            JobSpec(command=["sh", "-c", "sleep 60"], max_runtime=0.5, grace_ceiling=0.5),
            BufferSink(),
        )
    assert res.killed is True
    assert "max_runtime" in res.reason
    assert res.reason == "max_runtime exceeded (500ms)"


async def test_process_018_idle_watchdog_kills_a_silent_job() -> None:
    sink = BufferSink()
    with trio.fail_after(10):
        res = await run(
            JobSpec(
                command=["sh", "-c", "echo starting; sleep 60"], idle_timeout=0.7, grace_ceiling=0.5
            ),
            sink,
        )
    assert res.killed is True
    assert "idle" in res.reason
    assert res.reason == "idle: no output for 700ms"
    assert "starting" in sink.text()


async def test_process_019_chatty_job_is_not_tripped_by_idle_watchdog() -> None:
    script = "for i in 1 2 3 4 5 6; do echo tick; sleep 0.2; done"
    with trio.fail_after(10):
        res = await run(JobSpec(command=["sh", "-c", script], idle_timeout=0.7), BufferSink())
    assert res.killed is False
    assert res.exit_code == 0


async def test_process_020_no_watchdogs_means_no_limit() -> None:
    sink = BufferSink()
    with trio.fail_after(10):
        res = await run(JobSpec(command=["sh", "-c", "sleep 0.3; echo done"]), sink)
    assert res.killed is False
    assert res.exit_code == 0
    assert "done" in sink.text()
