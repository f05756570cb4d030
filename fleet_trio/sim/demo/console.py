"""The demo's terminal: lines to our stdout in order, through a thread, optionally coloured."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import AsyncIterator
from typing import Any

import trio

COLOURS = {
    "bold": "1",
    "dim": "2",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "blue": "34",
    "magenta": "35",
    "cyan": "36",
}
TAIL_COLOURS = ("cyan", "magenta", "blue", "yellow", "green")


def want_colour(stream: Any) -> bool:
    """Colours only on a terminal (and not with ``NO_COLOR`` or ``TERM=dumb``)."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class Console:
    """Lines to our stdout, written in order by one task (writes go through a thread, so a
    slow terminal never blocks the event loop). ``say`` never blocks and never fails."""

    def __init__(self, fd: int, *, colour: bool) -> None:
        self.fd = fd
        self.colour = colour
        self.started = trio.current_time()
        self.broken = False
        send, recv = trio.open_memory_channel[bytes](math.inf)
        self._send = send
        self._recv = recv

    def paint(self, text: str, *styles: str) -> str:
        if not self.colour or not styles:
            return text
        codes = ";".join(COLOURS[s] for s in styles)
        return f"\x1b[{codes}m{text}\x1b[0m"

    def elapsed(self) -> float:
        return trio.current_time() - self.started

    def say(self, text: str = "") -> None:
        with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
            self._send.send_nowait((text + "\n").encode("utf-8", errors="replace"))

    def close(self) -> None:
        self._send.close()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        limiter = trio.CapacityLimiter(1)
        task_status.started()
        async with self._recv:
            async for data in self._recv:
                batch = [data]
                while True:
                    try:
                        batch.append(self._recv.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                if self.broken:
                    continue
                try:
                    await trio.to_thread.run_sync(
                        _write_all, self.fd, b"".join(batch), limiter=limiter
                    )
                except OSError:
                    self.broken = True  # our reader went away: the fleet still shuts down


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


@contextlib.asynccontextmanager
async def open_console(fd: int, *, colour: bool) -> AsyncIterator[Console]:
    """A :class:`Console` whose last line is written before this block is left."""
    con = Console(fd, colour=colour)
    async with trio.open_nursery() as nursery:
        await nursery.start(con.serve)
        try:
            yield con
        finally:
            con.close()
