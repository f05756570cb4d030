"""The task tree: named nested scopes (services, role, jobs), the shutdown coordinator, signals.

See ``docs/task-tree.md`` and design.md §3.
"""

from fleet_trio.nursery.signals import DEFAULT_SIGNALS, ShutdownTarget, serve_shutdown_signals
from fleet_trio.nursery.tree import (
    DEFAULT_INTERRUPT_BUDGET,
    JOB_TEARDOWN_SLACK,
    SCOPE_TEARDOWN_SLACK,
    SHUTDOWN_SLACK,
    Phase,
    PhaseError,
    RequestOutcome,
    Scope,
    ShutdownState,
    TaskTree,
    TaskTreeClosed,
    open_task_tree,
    run_task_tree,
)

__all__ = [
    "DEFAULT_INTERRUPT_BUDGET",
    "DEFAULT_SIGNALS",
    "JOB_TEARDOWN_SLACK",
    "SCOPE_TEARDOWN_SLACK",
    "SHUTDOWN_SLACK",
    "Phase",
    "PhaseError",
    "RequestOutcome",
    "Scope",
    "ShutdownState",
    "ShutdownTarget",
    "TaskTree",
    "TaskTreeClosed",
    "open_task_tree",
    "run_task_tree",
    "serve_shutdown_signals",
]
