"""The live log tail over websocket: the message protocol shared by server and client.

One websocket carries one job's log, server → client, as JSON **text** frames with a
``type`` tag (see ``docs/tail.md``)::

    {"type": "output", "stream": "stdout", "offset": 0, "t": 1700000000.25, "data": "hi\\n"}
    {"type": "output", "stream": "stderr", "offset": 3, "t": 1700000000.5,
     "data": "\\ufffd", "b64": "/w=="}
    {"type": "skipped", "offset": 4, "bytes": 1024}
    {"type": "end", "state": "done", "exit_code": 0, "reason": "", "offset": 1028}
    {"type": "error", "message": "unknown job"}

Output encoding (the choice): ``data`` is always present, the chunk decoded as UTF-8 with
invalid bytes replaced by U+FFFD (what a browser or a human displays). ``b64`` (standard
base64 of the raw bytes) is present **only** when the chunk is not valid UTF-8, i.e. when
``data`` is lossy. The raw bytes are therefore ``b64decode(b64)`` if ``b64`` is present, else
``data.encode("utf-8")`` — exact in both cases (:func:`output_bytes`). A multi-byte character
cut by a chunk boundary makes both chunks "invalid" and they carry ``b64``.

``offset`` is the position of the chunk's first byte in the job's log, as the log bus counts
it; a client that lost its connection resumes with ``from=<offset + len(raw bytes)>`` of the
last output (or ``offset + bytes`` of the last ``skipped``). Output chunks larger than
:data:`MAX_FRAME_DATA` bytes are split into several frames (offsets stay exact).

The stream ends with exactly one ``end`` (then the server closes with 1000), or with one
``error`` (then the server closes with :data:`CLOSE_UNKNOWN_JOB` or
:data:`CLOSE_BAD_REQUEST`).

Query parameters (:func:`parse_query`): ``from=start|now|<offset>`` (default ``start``) and
``streams=stdout,stderr`` (comma-separated, default both). Anything else is ignored (the node
reads ``token`` for browsers).

:func:`serve_tail` is the server side, independent of any web framework. The frames it sends
are :func:`dumps` of the messages above, byte for byte (:func:`output_text`).

Fan-out (:mod:`fleet_trio.logbus.fanout`): a server admits at most ``max_tails`` tails at
once and ``max_tails_per_job`` of one job (beyond them the route answers 503
``too many tails`` before the upgrade). The tails of one job share their frames' text (each
frame is encoded once) and take turns for their paced catch-ups, so that
watching a job costs it about as much with many tails as with one.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal, cast

import attrs
import trio

if TYPE_CHECKING:
    from fleet_trio.logbus.fanout import TailSlot

from fleet_trio.inputs import InputError, loads_json, printable
from fleet_trio.logbus.bus import MAX_LAG, End, LogBus, Output, Skipped, Stream, utf8_cut

STREAMS: tuple[Stream, ...] = ("stdout", "stderr")
ALL_STREAMS: frozenset[Stream] = frozenset(STREAMS)

MAX_FRAME_DATA = 64 << 10
"""Most raw bytes one ``output`` frame carries; larger chunks are split, and a subscriber
that is behind gets consecutive chunks of one stream joined up to this size. 64 KiB keeps
every buffer a frame goes through (the escaped text, its UTF-8, the websocket frame) below
the C allocator's 128 KiB threshold for fresh memory maps: a 256 KiB frame cost a page fault
per 4 KiB, several times over, on both ends."""

CATCH_UP_PAUSE = 0.01
"""Seconds a tail waits after catching up a reader that keeps falling behind (a ``skipped`` frame
and the frame after it, when it was skipped before and got less than ``MAX_LAG`` bytes of output
since, and the catch-up before was not paced) before it looks again: such a reader is sent about
100 samples a second of a flood, not frames with every CPU cycle the node and the reader have
free (on a busy machine, cycles taken from the job itself). A reader skipped once (it was away,
then reads fast) is not paced, so it drains what follows at full speed; a reader that keeps up
never waits; the job's end cuts a pause short."""

