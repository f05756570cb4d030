"""The shutdown sequence and its timing, with fake jobs under the autojump clock."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from trio.testing import MockClock

from fleet_trio.nursery import (
    JOB_TEARDOWN_SLACK,
    SHUTDOWN_SLACK,
    Phase,
    RequestOutcome,
    TaskTree,
    TaskTreeClosed,
    open_task_tree,
    run_task_tree,
)
from tests.helpers import elapse

# A tolerance for "about this much fake time": the autojump clock only moves when all tasks
# are blocked, so timings are exact up to scheduling rounds, which cost no fake time.
EPS = 1e-6


class Recorder:
    """Records events in order, with the fake time they happened at."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.times: dict[str, float] = {}

    def __call__(self, event: str) -> None:
        self.events.append(event)
        self.times[event] = trio.current_time()

    async def interrupt(self) -> None:
        self("interrupt")


async def sleeper(rec: Recorder, name: str, seconds: float = float("inf")) -> None:
    """A job that works for ``seconds`` and records how it ended."""
    try:
        await trio.sleep(seconds)
    except trio.Cancelled:
        rec(f"cancelled:{name}")
        raise
    rec(f"done:{name}")


async def stubborn(rec: Recorder, name: str, teardown: float) -> None:
    """A job whose teardown after a cancel takes ``teardown`` seconds (shielded, bounded)."""
    try:
        await trio.sleep_forever()
    finally:
        rec(f"cancelled:{name}")
        with trio.move_on_after(teardown, shield=True):
            await trio.sleep(teardown)
        rec(f"torn-down:{name}")


async def service(rec: Recorder, name: str, *, task_status: trio.TaskStatus[None]) -> None:
    task_status.started()
    try:
        await trio.sleep_forever()
    finally:
        rec(f"cancelled:{name}")


async def test_drain_ends_early_when_the_jobs_finish(autojump_clock: MockClock) -> None:
    rec = Recorder()
    start = trio.current_time()
    async with open_task_tree(drain=30, kill_grace=5, on_interrupt=rec.interrupt) as tree:
        tree.start_job(sleeper, rec, "a", 1.0)
        tree.start_job(sleeper, rec, "b", 2.5)
        assert tree.live_jobs == 2
        tree.request_shutdown()
        await tree.wait_shutdown()
    assert rec.events == ["done:a", "done:b"]  # real outcomes; never interrupted
    assert trio.current_time() - start == pytest.approx(2.5, abs=EPS)
    assert tree.live_jobs == 0
    assert tree.phase == Phase.DONE


async def test_interrupt_comes_before_any_job_sees_the_cancel(autojump_clock: MockClock) -> None:
    rec = Recorder()
    start = trio.current_time()
    async with open_task_tree(drain=3, kill_grace=5, on_interrupt=rec.interrupt) as tree:
        tree.start_job(sleeper, rec, "a")
        tree.start_job(sleeper, rec, "b")
        tree.start_job(sleeper, rec, "quick", 1.0)
        tree.request_shutdown()
        await tree.wait_shutdown()
    assert rec.events[0] == "done:quick"
    assert rec.events[1] == "interrupt"
    assert sorted(rec.events[2:]) == ["cancelled:a", "cancelled:b"]
    assert rec.times["interrupt"] - start == pytest.approx(3.0, abs=EPS)  # the whole drain
    assert trio.current_time() - start == pytest.approx(3.0, abs=EPS)


async def test_on_interrupt_is_bounded_by_its_budget(autojump_clock: MockClock) -> None:
    rec = Recorder()

    async def hanging_interrupt() -> None:
        rec("interrupt")
        await trio.sleep_forever()

    start = trio.current_time()
    async with open_task_tree(
        drain=1, kill_grace=5, on_interrupt=hanging_interrupt, interrupt_budget=2
    ) as tree:
        tree.start_job(sleeper, rec, "a")
        tree.request_shutdown()
    assert rec.events == ["interrupt", "cancelled:a"]
    assert rec.times["cancelled:a"] - start == pytest.approx(1 + 2, abs=EPS)


