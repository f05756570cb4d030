"""``fleet-trio worker``: the rc worker lifecycle as a task tree (worker-protocol.md §4–§7).

(Over 500 lines: the Worker's state and the task-tree callbacks that read it are one unit;
the job lifecycle is in :mod:`fleet_trio.worker.job`, the sheets in :mod:`.sheets`.)

::

    task tree  (opened first; serves SIGTERM/SIGINT from its opening to its close)
    ├─ services   shutdown-signals, controller-client, tail-listener, release-timers
    ├─ role       heartbeat loop, labels push loop (a probe pass each), poll loop
    └─ jobs       one task per assignment: acquire hook → running → run (logs mode, or a
                  PTY / pipes through the relay) → log upload catch-up → verify → terminal
                  report → release linger
    on_jobs_closed: the tails' end, then the release drain (§4.7)

Startup (§4.1), in the tree's body (a shutdown request cancels it): register (first probe
pass, sheets, boot id, recovery proof), heartbeat and labels loops, the startup release pass,
then the first poll.

Shutdown (§4.3): stop polling, set every job's stop token (SIGTERM → 10 s → SIGKILL through
``fleet_trio.proc``), drain up to 45 s while the final flushes and terminal reports go out
(heartbeats keep naming the jobs during the drain, §17.9). Once the drain is over, every log
catch-up and report still in flight shares one deadline (``hurry_budget``, 10 s), report
attempts in flight included, then the jobs are cancelled. The live tails get their ``end``,
pending releases fire at once (worker-process.md §4.7, 20 s for all devices), the services
close. The whole stop is bounded by :func:`shutdown_bound` (110.5 s with the defaults).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import random
import signal
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import attrs
import trio

from fleet_trio import proc
from fleet_trio.backoff import Backoff
from fleet_trio.durations import SECOND
from fleet_trio.logbus import JobLog, LogBus
from fleet_trio.logbus.fanout import TailLimits
from fleet_trio.logs import ENV_SECRETS, console, job_context
from fleet_trio.memory import MemoryBudget
from fleet_trio.nursery import TaskTree, TaskTreeClosed, open_task_tree
from fleet_trio.nursery.tree import SHUTDOWN_SLACK
from fleet_trio.proc.containment import (
    AnyContainment,
    CgroupContainment,
    ContainmentError,
    choose_for_agent,
    describe,
    recover_leftovers,
)
from fleet_trio.proc.limits import JobLimits, check_limits
from fleet_trio.proc.recovery import gather_recovery_proof
from fleet_trio.worker import job as job_lifecycle
from fleet_trio.worker.check import missing_dirs
from fleet_trio.worker.client import (
    Assignment,
    ContactTracker,
    ControllerClient,
    ControllerError,
    DeviceDecl,
    PollAnswer,
    Refused,
    Registration,
    StatusReport,
    Timings,
)
from fleet_trio.worker.config import WorkerConfig, check_tail_listen
from fleet_trio.worker.hooks import DRAIN_BUDGET, HOOK_GRACE, HostHooks
from fleet_trio.worker.job import (
    HOLD_COMMAND,
    Job,
    effective_max_runtime,
    job_environment,
    terminal_report,
)
from fleet_trio.worker.listener import TailListenError, serve_tail_listener
from fleet_trio.worker.metrics import WorkerMetrics
from fleet_trio.worker.outage import OUTAGE_LINE_EVERY, FailureRun, RegistrationRun
from fleet_trio.worker.probes import Prober
from fleet_trio.worker.sheets import MAX_SHEET, SHEET_MARKER, read_sheets, truncate_sheet

log = logging.getLogger(__name__)


@attrs.frozen
class WorkerTimings:
    """Lifecycle constants of §13 in float seconds (tests shrink them)."""

    idle_poll_floor: float = 0.25
    poll_error_delay: float = 2.0
    shutdown_drain: float = 45.0
    kill_grace: float = 10.0
    hurry_budget: float = 10.0
    """Once the drain is over (or the worker is cancelled), each job's final flush and
    terminal report get this long."""
    register_backoff: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 60.0)
    """Startup registration retries (§17.1 decision: retry, capped, never exit)."""
    reregister_silence: float = 300.0
    reregister_jitter: float = 30.0
    reregister_pacing: float = 60.0
    heartbeat_interval: float | None = None
    """``None``: the config's ``heartbeat_interval``."""
    poll_wait: float | None = None
    probe_interval: float | None = None


