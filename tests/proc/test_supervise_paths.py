"""The supervisor's two ways of reading a pipe job's output, held to the same behaviours.

A job's stdout into a sink that never blocks (``never_blocks = True``: the buffers of
``fleet_trio.proc.sinks``) is read by the supervising task itself (with stdout alone, no task
and no nursery at all); any other sink, and a separate stderr, gets a pump task. Every test
here runs on both paths (``path``) and checks which one ran. Real processes, each guarded by
``trio.fail_after``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
import trio

from fleet_trio.proc import BufferSink, JobSpec, Result, StopToken
from fleet_trio.proc.procfs import pid_alive
from fleet_trio.proc.run import run
from fleet_trio.proc.sinks import CappedBuffer, NullSink, TailBuffer, TeeSink
from fleet_trio.proc.supervisor import (
    REASON_CANCELLED,
    Pump,
    Supervisor,
    inline_pump,
    never_blocks,
)
from fleet_trio.proc.target import GroupTarget
from tests.helpers import PidWatcher, cancel_when_output, gone_within, run_stopped_once_seen


class BytesReceiveStream(trio.abc.ReceiveStream):
    """Fixed bytes, then EOF (a stdin source; it has no ``fileno``)."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        n = max_bytes or 65536
        chunk, self._data = self._data[:n], self._data[n:]
        return chunk

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


class TaskWatcher(PidWatcher):
    """Records output, wakes on ``child:<pid>``; says nothing about blocking (a pump task)."""


class InlineWatcher(PidWatcher):
    """The same sink declaring that its ``write`` never awaits (read inline)."""

    never_blocks = True


