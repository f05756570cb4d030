"""The per-job output bus: one producer (the job's pump), many consumers (node, worker, tail).

(Over 500 lines: the history, the cursors, the job log and the bus are one bounded-memory design,
whose eviction and skip rules must be read together.)

Layers:

* :class:`History` – a plain, synchronous, bounded list of chunks keyed by their offset in the
  job's single byte sequence (stdout and stderr interleaved in write order). It evicts the
  oldest chunks once it holds more than ``limit`` bytes, but always keeps the newest chunk:
  ``size <= max(limit, len(newest chunk))``.
* :class:`Cursor` – a plain, synchronous reader of a :class:`History` by offset. It owns no
  copy of the data; ``poll`` returns the next event or ``None`` ("wait"). The writer never
  touches cursors, so a slow reader cannot slow the writer or other readers.
* :class:`JobLog`, :class:`Subscription`, :class:`LogBus` – the Trio layer: wake-ups, the
  optional spill file, retention.

The lag rule (``max_lag``): the *lag* of a cursor is the number of bytes written **after the
subscription was created** that it has not been handed yet,
``lag = total - max(pos, total_at_subscribe)``. Bytes that already existed when it subscribed
(a replay from ``"start"`` or an offset) do not count, so replaying a large finished log is
never cut. Whenever the cursor is asked for its next event and ``lag > max_lag``, it yields
``Skipped(pos, total - max_lag - pos)`` and continues at ``total - max_lag``: exactly
``max_lag`` bytes behind, keeping the newest ``max_lag`` bytes (possibly starting in the
middle of a chunk). Without a spill file, a cursor whose position was evicted from the
history likewise gets one ``Skipped`` up to the oldest retained byte (both rules are folded
into a single ``Skipped``).
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import time
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Literal, TypeAlias

import attrs
import trio

from fleet_trio.logbus import spill as _spill
from fleet_trio.memory import MemoryBudget
from fleet_trio.proc.sinks import Sink

Stream: TypeAlias = Literal["stdout", "stderr"]
STREAMS: frozenset[Stream] = frozenset({"stdout", "stderr"})
SPILL_READ_MAX = 1 << 16
"""The largest ``Output`` served from a spill file (bytes)."""
MAX_LAG = 1 << 20
"""A reader's default ``max_lag`` (bytes): a tail more than 1 MiB behind is skipped ahead."""


@attrs.frozen
class Output:
    """Bytes the job wrote; ``offset`` is the position of ``data[0]``, ``t`` wall-clock seconds."""

    stream: Stream
    offset: int
    data: bytes
    t: float


@attrs.frozen
class Skipped:
    """``nbytes`` bytes from ``offset`` this subscriber will not get (evicted, or it lagged)."""

    offset: int
    nbytes: int


@attrs.frozen
class End:
    """The job's end; ``offset`` is the total number of bytes written. Always the last event."""

    state: str
    exit_code: int | None
    reason: str
    offset: int
    cpu_seconds: float | None = None
    """The job's CPU time from its cgroup (cgroup backend; ``None``: not known)."""


Event: TypeAlias = Output | Skipped | End


@attrs.frozen
class JobInfo:
    """A summary of one log for listings (wall-clock times)."""

    job_id: str
    state: str
    started: float
    ended: float | None
    nbytes: int
    meta: Mapping[str, str]


@attrs.define
class BusStats:
    """A bus's running totals (for metrics); ``LogBus.stats()`` returns a copy."""

    bytes_written: dict[str, int] = attrs.Factory(lambda: {"stdout": 0, "stderr": 0})
    """Bytes jobs wrote, by stream."""
    bytes_skipped: int = 0
    """Bytes subscribers were told they will not get (``Skipped``: lag or eviction)."""
    subscribers: int = 0
    """Subscriptions open now."""


@attrs.frozen
class SpillRead:
    """:meth:`Cursor.poll`'s request: serve ``[offset, upto)`` from the spill file."""

    offset: int
    upto: int


@attrs.frozen
class _Chunk:
    stream: Stream
    data: bytes
    t: float


_EVICTED = _Chunk("stdout", b"", 0.0)
"""What an evicted chunk's slot holds until the history's index is compacted."""


