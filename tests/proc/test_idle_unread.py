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
from pathlib import Path

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


IDLE = 1.5
"""The idle limit of the starved job."""
STARVED = IDLE + 0.5
"""How long the event loop stays blocked after the job's first line was read: past the idle
deadline by a margin."""


@pytest.mark.parametrize("sink_type", [InlineSink, TaskSink], ids=["inline", "task"])
async def test_output_that_waited_out_a_starved_loop_is_not_idleness(
    sink_type: type[InlineSink], tmp_path: Path
) -> None:
    """Right after the job's first line is read, the event loop is blocked (a starved worker)
    until the job has written a second line (``wrote_b``) and the idle deadline has passed:
    that line waits in the pipe when the deadline is found passed. The job was never idle: its
    last line comes as soon as the loop runs again (``go``), and it ends by itself. Each step
    waits on a file, so no output gap depends on how fast the machine is."""
    sink = sink_type()
    read_a, wrote_b, go = tmp_path / "read_a", tmp_path / "wrote_b", tmp_path / "go"

    def sh_awaits(path: Path) -> str:  # the shell loop that waits for the file
        return f'until [ -e "{path}" ]; do sleep 0.05; done'

    code = f'echo a; {sh_awaits(read_a)}; echo b; : > "{wrote_b}"; {sh_awaits(go)}; echo c'
    spec = JobSpec(command=["sh", "-c", code], idle_timeout=IDLE, grace_ceiling=0.5)

    async def starve() -> None:
        await sink.first.wait()
        read_at = time.monotonic()
        read_a.touch()
        # blocks the event loop on purpose: the starvation under test
        while not wrote_b.exists() or time.monotonic() - read_at < STARVED:
            assert time.monotonic() - read_at < 20, "the job never wrote its second line"
            time.sleep(0.01)
        go.touch()

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(starve)
            res = await run(spec, sink)
    assert (res.exit_code, res.killed, res.reason) == (0, False, "")
    assert sink.getvalue().split() == [b"a", b"b", b"c"]


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
