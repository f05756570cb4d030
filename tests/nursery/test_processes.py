"""The task tree with real child processes and real signals (real time: no autojump clock).

Each job spawns a real process group. Two supervisors are exercised: a tiny local one written
here (SIGTERM the group on cancel, wait the grace in a shielded scope, SIGKILL, reap) and, when
it exists, ``fleet_trio.proc.run.run`` with ``grace_ceiling=tree.kill_grace``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from fleet_trio.nursery import Phase, TaskTree, open_task_tree, run_task_tree
from fleet_trio.proc import BufferSink, JobSpec, StopToken
from fleet_trio.proc.procfs import group_alive
from tests.helpers import scenario_pause, wait_until

try:
    from fleet_trio.proc.run import run as proc_run
except ImportError:  # pragma: no cover - the supervisor is being written alongside
    proc_run = None  # type: ignore[assignment]

IGNORES_TERM = "trap '' TERM; echo pid:$$; while :; do sleep 0.05; done"
EXITS_ON_TERM = "echo pid:$$; exec sleep 30"

# A job: (argv, grace, stop token or None, record) -> None. It records "pid" once the process
# is up, and whatever it learns about the ending.
Job = Callable[[list[str], float, StopToken | None, "JobRecord"], Awaitable[None]]


class JobRecord:
    def __init__(self) -> None:
        self.ready = trio.Event()
        self.pid: int | None = None
        self.ending: Any = None
        self.cancelled = False

    def started(self, pid: int) -> None:
        self.pid = pid
        self.ready.set()


async def local_job(
    argv: list[str], grace: float, stop: StopToken | None, record: JobRecord
) -> None:
    """A minimal group supervisor (what ``proc.run`` does on a cancel, and nothing else)."""
    sink = _ReadySink(record)
    proc = await trio.lowlevel.open_process(
        argv,
        process_group=0,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_pump, proc.stdout, sink)
            if stop is not None:
                nursery.start_soon(_terminate_on_stop, proc, grace, stop)
            await proc.wait()
            nursery.cancel_scope.cancel()
    except BaseException as exc:
        record.cancelled = _is_cancellation(exc)
        raise
    finally:
        with trio.CancelScope(shield=True):
            await _terminate(proc, grace)
            record.ending = proc.returncode
            with trio.move_on_after(1):
                await proc.stdout.aclose()


async def run_job(argv: list[str], grace: float, stop: StopToken | None, record: JobRecord) -> None:
    """The real supervisor, with the tree's kill grace as its grace ceiling."""
    assert proc_run is not None
    try:
        record.ending = await proc_run(
            JobSpec(command=argv, grace_ceiling=grace), _ReadySink(record), stop
        )
    except BaseException as exc:
        record.cancelled = _is_cancellation(exc)
        raise


class _ReadySink(BufferSink):
    """Notes the ``pid:<n>`` line the scripts print once they are set up."""

    def __init__(self, record: JobRecord) -> None:
        super().__init__()
        self.record = record

    async def write(self, data: bytes) -> None:
        await super().write(data)
        if self.record.pid is None and (m := re.search(r"pid:(\d+)\n", self.text())):
            self.record.started(int(m.group(1)))


async def _pump(stream: trio.abc.ReceiveStream, sink: BufferSink) -> None:
    while data := await stream.receive_some(65536):
        await sink.write(bytes(data))


async def _terminate_on_stop(proc: trio.Process, grace: float, stop: StopToken) -> None:
    await stop.wait()
    with trio.CancelScope(shield=True):
        await _terminate(proc, grace)