CLOSE_NORMAL = 1000
"""After ``end``."""
CLOSE_INTERNAL = 1011
"""The server failed while streaming (it sends an ``error`` frame first when it can)."""
CLOSE_BAD_REQUEST = 4400
"""After an ``error`` frame for a bad query (``from``, ``streams``)."""
CLOSE_UNKNOWN_JOB = 4404
"""After an ``error`` frame for a job the node has no log for."""

MSG_UNKNOWN_JOB = "unknown job"

Start = Literal["start", "now"] | int


class TailProtocolError(ValueError):
    """A bad query parameter or a malformed message."""


@attrs.frozen
class TailQuery:
    """What a tail asks for: where to start and which streams."""

    start: Start = "start"
    streams: frozenset[Stream] = ALL_STREAMS

    def to_params(self) -> dict[str, str]:
        """The query parameters (for a URL)."""
        params = {"from": str(self.start)}
        if self.streams != ALL_STREAMS:
            params["streams"] = ",".join(s for s in STREAMS if s in self.streams)
        return params


@attrs.frozen
class TailError:
    """An ``error`` message: the server refuses or gives up; nothing follows."""

    message: str


TailEvent = Output | Skipped | End | TailError


MAX_OFFSET = (1 << 63) - 1
"""Largest ``from`` offset accepted (a log never gets near it)."""
MAX_PARAM_LEN = 64
"""Longest query value looked at; longer ones are refused (and cut in the message)."""


def _shown(text: str) -> str:
    """A query value as an error message shows it: quoted, escaped, cut."""
    return '"' + printable(text, limit=MAX_PARAM_LEN) + '"'


def parse_start(text: str) -> Start:
    """``start`` | ``now`` | a non-negative integer offset (ASCII digits, at most 2**63-1)."""
    value = text.strip().lower() if len(text) <= MAX_PARAM_LEN else ""
    if value in ("start", "now"):
        return cast(Literal["start", "now"], value)
    # ASCII digits only: no sign, no spaces, no "1e3", no other script's digits ("²", "١")
    if value.isascii() and value.isdigit() and len(value) <= 19 and int(value) <= MAX_OFFSET:
        return int(value)
    raise TailProtocolError(
        f"from must be start, now or a byte offset from 0 to {MAX_OFFSET}, got {_shown(text)}"
    )


def parse_streams(text: str) -> frozenset[Stream]:
    """A comma-separated, non-empty subset of ``stdout,stderr``."""
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    chosen = frozenset(s for s in STREAMS if s in names)
    if len(text) > MAX_PARAM_LEN or not names or len(chosen) != len(set(names)):
        raise TailProtocolError(
            f"streams must be a comma-separated subset of stdout,stderr; got {_shown(text)}"
        )
    return chosen


def parse_query(query: Mapping[str, str]) -> TailQuery:
    """``from`` and ``streams`` of a tail request (other keys are ignored)."""
    start = parse_start(query["from"]) if query.get("from") else "start"
    streams = parse_streams(query["streams"]) if query.get("streams") else ALL_STREAMS
    return TailQuery(start=start, streams=streams)


# -- encoding ------------------------------------------------------------------------------------


def _finite(t: float) -> float:
    return t if math.isfinite(t) else 0.0


def encode_output(stream: str, offset: int, data: bytes, t: float) -> dict[str, Any]:
    """One ``output`` message (``data`` as text; ``b64`` only when the text is lossy)."""
    msg: dict[str, Any] = {"type": "output", "stream": stream, "offset": offset, "t": _finite(t)}
    try:
        msg["data"] = data.decode("utf-8")
    except UnicodeDecodeError:
        msg["data"] = data.decode("utf-8", errors="replace")
        msg["b64"] = base64.b64encode(data).decode("ascii")
    return msg


