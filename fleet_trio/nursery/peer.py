"""Is the client of a request still there? A look at its connection, without reading it.

The HTTP server (:mod:`fleet_trio.nursery.httpserve`) hands each request's connection to the
app in its ASGI scope (:func:`with_peer`); a handler asks :func:`peer_of` for it and calls
:meth:`Peer.gone` (before it commits to an answer) or :meth:`Peer.reset` (after the answer's
bytes were handed to the kernel).

Hypercorn stops reading a connection while one of its requests is being answered (HTTP/1.1 is
answered in order), so a client that closed or reset its connection meanwhile is not seen by
the server until the answer is written. :meth:`Peer.gone` sees it at once: one ``poll(2)`` with
a zero timeout on the socket (nothing is read, nothing blocks):

- ``POLLERR`` / ``POLLHUP``: the connection was reset or is closed both ways;
- ``POLLRDHUP`` (Linux): the client closed its side (EOF), also when bytes it sent before are
  still unread — a request pipelined after this one is data, never EOF, and so is never taken
  for a gone client. A client that half-closes after its request and still waits for the answer
  is taken as gone: the server itself drops such a connection once it reads the EOF.

Where ``POLLRDHUP`` does not exist, a ``MSG_PEEK`` read of one byte tells EOF (``b""``) apart
from unread data (then the client is taken as present).

A reset after the answer was written is a lost answer only while the client's kernel never
acknowledged it: a client that read its answer and then closed abortively (an RST at once:
``SO_LINGER`` 0, some proxies) is no loss. On Linux the socket's ``TCP_INFO`` counts the bytes
the client acknowledged (``tcpi_bytes_acked``, kept after the reset) and ``SIOCOUTQ`` the bytes
written and not yet acknowledged: :meth:`Peer.answering`, right before the answer is written,
notes how many the client must acknowledge for the answer to have reached it. Elsewhere (or on
an older kernel) every reset after the answer counts as a loss.
"""

from __future__ import annotations

import fcntl
import select
import socket
import struct
import termios
from typing import Any

SCOPE_KEY = "fleet_trio.peer"
"""Where :func:`with_peer` puts a request's :class:`Peer` (in its ASGI scope)."""

_RDHUP: int = getattr(select, "POLLRDHUP", 0)

GONE_RESET = "the client reset its connection"
GONE_CLOSED = "the client closed its connection"

_TCP_INFO: int | None = getattr(socket, "TCP_INFO", None)
_BYTES_ACKED_AT = 120
"""Offset of ``tcpi_bytes_acked`` (a u64) in Linux's ``struct tcp_info`` (since 4.1)."""
_OUTQ: int | None = getattr(termios, "TIOCOUTQ", None)
"""``SIOCOUTQ``: bytes in the send queue the peer has not acknowledged (Linux)."""


def _acked(sock: Any) -> int | None:
    """Bytes the peer has acknowledged on ``sock`` (kept after a reset), or ``None``."""
    if _TCP_INFO is None:
        return None
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 256)
    except (OSError, AttributeError, TypeError):
        return None
    if len(raw) < _BYTES_ACKED_AT + 8:
        return None
    return int(struct.unpack_from("Q", raw, _BYTES_ACKED_AT)[0])


def _unacked(fd: int) -> int | None:
    """Bytes written on ``fd`` and not yet acknowledged by the peer, or ``None``."""
    if _OUTQ is None:
        return None
    try:
        raw = fcntl.ioctl(fd, _OUTQ, b"\0\0\0\0")
    except OSError:
        return None
    return int(struct.unpack("i", raw)[0])


class Peer:
    """The client end of one connection, as its socket shows it (no I/O but ``poll``)."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        """A trio or standard socket (anything with ``fileno()`` and ``recv``)."""
        self._reached_at: int | None = None
        """Acknowledged bytes that mean the answer being written reached the client's kernel
        (:meth:`answering`); ``None`` when unknown."""

    def _events(self) -> int | None:
        """The socket's ready events now; ``None`` once the server closed the socket."""
        fd = self.sock.fileno()
        if fd < 0:
            return None
        poller = select.poll()
        poller.register(fd, select.POLLIN | _RDHUP)
        ready = poller.poll(0)
        return ready[0][1] if ready else 0

    def gone(self) -> str | None:
        """Why the client is gone (reset, or EOF on its side), or ``None`` while it is there.

        A socket the server has already closed counts as gone: nothing can reach the client."""
        events = self._events()
        if events is None:
            return GONE_CLOSED
        if events & (select.POLLERR | select.POLLNVAL):
            return GONE_RESET
        if events & select.POLLHUP:
            return GONE_CLOSED
        if _RDHUP:
            return GONE_CLOSED if events & _RDHUP else None
        if events & select.POLLIN:  # no POLLRDHUP here: EOF reads as b"", data as data
            try:
                head = self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return None
            except OSError:
                return GONE_RESET
            return GONE_CLOSED if head == b"" else None
        return None

    def answering(self) -> None:
        """Right before an answer is written: note what the client must acknowledge for it to
        have reached the client's kernel (every byte written before it, and its first)."""
        self._reached_at = None
        fileno = getattr(self.sock, "fileno", None)
        fd = fileno() if fileno is not None else -1
        if fd < 0:
            return
        acked, unacked = _acked(self.sock), _unacked(fd)
        if acked is not None and unacked is not None:
            self._reached_at = acked + unacked + 1

    def reset(self) -> str | None:
        """After an answer was written: why it cannot have been read (the connection was
        reset: ``POLLERR``, or ``POLLHUP`` on a socket the server still holds open and so has
        not shut), or ``None``. An EOF now is a client that read its answer and closed, and a
        socket the server closed (``Connection: close``) was written whole: neither is a loss.
        Nor is a reset once the client's kernel acknowledged the answer (:meth:`answering`):
        the client read it and closed abortively, or its timeout fired the very instant the
        answer arrived (the window no server can close, docs/node.md)."""
        events = self._events()
        if events is None:
            return None
        if not events & (select.POLLERR | select.POLLHUP):
            return None
        if self._reached_at is not None:
            acked = _acked(self.sock)
            if acked is not None and acked >= self._reached_at:
                return None
        return GONE_RESET


def peer_of(scope: Any) -> Peer | None:
    """The request's :class:`Peer` (``None`` outside :func:`with_peer`, e.g. a test client)."""
    peer = scope.get(SCOPE_KEY) if isinstance(scope, dict) else None
    return peer if isinstance(peer, Peer) else None


def with_peer(app: Any, sock: Any) -> Any:
    """Hypercorn's app wrapper for one connection: each request's scope carries a
    :class:`Peer` of ``sock`` under :data:`SCOPE_KEY`."""
    peer = Peer(sock)

    async def call(scope: Any, *args: Any) -> None:  # hypercorn's AppWrapper signature
        scope[SCOPE_KEY] = peer
        await app(scope, *args)

    return call


__all__ = ["GONE_CLOSED", "GONE_RESET", "SCOPE_KEY", "Peer", "peer_of", "with_peer"]
