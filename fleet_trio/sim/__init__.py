"""The simulation harness (docs/sim.md): the simulated rc controller, the simulated Fleet
Dispatcher, faulty links, the pytest plugin's building blocks, chaos scenarios and the demo.

Names are imported on first use (PEP 562), so importing ``fleet_trio.sim`` (the pytest plugin,
the CLI) does not load the web stack until a simulated service is actually used. ``_MODULES``
names each module's exports, once; type checkers read the same modules' ``__all__``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_MODULES = {
    "controller": "ENDPOINTS INSTANCE_HEADER Device Event Job RequestRecord SimController SimError "
    "Worker create_app serve_controller",
    "dispatcher": "LOST_404 DispatchRecord Observation SimDispatcher serve_dispatcher "
    "terminal_states",
    "faults": "FaultyLink serve_link",
}
_EXPORTS = {name: module for module, names in _MODULES.items() for name in names.split()}

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
