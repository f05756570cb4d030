"""worker-process.md §11, T — PTY (items 100–108). Real shells on real pseudo-terminals."""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from fleet_trio.proc import JobSpec, StopToken
from fleet_trio.proc.procfs import pid_alive
from fleet_trio.proc.pty import PtySession, start_pty
from tests.helpers import gone_within, wait_until

GRACE = 0.3
"""Interactive shells ignore SIGTERM: tests use a short grace (§8.4)."""


class Transcript:
    """Everything read from a session so far, and a way to read on until a pattern shows."""

    def __init__(self, session: PtySession) -> None:
        self.session = session
        self.data = bytearray()

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")

    async def read_until(self, pattern: str, seconds: float = 5.0) -> re.Match[str]:
        """Read until ``pattern`` matches the transcript; fail after ``seconds`` or at EOF."""
        regex = re.compile(pattern)
        with trio.fail_after(seconds):
            while True:
                m = regex.search(self.text())
                if m:
                    return m
                chunk = await self.session.read()
                assert chunk, f"EOF before {pattern!r}; got {self.text()!r}"
                self.data += chunk

    async def prompt(self) -> None:
        """Wait for the interactive shell's first prompt, so typed input and the shell's answer
        are not interleaved with it."""
        await self.read_until(r"[$#] ")

    async def to_eof(self, seconds: float = 5.0) -> str:
        with trio.fail_after(seconds):
            while chunk := await self.session.read():
                self.data += chunk
        return self.text()


def shell(**kw: object) -> JobSpec:
    return JobSpec(command=["/bin/sh"], grace_ceiling=GRACE, **kw)  # type: ignore[arg-type]


@asynccontextmanager
async def prompted(spec: JobSpec | None = None) -> AsyncIterator[Transcript]:
    """A shell (``spec``, default :func:`shell`) on a PTY, past its first prompt."""
    async with await start_pty(spec if spec is not None else shell()) as session:
        t = Transcript(session)
        await t.prompt()
        yield t


async def background_sleeper(t: Transcript) -> int:
    """Have the shell start ``sleep 300 &``; its pid (alive)."""
    await t.session.write(b"sleep 300 & echo child:$!\n")
    # The echoed input reads "child:$!"; only the shell's output has digits.
    child = int((await t.read_until(r"child:(\d+)")).group(1))
    assert pid_alive(child)
    return child


async def test_process_100_pty_looks_like_a_terminal() -> None:
    spec = JobSpec(command=["/bin/sh", "-c", "test -t 1 && echo IS_TTY || echo NOT_TTY"])
    with trio.fail_after(10):
        async with await start_pty(spec) as session:
            out = await Transcript(session).to_eof()
            res = await session.wait()
    assert "IS_TTY" in out
    assert "NOT_TTY" not in out
    assert res.exit_code == 0
    assert res.killed is False


async def test_process_101_pty_carries_input_back_to_the_process() -> None:
    with trio.fail_after(10):
        async with prompted() as t:
            session = t.session
            await session.write(b"echo hello-from-stdin\n")
            # The shell's own output line, not the terminal's echo of what was typed.
            await t.read_until(r"(?:^|\n)hello-from-stdin\r?\n", seconds=5)
    assert "hello-from-stdin" in t.text()


async def test_process_102_pty_resize_is_visible_to_the_process() -> None:
    with trio.fail_after(10):
        async with prompted() as t:
            session = t.session
            session.resize(48, 180)
            await session.write(b"stty size\n")
            await t.read_until(r"48 180", seconds=5)


async def test_process_103_pty_stop_kills_the_whole_session() -> None:
    with trio.fail_after(15):
        async with prompted() as t:
            session = t.session
            child = await background_sleeper(t)
            stop = StopToken()
            stop.set()
            with trio.fail_after(5):
                res = await session.wait(stop)
                assert await gone_within(child, 5)
                assert await gone_within(session.pid, 5)
    assert res.killed is True
    assert res.reason == "cancelled"
    assert res.err is None


async def test_process_104_pty_clean_shell_exit_reaps_backgrounded_stragglers() -> None:
    with trio.fail_after(15):
        async with prompted() as t:
            session = t.session
            child = await background_sleeper(t)
            await session.write(b"exit\n")
            with trio.fail_after(5):
                res = await session.wait()  # no stop
                assert await gone_within(child, 5)
    assert res.killed is True
    assert res.reason == "stragglers reaped after exit"
    assert res.exit_code == 0


def reaped(pid: int) -> bool:
    """ESRCH: reaped, not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_process_105_pty_close_reaps_without_an_explicit_wait() -> None:
    with trio.fail_after(10):
        session = await start_pty(shell())
        pid = session.pid
        await Transcript(session).prompt()
        await session.close()
        await wait_until(lambda: reaped(pid), timeout=5, what=f"pid {pid} reaped")


async def test_process_106_pty_has_a_usable_default_window_size() -> None:
    with trio.fail_after(10):
        async with await start_pty(JobSpec(command=["/bin/sh", "-c", "stty size"])) as session:
            out = await Transcript(session).to_eof()
    assert "24 80" in out


async def test_process_107_pty_idle_watchdog_ends_an_abandoned_session() -> None:
    with trio.fail_after(10):
        async with await start_pty(shell(idle_timeout=0.2)) as session:
            res = await session.wait()  # nobody reads or writes
    assert res.killed is True
    assert "idle" in res.reason
    assert res.reason == "idle: no output for 200ms"


async def test_process_108_pty_runs_in_requested_directory_with_requested_env(
    tmp_path: Path,
) -> None:
    spec = shell(cwd=str(tmp_path), env={"RC_PTY_TEST": "pty-env-value"})
    with trio.fail_after(10):
        async with prompted(spec) as t:
            session = t.session
            await session.write(b"pwd; echo $RC_PTY_TEST\n")
            await t.read_until(r"(?:^|\n)pty-env-value\r?\n")
    assert "pty-env-value" in t.text()
    assert str(tmp_path.resolve()) in t.text() or str(tmp_path) in t.text()
