"""The worker routes' transitions (E1–E7 of worker-protocol.md, §3, §5–§7, §10, §14): each
takes the request's parts and the :class:`~.state.SimController`, changes its state and
returns a :class:`~.records.Reply`. No HTTP here: :mod:`.app` reads requests and sends replies.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import trio

from fleet_trio.durations import SECOND, parse_duration
from fleet_trio.errors import DurationError, WireError
from fleet_trio.sim.controller.records import (
    ACTIVE,
    DEFAULT_WAIT,
    FLAP_LIMIT,
    FLAP_WINDOW,
    MAX_WAIT,
    RECOVERABLE_REASONS,
    TERMINAL,
    Device,
    Event,
    Reply,
    Worker,
)
from fleet_trio.sim.rcwire import (
    MAX_HEARTBEAT_BODY,
    MAX_LOG_CHUNK,
    MAX_SHEET,
    Assignment,
    Assignments,
    FaultReport,
    Heartbeat,
    LabelsPush,
    RegisterResponse,
    Registration,
    StatusReport,
    go_json,
    structure_body,
)

if TYPE_CHECKING:
    from fleet_trio.sim.controller.state import SimController

_LOG_JOB_ID = re.compile(r"^[A-Za-z0-9._-]+$")


def reply_json(status: int, obj: Any) -> Reply:
    return Reply(status, go_json(obj), json=True)


def reply_error(status: int, code: str, message: str) -> Reply:
    return reply_json(status, {"error": code, "message": message})


def reply_empty(status: int) -> Reply:
    """Go's bare ``WriteHeader``: no Content-Type (and no Content-Length on a 204)."""
    return Reply(status)


# -- E1 register ------------------------------------------------------------------------------


def register(ctrl: SimController, body: bytes) -> Reply:
    reg = structure_body(ctrl.converter, body, Registration)
    if not reg.host:
        raise WireError("host required")
    _check_sheets(reg.host, reg.sheet, reg.device_sheets)
    now = trio.current_time()
    worker_id = str(uuid.uuid5(uuid.NAMESPACE_DNS, reg.host))
    worker = ctrl._workers.get(worker_id)
    rebooted = bool(worker and worker.boot_id and reg.boot_id and worker.boot_id != reg.boot_id)
    if worker is None:
        worker = ctrl._workers[worker_id] = Worker(worker_id=worker_id, host=reg.host)
    worker.boot_id = reg.boot_id
    worker.last_heartbeat = now
    # 3. reconcile in-flight jobs
    reason = "host rebooted" if rebooted else "worker re-registered"
    for job in ctrl._jobs.values():
        if job.worker_id == worker_id and job.state in ACTIVE:
            ctrl._finish(job, "lost", None, reason, free_device=False)
            dev = ctrl._devices.get(job.device_id)
            if dev is None:
                continue
            if rebooted:
                if dev.state in ("busy", "unknown"):
                    dev.state = "ready"
            elif dev.state != "unhealthy":
                dev.state, dev.reason, dev.detail = "unhealthy", "registration", ""
    mine = [d for d in ctrl._devices.values() if d.worker_id == worker_id]
    # 4. reboot recovery
    if rebooted:
        for dev in mine:
            if (
                dev.state == "unhealthy"
                and dev.reason in RECOVERABLE_REASONS
                and not ctrl._leased(dev.device_id)
            ):
                dev.state, dev.reason, dev.detail = "ready", "", ""
    # 5–6. declared devices and ceilings
    for decl in reg.devices:
        device_id = f"{reg.host}:{decl.name}"
        dev = ctrl._devices.get(device_id)
        if dev is None:
            dev = ctrl._devices[device_id] = Device(
                device_id=device_id, host=reg.host, name=decl.name, worker_id=worker_id
            )
        elif dev.state != "unhealthy":
            dev.state = "ready"
        dev.worker_id = worker_id
        dev.max_runtime_seconds = decl.max_runtime_seconds
        dev.last_heartbeat = now
    # 7. auto-recovery from the proof
    if reg.recovery is not None and reg.recovery.proves_nothing_survived:
        proof = "isolated" if reg.recovery.isolated else "survivors_checked"
        for dev in ctrl._devices.values():
            if (
                dev.worker_id != worker_id
                or dev.state != "unhealthy"
                or dev.reason not in RECOVERABLE_REASONS
                or ctrl._leased(dev.device_id)
            ):
                continue
            dev.recoveries = [t for t in dev.recoveries if now - t < FLAP_WINDOW]
            if len(dev.recoveries) >= FLAP_LIMIT:
                continue
            dev.recoveries.append(now)
            ctrl._events.append(
                Event("device_recovered", device_id=dev.device_id, detail=f"{dev.reason} {proof}")
            )
            dev.state, dev.reason, dev.detail = "ready", "", ""
    # 8. labels and sheets
    _apply_labels(ctrl, worker, reg.labels, reg.declared_labels, reg.sheet, reg.device_sheets)
    ctrl._schedule()
    return reply_json(200, ctrl.converter.unstructure(RegisterResponse(worker_id)))