@pytest.fixture(params=["inline", "task"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The path under test; afterwards, that every run took it (the pump tasks' sinks)."""
    pumps: list[Pump] = []
    orig = Supervisor._pump

    async def counting(self: Supervisor, pump: Pump) -> None:
        pumps.append(pump)
        await orig(self, pump)

    monkeypatch.setattr(Supervisor, "_pump", counting)
    yield request.param
    if request.param == "inline":
        assert not any(never_blocks(pump.sink) for pump in pumps), "stdout had a pump task"
    else:
        assert pumps, "no pump task ran"


def watcher(path: str) -> PidWatcher:
    return InlineWatcher(BufferSink()) if path == "inline" else TaskWatcher(BufferSink())


async def test_output_and_exit_status(path: str) -> None:
    """Every byte (stderr merged, more than a pipe holds) and the exit status."""
    code = "import sys; sys.stdout.write('x' * 300000); sys.stdout.flush(); sys.stderr.write('e')"
    sink = watcher(path)
    with trio.fail_after(20):
        res = await run(JobSpec(command=[sys.executable, "-c", code]), sink)
        assert (res.exit_code, res.killed, res.reason, res.err) == (0, False, "", None)
        assert sink.inner.getvalue() == b"x" * 300000 + b"e"
        res = await run(JobSpec(command=["sh", "-c", "exit 3"]), watcher(path))
        assert (res.exit_code, res.killed) == (3, False)
        res = await run(JobSpec(command=["sh", "-c", "kill -9 $$"]), watcher(path))
        assert (res.exit_code, res.killed, res.reason) == (137, True, "signal: killed")


async def test_a_stop_request_is_a_result_and_output_in_the_grace_is_kept(path: str) -> None:
    sink = watcher(path)
    script = "trap 'echo bye; exit 0' TERM; echo child:$$; while :; do sleep 0.05; done"
    with trio.fail_after(20):
        res = await run_stopped_once_seen(JobSpec(["sh", "-c", script], grace_ceiling=5), sink)
    assert (res.killed, res.reason) == (True, REASON_CANCELLED)
    assert b"bye" in sink.inner.getvalue()


async def test_a_stop_set_before_the_spawn_still_spawns_and_stops(path: str) -> None:
    stop = StopToken()
    stop.set()
    with trio.fail_after(20):
        res = await run(JobSpec(command=["sleep", "30"], grace_ceiling=1), watcher(path), stop)
    assert (res.err, res.killed, res.reason, res.exit_code) == (None, True, REASON_CANCELLED, 143)


async def test_a_stop_after_the_end_is_no_kill(path: str) -> None:
    """The race re-check: the child has exited and closed its output before the supervision
    starts, and the stop is already set; the end that happened first wins."""
    stop = StopToken()

    def exited_then_stop(pid: int) -> None:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # a zombie: trio still reaps it
        stop.set()

    with trio.fail_after(20):
        res = await run(JobSpec(command=["true"]), watcher(path), stop, on_spawn=exited_then_stop)
    assert (res.exit_code, res.killed, res.reason) == (0, False, "")


async def test_max_runtime_escalates_to_sigkill_after_the_grace(path: str) -> None:
    """The limit (1.5 s: a shell still installing its trap when a short one tripped would die
    of the SIGTERM, 143) comes after the job said its trap is in place (``child:``)."""
    sink = watcher(path)
    script = "trap '' TERM; echo child:$$; while :; do sleep 0.05; done"
    spec = JobSpec(command=["sh", "-c", script], max_runtime=1.5, grace_ceiling=0.3)
    with trio.fail_after(20):
        res = await run(spec, sink)
    assert sink.inner.text().startswith("child:"), "the limit came before the trap"
    assert (res.exit_code, res.killed, res.reason) == (137, True, "max_runtime exceeded (1.5s)")


async def test_idle_limit_moves_with_output_then_trips(path: str) -> None:
    """A line every 100 ms for 2 s against a 1.5 s idle limit (a gap of 1.4 s would have to
    come from a stalled machine), then silence: the output outlived one idle period, so the
    deadline moved; the limit trips once the silence has lasted it."""
    sink = watcher(path)
    code = "for i in $(seq 20); do echo $i; sleep 0.1; done; sleep 30"
    spec = JobSpec(command=["sh", "-c", code], idle_timeout=1.5, grace_ceiling=0.5)
    started = trio.current_time()
    with trio.fail_after(20):
        res = await run(spec, sink)
    assert (res.killed, res.reason) == (True, "idle: no output for 1.5s")
    assert sink.inner.getvalue().split() == [str(i).encode() for i in range(1, 21)]
    assert trio.current_time() - started > 2 * 1.5  # output for > 1.5 s, then 1.5 s of silence


async def test_a_stop_kills_the_whole_group(path: str) -> None:
    sink = watcher(path)
    script = "sleep 300 & echo child:$!; wait"
    with trio.fail_after(20):
        res = await run_stopped_once_seen(JobSpec(["sh", "-c", script], grace_ceiling=1), sink)
        assert res.killed
        assert await gone_within(sink.pid(), 2)


async def test_trio_cancellation_tears_the_group_down_then_reraises_bare(path: str) -> None:
    sink = watcher(path)
    kept: list[Result] = []
    raised: list[type[BaseException]] = []
    script = "trap '' TERM; sleep 300 & echo child:$!; while :; do sleep 0.05; done"
    with trio.fail_after(20):
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancel_when_output, sink, scope)
                try:
                    spec = JobSpec(command=["sh", "-c", script], grace_ceiling=0.2)
                    await run(spec, sink, record=kept.append)
                except BaseException as exc:
                    raised.append(type(exc))
                    raise
        assert scope.cancelled_caught
        assert raised == [trio.Cancelled]
        assert len(kept) == 1 and kept[0].killed and kept[0].reason == REASON_CANCELLED
        assert await gone_within(sink.pid(), 2)
    if pid_alive(sink.pid()):
        os.kill(sink.pid(), 9)


class _CountingInline:
    never_blocks = True

    def __init__(self) -> None:
        self.total = 0

    async def write(self, data: bytes) -> None:
        self.total += len(data)


class _CountingTask(_CountingInline):
    never_blocks = False


async def test_a_flooding_writer_still_stops(path: str) -> None:
    """Output that never pauses (``yes``): a limit, a stop and a shutdown all still end the
    run, the reader being the supervising task or not."""
    sink = _CountingInline() if path == "inline" else _CountingTask()
    with trio.fail_after(20):
        res = await run(JobSpec(command=["yes"], max_runtime=0.3, grace_ceiling=1), sink)
        assert (res.killed, res.reason) == (True, "max_runtime exceeded (300ms)")
        res = await run(JobSpec(command=["yes"], grace_ceiling=1), sink, StopToken.after(0.3))
        assert (res.killed, res.reason) == (True, REASON_CANCELLED)
        kept: list[Result] = []
        with trio.move_on_after(0.3) as scope:
            await run(JobSpec(command=["yes"], grace_ceiling=1), sink, record=kept.append)
        assert scope.cancelled_caught
        assert len(kept) == 1 and kept[0].reason == REASON_CANCELLED
    assert sink.total > 0


class _Broken:
    def __init__(self) -> None:
        self.calls = 0

    async def write(self, data: bytes) -> None:
        self.calls += 1
        raise OSError("sink is gone")


class _BrokenInline(_Broken):
    never_blocks = True


async def test_a_broken_sink_does_not_strand_the_child(path: str) -> None:
    sink = _BrokenInline() if path == "inline" else _Broken()
    script = "i=0; while [ $i -lt 2000 ]; do echo line-$i; i=$((i+1)); done"
    with trio.fail_after(20):
        res = await run(JobSpec(command=["sh", "-c", script]), sink)
    assert (res.exit_code, res.killed, sink.calls) == (0, False, 1)


async def test_stderr_apart_and_a_stdin_relay(path: str) -> None:
    """A separate stderr (always a pump task) beside stdout, and stdin relayed to the child."""
    out, err = watcher(path), TaskWatcher(BufferSink())
    code = (
        "import sys; d = sys.stdin.read(); sys.stdout.write(d.upper()); "
        "sys.stderr.write('e' * 70000)"
    )
    spec = JobSpec(
        command=[sys.executable, "-c", code],
        stderr_sink=err,
        stdin_source=BytesReceiveStream(b"abc" * 30000),
    )
    with trio.fail_after(20):
        res = await run(spec, out)
    assert (res.exit_code, res.killed) == (0, False)
    assert out.inner.getvalue() == b"ABC" * 30000
    assert err.inner.getvalue() == b"e" * 70000


async def test_the_selection_condition() -> None:
    """stdout (the last pump) inline when its sink never blocks and the job is not swept."""
    rfd, wfd = os.pipe()
    os.close(wfd)
    pipe = trio.lowlevel.FdStream(rfd)
    try:
        spec = JobSpec(command=["true"])
        for sink in (NullSink(), BufferSink(), CappedBuffer(), TailBuffer(), TeeSink(NullSink())):
            assert inline_pump([Pump(pipe, sink)], spec), sink
        assert inline_pump([Pump(pipe, TaskWatcher(BufferSink())), Pump(pipe, NullSink())], spec)
        mixed = TeeSink(NullSink(), TaskWatcher(BufferSink()))
        assert not inline_pump([Pump(pipe, mixed)], spec)
        assert not inline_pump([Pump(pipe, TaskWatcher(BufferSink()))], spec)
        assert not inline_pump([Pump(pipe, NullSink()), Pump(pipe, mixed)], spec)
        swept = JobSpec(command=["true"], sweep_job_id="j")
        assert not inline_pump([Pump(pipe, NullSink())], swept)
        assert not inline_pump([], spec)
        assert not inline_pump([Pump(BytesReceiveStream(b""), NullSink())], spec)  # no fileno
    finally:
        await pipe.aclose()


async def test_a_supervisor_made_without_stop_requests_refuses_them() -> None:
    """``run`` makes its supervisor ``stoppable=False`` (only its ``stop`` token stops it,
    and without one and without limits the wait needs no cancel scope); a request to such a
    supervisor is a programming error, not a silent no-op."""
    with trio.fail_after(10):
        proc = await trio.lowlevel.open_process(["true"])
        try:
            spec = JobSpec(command=["true"])
            sup = Supervisor(
                spec, proc, GroupTarget(proc.pid), started=0, idle_from=0, stoppable=False
            )
            with pytest.raises(RuntimeError):
                sup.request_stop()
            with pytest.raises(RuntimeError):
                sup.link(StopToken())
            assert sup.link(None) is None
            res = await sup.supervise()
            assert (res.exit_code, res.killed) == (0, False)
        finally:
            await proc.wait()
