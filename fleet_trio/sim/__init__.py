"""The simulation harness (docs/sim.md): the simulated rc controller, the simulated Fleet
Dispatcher, faulty links, the pytest plugin's building blocks, chaos scenarios and the demo.

Names are imported on first use (PEP 562), so importing ``fleet_trio.sim`` (the pytest plugin,
the CLI) does not load the web stack until a simulated service is actually used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "ENDPOINTS": "controller",
    "INSTANCE_HEADER": "controller",
    "Device": "controller",
    "Event": "controller",
    "Job": "controller",
    "RequestRecord": "controller",
    "SimController": "controller",
    "SimError": "controller",
    "Worker": "controller",
    "create_app": "controller",
    "serve_controller": "controller",
    "DispatchRecord": "dispatcher",
    "Observation": "dispatcher",
    "SimDispatcher": "dispatcher",
    "serve_dispatcher": "dispatcher",
    "FaultyLink": "faults",
    "serve_link": "faults",
}

if TYPE_CHECKING:
    from fleet_trio.sim.controller import (
        ENDPOINTS,
        INSTANCE_HEADER,
        Device,
        Event,
        Job,
        RequestRecord,
        SimController,
        SimError,
        Worker,
        create_app,
        serve_controller,
    )
    from fleet_trio.sim.dispatcher import (
        DispatchRecord,
        Observation,
        SimDispatcher,
        serve_dispatcher,
    )
    from fleet_trio.sim.faults import FaultyLink, serve_link


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fleet_trio.sim' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"fleet_trio.sim.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "ENDPOINTS",
    "INSTANCE_HEADER",
    "Device",
    "DispatchRecord",
    "Event",
    "FaultyLink",
    "Job",
    "Observation",
    "RequestRecord",
    "SimController",
    "SimDispatcher",
    "SimError",
    "Worker",
    "create_app",
    "serve_controller",
    "serve_dispatcher",
    "serve_link",
]
