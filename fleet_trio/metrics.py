"""Prometheus metrics of ``fleet-trio node`` and ``fleet-trio worker`` (docs/metrics.md).

One :class:`NodeMetrics` or :class:`WorkerMetrics` per node or worker instance, each with its
own ``CollectorRegistry`` (never prometheus-client's global one), served as ``GET /metrics``.

Two kinds of metric:

* **Read at scrape time.** Values that already live in state objects (the job table, the VRAM
  sampler's snapshot, the footprint store, the worker's supervised jobs, the log bus) are read
  by one custom collector when Prometheus scrapes: no second copy of the bookkeeping and no
  cost on any hot path. Each section of the collector fails alone: an error is logged and
  that section is left out of the scrape, the others are served.
* **Events.** Latencies and outcomes (dispatch answers, job ends, controller requests,
  heartbeats, hooks, verify and probe passes, sweeps) are counters and histograms updated
  where they happen, through the methods below. The dispatch ack pays one histogram observe.

This module imports neither ``fleet_trio.node`` nor ``fleet_trio.worker`` at run time: the
objects it reads are duck-typed, so each role imports it without importing the other.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import trio
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from fleet_trio import __version__

if TYPE_CHECKING:
    from fleet_trio.node.app import NodeContext
    from fleet_trio.proc.spec import SweepReport

log = logging.getLogger(__name__)

GIB = 1 << 30
"""The samplers and footprints speak GiB; metrics speak bytes."""

DISPATCH_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Seconds; an ack is a table update and should sit in the first buckets."""
JOB_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 21600.0)
"""Seconds; jobs run from a fraction of a second to hours."""
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
"""Seconds; the assignments long poll waits up to ``poll_wait`` (30 s) by design."""
SCRIPT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""Seconds; hooks, verify passes and probe passes."""

CONTROLLER_ENDPOINTS = frozenset(
    {"register", "labels", "heartbeat", "assignments", "status", "logs", "fault"}
)
"""The ``endpoint`` label values: the last segment of the rc controller route (E1–E7)."""

Section = Callable[[float], Iterable[Metric]]
"""One part of the scrape-time collector: ``section(now)`` yields metric families."""


def controller_endpoint(path: str) -> str:
    """The ``endpoint`` label of a controller request path (``/v1/jobs/J/logs`` → ``logs``).

    Job, worker and device ids never become label values (unbounded cardinality); an
    unexpected path is ``other``.
    """
    last = path.rsplit("/", 1)[-1].split("?", 1)[0]
    return last if last in CONTROLLER_ENDPOINTS else "other"


def _now() -> float:
    """``trio.current_time()``, or NaN outside a trio run (ages are then left out)."""
    try:
        return trio.current_time()
    except RuntimeError:
        return math.nan


class ScrapeCollector:
    """The custom collector: named sections read at scrape time, each failing alone."""

    def __init__(self) -> None:
        self.sections: list[tuple[str, Section]] = []

    def add(self, name: str, section: Section) -> None:
        self.sections.append((name, section))

    def describe(self) -> list[Metric]:
        return []  # the names depend on what is attached; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        now = _now()
        for name, section in self.sections:
            try:
                families = list(section(now))
            except Exception:
                log.exception("metrics: the %s section failed; left out of this scrape", name)
                continue
            yield from families


class BaseMetrics:
    """What the node and the worker share: the registry, process metrics, build info, the
    scrape-time collector and the log bus section."""

    role = ""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.collector = ScrapeCollector()
        self.registry.register(self.collector)
        ProcessCollector(registry=self.registry)  # process_* (CPU, memory, fds, start time)
        PlatformCollector(registry=self.registry)  # python_info
        info = Gauge(
            "fleet_trio_build_info",
            "Always 1; the labels say which fleet-trio version runs in which role.",
            ["version", "role"],
            registry=self.registry,
        )
        info.labels(version=__version__, role=self.role).set(1)

    def watch_bus(self, bus: Any) -> None:
        """Export the log bus (``fleet_trio.logbus.LogBus``) at scrape time, and the memory
        budget it charges when it has one."""
        self.collector.add("log bus", functools.partial(bus_section, bus))
        budget = getattr(bus, "budget", None)
        if budget is not None:
            self.collector.add("memory budget", functools.partial(memory_section, budget))

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """The exposition for an ``Accept`` header: ``(body, content type)``. Prometheus text
        by default, OpenMetrics when the scraper asks for it."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type


