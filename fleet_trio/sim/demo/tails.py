"""The demo's live tails: every job's output followed over the real websocket tail (the
node's and the worker's ``tail_listen``) through the one tail client,
:mod:`fleet_trio.logbus.tail_client`, and printed line by line with the job's name in front."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Awaitable, Callable

import attrs
import trio

from fleet_trio.sim.demo.console import Console

TAIL_PATIENCE = 3.0
"""Seconds a live tail keeps trying to (re)connect without receiving anything."""
RETRY = -1
"""What the message handler returns to reconnect (the job's log is not open yet)."""


@attrs.define
class Tail:
    """One job's live output as the demo follows it (and what the story looks for in it)."""

    label: str
    colour: str
    lines: list[str] = attrs.Factory(list)
    problem: str | None = None
    finished: trio.Event = attrs.Factory(trio.Event)
    _changed: trio.Event = attrs.Factory(trio.Event)

    def poke(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_line(self, pattern: str, timeout: float = 15.0) -> re.Match[str] | None:  # noqa: ASYNC109
        """The first line matching ``pattern`` (a regex), waiting for it; ``None`` when the
        tail ended (or ``timeout`` passed) without one."""
        rx = re.compile(pattern)
        with trio.move_on_after(timeout):
            while True:
                for line in self.lines:
                    m = rx.search(line)
                    if m is not None:
                        return m
                if self.finished.is_set():
                    return None
                await self._changed.wait()
        return None


async def follow(
    con: Console,
    tail: Tail,
    base_url: str,
    job_id: str,
    *,
    ready: Callable[[], Awaitable[object]] | None = None,
    gone: Callable[[], bool] | None = None,
) -> None:
    """Follow ``job_id``'s tail on ``base_url`` from its first byte to its ``end``, printing
    each line as ``  label | line``.

    ``ready`` is awaited before connecting (a worker job's log exists once the worker has
    started the job; it may raise ``trio.TooSlowError``). A dropped connection is resumed
    from the last offset received, unless ``gone()`` says the server has shut down. Never
    raises: a tail that cannot be followed is reported in the output and in
    ``tail.problem``."""
    from fleet_trio.logbus.bus import End, Output, Skipped
    from fleet_trio.logbus.tail import MSG_UNKNOWN_JOB, TailProtocolError, loads
    from fleet_trio.logbus.tail_client import LOST, connection_problem, tail_url
    from fleet_trio.logbus.tail_client import follow as follow_once

    partial: dict[str, str] = {}
    prefix = con.paint(f"    {tail.label:<14}|", tail.colour)
    position: int | str = "start"
    problem = ""
    give_up = 0.0

    def emit(text: str, stream: str) -> None:
        tail.lines.append(text)
        shown = con.paint(text, "dim") if stream == "note" else text
        con.say(f"{prefix} {shown}")
        tail.poke()

    def feed(stream: str, data: str) -> None:
        text = partial.pop(stream, "") + data
        *complete, rest = text.split("\n")
        for line in complete:
            emit(line.rstrip("\r"), stream)
        if rest:
            partial[stream] = rest

    async def on_message(message: str | bytes) -> int | None:
        nonlocal position, give_up, problem
        event = loads(message)
        give_up = trio.current_time() + TAIL_PATIENCE
        if isinstance(event, Output):
            feed(event.stream, event.data.decode("utf-8", errors="replace"))
            position = event.offset + len(event.data)
        elif isinstance(event, Skipped):
            emit(f"({event.nbytes} bytes skipped)", "note")
            position = event.offset + event.nbytes
        elif isinstance(event, End):
            for stream in list(partial):
                emit(partial.pop(stream), stream)
            return 0
        elif event.message == MSG_UNKNOWN_JOB:
            problem = event.message  # not opened yet: try again shortly
            return RETRY
        else:
            raise TailProtocolError(event.message)
        return None

    try:
        if ready is not None:
            with contextlib.suppress(trio.TooSlowError):
                await ready()
        give_up = trio.current_time() + TAIL_PATIENCE
        while True:
            try:
                url = tail_url(base_url, job_id, {"from": str(position)})
                status = await follow_once(
                    url,
                    on_message,
                    headers=[],
                    max_message_size=4 << 20,
                    connect_timeout=5,
                    disconnect_timeout=2,
                )
                if status != RETRY:
                    return
            except LOST as exc:
                problem = connection_problem(exc)
                if gone is not None and gone():
                    tail.problem = "the server has shut down"
                    emit("(live tail closed: the node has shut down)", "note")
                    return
            if trio.current_time() >= give_up:
                raise TailProtocolError(problem)
            await trio.sleep(0.1)
    except TailProtocolError as exc:
        tail.problem = str(exc)
        emit(f"(live tail stopped: {exc})", "note")
    finally:
        tail.finished.set()
        tail.poke()
