"""``fleet-trio worker``: a drop-in replacement for the Go ``rc worker`` (docs/worker.md).

``config`` reads ``/etc/rc/worker.yaml``; ``client`` speaks the controller's worker routes;
``worker`` runs the lifecycle as a task tree.

The names below are loaded on first use, so that reading a config (``fleet-trio worker
--check``, a config error) does not load the HTTP stack.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleet_trio.worker.client import ContactTracker, ControllerClient, Timings
    from fleet_trio.worker.worker import (
        NoHooks,
        Worker,
        WorkerHooks,
        WorkerTimings,
        serve_worker,
    )

_HOME = {
    "ContactTracker": "client",
    "ControllerClient": "client",
    "Timings": "client",
    "NoHooks": "worker",
    "Worker": "worker",
    "WorkerHooks": "worker",
    "WorkerTimings": "worker",
    "serve_worker": "worker",
}


if not TYPE_CHECKING:  # the type checker sees the imports above, and flags a misspelt name

    def __getattr__(name: str) -> Any:
        module = _HOME.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})


__all__ = [
    "ContactTracker",
    "ControllerClient",
    "NoHooks",
    "Timings",
    "Worker",
    "WorkerHooks",
    "WorkerTimings",
    "serve_worker",
]
