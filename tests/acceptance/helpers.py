"""Helpers for the acceptance tests: watch a job's output, stop it, check pids are gone."""

from __future__ import annotations

import re

import trio

from fleet_trio.proc import BufferSink, StopToken
from fleet_trio.proc.procfs import pid_alive


class PidWatcher:
    """A sink that records output and wakes waiters once a ``child:<pid>`` line appears."""

    def __init__(self, inner: BufferSink) -> None:
        self.inner = inner
        self.seen = trio.Event()
        self._pid: int | None = None

    async def write(self, data: bytes) -> None:
        await self.inner.write(data)
        if self._pid is None:
            m = re.search(r"child:(\d+)", self.inner.text())
            if m:
                self._pid = int(m.group(1))
                self.seen.set()

    def pid(self) -> int:
        assert self._pid is not None, "the job never printed child:<pid>"
        return self._pid


async def stop_when_output(watcher: PidWatcher, stop: StopToken) -> None:
    await watcher.seen.wait()
    stop.set()


async def stop_after(stop: StopToken, seconds: float) -> None:
    await trio.sleep(seconds)
    stop.set()


async def gone_within(pid: int, seconds: float) -> bool:
    """True once ``pid`` is gone or a zombie, polling for at most ``seconds``."""
    with trio.move_on_after(seconds):
        while pid_alive(pid):
            await trio.sleep(0.02)
        return True
    return not pid_alive(pid)
