"""The node's shared per-process view: one query per tick for all job samplers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import trio

from fleet_trio.gpu import GIB, GpuError, VramSnapshot
from fleet_trio.gpu.sampler import (
    ProcessView,
    SharedProcessView,
    attribute,
    measure_job_peak,
    read_process_view,
)
from fleet_trio.proc.procfs import ProcStat
from tests.helpers import elapse, scenario_pause, wait_until


class CountingSource:
    """A GPU source whose per-process answer is set by the test; counts queries."""

    name = "counting"

    def __init__(self, used: dict[int, int] | None) -> None:
        self.used = used
        self.calls = 0
        self.fail = False

    async def snapshot(self) -> VramSnapshot:
        raise AssertionError("not used")

    async def process_used_bytes(self) -> dict[int, int] | None:
        self.calls += 1
        await scenario_pause(0.01, why="a query takes time: concurrent callers overlap")
        if self.fail:
            raise GpuError("boom")
        return self.used


def stat(pid: int, ppid: int, pgid: int, state: str = "S") -> ProcStat:
    return ProcStat(pid=pid, state=state, ppid=ppid, pgid=pgid, sid=pgid)


def test_attribute_by_group_descent_and_marker() -> None:
    view = ProcessView(
        used={10: 1, 11: 2, 20: 4, 30: 8, 40: 16},
        stats={
            10: stat(10, 1, 10),  # the group leader
            11: stat(11, 10, 10),  # in the group
            20: stat(20, 11, 20),  # left the group (setsid), still a descendant
            30: stat(30, 1, 30),  # unrelated, but carries the marker
            40: stat(40, 1, 40),  # unrelated
            1: stat(1, 0, 1),
        },
        markers={10: "j", 11: "j", 20: "", 30: "j", 40: "other"},
    )
    assert attribute(view, 10, "j") == {10, 11, 20, 30}
    assert attribute(view, 10, None) == {10, 11, 20}
    assert attribute(view, 0, "j") == {10, 11, 30}
    assert attribute(view, 40, "nope") == {40}


async def test_read_process_view_reads_a_real_child() -> None:
    env = {**os.environ, "FT_VIEW_MARK": "m1"}
    child = await trio.lowlevel.open_process(
        [sys.executable, "-c", "import time; time.sleep(30)"], env=env, start_new_session=True
    )
    try:
        # the spawn returns once the exec is past its point of no return, but the new program's
        # environment is readable in /proc only a moment later (it reads empty until then)
        await wait_until(
            lambda: b"FT_VIEW_MARK=m1" in Path(f"/proc/{child.pid}/environ").read_bytes(),
            timeout=10,
            what="the child's environment in /proc",
        )
        me = os.getpid()
        view = read_process_view({child.pid: 5, me: 7}, "FT_VIEW_MARK")
        st = view.stats[child.pid]
        assert st is not None and st.pid == child.pid and st.pgid == child.pid
        assert me in view.stats and st.ppid == me  # the ancestry is read too
        assert view.markers[child.pid] == "m1"
        assert not view.markers[me]
        assert attribute(view, child.pid, None) == {child.pid}
        assert attribute(view, 0, "m1") == {child.pid}
    finally:
        child.kill()
        with trio.fail_after(10):
            await child.wait()


async def test_concurrent_callers_share_one_query(autojump_clock: trio.abc.Clock) -> None:
    me = os.getpid()
    source = CountingSource({me: GIB})
    shared = SharedProcessView(source, "FLEET_JOB_ID", max_age=0.25)
    views: list[ProcessView | None] = []

    async def ask() -> None:
        views.append(await shared.view())

    async with trio.open_nursery() as nursery:
        for _ in range(32):
            nursery.start_soon(ask)
    assert source.calls == 1 and shared.queries == 1
    assert len(views) == 32 and all(v is views[0] for v in views)
    await elapse(0.1)
    await shared.view()
    assert source.calls == 1  # still fresh
    await elapse(0.2)
    await shared.view()
    assert source.calls == 2  # older than max_age: queried again


async def test_failed_query_raises_and_is_not_kept(autojump_clock: trio.abc.Clock) -> None:
    source = CountingSource({os.getpid(): GIB})
    shared = SharedProcessView(source, None, max_age=10.0)
    source.fail = True
    try:
        await shared.view()
    except GpuError:
        pass
    else:
        raise AssertionError("a failed query must raise")
    source.fail = False
    view = await shared.view()
    assert view is not None and source.calls == 2


async def test_no_accounting_is_none() -> None:
    shared = SharedProcessView(CountingSource(None), None)
    assert await shared.view() is None


async def test_many_job_samplers_one_query_per_tick(autojump_clock: trio.abc.Clock) -> None:
    """32 jobs sampled every 500 ms for 2 s through one shared view: the source is asked about
    once per tick (5 ticks), not 32 times per tick; each job still sees its own bytes."""
    me = os.getpid()
    source = CountingSource({me: 3 * GIB})
    shared = SharedProcessView(source, "FLEET_JOB_ID", max_age=0.25)
    stop = trio.Event()
    peaks: list[float | None] = []

    async def job(pgid: int) -> None:
        peaks.append(
            await measure_job_peak(
                source, pgid=pgid, marker=("FLEET_JOB_ID", "x"), stop=stop, shared=shared
            )
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(job, os.getpgrp())  # this process's group: owns the 3 GiB
        for _ in range(31):
            nursery.start_soon(job, 999_999)  # no such group: owns nothing
        await trio.sleep(2.0)
        stop.set()
    assert sorted(p or 0.0 for p in peaks) == [0.0] * 31 + [3.0]
    assert source.calls <= 6
