"""The pump's pipe growth for fast writers (``fleet_trio.proc.run.grow_pipe``)."""

from __future__ import annotations

import fcntl
import os
import sys

import trio

from fleet_trio import proc
from fleet_trio.proc.run import PIPE_SIZE, READ_CHUNK, grow_pipe
from fleet_trio.proc.sinks import Sink

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
