"""One websocket connection of ``fleet-trio tail``, robust to how it can end.

:func:`follow` connects (bounded by ``connect_timeout``), hands every message to
``on_message`` until it returns an exit status, then closes (bounded, shielded). It owns the
websocket's reader task in its own nursery, because trio-websocket's context manager lets a
failure of that task during the close handshake escape as a traceback (the server pings while
we close: ``LocalProtocolError: Event Pong … LOCAL_CLOSING``, then a stray ``Cancelled``).
Once ``on_message`` has decided, whatever the close does is moot: the status is returned.

Connection failures are raised as **one** exception (never a group): ``ConnectionRejected``
(an HTTP status instead of the upgrade), ``HandshakeError``/``OSError`` (not reachable),
:class:`ConnectTimeout`, ``ConnectionClosed`` (lost), :class:`TailLinkError` (the peer broke
the websocket or HTTP protocol), or what ``on_message`` raised.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import h11
import trio
import wsproto.utilities
from trio_websocket import ConnectionClosed, HandshakeError, connect_websocket_url


class ConnectTimeout(Exception):
    """No websocket within ``connect_timeout``."""


class TailLinkError(Exception):
    """The peer broke the websocket or HTTP protocol (or the library failed on it)."""


_LINK_ERRORS: tuple[type[BaseException], ...] = (
    h11.ProtocolError,
    wsproto.utilities.ProtocolError,
)

OnMessage = Callable[[str | bytes], Awaitable[int | None]]


def _leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first non-``Cancelled`` exception of a group (else its first one)."""
    leaves: list[BaseException] = []
    todo: list[BaseException] = [group]
    while todo:
        exc = todo.pop(0)
        if isinstance(exc, BaseExceptionGroup):
            todo.extend(exc.exceptions)
        else:
            leaves.append(exc)
    return next((e for e in leaves if not isinstance(e, trio.Cancelled)), leaves[0])


async def follow(
    url: str,
    on_message: OnMessage,
    *,
    headers: list[tuple[bytes, bytes]],
    max_message_size: int,
    connect_timeout: float,
    disconnect_timeout: float,
    on_open: Callable[[], None] = lambda: None,
) -> int:
    """Follow ``url`` until ``on_message`` returns a status (see the module docstring)."""
    status: int | None = None
    try:
        async with trio.open_nursery() as nursery:
            try:
                with trio.fail_after(connect_timeout):
                    ws = await connect_websocket_url(
                        nursery, url, extra_headers=headers, max_message_size=max_message_size
                    )
            except trio.TooSlowError:
                raise ConnectTimeout(f"no answer within {connect_timeout:g}s") from None
            on_open()
            try:
                while status is None:
                    status = await on_message(await ws.get_message())
            finally:
                with trio.move_on_after(disconnect_timeout, shield=True):
                    await ws.aclose()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        if group.split(KeyboardInterrupt)[0] is not None:
            raise KeyboardInterrupt from None  # ^C: bare, as the caller expects it
        if group.split(SystemExit)[0] is not None:
            raise
        if status is not None:
            return status  # the close failed after the end: moot
        leaf = _leaf(group)
        if isinstance(leaf, trio.Cancelled):
            raise  # a cancellation from outside: not ours to handle
        raise _translate(leaf)  # noqa: B904 (keeps its own __cause__: the reason)
    except _LINK_ERRORS as exc:
        if status is not None:
            return status
        raise TailLinkError(str(exc) or type(exc).__name__) from exc
    if status is None:  # pragma: no cover - the loop only ends with a status
        raise TailLinkError("connection ended without a status")
    return status


def _translate(exc: BaseException) -> BaseException:
    if isinstance(exc, _LINK_ERRORS):
        return TailLinkError(str(exc) or type(exc).__name__)
    return exc


__all__ = [
    "ConnectTimeout",
    "ConnectionClosed",
    "HandshakeError",
    "OnMessage",
    "TailLinkError",
    "follow",
]
