"""PTY sessions beyond the checklist: EOF, resize, cancellation, errors, cached results."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import trio

from fleet_trio.proc import JobSpec, StopToken
from fleet_trio.proc.procfs import pid_alive, read_proc_stat
from fleet_trio.proc.pty import PtySession, PtyStartError, start_pty
from tests.helpers import scenario_pause, wait_until

GRACE = 0.3


def shell(**kw: object) -> JobSpec:
    return JobSpec(command=["/bin/sh"], grace_ceiling=GRACE, **kw)  # type: ignore[arg-type]


async def read_until(session: PtySession, pattern: str, seconds: float = 5.0) -> re.Match[str]:
    buf = bytearray()
    regex = re.compile(pattern)
    with trio.fail_after(seconds):
        while not (m := regex.search(buf.decode(errors="replace"))):
            chunk = await session.read()
            assert chunk, f"EOF before {pattern!r}: {bytes(buf)!r}"
            buf += chunk
    return m


async def read_to_eof(session: PtySession, seconds: float = 5.0) -> bytes:
    buf = bytearray()
    with trio.fail_after(seconds):
        while chunk := await session.read():
            buf += chunk
    return bytes(buf)


async def gone(pid: int, seconds: float = 5.0) -> bool:
    with trio.move_on_after(seconds):
        await wait_until(lambda: not pid_alive(pid))
    return not pid_alive(pid)


async def test_eio_after_the_shell_exits_reads_as_eof_repeatedly() -> None:
    with trio.fail_after(10):
        async with await start_pty(JobSpec(command=["/bin/sh", "-c", "echo bye"])) as s:
            assert b"bye" in await read_to_eof(s)
            assert await s.read() == b""
            assert await s.read() == b""
            res = await s.wait()
    assert (res.exit_code, res.killed, res.reason, res.err) == (0, False, "", None)


async def test_read_after_close_is_eof() -> None:
    with trio.fail_after(10):
        s = await start_pty(shell())
        await s.close()
        assert await s.read() == b""


async def test_zero_sized_resize_is_ignored() -> None:
    with trio.fail_after(10):
        async with await start_pty(shell()) as s:
            await read_until(s, r"[$#] ")
            s.resize(0, 0)
            s.resize(0, 100)
            s.resize(30, 0)
            await s.write(b"stty size\n")
            await read_until(s, r"(?:^|\n)24 80\r?\n")


async def test_start_window_size_is_configurable() -> None:
    spec = JobSpec(command=["/bin/sh", "-c", "stty size"])
    with trio.fail_after(10):
        async with await start_pty(spec, rows=40, cols=132) as s:
            assert b"40 132" in await read_to_eof(s)


async def test_leader_is_session_and_group_leader() -> None:
    with trio.fail_after(10):
        async with await start_pty(shell()) as s:
            await read_until(s, r"[$#] ")
            st = read_proc_stat(s.pid)
            assert st is not None
            assert st.sid == st.pgid == s.pid


async def test_trio_cancellation_of_wait_tears_down_then_reraises() -> None:
    with trio.fail_after(10):
        s = await start_pty(shell())
        try:
            await read_until(s, r"[$#] ")
            await s.write(b"sleep 300 & echo child:$!\n")
            child = int((await read_until(s, r"child:(\d+)")).group(1))
            raised: list[type[BaseException]] = []
            with trio.move_on_after(0.2) as cs:
                try:
                    await s.wait()
                except BaseException as exc:
                    raised.append(type(exc))
                    raise
            assert cs.cancelled_caught
            assert raised == [trio.Cancelled]  # re-raised bare, not inside a group
            # By the time it propagated, the session was already torn down.
            assert not pid_alive(child)
            assert not pid_alive(s.pid)
            assert s.result is not None
            assert s.result.killed is True
            assert s.result.reason == "cancelled"
            assert await s.wait() is s.result  # cached for later callers
        finally:
            await s.close()


async def test_write_after_exit_and_after_close_does_not_crash() -> None:
    with trio.fail_after(10):
        s = await start_pty(JobSpec(command=["/bin/sh", "-c", "exit 0"]))
        res = await s.wait()
        assert res.exit_code == 0
        for _ in range(8):
            await s.write(b"x" * 1024)
        await s.close()
        await s.write(b"after close\n")
        s.resize(50, 50)  # a closed session ignores resizes
        await s.close()  # idempotent


async def test_concurrent_waiters_share_one_result_and_a_follower_can_stop() -> None:
    results: list[object] = []
    with trio.fail_after(10):
        async with await start_pty(shell()) as s:
            await read_until(s, r"[$#] ")
            stop = StopToken()

            async def waiter(token: StopToken | None) -> None:
                results.append(await s.wait(token))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiter, None)
                await scenario_pause(0.05, why="the first waiter is waiting")
                nursery.start_soon(waiter, stop)  # a follower's token still stops it
                await scenario_pause(0.05, why="the follower is waiting")
                stop.set()
    assert len(results) == 2
    assert results[0] is results[1]
    assert getattr(results[0], "reason", None) == "cancelled"


async def test_deadline_token_stops_the_session() -> None:
    with trio.fail_after(10):
        async with await start_pty(shell()) as s:
            res = await s.wait(StopToken.after(0.1))
    assert res.killed is True
    assert res.reason == "cancelled"


async def test_max_runtime_reason() -> None:
    with trio.fail_after(10):
        async with await start_pty(shell(max_runtime=0.3)) as s:
            res = await s.wait()
    assert res.killed is True
    assert res.reason == "max_runtime exceeded (300ms)"


async def test_reading_keeps_the_idle_watchdog_quiet() -> None:
    """A tick every 100 ms for 2 s against a 1.5 s idle limit (a gap of 1.4 s would have to
    come from a stalled machine): the session outlives one idle period, so only the bytes read
    from the master can have kept it alive."""
    script = "for i in $(seq 20); do echo tick; sleep 0.1; done"
    started = trio.current_time()
    with trio.fail_after(20):
        async with await start_pty(
            JobSpec(command=["/bin/sh", "-c", script], idle_timeout=1.5)
        ) as s:
            out = await read_to_eof(s, seconds=15)
            res = await s.wait()
    assert trio.current_time() - started > 1.5
    assert out.count(b"tick") == 20
    assert (res.exit_code, res.killed, res.reason) == (0, False, "")


async def test_exit_status_and_signal_death() -> None:
    with trio.fail_after(10):
        async with await start_pty(JobSpec(command=["/bin/sh", "-c", "exit 3"])) as s:
            res = await s.wait()
        assert (res.exit_code, res.killed, res.reason) == (3, False, "")
        async with await start_pty(JobSpec(command=["/bin/sh", "-c", "kill -KILL $$"])) as s:
            res = await s.wait()
        assert (res.exit_code, res.killed, res.reason) == (137, True, "signal: killed")


async def test_start_errors() -> None:
    with pytest.raises(PtyStartError) as info:
        await start_pty(JobSpec(command=[]))
    assert info.value.result.err == "empty command"
    assert info.value.result.exit_code == -1

    with pytest.raises(PtyStartError) as info:
        await start_pty(JobSpec(command=["/nonexistent/definitely-not-here"]))
    assert (info.value.result.err or "").startswith("start pty: ")


async def test_bad_cwd_is_a_start_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing")
    with pytest.raises(PtyStartError) as info:
        await start_pty(JobSpec(command=["/bin/sh", "-c", "true"], cwd=missing))
    assert info.value.result.err == f"start pty: chdir {missing}: no such file or directory"


async def test_pre_cancelled_caller_still_gets_a_session_it_can_close() -> None:
    with trio.fail_after(10):
        with trio.CancelScope() as cs:
            cs.cancel()
            s = await start_pty(shell())  # the spawn is shielded
            try:
                await s.wait()
            finally:
                with trio.CancelScope(shield=True):
                    await s.close()
        assert s.result is not None
        assert s.result.killed is True
        assert await gone(s.pid)


async def test_cancelling_a_follower_leaves_the_supervising_caller_alone() -> None:
    raised: list[type[BaseException]] = []
    with trio.fail_after(10):
        async with await start_pty(shell()) as s, trio.open_nursery() as nursery:
            nursery.start_soon(s.wait)
            await scenario_pause(0.05, why="the first waiter is waiting")
            with trio.move_on_after(0.1):
                try:
                    await s.wait(StopToken())
                except BaseException as exc:
                    raised.append(type(exc))
                    raise
            assert raised == [trio.Cancelled]
            assert s.result is None  # still supervised by the first caller
            assert pid_alive(s.pid)
            await s.close()
    final = await s.wait()  # cached
    assert final.reason == "cancelled"
