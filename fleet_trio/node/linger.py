"""The poll linger: after the drain, the node answers ``GET /fleet/jobs/{id}`` (only) a little
longer, so a dispatcher polling every few seconds reads the terminal state of the jobs the
shutdown ended instead of a refused connection.

:class:`PollLinger` is plain synchronous bookkeeping plus one event. The node tells it which
jobs were in flight when the drain began (:meth:`PollLinger.drain_began`); the poll route
reports each poll that returned a terminal state (:meth:`PollLinger.polled_terminal`). The
linger step of the shutdown (:meth:`PollLinger.wait`, bounded by ``poll_linger`` in the task
tree) returns as soon as every one of those jobs has been polled in its terminal state — at
once when there were none — or when its deadline passes.
"""

from __future__ import annotations

from collections.abc import Iterable

import trio


class PollLinger:
    def __init__(self) -> None:
        self.active = False
        """True during the linger step: every route but the poll answers 503."""
        self._watch: set[str] = set()
        self._seen: set[str] = set()
        self._changed = trio.Event()
        self._skipped = False

    def skip(self) -> None:
        """No poller will come (an in-process harness shutting its node down): no linger."""
        self._skipped = True
        self._wake()

    def drain_began(self, in_flight: Iterable[str]) -> None:
        """The jobs whose terminal state a poller has yet to read."""
        self._watch.update(in_flight)
        self._wake()

    @property
    def unseen(self) -> set[str]:
        return self._watch - self._seen

    def polled_terminal(self, job_id: str) -> None:
        if job_id in self._watch and job_id not in self._seen:
            self._seen.add(job_id)
            self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait(self) -> None:
        """The linger step: serve polls until every watched job was polled terminal.

        Cancellation: the task tree bounds it with ``poll_linger``; a cancel simply ends it.
        """
        self.active = True
        while self.unseen and not self._skipped:
            await self._changed.wait()


__all__ = ["PollLinger"]
