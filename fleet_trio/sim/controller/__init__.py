"""A simulated rc controller: the worker-facing half of ``rc serve``, in process, on Trio.

It speaks E1–E7 of worker-protocol.md exactly as rc-wire-capture.md shows the reference
controller doing it (paths, bodies, status codes, ``Rc-Controller-Instance`` on every answer,
Go's JSON encoding), applies the controller state changes of §3, §5–§7, §10 and §14, and gives
tests a small Python API: submit and kill jobs, restart the controller, inject failures, and
read back every request the worker sent. See docs/sim-controller.md.

The package: :mod:`.records` (constants and records), :mod:`.state` (:class:`SimController`:
the state and the test API), :mod:`.protocol` (the E1–E7 transitions, no HTTP),
:mod:`.faults` (failure injection), :mod:`.app` (the quart-trio app and the byte pump in
front of hypercorn: :func:`create_app`, :func:`serve_controller`). The public names are
re-exported here: ``from fleet_trio.sim.controller import SimController`` keeps working.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "create_app": "app",
    "serve_controller": "app",
    "ENDPOINTS": "records",
    "INSTANCE_HEADER": "records",
    "Device": "records",
    "Event": "records",
    "Job": "records",
    "RequestRecord": "records",
    "SimError": "records",
    "Worker": "records",
    "SimController": "state",
}
"""Names imported on first use (PEP 562): the state alone does not load the web stack."""

if TYPE_CHECKING:
    from fleet_trio.sim.controller.app import create_app, serve_controller
    from fleet_trio.sim.controller.records import (
        ENDPOINTS,
        INSTANCE_HEADER,
        Device,
        Event,
        Job,
        RequestRecord,
        SimError,
        Worker,
    )
    from fleet_trio.sim.controller.state import SimController


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fleet_trio.sim.controller' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"fleet_trio.sim.controller.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "ENDPOINTS",
    "INSTANCE_HEADER",
    "Device",
    "Event",
    "Job",
    "RequestRecord",
    "SimController",
    "SimError",
    "Worker",
    "create_app",
    "serve_controller",
]
