"""node.md §9, items 1–19: the job store, with fake executions (trio tasks).

The store runs in a real task tree wired as ``serve_node`` wires it (``tests.node.store_tree``):
items 14–19 ("the drain") exercise the tree's shutdown sequence — the code that drains a node in
production — with the drain timeout as the tree's ``drain``."""

from __future__ import annotations

import trio
import trio.testing

from fleet_trio.node.jobs import (
    INTERRUPTED,
    Done,
    Failed,
    JobState,
    JobTable,
    Outcome,
    Registration,
)
from tests.helpers import elapse, wait_until
from tests.node.store_tree import store_in_tree


class Blocker:
    """A fake execution that blocks until released, counting its runs."""

    def __init__(self, outcome: Outcome | None = None) -> None:
        self.outcome = outcome if outcome is not None else Done(b'{"ok":true}')
        self.release = trio.Event()
        self.started = trio.Event()
        self.runs = 0

    async def __call__(self) -> Outcome:
        self.runs += 1
        self.started.set()
        await self.release.wait()
        return self.outcome


async def settle() -> None:
    await trio.testing.wait_all_tasks_blocked()


async def test_node_001_registered_job_readable_immediately(autojump_clock: object) -> None:
    async with store_in_tree() as (store, _tree):
        work = Blocker()
        assert store.register("j1", work) is Registration.CREATED
        view = store.get("j1")
        assert view is not None and view.state in (JobState.ACCEPTED, JobState.RUNNING)
        work.release.set()


async def test_node_002_blocked_execution_is_running(autojump_clock: object) -> None:
    async with store_in_tree() as (store, _tree):
        work = Blocker()
        store.register("j1", work)
        await work.started.wait()
        view = store.get("j1")
        assert view is not None and view.state is JobState.RUNNING
        work.release.set()


async def test_node_003_success_is_done_with_identical_data(autojump_clock: object) -> None:
    raw = b'{"image_path": "/tmp/x.png",  "seed":7, "f": 16.0}'
    async with store_in_tree() as (store, _tree):
        work = Blocker(Done(raw))
        store.register("j1", work)
        work.release.set()
        await settle()
        view = store.get("j1")
        assert view is not None and view.state is JobState.DONE
        assert view.data == raw and view.error is None


async def test_node_004_failure_is_error_with_exact_message(autojump_clock: object) -> None:
    async with store_in_tree() as (store, _tree):
        work = Blocker(Failed("oom: cudaMalloc failed"))
        store.register("j1", work)
        work.release.set()
        await settle()
        view = store.get("j1")
        assert view is not None and view.state is JobState.ERROR
        assert view.error == "oom: cudaMalloc failed" and view.data is None


async def test_node_005_duplicate_not_created_running_and_done(autojump_clock: object) -> None:
    async with store_in_tree() as (store, _tree):
        work = Blocker()
        assert store.register("j1", work).created
        await work.started.wait()
        assert store.register("j1", work) is Registration.EXISTS
        work.release.set()
        await settle()
        assert store.get("j1") is not None
        assert store.get("j1").state is JobState.DONE  # type: ignore[union-attr]
        assert store.register("j1", work) is Registration.EXISTS
        await settle()
        assert work.runs == 1


async def test_node_006_concurrent_registrations_exactly_once(autojump_clock: object) -> None:
    async with store_in_tree() as (store, _tree):
        work = Blocker()
        results: list[Registration] = []

        async def attempt() -> None:
            await trio.lowlevel.checkpoint()
            results.append(store.register("same", work))

        async with trio.open_nursery() as n:
            for _ in range(32):
                n.start_soon(attempt)
        work.release.set()
        await settle()
        assert results.count(Registration.CREATED) == 1
        assert results.count(Registration.EXISTS) == 31
        assert work.runs == 1


async def test_node_007_queue_depth(autojump_clock: object) -> None:
    async with store_in_tree() as (store, _tree):
        assert store.queue_depth == 0
        a, b = Blocker(), Blocker()
        store.register("a", a)
        store.register("b", b)
        await settle()
        assert store.queue_depth == 2
        a.release.set()
        b.release.set()
        await settle()
        assert store.queue_depth == 0


async def test_node_008_unknown_id_not_found() -> None:
    assert JobTable().get("nope") is None


