"""Chaos scenarios (docs/chaos.md): :mod:`.schedule`, :mod:`.runner` and :mod:`.checker`, one
part each. Every public name is re-exported here (``from fleet_trio.sim.chaos import
run_schedule``)."""

from __future__ import annotations

from fleet_trio.sim.chaos import checker, runner, schedule
from fleet_trio.sim.chaos.checker import *  # noqa: F403
from fleet_trio.sim.chaos.runner import *  # noqa: F403
from fleet_trio.sim.chaos.schedule import *  # noqa: F403

__all__ = [*checker.__all__, *runner.__all__, *schedule.__all__]
