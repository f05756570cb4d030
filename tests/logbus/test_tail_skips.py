"""A tail reader that lags behind a fast writer: one ``skipped`` frame per catch-up, paced by
``CATCH_UP_PAUSE``, the offsets still cover every byte; ``Subscription.next_ready`` never
waits."""

from __future__ import annotations

import itertools
import json
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from fleet_trio.logbus.bus import MAX_LAG, LogBus, Output, Skipped
from fleet_trio.logbus.tail import CATCH_UP_PAUSE, CLOSE_NORMAL, output_bytes, serve_tail
from tests.helpers import elapse, wait_until

CHUNK = 300 << 10  # what the writer adds while one frame is being sent


async def tail_behind_a_burst(
    bus: LogBus,
    job_id: str,
    send_text: Callable[[str], Awaitable[None]],
    then: Callable[[], Awaitable[None]] | None = None,
) -> int:
    """Serve the tail of ``job_id`` from the start through ``send_text``; once it has
    subscribed, a burst (three ``MAX_LAG`` writes) puts the reader more than max_lag behind at
    once, then ``then()`` writes on. The tail's close code, once it has ended."""
    log = bus.open(job_id)
    code: list[int] = []

    async def tail() -> None:
        code.append(await serve_tail(bus, job_id, send_text, {"from": "start"}))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(tail)
        await wait_until(lambda: bus.stats().subscribers == 1, what="the tail subscribed")
        for _ in range(3):
            await log.write("stderr", b"x" * MAX_LAG)
        if then is not None:
            await then()
    [close_code] = code
    return close_code


async def test_a_lagging_reader_gets_one_skipped_frame_per_catch_up(
    autojump_clock: trio.testing.MockClock,
) -> None:
    bus = LogBus()
    log = bus.open("job-lag")
    frames: list[dict[str, Any]] = []
    writes = 40

    async def send_text(text: str) -> None:
        # The writer runs on while a frame is sent (each send is a checkpoint in the node).
        nonlocal writes
        frames.append(json.loads(text) | {"at": trio.current_time()})
        if writes:
            writes -= 1
            await log.write("stderr", b"y" * CHUNK)
        elif log.ended is None:
            log.end("done", 0)
            ended_at.append(trio.current_time())

    ended_at: list[float] = []
    with trio.fail_after(10):
        assert await tail_behind_a_burst(bus, "job-lag", send_text) == CLOSE_NORMAL
    kinds = [f["type"] for f in frames]
    assert kinds[-1] == "end"
    assert kinds.count("skipped") >= 3, kinds  # it did lag, again and again
    runs = [a for a, b in itertools.pairwise(kinds) if a == b == "skipped"]
    assert runs == [], kinds  # never two skipped frames in a row
    # The frames account for every byte, in order, with no overlap.
    pos = 0
    for f in frames[:-1]:
        assert f["offset"] == pos, (f["type"], f["offset"], pos)
        pos += f["bytes"] if f["type"] == "skipped" else len(output_bytes(f))
    assert pos == frames[-1]["offset"] == log.nbytes == 3 * MAX_LAG + 40 * CHUNK
    # Paced: from its second catch-up on (skipped again within MAX_LAG bytes of the first),
    # every other catch-up waits CATCH_UP_PAUSE before the next look (the one after a paced
    # catch-up is not: the reader may show it keeps up), so at most two skips per pause.
    skips = [f["at"] for f in frames if f["type"] == "skipped" and f["at"] < ended_at[0]]
    assert len(skips) >= 4, skips
    paced = zip(skips[1:], skips[3:], strict=False)
    assert all(b - a >= CATCH_UP_PAUSE - 1e-9 for a, b in paced), skips
    # ... but the end is not held back by a pause: it goes out when the job ends.
    assert frames[-2]["type"] == "output"  # the end came during a catch-up's pause
    assert frames[-1]["at"] == ended_at[0]


async def test_next_ready_hands_out_what_is_there_without_waiting() -> None:
    bus = LogBus()
    log = bus.open("job-ready")
    sub = log.subscribe("start", max_lag=10)
    with trio.fail_after(5):
        assert sub.next_ready() is None  # nothing written yet: no wait, no event
        await log.write("stdout", b"abc")
        ev = sub.next_ready()
        assert isinstance(ev, Output) and ev.data == b"abc"
        await log.write("stdout", b"z" * 30)  # now more than max_lag behind
        ev = sub.next_ready()
        assert ev == Skipped(3, 20)
        assert bus.stats().bytes_skipped == 20  # counted like one that __anext__ returns
        ev = sub.next_ready()
        assert isinstance(ev, Output) and ev.offset == 23 and ev.data == b"z" * 10
        assert sub.next_ready() is None
        await sub.aclose()
        await log.write("stdout", b"more")
        assert sub.next_ready() is None  # closed


async def test_a_reader_that_lagged_once_catches_up_at_full_speed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Pacing is for a reader that keeps falling behind, not for one that fell behind once: a
    fast reader skipped past a burst drains what follows at full speed and is never skipped
    again, though the job goes on writing 16 MB/s (a pause after every catch-up kept such a
    reader 1 MiB behind, skipped a hundred times a second, for the rest of the job)."""
    bus = LogBus()
    log = bus.open("job-once")
    frames: list[dict[str, Any]] = []

    async def send_text(text: str) -> None:  # a fast reader: every frame taken at once
        frames.append(json.loads(text))
        await trio.lowlevel.checkpoint()

    async def then() -> None:
        for _ in range(500):  # 64 KiB every 4 ms for 2 s
            await log.write("stderr", b"y" * (64 << 10))
            await elapse(0.004)
        log.end("done", 0)

    with trio.fail_after(30):
        assert await tail_behind_a_burst(bus, "job-once", send_text, then) == CLOSE_NORMAL
    kinds = [f["type"] for f in frames]
    # skipped during the burst only (how many depends on how the burst's writes interleave
    # with the reader's sends), then never again: the 32 MB after it all arrive
    assert 1 <= kinds.count("skipped") <= 3, kinds.count("skipped")
    skipped = sum(f["bytes"] for f in frames if f["type"] == "skipped")
    delivered = sum(len(output_bytes(f)) for f in frames if f["type"] == "output")
    assert delivered == log.nbytes - skipped
    assert skipped <= 3 * MAX_LAG, skipped
