"""One job's lifecycle on the worker (worker-protocol.md §7.3, steps 2–11).

:func:`run_job`: acquire hook → running report → run (logs mode through
:func:`fleet_trio.proc.run`, or a PTY / pipes through the relay) → log upload catch-up →
verify → terminal report → release linger. :func:`pre_killed`: the terminal report of an
assignment killed before it started (§7.4). The pure pieces (the job's environment, its
runtime ceiling, the terminal report's precedence) live here too.

The :class:`~fleet_trio.worker.worker.Worker` owns the state these functions read and write
(``jobs``, the controller client, the hooks, the finish scopes); a job is one task of its
task tree's jobs scope.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import attrs
import trio

from fleet_trio import proc
from fleet_trio.logbus import JobLog, Stream
from fleet_trio.proc.sinks import Sink
from fleet_trio.worker.client import Assignment, LogShipper, StatusReport
from fleet_trio.worker.config import cuda_device_index
from fleet_trio.worker.logfeed import FINISH_BOUND, LogFeed
from fleet_trio.worker.relay import run_attached

if TYPE_CHECKING:
    from fleet_trio.worker.worker import Worker

log = logging.getLogger("fleet_trio.worker.worker")
"""The job's log lines keep the worker's logger name (operators filter on it)."""

VERIFY_CUT_SHORT = "verify failed: cut short by the shutdown"
"""The verify failure of a pass the shutdown cut short: the device was not proven clean, so
it is quarantined like a failed pass (a recovery proof never clears a ``fault``)."""

HOLD_COMMAND = ("sleep", "2147483647")
"""§7.4: what a hold runs (the assignment's ``["hold"]`` is never executed)."""
PRE_KILLED_REASON = "killed before this worker started it"


def job_environment(job: Assignment) -> dict[str, str]:
    """§7.3 step 4: assignment env, then RC_JOB_ID/RC_DEVICE, then the derived CUDA index."""
    env = dict(job.env)
    env["RC_JOB_ID"] = job.job_id
    env["RC_DEVICE"] = job.device_id
    if "CUDA_VISIBLE_DEVICES" not in job.env:
        index = cuda_device_index(job.device_id)
        if index is not None:
            env["CUDA_VISIBLE_DEVICES"] = index
    return env


def effective_max_runtime(job: Assignment, ceiling_seconds: int) -> int:
    """§17.7 decision: the configured device ceiling caps a missing or larger limit."""
    if ceiling_seconds > 0 and (
        job.max_runtime_seconds <= 0 or job.max_runtime_seconds > ceiling_seconds
    ):
        return ceiling_seconds
    return job.max_runtime_seconds


def terminal_report(worker_id: str, result: proc.Result) -> StatusReport:
    """§7.2 precedence: killed, else failed (error or non-zero), else succeeded."""
    if result.killed:
        return StatusReport(worker_id, "killed", result.exit_code, result.err or result.reason)
    if result.err is not None:
        return StatusReport(worker_id, "failed", -1, result.err)
    if result.exit_code != 0:
        return StatusReport(worker_id, "failed", result.exit_code, result.reason)
    return StatusReport(worker_id, "succeeded", 0, "")


# --------------------------------------------------------------------------------------------
# The live log bus (docs/tail.md): best effort, never in the way of a job or a report
# --------------------------------------------------------------------------------------------


class _BusSink:
    """A job log's sink that swallows its own failures: the bus is never a job's problem.
    After the first failure it stops writing (the log is then incomplete, not wrong)."""

    def __init__(self, joblog: JobLog, stream: Stream) -> None:
        self._sink: Sink | None = joblog.sink(stream)
        self._label = f"job {joblog.job_id}"

    async def write(self, data: bytes) -> None:
        if self._sink is None:
            return
        try:
            await self._sink.write(data)
        except Exception:
            self._sink = None
            log.exception("%s: live log write failed; the live tail stops here", self._label)


def _upload_stream(a: Assignment) -> Stream | None:
    """The live log's stream that goes to the log endpoint (E6): logs mode's merged output
    (``stdout``), pipe mode's stderr; nothing for a tty."""
    if a.stdio == "tty":
        return None
    return "stderr" if a.stdio == "pipe" else "stdout"


def _to_upload(shipper: LogShipper, feed: LogFeed | None, stream: Stream) -> Sink:
    """Where the pump writes output bound for the log endpoint: the live log, which the
    job's :class:`LogFeed` reads into ``shipper``; ``shipper`` itself without a live log."""
    return shipper if feed is None else feed.sink(stream)


def _log_feed(joblog: JobLog | None, a: Assignment, shipper: LogShipper) -> LogFeed | None:
    stream = _upload_stream(a)
    if joblog is None or stream is None:
        return None
    return LogFeed(joblog, frozenset({stream}), shipper)


def _end_log(
    joblog: JobLog | None,
    state: str,
    exit_code: int | None,
    reason: str,
    cpu_seconds: float | None = None,
) -> None:
    if joblog is None:
        return
    try:
        joblog.end(state, exit_code, reason, cpu_seconds=cpu_seconds)
    except Exception:
        log.exception("job %s: could not end its live log", joblog.job_id)


@attrs.define(eq=False)
class Job:
    assignment: Assignment
    stop: proc.StopToken
    process_done: trio.Event = attrs.Factory(trio.Event)
    finish_scope: trio.CancelScope | None = None
    started_at: float | None = None
    """When its process started, and ended (metrics: the job duration)."""
    ended_at: float | None = None

    def ran_for(self) -> float | None:
        if self.started_at is None:
            return None
        return (self.ended_at or trio.current_time()) - self.started_at


async def pre_killed(worker: Worker, a: Assignment) -> None:
    report = StatusReport(worker.worker_id, "killed", None, PRE_KILLED_REASON)
    _end_log(worker.open_log(a), report.state, report.exit_code, report.reason)
    worker.metrics.job_finished(a.device_id, report.state)
    with worker.finish_scope(None):
        await worker.client.report_terminal(a.job_id, report)


class _RunningReport:
    """The job's single-attempt ``running`` report (§7.3 step 3); ``done`` once answered (or
    given up)."""

    def __init__(self, worker: Worker, a: Assignment) -> None:
        self.worker = worker
        self.assignment = a
        self.done = trio.Event()

    async def post(self) -> None:
        a = self.assignment
        try:
            await self.worker.client.report_running(a.job_id, self.worker.worker_id)
        finally:
            self.done.set()
        log.info("job %s: started on %s", a.job_id, a.device_id, extra=self.worker.log_context(a))


class _Verify:
    """The verify pass of one job, started as soon as its process tree is gone; shielded and
    bounded like the terminal report (detached from the shutdown, §7.3 step 8), but it ends
    :meth:`fault_reserve` seconds before the hurry deadline, and a pass that is cut short
    fails (:data:`VERIFY_CUT_SHORT`), so its fault report still has room to go out."""

    def __init__(self, worker: Worker, job: Job) -> None:
        self.worker = worker
        self.job = job
        self.started = False
        self.finished = trio.Event()
        self.failure: str | None = None

    def fault_reserve(self) -> float:
        """One fault attempt, at most half the hurry budget."""
        attempt = self.worker.client_timings.report_attempt_timeout
        return max(0.0, min(attempt, self.worker.timings.hurry_budget / 2))

    async def run(self) -> None:
        self.started = True
        a = self.job.assignment
        try:
            with self.worker.finish_scope(
                self.job, "verify pass", reserve=self.fault_reserve()
            ) as scope:
                self.failure = await self.worker.hooks.verify(a.device_id, a)
            if scope.cancelled_caught:
                self.failure = VERIFY_CUT_SHORT
        finally:
            self.finished.set()

    async def outcome(self) -> str | None:
        """Run the pass if nothing started it yet; its failure once it has ended."""
        if not self.started:
            await self.run()
        await self.finished.wait()
        return self.failure


async def _serve_after(
    ready: trio.Event,
    shipper: LogShipper,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The log shipper's sender, once ``ready`` (the running report answered)."""
    task_status.started()
    await ready.wait()
    await shipper.serve()


async def run_job(worker: Worker, a: Assignment) -> None:
    """§7.3, steps 2–11 (step 1, dedup and the supervised set, is done by the caller).

    Cancellation: the job's process gets its supervisor's SIGTERM → grace → SIGKILL; the
    log catch-up and the terminal report are shielded (they must go out) but bounded: once
    the shutdown's drain is over they end by the hurry deadline, and a request after the
    drain cuts them at once."""
    job = worker.jobs[a.job_id]
    client = worker.client
    joblog = worker.open_log(a)
    try:
        failure = await worker.hooks.acquire(a.device_id, a, job.stop)
        if failure is not None:
            with worker.finish_scope(job):
                state = "killed" if job.stop.was_set else "failed"
                prefix = (
                    "cancelled during acquire hook" if job.stop.was_set else "acquire hook failed"
                )
                reason = f"{prefix}: {failure}"
                _end_log(joblog, state, None, reason)
                worker.metrics.job_finished(a.device_id, state)
                await client.report_terminal(
                    a.job_id, StatusReport(worker.worker_id, state, None, reason)
                )
                if state == "failed":  # kept like the report before it (docs/worker.md)
                    await client.report_fault(a.device_id, reason, keep=True)
            return
        shipper = LogShipper(
            lambda chunk: client.send_log_chunk(a.job_id, chunk),
            send_once=lambda chunk: client.send_log_chunk(a.job_id, chunk, once=True),
            single=lambda: not client.log_retries,
            flush_bytes=worker.client_timings.log_flush_bytes,
            flush_delay=worker.client_timings.log_flush_delay,
            limit=worker.client_timings.log_outbox_limit,
            label=f"job {a.job_id}",
        )
        feed = _log_feed(joblog, a, shipper)
        running = _RunningReport(worker, a)
        if a.stdio in ("tty", "pipe"):
            await running.post()  # the relay's halves are opened only after it (§7.3 step 3)
        result: proc.Result | None = None
        verify = _Verify(worker, job)
        try:
            async with trio.open_nursery() as nursery:
                # Logs mode: the ``running`` report goes out while the process starts; the
                # shipper sends nothing before it has been answered, and the terminal report
                # waits for it, so the controller sees running → log chunks → terminal.
                if not running.done.is_set():
                    nursery.start_soon(running.post)
                await nursery.start(_serve_after, running.done, shipper)
                if feed is not None:
                    await nursery.start(feed.serve)
                job.started_at = trio.current_time()
                try:
                    result = await _execute(worker, a, shipper, job.stop, joblog=joblog, feed=feed)
                except Exception as exc:
                    result = proc.Result(exit_code=-1, err=f"worker error: {exc}")
                    raise
                finally:
                    job.process_done.set()
                    job.ended_at = trio.current_time()
                    # The process tree is gone (reaped and swept): the verify pass runs while
                    # the last log chunks go out (§7.3 steps 7–8; its fault report still
                    # follows the final flush on the wire).
                    nursery.start_soon(verify.run)
                    if feed is not None and joblog is not None:
                        with worker.finish_scope(job, "log upload catch-up") as scope:
                            scope.deadline = min(scope.deadline, trio.current_time() + FINISH_BOUND)
                            await feed.finish(joblog.nbytes)
                        if not feed.finished:
                            log.error("job %s: the log upload did not catch up", a.job_id)
                    shipper.seal()
        finally:
            with worker.finish_scope(job):
                await running.done.wait()
                await shipper.close()
            if result is None:
                result = proc.Result(exit_code=-1, killed=True, reason="cancelled")
            await _conclude(worker, a, result, joblog=joblog, verify=verify)
    finally:
        job.process_done.set()
        worker.jobs.pop(a.job_id, None)
        if joblog is not None and joblog.ended is None:  # never leave a tail hanging
            _end_log(joblog, "failed", None, "the worker did not conclude this job")


async def _execute(
    worker: Worker,
    a: Assignment,
    shipper: LogShipper,
    stop: proc.StopToken,
    *,
    joblog: JobLog | None = None,
    feed: LogFeed | None = None,
) -> proc.Result:
    """Step 7: logs mode through ``proc.run``; ``tty`` / ``pipe`` through the relay (§8.2):
    the operator's terminal halves, and for ``pipe`` the stderr to the log endpoint.

    The pump writes into the live log (``joblog``), and the log upload reads from there
    (:class:`~fleet_trio.worker.logfeed.LogFeed`): logs mode's merged output (what goes
    to the log endpoint) as ``stdout``; pipe mode's stdout (to the operator) as ``stdout``
    and its stderr (to the log endpoint) as ``stderr``; a tty's output (to the operator)
    as ``stdout``. Without a live log (``feed`` None) the pump writes to ``shipper``."""
    if a.stdio in ("tty", "pipe"):
        return await run_attached(
            worker.client.base_url,
            worker.config.token,
            a,
            worker.job_spec(a),
            stop,
            stderr_sink=_to_upload(shipper, feed, "stderr") if a.stdio == "pipe" else None,
            output_sink=_BusSink(joblog, "stdout") if joblog is not None else None,
        )
    return await proc.run(worker.job_spec(a), _to_upload(shipper, feed, "stdout"), stop)


async def _conclude(
    worker: Worker,
    a: Assignment,
    result: proc.Result,
    *,
    joblog: JobLog | None,
    verify: _Verify,
) -> None:
    """Steps 8–10: verify (fault first), terminal report, release. The live log ends
    with the report's state, exit code and reason just before the report goes out.

    The terminal report frees the device, so it goes out only once the device is known
    clean or quarantined: the pass passed, or its fault was delivered (kept through an
    outage like the report itself). Otherwise it is withheld (logged): the controller
    reconciles a job that never reports as ``lost``, which quarantines its device. The wait
    for the pass and its fault run in a scope that a request after the drain does not cut
    (the hurry deadline still ends it); the report and the release in an ordinary one."""
    client = worker.client
    job = worker.jobs.get(a.job_id)
    faulted = False
    passed = verify.finished.is_set() and verify.failure is None
    if not passed:  # (a pass that has passed needs no scope: nothing to cut)
        with worker.finish_scope(job, "verify pass and its fault report", cut=False):
            failure = await verify.outcome()
            if failure is not None:
                log.error(
                    "job %s: %s; quarantining device %s",
                    a.job_id,
                    failure,
                    a.device_id,
                    extra=worker.log_context(a),
                )
                faulted = await client.report_fault(a.device_id, failure, keep=True)
    # read from the pass itself: a scope cut after the pass ended is not a failure
    cleared = verify.finished.is_set() and (verify.failure is None or faulted)
    with worker.finish_scope(job):
        await _report(worker, a, result, joblog=joblog, cleared=cleared)
        await worker.hooks.release(a.device_id, a)


async def _report(
    worker: Worker,
    a: Assignment,
    result: proc.Result,
    *,
    joblog: JobLog | None,
    cleared: bool,
) -> None:
    """Step 9: the terminal report, withheld unless ``cleared`` (see :func:`_conclude`)."""
    client = worker.client
    report = terminal_report(worker.worker_id, result)
    job = worker.jobs.get(a.job_id)
    worker.metrics.job_finished(
        a.device_id, report.state, job.ran_for() if job else None, result.sweep
    )
    sweep = result.sweep
    if sweep.remaining:  # worker-process.md §3.6
        log.error(
            "job %s: processes %s survived SIGKILL after the sweep; device %s may be occupied",
            a.job_id,
            list(sweep.remaining),
            a.device_id,
            extra=worker.log_context(a),
        )
    elif sweep.found:
        log.warning(
            "job %s: processes %s outlived the group and were reaped by job id",
            a.job_id,
            list(sweep.found),
            extra=worker.log_context(a),
        )
        if sweep.scope == "cgroup":
            # The line above is the spec's text (worker-process.md §3.6); what really happened
            # under the cgroup backend is said beside it (docs/containment.md).
            log.warning(
                "job %s: (scope cgroup) those processes were found in the job's cgroup and"
                " killed with it, whatever their environment",
                a.job_id,
                extra=worker.log_context(a),
            )
    if result.usage is not None:
        worker.metrics.job_cpu(a.device_id, result.usage.cpu_seconds)
        log.info("job %s: used %s", a.job_id, result.usage.text(), extra=worker.log_context(a))
    log.info(
        "job %s: %s (exit %s) %s",
        a.job_id,
        report.state,
        report.exit_code,
        report.reason,
        extra=worker.log_context(a),
    )
    cpu = None if result.usage is None else result.usage.cpu_seconds
    _end_log(joblog, report.state, report.exit_code, report.reason, cpu)
    if not cleared:
        log.error(
            "job %s: terminal report %s WITHHELD: device %s failed its verify pass (or the "
            "pass did not end) and no fault was delivered, so the report would free a dirty "
            "device; the controller will reconcile the job as lost and quarantine the device",
            a.job_id,
            report.state,
            a.device_id,
            extra=worker.log_context(a),
        )
        return
    await client.report_terminal(a.job_id, report)


__all__ = [
    "HOLD_COMMAND",
    "PRE_KILLED_REASON",
    "VERIFY_CUT_SHORT",
    "Job",
    "effective_max_runtime",
    "job_environment",
    "pre_killed",
    "run_job",
    "terminal_report",
]
