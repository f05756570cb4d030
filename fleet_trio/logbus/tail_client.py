"""The one tail client (``fleet-trio tail`` and the demo): one websocket connection to a
node's or a worker's ``GET /fleet/jobs/JOB_ID/tail``, robust to how it can end.

:func:`follow` connects (bounded by ``connect_timeout``), hands every message to
``on_message`` until it returns an exit status, then closes (bounded, shielded). It owns the
websocket's reader task in its own nursery, because trio-websocket's context manager lets a
failure of that task during the close handshake escape as a traceback (the server pings while
we close: ``LocalProtocolError: Event Pong … LOCAL_CLOSING``, then a stray ``Cancelled``).
Once ``on_message`` has decided, whatever the close does is moot: the status is returned.

Connection failures are raised as **one** exception (never a group): ``ConnectionRejected``
(an HTTP status instead of the upgrade), ``HandshakeError``/``OSError`` (not reachable),
:class:`ConnectTimeout`, ``ConnectionClosed`` (lost), :class:`TailLinkError` (the peer broke
the websocket or HTTP protocol), or what ``on_message`` raised. :data:`LOST` names them all
(``ConnectionRejected`` is a ``HandshakeError``); :func:`connection_problem` says why in one
short line, and :func:`tail_url` builds the URL. Reconnecting from the last offset received is
the caller's policy.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable

import h11
import trio
import wsproto.utilities
from trio_websocket import ConnectionClosed, HandshakeError, connect_websocket_url

from fleet_trio.inputs import printable


class ConnectTimeout(Exception):
    """No websocket within ``connect_timeout``."""


class TailLinkError(Exception):
    """The peer broke the websocket or HTTP protocol (or the library failed on it)."""


_LINK_ERRORS: tuple[type[BaseException], ...] = (
    h11.ProtocolError,
    wsproto.utilities.ProtocolError,
)

LOST: tuple[type[BaseException], ...] = (
    HandshakeError,
    ConnectionClosed,
    OSError,
    ConnectTimeout,
    TailLinkError,
)
"""What :func:`follow` raises when the connection could not be opened or was lost."""

RECEIVE_BUFFER = 64 << 10
"""Bytes one socket read asks for (trio-websocket's default is 4 KiB: a 64 KiB frame took 16
trips through its reader loop and the websocket parser, each with a scheduler turn)."""

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
                        nursery,
                        url,
                        extra_headers=headers,
                        max_message_size=max_message_size,
                        receive_buffer_size=RECEIVE_BUFFER,
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
        if isinstance(leaf, _LINK_ERRORS):
            raise TailLinkError(str(leaf) or type(leaf).__name__)  # noqa: B904
        raise leaf  # noqa: B904 (keeps its own __cause__: the reason)
    assert status is not None  # the loop only ends with a status; a nursery raises groups
    return status


def tail_url(base: str, job_id: str, params: dict[str, str]) -> str:
    """The tail websocket URL of ``job_id`` under the node's base URL (``http(s)://`` is taken
    as ``ws(s)://``, a bare ``HOST:PORT`` as ``ws://``)."""
    from urllib.parse import quote, urlencode

    base = base.strip().rstrip("/")
    for http, ws in (("http://", "ws://"), ("https://", "wss://")):
        if base.lower().startswith(http):
            base = ws + base[len(http) :]
    if "://" not in base:
        base = "ws://" + base
    return f"{base}/fleet/jobs/{quote(job_id, safe='')}/tail?{urlencode(params)}"


def connection_problem(exc: BaseException) -> str:
    """One short line for why a websocket could not be opened or was lost."""
    if isinstance(exc, ConnectionClosed) and exc.reason is not None:
        reason = exc.reason
        text = printable(str(reason.reason), limit=200) if reason.reason else ""  # the server's
        return f"closed {reason.code}" + (f" {text}" if text else "")
    # HandshakeError wraps the OSError that says why; trio's "all attempts to connect … failed"
    # wraps (in a group) the errno of each attempt: the first errno found is the reason.
    todo: list[BaseException] = [exc]
    visited: set[int] = set()  # chains can loop (a group's context is its own member)
    fallback = ""
    while todo and len(visited) < 100:
        seen = todo.pop(0)
        if id(seen) in visited:
            continue
        visited.add(id(seen))
        if isinstance(seen, OSError):
            if seen.errno is not None and seen.errno > 0:
                return os.strerror(seen.errno)
            if seen.errno is not None and seen.strerror:  # getaddrinfo's negative codes
                return seen.strerror
            fallback = fallback or str(seen)
        if isinstance(seen, BaseExceptionGroup):
            todo.extend(seen.exceptions)
        todo.extend(e for e in (seen.__cause__, seen.__context__) if e is not None)
    return fallback or str(exc) or type(exc).__name__


__all__ = [
    "LOST",
    "RECEIVE_BUFFER",
    "ConnectTimeout",
    "ConnectionClosed",
    "HandshakeError",
    "OnMessage",
    "TailLinkError",
    "connection_problem",
    "follow",
    "tail_url",
]
