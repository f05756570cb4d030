"""A :class:`~fleet_trio.node.jobs.JobStore` wired into a real task tree the way
``serve_node`` wires it: jobs run in the tree's jobs scope, ``begin_drain`` is the tree's
``on_stop_accepting``, ``mark_interrupted`` its ``on_interrupt``, the janitor runs in the
services scope. The drain is the tree's shutdown sequence (the code that runs in production),
driven by ``tree.request_shutdown()`` and the end of the ``async with``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fleet_trio.node.jobs import DEFAULT_JANITOR_INTERVAL, DEFAULT_TTL, JobStore
from fleet_trio.node.journal import JournalWriter
from fleet_trio.nursery import TaskTree, open_task_tree


@asynccontextmanager
async def store_in_tree(
    *,
    ttl: float = DEFAULT_TTL,
    janitor_interval: float = DEFAULT_JANITOR_INTERVAL,
    drain: float = 30.0,
    kill_grace: float = 5.0,
    janitor: bool = True,
    journal: JournalWriter | None = None,
) -> AsyncIterator[tuple[JobStore, TaskTree]]:
    store = JobStore(ttl=ttl, janitor_interval=janitor_interval, journal=journal)

    async def interrupt() -> None:
        await store.mark_interrupted()

    async with open_task_tree(
        drain=drain,
        kill_grace=kill_grace,
        on_stop_accepting=store.begin_drain,
        on_interrupt=interrupt,
    ) as tree:
        store.set_spawn(tree.start_job)
        if journal is not None:
            await tree.services.start(journal.serve)
        if janitor:
            await tree.services.start(store.serve_janitor)
        yield store, tree
