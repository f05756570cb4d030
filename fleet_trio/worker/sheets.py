"""Usage sheets (worker-protocol.md §9.2): ``host.md`` and ``host.d/<device>.md``, capped at
64 KiB of valid UTF-8 as sent."""

from __future__ import annotations

import errno
import logging
import os
import stat

import trio

from fleet_trio.worker.config import WorkerConfig

log = logging.getLogger("fleet_trio.worker.worker")

MAX_SHEET = 65536
SHEET_TIMEOUT = 5.0
"""Seconds one sheet read may take; past it the read is abandoned in its thread (which keeps
its limiter's token until it returns) and the sheet is unreadable."""
SHEET_MARKER = "\n...(truncated: sheet exceeds 64KB)\n"


def truncate_sheet(data: bytes) -> str:
    """A sheet as sent (§9.2): at most 64 KiB of valid UTF-8, cut on a character boundary.

    Invalid bytes become U+FFFD first, so the cap holds for what is actually sent (the
    reference once produced invalid UTF-8 that grew past 64 KiB when encoded).
    """
    text = data.decode("utf-8", errors="replace")
    encoded = text.encode("utf-8")
    if len(encoded) <= MAX_SHEET:
        return text
    cut = MAX_SHEET - len(SHEET_MARKER.encode("utf-8"))
    while cut > 0 and (encoded[cut] & 0xC0) == 0x80:  # never end inside a character
        cut -= 1
    return encoded[:cut].decode("utf-8") + SHEET_MARKER


def read_sheet_head(path: str) -> bytes:
    """The first ``MAX_SHEET + 4`` bytes of the regular file at ``path``: all that can reach
    the sent sheet (every byte read is at least one byte sent). A FIFO, a device or a directory
    is an ``OSError`` at once (opened without blocking, checked before any read), so neither
    a FIFO without a writer nor ``/dev/zero`` can hang or fill the worker."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        chunks: list[bytes] = []
        left = MAX_SHEET + 4
        while left > 0 and (chunk := os.read(fd, left)):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


async def read_sheets(
    cfg: WorkerConfig, *, limiter: trio.CapacityLimiter | None = None
) -> tuple[str | None, dict[str, str]]:
    """``host.md`` (missing ⇒ ``""``, unreadable ⇒ ``None``) and ``host.d/<dev>.md``.

    Each read runs in a thread of ``limiter`` (the sheet directory's own, held by the worker;
    a fresh one of one token when ``None``) under :data:`SHEET_TIMEOUT`: a read that hangs (a
    dead network mount) is abandoned and that sheet is unreadable; while its thread lives, the
    next reads time out waiting for its token, and nothing else is starved.

    Cancellation: safe at any point (file reads in worker threads, abandoned on cancel)."""
    lim = limiter if limiter is not None else trio.CapacityLimiter(1)

    async def one(path: str) -> str | None:
        try:
            with trio.fail_after(SHEET_TIMEOUT):
                data = await trio.to_thread.run_sync(
                    read_sheet_head, path, limiter=lim, abandon_on_cancel=True
                )
            return truncate_sheet(data)
        except FileNotFoundError:
            return ""
        except OSError as exc:
            log.warning("usage sheet %s unreadable: %s", path, exc.strerror or exc)
            return None
        except trio.TooSlowError:
            log.warning("usage sheet %s unreadable: no answer within %gs", path, SHEET_TIMEOUT)
            return None

    sheet = await one(os.path.join(cfg.sheet_dir, "host.md"))
    devices: dict[str, str] = {}
    for d in cfg.devices:
        text = await one(os.path.join(cfg.sheet_dir, "host.d", f"{d.name}.md"))
        if text is not None:
            devices[d.name] = text
    return sheet, devices


__all__ = ["MAX_SHEET", "SHEET_MARKER", "SHEET_TIMEOUT", "read_sheets", "truncate_sheet"]
