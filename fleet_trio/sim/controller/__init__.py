"""A simulated rc controller: the worker-facing half of ``rc serve``, in process, on Trio.

It speaks E1–E7 of worker-protocol.md exactly as rc-wire-capture.md shows the reference
controller doing it (paths, bodies, status codes, ``Rc-Controller-Instance`` on every answer,
Go's JSON encoding), applies the controller state changes of §3, §5–§7, §10 and §14, and gives
tests a small Python API: submit and kill jobs, restart the controller, inject failures, and
read back every request the worker sent. See docs/sim-controller.md.

Its modules (records, state, protocol, faults, app) each say what they hold; the public names
are re-exported here.
"""

from __future__ import annotations

from fleet_trio.sim.controller import app, records, state
from fleet_trio.sim.controller.app import *  # noqa: F403
from fleet_trio.sim.controller.records import *  # noqa: F403
from fleet_trio.sim.controller.state import *  # noqa: F403

__all__ = [*app.__all__, *records.__all__, *state.__all__]