def _apply_labels(
    ctrl: SimController,
    worker: Worker,
    labels: Mapping[str, Mapping[str, str]] | None,
    declared: Mapping[str, Mapping[str, str] | None] | None,
    sheet: str | None,
    device_sheets: Mapping[str, str] | None,
) -> None:
    """§9.1: per present device key, host map then device map; absent keys untouched."""
    for source, maps in (("detected", labels), ("declared", declared)):
        if maps is None:
            continue
        host_map = dict(maps.get("") or {})
        for name, dev_map in maps.items():
            dev = ctrl._devices.get(f"{worker.host}:{name}") if name else None
            if dev is None:
                continue
            merged = {**host_map, **(dev_map or {})}
            if source == "detected":
                dev.detected_labels = merged
            else:
                dev.declared_labels = merged
    if sheet is not None:
        worker.sheet = sheet
    for name, text in (device_sheets or {}).items():
        dev = ctrl._devices.get(f"{worker.host}:{name}")
        if dev is not None:
            dev.sheet = text


# -- E2 labels --------------------------------------------------------------------------------


def labels(ctrl: SimController, worker_id: str, body: bytes) -> Reply:
    push = structure_body(ctrl.converter, body, LabelsPush)
    worker = ctrl._workers.get(worker_id)
    if worker is None:
        return reply_error(404, "not_found", "worker not found")
    if not push.host:
        raise WireError("host required")
    if push.host != worker.host:
        raise WireError("host does not match the registered worker")
    _check_sheets(push.host, push.sheet, push.device_sheets)
    _apply_labels(ctrl, worker, push.labels, push.declared_labels, push.sheet, push.device_sheets)
    return reply_empty(200)


# -- E3 heartbeat -----------------------------------------------------------------------------


def heartbeat(ctrl: SimController, worker_id: str, body: bytes) -> Reply:
    if len(body) > MAX_HEARTBEAT_BODY:
        return reply_error(413, "body_too_large", "heartbeat body exceeds 64KB")
    beat = Heartbeat()
    if body.strip():
        beat = structure_body(ctrl.converter, body, Heartbeat)
    worker = ctrl._workers.get(worker_id)
    if worker is None:
        return reply_empty(200)
    now = trio.current_time()
    worker.last_heartbeat = now
    named = set(beat.running_job_ids)
    for dev in ctrl._devices.values():
        if dev.worker_id == worker_id:
            dev.last_heartbeat = now
    for job in ctrl._jobs.values():
        if job.worker_id != worker_id:
            continue
        if job.job_id in named and job.state in ACTIVE:
            job.lease_expires = now + ctrl.lease_renewal
            held = ctrl._devices.get(job.device_id)
            if held is not None and held.state == "unhealthy" and held.reason == "worker_lost":
                held.state, held.reason, held.detail = "busy", "", ""
        if job.state == "killed" and job.kill_flag and job.job_id not in named:
            job.kill_flag = False
    for dev in ctrl._devices.values():
        if dev.worker_id != worker_id or dev.state != "unknown":
            continue
        if ctrl.retain_disconnected_jobs:
            # "retained job proof": only a named job with a live lease promotes it
            proven = any(
                j.device_id == dev.device_id
                and j.job_id in named
                and j.state in ACTIVE
                and j.lease_expires is not None
                for j in ctrl._jobs.values()
            )
            if proven:
                dev.state = "busy"
                continue
            if ctrl._leased(dev.device_id):
                continue  # a retained job not named: the device stays unknown
        elif ctrl._leased(dev.device_id):
            dev.state = "busy"
            continue
        if not any(
            j.device_id == dev.device_id and j.state == "killed" and j.kill_flag
            for j in ctrl._jobs.values()
        ):
            dev.state = "ready"
    ctrl._schedule()
    return reply_empty(200)


# -- E4 assignments ---------------------------------------------------------------------------


