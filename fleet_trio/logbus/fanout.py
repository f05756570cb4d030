"""Many live tails (docs/tail.md "Many tails"): the caps on open tails, the frames the tails of
one job share, and their turns to send.

A server (the node, the worker's listener) holds one :class:`Tails`. Its route opens a
:class:`TailSlot` before the websocket upgrade (``None`` beyond a cap: HTTP 503
:data:`MSG_TOO_MANY_TAILS`) and closes it in a ``finally``;
:func:`~fleet_trio.logbus.tail.serve_tail` takes its frames and its turns from the slot.
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Iterator

import attrs
import trio

from fleet_trio.inputs import printable
from fleet_trio.logbus.bus import Output
from fleet_trio.logbus.tail import (
    CATCH_UP_PAUSE,
    MAX_FRAME_DATA,
    MAX_PARAM_LEN,
    SendText,
    TailEvent,
    event_texts,
    output_text,
)

MSG_TOO_MANY_TAILS = "too many tails"
"""The 503 answer (the error envelope, before the upgrade) beyond a :class:`TailLimits` cap."""

logger = logging.getLogger(__name__)


DEFAULT_MAX_TAILS = 256
DEFAULT_MAX_TAILS_PER_JOB = 32
FRAME_CACHE_BYTES = 4 << 20
"""Bytes of encoded frames (and the raw bytes they were built from) a server keeps for the
tails of jobs that have more than one: the frames of the newest few MiB, which every reader
that keeps up asks for."""
REFUSAL_LOG_INTERVAL = 60.0
"""Seconds between two WARNING lines about tails refused beyond a cap (the first is logged)."""


@attrs.frozen
class TailLimits:
    """How many live tails a server admits: ``max_tails`` in all, ``max_tails_per_job`` of one
    job (node config ``node.max_tails`` / ``node.max_tails_per_job``; the worker's
    ``max_tails`` / ``max_tails_per_job``, docs/tail.md)."""

    max_tails: int = DEFAULT_MAX_TAILS
    max_tails_per_job: int = DEFAULT_MAX_TAILS_PER_JOB

    def __attrs_post_init__(self) -> None:
        for name in ("max_tails", "max_tails_per_job"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")


_Key = tuple[str, str, int, float, int]
"""A frame in the cache: job id, stream, offset, the chunk's time, the number of raw bytes."""


SENDING_PER_JOB = 2
"""Tails of one job that send a frame at once; the others wait for their turn (and fall behind,
and skip, as a slow reader does). The job's pump shares the node's event loop with the tasks
that are ready to run: with every tail of a flooding job sending, it got one turn in a hundred
with a hundred tails. A send that takes longer than :data:`STUCK_SEND` no longer holds a turn
(a client that stopped reading costs the other tails nothing)."""
STUCK_SEND = 0.05
"""Seconds after which a tail's frame send no longer counts against :data:`SENDING_PER_JOB`."""


class _JobTails:
    """The open tails of one job: how many, the time of the next paced catch-up turn, and the
    turns to send (:meth:`TailSlot.wait_turn`)."""

    def __init__(self) -> None:
        self.count = 0
        self.next_turn = -math.inf
        self.sending: dict[TailSlot, float] = {}
        """The sends under way, by tail, since when."""
        self.handed = 0
        """Waiters woken for a turn that have not run yet (their turn is taken)."""
        self.waiting = trio.lowlevel.ParkingLot()
        self.watching = False
        """One waiter (not all: a hundred timers firing at once cost more than the sends)
        wakes when the oldest send under way stops counting."""

    def _counted(self, now: float) -> list[float]:
        return [t for t in self.sending.values() if now - t < STUCK_SEND]

    def free(self, now: float) -> bool:
        """May one more send start?"""
        return len(self._counted(now)) + self.handed < SENDING_PER_JOB

    def stuck_at(self, now: float) -> float:
        """When the oldest send that counts stops counting (``inf``: none under way)."""
        counted = self._counted(now)
        return min(counted) + STUCK_SEND if counted else math.inf

    def wake(self) -> None:
        """Wake the next waiter (its turn is taken from now until it runs)."""
        self.handed += len(self.waiting.unpark())

    def hand_on(self, now: float) -> None:
        """A send ended (or a turn went unused): wake waiters for the turns free now."""
        while self.waiting.statistics().tasks_waiting and self.free(now):
            self.wake()