async def _terminate(proc: trio.Process, grace: float) -> None:
    """SIGTERM the group, wait ``grace``, SIGKILL the group, reap. Bounded: grace + 2 s."""
    if proc.returncode is None:
        _killpg(proc.pid, signal.SIGTERM)
        with trio.move_on_after(grace):
            await proc.wait()
    _killpg(proc.pid, signal.SIGKILL)  # the leader, or anything it left in its group
    with trio.move_on_after(2):
        await proc.wait()


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _is_cancellation(exc: BaseException) -> bool:
    """A ``Cancelled``, or a group made only of them (a nursery passes it on that way)."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)[1] is None
    return isinstance(exc, trio.Cancelled)


SUPERVISORS = [
    pytest.param(local_job, id="local"),
    pytest.param(
        run_job,
        id="proc.run",
        marks=pytest.mark.skipif(proc_run is None, reason="fleet_trio.proc.run not there yet"),
    ),
]


@pytest.mark.parametrize("job", SUPERVISORS)
async def test_a_job_ignoring_sigterm_is_killed_after_the_grace(job: Job) -> None:
    drain, grace = 0.3, 0.5
    record = JobRecord()
    interrupted: list[bool] = []

    async def on_interrupt() -> None:
        assert record.pid is not None
        interrupted.append(group_alive(record.pid))  # marked while the job still runs

    with trio.fail_after(10):
        async with open_task_tree(drain=drain, kill_grace=grace, on_interrupt=on_interrupt) as tree:
            tree.start_job(job, ["sh", "-c", IGNORES_TERM], tree.kill_grace, None, record)
            await record.ready.wait()
            start = trio.current_time()
            tree.request_shutdown()
        elapsed = trio.current_time() - start
    assert interrupted == [True]
    assert record.cancelled
    assert record.pid is not None
    assert not group_alive(record.pid)
    if job is local_job:
        assert record.ending == -signal.SIGKILL
    # exact lower bound; the upper bound is "bounded", with slack for a loaded 2-core machine
    assert drain + grace - 0.05 <= elapsed <= drain + grace + 5
    assert elapsed <= tree.shutdown_bound


@pytest.mark.parametrize("job", SUPERVISORS)
async def test_a_job_exiting_on_sigterm_ends_the_shutdown_early(job: Job) -> None:
    drain, grace = 0.3, 5.0
    record = JobRecord()
    with trio.fail_after(10):
        async with open_task_tree(drain=drain, kill_grace=grace) as tree:
            tree.start_job(job, ["sh", "-c", EXITS_ON_TERM], tree.kill_grace, None, record)
            await record.ready.wait()
            start = trio.current_time()
            tree.request_shutdown()
        elapsed = trio.current_time() - start
    assert record.cancelled
    assert record.pid is not None
    assert not group_alive(record.pid)
    # nowhere near drain + grace (5.3 s); slack for a loaded 2-core machine below that
    assert drain - 0.05 <= elapsed < drain + 3.5


@pytest.mark.parametrize("job", SUPERVISORS)
async def test_stop_tokens_set_on_stop_accepting_end_the_drain_early(job: Job) -> None:
    """The worker's way: step 1 sets every job's stop token; the jobs end during the drain."""
    drain, grace = 5.0, 5.0
    tokens = [StopToken(), StopToken()]
    records = [JobRecord(), JobRecord()]
    interrupted: list[bool] = []

    def stop_accepting() -> None:
        for token in tokens:
            token.set()

    async def on_interrupt() -> None:
        interrupted.append(True)  # pragma: no cover - must not happen

    with trio.fail_after(10):
        async with open_task_tree(
            drain=drain,
            kill_grace=grace,
            on_stop_accepting=stop_accepting,
            on_interrupt=on_interrupt,
        ) as tree:
            for token, record in zip(tokens, records, strict=True):
                tree.start_job(job, ["sh", "-c", EXITS_ON_TERM], tree.kill_grace, token, record)
            for record in records:
                await record.ready.wait()
            start = trio.current_time()
            tree.request_shutdown()
        elapsed = trio.current_time() - start
    assert interrupted == []
    assert elapsed < 4.0  # ended early: below the 5 s drain, slack for a loaded machine
    for record in records:
        assert not record.cancelled  # ended by its stop token, not by the tree's cancel
        assert record.pid is not None
        assert not group_alive(record.pid)
        if job is run_job:
            assert record.ending.killed
            assert record.ending.reason == "cancelled"
        else:
            assert record.ending == -signal.SIGTERM


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_real_signal_starts_the_shutdown(sig: signal.Signals) -> None:
    trees: list[TaskTree] = []
    finished: list[str] = []

    async def job() -> None:
        await scenario_pause(0.2, why="the job takes 0.2 s")
        finished.append("job")

    async def setup(tree: TaskTree) -> None:
        trees.append(tree)
        assert "shutdown-signals" in tree.snapshot()["services"]
        tree.start_job(job)
        os.kill(os.getpid(), sig)  # the signal service is already listening

    with trio.fail_after(5):
        await run_task_tree(setup, drain=2, kill_grace=1)
    (tree,) = trees
    assert tree.phase == Phase.DONE
    assert not tree.escalated
    assert finished == ["job"]  # drained, not interrupted


async def test_a_second_real_sigint_skips_the_drain() -> None:
    trees: list[TaskTree] = []
    events: list[str] = []

    async def job() -> None:
        try:
            await trio.sleep_forever()
        finally:
            events.append("cancelled")

    async def on_interrupt() -> None:
        events.append("interrupt")

    async def setup(tree: TaskTree) -> None:
        trees.append(tree)
        tree.start_job(job)
        tree.services.start_soon(_second_sigint, tree)
        os.kill(os.getpid(), signal.SIGINT)

    with trio.fail_after(15):
        start = trio.current_time()
        await run_task_tree(setup, drain=30, kill_grace=1, on_interrupt=on_interrupt)
        elapsed = trio.current_time() - start
    (tree,) = trees
    assert tree.escalated
    assert events == ["interrupt", "cancelled"]
    assert elapsed < 10  # the 30 s drain was skipped; slack for a loaded machine


async def _second_sigint(tree: TaskTree) -> None:
    await wait_until(lambda: tree.phase >= Phase.DRAINING)
    os.kill(os.getpid(), signal.SIGINT)
