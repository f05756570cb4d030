"""``fleet_trio.metrics`` on its own: registries, scrape-time sections, event methods."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import attrs
import prometheus_client
import pytest
import trio

from fleet_trio.gpu import FootprintKey, FootprintStore
from fleet_trio.gpu.sampler import GlobalSampler
from fleet_trio.gpu.source import GpuError, VramSnapshot
from fleet_trio.logbus import LogBus
from fleet_trio.metrics import bus_section
from fleet_trio.node.metrics import GIB, NodeMetrics, footprint_section, vram_section
from fleet_trio.proc.spec import SweepReport
from fleet_trio.worker.metrics import WorkerMetrics, controller_endpoint
from tests.helpers import elapse
from tests.metrics.scrape import Samples, parse, total, value


def scraped(metrics: NodeMetrics | WorkerMetrics) -> Samples:
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    return parse(body.decode())


@pytest.mark.parametrize(
    ("path", "endpoint"),
    [
        ("/v1/workers/register", "register"),
        ("/v1/workers/w-1/labels", "labels"),
        ("/v1/workers/w-1/heartbeat", "heartbeat"),
        ("/v1/workers/w-1/assignments", "assignments"),
        ("/v1/jobs/j-1/status", "status"),
        ("/v1/jobs/a/b/logs", "logs"),
        ("/v1/devices/gpubox:gpu0/fault", "fault"),
        ("/v1/jobs/j-1/tty/out", "other"),
        ("/v1/jobs/status-of-everything", "other"),
    ],
)
def test_controller_endpoint_never_carries_an_id(path: str, endpoint: str) -> None:
    assert controller_endpoint(path) == endpoint


def test_every_instance_has_its_own_registry_and_the_global_one_stays_empty() -> None:
    a, b = NodeMetrics(), NodeMetrics()
    a.job_started("render")
    assert value(scraped(a), "fleet_trio_node_jobs_started_total", task_type="render") == 1
    assert value(scraped(b), "fleet_trio_node_jobs_started_total", task_type="render") is None
    w = WorkerMetrics()
    w.heartbeat(False)
    assert value(scraped(w), "fleet_trio_worker_heartbeats_missed_total") == 1
    assert value(scraped(a), "fleet_trio_worker_heartbeats_missed_total") is None
    global_text = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    assert "fleet_trio_" not in global_text


def test_process_metrics_and_build_info() -> None:
    samples = scraped(WorkerMetrics())
    assert value(samples, "fleet_trio_build_info", role="worker", version="0.1.0") == 1
    assert (value(samples, "process_resident_memory_bytes") or 0) > 0


def test_worker_events() -> None:
    m = WorkerMetrics()
    m.controller_request("/v1/jobs/j/status", 200, 0.01)
    m.controller_request("/v1/jobs/j/status", 500, 0.02)
    m.controller_request("/v1/jobs/j/status", None, 5.0)
    m.job_finished("h:gpu0", "killed")  # never ran: no duration
    sweep = SweepReport(scanned=True, found=(11, 12, 13), remaining=(13,), blind=True)
    m.job_finished("h:gpu0", "failed", 2.5, sweep)
    m.job_finished("h:gpu0", "succeeded", 1.0, SweepReport())  # not scanned: no sweep
    m.hook_ran("h:gpu0", "release", False, 0.3)
    m.verify_ran("h:gpu0", True, 0.1)
    m.probe_pass(attrs.make_class("P", {"unconfirmed": attrs.field()})(frozenset({"gpu1"})), 0.2)
    s = scraped(m)
    assert value(s, "fleet_trio_controller_requests_total", endpoint="status", code="200") == 1
    assert value(s, "fleet_trio_controller_requests_total", endpoint="status", code="500") == 1
    assert value(s, "fleet_trio_controller_requests_total", endpoint="status", code="error") == 1
    assert value(s, "fleet_trio_controller_request_errors_total", endpoint="status") == 2
    assert value(s, "fleet_trio_controller_request_duration_seconds_count", endpoint="status") == 3
    assert value(s, "fleet_trio_worker_jobs_finished_total", device="h:gpu0", state="killed") == 1
    assert total(s, "fleet_trio_worker_job_duration_seconds_count") == 2
    assert value(s, "fleet_trio_sweeps_total") == 1
    assert value(s, "fleet_trio_sweep_found_processes_total") == 3
    assert value(s, "fleet_trio_sweep_remaining_processes_total") == 1
    assert value(s, "fleet_trio_sweep_blind_total") == 1
    hook = {"device": "h:gpu0", "event": "release", "outcome": "failed"}
    assert value(s, "fleet_trio_hook_runs_total", **hook) == 1
    assert value(s, "fleet_trio_verify_passes_total", device="h:gpu0", outcome="passed") == 1
    assert value(s, "fleet_trio_probe_passes_total", outcome="unconfirmed") == 1
    assert value(s, "fleet_trio_probe_unconfirmed_devices") == 1


@attrs.frozen
class FakeStats:
    bytes_written: Any
    bytes_skipped: int
    subscribers: int


class BusWithStats(LogBus):
    """A bus with the ``stats()`` the collector reads when the bus provides it."""

    def __init__(self, stats: FakeStats) -> None:
        super().__init__()
        self._stats = stats

    def stats(self) -> FakeStats:
        return self._stats


async def test_bus_counters_from_stats_when_the_bus_has_them() -> None:
    bus = BusWithStats(FakeStats(bytes_written=1234, bytes_skipped=56, subscribers=2))
    s = parse_families(bus_section(bus, trio.current_time()))
    assert value(s, "fleet_trio_log_bytes_total") == 1234
    assert value(s, "fleet_trio_log_skipped_bytes_total") == 56
    assert value(s, "fleet_trio_log_subscribers") == 2
    per_stream = BusWithStats(FakeStats({"stdout": 10, "stderr": 5}, 0, 0))
    s = parse_families(bus_section(per_stream, trio.current_time()))
    assert value(s, "fleet_trio_log_bytes_total", stream="stdout") == 10
    assert value(s, "fleet_trio_log_bytes_total", stream="stderr") == 5


async def test_bus_bytes_grow_with_writes() -> None:
    m = WorkerMetrics()
    bus = LogBus()
    m.watch_bus(bus)
    job = bus.open("job-1")
    await job.write("stdout", b"a" * 100)
    s = scraped(m)
    assert value(s, "fleet_trio_log_retained_bytes") == 100
    assert value(s, "fleet_trio_log_jobs", state="running") == 1
    await job.write("stderr", b"b" * 50)
    job.end("done", 0)
    s = scraped(m)
    assert value(s, "fleet_trio_log_retained_bytes") == 150
    assert value(s, "fleet_trio_log_jobs", state="ended") == 1
    assert value(s, "fleet_trio_log_bytes_total", stream="stdout") == 100
    assert value(s, "fleet_trio_log_bytes_total", stream="stderr") == 50
    sub = job.subscribe("start", max_lag=0)  # replays the ended log: nothing skipped
    assert value(scraped(m), "fleet_trio_log_subscribers") == 1
    await sub.aclose()
    assert value(scraped(m), "fleet_trio_log_skipped_bytes_total") == 0


async def test_a_failing_section_is_left_out_and_the_rest_served(
    caplog: pytest.LogCaptureFixture,
) -> None:
    m = WorkerMetrics()

    def broken(now: float) -> Any:
        raise RuntimeError("boom")

    m.collector.add("broken", broken)
    m.watch_bus(LogBus())
    m.heartbeat(True)
    with caplog.at_level(logging.ERROR, logger="fleet_trio.metrics"):
        s = scraped(m)
    assert value(s, "fleet_trio_worker_heartbeats_total") == 1
    assert value(s, "fleet_trio_log_retained_bytes") == 0
    assert "the broken section failed" in caplog.text


class FlakySource:
    """A GPU source whose second sample fails."""

    name = "fake"

    def __init__(self) -> None:
        self.calls = 0

    async def snapshot(self) -> VramSnapshot:
        await trio.lowlevel.checkpoint()
        self.calls += 1
        if self.calls == 2:
            raise GpuError("driver went away")
        return VramSnapshot.now(80.0, 20.0)


async def test_vram_from_the_real_sampler_with_its_failures(autojump_clock: Any) -> None:
    sampler = GlobalSampler(FlakySource(), interval=2.0)  # type: ignore[arg-type]
    assert await sampler.sample_once()
    await elapse(5)
    assert not await sampler.sample_once()  # keeps the old snapshot
    s = parse_families(vram_section(sampler, "1", trio.current_time()))
    assert value(s, "fleet_trio_gpu_vram_total_bytes", gpu="1") == 80 * GIB
    assert value(s, "fleet_trio_gpu_vram_used_bytes", gpu="1") == 20 * GIB
    assert value(s, "fleet_trio_gpu_vram_free_bytes", gpu="1") == 60 * GIB
    assert value(s, "fleet_trio_gpu_sample_age_seconds", gpu="1") == pytest.approx(5.0)
    assert value(s, "fleet_trio_gpu_samples_total", gpu="1") == 1
    assert value(s, "fleet_trio_gpu_sample_failures_total", gpu="1") == 1


async def test_footprints_from_the_real_store(tmp_path: Path) -> None:
    store = await FootprintStore.open(str(tmp_path / "footprints.json"), margin=1.2)
    await store.record(FootprintKey("sdxl", "", "image-gen"), 2.0)
    await store.record(FootprintKey("sdxl", "", "image-gen"), 1.5)
    s = parse_families(footprint_section(store, trio.current_time()))
    key = {"model_family": "sdxl", "quant": "", "task_type": "image-gen"}
    advertised = value(s, "fleet_trio_footprint_bytes", **key)
    assert advertised == pytest.approx(2.4 * GIB)  # 2.0 x 1.2, as health advertises it
    assert value(s, "fleet_trio_footprint_observed_peak_bytes", **key) == 2.0 * GIB
    assert value(s, "fleet_trio_footprint_samples", **key) == 2


def parse_families(families: Any) -> Samples:
    """Samples of metric families yielded by one section."""
    registry = prometheus_client.CollectorRegistry()
    collected = list(families)

    class Fixed:
        def collect(self) -> Any:
            return collected

    registry.register(Fixed())  # type: ignore[arg-type]
    return parse(prometheus_client.generate_latest(registry).decode())
