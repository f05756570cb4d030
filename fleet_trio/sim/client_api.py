"""The client half of the simulated rc controller: what ``rc run``/``rc jobs``/``rc kill``
call, so a job can be submitted to the sim from the command line (``fleet-trio sim submit``)
or with any HTTP client.

Routes (a ``client`` or ``admin`` token; a worker token gets 403 ``forbidden``):

* ``POST /v1/jobs`` — submit, as ``rc run`` sends it: ``{"device_id": "host:gpu0",
  "command": [...], "submitter": "...", "idempotency_key": "...", "max_runtime_seconds": N,
  "cwd": "", "env": {...}}``. ``device_id`` may be left out (or ``selector: ""``): the
  first ready device takes the job; a non-empty ``selector`` is not simulated (400).
  201 with the job (the reference's shape: ``id``, ``selector``, ``kind``, ``command``, ``cwd``,
  ``submitter``, ``idempotency_key``, ``priority``, ``max_runtime_seconds``, ``queued_at``,
  ``state``, ``device_id``, ``worker_id``, ``submitted_at``); the same ``idempotency_key``
  again answers the same job.
* ``GET /v1/jobs/{id}`` — ``{"job": {...}}`` with ``exit_code``, ``reason``, ``started_at``,
  ``finished_at`` once known; 404 ``not_found``.
* ``GET /v1/jobs/{id}/logs`` — the job's output so far; with ``?follow=1``, streamed until
  the job is terminal (``rc run`` follows this way).
* ``POST /v1/jobs/{id}/kill`` — ``rc kill``: 200 ``{"killed": true|false}``.
* ``GET /v1/devices`` — ``{"devices": [{"id", "host", "name", "state", "reason", "detail",
  "worker_id", "labels"}]}``.
* ``GET /v1/state`` — ``{"devices": [...], "jobs": [...]}`` (the sim's shape).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, cast

import trio
from quart import Response, request
from quart_trio import QuartTrio

from fleet_trio.sim.controller.records import TERMINAL
from fleet_trio.sim.rcwire import decode_json, go_json

if TYPE_CHECKING:
    from fleet_trio.sim.controller import Device, Job, SimController


def _json(status: int, obj: Any) -> Response:
    return Response(go_json(obj), status=status, content_type="application/json")


def error_reply(status: int, code: str, message: str) -> Response:
    """The rc error envelope ``{"error": code, "message": ...}`` (the relay routes use it too)."""
    return _json(status, {"error": code, "message": message})


def _stamp(wall: float | None) -> str | None:
    if wall is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


def device_json(dev: Device) -> dict[str, Any]:
    labels = {**dev.detected_labels, **dev.declared_labels}
    return {
        "id": dev.device_id,
        "host": dev.host,
        "name": dev.name,
        "state": dev.state,
        "reason": dev.reason,
        "detail": dev.detail,
        "worker_id": dev.worker_id,
        "labels": labels,
    }


def mount_client(app: QuartTrio, ctrl: SimController) -> None:
    """Add the client routes above to the sim's app (``create_app`` calls this)."""
    extra: dict[str, dict[str, Any]] = {}  # job id -> selector, idempotency_key, wall times
    by_key: dict[str, str] = {}
    wall_offset = time.time() - trio.current_time()

    def wall(t: float | None) -> str | None:
        return _stamp(None if t is None else t + wall_offset)

    def job_json(job: Job) -> dict[str, Any]:
        more = extra.get(job.job_id, {})
        out: dict[str, Any] = {
            "id": job.job_id,
            "selector": more.get("selector", ""),
            "kind": job.kind,
            "command": list(job.command),
            "cwd": job.cwd,
            "submitter": job.submitter,
            "idempotency_key": more.get("idempotency_key", ""),
            "priority": 0,
            "max_runtime_seconds": job.max_runtime_seconds,
            "queued_at": more.get("queued_at"),
            "state": job.state,
            "device_id": job.device_id,
            "worker_id": job.worker_id,
        }
        if job.exit_code is not None:
            out["exit_code"] = job.exit_code
        if job.kill_reason:
            out["reason"] = job.kill_reason
        out["submitted_at"] = more.get("queued_at")
        if job.started_at is not None:
            out["started_at"] = wall(job.started_at)
        if job.finished_at is not None:
            out["finished_at"] = wall(job.finished_at)
        return out

    def check() -> Response | None:
        denied = ctrl._denial(request.headers.get("Authorization", ""), "client")
        return None if denied is None else error_reply(*denied)

    def pick_device(body: dict[str, Any]) -> str | Response:
        device = body.get("device_id") or ""
        selector = body.get("selector") or ""
        if not isinstance(device, str) or not isinstance(selector, str):
            return error_reply(400, "bad_request", "device_id and selector must be strings")
        if device:
            return device
        if selector:
            return error_reply(400, "bad_request", "selectors are not simulated: pass device_id")
        devices = sorted(ctrl.devices(), key=lambda d: (d.state != "ready", d.device_id))
        if not devices:
            return error_reply(409, "no_device", "no device registered yet: start a worker first")
        return devices[0].device_id

    async def submit() -> Response:
        if denied := check():
            return denied
        try:
            body = decode_json(cast(bytes, await request.get_data(as_text=False)))
        except ValueError as exc:
            return error_reply(400, "bad_request", f"malformed JSON: {exc}")
        if not isinstance(body, dict):
            return error_reply(400, "bad_request", "want a JSON object")
        key = body.get("idempotency_key") or ""
        if isinstance(key, str) and key and key in by_key:
            return _json(201, job_json(ctrl.job(by_key[key])))
        device = pick_device(body)
        if isinstance(device, Response):
            return device
        command = body.get("command") or []
        env = body.get("env") or {}
        runtime = body.get("max_runtime_seconds") or 0
        ok = (
            isinstance(command, list)
            and all(isinstance(a, str) for a in command)
            and isinstance(env, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
            and isinstance(runtime, int)
            and not isinstance(runtime, bool)
        )
        if not ok:
            return error_reply(400, "bad_request", "command: [str], env: {str: str}, runtime: int")
        from fleet_trio.sim.controller import SimError

        try:
            job_id = ctrl.submit(
                device,
                command,
                env=env,
                cwd=str(body.get("cwd") or ""),
                max_runtime_seconds=runtime,
                submitter=str(body.get("submitter") or "sim@cli"),
            )
        except SimError as exc:
            text = str(exc)
            status = 404 if text.startswith("device not found") else 400
            code = text.split(":", 1)[0] if text.startswith("runtime_above") else "bad_request"
            return error_reply(status, "not_found" if status == 404 else code, text)
        extra[job_id] = {
            "selector": body.get("selector") or "",
            "idempotency_key": key if isinstance(key, str) else "",
            "queued_at": _stamp(time.time()),
        }
        if isinstance(key, str) and key:
            by_key[key] = job_id
        return _json(201, job_json(ctrl.job(job_id)))

    def find(job_id: str) -> Job | Response:
        """The job, or the refusal (401, 403, 404)."""
        job = ctrl._jobs.get(job_id)
        return check() or job or error_reply(404, "not_found", "job not found")

    async def get_job(job_id: str) -> Response:
        job = find(job_id)
        return job if isinstance(job, Response) else _json(200, {"job": job_json(job)})

    async def get_logs(job_id: str) -> Response:
        job = find(job_id)
        if isinstance(job, Response):
            return job
        if request.args.get("follow") not in ("1", "true"):
            return Response(ctrl.logs(job_id), content_type="text/plain; charset=utf-8")

        async def follow() -> AsyncIterator[bytes]:
            sent = 0
            while True:
                changed = ctrl._changed  # taken before reading: no change slips between
                data = ctrl.logs(job_id)
                if len(data) > sent:
                    yield data[sent:]
                    sent = len(data)
                if ctrl.job(job_id).state in TERMINAL:
                    rest = ctrl.logs(job_id)[sent:]
                    if rest:
                        yield rest
                    return
                with trio.move_on_after(1.0):  # a change wakes us (logs, status, kill)
                    await changed.wait()

        resp = Response(follow(), content_type="text/plain; charset=utf-8")
        resp.timeout = None
        return resp

    async def kill(job_id: str) -> Response:
        job = find(job_id)
        if isinstance(job, Response):
            return job
        return _json(200, {"killed": ctrl.kill(job_id)})

    async def devices() -> Response:
        return check() or _json(200, {"devices": [device_json(d) for d in ctrl.devices()]})

    async def state() -> Response:
        jobs = [job_json(j) for j in sorted(ctrl._jobs.values(), key=lambda j: j.seq)]
        devices = [device_json(d) for d in ctrl.devices()]
        return check() or _json(200, {"devices": devices, "jobs": jobs})

    app.add_url_rule("/v1/jobs", "client_submit", submit, methods=["POST"])
    app.add_url_rule("/v1/jobs/<job_id>", "client_job", get_job, methods=["GET"])
    app.add_url_rule("/v1/jobs/<job_id>/logs", "client_logs", get_logs, methods=["GET"])
    app.add_url_rule("/v1/jobs/<job_id>/kill", "client_kill", kill, methods=["POST"])
    app.add_url_rule("/v1/devices", "client_devices", devices, methods=["GET"])
    app.add_url_rule("/v1/state", "client_state", state, methods=["GET"])


__all__ = ["device_json", "mount_client"]
