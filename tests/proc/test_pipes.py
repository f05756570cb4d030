"""The pump's pipe growth for fast writers (``fleet_trio.proc.run.grow_pipe``) and its
pipe read (``fleet_trio.proc.supervisor.read_some``)."""

from __future__ import annotations

import fcntl
import os
import sys

import pytest
import trio
import trio.testing

from fleet_trio import proc
from fleet_trio.proc.run import PIPE_SIZE, READ_CHUNK, grow_pipe
from fleet_trio.proc.sinks import Sink
from fleet_trio.proc.supervisor import read_some

PY = sys.executable


async def test_grow_pipe_asks_for_a_larger_buffer() -> None:
    r, w = os.pipe()
    os.close(w)
    stream = trio.lowlevel.FdStream(r)
    try:
        size = grow_pipe(stream)
        assert size in (READ_CHUNK, PIPE_SIZE)  # refused → the default read size
        if size == PIPE_SIZE:
            assert fcntl.fcntl(r, fcntl.F_GETPIPE_SZ) == PIPE_SIZE
    finally:
        await stream.aclose()


class Counting(Sink):
    def __init__(self) -> None:
        self.chunks: list[int] = []

    async def write(self, data: bytes) -> None:
        self.chunks.append(len(data))
        await trio.lowlevel.checkpoint()


async def test_a_fast_writer_is_read_in_larger_pieces_and_nothing_is_lost() -> None:
    n = 32 << 20
    code = (
        "import os, sys\n"
        f"n = {n}\n"
        "block = b'x' * 65536\n"
        "while n:\n"
        "    n -= os.write(1, block[: min(n, 65536)])\n"
    )
    sink = Counting()
    with trio.fail_after(30):
        result = await proc.run(proc.JobSpec(command=[PY, "-c", code]), sink)
    assert result.exit_code == 0
    assert sum(sink.chunks) == n
    # reads start at the default pipe size; after a full read the pump may take up to
    # PIPE_SIZE at once (whether it does depends on who is faster), never more
    assert sink.chunks[0] <= READ_CHUNK
    assert max(sink.chunks) <= PIPE_SIZE


async def test_read_some_returns_data_eof_and_refuses_a_closed_pipe() -> None:
    """The pump's pipe read: data in order, ``b""`` at EOF, ``ClosedResourceError`` after a
    close (even one that happens while the read waits)."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    stream = trio.lowlevel.FdStream(r)
    with trio.fail_after(10):
        os.write(w, b"ready\n")
        assert await read_some(stream, 100) == b"ready\n"  # found at once
        async with trio.open_nursery() as nursery:
            got: list[bytes] = []

            async def reader() -> None:
                got.append(bytes(await read_some(stream, 100)))

            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            assert got == []  # it waits for data
            os.write(w, b"later\n")
        assert got == [b"later\n"]
        os.close(w)
        assert await read_some(stream, 100) == b""
        stream.close()
        with pytest.raises(trio.ClosedResourceError):
            await read_some(stream, 100)


async def test_read_some_cancelled_before_reading_loses_nothing() -> None:
    r, w = os.pipe()
    stream = trio.lowlevel.FdStream(r)
    try:
        os.write(w, b"kept")
        with trio.CancelScope() as scope:
            scope.cancel()
            await read_some(stream, 100)
        assert scope.cancelled_caught
        with trio.fail_after(10):
            assert await read_some(stream, 100) == b"kept"
    finally:
        os.close(w)
        await stream.aclose()


async def test_read_some_yields_after_a_read_that_did_not_wait() -> None:
    """A writer that is always ahead cannot starve the loop: every such read yields."""
    r, w = os.pipe()
    stream = trio.lowlevel.FdStream(r)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.lowlevel.checkpoint()

    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ticker)
                before = ticks
                reads = 20
                for _ in range(reads):
                    os.write(w, b"x")
                    assert await read_some(stream, 100) == b"x"
                # every read let the ticker run once; trio's scheduler may order the last
                # batch either way, so the last turn may not have been counted yet
                assert ticks - before >= reads - 1
                nursery.cancel_scope.cancel()
    finally:
        os.close(w)
        await stream.aclose()
