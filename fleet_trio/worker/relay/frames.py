"""The relay's frame codec (worker-protocol.md §8.2 "Input frame format").

:func:`encode_data` / :func:`encode_resize` write one NDJSON line (``{"t":"d","b":"bHM="}``,
``{"t":"r","rows":48,"cols":180}``; ``b`` omitted when empty, ``rows``/``cols`` omitted when
0). :class:`FrameReader` is incremental: it reassembles lines split across reads, skips blank
lines and frames of an unknown ``t``, and raises :class:`FrameError` on malformed JSON, a
wrongly typed field, bad base64, a size outside 0–65535 or a line over 1 MiB.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging

import attrs

from fleet_trio.inputs import InputError, loads_json

log = logging.getLogger(__name__)

MAX_FRAME_LINE = 1 << 20
"""Longest input frame line (bytes, without the newline), §13."""
MAX_DIMENSION = 65535


class FrameError(ValueError):
    """An input frame that cannot be decoded (malformed JSON, bad field, line too long)."""


@attrs.frozen
class DataFrame:
    """``{"t":"d","b":<base64>}``: keystrokes / bytes for the process."""

    data: bytes


@attrs.frozen
class ResizeFrame:
    """``{"t":"r","rows":R,"cols":C}``: a terminal window size (0 means "not given")."""

    rows: int
    cols: int


Frame = DataFrame | ResizeFrame


def _dump(obj: dict[str, object]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode("ascii") + b"\n"


def encode_data(data: bytes) -> bytes:
    """One data frame line, ``\\n``-terminated (``b"ls"`` → ``{"t":"d","b":"bHM="}``)."""
    obj: dict[str, object] = {"t": "d"}
    if data:
        obj["b"] = base64.b64encode(data).decode("ascii")
    return _dump(obj)


def encode_resize(rows: int, cols: int) -> bytes:
    """One resize frame line (``{"t":"r","rows":48,"cols":180}``); zero sizes are omitted."""
    for value in (rows, cols):
        if not 0 <= value <= MAX_DIMENSION:
            raise ValueError(f"terminal size out of range: {rows}x{cols}")
    obj: dict[str, object] = {"t": "r"}
    if rows:
        obj["rows"] = rows
    if cols:
        obj["cols"] = cols
    return _dump(obj)


def _dimension(obj: dict[str, object], key: str) -> int:
    value = obj.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise FrameError(f"frame field {key!r} is not an integer: {value!r}")
    if not 0 <= value <= MAX_DIMENSION:
        raise FrameError(f"frame field {key!r} out of range: {value}")
    return value


def decode_frame(line: bytes) -> Frame | None:
    """Decode one line. ``None`` for a blank line or an unknown ``t`` (skipped)."""
    text = line.strip()
    if not text:
        return None
    try:
        # controller input: depth-bounded, finite numbers, strings as Go reads them
        obj = loads_json(text, max_depth=8, go_text=True)
    except InputError as exc:
        raise FrameError(f"malformed frame: {exc}") from None
    if not isinstance(obj, dict):
        raise FrameError(f"frame is not a JSON object: {text[:64]!r}")
    kind = obj.get("t")
    if kind is not None and not isinstance(kind, str):
        raise FrameError(f"frame field 't' is not a string: {kind!r}")
    if kind == "d":
        b = obj.get("b")
        if b is None:
            return DataFrame(b"")
        if not isinstance(b, str):
            raise FrameError(f"frame field 'b' is not a string: {b!r}")
        try:
            return DataFrame(base64.b64decode(b, validate=True))
        except (binascii.Error, ValueError) as exc:
            raise FrameError(f"frame field 'b' is not base64: {exc}") from None
    if kind == "r":
        return ResizeFrame(_dimension(obj, "rows"), _dimension(obj, "cols"))
    log.debug("relay: skipping a frame of unknown type %r", kind)
    return None


class FrameReader:
    """Incremental NDJSON decoder: :meth:`feed` bytes as they arrive, :meth:`finish` at EOF.

    After a :class:`FrameError` the reader is unusable (input handling ends, §8.2).
    """

    def __init__(self, max_line: int = MAX_FRAME_LINE) -> None:
        self.max_line = max_line
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        frames: list[Frame] = []
        self._buf += data
        start = 0
        while True:
            end = self._buf.find(b"\n", start)
            if end < 0:
                break
            if end - start > self.max_line:
                raise FrameError(f"frame line longer than {self.max_line} bytes")
            frame = decode_frame(bytes(self._buf[start:end]))
            if frame is not None:
                frames.append(frame)
            start = end + 1
        del self._buf[:start]
        if len(self._buf) > self.max_line:
            raise FrameError(f"frame line longer than {self.max_line} bytes")
        return frames

    def finish(self) -> list[Frame]:
        """EOF: a last line without its newline still counts (as Go's ``bufio.Scanner``)."""
        rest, self._buf = bytes(self._buf), bytearray()
        frame = decode_frame(rest)
        return [] if frame is None else [frame]


__all__ = [
    "MAX_FRAME_LINE",
    "DataFrame",
    "Frame",
    "FrameError",
    "FrameReader",
    "ResizeFrame",
    "decode_frame",
    "encode_data",
    "encode_resize",
]