def bus_section(bus: Any, now: float) -> Iterator[Metric]:
    """The log bus: its counters (``bus.stats()``, when the bus has it) and what it keeps.

    ``stats()`` is read duck-typed: an object with ``bytes_written`` (an int, or a mapping of
    stream → int), ``bytes_skipped`` and ``subscribers``; a missing member is left out.
    """
    stats_fn = getattr(bus, "stats", None)
    stats = stats_fn() if callable(stats_fn) else None
    if stats is not None:
        written = getattr(stats, "bytes_written", None)
        if isinstance(written, Mapping):
            family = CounterMetricFamily(
                "fleet_trio_log_bytes_total",
                "Bytes of job output written to the log bus.",
                labels=["stream"],
            )
            for stream, value in sorted(written.items()):
                family.add_metric([str(stream)], float(value))
            yield family
        elif isinstance(written, int | float):
            yield CounterMetricFamily(
                "fleet_trio_log_bytes_total",
                "Bytes of job output written to the log bus.",
                value=float(written),
            )
        skipped = getattr(stats, "bytes_skipped", None)
        if isinstance(skipped, int | float):
            yield CounterMetricFamily(
                "fleet_trio_log_skipped_bytes_total",
                "Bytes of job output that slow live-tail subscribers did not get (skipped).",
                value=float(skipped),
            )
        subscribers = getattr(stats, "subscribers", None)
        if isinstance(subscribers, int | float):
            yield GaugeMetricFamily(
                "fleet_trio_log_subscribers",
                "Live-tail subscriptions open now.",
                value=float(subscribers),
            )
    jobs = bus.jobs()
    retained = GaugeMetricFamily(
        "fleet_trio_log_retained_bytes",
        "Bytes of output the bus holds in memory now (the histories of running and recently "
        "ended jobs; a history is bounded, and the memory budget drops ended ones).",
        value=float(bus.kept_bytes()),
    )
    logs = GaugeMetricFamily(
        "fleet_trio_log_jobs",
        "Job logs the bus keeps now, running or ended.",
        labels=["state"],
    )
    running = sum(1 for info in jobs if info.ended is None)
    logs.add_metric(["running"], float(running))
    logs.add_metric(["ended"], float(len(jobs) - running))
    yield retained
    yield logs


def memory_section(budget: Any, now: float) -> Iterator[Metric]:
    """The memory budget (``fleet_trio.memory.MemoryBudget``): limit, what is charged, and
    what was evicted to stay within it, by kind (``result``, ``log``)."""
    yield GaugeMetricFamily(
        "fleet_trio_memory_budget_bytes",
        "The memory budget: most bytes of kept job output (results and log histories).",
        value=float(budget.limit),
    )
    retained = GaugeMetricFamily(
        "fleet_trio_memory_retained_bytes",
        "Bytes of job output charged to the memory budget now, by kind.",
        labels=["kind"],
    )
    for kind, value in sorted(budget.retained().items()):
        retained.add_metric([kind], float(value))
    yield retained
    entries = CounterMetricFamily(
        "fleet_trio_memory_evictions",
        "Ended jobs' results and log histories evicted to stay within the memory budget.",
        labels=["kind"],
    )
    nbytes = CounterMetricFamily(
        "fleet_trio_memory_evicted_bytes",
        "Bytes freed by memory-budget evictions, by kind.",
        labels=["kind"],
    )
    for kind in sorted(budget.evicted.entries):
        entries.add_metric([kind], float(budget.evicted.entries[kind]))
        nbytes.add_metric([kind], float(budget.evicted.nbytes[kind]))
    yield entries
    yield nbytes


# --------------------------------------------------------------------------------------------
# The node
# --------------------------------------------------------------------------------------------


