"""Chaos scenarios: seeded fault schedules against a real fleet, and the promise checker
(docs/chaos.md). Three parts, one module each: :mod:`.schedule` (a pure function of the seed),
:mod:`.runner` (plays it against a fleet, collects the records) and :mod:`.checker` (one pure
function per promise). Every public name is re-exported here
(``from fleet_trio.sim.chaos import run_schedule``).
"""

from __future__ import annotations

from fleet_trio.sim.chaos import checker, runner, schedule
from fleet_trio.sim.chaos.checker import *  # noqa: F403
from fleet_trio.sim.chaos.runner import *  # noqa: F403
from fleet_trio.sim.chaos.schedule import *  # noqa: F403

__all__ = [*checker.__all__, *runner.__all__, *schedule.__all__]
