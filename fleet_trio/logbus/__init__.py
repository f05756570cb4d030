"""The per-job output bus: one producer, many consumers (node, worker, websocket tail).

See :mod:`fleet_trio.logbus.bus` for the semantics (history bound, lag rule, spill files).
"""

from fleet_trio.logbus.bus import (
    STREAMS,
    Cursor,
    End,
    Event,
    History,
    JobInfo,
    JobLog,
    LogBus,
    Output,
    Skipped,
    SpillRead,
    Stream,
    Subscription,
)
from fleet_trio.logbus.spill import check_job_id

__all__ = [
    "STREAMS",
    "Cursor",
    "End",
    "Event",
    "History",
    "JobInfo",
    "JobLog",
    "LogBus",
    "Output",
    "Skipped",
    "SpillRead",
    "Stream",
    "Subscription",
    "check_job_id",
]
