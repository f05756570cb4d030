"""The log bus: ordering, completeness, lag, eviction, spill, retention."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import trio
import trio.testing

from fleet_trio.logbus import End, Event, JobLog, LogBus, Output, Skipped, Stream, Subscription
from fleet_trio.proc import BufferSink, JobSpec, TeeSink, run
from tests.helpers import elapse, scenario_pause, wait_until


async def collect(sub: Subscription) -> list[Event]:
    events: list[Event] = []
    async with sub:
        async for ev in sub:
            events.append(ev)
    return events


def check_cover(events: list[Event], start: int = 0) -> bytes:
    """Outputs and Skipped cover [start, End.offset) contiguously; return the Output bytes."""
    pos = start
    out = bytearray()
    assert isinstance(events[-1], End)
    assert sum(isinstance(e, End) for e in events) == 1
    for ev in events[:-1]:
        assert not isinstance(ev, End)
        assert ev.offset == pos, (ev, pos)
        if isinstance(ev, Output):
            out += ev.data
            pos += len(ev.data)
        else:
            assert ev.nbytes > 0
            pos += ev.nbytes
    assert pos == events[-1].offset
    return bytes(out)


def outputs(events: list[Event]) -> bytes:
    return b"".join(e.data for e in events if isinstance(e, Output))


async def test_every_byte_in_order_with_many_subscribers() -> None:
    log = LogBus().open("job-1")
    expected = b"".join(b"line %d\n" % i for i in range(2000))
    results: list[list[Event]] = []

    async def reader(sub: Subscription) -> None:
        results.append(await collect(sub))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(reader, log.subscribe())
            await trio.testing.wait_all_tasks_blocked()
            sink = log.sink("stdout")
            for i in range(2000):
                await sink.write(b"line %d\n" % i)
            log.end("done", 0)
            # a late subscriber from the start sees the same bytes
            nursery.start_soon(reader, log.subscribe("start"))
    assert len(results) == 11
    for events in results:
        assert check_cover(events) == expected
        assert events[-1] == End("done", 0, "", len(expected))
        assert all(isinstance(e, Output) and e.stream == "stdout" for e in events[:-1])


async def test_interleaved_streams_offsets_are_global() -> None:
    log = JobLog("j")
    await log.write("stdout", b"aa")
    await log.write("stderr", b"bbb")
    await log.write("stdout", b"c")
    log.end("done", 0)
    events = await collect(log.subscribe())
    assert [(e.stream, e.offset, e.data) for e in events if isinstance(e, Output)] == [
        ("stdout", 0, b"aa"),
        ("stderr", 2, b"bbb"),
        ("stdout", 5, b"c"),
    ]
    out = events[0]
    assert isinstance(out, Output)
    assert abs(out.t - time.time()) < 60
    # streams filter: offsets stay global, End always delivered
    err_only = await collect(log.subscribe(streams=frozenset({"stderr"})))
    first = err_only[0]
    assert isinstance(first, Output)
    assert err_only == [Output("stderr", 2, b"bbb", first.t), End("done", 0, "", 6)]


async def test_start_offset_now_and_beyond() -> None:
    log = JobLog("j")
    await log.write("stdout", b"0123456789")
    mid = log.subscribe(4)
    now = log.subscribe("now")
    neg = log.subscribe(-5)
    beyond = log.subscribe(15)
    await log.write("stdout", b"abcdefghij")
    log.end("done", 0)
    mid_ev = await collect(mid)
    assert check_cover(mid_ev, 4) == b"456789abcdefghij"
    assert mid_ev[0] == Output("stdout", 4, b"456789", mid_ev[0].t)  # type: ignore[union-attr]
    assert check_cover(await collect(now), 10) == b"abcdefghij"
    assert check_cover(await collect(neg), 0) == b"0123456789abcdefghij"
    assert check_cover(await collect(beyond), 15) == b"fghij"
    # after the end, an offset beyond it is clamped: End straight away
    assert await collect(log.subscribe(99)) == [End("done", 0, "", 20)]


async def test_subscriber_waits_for_offset_beyond_end() -> None:
    log = JobLog("j")
    got: list[Event] = []

    async def reader() -> None:
        got.extend(await collect(log.subscribe(3)))

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            assert got == []
            await log.write("stdout", b"ab")
            await trio.testing.wait_all_tasks_blocked()
            assert got == []
            await log.write("stdout", b"cdef")
            log.end("done", 0)
    assert check_cover(got, 3) == b"def"


async def test_end_idempotent_and_writes_after_end_ignored() -> None:
    log = JobLog("j")
    await log.write("stdout", b"abc")
    log.end("killed", -1, "cancelled")
    log.end("done", 0, "late")
    await log.write("stdout", b"more")
    await log.sink("stderr").write(b"more")
    assert log.ended == End("killed", -1, "cancelled", 3)
    assert log.nbytes == 3
    events = await collect(log.subscribe())
    assert check_cover(events) == b"abc"
    assert events[-1] == End("killed", -1, "cancelled", 3)


async def test_end_mid_write_from_a_real_child() -> None:
    """A job killed mid-write: every byte up to End.offset arrives, in order, then one End."""
    log = LogBus().open("child")
    tee = BufferSink()
    script = 'i=0; while :; do echo "line $i"; i=$((i+1)); done'
    got: list[Event] = []

    async def reader() -> None:
        got.extend(await collect(log.subscribe()))

    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            with trio.CancelScope() as scope:

                async def stop_soon() -> None:
                    await wait_until(lambda: log.nbytes >= 200_000)
                    log.end("killed", -1, "cancelled")  # while the child is still writing
                    await scenario_pause(0.05, why="the child is still writing after the log ended")
                    scope.cancel()

                nursery.start_soon(stop_soon)
                await run(
                    JobSpec(command=("sh", "-c", script), grace_ceiling=1.0),
                    TeeSink(tee, log.sink()),
                )
    end = log.ended
    assert end is not None and end.state == "killed"
    data = check_cover(got)
    assert got[-1] == end
    assert len(data) == end.offset >= 200_000
    assert data == tee.getvalue()[: end.offset]
    assert len(tee.getvalue()) >= end.offset
    lines = data.split(b"\n")
    assert lines[:3] == [b"line 0", b"line 1", b"line 2"]


async def test_real_child_both_streams() -> None:
    log = LogBus().open("child2")
    script = "for i in 1 2 3; do echo out$i; echo err$i >&2; done"
    with trio.fail_after(10):
        res = await run(
            JobSpec(command=("sh", "-c", script), stderr_sink=log.sink("stderr")), log.sink()
        )
    log.end("done", res.exit_code)
    events = await collect(log.subscribe())
    check_cover(events)
    out = b"".join(e.data for e in events if isinstance(e, Output) and e.stream == "stdout")
    err = b"".join(e.data for e in events if isinstance(e, Output) and e.stream == "stderr")
    assert out == b"out1\nout2\nout3\n"
    assert err == b"err1\nerr2\nerr3\n"
    assert events[-1] == End("done", 0, "", log.nbytes)


async def test_stuck_subscriber_does_not_slow_the_writer() -> None:
    log = LogBus().open("big")
    stuck = log.subscribe()
    live = log.subscribe()
    chunk = b"x" * 65536
    n = 800  # ~50 MB
    live_bytes = 0

    async def live_reader() -> None:
        nonlocal live_bytes
        async for ev in live:
            if isinstance(ev, Output):
                live_bytes += len(ev.data)

    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(live_reader)
            started = trio.current_time()
            for _ in range(n):
                await log.write("stdout", chunk)
            elapsed = trio.current_time() - started
            log.end("done", 0)
    assert elapsed < 10
    assert log.history.size <= 8 << 20
    assert live_bytes == n * len(chunk)
    events = await collect(stuck)
    assert isinstance(events[0], Skipped)
    # lag rule: resumes exactly max_lag (1 MiB) behind the end
    assert events[0] == Skipped(0, n * len(chunk) - (1 << 20))
    assert len(check_cover(events)) == 1 << 20
    assert events[-1] == End("done", 0, "", n * len(chunk))


async def test_lag_jump_mid_chunk() -> None:
    log = JobLog("lag")
    sub = log.subscribe(max_lag=10)
    for i in range(5):
        await log.write("stdout", bytes([65 + i]) * 4)  # 20 bytes in chunks of 4
    ev = await sub.__anext__()
    assert ev == Skipped(0, 10)
    ev = await sub.__anext__()
    assert isinstance(ev, Output) and (ev.offset, ev.data) == (10, b"CC")
    log.end("done", 0)
    rest = [ev async for ev in sub]
    assert check_cover(rest, 12) == b"DDDDEEEE"


async def test_batch_hands_out_a_large_chunk_in_pieces() -> None:
    # A reader with a batch size never gets more than it asked for in one Output: a chunk
    # larger than that comes in pieces (cut before a UTF-8 continuation byte), and the lag
    # rule is applied between pieces, so a reader that is behind skips ahead sooner.
    log = JobLog("pieces")
    sub = log.subscribe(max_lag=100, batch=16)
    text = ("ab€" * 20).encode()  # 100 bytes, a 3-byte character every 5
    await log.write("stdout", text)
    first = await sub.__anext__()
    assert isinstance(first, Output) and first.offset == 0 and len(first.data) <= 16
    first.data.decode("utf-8")  # a whole number of characters
    await log.write("stdout", b"x" * 60)  # now more than max_lag behind
    ev = await sub.__anext__()
    assert ev == Skipped(len(first.data), 160 - 100 - len(first.data))
    log.end("done", 0)
    rest = [ev async for ev in sub]
    pieces = [ev for ev in rest if isinstance(ev, Output)]
    assert all(len(ev.data) <= 16 for ev in pieces)
    assert check_cover(rest, 60) == (text + b"x" * 60)[60:]
    for ev in pieces:  # offset 60 starts a character, and so does every cut after it
        ev.data.decode("utf-8")


async def test_lag_excludes_backlog_present_at_subscribe() -> None:
    log = JobLog("backlog")
    await log.write("stdout", b"a" * 100)
    sub = log.subscribe("start", max_lag=10)
    await log.write("stdout", b"b" * 5)  # lag is 5 (<= 10): no skip
    log.end("done", 0)
    assert check_cover(await collect(sub)) == b"a" * 100 + b"b" * 5


async def test_eviction_gives_skipped_then_continues() -> None:
    bus = LogBus(history_bytes=100)
    log = bus.open("ev")
    for i in range(30):
        await log.write("stdout", bytes([48 + i % 10]) * 10)
    assert log.history.size <= 100
    assert log.history.start == 200
    log.end("done", 0)
    events = await collect(log.subscribe("start"))
    assert events[0] == Skipped(0, 200)
    assert len(check_cover(events)) == 100
    events = await collect(log.subscribe(205))
    assert events[0] == Output("stdout", 205, b"00000", events[0].t)  # type: ignore[union-attr]


async def test_oversized_chunk_is_kept_whole() -> None:
    log = JobLog("huge", history_bytes=10)
    await log.write("stdout", b"a" * 8)
    await log.write("stdout", b"b" * 50)
    assert log.history.chunks() == [(8, "stdout", b"b" * 50)]
    log.end("done", 0)
    events = await collect(log.subscribe())
    assert events[0] == Skipped(0, 8)
    assert check_cover(events) == b"b" * 50


async def test_spill_file_serves_evicted_bytes(tmp_path: Path) -> None:
    bus = LogBus(history_bytes=1000, spill_dir=str(tmp_path))
    log = bus.open("sp-1")
    expected = bytearray()
    for i in range(200):
        data = b"%05d:" % i + bytes([97 + i % 26]) * (i % 50)
        stream: Stream = "stderr" if i % 7 == 0 else "stdout"
        await log.write(stream, data)
        expected += data
    log.end("done", 0)
    assert log.history.start > 0
    assert (tmp_path / "sp-1.log").read_bytes() == expected
    events = await collect(log.subscribe())
    assert not any(isinstance(e, Skipped) for e in events)
    assert check_cover(events) == expected
    # stream attribution survives the spill
    err = b"".join(e.data for e in events if isinstance(e, Output) and e.stream == "stderr")
    want_err = b"".join(b"%05d:" % i + bytes([97 + i % 26]) * (i % 50) for i in range(0, 200, 7))
    assert err == want_err
    only_err = await collect(log.subscribe(streams=frozenset({"stderr"})))
    assert outputs(only_err) == want_err
    assert only_err[-1] == End("done", 0, "", len(expected))
    # a new log with the same id (a new bus) truncates the old file
    log2 = LogBus(spill_dir=str(tmp_path)).open("sp-1")
    await log2.write("stdout", b"new")
    assert (tmp_path / "sp-1.log").read_bytes() == b"new"


async def test_spill_file_lost_falls_back_to_skipped(tmp_path: Path) -> None:
    log = LogBus(history_bytes=10, spill_dir=str(tmp_path)).open("sp-2")
    for _ in range(5):
        await log.write("stdout", b"0123456789")
    log.end("done", 0)
    os.unlink(tmp_path / "sp-2.log")
    events = await collect(log.subscribe())
    assert events[0] == Skipped(0, 40)
    assert check_cover(events) == b"0123456789"


async def test_spill_unwritable_dir_keeps_history(tmp_path: Path) -> None:
    log = LogBus(history_bytes=10, spill_dir=str(tmp_path / "missing")).open("sp-3")
    for _ in range(3):
        await log.write("stdout", b"0123456789")
    log.end("done", 0)
    events = await collect(log.subscribe())
    assert events[0] == Skipped(0, 20)
    assert check_cover(events) == b"0123456789"


@pytest.mark.parametrize(
    "bad", ["", "../etc/passwd", "a/b", "a\x00b", "sp ace", "é", "x" * 257, "a\nb", ".hidden"]
)
async def test_job_id_validation(bad: str) -> None:
    bus = LogBus(spill_dir="/tmp")
    with pytest.raises(ValueError):
        bus.open(bad)
    assert bus.get(bad) is None


async def test_job_id_allowed_chars(tmp_path: Path) -> None:
    bus = LogBus(spill_dir=str(tmp_path))
    log = bus.open("A-z_0.9..")
    await log.write("stdout", b"x")
    assert (tmp_path / "A-z_0.9...log").read_bytes() == b"x"


async def test_every_id_the_node_accepts_gets_a_log(tmp_path: Path) -> None:
    """The log bus takes the same id set as the HTTP edge (fleet_trio.inputs), the spec's own
    example id included, and a 256-character id gets a spill file under the name length limit."""
    bus = LogBus(history_bytes=4, spill_dir=str(tmp_path))
    long_a, long_b = "a" * 255 + "1", "a" * 255 + "2"
    for job_id in ("a3f9-XYZ_0123456789abcdef.fleet~job", "fakehost:gpu0", long_a, long_b):
        log = bus.open(job_id)
        await log.write("stdout", job_id.encode() * 2)
        log.end("done", 0)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "a3f9-XYZ_0123456789abcdef.fleet~job.log" in names
    assert len(names) == 4 and all(len(n.encode()) <= 255 for n in names)
    events = await collect(bus.open(long_b).subscribe())
    assert check_cover(events) == long_b.encode() * 2


async def test_open_returns_existing_and_meta_is_readonly() -> None:
    bus = LogBus()
    log = bus.open("a", meta={"k": "v"})
    assert bus.open("a") is log
    assert bus.get("a") is log
    assert bus.get("b") is None
    assert dict(log.meta) == {"k": "v"}
    with pytest.raises(TypeError):
        log.meta["k"] = "w"  # type: ignore[index]


async def test_jobs_newest_first_and_retention(mock_clock: trio.testing.MockClock) -> None:
    bus = LogBus(keep_ended=2, keep_ended_for=100.0)
    logs = [bus.open(f"j{i}", meta={"i": str(i)}) for i in range(5)]
    await logs[0].write("stdout", b"abc")
    assert [j.job_id for j in bus.jobs()] == ["j4", "j3", "j2", "j1", "j0"]
    info = bus.jobs()[-1]
    assert (info.state, info.nbytes, info.ended) == ("running", 3, None)
    assert dict(info.meta) == {"i": "0"}
    for log in logs[:3]:
        log.end("done", 0)
        mock_clock.jump(1)
    # three ended, keep 2: the oldest ended (j0) goes; running ones stay
    assert [j.job_id for j in bus.jobs()] == ["j4", "j3", "j2", "j1"]
    assert bus.jobs()[-1].state == "done" and bus.jobs()[-1].ended is not None
    mock_clock.jump(99.5)  # j1 ended 101.5 s ago, j2 100.5 s ago
    logs[3].end("failed", 1)
    mock_clock.jump(0.2)
    assert [j.job_id for j in bus.jobs()] == ["j4", "j3"]
    assert bus.get("j0") is None
    mock_clock.jump(1000)
    assert [j.job_id for j in bus.jobs()] == ["j4"]
    # a dropped id opens a fresh log
    fresh = bus.open("j0")
    assert fresh is not logs[0] and fresh.nbytes == 0


async def test_subscription_close_and_busy() -> None:
    log = JobLog("c")
    sub = log.subscribe()
    result: list[BaseException] = []

    async def reader() -> None:
        try:
            await sub.__anext__()
        except BaseException as exc:
            result.append(exc)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(trio.BusyResourceError):
                await sub.__anext__()
            await sub.aclose()
    assert len(result) == 1 and isinstance(result[0], StopAsyncIteration)
    with pytest.raises(StopAsyncIteration):
        await sub.__anext__()


async def test_cancelled_reader_loses_nothing() -> None:
    log = JobLog("cancel")
    sub = log.subscribe()
    with trio.move_on_after(0.05):
        await sub.__anext__()  # nothing yet: cancelled while waiting
    await log.write("stdout", b"abc")
    with trio.CancelScope() as scope:
        scope.cancel()
        with pytest.raises(trio.Cancelled):
            await sub.__anext__()
    log.end("done", 0)
    assert check_cover([e async for e in sub]) == b"abc"


async def test_bad_stream_rejected() -> None:
    log = JobLog("s")
    with pytest.raises(ValueError):
        await log.write("stdin", b"x")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        log.sink("both")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        log.subscribe(streams=frozenset({"nope"}))  # type: ignore[arg-type]


async def test_holding_subscription_loses_nothing_beyond_the_history() -> None:
    bus = LogBus(history_bytes=100)
    log = bus.open("held")
    held = log.subscribe("start", hold=True, max_lag=10_000)
    plain = log.subscribe("start", max_lag=10_000)
    data = b"".join(bytes([48 + i % 10]) * 10 for i in range(100))
    for i in range(100):
        await log.write("stdout", data[i * 10 : i * 10 + 10])
    # nothing read yet: the history kept all 1000 bytes for the holder
    assert log.history.size == 1000
    got = bytearray()
    async for ev in held:
        assert isinstance(ev, Output)
        got += ev.data
        if len(got) == 1000:
            break
    assert bytes(got) == data
    await log.write("stdout", b"x" * 10)  # the holder has read everything: back to the limit
    assert log.history.size <= 100
    log.end("done", 0)
    assert check_cover(await collect(held), 1000) == b"x" * 10
    # the plain subscriber read nothing meanwhile and lost the evicted bytes
    events = await collect(plain)
    assert isinstance(events[0], Skipped)


async def test_holding_is_bounded_by_max_lag_and_released_on_close() -> None:
    log = JobLog("bounded", history_bytes=100)
    held = log.subscribe("start", hold=True, max_lag=300)
    for _ in range(100):
        await log.write("stdout", b"y" * 10)
    assert log.history.size <= 100 + 300 + 10  # a holder too far behind skips, as lag says
    events: list[Event] = [await held.__anext__()]
    assert events[0] == Skipped(0, 700)
    await held.aclose()
    await log.write("stdout", b"z" * 10)
    assert log.history.size <= 100  # released: the plain limit again


async def test_stats_count_bytes_by_stream_skips_and_open_subscribers() -> None:
    bus = LogBus(history_bytes=100)
    log = bus.open("stats")
    lagging = log.subscribe("start", max_lag=10)
    async with log.subscribe("start"):
        assert bus.stats().subscribers == 2
        await log.write("stdout", b"o" * 30)
        await log.write("stderr", b"e" * 20)
        assert bus.stats().bytes_written == {"stdout": 30, "stderr": 20}
        ev = await lagging.__anext__()
        assert ev == Skipped(0, 40)
        assert bus.stats().bytes_skipped == 40
    assert bus.stats().subscribers == 1
    log.end("done", 0)
    assert isinstance((await collect(lagging))[-1], End)
    assert bus.stats().subscribers == 0


def test_evicted_chunks_are_let_go_at_once() -> None:
    """An evicted chunk's bytes are freed when it is evicted, not when the history next
    compacts its index: with 1 MiB chunks (a flood), up to 64 dead chunks used to stay
    referenced beside an 8 MiB history, and every read of the flood landed in fresh memory."""
    import sys

    from fleet_trio.logbus.bus import History

    h = History(limit=100)
    datas = [bytes([65 + i]) * 50 for i in range(10)]
    for i in range(len(datas)):
        h.append("stdout", datas[i], 0.0)
    assert h.size == 100 and len(h) == 2
    kept = {id(data) for _, _, data in h.chunks()}

    def in_history(i: int) -> int:  # references beyond the list's and getrefcount's own
        return sys.getrefcount(datas[i]) - 2

    held = [in_history(i) for i in range(len(datas))]
    assert held == [1 if id(d) in kept else 0 for d in datas] == [0] * 8 + [1, 1]
    h.drop()
    assert [in_history(i) for i in range(len(datas))] == [0] * 10


async def test_wait_ended_wakes_on_the_end_not_on_writes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log = LogBus().open("job-wait-end")
    woke: list[float] = []

    async def waiter() -> None:
        await log.wait_ended()
        woke.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await log.write("stdout", b"a")
        await elapse(1)
        assert woke == []  # a write is not the end
        log.end("done", 0)
    assert woke == [1.0]
    with trio.fail_after(1):
        await log.wait_ended()  # already ended: returns at once
