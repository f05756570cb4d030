"""The worker's Prometheus metrics (docs/metrics.md): :class:`WorkerMetrics`, its scrape-time
section (supervised jobs, registrations, the lease) and its events (controller requests,
heartbeats, job ends, hooks, verify and probe passes, sweeps). The shared core is
:mod:`fleet_trio.metrics`.

Declared separately on purpose: the metric families are declarations (one family's name, help,
labels and buckets each), alike only in shape here and in ``fleet_trio.node.metrics``; each
stays spelled out so that it reads as docs/metrics.md lists it."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fleet_trio.metrics import JOB_BUCKETS, BaseMetrics

if TYPE_CHECKING:
    from fleet_trio.proc.spec import SweepReport

REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
"""Seconds; the assignments long poll waits up to ``poll_wait`` (30 s) by design."""
SCRIPT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""Seconds; hooks, verify passes and probe passes."""

CONTROLLER_ENDPOINTS = frozenset(
    {"register", "labels", "heartbeat", "assignments", "status", "logs", "fault"}
)
"""The ``endpoint`` label values: the last segment of the rc controller route (E1–E7)."""


def controller_endpoint(path: str) -> str:
    """The ``endpoint`` label of a controller request path (``/v1/jobs/J/logs`` → ``logs``).

    Job, worker and device ids never become label values (unbounded cardinality); an
    unexpected path is ``other``.
    """
    last = path.rsplit("/", 1)[-1].split("?", 1)[0]
    return last if last in CONTROLLER_ENDPOINTS else "other"