def utf8_cut(data: bytes, cut: int, floor: int) -> int:
    """``cut``, moved back (by at most 3 bytes, never to ``floor`` or below) off UTF-8
    continuation bytes, so that a piece ending there does not split a character; ``cut``
    unchanged when no character start is that close (the bytes are not UTF-8 anyway)."""
    for back in range(min(3, cut - floor - 1) + 1):
        if data[cut - back] & 0xC0 != 0x80:
            return cut - back
    return cut


class History:
    """A bounded, offset-addressed list of chunks, stored as written. Synchronous."""

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError("history limit must be >= 0")
        self.limit = limit
        self.total = 0
        self.size = 0
        self._offsets: list[int] = []
        self._chunks: list[_Chunk] = []
        self._head = 0  # index of the oldest retained chunk (amortised pop-left)
        self._holders: list[Cursor] = []

    @property
    def start(self) -> int:
        """The offset of the oldest retained byte (``total`` when empty)."""
        return self.total - self.size

    def __len__(self) -> int:
        return len(self._chunks) - self._head

    def append(self, stream: Stream, data: bytes, t: float) -> int:
        """Store one chunk; return its offset. Evicts the oldest chunks beyond ``limit``."""
        offset = self.total
        if not data:
            return offset
        self._offsets.append(offset)
        self._chunks.append(_Chunk(stream, data, t))
        self.total += len(data)
        self.size += len(data)
        self._evict()
        return offset

    def _evict(self) -> None:
        while self.size > self.limit and len(self) > 1:
            if self._holders and self._held(self._offsets[self._head + 1]):
                break
            self._pop_head()
        if self._head > 64 and self._head * 2 > len(self._chunks):
            del self._offsets[: self._head]
            del self._chunks[: self._head]
            self._head = 0

    def _pop_head(self) -> None:
        """Evict the oldest chunk. Its slot in the index keeps only an empty placeholder until
        the index is compacted: the bytes are freed now (a flood of 1 MiB chunks would
        otherwise keep up to 64 dead chunks alive beside the history, and each new read would
        land in fresh memory, a page fault per 4 KiB)."""
        self.size -= len(self._chunks[self._head].data)
        self._chunks[self._head] = _EVICTED
        self._head += 1

    def drop(self) -> None:
        """Evict every chunk no holding cursor still needs, the newest too (memory budget: an
        ended log's history)."""
        self.limit = 0
        while len(self) > 0:
            head_end = self._offsets[self._head] + len(self._chunks[self._head].data)
            if self._holders and self._held(head_end):
                break
            self._pop_head()
        del self._offsets[: self._head]
        del self._chunks[: self._head]
        self._head = 0

    def hold(self, cursor: Cursor) -> None:
        """Keep the bytes ``cursor`` has not read yet, beyond ``limit`` when needed, up to its
        ``max_lag`` (older bytes it would skip under the lag rule anyway)."""
        if cursor not in self._holders:
            self._holders.append(cursor)

    def release(self, cursor: Cursor) -> None:
        if cursor in self._holders:
            self._holders.remove(cursor)
            self._evict()

    def _held(self, head_end: int) -> bool:
        """Does a holder still need the oldest chunk (which ends at ``head_end``)?"""
        return any(c.pos < head_end and head_end > self.total - c.max_lag for c in self._holders)

    def index_at(self, offset: int) -> int:
        """The internal index of the chunk holding byte ``offset`` (valid until the next
        ``append``)."""
        if not self.start <= offset < self.total:
            raise IndexError(offset)
        return bisect.bisect_right(self._offsets, offset, lo=self._head) - 1

    def item(self, i: int) -> tuple[int, _Chunk]:
        return self._offsets[i], self._chunks[i]

    def following(self, i: int) -> Iterator[_Chunk]:
        """The chunks from internal index ``i`` on, oldest first."""
        return itertools.islice(self._chunks, i, None)

    def chunks(self) -> list[tuple[int, Stream, bytes]]:
        """The retained chunks (tests, debugging)."""
        return [
            (self._offsets[i], self._chunks[i].stream, self._chunks[i].data)
            for i in range(self._head, len(self._chunks))
        ]