def _finished_at(t: float, job_id: str = "j", table: JobTable | None = None) -> JobTable:
    table = table if table is not None else JobTable(ttl=3600.0)
    table.register(job_id)
    table.finish(job_id, Done(b"{}"), t)
    return table


def test_node_009_sweep_after_30_min_keeps() -> None:
    table = _finished_at(0.0)
    assert table.sweep(30 * 60.0) == []
    assert table.get("j") is not None


def test_node_010_sweep_after_75_min_evicts() -> None:
    table = _finished_at(0.0)
    assert table.sweep(75 * 60.0) == ["j"]
    assert table.get("j") is None


def test_node_011_recent_job_survives_75_min_sweep() -> None:
    table = _finished_at(0.0)
    _finished_at(75 * 60.0 - 1.0, "recent", table)
    assert table.sweep(75 * 60.0) == ["j"]
    assert table.get("recent") is not None


def test_node_012_in_flight_never_evicted() -> None:
    table = JobTable(ttl=3600.0)
    table.register("old")
    table.start("old")
    assert table.sweep(1e9) == []
    view = table.get("old")
    assert view is not None and view.state is JobState.RUNNING


async def test_node_013_janitor_evicts_within_3s_real_time() -> None:
    with trio.fail_after(5):
        async with store_in_tree(ttl=0.001, janitor_interval=0.01) as (store, _tree):

            async def quick() -> Outcome:
                return Done(b"{}")

            store.register("j", quick)
            await wait_until(lambda: store.get("j") is None, timeout=3.0, interval=0.005)


async def test_node_014_drain_marks_blocked_job_interrupted(autojump_clock: object) -> None:
    work = Blocker()
    async with store_in_tree(drain=0.05) as (store, tree):
        store.register("j", work)
        await work.started.wait()
        tree.request_shutdown()
        t0 = trio.current_time()
    assert trio.current_time() - t0 < 3.0
    view = store.get("j")
    assert view is not None and view.state is JobState.ERROR and view.error == INTERRUPTED


async def test_node_015_late_success_never_replaces_interrupted(autojump_clock: object) -> None:
    async with store_in_tree(drain=0.05) as (store, tree):

        async def stubborn() -> Outcome:
            try:
                await trio.sleep_forever()
            finally:
                # A late "success" produced during the post-cancel cleanup.
                with trio.CancelScope(shield=True):
                    await store.finish("j", Done(b'{"late":true}'))
            raise AssertionError("unreachable")

        store.register("j", stubborn)
        await settle()
        tree.request_shutdown()
    view = store.get("j")
    assert view is not None and view.error == INTERRUPTED and view.data is None


async def test_node_016_drain_waits_for_cleanup(autojump_clock: object) -> None:
    cleaned = trio.Event()

    async def slow_cleanup() -> Outcome:
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(1.0)
            cleaned.set()
        raise AssertionError("unreachable")

    async with store_in_tree(drain=0.05) as (store, tree):
        store.register("j", slow_cleanup)
        await settle()
        tree.request_shutdown()
        t0 = trio.current_time()
    elapsed = trio.current_time() - t0
    assert cleaned.is_set()
    assert 1.0 <= elapsed < 4.0
    view = store.get("j")
    assert view is not None and view.error == INTERRUPTED


async def test_node_017_after_drain_registration_refused(autojump_clock: object) -> None:
    async with store_in_tree(drain=0.05) as (store, tree):
        tree.request_shutdown()
    assert store.draining
    assert store.register("late", Blocker()) is Registration.DRAINING
    assert store.get("late") is None


async def test_node_018_job_finishing_within_drain_keeps_outcome(autojump_clock: object) -> None:
    async with store_in_tree(drain=5.0) as (store, tree):

        async def quick() -> Outcome:
            await elapse(0.03)
            return Done(b'{"v":1}')

        store.register("j", quick)
        await settle()
        tree.request_shutdown()
    view = store.get("j")
    assert view is not None and view.state is JobState.DONE and view.data == b'{"v":1}'


async def test_node_019_second_drain_is_harmless(autojump_clock: object) -> None:
    work = Blocker()
    async with store_in_tree(drain=0.05) as (store, tree):
        store.register("j", work)
        await settle()
        tree.request_shutdown()
        tree.request_shutdown()  # the second request only shortens what is left of the drain
    tree.request_shutdown()  # and one after the tree closed changes nothing
    view = store.get("j")
    assert view is not None and view.error == INTERRUPTED
    assert store.queue_depth == 0
