"""The simulation harness (docs/sim.md): the simulated rc controller, the simulated Fleet
Dispatcher, faulty links, the pytest plugin's building blocks, chaos scenarios and the demo.

Names are imported on first use (PEP 562), so importing ``fleet_trio.sim`` (the pytest plugin,
the CLI) does not load the web stack until a simulated service is actually used. ``_EXPORTS``
names each export's module, once; type checkers read the same modules' ``__all__``.
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
    "LOST_404": "dispatcher",
    "DispatchRecord": "dispatcher",
    "Observation": "dispatcher",
    "SimDispatcher": "dispatcher",
    "serve_dispatcher": "dispatcher",
    "terminal_states": "dispatcher",
    "FaultyLink": "faults",
    "serve_link": "faults",
}

if TYPE_CHECKING:
    from fleet_trio.sim.controller import *  # noqa: F403
    from fleet_trio.sim.dispatcher import *  # noqa: F403
    from fleet_trio.sim.faults import *  # noqa: F403


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fleet_trio.sim' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"fleet_trio.sim.{module}"), name)
    globals()[name] = value
    return value


__all__ = sorted(_EXPORTS)
