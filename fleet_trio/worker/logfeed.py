"""The rc log upload reads the job's output from the log bus (docs/tail.md, docs/worker.md).

One producer, many consumers: the job's pump writes each chunk once into the job's
:class:`~fleet_trio.logbus.JobLog`; the live tail's subscribers and the log upload
(:class:`~fleet_trio.worker.client.LogShipper`, the E6 batching) all read from there. The upload
reads through a *holding* subscription, so the bus keeps every byte it has not taken yet: it
loses output only if it falls ``max_lag`` behind (the shipper's outbox limit), as the shipper
itself would.

:class:`LogFeed` is the reader task. The job's output is complete when ``proc.run`` returns
(its pumps are done), but the log only *ends* later, with the terminal report's state, after
verify; so the feed is not stopped by the log's end but by :meth:`LogFeed.finish`, with the
offset the output reached.
"""

from __future__ import annotations

import logging

import trio

from fleet_trio.logbus import End, JobLog, Output, Skipped, Stream, Subscription
from fleet_trio.proc.sinks import Sink
from fleet_trio.worker.client import LogShipper

log = logging.getLogger(__name__)

FINISH_BOUND = 5.0
"""Seconds the worker lets :meth:`LogFeed.finish` take to hand the last bytes to the shipper
(they are in memory: it takes a few scheduler turns)."""


class LogFeed:
    """Feeds ``streams`` of ``job_log`` into ``shipper``, in order, from the log's start."""

    def __init__(self, job_log: JobLog, streams: frozenset[Stream], shipper: LogShipper) -> None:
        self.job_log = job_log
        self.shipper = shipper
        self._sub: Subscription = job_log.subscribe(
            "start", streams=streams, max_lag=shipper.limit, hold=True
        )
        self._target: int | None = None
        self._done = trio.Event()
        self.skipped = 0
        self.finished = False

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read until :meth:`finish`'s offset (or the log's end, or a cancel)."""
        try:
            task_status.started()
            async for event in self._sub:
                self._deliver(event)
                if self._target is not None and self._sub.position >= self._target:
                    break
        finally:
            self._done.set()

    def _deliver(self, event: Output | Skipped | End) -> None:
        if isinstance(event, Output):
            self.shipper.write_nowait(event.data)
        elif isinstance(event, Skipped):
            # only when the upload fell shipper.limit behind: the outbox would drop it too
            self.skipped += event.nbytes
            self.shipper.count_dropped(event.nbytes)

    def sink(self, stream: Stream) -> Sink:
        """The pump's sink for ``stream``: writes go into the live log, which this feed reads.
        If the log refuses a write (a bug: it never should), the failure is logged and the
        upload goes on without the bus: what the log got is handed over first, then this and
        every later write goes to the shipper directly, so the upload stays whole and in
        order while the live tail stops there."""
        return _FeedSink(self, stream)

    async def finish(self, offset: int) -> None:
        """Hand every byte below ``offset`` to the shipper, then stop reading. Call it
        shielded and bounded (the worker gives it :data:`FINISH_BOUND`); also right after a
        cancel of :meth:`serve`: what it had not read yet is then handed over here."""
        if self.finished:
            await trio.lowlevel.checkpoint()
            return
        self._target = offset
        if self._sub.position >= offset and not self._done.is_set():
            await self._sub.aclose()  # a reader parked at the end returns at once
        await self._done.wait()
        if self._sub.position < offset:  # serve was cancelled early: hand over the rest
            for event in self._sub.ready():
                self._deliver(event)
        await self._sub.aclose()
        self.finished = True


class _FeedSink:
    def __init__(self, feed: LogFeed, stream: Stream) -> None:
        self._feed = feed
        self._stream: Stream = stream
        self._direct = False

    async def write(self, data: bytes) -> None:
        feed = self._feed
        if not self._direct:
            try:
                await feed.job_log.write(self._stream, data)
                return
            except Exception:
                log.exception(
                    "job %s: live log write failed; the live tail stops here, the log upload "
                    "goes on without it",
                    feed.job_log.job_id,
                )
                self._direct = True
                with trio.move_on_after(FINISH_BOUND, shield=True):
                    await feed.finish(feed.job_log.nbytes)
        feed.shipper.write_nowait(data)


__all__ = ["FINISH_BOUND", "LogFeed"]
