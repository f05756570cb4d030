"""The node's Prometheus metrics (docs/metrics.md): :class:`NodeMetrics`, its scrape-time
sections (jobs, VRAM, devices, footprints) and its events (dispatch answers, job ends). The
shared core is :mod:`fleet_trio.metrics`.

Declared separately on purpose: the metric families are declarations (one family's name, help,
labels and buckets each), alike only in shape here and in ``fleet_trio.worker.metrics``."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fleet_trio.metrics import JOB_BUCKETS, BaseMetrics

if TYPE_CHECKING:
    from fleet_trio.node.app import NodeContext

GIB = 1 << 30
"""The samplers and footprints speak GiB; metrics speak bytes."""

DISPATCH_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Seconds; an ack is a table update and should sit in the first buckets."""


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
        self.job_cpu_seconds = Counter(
            "fleet_trio_node_job_cpu_seconds_total",
            "CPU time of finished jobs, read from their cgroups (cgroup backend only), by task"
            " type (docs/containment.md).",
            ["task_type"],
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

    def job_cpu(self, task_type: str, seconds: float) -> None:
        """A job's CPU time, read from its cgroup (cgroup backend only)."""
        self.job_cpu_seconds.labels(task_type=task_type).inc(seconds)

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


__all__ = [
    "GIB",
    "NodeMetrics",
    "device_section",
    "footprint_section",
    "node_jobs_section",
    "vram_section",
]
