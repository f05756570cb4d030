"""``fleet-trio worker``: a drop-in replacement for the Go ``rc worker`` (docs/worker.md).

``config`` reads ``/etc/rc/worker.yaml``; ``client`` speaks the controller's worker routes;
``worker`` runs the lifecycle as a task tree.
"""

from fleet_trio.worker.client import ContactTracker, ControllerClient, Timings
from fleet_trio.worker.worker import NoHooks, Worker, WorkerHooks, WorkerTimings, serve_worker

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