# --------------------------------------------------------------------------------------------
# Hook seams: ``HostHooks`` (fleet_trio.worker.hooks) by default; tests substitute doubles
# --------------------------------------------------------------------------------------------


class WorkerHooks(Protocol):
    async def acquire(self, device_id: str, job: Assignment, stop: proc.StopToken) -> str | None:
        """Run the device's ``on_acquire``; a failure reason, or ``None`` when it passed."""
        ...

    async def verify(self, device_id: str, job: Assignment) -> str | None:
        """The post-job verify pass: ``None`` when clean, else the fault reason, which starts
        with ``verify failed: `` (worker-process.md §5)."""
        ...

    async def release(self, device_id: str, job: Assignment) -> None:
        """Arm the device's release linger after the terminal report."""
        ...


class NoHooks:
    """The default: nothing to acquire, verify or release."""

    async def acquire(self, device_id: str, job: Assignment, stop: proc.StopToken) -> str | None:
        return None

    async def verify(self, device_id: str, job: Assignment) -> str | None:
        return None

    async def release(self, device_id: str, job: Assignment) -> None:
        return None


# --------------------------------------------------------------------------------------------
# The worker
# --------------------------------------------------------------------------------------------


class Worker:
    """One worker process's state: supervised jobs, the never-cleared started set, the
    contact tracker and the registration. Run it with :func:`serve_worker`."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        timings: WorkerTimings | None = None,
        client_timings: Timings | None = None,
        hooks: WorkerHooks | None = None,
        rng: random.Random | None = None,
        prober: Prober | None = None,
        bus: LogBus | None = None,
        tail_trusted_network: bool = False,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.config = config
        self.bus = bus if bus is not None else LogBus(budget=MemoryBudget(config.memory_budget))
        """Every job's output (the tail listener's source, docs/tail.md)."""
        self.tail_trusted_network = tail_trusted_network
        """``--listen-trusted-network``: allow a non-loopback ``tail_listen``."""
        self.tail_url: str | None = None
        """The tail listener's base URL once it listens (``tail_listen`` set)."""
        self.timings = timings if timings is not None else WorkerTimings()
        self.client_timings = client_timings if client_timings is not None else Timings()
        self.hooks: WorkerHooks = hooks if hooks is not None else HostHooks(config)
        # One prober for the process: it remembers which devices each probe speaks for (§6.6).
        self.prober = prober if prober is not None else Prober(config)
        self.containment: AnyContainment | None = None
        """How jobs are contained, chosen at start (:meth:`open_containment`); ``None``
        before: the marker backend."""
        self.metrics = metrics if metrics is not None else WorkerMetrics()
        """``GET /metrics`` on the tail listener (docs/metrics.md): this worker's registry."""
        self.metrics.attach(self)
        host_hooks: Any = self.hooks
        if getattr(host_hooks, "metrics", False) is None:
            host_hooks.metrics = self.metrics
        self.tracker = ContactTracker(
            silence=self.timings.reregister_silence,
            jitter_window=self.timings.reregister_jitter,
            retry_pacing=self.timings.reregister_pacing,
            rng=rng,
        )
        self.worker_id = ""
        self.registrations = 0
        self.jobs: dict[str, Job] = {}
        self.started: set[str] = set()
        self._hurry = False
        self._hurry_deadline = math.inf
        """Once the drain is over: when every final flush and report must be done."""
        self._finish_scopes: dict[trio.CancelScope, float] = {}
        """Every final flush / terminal report scope in progress (shielded; bounded once the
        drain is over, cut by a request after it)."""
        self._early_shutdown: str | None = None
        self._tree: TaskTree | None = None
        self._client: ControllerClient | None = None
        self._register_lock = trio.Lock()
        self.sheet_limiter = trio.CapacityLimiter(1)
        """The sheet directory's reads (a hung mount holds only this one token)."""
        self.host_limiter = trio.CapacityLimiter(1)
        """The ``/proc`` walk of the recovery proof and the startup directory checks."""
        self.register_failures = 0
        """Failed startup registration attempts (the log tells only a few of them)."""

    # -- settings ------------------------------------------------------------------------------
    def _seconds(self, name: str) -> float:
        """Setting ``name`` in seconds: the timings' override, else the config's."""
        t: float | None = getattr(self.timings, name)
        return t if t is not None else float(getattr(self.config, name)) / SECOND

    heartbeat_interval = property(functools.partial(_seconds, name="heartbeat_interval"))
    poll_wait = property(functools.partial(_seconds, name="poll_wait"))
    probe_interval = property(functools.partial(_seconds, name="probe_interval"))

    @property
    def client(self) -> ControllerClient:
        assert self._client is not None, "the worker is not running"
        return self._client

    def supervised(self) -> list[str]:
        """The jobs heartbeats name (§6.1)."""
        return sorted(self.jobs)

    def request_shutdown(self, reason: str = "shutdown requested") -> None:
        """Ask the running worker to shut down; before :func:`serve_worker` has opened its
        tree, the request is kept and the tree shuts down as soon as it opens."""
        if self._tree is not None:
            self._tree.request_shutdown(reason)
        elif self._early_shutdown is None:
            self._early_shutdown = reason

    def bind_tree(self, tree: TaskTree | None) -> None:
        """:func:`serve_worker`: the task tree the worker runs in (``None`` once it closed). A
        shutdown requested before it opened is passed on to it now."""
        self._tree = tree
        if tree is not None and self._early_shutdown is not None:
            tree.request_shutdown(self._early_shutdown)

    # -- registration ----------------------------------------------------------------------------
    async def build_registration(self, *, with_proof: bool = True) -> Registration:
        """A full registration (§3.1): boot id, fresh recovery proof, ceilings, labels from a
        fresh probe pass (§6.7), sheets.

        ``with_proof=False`` (the E2 labels push, which sends no proof) skips the /proc walk.

        Cancellation: safe at any point; the probe pass's processes are stopped by their
        supervisor.
        """
        cfg = self.config
        recovery = proc.RecoveryProof()
        if with_proof:
            recovery = await gather_recovery_proof(
                os.getpid(),
                require_manual_clear=cfg.require_manual_clear,
                limiter=self.host_limiter,
            )
        sheet, device_sheets = await read_sheets(cfg, limiter=self.sheet_limiter)
        probe_started = trio.current_time()
        probed = await self.prober.run_pass()
        self.metrics.probe_pass(probed, trio.current_time() - probe_started)
        labels = self.prober.wire_labels(probed)
        return Registration(
            host=cfg.host,
            devices=tuple(DeviceDecl(d.name, d.max_runtime_seconds) for d in cfg.devices),
            boot_id=proc.boot_id(),
            recovery=recovery.to_wire(),
            labels=labels,
            declared_labels={d.name: (dict(d.labels) or None) for d in cfg.devices},
            sheet=sheet,
            device_sheets=device_sheets,
        )

    async def register(self) -> None:
        """One registration; raises :class:`ControllerError` on failure.

        Cancellation: the request in flight is abandoned; nothing is recorded."""
        async with self._register_lock:
            registration = await self.build_registration()
            self.worker_id = await self.client.register(registration)
            self.registrations += 1
            log.info("registered with %s as worker %s", self.config.controller_url, self.worker_id)
            if self.registrations == 1:  # the operator's sign that the worker is up
                n = len(registration.devices)
                console(
                    f"fleet-trio worker: registered with {self.config.controller_url} as worker "
                    f"{self.worker_id} ({n} device{'s' if n != 1 else ''})",
                    logger="fleet_trio.worker",
                )

    async def register_at_startup(self) -> None:
        """§4.1 step 2, retried with capped exponential backoff (§17.1 decision).

        Cancellation: :func:`serve_worker` runs it in the tree's body, which the first
        shutdown request cancels: a controller that never answers cannot hold a stop."""
        backoff = Backoff(self.timings.register_backoff, empty=1.0)
        run = RegistrationRun(f"{self.config.controller_url}/v1/workers/register", self.config.path)
        attempt = 0
        while True:
            try:
                await self.register()
                return
            except ControllerError as exc:
                delay = backoff.delay(attempt)
                self.register_failures += 1
                line = run.failed(trio.current_time(), str(exc), exc.status, delay)
                if line is not None:  # the first, the hint, then fewer and fewer reminders
                    log.warning("%s", line)
                else:
                    log.debug("registration failed (%s); retrying in %gs", exc, delay)
                attempt += 1
                await trio.sleep(delay)

    async def maybe_reregister(self) -> None:
        """§5.4: after an idle poll, re-register if owed, due and nothing is supervised.

        Cancellation: as :meth:`register`."""
        now = trio.current_time()
        if not self.tracker.due(now, busy=bool(self.jobs)):
            return
        self.tracker.attempt(now)
        log.info("controller changed or was out of contact: re-registering")
        try:
            await self.register()
        except ControllerError as exc:
            log.warning(
                "re-registration failed (%s); retrying in %gs", exc, self.tracker.retry_pacing
            )
            return
        self.tracker.succeeded()

    # -- loops -------------------------------------------------------------------------------------
    async def heartbeat_loop(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """E3 every ``heartbeat_interval``, naming the supervised jobs (§6.1), until cancelled.

        Cancellation: in the role scope, cancelled after the jobs (heartbeats keep naming
        them during the drain, §17.9); a heartbeat in flight is abandoned."""
        task_status.started()
        while True:
            await trio.sleep(self.heartbeat_interval)
            self.metrics.heartbeat(await self.client.heartbeat(self.worker_id, self.supervised()))

    async def labels_loop(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """E2 after each probe pass, every ``probe_interval``, until cancelled.

        Cancellation: a probe pass in progress is cancelled (its processes are stopped by
        their supervisor); a push in flight is abandoned."""
        task_status.started()
        while True:
            await trio.sleep(self.probe_interval)
            async with self._register_lock:
                registration = await self.build_registration(with_proof=False)
                await self.client.push_labels(self.worker_id, registration)

    async def poll_loop(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """E4 long polls, kills first, then assignments (§3.4), until cancelled.

        Cancellation: :func:`serve_worker` cancels it at step 1 of the shutdown (no new
        assignment once stopping); a poll in flight is abandoned."""
        task_status.started()
        failing = FailureRun("poll", every=OUTAGE_LINE_EVERY)
        while True:
            try:
                answer = await self.client.poll(self.worker_id, self.poll_wait)
            except ControllerError as exc:
                delay = self.timings.poll_error_delay
                if exc.status is not None:  # an answer, but not one to use: each is told
                    log.warning("poll failed: %s; polling again in %gs", exc, delay)
                elif (line := failing.failed(trio.current_time(), str(exc))) is not None:
                    # no answer (an outage): one line a minute, not one per poll
                    log.warning("%s; polling again in %gs", line, delay)
                await trio.sleep(delay)
                continue
            if (line := failing.succeeded(trio.current_time())) is not None:
                log.info("%s", line)
            if self.handle_answer(answer):
                continue
            await self.maybe_reregister()
            await trio.sleep(self.timings.idle_poll_floor)

    def handle_answer(self, answer: PollAnswer) -> bool:
        """Kills first, then assignments (§3.4). Returns True when a job was started.

        What the decoder set aside (a kill id outside the id set, an assignment it could not
        take) is logged and skipped alone; the rest of the answer is honoured."""
        kills = set(answer.kills)
        for problem in answer.bad_kills:
            log.warning("poll answer: %s: skipped", problem)
        for job_id in answer.kills:
            job = self.jobs.get(job_id)
            if job is not None and not job.stop.was_set:
                log.info("job %s: kill received", job_id)
                job.stop.set()
        for refused in answer.refused:
            self._refuse(refused, killed=refused.job_id in kills)
        started = False
        for a in answer.assignments:
            if a.job_id in self.started or a.job_id in self.jobs:
                log.debug("job %s: delivered again, ignored", a.job_id)
                continue
            if self.config.device_by_id(a.device_id) is None:
                # the controller hands out only the devices this worker registered: another
                # host's device (its CUDA index taken from the name) is never run here
                why = f"device {a.device_id} is not one of this worker's devices"
                self._refuse(Refused(why, a.job_id), killed=a.job_id in kills)
                continue
            self.started.add(a.job_id)
            tree = self._tree
            assert tree is not None
            try:
                if a.job_id in kills:
                    tree.start_job(self._pre_killed, a, name=f"job {a.job_id} (pre-killed)")
                else:
                    self.jobs[a.job_id] = Job(a, proc.StopToken())
                    tree.start_job(self.run_job, a, name=f"job {a.job_id}")
                    started = True
            except TaskTreeClosed:
                self.jobs.pop(a.job_id, None)
                log.warning("job %s arrived during shutdown: not started", a.job_id)
        return started

    def _refuse(self, refused: Refused, *, killed: bool) -> None:
        """An assignment the worker cannot take (a member of the wrong type or out of range):
        logged and skipped. When its job id is usable the job is reported ``failed`` with the
        reason (``killed`` when the same answer kills it), so the controller, which counts a
        handed-out job as running, ends it now instead of letting its lease run out (the job
        ``lost``, the device quarantined ``lease_expired``)."""
        job_id = refused.job_id
        log.warning("poll answer: assignment skipped: %s", refused.reason)
        if job_id is None or job_id in self.started or job_id in self.jobs:
            return
        self.started.add(job_id)
        if killed:
            report = StatusReport(self.worker_id, "killed", None, job_lifecycle.PRE_KILLED_REASON)
        else:
            reason = f"assignment refused by the worker: {refused.reason}"
            report = StatusReport(self.worker_id, "failed", None, reason)
        tree = self._tree
        assert tree is not None
        try:
            tree.start_job(self._report_refused, job_id, report, name=f"job {job_id} (refused)")
        except TaskTreeClosed:
            log.warning("job %s refused during shutdown: not reported", job_id)

    async def _report_refused(self, job_id: str, report: StatusReport) -> None:
        with self.finish_scope(None):
            await self.client.report_terminal(job_id, report)

    # -- one job ---------------------------------------------------------------------------------
    async def _pre_killed(self, a: Assignment) -> None:
        await job_lifecycle.pre_killed(self, a)

    @contextlib.contextmanager
    def finish_scope(
        self, job: Job | None, what: str = "final report", *, reserve: float = 0.0, cut: bool = True
    ) -> Iterator[trio.CancelScope]:
        """A job's final flush and terminal report: shielded from the tree's cancel (the report
        must go out), and bounded: once the drain is over every such scope, whatever job it
        belongs to (a pre-killed one too), ends within ``hurry_budget``, and a shutdown request
        after the drain cuts it at once (:meth:`TaskTree.cut_on_hurry`).

        ``reserve``: end that many seconds before the others (the verify pass leaves its fault
        report room to go out). ``cut=False``: a request after the drain does not cut it (the
        verify fault: only the hurry deadline ends it)."""
        scope = trio.CancelScope(shield=True, deadline=self._hurry_deadline - reserve)
        if job is not None:
            job.finish_scope = scope
        tree = self._tree
        forget = tree.cut_on_hurry(scope) if tree is not None and cut else None
        self._finish_scopes[scope] = reserve
        try:
            with scope:
                yield scope
        finally:
            self._finish_scopes.pop(scope, None)
            if forget is not None:
                forget()
            if scope.cancelled_caught:
                log.error(
                    "job %s: %s cut short by the shutdown",
                    job.assignment.job_id if job is not None else "(pre-killed)",
                    what,
                )

    def log_context(self, a: Assignment) -> dict[str, str]:
        """The ``extra=`` of a job's log lines (docs/logging.md)."""
        return job_context(job_id=a.job_id, device=a.device_id, worker_id=self.worker_id)

    def open_log(self, a: Assignment) -> JobLog | None:
        """The job's live log, or ``None`` (an id the bus refuses, or any bus failure)."""
        try:
            return self.bus.open(a.job_id, meta={"device": a.device_id, "stdio": a.stdio or "logs"})
        except Exception as exc:
            log.warning("job %s: no live log (%s)", a.job_id, exc)
            return None

    def job_spec(self, a: Assignment) -> proc.JobSpec:
        device = self.config.device_by_id(a.device_id)
        ceiling = device.max_runtime_seconds if device is not None else 0
        limit = effective_max_runtime(a, ceiling)
        if limit != a.max_runtime_seconds:
            log.info("job %s: applying the device ceiling of %ds", a.job_id, limit)
        return proc.JobSpec(
            command=HOLD_COMMAND if a.is_hold else a.command,
            cwd="" if a.is_hold else a.cwd,
            env=job_environment(a),
            grace_ceiling=self.timings.kill_grace,
            max_runtime=float(limit),
            idle_timeout=float(a.idle_timeout_seconds),
            sweep_job_id="" if a.is_hold else a.job_id,
            env_unset=ENV_SECRETS,  # the worker's token is not the job's (an assignment may set it)
            containment=self.containment,
            cgroup_key=f"hold-{a.job_id}" if a.is_hold else a.job_id,
            limits=device.limits if device is not None else None,
        )

    def configured_limits(self) -> list[tuple[str, JobLimits]]:
        """``(where, limits)`` of every device: where names the device and the file."""
        where = f" in {self.config.path}" if self.config.path else ""
        return [
            (f"devices[{i}] ({d.name}){where}", d.limits) for i, d in enumerate(self.config.devices)
        ]

    async def open_containment(self) -> None:
        """Choose the jobs' containment (docs/containment.md), say it once, and kill and
        remove a crashed run's job cgroups (the recovery log says so). Raises
        :class:`~fleet_trio.proc.containment.ContainmentError` (one line) when
        ``containment: cgroup`` cannot be had."""
        chosen = self.containment is None
        if self.containment is None:
            self.containment = choose_for_agent(
                self.config.containment, base=self.config.cgroup_base
            )
        problem = check_limits(
            self.containment.jobs_dir if isinstance(self.containment, CgroupContainment) else None,
            self.configured_limits(),
        )
        if problem is not None:
            if chosen and isinstance(self.containment, CgroupContainment):
                self.containment.release()
            raise ContainmentError(problem)
        log.info("%s", describe(self.containment))
        self.metrics.set_containment(self.containment.name)
        # hooks, verify scripts and probes are contained like the jobs (fakes in tests may
        # have no such attribute: they spawn nothing)
        for part in (self.hooks, self.prober):
            if hasattr(part, "containment"):
                part.containment = self.containment
        if isinstance(self.containment, CgroupContainment):
            for line in await recover_leftovers(self.containment):
                log.warning("recovery: %s", line)

    async def run_job(self, a: Assignment) -> None:
        """§7.3, steps 2–11: :func:`fleet_trio.worker.job.run_job`."""
        await job_lifecycle.run_job(self, a)

    # -- shutdown ----------------------------------------------------------------------------
    def stop_accepting(self) -> None:
        """Shutdown step 1 (the poll loop's scope is cancelled by the tree): stop every job."""
        for job in self.jobs.values():
            job.stop.set()
        if self._client is not None:  # the drain is for reports: log chunks get one attempt
            self._client.stop_log_retries()

    async def interrupt(self) -> None:
        """After the drain: hurry the final reports, wait (bounded) for the processes."""
        self._hurry = True
        log.warning("drain over: %d job(s) still finishing: %s", len(self.jobs), self.supervised())
        deadline = trio.current_time() + self.timings.hurry_budget
        self._hurry_deadline = deadline  # scopes opened from now on share it
        if self._client is not None:  # no report attempt outlives it, shielded or not
            self._client.cut_attempts_at(deadline)
        for job in list(self.jobs.values()):
            job.stop.set()
        for scope, reserve in list(self._finish_scopes.items()):  # pre-killed ones included
            scope.deadline = min(scope.deadline, deadline - reserve)
        for job in list(self.jobs.values()):
            await job.process_done.wait()

    async def jobs_closed(self) -> None:
        """The tree's ``on_jobs_closed`` step: every job has ended; the live tails get
        :data:`TAILS_END_BUDGET` to send their ``end``, then pending releases fire at once
        (§4.7), in the tree, with the controller client and the signals still served.

        Cancellation: bounded by the tree (``jobs_closed_budget``); a request after the drain
        cuts it."""
        with trio.move_on_after(TAILS_END_BUDGET):
            await self.bus.wait_streams_done()
        drain = getattr(self.hooks, "drain", None)
        if drain is not None:
            await drain()

    async def serve_client(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """The controller client, a service of the tree: it outlives the jobs (their final
        reports) and the release drain, and is closed (bounded, 2 s) when the services go.

        Cancellation: closes the client and returns."""
        async with ControllerClient(
            self.config.controller_url,
            self.config.token,
            tracker=self.tracker,
            timings=self.client_timings,
            metrics=self.metrics,
        ) as client:
            self._client = client
            task_status.started()
            await trio.sleep_forever()


async def _start_tail_listener(worker: Worker, tree: TaskTree) -> None:
    """``tail_listen``: the live log tail in the services scope (cancelled last, so tails see
    the ends of the jobs stopped by a shutdown). A bind failure is logged, not fatal: the
    worker runs its jobs without a tail."""
    cfg = worker.config
    if not cfg.tail_listen:
        return
    try:
        worker.tail_url = await tree.services.start(
            functools.partial(
                serve_tail_listener,
                worker.bus,
                cfg.tail_listen,
                token=cfg.tail_token or None,
                allow_origins=cfg.tail_allow_origins,
                metrics=worker.metrics,
                node_id=cfg.host,  # shown on the browser page
                limits=TailLimits(cfg.max_tails, cfg.max_tails_per_job),
            ),
            name="tail-listener",
        )
    except TailListenError as exc:
        log.error("%s; running without the live log tail", exc)
        return
    log.info("live log tail listening on %s", worker.tail_url)


TAILS_END_BUDGET = 1.5
"""Seconds the live tails get, once every job has ended, to send their ``end`` (as the node's
:data:`~fleet_trio.nursery.tree.JOBS_CLOSED_BUDGET`)."""
RELEASE_DRAIN_BOUND = DRAIN_BUDGET + HOOK_GRACE + 4.0
"""The release drain's share of the shutdown (§4.7): its 20 s budget, the kill grace of a
release hook the budget cuts, and a margin for the reap."""
JOBS_CLOSED_BUDGET = TAILS_END_BUDGET + RELEASE_DRAIN_BOUND
"""The task tree's ``on_jobs_closed`` step for the worker: the tails' end, then the release
drain."""


CLIENT_CLOSE_BOUND = 2.0
"""Seconds the controller client may take to close when the services go (its own bound)."""


def shutdown_bound(timings: WorkerTimings) -> float:
    """Seconds from the first SIGTERM to the exit, at most (docs/worker.md "Stopping"):
    drain + interrupt budget (kill grace + 5 s) + kill grace + the tree's slack + the tails'
    end + the release drain + the controller client's close. Holds while ``hurry_budget``
    is at most ``kill_grace`` + the tree's job teardown slack (the defaults: 10 ≤ 12)."""
    return (
        timings.shutdown_drain
        + (timings.kill_grace + 5.0)
        + timings.kill_grace
        + SHUTDOWN_SLACK
        + JOBS_CLOSED_BUDGET
        + CLIENT_CLOSE_BOUND
    )


async def serve_worker(
    worker: Worker,
    *,
    signals: Sequence[signal.Signals] = (),
    absorb_late_signals: bool = False,
    task_status: trio.TaskStatus[Worker] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``worker`` until :meth:`Worker.request_shutdown`, one of ``signals``, or a cancel,
    per §4.1 / §4.3, in the task tree drawn in the module docstring (opened first, with its
    signal handling). ``started`` (with the worker) once the startup registration succeeded
    and the loops run.

    Cancellation: a cancel, a signal or :meth:`Worker.request_shutdown` runs the shutdown the
    module docstring tells (a request after the drain cuts ``hurry_budget`` short), bounded by
    :func:`shutdown_bound` whatever the controller, a tail client or a job does.
    """
    t = worker.timings
    check_tail_listen(worker.config, worker.tail_trusted_network)
    async with contextlib.AsyncExitStack() as tree_exit, open_task_tree(
        drain=t.shutdown_drain,
        kill_grace=t.kill_grace,
        on_stop_accepting=worker.stop_accepting,
        on_interrupt=worker.interrupt,
        interrupt_budget=t.kill_grace + 5.0,
        on_jobs_closed=worker.jobs_closed,
        jobs_closed_budget=JOBS_CLOSED_BUDGET,
        signals=signals,
        absorb_late_signals=absorb_late_signals,
    ) as tree:
        worker.bind_tree(tree)
        with trio.CancelScope() as body:
            tree.cancel_on_shutdown(body)
            await worker.open_containment()
            if isinstance(worker.containment, CgroupContainment):  # held to the tree's end
                tree_exit.callback(worker.containment.release)
            await tree.services.start(worker.serve_client, name="controller-client")
            for line in await trio.to_thread.run_sync(
                missing_dirs, worker.config, limiter=worker.host_limiter
            ):
                log.warning("%s", line)
            await worker.register_at_startup()
            await tree.role.start(worker.heartbeat_loop, name="heartbeat")
            if math.isfinite(worker.probe_interval) and worker.probe_interval > 0:
                await tree.role.start(worker.labels_loop, name="labels")
            await _start_tail_listener(worker, tree)
            timers = getattr(worker.hooks, "serve", None)
            if timers is not None:
                await tree.services.start(timers, name="release-timers")
            startup_pass = getattr(worker.hooks, "startup_pass", None)
            if startup_pass is not None:
                await startup_pass()  # §4.1 step 5: before the first poll
            poll_scope = trio.CancelScope()
            tree.cancel_on_shutdown(poll_scope)

            async def poll(
                *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
            ) -> None:
                with poll_scope:
                    await worker.poll_loop(task_status=task_status)

            await tree.role.start(poll, name="poll")
            task_status.started(worker)
        await tree.wait_shutdown()
    worker.bind_tree(None)


__all__ = [
    "HOLD_COMMAND",
    "MAX_SHEET",
    "SHEET_MARKER",
    "NoHooks",
    "Worker",
    "WorkerHooks",
    "WorkerTimings",
    "effective_max_runtime",
    "job_environment",
    "read_sheets",
    "serve_worker",
    "shutdown_bound",
    "terminal_report",
    "truncate_sheet",
]
