"""A simulated rc controller: the worker-facing half of ``rc serve``, in process, on Trio.

It speaks E1–E7 of worker-protocol.md exactly as rc-wire-capture.md shows the reference
controller doing it (paths, bodies, status codes, ``Rc-Controller-Instance`` on every answer,
Go's JSON encoding), applies the controller state changes of §3, §5–§7, §10 and §14, and gives
tests a small Python API: submit and kill jobs, restart the controller, inject failures, and
read back every request the worker sent. See docs/sim-controller.md.

Serving: hypercorn (quart-trio) listens on an internal loopback port; a byte pump in front of
it owns the public port. The pump is what lets the sim close a connection without answering
(``drop_next``) and cut every open connection on ``restart()``, as a dying process would.
"""

from __future__ import annotations

import functools
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import attrs
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from fleet_trio.durations import SECOND, parse_duration
from fleet_trio.errors import DurationError, FleetTrioError, WireError
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
    decode_json,
    go_json,
    make_converter,
    structure_body,
)

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
_LOG_JOB_ID = re.compile(r"^[A-Za-z0-9._-]+$")


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


@attrs.define
class _Fault:
    endpoint: str
    status: int | None  # None: drop the connection
    count: int
    body: bytes | None = None  # None: the standard injected error body


class SimController:
    """The controller's whole state, plus the test API. Serve it with :func:`serve_controller`.

    Timers default to the reference values (§13); tests shrink them.
    """

    def __init__(
        self,
        *,
        token: str = "wtok",
        tokens: Mapping[str, str] | None = None,
        reaper_interval: float = 10.0,
        heartbeat_timeout: float = 30.0,
        worker_lost_after: float = 300.0,
        startup_grace: float = 30.0,
        kill_redelivery: float = 30.0,
        lease_no_limit: float = 300.0,
        lease_margin: float = 600.0,
        lease_renewal: float = 900.0,
        retain_disconnected_jobs: bool = False,
    ) -> None:
        self.tokens: dict[str, str] = {token: "worker"} if token else {}
        self.tokens.update(tokens or {})
        self.reaper_interval = reaper_interval
        self.heartbeat_timeout = heartbeat_timeout
        self.worker_lost_after = worker_lost_after
        self.startup_grace = startup_grace
        self.kill_redelivery = kill_redelivery
        self.lease_no_limit = lease_no_limit
        self.lease_margin = lease_margin
        self.lease_renewal = lease_renewal
        self.retain_disconnected_jobs = retain_disconnected_jobs
        """``--retain-disconnected-jobs`` (§5.5): a lost worker's jobs stay assigned/running,
        job leases never expire, and ``rc kill`` on a disconnected device finalizes at once."""
        self.converter = make_converter()
        self.instance = str(uuid.uuid4())
        self.instances: list[str] = [self.instance]
        self.base_url = ""
        self._workers: dict[str, Worker] = {}
        self._devices: dict[str, Device] = {}
        self._jobs: dict[str, Job] = {}
        self._job_seq = 0
        self._log_chunks: dict[str, list[bytes]] = {}
        self._status_reports: dict[str, list[StatusReport]] = {}
        self._fault_reports: dict[str, list[str]] = {}
        self._events: list[Event] = []
        self._requests: list[RequestRecord] = []
        self._faults: list[_Fault] = []
        self._latency: dict[str, float] = {}
        self._pokes: dict[str, trio.Event] = {}
        self._changed = trio.Event()
        self._conns: dict[int, trio.CancelScope] = {}
        self._polls: set[trio.CancelScope] = set()
        self._started_at = trio.current_time()
        self._down_until = 0.0

    # ----------------------------------------------------------------- test API: work

    def submit(
        self,
        device_id: str,
        command: Sequence[str] = (),
        *,
        kind: str = "job",
        env: Mapping[str, str] | None = None,
        cwd: str = "",
        max_runtime_seconds: int = 0,
        idle_timeout_seconds: int = 0,
        stdio: str = "",
        submitter: str = "sim@test",
    ) -> str:
        """Queue a job (or a hold) for ``device_id`` (``host:name``); returns its job ID.

        Like ``rc run -d``: the device must exist; the job is assigned at once when the device
        is ready and unleased (the reference's 1 s scheduler pass is immediate here).
        """
        dev = self._devices.get(device_id)
        if dev is None:
            raise SimError(f"device not found: {device_id}")
        if kind not in ("job", "hold"):
            raise SimError(f"kind must be job or hold, not {kind!r}")
        if stdio not in ("", "tty", "pipe"):
            raise SimError(f"stdio must be '', tty or pipe, not {stdio!r}")
        if kind == "hold":
            if command or env or cwd or idle_timeout_seconds or stdio:
                raise SimError("a hold takes no command, cwd, env, idle timeout or stdio")
            if max_runtime_seconds <= 0:
                raise SimError("a hold needs a TTL (max_runtime_seconds > 0)")
            argv: tuple[str, ...] = ("hold",)
        else:
            if not command:
                raise SimError("command required")
            argv = tuple(command)
        runtime = max_runtime_seconds
        if dev.max_runtime_seconds:
            if runtime > dev.max_runtime_seconds:
                raise SimError(
                    f"runtime_above_ceiling: {runtime}s > {dev.max_runtime_seconds}s on {device_id}"
                )
            runtime = runtime or dev.max_runtime_seconds
        self._job_seq += 1
        job = Job(
            job_id=str(uuid.uuid4()),
            device_id=device_id,
            command=argv,
            kind=kind,
            cwd=cwd,
            env=dict(env or {}),
            max_runtime_seconds=runtime,
            idle_timeout_seconds=idle_timeout_seconds,
            submitter=submitter,
            stdio=stdio,
            seq=self._job_seq,
        )
        self._jobs[job.job_id] = job
        self._schedule()
        self._notify()
        return job.job_id

    def kill(self, job_id: str) -> bool:
        """``rc kill``: a queued job is killed on the spot; an assigned/running one gets a kill
        flag and its worker's long poll is poked (§7.6). ``False`` if already terminal."""
        job = self._job(job_id)
        if job.state in TERMINAL:
            return False
        if job.state == "queued":
            self._finish(job, "killed", None, "cancelled")
        elif self.retain_disconnected_jobs and self._disconnected(job.device_id):
            # finalized on the spot, the device kept out of the pool, the kill flag kept for a
            # returning worker (§5.5); a heartbeat that stops naming the job clears the flag
            self._finish(job, "killed", None, "cancelled", free_device=False)
            job.kill_flag = True
            job.kill_delivered_at = None
            self._poke(job.worker_id)
        else:
            job.kill_flag = True
            job.kill_delivered_at = None
            self._poke(job.worker_id)
        self._notify()
        return True

    def silence(self, worker_id: str, seconds: float) -> None:
        """Pretend ``worker_id`` has not been heard from for ``seconds`` and run one reaper
        sweep: a disconnection, without waiting for one. Its next heartbeat undoes it."""
        worker = self._workers[worker_id]
        worker.last_heartbeat = min(worker.last_heartbeat, trio.current_time() - seconds)
        self.reap()

    def _disconnected(self, device_id: str) -> bool:
        dev = self._devices.get(device_id)
        return dev is not None and (
            dev.state == "unknown" or (dev.state == "unhealthy" and dev.reason == "worker_lost")
        )

    def clear(self, device_id: str) -> None:
        """``rc clear`` (admin): only an ``unhealthy`` device with no live lease (else 409)."""
        dev = self._device(device_id)
        if dev.state != "unhealthy" or self._leased(device_id):
            raise SimError("device_not_cleared")
        dev.state, dev.reason, dev.detail = "ready", "", ""
        self._schedule()
        self._notify()

    # ----------------------------------------------------------------- test API: faults

    def restart(self, *, wipe: bool = False, down_for: float = 0.0) -> str:
        """Simulate a controller process restart; returns the new instance ID.

        Durable state (workers, devices, jobs, leases, kill flags, labels, logs) is kept, as the
        reference keeps it in SQLite; ``wipe=True`` models a lost database. Every open
        connection is cut without an answer (parked long polls included), the startup grace
        starts again, and for ``down_for`` seconds new connections are closed at once.
        """
        self.instance = str(uuid.uuid4())
        self.instances.append(self.instance)
        now = trio.current_time()
        self._started_at = now
        self._down_until = now + down_for
        if wipe:
            self._workers.clear()
            self._devices.clear()
            self._jobs.clear()
        for scope in list(self._conns.values()):
            scope.cancel()
        for scope in list(self._polls):
            scope.cancel()
        self._pokes.clear()
        self._notify()
        return self.instance

    def fail_next(
        self, endpoint: str, status: int = 503, count: int = 1, *, body: bytes | None = None
    ) -> None:
        """Answer the next ``count`` requests to ``endpoint`` with ``status`` (state untouched):
        the standard ``injected`` error body, or ``body`` verbatim (``application/json``), e.g.
        a malformed 200 answer."""
        self._faults.append(_Fault(self._check_endpoint(endpoint), status, count, body))

    def drop_next(self, endpoint: str, count: int = 1) -> None:
        """Close the connection of the next ``count`` requests to ``endpoint`` unanswered."""
        self._faults.append(_Fault(self._check_endpoint(endpoint), None, count))

    def latency(self, endpoint: str, seconds: float) -> None:
        """Delay every request to ``endpoint`` by ``seconds`` before handling it (0 clears)."""
        self._latency[self._check_endpoint(endpoint)] = seconds

    # ----------------------------------------------------------------- test API: read back

    def requests(self, endpoint: str | None = None) -> list[RequestRecord]:
        return [r for r in self._requests if endpoint is None or r.endpoint == endpoint]

    def _handled_json(self, endpoint: str) -> list[Any]:
        return [r.json() for r in self.requests(endpoint) if r.outcome == "handled"]

    def registrations(self) -> list[Any]:
        """Every handled E1 body, as the JSON the worker sent (key presence preserved)."""
        return self._handled_json("register")

    def label_pushes(self) -> list[Any]:
        return self._handled_json("labels")

    def heartbeats(self, worker_id: str | None = None) -> list[Any]:
        """Handled E3 bodies (``None`` for an empty body)."""
        return [
            r.json()
            for r in self.requests("heartbeat")
            if r.outcome == "handled" and (worker_id is None or f"/{worker_id}/" in r.path)
        ]

    def polls(self) -> list[RequestRecord]:
        return self.requests("assignments")

    def statuses(self, job_id: str) -> list[str]:
        """The ``state`` of every accepted E5 report for ``job_id``, in order."""
        return [s.state for s in self._status_reports.get(job_id, [])]

    def status_reports(self, job_id: str) -> list[StatusReport]:
        return list(self._status_reports.get(job_id, []))

    def logs(self, job_id: str) -> bytes:
        return b"".join(self._log_chunks.get(job_id, []))

    def log_chunks(self, job_id: str) -> list[bytes]:
        return list(self._log_chunks.get(job_id, []))

    def faults(self, device_id: str) -> list[str]:
        """Reasons of the accepted E7 reports for ``device_id``, in order."""
        return list(self._fault_reports.get(device_id, []))

    def events(self) -> list[Event]:
        return list(self._events)

    def worker(self, worker_id: str) -> Worker:
        return attrs.evolve(self._workers[worker_id])

    def workers(self) -> list[Worker]:
        return [attrs.evolve(w) for w in self._workers.values()]

    def device(self, device_id: str) -> Device:
        return attrs.evolve(self._device(device_id))

    def devices(self) -> list[Device]:
        return [attrs.evolve(d) for d in self._devices.values()]

    def job(self, job_id: str) -> Job:
        return attrs.evolve(self._job(job_id))

    async def wait_for(
        self,
        predicate: Callable[[], Any],
        timeout: float = 5.0,  # noqa: ASYNC109 -- the documented test API
    ) -> Any:
        """Wait until ``predicate()`` is truthy (re-checked on every request and state change);
        returns its value. Raises ``trio.TooSlowError`` after ``timeout`` seconds."""
        with trio.fail_after(timeout):
            while True:
                changed = self._changed
                value = predicate()
                if value:
                    return value
                await changed.wait()

    # ----------------------------------------------------------------- the reaper

    def reap(self) -> None:
        """One reaper sweep (§6.3); :func:`serve_controller` runs it every ``reaper_interval``."""
        now = trio.current_time()
        in_grace = now - self._started_at < self.startup_grace
        for worker in self._workers.values():
            silence = now - worker.last_heartbeat
            devs = [d for d in self._devices.values() if d.worker_id == worker.worker_id]
            if silence >= self.heartbeat_timeout:
                for d in devs:
                    if d.state in ("ready", "busy"):
                        d.state = "unknown"
            if silence >= self.worker_lost_after and not in_grace:
                for d in devs:
                    if d.state != "unhealthy":
                        d.state, d.reason, d.detail = "unhealthy", "worker_lost", ""
                for job in self._jobs.values():
                    if self.retain_disconnected_jobs:
                        break  # retained: the jobs stay assigned/running
                    if job.worker_id == worker.worker_id and job.state in ACTIVE:
                        self._finish(job, "lost", None, "worker lost", free_device=False)
        if not in_grace:
            for job in self._jobs.values():
                if job.lease_expires is not None and now > job.lease_expires:
                    if self.retain_disconnected_jobs and job.kind == "job":
                        continue  # retention exempts job-kind leases; holds still expire
                    job.lease_expires = None
                    dev = self._devices.get(job.device_id)
                    if dev is not None and dev.state != "unhealthy":
                        dev.state, dev.reason, dev.detail = "unhealthy", "lease_expired", ""
                    if job.state in ACTIVE:
                        self._finish(job, "lost", None, "lease expired", free_device=False)
        self._schedule()
        self._notify()

    # ----------------------------------------------------------------- internals

    def _check_endpoint(self, endpoint: str) -> str:
        if endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {endpoint!r}; one of {', '.join(ENDPOINTS)}")
        return endpoint

    def _job(self, job_id: str) -> Job:
        try:
            return self._jobs[job_id]
        except KeyError:
            raise SimError(f"job not found: {job_id}") from None

    def _device(self, device_id: str) -> Device:
        try:
            return self._devices[device_id]
        except KeyError:
            raise SimError(f"device not found: {device_id}") from None

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _poke(self, worker_id: str) -> None:
        ev = self._pokes.pop(worker_id, None)
        if ev is not None:
            ev.set()

    def _poke_event(self, worker_id: str) -> trio.Event:
        ev = self._pokes.get(worker_id)
        if ev is None:
            ev = self._pokes[worker_id] = trio.Event()
        return ev

    def _leased(self, device_id: str) -> bool:
        return any(
            j.device_id == device_id and j.lease_expires is not None for j in self._jobs.values()
        )

    def _schedule(self) -> None:
        """Hand queued jobs to ready, unleased devices, oldest first."""
        now = trio.current_time()
        for job in sorted(self._jobs.values(), key=lambda j: j.seq):
            if job.state != "queued":
                continue
            dev = self._devices.get(job.device_id)
            if dev is None or dev.state != "ready" or self._leased(dev.device_id):
                continue
            job.state = "assigned"
            job.worker_id = dev.worker_id
            limit = job.max_runtime_seconds
            job.lease_expires = now + (limit + self.lease_margin if limit else self.lease_no_limit)
            dev.state = "busy"
            self._poke(dev.worker_id)

    def _finish(
        self,
        job: Job,
        state: str,
        exit_code: int | None,
        reason: str,
        *,
        free_device: bool = True,
    ) -> None:
        job.state = state
        job.exit_code = exit_code
        job.kill_reason = reason
        job.finished_at = trio.current_time()
        job.lease_expires = None
        dev = self._devices.get(job.device_id)
        if free_device and dev is not None and dev.state == "busy":
            dev.state = "ready"

    def _record(self, endpoint: str, body: bytes) -> RequestRecord:
        rec = RequestRecord(
            seq=len(self._requests),
            at=trio.current_time(),
            endpoint=endpoint,
            method=request.method,
            path=request.path,
            query=request.query_string.decode("latin-1"),
            headers={k: v for k, v in request.headers.items()},
            body=body,
            instance=self.instance,
        )
        self._requests.append(rec)
        self._notify()
        return rec

    def _mark(self, rec: RequestRecord, outcome: str) -> None:
        self._requests[rec.seq] = attrs.evolve(rec, outcome=outcome)
        self._notify()

    def _take_fault(self, endpoint: str) -> _Fault | None:
        for f in self._faults:
            if f.endpoint == endpoint:
                f.count -= 1
                if f.count <= 0:
                    self._faults.remove(f)
                return f
        return None

    def _auth(self) -> Response | None:
        header = request.headers.get("Authorization", "")
        token = header[7:] if header.startswith("Bearer ") else ""
        role = self.tokens.get(token) if token else None
        if role is None:
            return _error(401, "unauthorized", "unknown or missing token")
        if role not in ("worker", "admin"):
            return _error(403, "forbidden", f"token role {role} may not call a worker route")
        return None

    # --------------------------------------------------------------- E1 register

    def _register(self, body: bytes) -> Response:
        reg = structure_body(self.converter, body, Registration)
        if not reg.host:
            raise WireError("host required")
        _check_sheets(reg.host, reg.sheet, reg.device_sheets)
        now = trio.current_time()
        worker_id = str(uuid.uuid5(uuid.NAMESPACE_DNS, reg.host))
        worker = self._workers.get(worker_id)
        rebooted = bool(worker and worker.boot_id and reg.boot_id and worker.boot_id != reg.boot_id)
        if worker is None:
            worker = self._workers[worker_id] = Worker(worker_id=worker_id, host=reg.host)
        worker.boot_id = reg.boot_id
        worker.last_heartbeat = now
        # 3. reconcile in-flight jobs
        reason = "host rebooted" if rebooted else "worker re-registered"
        for job in self._jobs.values():
            if job.worker_id == worker_id and job.state in ACTIVE:
                self._finish(job, "lost", None, reason, free_device=False)
                dev = self._devices.get(job.device_id)
                if dev is None:
                    continue
                if rebooted:
                    if dev.state in ("busy", "unknown"):
                        dev.state = "ready"
                elif dev.state != "unhealthy":
                    dev.state, dev.reason, dev.detail = "unhealthy", "registration", ""
        mine = [d for d in self._devices.values() if d.worker_id == worker_id]
        # 4. reboot recovery
        if rebooted:
            for dev in mine:
                if (
                    dev.state == "unhealthy"
                    and dev.reason in RECOVERABLE_REASONS
                    and not self._leased(dev.device_id)
                ):
                    dev.state, dev.reason, dev.detail = "ready", "", ""
        # 5–6. declared devices and ceilings
        for decl in reg.devices:
            device_id = f"{reg.host}:{decl.name}"
            dev = self._devices.get(device_id)
            if dev is None:
                dev = self._devices[device_id] = Device(
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
            for dev in self._devices.values():
                if (
                    dev.worker_id != worker_id
                    or dev.state != "unhealthy"
                    or dev.reason not in RECOVERABLE_REASONS
                    or self._leased(dev.device_id)
                ):
                    continue
                dev.recoveries = [t for t in dev.recoveries if now - t < FLAP_WINDOW]
                if len(dev.recoveries) >= FLAP_LIMIT:
                    continue
                dev.recoveries.append(now)
                self._events.append(
                    Event(
                        "device_recovered", device_id=dev.device_id, detail=f"{dev.reason} {proof}"
                    )
                )
                dev.state, dev.reason, dev.detail = "ready", "", ""
        # 8. labels and sheets
        self._apply_labels(worker, reg.labels, reg.declared_labels, reg.sheet, reg.device_sheets)
        self._schedule()
        return _json(200, self.converter.unstructure(RegisterResponse(worker_id)))

    def _apply_labels(
        self,
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
                dev = self._devices.get(f"{worker.host}:{name}") if name else None
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
            dev = self._devices.get(f"{worker.host}:{name}")
            if dev is not None:
                dev.sheet = text

    # --------------------------------------------------------------- E2 labels

    def _labels(self, worker_id: str, body: bytes) -> Response:
        push = structure_body(self.converter, body, LabelsPush)
        worker = self._workers.get(worker_id)
        if worker is None:
            return _error(404, "not_found", "worker not found")
        if not push.host:
            raise WireError("host required")
        if push.host != worker.host:
            raise WireError("host does not match the registered worker")
        _check_sheets(push.host, push.sheet, push.device_sheets)
        self._apply_labels(
            worker, push.labels, push.declared_labels, push.sheet, push.device_sheets
        )
        return _empty(200)

    # --------------------------------------------------------------- E3 heartbeat

    def _heartbeat(self, worker_id: str, body: bytes) -> Response:
        if len(body) > MAX_HEARTBEAT_BODY:
            return _error(413, "body_too_large", "heartbeat body exceeds 64KB")
        beat = Heartbeat()
        if body.strip():
            beat = structure_body(self.converter, body, Heartbeat)
        worker = self._workers.get(worker_id)
        if worker is None:
            return _empty(200)
        now = trio.current_time()
        worker.last_heartbeat = now
        named = set(beat.running_job_ids)
        for dev in self._devices.values():
            if dev.worker_id == worker_id:
                dev.last_heartbeat = now
        for job in self._jobs.values():
            if job.worker_id != worker_id:
                continue
            if job.job_id in named and job.state in ACTIVE:
                job.lease_expires = now + self.lease_renewal
                held = self._devices.get(job.device_id)
                if held is not None and held.state == "unhealthy" and held.reason == "worker_lost":
                    held.state, held.reason, held.detail = "busy", "", ""
            if job.state == "killed" and job.kill_flag and job.job_id not in named:
                job.kill_flag = False
        for dev in self._devices.values():
            if dev.worker_id != worker_id or dev.state != "unknown":
                continue
            if self.retain_disconnected_jobs:
                # "retained job proof": only a named job with a live lease promotes it
                proven = any(
                    j.device_id == dev.device_id
                    and j.job_id in named
                    and j.state in ACTIVE
                    and j.lease_expires is not None
                    for j in self._jobs.values()
                )
                if proven:
                    dev.state = "busy"
                    continue
                if self._leased(dev.device_id):
                    continue  # a retained job not named: the device stays unknown
            elif self._leased(dev.device_id):
                dev.state = "busy"
                continue
            if not any(
                j.device_id == dev.device_id and j.state == "killed" and j.kill_flag
                for j in self._jobs.values()
            ):
                dev.state = "ready"
        self._schedule()
        return _empty(200)

    # --------------------------------------------------------------- E4 assignments

    def _take_work(self, worker_id: str) -> Assignments | None:
        now = trio.current_time()
        jobs = sorted(
            (j for j in self._jobs.values() if j.worker_id == worker_id),
            key=lambda j: j.seq,
        )
        handout = [j for j in jobs if j.state == "assigned"]
        kills = [
            j
            for j in jobs
            if j.kill_flag
            and j.state in ("assigned", "running", "killed")
            and (j.kill_delivered_at is None or now - j.kill_delivered_at >= self.kill_redelivery)
        ]
        if not handout and not kills:
            return None
        for j in kills:
            j.kill_delivered_at = now
        for j in handout:
            j.state = "running"
            j.started_at = now
        self._notify()
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

    async def _assignments(self, worker_id: str) -> Response:
        wait = DEFAULT_WAIT
        try:
            ns = parse_duration(request.args.get("wait", ""))
            if 0 < ns <= MAX_WAIT * SECOND:
                wait = ns / SECOND
        except DurationError:
            pass
        deadline = trio.current_time() + wait
        with trio.CancelScope(deadline=deadline) as scope:
            self._polls.add(scope)
            try:
                while True:
                    poke = self._poke_event(worker_id)
                    work = self._take_work(worker_id)
                    if work is not None:
                        return _json(200, self.converter.unstructure(work))
                    await poke.wait()
            finally:
                self._polls.discard(scope)
        return _empty(204)

    # --------------------------------------------------------------- E5 status

    def _status(self, job_id: str, body: bytes) -> Response:
        report = structure_body(self.converter, body, StatusReport)
        if report.state not in ("running", *TERMINAL):
            raise WireError("state must be running or terminal")
        job = self._jobs.get(job_id)
        if job is None:
            return _error(404, "not_found", "job not found")
        if not report.worker_id or report.worker_id != job.worker_id:
            return _error(403, "not_job_owner", "job is not assigned to this worker")
        self._status_reports.setdefault(job_id, []).append(report)
        if report.state == "running":
            if job.state == "assigned":
                job.state = "running"
                job.started_at = trio.current_time()
        elif job.state not in TERMINAL:
            if job.kind != "hold" and report.reason.startswith(
                ("max_runtime exceeded", "idle: no output for")
            ):
                self._events.append(
                    Event("watchdog_trip", job.device_id, job.job_id, report.reason)
                )
            self._finish(job, report.state, report.exit_code, report.reason)
            self._schedule()
        return _empty(200)

    # --------------------------------------------------------------- E6 logs

    def _logs(self, job_id: str, body: bytes) -> Response:
        if len(body) > MAX_LOG_CHUNK:
            return _error(413, "chunk_too_large", "log chunk exceeds 1MB; split and retry")
        if not _LOG_JOB_ID.match(job_id):
            return _error(500, "log_error", f"invalid job id {job_id!r}")
        self._log_chunks.setdefault(job_id, []).append(body)
        return _empty(200)

    # --------------------------------------------------------------- E7 fault

    def _fault(self, device_id: str, body: bytes) -> Response:
        try:
            report = structure_body(self.converter, body, FaultReport)
        except WireError:
            raise WireError("reason required") from None
        if not report.reason:
            raise WireError("reason required")
        dev = self._devices.get(device_id)
        if dev is None:
            return _error(404, "not_found", "device not found")
        self._fault_reports.setdefault(device_id, []).append(report.reason)
        dev.state, dev.reason, dev.detail = "unhealthy", "fault", report.reason
        kind = (
            "verify_failed" if report.reason.startswith("verify failed: ") else "device_unhealthy"
        )
        # the job that holds the device's lease, if any (the worker faults before its terminal
        # report, so a verify failure still finds its job holding the device)
        holder = next(
            (
                j.job_id
                for j in sorted(self._jobs.values(), key=lambda j: j.seq)
                if j.device_id == device_id and j.state in ACTIVE and j.lease_expires is not None
            ),
            "",
        )
        self._events.append(Event(kind, device_id=device_id, job_id=holder, detail=report.reason))
        return _empty(200)


def _check_sheets(host: str, sheet: str | None, device_sheets: Mapping[str, str] | None) -> None:
    if sheet is not None and len(sheet.encode()) > MAX_SHEET:
        raise WireError(f'usage sheet "{host}" exceeds 64KB', status=413)
    for name, text in (device_sheets or {}).items():
        if len(text.encode()) > MAX_SHEET:
            raise WireError(f'usage sheet "{name}" exceeds 64KB', status=413)


def _json(status: int, obj: Any) -> Response:
    return Response(go_json(obj), status=status, content_type="application/json")


def _error(status: int, code: str, message: str) -> Response:
    return _json(status, {"error": code, "message": message})


def _empty(status: int) -> Response:
    """Go's bare ``WriteHeader``: no Content-Type (and no Content-Length on a 204)."""
    resp = Response(b"", status=status)
    del resp.headers["Content-Type"]
    if status == 204:
        resp.headers.pop("Content-Length", None)
    return resp


def create_app(ctrl: SimController) -> QuartTrio:
    """The quart-trio app serving ``ctrl`` (E1–E7)."""
    app = QuartTrio(__name__)
    app.config["MAX_CONTENT_LENGTH"] = 16 * MAX_LOG_CHUNK
    app.config["RESPONSE_TIMEOUT"] = MAX_WAIT + 30
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False

    async def handle(endpoint: str, **params: str) -> Response:
        body = cast(bytes, await request.get_data(as_text=False))
        rec = ctrl._record(endpoint, body)
        delay = ctrl._latency.get(endpoint, 0.0)
        if delay > 0:
            await trio.sleep(delay)
        fault = ctrl._take_fault(endpoint)
        if fault is not None and fault.status is None:
            ctrl._mark(rec, "dropped")
            client = request.scope.get("client")
            scope = ctrl._conns.get(client[1]) if client else None
            if scope is not None:
                scope.cancel()
            await trio.sleep(1.0)  # the proxy has cut the socket; this answer goes nowhere
            return _empty(500)
        if fault is not None:
            ctrl._mark(rec, "injected")
            if fault.body is not None:
                return Response(
                    fault.body, status=fault.status or 503, content_type="application/json"
                )
            return _error(fault.status or 503, "injected", "simulated failure")
        denied = ctrl._auth()
        if denied is not None:
            return denied
        try:
            if endpoint == "register":
                resp = ctrl._register(body)
            elif endpoint == "labels":
                resp = ctrl._labels(params["worker_id"], body)
            elif endpoint == "heartbeat":
                resp = ctrl._heartbeat(params["worker_id"], body)
            elif endpoint == "assignments":
                resp = await ctrl._assignments(params["worker_id"])
            elif endpoint == "status":
                resp = ctrl._status(params["job_id"], body)
            elif endpoint == "logs":
                resp = ctrl._logs(params["job_id"], body)
            else:
                resp = ctrl._fault(params["device_id"], body)
        except WireError as exc:
            code = "sheet_too_large" if exc.status == 413 else "bad_request"
            resp = _error(exc.status, code, str(exc))
        ctrl._notify()
        return resp

    routes = [
        ("register", "/v1/workers/register", "POST"),
        ("labels", "/v1/workers/<worker_id>/labels", "POST"),
        ("heartbeat", "/v1/workers/<worker_id>/heartbeat", "POST"),
        ("assignments", "/v1/workers/<worker_id>/assignments", "GET"),
        ("status", "/v1/jobs/<job_id>/status", "POST"),
        ("logs", "/v1/jobs/<job_id>/logs", "POST"),
        ("fault", "/v1/devices/<device_id>/fault", "POST"),
    ]
    for name, rule, method in routes:

        async def view(_name: str = name, **params: str) -> Response:
            return await handle(_name, **params)

        app.add_url_rule(rule, name, view, methods=[method])

    # --- relay E8/E9 (tty/pipe jobs): routes and per-job sessions live in sim/relay.py ---
    from fleet_trio.sim.relay import mount_relay

    mount_relay(app, ctrl)
    # --- end relay ---------------------------------------------------------------------
    from fleet_trio.sim.client_api import mount_client  # POST /v1/jobs & co. (rc run's side)

    mount_client(app, ctrl)

    @app.after_request
    async def _instance(resp: Response) -> Response:
        resp.headers[INSTANCE_HEADER] = ctrl.instance
        return resp

    async def _http_error(exc: HTTPException) -> Response:
        # Go's ServeMux answers: plain text, not the JSON envelope.
        code = exc.code or 500
        text = "404 page not found\n" if code == 404 else f"{exc.name}\n"
        resp = Response(text, status=code, content_type="text/plain; charset=utf-8")
        resp.headers["X-Content-Type-Options"] = "nosniff"
        allow = getattr(exc, "valid_methods", None)
        if code == 405 and allow:
            resp.headers["Allow"] = ", ".join(allow)
        return resp

    app.register_error_handler(HTTPException, _http_error)
    return app


async def _pump(src: trio.SocketStream, dst: trio.SocketStream, scope: trio.CancelScope) -> None:
    try:
        async for data in src:
            await dst.send_all(data)
        await dst.send_eof()
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        scope.cancel()


async def _proxy(ctrl: SimController, backend_port: int, client: trio.SocketStream) -> None:
    async with client:
        if trio.current_time() < ctrl._down_until:
            return
        try:
            backend = await trio.open_tcp_stream("127.0.0.1", backend_port)
        except OSError:
            return
        async with backend:
            port = backend.socket.getsockname()[1]
            with trio.CancelScope() as scope:
                ctrl._conns[port] = scope
                try:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(_pump, client, backend, scope)
                        nursery.start_soon(_pump, backend, client, scope)
                finally:
                    del ctrl._conns[port]


async def _reaper(ctrl: SimController) -> None:
    while True:
        await trio.sleep(ctrl.reaper_interval)
        ctrl.reap()


async def serve_controller(
    ctrl: SimController,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``ctrl`` until cancelled; ``started`` with the base URL (``http://host:port``)."""
    hc = HypercornConfig()
    hc.bind = ["127.0.0.1:0"]
    hc.accesslog = None
    hc.errorlog = None
    hc.graceful_timeout = 0.5
    hc.keep_alive_timeout = 120
    async with trio.open_nursery() as nursery:
        urls: list[str] = await nursery.start(hypercorn_serve, create_app(ctrl), hc)
        backend_port = int(urls[0].rsplit(":", 1)[1])
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()[1]
        ctrl._started_at = trio.current_time()
        nursery.start_soon(_reaper, ctrl)
        serve = functools.partial(trio.serve_listeners, handler_nursery=nursery)
        await nursery.start(serve, functools.partial(_proxy, ctrl, backend_port), listeners)
        shown = f"[{host}]" if ":" in host else host
        ctrl.base_url = f"http://{shown}:{bound}"
        task_status.started(ctrl.base_url)


__all__ = [
    "ENDPOINTS",
    "INSTANCE_HEADER",
    "Device",
    "Event",
    "Job",
    "RequestRecord",
    "SimController",
    "SimError",
    "Worker",
    "create_app",
    "serve_controller",
]
