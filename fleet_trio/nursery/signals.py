"""SIGTERM and SIGINT become shutdown requests (design.md §3; node.md checklist 104).

:func:`serve_shutdown_signals` runs in the services scope, which is cancelled last, so it keeps
receiving signals for the whole shutdown: the first signal starts it, the second one (while the
tree is still draining) skips the rest of the drain, later ones are only logged. While it runs,
SIGINT never turns into ``KeyboardInterrupt``.

Trio coalesces a signal that arrives again before the service has read it: two SIGINTs in a
row, faster than the service runs, count as one.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Sequence
from typing import Protocol

import trio

log = logging.getLogger(__name__)

DEFAULT_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)


class ShutdownTarget(Protocol):
    """What a signal is forwarded to (a :class:`fleet_trio.nursery.TaskTree`)."""

    def request_shutdown(self, reason: str = ...) -> object: ...


async def serve_shutdown_signals(
    tree: ShutdownTarget,
    *,
    signals: Sequence[signal.Signals] = DEFAULT_SIGNALS,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Forward each of ``signals`` to ``tree.request_shutdown()``; ready once installed.

    Must run in the main thread (a trio restriction on signal handlers).

    Cancellation: the handlers are uninstalled at once (a later SIGTERM gets the default
    action). :func:`~fleet_trio.nursery.open_task_tree` runs it in the services scope, which is
    cancelled last, so signals are served until the tree has closed.
    """
    with trio.open_signal_receiver(*signals) as received:
        task_status.started()
        async for signum in received:
            name = _signal_name(signum)
            log.info("received %s", name)
            tree.request_shutdown(name)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


__all__ = ["DEFAULT_SIGNALS", "ShutdownTarget", "serve_shutdown_signals"]