def frame_pieces(data: bytes, size: int = MAX_FRAME_DATA) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` of the pieces a chunk is sent in: at most ``size`` bytes each, cut
    before a UTF-8 continuation byte where one of the 3 bytes before the limit allows it (so a
    character is not split and both frames stay lossless). One empty piece for empty data."""
    start, n = 0, len(data)
    if n == 0:
        yield 0, 0
    while start < n:
        stop = utf8_cut(data, start + size, start) if n - start > size else n
        yield start, stop
        start = stop


def encode_event(event: TailEvent) -> list[dict[str, Any]]:
    """The message(s) for one event (an output chunk may be split, see :data:`MAX_FRAME_DATA`)."""
    if isinstance(event, Output):
        data = bytes(event.data)
        return [
            encode_output(event.stream, event.offset + i, data[i:j], event.t)
            for i, j in frame_pieces(data)
        ]
    if isinstance(event, Skipped):
        return [{"type": "skipped", "offset": event.offset, "bytes": event.nbytes}]
    if isinstance(event, End):  # its fields are in wire order: state, exit_code, reason, offset
        frame = {"type": "end", **attrs.asdict(event)}
        if event.cpu_seconds is None:
            del frame["cpu_seconds"]  # present only where the job's cgroup measured it
        return [frame]
    return [error_message(event.message)]


_JSON_ESCAPES: tuple[tuple[bytes, bytes], ...] = (
    (b"\\", b"\\\\"),  # first: the escapes below add backslashes
    (b'"', b'\\"'),
    (b"\n", b"\\n"),
    (b"\r", b"\\r"),
    (b"\t", b"\\t"),
    (b"\b", b"\\b"),
    (b"\f", b"\\f"),
    *((bytes((c,)), b"\\u%04x" % c) for c in range(0x20) if c not in b"\n\r\t\b\f"),
)
"""What JSON (as :func:`dumps` writes it) escapes in a string, as UTF-8 bytes: the quote, the
backslash and the C0 controls. No other byte of valid UTF-8 is escaped, and none of these
occurs inside a multi-byte character, so escaping the raw bytes is escaping the text."""


def output_text(stream: str, offset: int, data: bytes, t: float) -> str:
    """The text of one ``output`` frame: exactly ``dumps(encode_output(...))``, built without
    the JSON encoder for text that is valid UTF-8 (its string escaping looks at and copies one
    character at a time, about 200 MB/s; here each escape is one ``replace`` over the chunk's
    bytes, done only for the escapes the chunk holds)."""
    body = data
    for raw, escaped in _JSON_ESCAPES:
        if raw in body:
            body = body.replace(raw, escaped)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:  # lossy: "data" with U+FFFD, and "b64"
        return dumps(encode_output(stream, offset, data, t))
    head = dumps({"type": "output", "stream": stream, "offset": offset, "t": _finite(t)})
    return "".join((head[:-1], ',"data":"', text, '"}'))


def event_texts(event: TailEvent) -> Iterator[str]:
    """The frame text(s) for one event, one at a time (an output chunk may be split, see
    :data:`MAX_FRAME_DATA`): the texts of :func:`encode_event`'s messages, each built only when
    the previous one has been taken."""
    if isinstance(event, Output):
        data = bytes(event.data)
        for i, j in frame_pieces(data):
            piece = data if j - i == len(data) else data[i:j]
            yield output_text(event.stream, event.offset + i, piece, event.t)
        return
    for msg in encode_event(event):
        yield dumps(msg)


def error_message(message: str) -> dict[str, Any]:
    return {"type": "error", "message": message}


def dumps(msg: Mapping[str, Any]) -> str:
    """A message as the text of one frame (compact JSON, UTF-8 kept as is)."""
    return json.dumps(msg, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


# -- decoding ------------------------------------------------------------------------------------


def _cut(value: object) -> str:
    """A value from a message as an error shows it: its repr (escaped), cut."""
    text = repr(value)
    return text if len(text) <= MAX_PARAM_LEN else text[:MAX_PARAM_LEN] + "…"


def _int(msg: Mapping[str, Any], key: str) -> int:
    value = msg.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or (key != "exit_code" and value < 0):
        raise TailProtocolError(f"{_cut(msg.get('type'))} message: bad {key!r}: {_cut(value)}")
    return value


def _str(msg: Mapping[str, Any], key: str, default: str | None = None) -> str:
    value = msg.get(key, default)
    if not isinstance(value, str):
        raise TailProtocolError(f"{_cut(msg.get('type'))} message: bad {key!r}: {_cut(value)}")
    return value


def output_bytes(msg: Mapping[str, Any]) -> bytes:
    """The exact raw bytes of an ``output`` message."""
    b64 = msg.get("b64")
    if b64 is not None:
        if not isinstance(b64, str):
            raise TailProtocolError("output message: b64 must be a string")
        try:
            return base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise TailProtocolError(f"output message: bad b64: {exc}") from None
    return _str(msg, "data").encode("utf-8")


def decode_message(msg: Mapping[str, Any]) -> TailEvent:
    """A decoded message as the log bus's event (or :class:`TailError`)."""
    kind = msg.get("type")
    if kind == "output":
        stream = _str(msg, "stream")
        if stream not in ALL_STREAMS:
            raise TailProtocolError(f"output message: bad stream {_cut(stream)}")
        t = msg.get("t", 0.0)
        if not isinstance(t, int | float) or isinstance(t, bool) or not math.isfinite(t):
            raise TailProtocolError(f"output message: bad 't': {_cut(t)}")
        return Output(stream, _int(msg, "offset"), output_bytes(msg), float(t))
    if kind == "skipped":
        return Skipped(offset=_int(msg, "offset"), nbytes=_int(msg, "bytes"))
    if kind == "end":
        return End(
            offset=_int(msg, "offset"),
            state=_str(msg, "state"),
            exit_code=None if msg.get("exit_code") is None else _int(msg, "exit_code"),
            reason=_str(msg, "reason", ""),
            cpu_seconds=_cpu_seconds(msg),
        )
    if kind == "error":
        return TailError(_str(msg, "message", "error"))
    raise TailProtocolError(f"unknown message type {_cut(kind)}")


def _cpu_seconds(msg: Mapping[str, Any]) -> float | None:
    value = msg.get("cpu_seconds")
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise TailProtocolError(f"end message: bad 'cpu_seconds': {_cut(value)}")
    return float(value)


def loads(text: str | bytes) -> TailEvent:
    """Decode the text of one frame.

    A message is one flat object, so its nesting is left to the decoder's own recursion
    bound (a deep document is refused all the same) rather than to ``loads_json``'s
    character-by-character depth scan, which a frame of JSON log lines (more brackets in its
    ``data`` than the depth limit) would run over all of its text: ten times the decoding."""
    try:
        msg = loads_json(text, max_depth=len(text))  # finite numbers only
    except InputError as exc:
        raise TailProtocolError(f"not a valid message: {exc}") from None
    if not isinstance(msg, dict):
        raise TailProtocolError("a message must be a JSON object")
    return decode_message(msg)


# -- the server side -----------------------------------------------------------------------------

SendText = Callable[[str], Awaitable[None]]
"""Sends the text of one frame (a websocket text message)."""


async def serve_tail(
    bus: LogBus,
    job_id: str,
    send_text: SendText,
    query: Mapping[str, str],
    slot: TailSlot | None = None,
) -> int:
    """Stream one job's log as frames through ``send_text`` until its ``end``.

    Returns the websocket close code the caller should use: :data:`CLOSE_NORMAL` after
    ``end``; :data:`CLOSE_BAD_REQUEST` / :data:`CLOSE_UNKNOWN_JOB` after an ``error``
    message. A failure of ``send_text`` (the peer went away) propagates; so does a cancel.

    Each frame is encoded only when the one before it has been sent (:func:`event_texts`), so
    the task never holds the node's event loop for more than one frame's encoding. ``slot``
    (from :meth:`~fleet_trio.logbus.fanout.Tails.open`): the frames are shared with the job's
    other tails, and its paced catch-ups take turns with theirs; the caller closes it.

    Cancellation: safe at any point; the subscription is closed. The caller's ``send_text``
    must bound its own writes (the node and the worker's listener run on
    :func:`fleet_trio.nursery.httpserve.serve_http_bounded`, whose writes have deadlines).
    """
    try:
        q = parse_query(query)
    except TailProtocolError as exc:
        await send_text(dumps(error_message(str(exc))))
        return CLOSE_BAD_REQUEST
    log = bus.get(job_id)
    if log is None:
        await send_text(dumps(error_message(MSG_UNKNOWN_JOB)))
        return CLOSE_UNKNOWN_JOB
    try:
        subscription = log.subscribe(q.start, streams=q.streams, batch=MAX_FRAME_DATA)
    except ValueError as exc:  # e.g. an offset the log cannot serve
        await send_text(dumps(error_message(str(exc))))
        return CLOSE_BAD_REQUEST
    since_skip: int | None = None  # output bytes sent since the last catch-up (None: none yet)
    was_paced = False
    texts = slot.texts if slot is not None else event_texts
    send: SendText = send_text
    if slot is not None:
        tail_slot = slot

        async def send(text: str) -> None:  # in turn with the job's other tails
            await tail_slot.send(send_text, text)

    async def fetch() -> TailEvent | None:
        """The next event; with other tails of the job, taken when this one's turn to send
        has come (not before: a tail waiting for its turn holds no frame, and finds out then
        how far behind it has fallen)."""
        if slot is not None:
            await slot.wait_turn()
            ready = events.next_ready()
            if ready is not None:
                return ready
            slot.forgo()  # nothing to send yet: wait for output without a turn
        try:
            return await events.__anext__()
        except StopAsyncIteration:
            return None

    async with subscription as events:
        while (event := await fetch()) is not None:
            if isinstance(event, Skipped):
                # Behind again within MAX_LAG bytes of the last catch-up: it keeps falling
                # behind, so it is paced; skipped once (it was away), it reads on at full speed.
                # Never twice in a row: while paced, a reader cannot show that it keeps up, so
                # the catch-up after a paced one is not (a fast reader then drains and stays
                # caught up; a slow one is behind again within MAX_LAG and paced again).
                paced = since_skip is not None and since_skip < MAX_LAG and not was_paced
                since_skip, was_paced = 0, paced
                # The reader is behind (or its bytes were evicted). The skip and the event
                # after it are decided together, before the skip's frame is sent: the writer
                # runs on during that send, and a look afterwards would find the reader behind
                # again (a run of small ``skipped`` frames instead of one).
                following = events.next_ready()
                while isinstance(following, Skipped):
                    event = Skipped(event.offset, event.nbytes + following.nbytes)
                    following = events.next_ready()
                for text in texts(event):
                    await send(text)
                if following is None:
                    continue
                event = following
                if not isinstance(event, End):
                    for text in texts(event):
                        await send(text)
                    since_skip += len(event.data) if isinstance(event, Output) else 0
                    if paced:
                        now = trio.current_time()
                        turn = slot.catch_up_turn(now) if slot else now + CATCH_UP_PAUSE
                        with trio.move_on_at(turn):  # paced, but not the end
                            await log.wait_ended()
                    continue
            for text in texts(event):
                await send(text)
            if isinstance(event, End):
                return CLOSE_NORMAL
            if since_skip is not None and isinstance(event, Output):
                since_skip += len(event.data)
    # The subscription ended without an End (should not happen): say so.
    await send_text(dumps(error_message("log ended without an end event")))
    return CLOSE_INTERNAL


__all__ = [
    "ALL_STREAMS",
    "CATCH_UP_PAUSE",
    "CLOSE_BAD_REQUEST",
    "CLOSE_INTERNAL",
    "CLOSE_NORMAL",
    "CLOSE_UNKNOWN_JOB",
    "MAX_FRAME_DATA",
    "MAX_OFFSET",
    "MAX_PARAM_LEN",
    "MSG_UNKNOWN_JOB",
    "STREAMS",
    "SendText",
    "Start",
    "TailError",
    "TailEvent",
    "TailProtocolError",
    "TailQuery",
    "decode_message",
    "dumps",
    "encode_event",
    "encode_output",
    "error_message",
    "event_texts",
    "frame_pieces",
    "loads",
    "output_bytes",
    "output_text",
    "parse_query",
    "parse_start",
    "parse_streams",
    "serve_tail",
]
