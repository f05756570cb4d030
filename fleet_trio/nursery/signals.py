"""SIGTERM, SIGINT and SIGHUP become shutdown requests (design.md §3; node.md checklist 104).

SIGHUP (a closed SSH session after ``fleet-trio node … &``, a terminal window closed) drains
exactly as SIGTERM does; before, its default action killed the process at once and orphaned
the jobs. A SIGHUP that was already ignored when the service starts (``nohup``) stays ignored:
the operator asked for the hangup to be ignored. SIGINT and SIGTERM are served even when
ignored at start (a script's ``cmd &`` starts ``cmd`` with SIGINT ignored).

A signal that came before the service started, while the entry point's handler
(``fleet_trio.launch.EarlySignals``) held the signals inside ``trio.run``, is taken over from
that handler (its ``take_pending``) and served as soon as the service is ready.

:func:`serve_shutdown_signals` runs in the services scope, which is cancelled last, so it keeps
receiving signals for the whole shutdown: the first signal starts it, the second one (while the
tree is still draining) skips the rest of the drain, later ones are only logged. While it runs,
SIGINT never turns into ``KeyboardInterrupt``.

Each signal is forwarded from the handler through :meth:`trio.lowlevel.TrioToken.run_sync_soon`
(the one trio call that is safe in a signal handler), not through :func:`trio.open_signal_receiver`:
that receiver re-delivers, with its default action, a signal it has not read when it closes, so a
second SIGTERM landing as the tree closed killed the process (exit -15) in the middle of a clean
shutdown. A signal after the service has closed gets the handler that was there before.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterable, Sequence
from types import FrameType
from typing import Protocol

import trio

log = logging.getLogger(__name__)

DEFAULT_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

RESPECTED_IF_IGNORED: frozenset[signal.Signals] = frozenset({signal.SIGHUP})
"""Signals left ignored when the service finds them ignored (``nohup``)."""


class ShutdownTarget(Protocol):
    """What a signal is forwarded to (a :class:`fleet_trio.nursery.TaskTree`)."""

    def request_shutdown(self, reason: str = ...) -> object: ...


async def serve_shutdown_signals(
    tree: ShutdownTarget,
    *,
    signals: Sequence[signal.Signals] = DEFAULT_SIGNALS,
    absorb_after_close: bool = False,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Forward each of ``signals`` to ``tree.request_shutdown()``; ready once installed.

    Must run in the main thread (a trio restriction on signal handlers).

    ``absorb_after_close``: for a process whose life is the tree (the CLI's ``node``,
    ``worker``, ``exec``): when the service closes, the signals are ignored instead of getting
    the previous handler back, so a second SIGTERM landing in the last milliseconds
    of the exit does not end a clean shutdown by its default action (exit -15).

    Cancellation: the handlers are uninstalled at once (a later SIGTERM gets the handler that
    was there before, the default action in a process of its own); a signal that came just
    before is still forwarded, never re-delivered. :func:`~fleet_trio.nursery.open_task_tree`
    runs it in the services scope, which is cancelled last, so signals are served until the
    tree has closed.
    """
    token = trio.lowlevel.current_trio_token()

    def forward(signum: int) -> None:
        # runs in trio's run loop, as a run_sync_soon callback: it must not raise
        name = _signal_name(signum)
        try:
            if signum == signal.SIGHUP:  # not an operator's usual stop: say so at any level
                log.warning("received SIGHUP (the terminal or session closed?): draining")
            else:
                log.info("received %s", name)
            tree.request_shutdown(name)
        except Exception:
            log.exception("forwarding %s to the task tree failed", name)

    def handler(signum: int, frame: FrameType | None) -> None:
        token.run_sync_soon(forward, signum, idempotent=True)

    previous: dict[signal.Signals, Callable[[int, FrameType | None], object] | int | None] = {}
    try:
        for signum in signals:
            if signum in RESPECTED_IF_IGNORED and signal.getsignal(signum) == signal.SIG_IGN:
                log.debug("%s is ignored (nohup): left ignored", _signal_name(signum))
                continue
            previous[signum] = signal.signal(signum, handler)
        early = _take_early(previous.values())
        task_status.started()
        for came in early:  # came before the service, inside trio.run: served now
            forward(came)
        await trio.sleep_forever()
    finally:
        for signum, was in previous.items():
            if absorb_after_close:
                # ignored, not a Python handler: the interpreter's finalization puts a Python
                # handler back to the default action, and the exit is where the signal lands;
                # nothing is spawned after the tree has closed, so no child inherits it
                signal.signal(signum, signal.SIG_IGN)
            else:
                # None: a handler not installed from Python; the default is the honest fallback
                signal.signal(signum, signal.SIG_DFL if was is None else was)


def _take_early(handlers: Iterable[object]) -> list[int]:
    """The signals the entry point's handler recorded before this service replaced it."""
    taken: list[int] = []
    for was in handlers:
        take = getattr(was, "take_pending", None)
        if callable(take):
            taken.extend(take())
    return taken


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


__all__ = ["DEFAULT_SIGNALS", "RESPECTED_IF_IGNORED", "ShutdownTarget", "serve_shutdown_signals"]