class WorkerMetrics(BaseMetrics):
    """``fleet-trio worker``: one per worker. :meth:`attach` binds the scrape-time sections to
    a worker; the worker, its controller client and its hooks call the event methods."""

    role = "worker"

    def __init__(self, *, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        r = self.registry
        self.request_seconds = Histogram(
            "fleet_trio_controller_request_duration_seconds",
            "rc controller requests by endpoint, until the answer or the transport failure.",
            ["endpoint"],
            buckets=REQUEST_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "fleet_trio_controller_requests_total",
            "rc controller requests by endpoint and HTTP status (error: no answer).",
            ["endpoint", "code"],
            registry=r,
        )
        self.request_errors = Counter(
            "fleet_trio_controller_request_errors_total",
            "rc controller requests that failed: no answer, or a status outside 2xx.",
            ["endpoint"],
            registry=r,
        )
        self.heartbeats = Counter(
            "fleet_trio_worker_heartbeats_total", "Heartbeats sent.", registry=r
        )
        self.heartbeats_missed = Counter(
            "fleet_trio_worker_heartbeats_missed_total",
            "Heartbeats the controller did not accept (no answer or a status outside 2xx).",
            registry=r,
        )
        self.jobs_finished = Counter(
            "fleet_trio_worker_jobs_finished_total",
            "Jobs reported terminal, by device and state (succeeded, failed, killed).",
            ["device", "state"],
            registry=r,
        )
        self.job_seconds = Histogram(
            "fleet_trio_worker_job_duration_seconds",
            "Run time of job processes (start to exit), by device and terminal state.",
            ["device", "state"],
            buckets=JOB_BUCKETS,
            registry=r,
        )
        self.job_cpu_seconds = Counter(
            "fleet_trio_worker_job_cpu_seconds_total",
            "CPU time of finished jobs, read from their cgroups (cgroup backend only), by"
            " device (docs/containment.md).",
            ["device"],
            registry=r,
        )
        self.hooks = Counter(
            "fleet_trio_hook_runs_total",
            "on_acquire / on_release hook runs by device, event and outcome (ok, failed).",
            ["device", "event", "outcome"],
            registry=r,
        )
        self.hook_seconds = Histogram(
            "fleet_trio_hook_duration_seconds",
            "Hook run time by device and event.",
            ["device", "event"],
            buckets=SCRIPT_BUCKETS,
            registry=r,
        )
        self.verifies = Counter(
            "fleet_trio_verify_passes_total",
            "Post-job verify passes by device and outcome (passed, failed).",
            ["device", "outcome"],
            registry=r,
        )
        self.verify_seconds = Histogram(
            "fleet_trio_verify_duration_seconds",
            "Verify pass time by device.",
            ["device"],
            buckets=SCRIPT_BUCKETS,
            registry=r,
        )
        self.probes = Counter(
            "fleet_trio_probe_passes_total",
            "Label probe passes by outcome (complete, or unconfirmed when a source failed).",
            ["outcome"],
            registry=r,
        )
        self.probe_seconds = Histogram(
            "fleet_trio_probe_pass_duration_seconds",
            "Label probe pass time.",
            buckets=SCRIPT_BUCKETS,
            registry=r,
        )
        self.probe_unconfirmed = Gauge(
            "fleet_trio_probe_unconfirmed_devices",
            "Devices the last probe pass could not confirm (their labels are kept as they were).",
            registry=r,
        )
        self.sweeps = Counter(
            "fleet_trio_sweeps_total",
            "RC_JOB_ID sweeps that scanned /proc after a job.",
            registry=r,
        )
        self.sweep_found = Counter(
            "fleet_trio_sweep_found_processes_total",
            "Processes of ended jobs found alive by the sweep (they had left the job's group).",
            registry=r,
        )
        self.sweep_remaining = Counter(
            "fleet_trio_sweep_remaining_processes_total",
            "Processes the sweep could not kill.",
            registry=r,
        )
        self.sweep_blind = Counter(
            "fleet_trio_sweep_blind_total",
            "Sweeps that could not finish looking (/proc unreadable or never settled).",
            registry=r,
        )

    def attach(self, worker: Any) -> None:
        """Read the worker's state at scrape time: its supervised jobs, registrations,
        controller contact, and its log bus."""
        self.collector.add("worker", functools.partial(worker_section, worker))
        self.watch_bus(worker.bus)

    # -- events --------------------------------------------------------------------------
    def controller_request(self, path: str, status: int | None, seconds: float) -> None:
        """One exchange with the controller: ``status`` ``None`` = no answer."""
        endpoint = controller_endpoint(path)
        self.request_seconds.labels(endpoint=endpoint).observe(seconds)
        self.requests.labels(endpoint=endpoint, code=str(status or "error")).inc()
        if status is None or not 200 <= status < 300:
            self.request_errors.labels(endpoint=endpoint).inc()

    def heartbeat(self, accepted: bool) -> None:
        self.heartbeats.inc()
        if not accepted:
            self.heartbeats_missed.inc()

    def job_finished(
        self,
        device: str,
        state: str,
        seconds: float | None = None,
        sweep: SweepReport | None = None,
    ) -> None:
        """A terminal report: ``seconds`` the process run time (``None``: it never ran);
        ``sweep`` the job's sweep report."""
        self.jobs_finished.labels(device=device, state=state).inc()
        if seconds is not None:
            self.job_seconds.labels(device=device, state=state).observe(seconds)
        if sweep is not None and sweep.scanned:
            self.sweeps.inc()
            self.sweep_found.inc(len(sweep.found))
            self.sweep_remaining.inc(len(sweep.remaining))
            if sweep.blind:
                self.sweep_blind.inc()

    def job_cpu(self, device: str, seconds: float) -> None:
        """A job's CPU time, read from its cgroup (cgroup backend only)."""
        self.job_cpu_seconds.labels(device=device).inc(seconds)

    def hook_ran(self, device: str, event: str, ok: bool, seconds: float) -> None:
        outcome = "ok" if ok else "failed"
        self.hooks.labels(device=device, event=event, outcome=outcome).inc()
        self.hook_seconds.labels(device=device, event=event).observe(seconds)

    def verify_ran(self, device: str, ok: bool, seconds: float) -> None:
        self.verifies.labels(device=device, outcome="passed" if ok else "failed").inc()
        self.verify_seconds.labels(device=device).observe(seconds)

    def probe_pass(self, result: Any, seconds: float) -> None:
        """One probe pass; ``result`` a ``ProbeResult`` (its ``unconfirmed`` devices)."""
        unconfirmed = len(getattr(result, "unconfirmed", ()) or ())
        self.probes.labels(outcome="unconfirmed" if unconfirmed else "complete").inc()
        self.probe_seconds.observe(seconds)
        self.probe_unconfirmed.set(unconfirmed)


def worker_section(worker: Any, now: float) -> Iterator[Metric]:
    running = GaugeMetricFamily(
        "fleet_trio_worker_jobs_running",
        "Jobs the worker supervises now (named in its heartbeats), by device.",
        labels=["device"],
    )
    counts: dict[str, int] = {}
    config = worker.config
    for device in config.devices:
        counts[config.device_id(device.name)] = 0
    for job in list(worker.jobs.values()):
        device_id = job.assignment.device_id
        counts[device_id] = counts.get(device_id, 0) + 1
    for device_id, count in counts.items():
        running.add_metric([device_id], float(count))
    yield running
    yield CounterMetricFamily(
        "fleet_trio_worker_registrations_total",
        "Accepted registrations (startup and re-registrations).",
        value=float(worker.registrations),
    )
    silent = worker.tracker.silent_for(now) if not math.isnan(now) else None
    if silent is not None:
        yield GaugeMetricFamily(
            "fleet_trio_controller_last_contact_age_seconds",
            "Seconds since the controller last answered anything.",
            value=max(0.0, float(silent)),
        )


__all__ = [
    "CONTROLLER_ENDPOINTS",
    "WorkerMetrics",
    "controller_endpoint",
    "worker_section",
]
