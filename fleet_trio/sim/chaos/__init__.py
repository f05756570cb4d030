"""Chaos scenarios: seeded fault schedules against a real fleet, and the promise checker.

Three parts, one module each (docs/chaos.md):

* :mod:`.schedule`: :func:`make_schedule`, a pure function of ``(seed, duration)``: a list of
  :class:`Step` (dispatches to the nodes, rc jobs on the workers' devices, ``rc kill``, a crash
  or a graceful stop and restart of a node or worker, a controller restart, link faults). The
  same seed gives the same list, on any machine.
* :mod:`.runner`: :func:`run_schedule` plays a schedule against a fleet from
  :func:`~fleet_trio.sim.fleet.open_fleet`, lets it settle, and collects plain
  :class:`Records` (what the dispatcher, the controller, ``/proc``, the fake GPUs and the
  launcher saw).
* :mod:`.checker`: :func:`check`, synchronous functions over those records, one per promise;
  each broken promise is a :class:`Violation`. No I/O, so they are unit-tested on hand-made
  records.

Every public name is re-exported here (``from fleet_trio.sim.chaos import run_schedule``).
"""

from __future__ import annotations

from fleet_trio.sim.chaos import checker, runner, schedule
from fleet_trio.sim.chaos.checker import *  # noqa: F403
from fleet_trio.sim.chaos.runner import *  # noqa: F403
from fleet_trio.sim.chaos.schedule import *  # noqa: F403

__all__ = [*checker.__all__, *runner.__all__, *schedule.__all__]
