"""Issue 13: the tree owns the signals from its opening, a request after the drain cuts the
remaining budgets, ``on_jobs_closed`` has its own budget (autojump clock, fake jobs)."""

from __future__ import annotations

import os
import signal

import trio

from fleet_trio.nursery import open_task_tree
from tests.helpers import scenario_pause, wait_until


async def _stubborn_job(started: trio.Event) -> None:
    started.set()
    try:
        await trio.sleep(100)
    finally:
        with trio.CancelScope(shield=True):
            await trio.sleep(1.0)  # its own bounded teardown: the grace


async def test_a_request_after_the_drain_cuts_on_interrupt_and_on_jobs_closed(
    autojump_clock: trio.abc.Clock,
) -> None:
    seen: dict[str, float] = {}

    async def slow_interrupt() -> None:
        seen["interrupt"] = trio.current_time()
        await trio.sleep(100)

    async def slow_jobs_closed() -> None:
        seen["jobs_closed"] = trio.current_time()
        await trio.sleep(100)

    began = trio.current_time()
    async with open_task_tree(
        drain=2.0,
        kill_grace=1.0,
        on_interrupt=slow_interrupt,
        interrupt_budget=50.0,
        on_jobs_closed=slow_jobs_closed,
        jobs_closed_budget=60.0,
    ) as tree:
        started = trio.Event()
        tree.start_job(_stubborn_job, started)
        await started.wait()

        async def hurry_later() -> None:
            await wait_until(lambda: "interrupt" in seen)
            await scenario_pause(3.0, why="well into the 50 s interrupt step")
            assert tree.request_shutdown("second").name == "REPEATED"
            assert tree.hurried

        tree.services.start_soon(hurry_later)
        tree.request_shutdown("stop")
        await tree.wait_shutdown()
    took = trio.current_time() - began
    # drain 2 s + 3 s of the interrupt step, then: the cut interrupt, the job's 1 s teardown,
    # the cut jobs-closed step; nowhere near the 50 + 60 s of budgets
    assert "interrupt" in seen and "jobs_closed" in seen
    assert took < 2.0 + 3.0 + 1.0 + 5.0  # slack for a loaded 2-core machine


async def test_on_jobs_closed_is_bounded_by_its_budget(autojump_clock: trio.abc.Clock) -> None:
    async def never() -> None:
        await trio.sleep_forever()

    began = trio.current_time()
    async with open_task_tree(
        drain=1.0, kill_grace=1.0, on_jobs_closed=never, jobs_closed_budget=7.0
    ) as tree:
        assert tree.shutdown_bound == 1.0 + 5.0 + 1.0 + 3.0 + 7.0
    assert 7.0 <= trio.current_time() - began < 7.5


async def test_a_cut_on_hurry_scope_is_cancelled_by_a_request_after_the_drain(
    autojump_clock: trio.abc.Clock,
) -> None:
    early = trio.CancelScope(shield=True)
    late = trio.CancelScope(shield=True)

    async def interrupt() -> None:
        assert not early.cancel_called  # the drain is over, no request since: nothing cut
        tree.request_shutdown("again")
        assert early.cancel_called
        tree.cut_on_hurry(late)  # registered after the hurry: cut at once
        assert late.cancel_called

    async with open_task_tree(drain=1.0, kill_grace=1.0, on_interrupt=interrupt) as tree:
        tree.cut_on_hurry(early)
        started = trio.Event()
        tree.start_job(_stubborn_job, started)
        await started.wait()
        tree.request_shutdown("stop")  # during the drain: not a hurry
        assert not early.cancel_called


async def test_signals_reach_the_tree_from_its_opening() -> None:
    with trio.fail_after(10):
        async with open_task_tree(drain=1.0, kill_grace=1.0, signals=(signal.SIGTERM,)) as tree:
            assert "shutdown-signals" in tree.snapshot()["services"]
            os.kill(os.getpid(), signal.SIGTERM)
            await tree.wait_shutdown()
            assert tree.stopping
