"""The node's kept results under the memory budget (``fleet_trio.memory``, docs/node.md).

:func:`attach_result_budget` charges every ``done`` result the job table keeps to a
:class:`~fleet_trio.memory.MemoryBudget` (the one the log bus also charges), through the table's
``on_change`` hook. When the budget is full the oldest ended entries go first: an evicted result
turns its job into ``error`` with :data:`EVICTED_PREFIX` …, so a poll says clearly what happened
(never a silent 404, which the dispatcher would answer by running the job again).
"""

from __future__ import annotations

from collections.abc import Callable

from fleet_trio.memory import Key, MemoryBudget, format_size
from fleet_trio.node.jobs import JobState, JobTable, JobView

EVICTED_PREFIX = "result evicted"


def evicted_message(nbytes: int, budget: int) -> str:
    return (
        f"{EVICTED_PREFIX}: the job succeeded, but its {nbytes}-byte result was dropped to keep "
        f"the node within its memory budget ({format_size(budget)}, memory_budget); poll "
        "sooner, raise the budget, or dispatch again under a new id"
    )


def attach_result_budget(
    table: JobTable,
    budget: MemoryBudget,
    *,
    on_drop: Callable[[str, str], object] | None = None,
) -> None:
    """Charge ``table``'s kept results to ``budget`` (sync; the table calls back).

    ``on_drop(job_id, error)``: after an evicted result turned its job into ``error`` (the
    node journals it, so a restart answers what polls were answered)."""

    def evict(job_id: str, nbytes: int) -> int:
        message = evicted_message(nbytes, budget.limit)
        if table.drop_result(job_id, message) and on_drop is not None:
            on_drop(job_id, message)
        return 0

    def changed(job_id: str, view: JobView | None) -> None:
        key: Key = ("result", job_id)
        if view is None:
            budget.release(key)
            return
        if view.state is JobState.DONE and view.data:
            n = len(view.data)
            budget.charge(key, n, lambda: evict(job_id, n))
            budget.end(key)
            budget.settle()

    table.on_change = changed


__all__ = ["EVICTED_PREFIX", "attach_result_budget", "evicted_message"]
