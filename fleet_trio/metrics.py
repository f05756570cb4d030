"""Prometheus metrics, the part both roles share (docs/metrics.md): each role's metrics
(``fleet_trio.node.metrics``, ``fleet_trio.worker.metrics``) is a :class:`BaseMetrics` with its
own ``CollectorRegistry`` (never prometheus-client's global one), served as ``GET /metrics``.

Values that already live in state objects (the job table, the VRAM sampler, the worker's jobs,
the log bus) are read by one :class:`ScrapeCollector` at scrape time: no second copy of the
bookkeeping, no cost on a hot path; each section fails alone (logged, left out of that scrape).
Latencies and outcomes are counters and histograms the roles update where they happen. This
module knows neither role: the objects it reads (the log bus, the memory budget) are duck-typed.

The families yielded at scrape time are declarations (name, help, value), alike only in shape;
each stays written out where its value is read, as docs/metrics.md lists it.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import trio
from prometheus_client import (
    CollectorRegistry,
    Gauge,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from fleet_trio import __version__

log = logging.getLogger(__name__)

JOB_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 21600.0)
"""Seconds; jobs run from a fraction of a second to hours."""
Section = Callable[[float], Iterable[Metric]]
"""One part of the scrape-time collector: ``section(now)`` yields metric families."""


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
        self._containment = Gauge(
            "fleet_trio_containment_info",
            "Always 1; the label says how jobs are contained: cgroup or marker "
            "(docs/containment.md).",
            ["backend"],
            registry=self.registry,
        )

    def set_containment(self, backend: str) -> None:
        """Say which containment backend the jobs run under (once, at start)."""
        self._containment.clear()
        self._containment.labels(backend=backend).set(1)

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


_BUS_STATS = {
    "bytes_written": ("fleet_trio_log_bytes_total", "Bytes of job output written to the log bus."),
    "bytes_skipped": (
        "fleet_trio_log_skipped_bytes_total",
        "Bytes of job output that slow live-tail subscribers did not get (skipped).",
    ),
    "subscribers": ("fleet_trio_log_subscribers", "Live-tail subscriptions open now."),
}
"""The bus's ``stats()`` members and their families (a ``_total`` name is a counter)."""


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
            family = CounterMetricFamily(*_BUS_STATS["bytes_written"], labels=["stream"])
            for stream, value in sorted(written.items()):
                family.add_metric([str(stream)], float(value))
            yield family
        for attr, (name, help_text) in _BUS_STATS.items():
            value = getattr(stats, attr, None)
            if isinstance(value, int | float):
                kind = CounterMetricFamily if name.endswith("_total") else GaugeMetricFamily
                yield kind(name, help_text, value=float(value))
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


__all__ = [
    "JOB_BUCKETS",
    "BaseMetrics",
    "ScrapeCollector",
    "Section",
    "bus_section",
    "memory_section",
]