async def test_failing_on_interrupt_still_cancels(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    rec = Recorder()

    async def broken_interrupt() -> None:
        rec("interrupt")
        raise RuntimeError("table on fire")

    async with open_task_tree(drain=1, kill_grace=5, on_interrupt=broken_interrupt) as tree:
        tree.start_job(sleeper, rec, "a")
        tree.request_shutdown()
    assert rec.events == ["interrupt", "cancelled:a"]
    assert "on_interrupt failed" in caplog.text
    assert "table on fire" in caplog.text


async def test_second_request_skips_the_rest_of_the_drain(autojump_clock: MockClock) -> None:
    rec = Recorder()
    start = trio.current_time()

    async def second_signal(tree: TaskTree) -> None:
        await trio.sleep(1.5)
        assert tree.phase == Phase.DRAINING
        assert tree.request_shutdown() is RequestOutcome.ESCALATED
        assert tree.request_shutdown() is RequestOutcome.REPEATED

    async with open_task_tree(drain=100, kill_grace=5, on_interrupt=rec.interrupt) as tree:
        tree.start_job(sleeper, rec, "a")
        tree.services.start_soon(second_signal, tree)
        assert tree.request_shutdown() is RequestOutcome.STARTED
        await tree.wait_shutdown()
    assert rec.events == ["interrupt", "cancelled:a"]
    assert rec.times["interrupt"] - start == pytest.approx(1.5, abs=EPS)
    assert tree.escalated


async def test_second_request_before_the_body_returns_skips_the_drain(
    autojump_clock: MockClock,
) -> None:
    rec = Recorder()
    start = trio.current_time()
    async with open_task_tree(drain=100, kill_grace=5, on_interrupt=rec.interrupt) as tree:
        tree.start_job(sleeper, rec, "a")
        tree.request_shutdown()
        tree.request_shutdown()
        await elapse(1)  # the body takes its time to return
    assert rec.events == ["interrupt", "cancelled:a"]
    assert rec.times["interrupt"] - start == pytest.approx(1, abs=EPS)


async def test_body_exception_marks_interrupted_first_and_is_reraised(
    autojump_clock: MockClock,
) -> None:
    rec = Recorder()
    stopped: list[float] = []
    start = trio.current_time()
    with pytest.raises(ValueError, match="setup failed") as info:
        async with open_task_tree(
            drain=100,
            kill_grace=5,
            on_interrupt=rec.interrupt,
            on_stop_accepting=lambda: stopped.append(trio.current_time()),
        ) as tree:
            tree.start_job(sleeper, rec, "a")
            tree.start_job(stubborn, rec, "b", 1.0)
            await elapse(0.5)
            raise ValueError("setup failed")
    assert type(info.value) is ValueError  # not wrapped in an exception group
    assert rec.events[0] == "interrupt"
    assert sorted(rec.events[1:3]) == ["cancelled:a", "cancelled:b"]
    assert rec.events[3:] == ["torn-down:b"]
    assert stopped == [pytest.approx(start + 0.5, abs=EPS)]  # no drain: straight to step 3
    assert rec.times["interrupt"] - start == pytest.approx(0.5, abs=EPS)
    assert trio.current_time() - start == pytest.approx(1.5, abs=EPS)
    assert tree.phase == Phase.DONE


async def test_outer_cancel_of_the_body_still_interrupts_before_cancelling(
    autojump_clock: MockClock,
) -> None:
    rec = Recorder()
    with trio.move_on_after(2) as outer:
        async with open_task_tree(drain=100, kill_grace=5, on_interrupt=rec.interrupt) as tree:
            tree.start_job(sleeper, rec, "a")
            await trio.sleep_forever()
    assert outer.cancelled_caught  # the Cancelled was re-raised and reached its scope
    assert rec.events == ["interrupt", "cancelled:a"]
    assert tree.phase == Phase.DONE


async def test_cancel_order_is_jobs_then_role_then_services(autojump_clock: MockClock) -> None:
    rec = Recorder()

    async def slow_role(*, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            rec("cancelled:role")
            with trio.move_on_after(0.3, shield=True):
                await elapse(0.3)  # e.g. closing the listener
            rec("closed:role")

    async with open_task_tree(drain=1, kill_grace=5, on_interrupt=rec.interrupt) as tree:
        await tree.services.start(service, rec, "services")
        await tree.role.start(slow_role)
        tree.start_job(stubborn, rec, "job", 0.5)
        tree.request_shutdown()
        await tree.wait_shutdown()
    assert rec.events == [
        "interrupt",
        "cancelled:job",
        "torn-down:job",
        "cancelled:role",
        "closed:role",
        "cancelled:services",
    ]
    assert rec.times["torn-down:job"] <= rec.times["cancelled:role"]
    assert rec.times["closed:role"] <= rec.times["cancelled:services"]


async def test_shutdown_waits_for_job_teardown_within_the_bound(autojump_clock: MockClock) -> None:
    rec = Recorder()
    start = trio.current_time()
    async with open_task_tree(drain=2, kill_grace=4, on_interrupt=rec.interrupt) as tree:
        tree.start_job(stubborn, rec, "a", 4.0)  # uses the whole kill grace
        tree.request_shutdown()
    elapsed = trio.current_time() - start
    assert elapsed == pytest.approx(2 + 4, abs=EPS)
    assert elapsed <= tree.shutdown_bound
    assert tree.shutdown_bound == 2 + tree.interrupt_budget + 4 + SHUTDOWN_SLACK


async def test_a_job_overrunning_the_grace_is_logged_and_awaited(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    rec = Recorder()
    start = trio.current_time()
    async with open_task_tree(drain=1, kill_grace=1) as tree:
        tree.start_job(stubborn, rec, "late", 10.0, name="late-job")
        tree.request_shutdown()
    # The tree cannot abandon a task: it says who is late, and waits.
    assert trio.current_time() - start == pytest.approx(1 + 10, abs=EPS)
    assert rec.events == ["cancelled:late", "torn-down:late"]
    assert f"jobs scope still busy {1 + JOB_TEARDOWN_SLACK:g}s after its cancel" in caplog.text
    assert "late-job" in caplog.text


async def test_a_failing_job_is_logged_and_does_not_stop_the_tree(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    rec = Recorder()

    async def broken() -> None:
        await elapse(0.1)
        raise KeyError("no such device")

    async with open_task_tree(drain=5, kill_grace=1) as tree:
        await tree.services.start(service, rec, "services")
        tree.start_job(broken, name="broken-job")
        tree.start_job(sleeper, rec, "ok", 1.0)
        await elapse(0.5)
        assert tree.live_jobs == 1
        assert not tree.stopping
        tree.request_shutdown()
    assert rec.events == ["done:ok", "cancelled:services"]
    assert "job broken-job failed" in caplog.text
    assert "no such device" in caplog.text
    assert "Traceback" in caplog.text


async def test_a_job_group_mixing_errors_and_cancelled_logs_the_errors(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    async def job_with_helpers() -> None:
        async def helper_that_fails_on_cancel() -> None:
            try:
                await trio.sleep_forever()
            finally:
                raise OSError("pipe closed")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(helper_that_fails_on_cancel)
            await trio.sleep_forever()

    async with open_task_tree(drain=0.5, kill_grace=1) as tree:
        tree.start_job(job_with_helpers, name="mixed")
        tree.request_shutdown()
    assert tree.phase == Phase.DONE
    assert "job mixed failed" in caplog.text
    assert "pipe closed" in caplog.text


async def test_a_crashing_role_shuts_the_tree_down_in_order(autojump_clock: MockClock) -> None:
    rec = Recorder()

    async def crashing_role() -> None:
        await elapse(1)
        raise RuntimeError("listener died")

    with pytest.RaisesGroup(
        pytest.RaisesExc(RuntimeError, match="listener died"), flatten_subgroups=True
    ):
        async with open_task_tree(drain=100, kill_grace=5, on_interrupt=rec.interrupt) as tree:
            await tree.services.start(service, rec, "services")
            tree.role.start_soon(crashing_role)
            tree.start_job(sleeper, rec, "a")
            await tree.wait_shutdown()
    assert rec.events == ["interrupt", "cancelled:a", "cancelled:services"]
    assert tree.phase == Phase.DONE


async def test_request_shutdown_is_idempotent_and_runs_step_one_once(
    autojump_clock: MockClock,
) -> None:
    calls: list[bool] = []
    async with open_task_tree(drain=1, kill_grace=1) as tree:
        watched = trio.CancelScope()
        tree.cancel_on_shutdown(watched)
        assert not watched.cancel_called
        tree._on_stop_accepting = lambda: calls.append(tree.stopping)
        assert not tree.stopping
        assert not tree.shutdown_requested.is_set()
        assert tree.request_shutdown() is RequestOutcome.STARTED
        assert tree.stopping
        assert tree.shutdown_requested.is_set()
        assert watched.cancel_called
        assert tree.request_shutdown() is RequestOutcome.ESCALATED
        assert tree.request_shutdown() is RequestOutcome.REPEATED
        late = trio.CancelScope()
        tree.cancel_on_shutdown(late)
        assert late.cancel_called
    assert calls == [True]
    assert tree.request_shutdown() is RequestOutcome.REPEATED  # after DONE: harmless


async def test_body_ending_on_its_own_runs_the_sequence(autojump_clock: MockClock) -> None:
    calls: list[str] = []
    async with open_task_tree(
        drain=1, kill_grace=1, on_stop_accepting=lambda: calls.append("stop")
    ) as tree:
        pass
    assert calls == ["stop"]
    assert tree.shutdown_requested.is_set()
    assert tree.phase == Phase.DONE


async def test_no_job_starts_once_the_jobs_are_cancelled(autojump_clock: MockClock) -> None:
    rec = Recorder()
    refused: list[str] = []

    async def late_starter(tree: TaskTree) -> None:
        try:
            await trio.sleep_forever()
        finally:
            try:
                tree.start_job(sleeper, rec, "late")
            except TaskTreeClosed as exc:
                refused.append(str(exc))

    async with open_task_tree(drain=1, kill_grace=1) as tree:
        tree.role.start_soon(late_starter, tree)
        tree.request_shutdown()
    assert refused == ["the task tree is cancelling: no new jobs"]
    assert rec.events == []
    with pytest.raises(TaskTreeClosed):
        tree.start_job(sleeper, rec, "after")


async def test_describe_lists_the_tasks_of_each_scope(autojump_clock: MockClock) -> None:
    rec = Recorder()
    async with open_task_tree(drain=1, kill_grace=1) as tree:
        await tree.services.start(service, rec, "sampler", name="sampler")
        await tree.role.start(service, rec, "http", name="http-server")
        tree.start_job(sleeper, rec, "a", 10, name="job-a")
        tree.start_job(sleeper, rec, "b", 10, name="job-b")
        await trio.testing.wait_all_tasks_blocked()
        assert tree.snapshot() == {
            "services": ["sampler"],
            "role": ["http-server"],
            "jobs": ["job-a", "job-b"],
        }
        text = tree.describe()
        assert text.splitlines() == [
            "task tree: phase running, 2 live job(s), drain 1s, kill grace 1s",
            "├─ services: sampler",
            "├─ role: http-server",
            "└─ jobs: job-a, job-b",
        ]
        assert repr(tree) == "<TaskTree phase=running live_jobs=2>"
        assert [scope.name for scope in tree.scopes] == ["services", "role", "jobs"]
    assert tree.describe().splitlines()[1:] == [
        "├─ services (closed): -",
        "├─ role (closed): -",
        "└─ jobs (closed): -",
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"drain": -1, "kill_grace": 1}, "drain"),
        ({"drain": 1, "kill_grace": 0}, "kill_grace"),
        ({"drain": 1, "kill_grace": float("nan")}, "kill_grace"),
        ({"drain": float("inf"), "kill_grace": 1}, "drain"),
        ({"drain": 1, "kill_grace": 1, "interrupt_budget": -2}, "interrupt_budget"),
    ],
)
async def test_policy_is_validated(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        async with open_task_tree(**kwargs):
            pass  # pragma: no cover


async def test_run_task_tree_cancels_setup_on_request(autojump_clock: MockClock) -> None:
    rec = Recorder()

    async def setup(tree: TaskTree) -> None:
        await tree.services.start(service, rec, "services")
        tree.start_job(sleeper, rec, "a", 2.0)
        tree.services.start_soon(_request_later, tree, 1.0)
        try:
            await trio.sleep_forever()  # e.g. a registration that never completes
        finally:
            rec("setup-cancelled")

    start = trio.current_time()
    await run_task_tree(setup, drain=10, kill_grace=1, signals=())
    assert rec.events == ["setup-cancelled", "done:a", "cancelled:services"]
    assert rec.times["setup-cancelled"] - start == pytest.approx(1.0, abs=EPS)
    assert trio.current_time() - start == pytest.approx(2.0, abs=EPS)


async def test_run_task_tree_reraises_a_setup_failure(autojump_clock: MockClock) -> None:
    rec = Recorder()

    async def setup(tree: TaskTree) -> None:
        tree.start_job(sleeper, rec, "a")
        raise OSError("address already in use")

    with pytest.raises(OSError, match="address already in use"):
        await run_task_tree(setup, drain=10, kill_grace=1, on_interrupt=rec.interrupt, signals=())
    assert rec.events == ["interrupt", "cancelled:a"]


async def _request_later(tree: TaskTree, delay: float) -> None:
    await trio.sleep(delay)
    tree.request_shutdown("test")