class NodeMetrics(BaseMetrics):
    """``fleet-trio node``: one per node. :meth:`attach` binds the scrape-time sections to a
    node's context; the runner and the app call the event methods."""

    role = "node"

    def __init__(self, *, gpu: str = "0", registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        self.gpu = gpu
        """The ``gpu`` label: the device index feeding health and the samplers."""
        r = self.registry
        self.dispatch_seconds = Histogram(
            "fleet_trio_node_dispatch_seconds",
            "Time to answer POST /fleet/dispatch inside the node (the ack), by HTTP status.",
            ["code"],
            buckets=DISPATCH_BUCKETS,
            registry=r,
        )
        self._acked = self.dispatch_seconds.labels(code="202")
        self.jobs_started = Counter(
            "fleet_trio_node_jobs_started_total",
            "Jobs whose execution started (after the ack), by task type.",
            ["task_type"],
            registry=r,
        )
        self.jobs_finished = Counter(
            "fleet_trio_node_jobs_finished_total",
            "Jobs whose execution ended, by task type and terminal state (done or error).",
            ["task_type", "state"],
            registry=r,
        )
        self.job_seconds = Histogram(
            "fleet_trio_node_job_duration_seconds",
            "Job execution time (GPU-slot wait included), by task type and terminal state.",
            ["task_type", "state"],
            buckets=JOB_BUCKETS,
            registry=r,
        )

    def attach(self, ctx: NodeContext) -> None:
        """Read the node's state at scrape time: job table, VRAM sampler, footprints, bus."""
        self.collector.add("job table", functools.partial(node_jobs_section, ctx))
        self.collector.add("vram sampler", lambda now: vram_section(ctx.sampler, self.gpu, now))
        self.collector.add("gpu devices", lambda now: device_section(ctx.sampler, now))
        self.collector.add("footprints", lambda now: footprint_section(ctx.footprints, now))
        self.watch_bus(ctx.bus)

    # -- events --------------------------------------------------------------------------
    def dispatch_answered(self, code: int, seconds: float) -> None:
        """One dispatch answer (the hot path: one observe on a cached child for a 202)."""
        child = self._acked if code == 202 else self.dispatch_seconds.labels(code=str(code))
        child.observe(seconds)

    def job_started(self, task_type: str) -> None:
        self.jobs_started.labels(task_type=task_type).inc()

    def job_finished(self, task_type: str, state: str, seconds: float) -> None:
        self.jobs_finished.labels(task_type=task_type, state=state).inc()
        self.job_seconds.labels(task_type=task_type, state=state).observe(seconds)


def node_jobs_section(ctx: NodeContext, now: float) -> Iterator[Metric]:
    store = ctx.store
    jobs = GaugeMetricFamily(
        "fleet_trio_node_jobs",
        "Jobs in the node's job table by state; done and error jobs stay for job_ttl.",
        labels=["state"],
    )
    for state, count in store.table.state_counts().items():
        jobs.add_metric([state.value], float(count))
    yield jobs
    yield GaugeMetricFamily(
        "fleet_trio_node_queue_depth",
        "Jobs accepted or running (health's queue_depth).",
        value=float(store.queue_depth),
    )
    yield GaugeMetricFamily(
        "fleet_trio_node_draining",
        "1 once the node is shutting down and refuses dispatches, else 0.",
        value=1.0 if store.draining else 0.0,
    )


def vram_section(sampler: Any, gpu: str, now: float) -> Iterator[Metric]:
    """The global VRAM sampler: its last good snapshot (even a stale one), its age and its
    sample counters."""
    if sampler is None:
        return
    snapshot_fn = getattr(sampler, "snapshot", None)
    if callable(snapshot_fn):
        snap = snapshot_fn()
    else:
        snap = sampler.status(now)[0] if not math.isnan(now) else None
    if snap is not None:
        for what, attr in (("total", "total_gb"), ("used", "used_gb"), ("free", "free_gb")):
            value = getattr(snap, attr, None)
            if value is None or not math.isfinite(value):
                continue
            yield _gauge(
                f"fleet_trio_gpu_vram_{what}_bytes",
                f"VRAM {what} in bytes, from the last good sample of the health sampler.",
                gpu,
                value * GIB,
            )
        if not math.isnan(now):
            yield _gauge(
                "fleet_trio_gpu_sample_age_seconds",
                "Seconds since the last good VRAM sample (health answers 503 past max age).",
                gpu,
                max(0.0, now - snap.taken_at),
            )
    for name, attr, help_text in (
        ("fleet_trio_gpu_samples_total", "samples", "Successful VRAM samples."),
        (
            "fleet_trio_gpu_sample_failures_total",
            "failures",
            "Failed VRAM samples (errors and timeouts); the last good snapshot is kept.",
        ),
    ):
        value = getattr(sampler, attr, None)
        if isinstance(value, int):
            family = CounterMetricFamily(name, help_text, labels=["gpu"])
            family.add_metric([gpu], float(value))
            yield family


def device_section(sampler: Any, now: float) -> Iterator[Metric]:
    """Multi-GPU: each device's last good sample, labelled by its index and UUID (absent on a
    one-device node, whose ``fleet_trio_gpu_vram_*`` gauges are that device)."""
    read = getattr(sampler, "device_snapshots", None)
    rows = read() if callable(read) else []
    if not rows:
        return
    labels = ["index", "uuid"]
    families = {
        "free": GaugeMetricFamily(
            "fleet_trio_gpu_device_vram_free_bytes",
            "Multi-GPU: VRAM free on each device, from its last good sample.",
            labels=labels,
        ),
        "total": GaugeMetricFamily(
            "fleet_trio_gpu_device_vram_total_bytes",
            "Multi-GPU: VRAM of each device, from its last good sample.",
            labels=labels,
        ),
        "age": GaugeMetricFamily(
            "fleet_trio_gpu_device_sample_age_seconds",
            "Multi-GPU: seconds since each device's last good sample (stale past max age: "
            "no new jobs on it).",
            labels=labels,
        ),
    }
    for device, snap in rows:
        if snap is None:
            continue
        key = [str(device.index), str(device.uuid)]
        if math.isfinite(snap.free_gb):
            families["free"].add_metric(key, snap.free_gb * GIB)
        if math.isfinite(snap.total_gb):
            families["total"].add_metric(key, snap.total_gb * GIB)
        if not math.isnan(now):
            families["age"].add_metric(key, max(0.0, now - snap.taken_at))
    yield from families.values()


def _gauge(name: str, help_text: str, gpu: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help_text, labels=["gpu"])
    family.add_metric([gpu], value)
    return family


def footprint_section(footprints: Any, now: float) -> Iterator[Metric]:
    """The footprint store as health advertises it, plus the raw observed peaks."""
    if footprints is None:
        return
    labels = ["model_family", "quant", "task_type"]
    advertised = GaugeMetricFamily(
        "fleet_trio_footprint_bytes",
        "Advertised VRAM footprint in bytes (margin applied), as health lists it.",
        labels=labels,
    )
    for entry in footprints.entries():
        wire = entry.to_wire()
        peak = float(wire.get("vram_peak_gb", 0.0))
        key = [str(wire.get("model_family", "")), wire.get("quant", ""), wire.get("task_type", "")]
        advertised.add_metric(key, peak * GIB)
    yield advertised
    table = getattr(footprints, "table", None)
    records_fn = getattr(table, "records", None)
    if not callable(records_fn):
        return
    observed = GaugeMetricFamily(
        "fleet_trio_footprint_observed_peak_bytes",
        "Largest VRAM peak measured for the key, in bytes (no margin).",
        labels=labels,
    )
    samples = GaugeMetricFamily(
        "fleet_trio_footprint_samples",
        "Measurements recorded for the key.",
        labels=labels,
    )
    for record in records_fn():
        key = [record.key.family, record.key.quant, record.key.task]
        observed.add_metric(key, float(record.observed_peak_gb) * GIB)
        samples.add_metric(key, float(record.samples))
    yield observed
    yield samples


# --------------------------------------------------------------------------------------------
# The worker
# --------------------------------------------------------------------------------------------


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
    "GIB",
    "BaseMetrics",
    "NodeMetrics",
    "ScrapeCollector",
    "WorkerMetrics",
    "bus_section",
    "controller_endpoint",
    "device_section",
    "footprint_section",
    "node_jobs_section",
    "vram_section",
    "worker_section",
]
