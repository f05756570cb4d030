"""The RC_JOB_ID sweep (worker-process.md §3). Placeholder: being written."""

from __future__ import annotations

import trio

from fleet_trio.proc.spec import SweepReport


async def sweep_job_survivors(
    job_id: str, self_pid: int, *, limiter: trio.CapacityLimiter | None = None
) -> SweepReport:
    return SweepReport()


__all__ = ["sweep_job_survivors"]
