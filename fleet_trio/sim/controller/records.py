"""The simulated controller's vocabulary: its constants, the records it keeps (workers,
devices, jobs, requests, events) and :class:`Reply`, an answer before it becomes HTTP."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from fleet_trio.errors import FleetTrioError
from fleet_trio.sim.rcwire import decode_json

INSTANCE_HEADER = "Rc-Controller-Instance"

ENDPOINTS = ("register", "labels", "heartbeat", "assignments", "status", "logs", "fault")
"""Names used by the failure-injection API (E1–E7 in this order)."""

DEVICE_STATES = ("ready", "busy", "unknown", "unhealthy")
JOB_STATES = ("queued", "assigned", "running", "succeeded", "failed", "killed", "lost")
TERMINAL = frozenset({"succeeded", "failed", "killed", "lost"})
ACTIVE = frozenset({"assigned", "running"})
RECOVERABLE_REASONS = frozenset({"worker_lost", "lease_expired", "registration"})

DEFAULT_WAIT = 30.0
MAX_WAIT = 60.0
FLAP_LIMIT = 3
FLAP_WINDOW = 3600.0


class SimError(FleetTrioError):
    """A test asked the sim for something the reference controller would refuse."""


@attrs.define
class Worker:
    worker_id: str
    host: str
    boot_id: str = ""
    last_heartbeat: float = 0.0
    sheet: str = ""


@attrs.define
class Device:
    device_id: str
    host: str
    name: str
    worker_id: str
    state: str = "ready"
    reason: str = ""
    detail: str = ""
    max_runtime_seconds: int = 0
    last_heartbeat: float = 0.0
    detected_labels: dict[str, str] = attrs.field(factory=dict)
    declared_labels: dict[str, str] = attrs.field(factory=dict)
    sheet: str = ""
    recoveries: list[float] = attrs.field(factory=list)


@attrs.define
class Job:
    """A job as the controller keeps it: the :class:`~fleet_trio.sim.rcwire.Assignment` fields
    plus its state and lease. Declared separately on purpose: the controller's record of the
    same wire facts (a mutable record, where the wire type is a frozen value)."""

    job_id: str
    device_id: str
    command: tuple[str, ...]
    kind: str = "job"
    cwd: str = ""
    env: dict[str, str] = attrs.field(factory=dict)
    max_runtime_seconds: int = 0
    idle_timeout_seconds: int = 0
    submitter: str = ""
    stdio: str = ""
    state: str = "queued"
    worker_id: str = ""
    exit_code: int | None = None
    kill_reason: str = ""
    seq: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    lease_expires: float | None = None
    """``None``: no live lease."""
    kill_flag: bool = False
    kill_delivered_at: float | None = None


@attrs.frozen
class RequestRecord:
    """One request the worker sent, in arrival order, whatever happened to it."""

    seq: int
    at: float
    """``trio.current_time()`` when the request (body included) had arrived."""
    endpoint: str
    method: str
    path: str
    query: str
    headers: Mapping[str, str]
    body: bytes
    instance: str
    outcome: str = "handled"
    """``handled``, ``injected`` (answered by ``fail_next``) or ``dropped`` (``drop_next``)."""

    def json(self) -> Any:
        return decode_json(self.body) if self.body.strip() else None


@attrs.frozen
class Event:
    """A controller event (the webhook vocabulary): ``device_recovered``, ``watchdog_trip``, …"""

    kind: str
    device_id: str = ""
    job_id: str = ""
    detail: str = ""


@attrs.frozen
class Reply:
    """An answer as the controller decides it; the app (:mod:`.app`) sends it as HTTP."""

    status: int
    body: bytes = b""
    json: bool = False
    """``application/json``; else Go's bare ``WriteHeader`` (no Content-Type)."""


__all__ = [
    "ENDPOINTS",
    "INSTANCE_HEADER",
    "Device",
    "Event",
    "Job",
    "RequestRecord",
    "SimError",
    "Worker",
]
