"""Where a process's output goes: the sink protocol and the buffers everyone reuses."""

from __future__ import annotations

from collections import deque
from typing import Protocol, runtime_checkable

STREAM_CAP = 65536
"""Probe, verify and script stdout/stderr cap (bytes, each)."""


@runtime_checkable
class Sink(Protocol):
    """An async byte writer. ``run`` awaits it, so a slow sink slows the pump (back-pressure)."""

    async def write(self, data: bytes) -> None:
        """Take ``data``.

        Cancellation: the supervisor's pumps run shielded and are only cancelled at teardown;
        a sink that may block must bound itself (the buffers here never block).

        A sink whose ``write`` never awaits may say so with a class attribute
        ``never_blocks = True`` (the buffers here do): the supervisor then reads a lone
        output pipe into it from its own task, without a pump task. A sink that says so
        and awaits breaks stop requests and deadlines.
        """
        ...


class NullSink:
    """Discards everything."""

    never_blocks = True

    async def write(self, data: bytes) -> None:
        """Cancellation: not a checkpoint; never blocks."""
        return None


class BufferSink:
    """Keeps everything (tests, short commands)."""

    never_blocks = True

    def __init__(self) -> None:
        self._chunks: list[bytes] = []

    async def write(self, data: bytes) -> None:
        """Cancellation: not a checkpoint; never blocks."""
        self._chunks.append(bytes(data))

    def getvalue(self) -> bytes:
        return b"".join(self._chunks)

    def text(self) -> str:
        return self.getvalue().decode("utf-8", errors="replace")


class CappedBuffer:
    """Keeps the first ``cap`` bytes and discards the rest while still accepting writes.

    The child is never blocked by a full buffer. Exactly ``cap`` bytes is not truncated.
    """

    never_blocks = True

    def __init__(self, cap: int = STREAM_CAP) -> None:
        self.cap = cap
        self._buf = bytearray()
        self.truncated = False
        self.total = 0

    async def write(self, data: bytes) -> None:
        """Cancellation: not a checkpoint; never blocks."""
        self.total += len(data)
        room = self.cap - len(self._buf)
        if len(data) > room:
            self.truncated = True
        if room > 0:
            self._buf += data[:room]

    def getvalue(self) -> bytes:
        return bytes(self._buf)


class TailBuffer:
    """Keeps the last ``keep`` bytes (hook output sent to the controller)."""

    never_blocks = True

    def __init__(self, keep: int = 4096) -> None:
        self.keep = keep
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self.total = 0

    async def write(self, data: bytes) -> None:
        """Cancellation: not a checkpoint; never blocks."""
        if not data:
            return
        self.total += len(data)
        self._chunks.append(bytes(data))
        self._size += len(data)
        while self._size - len(self._chunks[0]) >= self.keep:
            self._size -= len(self._chunks.popleft())

    @property
    def truncated(self) -> bool:
        return self.total > self.keep

    def getvalue(self) -> bytes:
        return b"".join(self._chunks)[-self.keep :] if self.keep else b""


class TeeSink:
    """Writes every chunk to each of several sinks, in order."""

    def __init__(self, *sinks: Sink) -> None:
        self.sinks = sinks
        self.never_blocks = all(getattr(s, "never_blocks", False) is True for s in sinks)

    async def write(self, data: bytes) -> None:
        """Cancellation: as each sink's ``write``; a cancelled tee may have reached only
        the first sinks."""
        for sink in self.sinks:
            await sink.write(data)


__all__ = ["STREAM_CAP", "BufferSink", "CappedBuffer", "NullSink", "Sink", "TailBuffer", "TeeSink"]
