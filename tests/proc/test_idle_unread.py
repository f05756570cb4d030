"""The idle limit and output that waits in the pipe.

On a starved event loop (a busy machine) a job's output and its idle deadline can come due
together, and the deadline can win: the job wrote in time, but no reader had had its turn. The
supervisor then lets the reader take what waits before it judges, on both ways of reading
(inline and pump task). A reader held inside its sink's ``write`` (back-pressure) is not late:
rc's idle clock counts reads, so that job still trips. Real processes, each guarded by
``trio.fail_after``.
"""

from __future__ import annotations

import time

import pytest
import trio

from fleet_trio.proc import JobSpec
from fleet_trio.proc.run import run
from fleet_trio.proc.sinks import BufferSink


class InlineSink(BufferSink):
    """Records output and says when the first chunk came (``never_blocks``: read inline)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = trio.Event()

    async def write(self, data: bytes) -> None:
        await super().write(data)
        self.first.set()


class TaskSink(InlineSink):
    """The same, read by a pump task (its ``write`` may block)."""

    never_blocks = False


class HeldSink:
    """Takes its first write, then holds every later one for good (back-pressure)."""

    def __init__(self) -> None:
        self.inner = BufferSink()
        self.writes = 0

    async def write(self, data: bytes) -> None:
        self.writes += 1
        if self.writes > 1:
            await trio.sleep_forever()
        await self.inner.write(data)


@pytest.mark.parametrize("sink_type", [InlineSink, TaskSink], ids=["inline", "task"])
async def test_output_that_waited_out_a_starved_loop_is_not_idleness(
    sink_type: type[InlineSink],
) -> None:
    """Lines 0.2–0.4 s apart against a 0.6 s idle limit; right after the first, the event
    loop is blocked for 0.8 s (a starved worker): two lines wait in the pipe when the idle
    deadline is found passed. The job was never idle and ends by itself."""
    sink = sink_type()
    code = "echo a; sleep 0.2; echo b; sleep 0.4; echo c; sleep 0.4; echo d"
    spec = JobSpec(command=["sh", "-c", code], idle_timeout=0.6, grace_ceiling=0.5)

    async def starve() -> None:
        await sink.first.wait()
        time.sleep(0.8)  # blocks the event loop on purpose: the starvation under test

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(starve)
            res = await run(spec, sink)
    assert (res.exit_code, res.killed, res.reason) == (0, False, "")
    assert sink.getvalue().split() == [b"a", b"b", b"c", b"d"]


async def test_a_reader_held_by_its_sink_still_trips_the_idle_limit() -> None:
    """The job keeps writing, but the sink holds the reader: the output waits unread, and as
    in rc (whose idle clock counts reads) the idle limit trips."""
    sink = HeldSink()
    spec = JobSpec(
        command=["sh", "-c", "while :; do echo x; sleep 0.05; done"],
        idle_timeout=0.4,
        grace_ceiling=0.5,
    )
    with trio.fail_after(20):
        res = await run(spec, sink)
    assert (res.killed, res.reason) == (True, "idle: no output for 400ms")
    assert sink.inner.getvalue() == b"x\n"
