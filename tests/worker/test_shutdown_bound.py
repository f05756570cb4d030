"""Issue 13: the worker's final reports are bounded in a shutdown, whatever the controller does
(a real worker, the sim controller, real processes)."""

from __future__ import annotations

import pytest
import trio

from fleet_trio.worker.worker import shutdown_bound
from tests.helpers import FAST, dev, sim, sim_worker, start_worker


@pytest.mark.slow
async def test_a_pre_killed_report_to_a_controller_that_never_answers_is_bounded() -> None:
    """A pre-killed job's report used to be bounded only by the client's 300 s patience,
    even in a shutdown. Now it ends by the hurry deadline: drain + hurry budget."""
    ctrl = sim()
    async with trio.open_nursery() as nursery:
        worker = await sim_worker(nursery, ctrl)
        done = start_worker(nursery, worker)
        with trio.fail_after(shutdown_bound(FAST) + 30):
            await ctrl.wait_for(lambda: worker.registrations >= 1 and ctrl.polls(), timeout=5)
            ctrl.latency("assignments", 0.4)  # the kill arrives with the assignment
            ctrl.latency("status", 10_000)  # and the controller never answers a report
            n = len(ctrl.polls())
            await ctrl.wait_for(lambda: len(ctrl.polls()) > n + 1, timeout=5)
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", "echo RAN"])
            ctrl.kill(job)
            await ctrl.wait_for(lambda: ctrl.requests("status"), timeout=5)
            began = trio.current_time()
            worker.request_shutdown("test")
            await done.wait()
            took = trio.current_time() - began
        nursery.cancel_scope.cancel()
    # drain + hurry budget, plus slack for a loaded 2-core machine (the contract is the next
    # line's bound)
    assert took <= FAST.shutdown_drain + FAST.hurry_budget + 3.0, took
    assert took <= shutdown_bound(FAST)
    assert ctrl.statuses(job) == []  # the report never got an answer (and never ran twice)