def take_work(ctrl: SimController, worker_id: str) -> Assignments | None:
    now = trio.current_time()
    jobs = sorted(
        (j for j in ctrl._jobs.values() if j.worker_id == worker_id),
        key=lambda j: j.seq,
    )
    handout = [j for j in jobs if j.state == "assigned"]
    kills = [
        j
        for j in jobs
        if j.kill_flag
        and j.state in ("assigned", "running", "killed")
        and (j.kill_delivered_at is None or now - j.kill_delivered_at >= ctrl.kill_redelivery)
    ]
    if not handout and not kills:
        return None
    for j in kills:
        j.kill_delivered_at = now
    for j in handout:
        j.state = "running"
        j.started_at = now
    ctrl._notify()
    return Assignments(
        assignments=tuple(
            Assignment(
                job_id=j.job_id,
                device_id=j.device_id,
                command=j.command,
                cwd=j.cwd,
                env=j.env,
                max_runtime_seconds=j.max_runtime_seconds,
                idle_timeout_seconds=j.idle_timeout_seconds,
                submitter=j.submitter,
                kind=j.kind,
                stdio=j.stdio,
            )
            for j in handout
        ),
        kills=tuple(j.job_id for j in kills),
    )


async def assignments(ctrl: SimController, worker_id: str, wait_text: str) -> Reply:
    """E4: hand out work and kills, or park the long poll up to ``wait`` (``wait_text``)."""
    wait = DEFAULT_WAIT
    with contextlib.suppress(DurationError):
        ns = parse_duration(wait_text)
        if 0 < ns <= MAX_WAIT * SECOND:
            wait = ns / SECOND
    deadline = trio.current_time() + wait
    with trio.CancelScope(deadline=deadline) as scope:
        ctrl._polls.add(scope)
        try:
            while True:
                poke = ctrl._poke_event(worker_id)
                work = take_work(ctrl, worker_id)
                if work is not None:
                    return reply_json(200, ctrl.converter.unstructure(work))
                await poke.wait()
        finally:
            ctrl._polls.discard(scope)
    return reply_empty(204)


# -- E5 status --------------------------------------------------------------------------------


def status(ctrl: SimController, job_id: str, body: bytes) -> Reply:
    report = structure_body(ctrl.converter, body, StatusReport)
    if report.state not in ("running", *TERMINAL):
        raise WireError("state must be running or terminal")
    job = ctrl._jobs.get(job_id)
    if job is None:
        return reply_error(404, "not_found", "job not found")
    if not report.worker_id or report.worker_id != job.worker_id:
        return reply_error(403, "not_job_owner", "job is not assigned to this worker")
    ctrl._status_reports.setdefault(job_id, []).append(report)
    if report.state == "running":
        if job.state == "assigned":
            job.state = "running"
            job.started_at = trio.current_time()
    elif job.state not in TERMINAL:
        if job.kind != "hold" and report.reason.startswith(
            ("max_runtime exceeded", "idle: no output for")
        ):
            ctrl._events.append(Event("watchdog_trip", job.device_id, job.job_id, report.reason))
        ctrl._finish(job, report.state, report.exit_code, report.reason)
        ctrl._schedule()
    return reply_empty(200)


# -- E6 logs ----------------------------------------------------------------------------------


def logs(ctrl: SimController, job_id: str, body: bytes) -> Reply:
    if len(body) > MAX_LOG_CHUNK:
        return reply_error(413, "chunk_too_large", "log chunk exceeds 1MB; split and retry")
    if not _LOG_JOB_ID.match(job_id):
        return reply_error(500, "log_error", f"invalid job id {job_id!r}")
    ctrl._log_chunks.setdefault(job_id, []).append(body)
    return reply_empty(200)


# -- E7 fault ---------------------------------------------------------------------------------


def fault(ctrl: SimController, device_id: str, body: bytes) -> Reply:
    try:
        report = structure_body(ctrl.converter, body, FaultReport)
    except WireError:
        raise WireError("reason required") from None
    if not report.reason:
        raise WireError("reason required")
    dev = ctrl._devices.get(device_id)
    if dev is None:
        return reply_error(404, "not_found", "device not found")
    ctrl._fault_reports.setdefault(device_id, []).append(report.reason)
    dev.state, dev.reason, dev.detail = "unhealthy", "fault", report.reason
    kind = "verify_failed" if report.reason.startswith("verify failed: ") else "device_unhealthy"
    # the job that holds the device's lease, if any (the worker faults before its terminal
    # report, so a verify failure still finds its job holding the device)
    holder = next(
        (
            j.job_id
            for j in sorted(ctrl._jobs.values(), key=lambda j: j.seq)
            if j.device_id == device_id and j.state in ACTIVE and j.lease_expires is not None
        ),
        "",
    )
    ctrl._events.append(Event(kind, device_id=device_id, job_id=holder, detail=report.reason))
    return reply_empty(200)


def _check_sheets(host: str, sheet: str | None, device_sheets: Mapping[str, str] | None) -> None:
    if sheet is not None and len(sheet.encode()) > MAX_SHEET:
        raise WireError(f'usage sheet "{host}" exceeds 64KB', status=413)
    for name, text in (device_sheets or {}).items():
        if len(text.encode()) > MAX_SHEET:
            raise WireError(f'usage sheet "{name}" exceeds 64KB', status=413)
