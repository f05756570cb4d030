"""Run work once a response is on its way: the dispatch's job starts after its 202 is written.

A dispatched job used to start the moment its ack was committed — at the very moment the
handler went on to build and write the 202. The job's start (its log line, its live log, the
spawn: a worker thread running ``Popen`` under the GIL, then a child interpreter on the same
cores) then competed with the ack it belonged to, and the ack waited. The dispatch handler
now hands its job's release to :func:`after_response`, and :class:`AfterSend` (the app's ASGI
wrapper) calls it once the response's last byte has been handed to the server. When the request
ends any other way (an error, a client gone, a cancel, a write that raised) the callback's
``unsent`` counterpart runs instead — the dispatch withdraws its ack then: a job whose 202 was
never written never runs (docs/node.md "Delivery-checked acks") — or, without one, the callback
itself, so nothing registered is ever lost.

Outside :class:`AfterSend` (a handler called without the wrapper) :func:`after_response` runs
the function at once. Callbacks are plain synchronous functions; one that raises is logged
and the others still run.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from quart import request

log = logging.getLogger(__name__)

SCOPE_KEY = "fleet_trio.after_send"
"""Where :class:`AfterSend` keeps a request's callbacks (in its ASGI scope)."""

Scope = Any
"""An ASGI scope (a dict; typed loosely: Quart's and hypercorn's ASGI types differ)."""
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]


def _run(scope: Scope, *, sent: bool) -> None:
    callbacks = scope.get(SCOPE_KEY)
    if not callbacks:
        return
    pending = list(callbacks)
    callbacks.clear()
    for fn, unsent in pending:
        try:
            (fn if sent or unsent is None else unsent)()
        except Exception:
            log.exception("a callback after the response failed")


def after_response(fn: Callable[[], None], *, unsent: Callable[[], None] | None = None) -> None:
    """Call ``fn`` once the current request's response is written; when the request ends
    without that (no response, or its write raised), ``unsent`` instead (``fn`` when no
    ``unsent`` is given). At once (``fn``) outside :class:`AfterSend`. Call it from a request
    handler."""
    scope: dict[str, Any] = request.scope  # type: ignore[assignment]
    callbacks = scope.get(SCOPE_KEY)
    if callbacks is None:
        fn()
    else:
        callbacks.append((fn, unsent))


def sends_after() -> bool:
    """True when the current request runs inside :class:`AfterSend` (callbacks of
    :func:`after_response` then wait for the response to be written)."""
    scope: dict[str, Any] = request.scope  # type: ignore[assignment]
    return scope.get(SCOPE_KEY) is not None


class AfterSend:
    """ASGI wrapper of an app (``app.asgi_app = AfterSend(app.asgi_app)``): runs the
    callbacks of :func:`after_response` after the final body message of an HTTP response
    was sent, and their ``unsent`` counterparts when the request's handling ends without
    that."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        scope[SCOPE_KEY] = []

        async def sent(message: Any) -> None:
            final = message.get("type") == "http.response.body" and not message.get(
                "more_body", False
            )
            try:
                await send(message)
            except trio.Cancelled:
                # hypercorn cancels the app as soon as the response is complete (the stream's
                # close sends ``http.disconnect``), inside this very send: written all the same
                if final:
                    _run(scope, sent=True)
                raise
            # another error: the write failed, the callbacks go to ``unsent``
            if final:
                _run(scope, sent=True)

        try:
            await self.app(scope, receive, sent)
        finally:
            _run(scope, sent=False)


__all__ = ["SCOPE_KEY", "AfterSend", "after_response", "sends_after"]
