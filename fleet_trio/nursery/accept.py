"""The accept loop of the HTTP servers (``fleet_trio.nursery.httpserve``): a process out of
descriptors backs off and says so once in a while, never a traceback per try.

``trio.serve_listeners`` retries an ``accept`` that failed with EMFILE every 100 ms and logs
each failure at ERROR with its traceback: a node started with ``ulimit -n 64`` and flooded
with connections wrote 3,546 log lines, 525 of them tracebacks. :func:`accept_loop` backs off
from 0.1 s to 1 s, retries at once when one of the server's own connections closes (a
descriptor came back), and logs what :class:`AcceptBackoff` says: one WARNING per 10 s with a
count, one INFO line when accepting works again (docs/security.md "Descriptors").
"""

from __future__ import annotations

import errno
import logging
import math
import os
import resource
from collections.abc import Callable
from typing import Any, Protocol

import trio

log = logging.getLogger("fleet_trio.nursery.httpserve")
"""The server's logger: the lines belong to the server that could not accept."""

ACCEPT_BACKOFF_MIN = 0.1
"""First wait after an accept failed for lack of descriptors (or memory)."""
ACCEPT_BACKOFF_MAX = 1.0
"""Longest wait between accept attempts while out of descriptors (doubling from the first)."""
ACCEPT_WARN_INTERVAL = 10.0
"""At most one WARNING per this many seconds while accept keeps failing."""
ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
"""``accept`` errors that mean "not now" (the same set as ``trio.serve_listeners``)."""


class ConnectionsClosing(Protocol):
    """What the accept loop needs of a server's connections (``httpserve.Connections``)."""

    @property
    def freed(self) -> trio.Event: ...

    def connection_closed(self) -> None: ...


class AcceptBackoff:
    """What to do when ``accept`` fails for lack of descriptors (or memory): how long to wait
    before the next try, and which line to log (no I/O; the loop is :func:`accept_loop`).

    The wait starts at ``first`` and doubles up to ``most`` while accepts keep failing; a
    success resets it. A WARNING at the first failure and then at most one per ``warn_every``
    seconds, each with the number of failures it did not report; one INFO line when an accept
    succeeds again after a warned episode."""

    def __init__(
        self,
        *,
        first: float = ACCEPT_BACKOFF_MIN,
        most: float = ACCEPT_BACKOFF_MAX,
        warn_every: float = ACCEPT_WARN_INTERVAL,
    ) -> None:
        if not (0 < first <= most and math.isfinite(most) and warn_every >= 0):
            raise ValueError("need 0 < first <= most (finite) and warn_every >= 0")
        self.first = first
        self.most = most
        self.warn_every = warn_every
        self.delay = 0.0
        """The last wait given; 0 while accepts succeed."""
        self.unreported = 0
        """Failures since the last warning (not in any line yet)."""
        self.warned_at = -math.inf
        self.episode_began: float | None = None
        self.episode_failures = 0
        self.episode_warned = False

    def failed(self, now: float, reason: str) -> tuple[float, str | None]:
        """An accept failed at ``now`` with ``reason``: ``(seconds to wait, warning or None)``."""
        self.delay = self.first if self.delay == 0 else min(self.delay * 2, self.most)
        if self.episode_began is None:
            self.episode_began = now
            self.episode_failures = 0
            self.episode_warned = False
        self.episode_failures += 1
        if now - self.warned_at < self.warn_every:
            self.unreported += 1
            return self.delay, None
        line = f"cannot accept connections: {reason}; retrying within {self.most:g}s"
        if self.unreported:
            line += f" ({self.unreported} more failed accepts since the last warning)"
        self.warned_at = now
        self.unreported = 0
        self.episode_warned = True
        return self.delay, line

    def accepted(self, now: float) -> str | None:
        """An accept succeeded at ``now``: the line to log (INFO) after a warned episode."""
        began, failures, warned = self.episode_began, self.episode_failures, self.episode_warned
        self.delay = 0.0
        self.episode_began = None
        self.episode_failures = 0
        self.episode_warned = False
        if began is None or not warned:
            return None
        return f"accepting connections again ({failures} failed accepts over {now - began:.1f}s)"


def accept_failure_reason(code: int) -> str:
    """``EMFILE (too many open files; descriptor limit 64)``: what an operator needs."""
    name = errno.errorcode.get(code, str(code))
    text = f"{name} ({os.strerror(code).lower()}"
    if code == errno.EMFILE:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        text += f"; descriptor limit {soft}, see ulimit -n / LimitNOFILE"
    return text + ")"


async def accept_loop(
    listener: trio.SocketListener,
    handler: Callable[[trio.SocketStream], Any],
    handler_nursery: trio.Nursery,
    connections: ConnectionsClosing,
    backoff: AcceptBackoff | None = None,
) -> None:
    """Accept connections on ``listener`` and start ``handler(stream)`` for each in
    ``handler_nursery`` (the stream is closed when the handler ends), until cancelled.

    An accept that fails for lack of descriptors or memory (``ACCEPT_CAPACITY_ERRNOS``) is
    retried after :class:`AcceptBackoff`'s wait, sooner when one of ``connections`` closes;
    logged as it says (no traceback). Any other ``OSError`` of ``accept`` ends the loop with it
    (trio's listener already retries the transient ones, such as ``ECONNABORTED``).

    Cancellation: closes the listener and ends; handlers run on in their nursery."""
    backoff = backoff if backoff is not None else AcceptBackoff()

    async def run_handler(stream: trio.SocketStream) -> None:
        try:
            await handler(stream)
        finally:
            await trio.aclose_forcefully(stream)
            connections.connection_closed()

    async with listener:
        while True:
            freed = connections.freed
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in ACCEPT_CAPACITY_ERRNOS:
                    raise
                delay, line = backoff.failed(trio.current_time(), accept_failure_reason(exc.errno))
                if line is not None:
                    log.warning("%s", line)
                with trio.move_on_after(delay):
                    await freed.wait()
                continue
            line = backoff.accepted(trio.current_time())
            if line is not None:
                log.info("%s", line)
            handler_nursery.start_soon(run_handler, stream)


__all__ = [
    "ACCEPT_BACKOFF_MAX",
    "ACCEPT_BACKOFF_MIN",
    "ACCEPT_CAPACITY_ERRNOS",
    "ACCEPT_WARN_INTERVAL",
    "AcceptBackoff",
    "ConnectionsClosing",
    "accept_failure_reason",
    "accept_loop",
]