class Cursor:
    """One reader's position in a :class:`History`. Synchronous; see the module doc for lag."""

    def __init__(
        self,
        history: History,
        start: Literal["start", "now"] | int = "start",
        *,
        streams: frozenset[Stream] = STREAMS,
        max_lag: int = MAX_LAG,
        batch: int = 0,
        hold: bool = False,
    ) -> None:
        if max_lag < 0:
            raise ValueError("max_lag must be >= 0")
        self.history = history
        self.batch = batch
        """Join following chunks of the same stream into one ``Output`` up to this many bytes,
        and hand out a larger chunk in pieces of at most this many, cut at multiples of
        ``batch`` from the chunk's start (moved back to a UTF-8 character boundary where
        :func:`utf8_cut` finds one; a reader that enters the chunk elsewhere first gets the
        bytes up to the next cut); 0: one chunk per ``Output``. Fewer, larger
        events for a reader that is behind, never larger than it asked for (a reader that is
        behind is checked against ``max_lag`` between pieces, and no slice of a large chunk
        is copied beyond what is handed out)."""
        self.base = history.total
        if start == "start":
            self.pos = 0
        elif start == "now":
            self.pos = history.total
        elif isinstance(start, int) and not isinstance(start, bool):
            self.pos = max(0, start)
        else:
            raise ValueError(f"bad start {start!r}")
        self.start = self.pos
        self.streams = frozenset(streams)
        self.max_lag = max_lag
        self.done = False
        self.holding = hold
        """A *holding* cursor keeps the history from evicting what it has not read (within
        ``max_lag``): it never misses a byte unless it falls ``max_lag`` behind. For a
        consumer that must not lose output (the rc log upload); :meth:`release` when done."""
        if hold:
            history.hold(self)

    def release(self) -> None:
        """Stop holding history (a no-op for a cursor that does not hold)."""
        if self.holding:
            self.holding = False
            self.history.release(self)

    def poll(
        self, end: End | None, *, spill_upto: int = 0, spill_pending: bool = False
    ) -> Event | SpillRead | None:
        """The next event, a spill read to do, or ``None`` when the caller must wait.

        ``spill_upto``: bytes below it can be read from a spill file. ``spill_pending``: bytes
        at or above it that were evicted will become readable later (a flush is under way).
        After returning ``End`` the cursor is done and returns ``None`` forever.
        """
        if self.done:
            return None
        h = self.history
        while True:
            total = h.total
            target = self.pos
            if total - max(self.pos, self.base) > self.max_lag:
                target = total - self.max_lag
            if target < h.start and target >= spill_upto and not spill_pending:
                target = h.start
            if target > self.pos:
                skipped = Skipped(self.pos, target - self.pos)
                self.pos = target
                return skipped
            if self.pos < h.start:
                if self.pos < spill_upto:
                    return SpillRead(self.pos, min(h.start, spill_upto))
                return None  # evicted bytes still being flushed to the spill file
            if self.pos >= total:
                if end is not None:
                    self.done = True
                    self.release()
                    return end
                return None
            i = h.index_at(self.pos)
            offset, chunk = h.item(i)
            start = self.pos
            if chunk.stream not in self.streams:
                self.pos = offset + len(chunk.data)
                continue
            lo, hi = start - offset, len(chunk.data)
            if 0 < self.batch < hi - lo:  # a large chunk: handed out batch bytes at a time
                # cut on the chunk's grid of batch bytes: readers that entered the chunk at
                # different places (after a skip) cut the rest of it alike, so a tail can
                # share their frames (a cut within a character's length of lo: the piece
                # ends batch bytes on, as a UTF-8 cut needs room)
                grid = (lo // self.batch + 1) * self.batch
                hi = utf8_cut(chunk.data, grid if grid - lo > 3 else lo + self.batch, lo)
            data = chunk.data if lo == 0 and hi == len(chunk.data) else chunk.data[lo:hi]
            self.pos = offset + hi
            if self.batch > len(data) and self.pos < total and hi == len(chunk.data):
                parts = [data]
                size = len(data)
                for nxt in h.following(i + 1):
                    if nxt.stream != chunk.stream or size + len(nxt.data) > self.batch:
                        break
                    parts.append(nxt.data)
                    size += len(nxt.data)
                    self.pos += len(nxt.data)
                if len(parts) > 1:
                    data = b"".join(parts)
            return Output(chunk.stream, start, data, chunk.t)

    def clamp(self, offset: int) -> None:
        """Move a start beyond ``offset`` back to it (the log has ended at ``offset``)."""
        if self.pos > offset:
            self.pos = self.start = offset

    def advance(self, nbytes: int) -> None:
        """Move past ``nbytes`` served outside the history (from a spill file)."""
        self.pos += nbytes


class _StreamSink:
    """A :class:`~fleet_trio.proc.sinks.Sink` writing one stream of a :class:`JobLog`."""

    def __init__(self, log: JobLog, stream: Stream) -> None:
        self._log = log
        self._stream: Stream = stream

    async def write(self, data: bytes) -> None:
        """Append ``data`` to the stream (:meth:`JobLog.write`).

        Cancellation: as :meth:`JobLog.write`."""
        await self._log.write(self._stream, data)


class JobLog:
    """The output of one job: a bounded history, an optional spill file, and its end."""

    def __init__(
        self,
        job_id: str,
        *,
        meta: Mapping[str, str] | None = None,
        history_bytes: int = 8 << 20,
        spill_dir: str | None = None,
        limiter: trio.CapacityLimiter | None = None,
        on_end: Callable[[JobLog], None] | None = None,
        stats: BusStats | None = None,
        budget: MemoryBudget | None = None,
    ) -> None:
        self.job_id = _spill.check_job_id(job_id)
        self._budget = budget
        """Memory budget: the history is charged as ``("log", job_id)``; once the job has
        ended the budget may evict it (:meth:`_evict_history`)."""
        self._stats = stats if stats is not None else BusStats()
        self._on_end = on_end
        self.meta: Mapping[str, str] = MappingProxyType(dict(meta or {}))
        self.started = time.time()
        self._history = History(history_bytes)
        self._end: End | None = None
        self._ended_wall: float | None = None
        self._ended_mono: float | None = None
        self._waiter: trio.Event | None = None
        self._end_waiter: trio.Event | None = None
        # spill state
        self._spill_path = None if spill_dir is None else _spill.spill_path(spill_dir, job_id)
        self._limiter = limiter if limiter is not None else trio.CapacityLimiter(1)
        self._spill_queue: list[bytes] = []
        self._spill_flushing = False
        self._spill_created = False
        self._spilled = 0  # bytes on disk
        self._spill_broken = False
        self._run_offsets: list[int] = []  # stream runs, for attributing spilled bytes
        self._runs: list[tuple[Stream, float]] = []

    # -- producer side -------------------------------------------------------------------

    def sink(self, stream: Stream = "stdout") -> Sink:
        """A sink for ``fleet_trio.proc.run``: its writes go to ``stream`` of this log."""
        _check_stream(stream)
        return _StreamSink(self, stream)

    async def write(self, stream: Stream, data: bytes) -> None:
        """Append ``data`` to ``stream``. Never waits on subscribers; with a spill file it
        waits for the disk (the bytes are in the history, visible to subscribers, before).

        Cancellation: the bytes are in the history once the call has begun; a cancel during
        the spill write leaves the spill file short of them (a later reader of that range
        gets a ``skipped``)."""
        _check_stream(stream)
        if self._end is not None or not data:
            await trio.lowlevel.checkpoint()
            return
        data = bytes(data)
        t = time.time()
        offset = self._history.append(stream, data, t)
        self._stats.bytes_written[stream] += len(data)
        if self._budget is not None:  # memory budget: running output is charged, never evicted
            self._budget.charge(("log", self.job_id), self._history.size, self._evict_history)
            self._budget.settle()
        if self._spill_path is not None and not self._spill_broken:
            if not self._runs or self._runs[-1][0] != stream:
                self._run_offsets.append(offset)
                self._runs.append((stream, t))
            self._spill_queue.append(data)
        self._wake()
        if self._spill_queue and not self._spill_flushing:
            await self._flush_spill()
        else:
            await trio.lowlevel.checkpoint()

    def end(
        self,
        state: str,
        exit_code: int | None = None,
        reason: str = "",
        *,
        cpu_seconds: float | None = None,
    ) -> None:
        """Record the end (first call wins), wake subscribers; later writes are ignored."""
        if self._end is not None:
            return
        self._end = End(state, exit_code, reason, self._history.total, cpu_seconds)
        self._ended_wall = time.time()
        self._ended_mono = trio.current_time()
        self._wake()
        if self._end_waiter is not None:
            self._end_waiter.set()
        if self._on_end is not None:
            self._on_end(self)
        if self._budget is not None:  # memory budget: an ended log may now be evicted
            self._budget.end(("log", self.job_id))
            self._budget.settle()

    def _evict_history(self) -> int:
        """Memory budget: drop the ended log's in-memory history (readers get it from the spill
        file when there is one, else a ``Skipped``), except what a holding reader still needs.
        Returns the bytes still in memory."""
        self._history.drop()
        self._wake()
        return self._history.size

    @property
    def ended(self) -> End | None:
        return self._end

    async def wait_ended(self) -> None:
        """Return once the log has ended (at once if it has); writes do not wake it.

        Cancellation: a plain wait."""
        if self._end is not None:
            await trio.lowlevel.checkpoint()
            return
        if self._end_waiter is None:
            self._end_waiter = trio.Event()
        await self._end_waiter.wait()

    @property
    def nbytes(self) -> int:
        return self._history.total

    @property
    def history(self) -> History:
        """The in-memory history (read-only use: tests, debugging)."""
        return self._history

    def info(self) -> JobInfo:
        return JobInfo(
            job_id=self.job_id,
            state=self._end.state if self._end is not None else "running",
            started=self.started,
            ended=self._ended_wall,
            nbytes=self._history.total,
            meta=self.meta,
        )

    # -- consumer side -------------------------------------------------------------------

    def subscribe(
        self,
        start: Literal["start", "now"] | int = "start",
        *,
        streams: frozenset[Stream] = STREAMS,
        max_lag: int = MAX_LAG,
        batch: int = 0,
        hold: bool = False,
    ) -> Subscription:
        """Read this log from ``start`` (``"start"``, ``"now"`` or an offset) through a
        :class:`Cursor` made with the same arguments (see it for ``max_lag``, ``batch`` and
        ``hold``)."""
        for s in streams:
            _check_stream(s)
        cursor = Cursor(
            self._history, start, streams=streams, max_lag=max_lag, batch=batch, hold=hold
        )
        if self._end is not None:
            cursor.clamp(self._end.offset)  # ended: nothing more will come
        return Subscription(self, cursor)

    # -- internals -----------------------------------------------------------------------

    def _wake(self) -> None:
        if self._waiter is not None:
            self._waiter.set()
            self._waiter = None

    async def _wait_change(self) -> None:
        if self._waiter is None:
            self._waiter = trio.Event()
        await self._waiter.wait()

    @property
    def _spill_upto(self) -> int:
        return 0 if self._spill_broken else self._spilled

    @property
    def _spill_pending(self) -> bool:
        return (
            self._spill_path is not None
            and not self._spill_broken
            and self._spilled < self._history.total
        )

    async def _flush_spill(self) -> None:
        # Shielded: bytes already in the history must reach the file, or readers of evicted
        # offsets would wait for them forever. Every queued write is drained by one flusher.
        assert self._spill_path is not None
        path = self._spill_path
        self._spill_flushing = True
        try:
            with trio.CancelScope(shield=True):
                while self._spill_queue and not self._spill_broken:
                    batch = b"".join(self._spill_queue)
                    self._spill_queue.clear()
                    truncate = not self._spill_created
                    self._spill_created = True
                    try:
                        await trio.to_thread.run_sync(
                            _spill.append, path, batch, truncate, limiter=self._limiter
                        )
                    except OSError:
                        self._break_spill()
                    else:
                        self._spilled += len(batch)
                    self._wake()
        finally:
            self._spill_flushing = False

    def _break_spill(self) -> None:
        self._spill_broken = True
        self._spill_queue.clear()
        self._wake()

    async def _read_spill(self, cursor: Cursor, req: SpillRead) -> Output | None:
        """Serve part of ``req`` from the spill file; ``None`` when nothing was yielded."""
        assert self._spill_path is not None
        i = bisect.bisect_right(self._run_offsets, req.offset) - 1
        stream, t = self._runs[i]
        run_end = self._run_offsets[i + 1] if i + 1 < len(self._run_offsets) else req.upto
        upto = min(req.upto, run_end)
        if stream not in cursor.streams:
            cursor.advance(upto - req.offset)
            return None
        want = min(upto - req.offset, SPILL_READ_MAX)
        try:
            data = await trio.to_thread.run_sync(
                _spill.read_range, self._spill_path, req.offset, want, limiter=self._limiter
            )
        except OSError:
            data = b""
        if not data:
            self._break_spill()  # file gone or truncated: evicted bytes become Skipped
            return None
        if cursor.pos != req.offset:  # pragma: no cover - guarded by Subscription's busy flag
            return None
        cursor.advance(len(data))
        return Output(stream, req.offset, data, t)


class Subscription(trio.abc.AsyncResource):
    """An async iterator of :data:`Event` over one :class:`JobLog`; ends right after ``End``.

    Also an async context manager (``aclose`` on exit, as every ``trio.abc.AsyncResource``).
    Not for concurrent ``__anext__`` calls from several tasks (``trio.BusyResourceError``).
    """

    def __init__(self, log: JobLog, cursor: Cursor) -> None:
        self._log = log
        self._cursor = cursor
        self._closed = False
        self._busy = False
        self._counted = True
        log._stats.subscribers += 1

    def _uncount(self) -> None:
        if self._counted:
            self._counted = False
            self._log._stats.subscribers -= 1

    def _seen(self, ev: Event) -> Event:
        if isinstance(ev, Skipped):
            self._log._stats.bytes_skipped += ev.nbytes
        elif isinstance(ev, End):
            self._uncount()
        return ev

    @property
    def position(self) -> int:
        """The offset of the next byte this subscription will consider."""
        return self._cursor.pos

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event:
        if self._closed or self._cursor.done:
            await trio.lowlevel.checkpoint()
            raise StopAsyncIteration
        if self._busy:
            raise trio.BusyResourceError("another task is reading this subscription")
        self._busy = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            while True:
                ev = self._poll()
                if ev is None:
                    await self._log._wait_change()
                    if self._closed:
                        raise StopAsyncIteration
                    continue
                if isinstance(ev, SpillRead):
                    out = await self._log._read_spill(self._cursor, ev)
                    if out is None:
                        continue
                    return self._seen(out)
                await trio.lowlevel.cancel_shielded_checkpoint()
                return self._seen(ev)
        finally:
            self._busy = False

    def _poll(self) -> Event | SpillRead | None:
        log = self._log
        return self._cursor.poll(
            log._end, spill_upto=log._spill_upto, spill_pending=log._spill_pending
        )

    def next_ready(self) -> Event | None:
        """The next event if it is available right now (``None`` when it would have to wait
        or read the spill file), without a checkpoint: for a caller that decides two events
        together (a tail sends a ``skipped`` with the output that follows it)."""
        if self._busy:
            raise trio.BusyResourceError("another task is reading this subscription")
        if self._closed:
            return None
        ev = self._poll()
        if ev is None or isinstance(ev, SpillRead):  # a spill read is left to __anext__
            return None
        return self._seen(ev)

    def ready(self) -> list[Event]:
        """The events available right now, in order, without waiting: for a caller whose
        reading task has stopped. Stops before anything that needs the spill file."""
        events: list[Event] = []
        while (ev := self.next_ready()) is not None:
            events.append(ev)
        return events

    async def aclose(self) -> None:
        """Stop reading; a task blocked in ``__anext__`` gets ``StopAsyncIteration``.

        Cancellation: the subscription is closed before the first checkpoint, so a cancel
        cannot leave it open."""
        self._closed = True
        self._cursor.release()
        self._uncount()
        if self._busy:
            self._log._wake()
        await trio.lowlevel.checkpoint()


class LogBus:
    """All job logs of one process, by job id, with retention of ended logs."""

    def __init__(
        self,
        *,
        history_bytes: int = 8 << 20,
        spill_dir: str | None = None,
        keep_ended: int = 100,
        keep_ended_for: float = 3600.0,
        budget: MemoryBudget | None = None,
    ) -> None:
        self.budget = budget
        """The memory budget the histories are charged to (``None``: not counted)."""
        self.history_bytes = history_bytes
        self.spill_dir = spill_dir
        self.keep_ended = keep_ended
        self.keep_ended_for = keep_ended_for
        self._logs: dict[str, JobLog] = {}
        self._ended: dict[str, JobLog] = {}
        """The ended logs, in the order they ended (so pruning looks only at the oldest)."""
        self._limiter = trio.CapacityLimiter(4)
        self._streaming = 0
        self._streams_idle = trio.Event()
        self._streams_idle.set()
        self._stats = BusStats()

    def stats(self) -> BusStats:
        """A copy of the running totals (bytes written by stream, skipped, open subscribers)."""
        s = self._stats
        return BusStats(dict(s.bytes_written), s.bytes_skipped, s.subscribers)

    @contextlib.contextmanager
    def streaming(self) -> Iterator[None]:
        """Count a consumer serving a log to a client (a tail) while the block runs."""
        if self._streaming == 0:
            self._streams_idle = trio.Event()
        self._streaming += 1
        try:
            yield
        finally:
            self._streaming -= 1
            if self._streaming == 0:
                self._streams_idle.set()

    async def wait_streams_done(self) -> None:
        """Return once no :meth:`streaming` block runs (a shutdown waits, bounded, for the
        tails to send their ``end``).

        Cancellation: a plain wait (the shutdown bounds it with its tails' end budget)."""
        await self._streams_idle.wait()

    def end_all(self, state: str, exit_code: int | None = None, reason: str = "") -> list[str]:
        """End every log that has not ended (a shutdown: jobs that never ran); their ids."""
        ended = [log.job_id for log in list(self._logs.values()) if log.ended is None]
        for job_id in ended:
            self._logs[job_id].end(state, exit_code, reason)
        return ended

    def discard_unwritten(self, job_id: str, reason: str = "not acked") -> bool:
        """Drop the log of a job that will never run (its ack was withdrawn, docs/node.md
        "Delivery-checked acks"): only a log that has not ended and holds no byte. Its
        readers get an ``end`` (``error``, ``reason``); the id is free for a new log (a
        re-dispatch) and a tail of it now is ``unknown job``. True when a log was dropped."""
        log = self._logs.get(job_id)
        if log is None or log.ended is not None or log.nbytes:
            return False
        del self._logs[job_id]
        log._on_end = None  # never kept among the ended logs: the id is unknown again
        log.end("error", None, reason)
        if self.budget is not None:
            self.budget.release(("log", job_id))
        return True

    def open(self, job_id: str, *, meta: Mapping[str, str] | None = None) -> JobLog:
        """The log of ``job_id``, created if needed (``ValueError`` for an unsafe id)."""
        _spill.check_job_id(job_id)
        self._prune()
        log = self._logs.get(job_id)
        if log is None:
            log = JobLog(
                job_id,
                meta=meta,
                history_bytes=self.history_bytes,
                spill_dir=self.spill_dir,
                limiter=self._limiter,
                on_end=self._log_ended,
                stats=self._stats,
                budget=self.budget,
            )
            self._logs[job_id] = log
        return log

    def get(self, job_id: str) -> JobLog | None:
        return self._logs.get(job_id)

    def kept_bytes(self) -> int:
        """Bytes of output the kept logs hold in memory now (their histories)."""
        return sum(log.history.size for log in self._logs.values())

    def jobs(self) -> list[JobInfo]:
        """Every kept log, newest first."""
        self._prune()
        return [log.info() for log in reversed(self._logs.values())]

    def _log_ended(self, log: JobLog) -> None:
        self._ended[log.job_id] = log

    def _prune(self) -> None:
        """Drop ended logs beyond ``keep_ended`` or older than ``keep_ended_for``, oldest
        first; costs nothing per call beyond the logs it drops (dispatch calls it)."""
        now = trio.current_time()
        while self._ended:
            job_id, log = next(iter(self._ended.items()))
            ended_at = log._ended_mono
            assert ended_at is not None
            if len(self._ended) <= self.keep_ended and now - ended_at <= self.keep_ended_for:
                break
            del self._ended[job_id]
            if self._logs.get(job_id) is log:
                del self._logs[job_id]
                if self.budget is not None:
                    self.budget.release(("log", job_id))


def _check_stream(stream: str) -> None:
    if stream not in STREAMS:
        raise ValueError(f"bad stream {stream!r}")


__all__ = [
    "MAX_LAG",
    "STREAMS",
    "BusStats",
    "Cursor",
    "End",
    "Event",
    "History",
    "JobInfo",
    "JobLog",
    "LogBus",
    "Output",
    "Skipped",
    "SpillRead",
    "Stream",
    "Subscription",
    "utf8_cut",
]