class Tails:
    """The live tails a server has open, by job, under :class:`TailLimits`; the frames the
    tails of one job share. Synchronous (the caller opens a :class:`TailSlot` before the
    websocket upgrade and closes it, in a ``finally``, once the tail is over)."""

    def __init__(self, limits: TailLimits | None = None, *, cache_bytes: int = FRAME_CACHE_BYTES):
        self.limits = limits if limits is not None else TailLimits()
        self._jobs: dict[str, _JobTails] = {}
        self._open = 0
        self._cache: collections.OrderedDict[_Key, tuple[bytes, str]] = collections.OrderedDict()
        self._cache_size = 0
        self._cache_limit = cache_bytes
        self._refused = 0
        self._warned_at: float | None = None
        self.encoded = 0
        """Frames encoded for a job with more than one tail (misses of the shared cache)."""
        self.shared = 0
        """Frames a tail took from the shared cache instead of encoding them again."""

    @property
    def open_count(self) -> int:
        """Tails open now (all jobs)."""
        return self._open

    def count(self, job_id: str) -> int:
        """Tails of ``job_id`` open now."""
        job = self._jobs.get(job_id)
        return job.count if job is not None else 0

    def open(self, job_id: str, now: float) -> TailSlot | None:
        """A slot for one more tail of ``job_id``, or ``None`` beyond a cap (then the route
        answers 503 :data:`MSG_TOO_MANY_TAILS`). ``now``: the current time (for the refusal's
        log line, at most one per :data:`REFUSAL_LOG_INTERVAL`)."""
        job = self._jobs.get(job_id)
        per_job = job.count if job is not None else 0
        limits = self.limits
        if self._open >= limits.max_tails or per_job >= limits.max_tails_per_job:
            self._refused += 1
            if self._warned_at is None or now - self._warned_at >= REFUSAL_LOG_INTERVAL:
                self._warned_at = now
                logger.warning(
                    "live tail refused (503 %s): %d open of max_tails %d, %d of job %s of "
                    "max_tails_per_job %d; %d refused so far",
                    MSG_TOO_MANY_TAILS,
                    self._open,
                    limits.max_tails,
                    per_job,
                    printable(job_id, limit=MAX_PARAM_LEN),
                    limits.max_tails_per_job,
                    self._refused,
                )
            return None
        if job is None:
            job = self._jobs[job_id] = _JobTails()
        job.count += 1
        self._open += 1
        return TailSlot(self, job_id, job)

    def _close(self, job_id: str, job: _JobTails) -> None:
        job.count -= 1
        self._open -= 1
        if job.count == 0 and self._jobs.get(job_id) is job:
            del self._jobs[job_id]

    def _text(self, job_id: str, event: Output) -> str:
        """The frame text of ``event`` (at most :data:`MAX_FRAME_DATA` bytes) for a tail of
        a job with others: built once, then shared while it is in the cache. A hit is checked
        against the raw bytes it was built from (a job id can come back with another log)."""
        data = bytes(event.data)
        key = (job_id, event.stream, event.offset, event.t, len(data))
        hit = self._cache.get(key)
        if hit is not None and (hit[0] is data or hit[0] == data):
            self.shared += 1
            return hit[1]
        text = output_text(event.stream, event.offset, data, event.t)
        self.encoded += 1
        if hit is not None:
            self._cache_size -= len(hit[0]) + len(hit[1])
            del self._cache[key]
        self._cache[key] = (data, text)
        self._cache_size += len(data) + len(text)
        while self._cache_size > self._cache_limit and self._cache:
            _, (old_data, old_text) = self._cache.popitem(last=False)
            self._cache_size -= len(old_data) + len(old_text)
        return text


class TailSlot:
    """One admitted tail (:meth:`Tails.open`): its frames (shared with the job's other
    tails) and its catch-up turns. :meth:`close` gives the slot back (idempotent)."""

    def __init__(self, tails: Tails, job_id: str, job: _JobTails) -> None:
        self._tails = tails
        self.job_id = job_id
        self._job = job
        self._closed = False
        self._granted = False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._tails._close(self.job_id, self._job)

    def texts(self, event: TailEvent) -> Iterator[str]:
        """:func:`event_texts` of ``event``; an output frame of a job with more than one tail
        comes from the shared cache (one encoding for all of them)."""
        if isinstance(event, Output) and self._job.count > 1 and len(event.data) <= MAX_FRAME_DATA:
            yield self._tails._text(self.job_id, event)
            return
        yield from event_texts(event)

    async def send(self, send_text: SendText, text: str) -> None:
        """``send_text(text)`` once it is this tail's turn among its job's tails (at once
        for a job's only tail): at most :data:`SENDING_PER_JOB` of them send at a time.

        Cancellation: a plain wait, then the send's own; the turn is given back."""
        job = self._job
        await self.wait_turn()
        self._granted = False
        job.sending[self] = trio.current_time()
        try:
            await send_text(text)
        finally:
            del job.sending[self]
            job.hand_on(trio.current_time())

    async def wait_turn(self) -> None:
        """Return once it is this tail's turn to send: at once, without a checkpoint, for a
        job's only tail, or when a turn is free and no other tail of the job waits for one;
        else in line (first come, first served). The turn is this tail's until its next
        checkpoint: :meth:`send` takes it, or :meth:`forgo` gives it back.

        Cancellation: a plain wait."""
        job = self._job
        if job.count < 2 or self._granted:
            return
        now = trio.current_time()
        if not job.waiting.statistics().tasks_waiting and job.free(now):
            self._granted = True
            return
        while True:
            timed = not job.watching
            job.watching = True
            woken = False
            try:
                with trio.move_on_at(job.stuck_at(now) if timed else math.inf):
                    await job.waiting.park()
                    woken = True
            except BaseException:
                job.hand_on(trio.current_time())  # a turn meant for this one goes on
                raise
            finally:
                if timed:
                    job.watching = False
                if woken:
                    job.handed -= 1
            now = trio.current_time()
            if job.free(now):
                break
        self._granted = True
        if not job.watching and job.waiting.statistics().tasks_waiting:
            job.wake()  # the next in line watches for a stuck send now

    def forgo(self) -> None:
        """Give back a turn :meth:`wait_turn` gave and no send took."""
        if self._granted:
            self._granted = False
            self._job.hand_on(trio.current_time())

    def catch_up_turn(self, now: float) -> float:
        """When a paced reader of this job may look again: :data:`CATCH_UP_PAUSE` from now,
        and the job's paced readers take turns, one per :data:`CATCH_UP_PAUSE` (so a job
        with N readers that keep falling behind sends them as many catch-ups in all as it
        sends one)."""
        job = self._job
        at = max(now + CATCH_UP_PAUSE, job.next_turn)
        job.next_turn = at + CATCH_UP_PAUSE
        return at


__all__ = [
    "DEFAULT_MAX_TAILS",
    "DEFAULT_MAX_TAILS_PER_JOB",
    "FRAME_CACHE_BYTES",
    "MSG_TOO_MANY_TAILS",
    "SENDING_PER_JOB",
    "STUCK_SEND",
    "TailLimits",
    "TailSlot",
    "Tails",
]
