"""The simulated controller's state, its test API (:class:`SimController`) and the reaper of
§6.3. It never sees HTTP: the worker routes' transitions are in :mod:`.protocol`, the serving
in :mod:`.app`."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from fleet_trio.sim.controller.faults import FaultPlan, check_endpoint
from fleet_trio.sim.controller.records import (
    ACTIVE,
    TERMINAL,
    Device,
    Event,
    Job,
    RequestRecord,
    SimError,
    Worker,
)
from fleet_trio.sim.rcwire import StatusReport, make_converter

if TYPE_CHECKING:
    from fleet_trio.sim.relay import RelaySession


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
        self.fault_plan = FaultPlan()
        self.relay_sessions: dict[str, RelaySession] = {}
        """The relay (E8/E9) sessions by job ID (:func:`fleet_trio.sim.relay.operator`)."""
        self._pokes: dict[str, trio.Event] = {}
        self._changed = trio.Event()
        self._conns: dict[int, trio.CancelScope] = {}
        self._polls: set[trio.CancelScope] = set()
        self._gates: dict[str, trio.Event] = {}
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
        else:
            if self.retain_disconnected_jobs and self._disconnected(job.device_id):
                # finalized on the spot, the device kept out of the pool, the kill flag kept for
                # a returning worker (§5.5); a heartbeat that stops naming the job clears it
                self._finish(job, "killed", None, "cancelled", free_device=False)
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

    def age_kill(self, job_id: str, seconds: float) -> None:
        """Pretend the kill of ``job_id`` was last delivered ``seconds`` earlier: the
        ``kill_redelivery`` window passes without waiting for it. As with the window itself, a
        parked long poll is not woken: the next poll offers the kill again."""
        job = self._job(job_id)
        if job.kill_delivered_at is not None:
            job.kill_delivered_at -= seconds
        self._notify()

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
        self.fault_plan.fail_next(endpoint, status, count, body)

    def drop_next(self, endpoint: str, count: int = 1) -> None:
        """Close the connection of the next ``count`` requests to ``endpoint`` unanswered."""
        self.fault_plan.drop_next(endpoint, count)

    def latency(self, endpoint: str, seconds: float) -> None:
        """Delay every request to ``endpoint`` by ``seconds`` before handling it (0 clears)."""
        self.fault_plan.set_latency(endpoint, seconds)

    def gate(self, endpoint: str) -> None:
        """Hold every request to ``endpoint`` from now on until :meth:`open_gate`: it is
        recorded on arrival (``requests()``) but handled, and answered, only once the gate
        opens (after any ``latency``). The client's own timeout still applies to it. A held
        request whose connection is cut meanwhile is still handled when the gate opens."""
        check_endpoint(endpoint)
        self._gates.setdefault(endpoint, trio.Event())

    def open_gate(self, endpoint: str) -> None:
        """Let the requests held at ``endpoint``'s gate through (all at once, in no promised
        order) and stop holding new ones; a no-op when the endpoint is not gated."""
        check_endpoint(endpoint)
        gate = self._gates.pop(endpoint, None)
        if gate is not None:
            gate.set()

    async def _pass_gate(self, endpoint: str) -> None:
        gate = self._gates.get(endpoint)
        if gate is not None:
            await gate.wait()

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
        timeout: float = 30.0,  # noqa: ASYNC109 -- the documented test API
    ) -> Any:
        """Wait until ``predicate()`` is truthy (re-checked on every request and state change);
        returns its value. Raises ``trio.TooSlowError`` after ``timeout`` seconds (the default
        is a bound for a loaded CI machine, not an expected wait: it only matters when the
        predicate never comes true)."""
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
        return self._pokes.setdefault(worker_id, trio.Event())

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

    def _record(
        self,
        endpoint: str,
        *,
        method: str,
        path: str,
        query: str,
        headers: Mapping[str, str],
        body: bytes,
    ) -> RequestRecord:
        rec = RequestRecord(
            seq=len(self._requests),
            at=trio.current_time(),
            endpoint=endpoint,
            method=method,
            path=path,
            query=query,
            headers=headers,
            body=body,
            instance=self.instance,
        )
        self._requests.append(rec)
        self._notify()
        return rec

    def _mark(self, rec: RequestRecord, outcome: str) -> None:
        self._requests[rec.seq] = attrs.evolve(rec, outcome=outcome)
        self._notify()

    def _denial(self, authorization: str, route: str = "worker") -> tuple[int, str, str] | None:
        """Why a ``route`` route (``worker`` or ``client``) refuses this ``Authorization``
        header: (status, code, message); ``None`` when the token's role may call it."""
        token = authorization[7:] if authorization.startswith("Bearer ") else ""
        role = self.tokens.get(token) if token else None
        if role is None:
            return 401, "unauthorized", "unknown or missing token"
        if role not in (route, "admin"):
            return 403, "forbidden", f"token role {role} may not call a {route} route"
        return None


__all__ = ["SimController"]
