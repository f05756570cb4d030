"""Many live tails of one job (docs/tail.md "Many tails"): the caps, the frames the tails of a
job share, and their turns to send. The node's and the worker's routes are tested in
tests/logbus/test_tail_node.py and tests/worker/test_tail_listener.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing

from fleet_trio.logbus.bus import MAX_LAG, LogBus
from fleet_trio.logbus.fanout import SENDING_PER_JOB, TailLimits, Tails
from fleet_trio.logbus.tail import CLOSE_NORMAL, output_bytes, serve_tail
from tests.helpers import elapse, wait_until


def test_caps_per_job_and_in_all_and_slots_come_back() -> None:
    tails = Tails(TailLimits(max_tails=5, max_tails_per_job=3))
    a = [tails.open("job-a", 0.0) for _ in range(3)]
    assert all(a) and tails.count("job-a") == 3
    assert tails.open("job-a", 0.0) is None  # the 4th tail of one job
    b = [tails.open("job-b", 0.0) for _ in range(2)]
    assert all(b) and tails.open_count == 5
    assert tails.open("job-c", 0.0) is None  # the 6th in all, another job
    slot = a[0]
    assert slot is not None
    slot.close()
    slot.close()  # idempotent: a slot is given back once
    assert tails.count("job-a") == 2 and tails.open_count == 4
    assert tails.open("job-c", 0.0) is not None  # a freed slot is taken again
    for s in [*a[1:], *b]:
        assert s is not None
        s.close()
    assert tails.count("job-a") == tails.count("job-b") == 0 and tails.open_count == 1


@pytest.mark.parametrize("value", [0, -1, True, 2.5])
def test_limits_must_be_whole_numbers_from_one(value: Any) -> None:
    with pytest.raises(ValueError, match="max_tails_per_job"):
        TailLimits(max_tails_per_job=value)


def test_refusals_are_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    tails = Tails(TailLimits(max_tails=1, max_tails_per_job=1))
    assert tails.open("j", 0.0) is not None
    for now in (1.0, 2.0, 3.0):
        assert tails.open("j", now) is None
    assert tails.open("j", 100.0) is None
    lines = [r for r in caplog.records if "too many tails" in r.getMessage()]
    assert len(lines) == 2, [r.getMessage() for r in lines]
    assert "4 refused so far" in lines[1].getMessage()


def log_content() -> list[tuple[str, bytes]]:
    """Writes of every kind a frame is built from: lines, a chunk larger than a frame (cut in
    pieces), bytes that are not UTF-8, both streams, JSON escapes."""
    big = "".join(f'step {i} loss 0.{i:04d} é\t"q"\n' for i in range(9000)).encode()
    return [
        ("stdout", b"hello\n"),
        ("stderr", big),
        ("stderr", b"\xff\xfe not utf-8\n"),
        ("stdout", b"\x00\x1b[31mred\x1b[0m\n"),
        ("stderr", b"tail \xe2\x82"),  # a character cut by the chunk boundary
        ("stderr", b"\xac end\n"),
    ]


async def frames_of(bus: LogBus, job_id: str, n: int, tails: Tails | None) -> list[list[str]]:
    """The frame texts ``n`` concurrent tails of ``job_id`` (from the start) are sent."""
    got: list[list[str]] = [[] for _ in range(n)]
    slots = [tails.open(job_id, trio.current_time()) if tails else None for _ in range(n)]

    async def one(i: int) -> None:
        slot = slots[i]
        try:

            async def send_text(text: str) -> None:
                got[i].append(text)
                await trio.lowlevel.checkpoint()

            assert await serve_tail(bus, job_id, send_text, {"from": "start"}, slot) == 1000
        finally:
            if slot is not None:
                slot.close()

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(one, i)
    return got


async def test_frames_of_many_tails_are_one_tails_frames_byte_for_byte() -> None:
    bus = LogBus()
    log = bus.open("job-many")
    for stream, data in log_content():
        await log.write(stream, data)  # type: ignore[arg-type]
    log.end("done", 0)
    with trio.fail_after(30):
        [alone] = await frames_of(bus, "job-many", 1, None)
        tails = Tails()
        many = await frames_of(bus, "job-many", 8, tails)
    assert all(frames == alone for frames in many)
    assert json.loads(alone[-1])["type"] == "end"
    assert b"".join(output_bytes(json.loads(f)) for f in alone[:-1]) == b"".join(
        data for _, data in log_content()
    )
    outputs = len(alone) - 1
    # each output frame encoded once, the other seven tails took it as it was
    assert tails.encoded == outputs and tails.shared == 7 * outputs


async def test_a_job_with_another_log_under_its_id_never_gets_the_old_frames() -> None:
    tails = Tails()
    for content in (b"first log\n", b"other log\n"):  # same id, offsets, lengths
        bus = LogBus()
        log = bus.open("job-again")
        await log.write("stdout", content)
        log.end("done", 0)
        with trio.fail_after(10):
            many = await frames_of(bus, "job-again", 2, tails)
        assert all(output_bytes(json.loads(f[0])) == content for f in many)


def covered(frames: list[dict[str, Any]]) -> int:
    """The frames account for every byte in order (output or skipped); the end's offset."""
    pos = 0
    for f in frames[:-1]:
        assert f["offset"] == pos
        pos += f["bytes"] if f["type"] == "skipped" else len(output_bytes(f))
    assert frames[-1]["type"] == "end" and frames[-1]["offset"] == pos
    return pos


