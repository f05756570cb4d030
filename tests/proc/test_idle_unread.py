"""The idle limit counts output the job wrote but the supervisor has not read yet.

A job's output can sit in its pipe past the idle deadline when the reader is behind: a sink
that applies back-pressure (a slow upload), or an event loop starved of CPU. The job was not
idle, so the limit must not trip; output that stays unread and does not grow is no new output,
so a job that then falls silent still trips. Real processes, each guarded by ``trio.fail_after``.
"""

from __future__ import annotations

import trio

from fleet_trio.proc import JobSpec
from fleet_trio.proc.run import run
from fleet_trio.proc.sinks import BufferSink


class HeldSink:
    """Takes its first write, then holds every later one until ``release`` is set (a sink
    applying back-pressure: the pump stops reading while it waits)."""

    def __init__(self) -> None:
        self.inner = BufferSink()
        self.release = trio.Event()
        self.writes = 0

    async def write(self, data: bytes) -> None:
        self.writes += 1
        if self.writes > 1:
            await self.release.wait()
        await self.inner.write(data)


async def test_output_waiting_in_the_pipe_is_not_idleness() -> None:
    """A line every 0.1 s for 1.2 s against a 0.4 s idle limit, while the sink holds the
    pump for 1 s: the lines wait in the pipe, the job is not idle, and it ends by itself."""
    sink = HeldSink()
    code = "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo $i; sleep 0.1; done"
    spec = JobSpec(command=["sh", "-c", code], idle_timeout=0.4, grace_ceiling=0.5)

    async def release_later() -> None:
        await trio.sleep(1.0)  # the hold under test, not a settle: longer than the limit
        sink.release.set()

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(release_later)
            res = await run(spec, sink)
    assert (res.exit_code, res.killed, res.reason) == (0, False, "")
    assert sink.inner.getvalue().split() == [str(i).encode() for i in range(1, 13)]


async def test_unread_output_that_stops_growing_still_trips() -> None:
    """The sink never lets go and the job writes twice then falls silent: the second line
    waits in the pipe for good, but no more comes, so the idle limit trips."""
    sink = HeldSink()
    spec = JobSpec(
        command=["sh", "-c", "echo a; sleep 0.1; echo b; sleep 30"],
        idle_timeout=0.4,
        grace_ceiling=0.5,
    )
    with trio.fail_after(20):
        res = await run(spec, sink)
    assert (res.killed, res.reason) == (True, "idle: no output for 400ms")


async def test_unread_output_never_postpones_max_runtime() -> None:
    """A job that keeps writing behind a held sink is still stopped at its max_runtime."""
    sink = HeldSink()
    code = "while :; do echo x; sleep 0.05; done"
    spec = JobSpec(command=["sh", "-c", code], max_runtime=0.3, idle_timeout=0.2, grace_ceiling=0.5)
    with trio.fail_after(20):
        res = await run(spec, sink)
    assert (res.killed, res.reason) == (True, "max_runtime exceeded (300ms)")
