"""The per-job output bus: one producer, many consumers (node, worker, websocket tail).

See :mod:`fleet_trio.logbus.bus` for the semantics (history bound, lag rule, spill files).
The package exports what :mod:`~fleet_trio.logbus.bus` exports, and ``check_job_id``.
"""

from fleet_trio.logbus import bus as _bus
from fleet_trio.logbus.bus import *  # noqa: F403 (its __all__, re-exported below)
from fleet_trio.logbus.spill import check_job_id

__all__ = ["check_job_id"]
__all__ += _bus.__all__
