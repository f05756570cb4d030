"""A dispatched job starts after its ack: its 202 is written first, and acks of other
dispatches still waiting for their commit go before it (bounded) — the job's spawn never
competes with an ack (docs/node.md, "Job journal and restarts")."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import trio
import trio.testing

from fleet_trio.node.app import create_app
from fleet_trio.node.jobs import ACK_PRIORITY_BOUND, RELEASE_BOUND, Done
from fleet_trio.node.journal import Accept, Journal, JournalWriter
from tests.helpers import wait_until
from tests.node.harness import make_ctx
from tests.node.store_tree import store_in_tree


class _Recorder:
    """ASGI wrapper outside the app: notes when a response's last body message went out."""

    def __init__(self, app: Any, events: list[str]) -> None:
        self.app = app
        self.events = events

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def sent(message: Any) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                self.events.append(f"sent {scope['path']}")

        await self.app(scope, receive, sent)


async def test_the_job_starts_after_its_202_is_written(tmp_path: Path) -> None:
    journal = Journal(str(tmp_path / "j.sqlite"))
    journal.open()
    events: list[str] = []
    async with store_in_tree(journal=JournalWriter(journal), janitor=False) as (store, _tree):
        ctx = make_ctx(tmp_path, store)

        async def execute(job: Any) -> Done:
            events.append(f"run {job.job_id}")
            job.cleanup()
            return Done(b"{}")

        ctx.runner.execute = execute  # type: ignore[method-assign]
        app = _Recorder(create_app(ctx), events)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            for job_id in ("a", "b", "c"):
                r = await client.post("/fleet/dispatch", json={"job_id": job_id, "task_type": "t"})
                assert r.status_code == 202
            await wait_until(lambda: len(events) >= 6, timeout=5, what="three acks and runs")
    for job_id in ("a", "b", "c"):
        assert events.index("sent /fleet/dispatch") < events.index(f"run {job_id}")
    assert events.count("sent /fleet/dispatch") == 3


async def test_a_job_whose_202_is_never_written_still_starts(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A client that never takes its answer does not hold the job: it starts after the bound."""
    started: list[float] = []
    async with store_in_tree(janitor=False) as (store, _tree):

        async def work() -> Done:
            started.append(trio.current_time())
            return Done(b"{}")

        t0 = trio.current_time()
        store.register("j", work, release=trio.Event())  # never set
        await wait_until(lambda: started, timeout=RELEASE_BOUND + 5, what="the job's start")
    assert RELEASE_BOUND <= started[0] - t0 < RELEASE_BOUND + 0.1


async def test_a_job_yields_to_an_ack_still_being_committed(tmp_path: Path) -> None:
    """ "a" is committed while the ack of "b" waits for its own commit: "a" does not start
    until that commit is done — or, if it hangs, until ACK_PRIORITY_BOUND has passed."""
    journal = Journal(str(tmp_path / "j.sqlite"))
    journal.open()
    original = journal.apply
    gates = {"a": threading.Event(), "b": threading.Event()}
    held = {"a": threading.Event(), "b": threading.Event()}

    def apply(records: Any) -> None:
        for rec in records:
            if isinstance(rec, Accept) and rec.job_id in gates:
                held[rec.job_id].set()
                gates[rec.job_id].wait(10)
        original(records)

    journal.apply = apply  # type: ignore[method-assign]
    order: list[str] = []
    started: dict[str, tuple[float, bool]] = {}  # name -> (when, was "b" still uncommitted)

    async with store_in_tree(journal=JournalWriter(journal), janitor=False) as (store, _tree):

        def work(name: str) -> Any:
            async def run() -> Done:
                order.append(name)
                started[name] = (trio.current_time(), store.table.pending("b"))
                return Done(b"{}")

            return run

        store.register("a", work("a"))
        assert await trio.to_thread.run_sync(held["a"].wait, 10)
        store.register("b", work("b"))  # queued behind the commit of "a"
        gates["a"].set()
        assert await store.wait_recorded("a")
        recorded = trio.current_time()
        await wait_until(lambda: order == ["a"], timeout=ACK_PRIORITY_BOUND + 5)
        when, b_pending = started["a"]
        assert b_pending  # "a" started while "b" was still uncommitted (it went at the bound)
        # a wait, not a race: "a" started at the bound after its commit, not at once (half the
        # bound leaves room for the two tasks that its commit woke to run apart)
        assert when - recorded >= ACK_PRIORITY_BOUND / 2, when - recorded
        gates["b"].set()
        assert await store.wait_recorded("b")
        await wait_until(lambda: order == ["a", "b"], timeout=5)


def test_the_bounds_are_short() -> None:
    assert 0 < ACK_PRIORITY_BOUND <= RELEASE_BOUND <= 1.0
