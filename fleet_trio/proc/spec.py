"""The values a supervised run takes and gives: ``JobSpec``, ``Result``, ``SweepReport``.

Durations here are float seconds (trio's unit). Reason strings render them with
:func:`fleet_trio.durations.go_duration_seconds`, exactly as Go would.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from fleet_trio.proc.sinks import Sink

if TYPE_CHECKING:
    from fleet_trio.proc.containment import CgroupContainment, CgroupUsage, MarkerContainment
    from fleet_trio.proc.limits import JobLimits

DEFAULT_GRACE = 10.0
"""SIGTERM → SIGKILL window when ``grace_ceiling <= 0``."""


def _to_tuple(value: Sequence[str]) -> tuple[str, ...]:
    return tuple(value)


def _to_dict(value: Mapping[str, str] | None) -> dict[str, str]:
    return dict(value or {})


@attrs.frozen
class JobSpec:
    """What to run and under which limits (worker-process.md §2.1)."""

    command: tuple[str, ...] = attrs.field(converter=_to_tuple)
    cwd: str = ""
    env: dict[str, str] = attrs.field(factory=dict, converter=_to_dict)
    grace_ceiling: float = 0.0
    max_runtime: float = 0.0
    idle_timeout: float = 0.0
    stderr_sink: Sink | None = None
    stdin_source: trio.abc.ReceiveStream | None = None
    sweep_job_id: str = ""
    sweep_marker: str = "RC_JOB_ID"
    """The environment variable the sweep matches ``sweep_job_id`` against."""
    env_unset: tuple[str, ...] = attrs.field(default=(), converter=_to_tuple)
    """Variables of the parent's environment not passed on (``env`` may still set them): the
    parent's own secrets, such as the token it authenticates with."""
    containment: CgroupContainment | MarkerContainment | None = None
    """The backend (:mod:`fleet_trio.proc.containment`); ``None`` is the marker backend. With
    a :class:`~fleet_trio.proc.containment.CgroupContainment` the run gets its own cgroup,
    named after ``cgroup_key`` (or ``sweep_job_id``), and is swept by it."""
    cgroup_key: str = ""
    """The job cgroup's name (default: ``sweep_job_id``; a node's job id, a worker's hold)."""
    limits: JobLimits | None = None
    """The job cgroup's ``memory.max`` / ``pids.max`` / ``cpu.weight``, written before the job
    enters it (cgroup backend only; the start checked their controllers; docs/containment.md)."""

    def environment(self) -> dict[str, str] | None:
        """The child's environment: the parent's less ``env_unset``, overlaid with ``env``;
        ``None`` (the parent's, as it is) when neither is set."""
        if not self.env and not self.env_unset:
            return None
        inherited = {k: v for k, v in os.environ.items() if k not in self.env_unset}
        return {**inherited, **self.env}

    @property
    def grace(self) -> float:
        """The effective grace: ``grace_ceiling`` if positive, else the 10 s default."""
        return self.grace_ceiling if self.grace_ceiling > 0 else DEFAULT_GRACE


@attrs.frozen
class SweepReport:
    """What the sweep saw and did (§3.5). A report only: it never changes a Result.

    ``scope``: ``"marker"`` (the RC_JOB_ID sweep: ``found`` are the *marked* processes that
    outlived the group, so ``clean`` means "no marked process remains") or ``"cgroup"`` (the
    job's cgroup: ``found`` are exactly the pids that outlived the leader or left its group,
    ``remaining`` those that survived SIGKILL; docs/containment.md)."""

    scanned: bool = False
    found: tuple[int, ...] = ()
    remaining: tuple[int, ...] = ()
    blind: bool = False
    scope: str = "marker"

    def clean(self) -> bool:
        """``scanned and not blind and not remaining``; an empty ``found`` alone proves nothing.
        With scope ``marker``: no *marked* process remains."""
        return self.scanned and not self.blind and not self.remaining

    def to_json(self) -> dict[str, Any]:
        return {
            "scanned": self.scanned,
            "found": list(self.found),
            "remaining": list(self.remaining),
            "blind": self.blind,
            "clean": self.clean(),
            "scope": self.scope,
        }


NO_SWEEP = SweepReport()
"""The report of a run that was not swept (an immutable value, shared)."""


@attrs.frozen
class Result:
    """How a supervised run ended (§2.2, §2.7)."""

    exit_code: int
    killed: bool = False
    reason: str = ""
    err: str | None = None
    sweep: SweepReport = NO_SWEEP
    usage: CgroupUsage | None = None
    """What the job used, from its cgroup (cgroup backend only; docs/containment.md)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "killed": self.killed,
            "reason": self.reason,
            "error": self.err,
            "sweep": self.sweep.to_json(),
        }


__all__ = ["DEFAULT_GRACE", "JobSpec", "Result", "SweepReport"]
