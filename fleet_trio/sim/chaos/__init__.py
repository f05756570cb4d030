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

from fleet_trio.sim.chaos.checker import (
    CHECKS,
    Holding,
    MarkedProcess,
    NodeJobRecord,
    RcJobRecord,
    Records,
    Violation,
    check,
    check_node_jobs,
    check_rc_jobs,
    check_shutdowns,
    check_sweep,
    check_vram,
    normalized_log,
)
from fleet_trio.sim.chaos.runner import (
    SeedResult,
    run_schedule,
    run_seed,
    verdict,
)
from fleet_trio.sim.chaos.schedule import (
    VERIFY_SCRIPT,
    FleetShape,
    Step,
    format_schedule,
    make_schedule,
    node_yaml,
    rc_command,
    rc_expected_output,
    shell_tasks_yaml,
    yaml_str,
)

__all__ = [
    "CHECKS",
    "VERIFY_SCRIPT",
    "FleetShape",
    "Holding",
    "MarkedProcess",
    "NodeJobRecord",
    "RcJobRecord",
    "Records",
    "SeedResult",
    "Step",
    "Violation",
    "check",
    "check_node_jobs",
    "check_rc_jobs",
    "check_shutdowns",
    "check_sweep",
    "check_vram",
    "format_schedule",
    "make_schedule",
    "node_yaml",
    "normalized_log",
    "rc_command",
    "rc_expected_output",
    "run_schedule",
    "run_seed",
    "shell_tasks_yaml",
    "verdict",
    "yaml_str",
]
