"""Stop tokens: how a job, a hook or a script pass is asked to stop.

A stop is *not* a trio cancellation. Trio cancellation is reserved for shutdown; a stop request
(``rc kill``, a limit) is an event the supervisor turns into a ``Result``, so the caller can
still verify and report. A token may have a deadline and a parent: it counts as stopped when it
was set, when its deadline has passed, or when its parent is stopped. The supervisor waits on a
token's deadline with a cancel-scope deadline, never by polling :meth:`StopToken.is_set`. Pass
budgets (hooks, probes, verify) are cancel scopes around the pass instead of tokens: ``run``
keeps the ``Result`` of the script a scope cuts short (``record``).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable

import trio


class StopToken:
    """A settable, deadline-aware, hierarchical stop request.

    ``on_set`` (optional) is called synchronously when the token is set, directly or through
    its parent; a deadline passing does not call it (waiters use :meth:`wait` or the
    ``deadline`` attribute for that).
    """

    def __init__(
        self,
        *,
        parent: StopToken | None = None,
        deadline: float = math.inf,
        on_set: Callable[[], None] | None = None,
    ) -> None:
        self._event = trio.Event()
        self._children: weakref.WeakSet[StopToken] | None = None  # made with the first child
        self._on_set = on_set
        self.deadline: float = deadline if parent is None else min(deadline, parent.deadline)
        if parent is not None:
            if parent._children is None:
                parent._children = weakref.WeakSet()
            parent._children.add(self)
            if parent._event.is_set():
                self.set()

    @classmethod
    def after(cls, seconds: float, *, parent: StopToken | None = None) -> StopToken:
        """A token that stops by itself ``seconds`` from now (a budget)."""
        return cls(parent=parent, deadline=trio.current_time() + seconds)

    def child(self, *, deadline: float = math.inf) -> StopToken:
        return StopToken(parent=self, deadline=deadline)

    def set(self) -> None:
        """Ask for a stop. Idempotent; reaches every child token."""
        if self._event.is_set():
            return
        self._event.set()
        if self._on_set is not None:
            self._on_set()
        for child in list(self._children or ()):
            child.set()

    @property
    def was_set(self) -> bool:
        """True when someone asked for the stop (not merely a passed deadline)."""
        return self._event.is_set()

    def expired(self) -> bool:
        """True when the token's deadline (or an ancestor's) has passed."""
        return trio.current_time() >= self.deadline

    def is_set(self) -> bool:
        return self._event.is_set() or self.expired()

    async def wait(self) -> None:
        """Return once the token is stopped, by request or by deadline.

        Cancellation: a plain checkpoint; cancelling the wait does not set the token.
        """
        with trio.move_on_at(self.deadline):
            await self._event.wait()


__all__ = ["StopToken"]