async def test_a_tail_that_stops_reading_costs_the_job_and_the_other_tails_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Three tails of a job stop reading (their first send does not end: more of them than
    the job's turns to send); the job writes 16 MiB at 6.4 MB/s and ends. The reading tail
    gets every byte and the end; the stuck ones, once their clients read again, are told
    what they missed (``skipped``) and get the end too."""
    bus = LogBus()
    log = bus.open("job-stuck")
    tails = Tails()
    stuck = SENDING_PER_JOB + 1
    reading_again = trio.Event()
    stuck_frames: list[list[dict[str, Any]]] = [[] for _ in range(stuck)]
    fast: list[dict[str, Any]] = []

    def stuck_send(i: int) -> Any:
        async def send_text(text: str) -> None:
            stuck_frames[i].append(json.loads(text))
            await reading_again.wait()

        return send_text

    async def fast_send(text: str) -> None:
        fast.append(json.loads(text))
        await trio.lowlevel.checkpoint()

    async def tail(send_text: Any) -> None:
        slot = tails.open("job-stuck", trio.current_time())
        assert slot is not None
        try:
            await serve_tail(bus, "job-stuck", send_text, {"from": "start"}, slot)
        finally:
            slot.close()

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for i in range(stuck):
                nursery.start_soon(tail, stuck_send(i))
            nursery.start_soon(tail, fast_send)
            await wait_until(lambda: tails.count("job-stuck") == stuck + 1, what="all tails")
            await log.write("stderr", b"first\n")
            await wait_until(lambda: all(stuck_frames), what="the stuck sends")
            for _ in range(256):  # the writer never waits for a tail
                await log.write("stderr", b"y" * (64 << 10))
                await elapse(0.01)  # 64 KiB per 10 ms of virtual time
            log.end("done", 0)
            await wait_until(lambda: fast and fast[-1]["type"] == "end", what="the fast end")
            assert [len(f) for f in stuck_frames] == [1] * stuck  # still in their first send
            reading_again.set()
    assert tails.open_count == 0  # every slot given back
    assert covered(fast) == log.nbytes == 6 + 256 * (64 << 10)
    assert "skipped" not in [f["type"] for f in fast]  # the reading tail got every byte
    for frames in stuck_frames:
        assert covered(frames) == log.nbytes
        skipped = sum(f["bytes"] for f in frames if f["type"] == "skipped")
        assert skipped >= log.nbytes - 6 - MAX_LAG  # all but the newest MAX_LAG bytes


async def test_a_jobs_tails_send_in_turns(autojump_clock: trio.testing.MockClock) -> None:
    """However many tails a job has, at most SENDING_PER_JOB of them send at once (the job's
    pump shares the event loop with them), and each gets its turns (first come, first
    served)."""
    bus = LogBus()
    log = bus.open("job-turns")
    tails = Tails()
    sending = 0
    most = 0
    sent = [0] * 10

    def sender(i: int) -> Any:
        async def send_text(text: str) -> None:
            nonlocal sending, most
            sending += 1
            most = max(most, sending)
            sent[i] += 1
            await elapse(0.001)  # a send that takes a while
            sending -= 1

        return send_text

    async def tail(i: int) -> None:
        slot = tails.open("job-turns", trio.current_time())
        assert slot is not None
        try:
            code = await serve_tail(bus, "job-turns", sender(i), {"from": "start"}, slot)
            assert code == CLOSE_NORMAL
        finally:
            slot.close()

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for i in range(10):
                nursery.start_soon(tail, i)
            await wait_until(lambda: tails.count("job-turns") == 10, what="all tails")
            for k in range(20):
                await log.write("stdout", b"line %d\n" % k)
                await elapse(0.05)
            log.end("done", 0)
    assert most == SENDING_PER_JOB
    assert sent == [21] * 10  # every line and the end, to every tail
    assert tails.open_count == 0
