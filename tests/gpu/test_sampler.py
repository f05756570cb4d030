"""GlobalSampler details beyond the checklist: timeouts, tick phase, the service form."""

from __future__ import annotations

import pytest
import trio

from fleet_trio.gpu import GlobalSampler, GpuError, VramSnapshot, serve_global_sampler
from tests.helpers import StubGpuSource, serving


class SlowSource(StubGpuSource):
    name = "slow"

    def __init__(self, delays: list[float]) -> None:
        self.delays = delays
        self.starts: list[float] = []

    async def snapshot(self) -> VramSnapshot:
        self.starts.append(trio.current_time())
        delay = self.delays[min(len(self.starts) - 1, len(self.delays) - 1)]
        await trio.sleep(delay)
        return VramSnapshot.now(16.0, 1.0)


async def test_hung_sample_times_out_and_counts_as_failure(
    autojump_clock: trio.abc.Clock,
) -> None:
    source = SlowSource([0.0, 100.0, 0.0])
    sampler = GlobalSampler(source, interval=2.0, sample_timeout=5.0)
    async with serving(serve_global_sampler, sampler):
        first = sampler.snapshot()
        await trio.sleep(7.5)  # the tick at 2 s hangs and is abandoned at 7 s
        assert sampler.failures == 1
        assert sampler.last_error is not None and "timed out" in sampler.last_error
        await trio.sleep(1.0)  # the tick at 8 s succeeds
        assert sampler.last_error is None
        assert sampler.samples == 2
        assert sampler.snapshot() != first  # recovered with a fresh snapshot


async def test_slow_samples_skip_missed_ticks(autojump_clock: trio.abc.Clock) -> None:
    source = SlowSource([0.0, 5.0, 0.0])
    sampler = GlobalSampler(source, interval=2.0)
    async with serving(sampler.serve):
        await trio.sleep(10.5)
    assert source.starts[:4] == [0.0, 2.0, 8.0, 10.0]


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError):
        GlobalSampler(SlowSource([0.0]), interval=0)


def test_gpu_error_is_a_fleet_trio_error() -> None:
    from fleet_trio.errors import FleetTrioError

    assert issubclass(GpuError, FleetTrioError)
