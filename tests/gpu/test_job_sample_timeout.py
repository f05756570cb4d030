"""Issue 13 item 6: each per-job VRAM sample has its own timeout; a hung or failed sample is a
failed sample, never a stuck job. Sources whose queries never return, under autojump_clock."""

from __future__ import annotations

import os

import pytest
import trio

from fleet_trio.gpu import GIB, GpuError, VramSnapshot
from fleet_trio.gpu.sampler import JOB_SAMPLE_TIMEOUT, SharedProcessView, measure_job_peak


class HangingSource:
    """Answers the first ``good`` queries, then hangs (``hang=True``) or raises, per query."""

    name = "hanging"

    def __init__(self, *, good: int = 0, hang: bool = True, used: float = 2.0) -> None:
        self.good = good
        self.hang = hang
        self.used = used
        self.calls = 0
        self.hung = 0

    async def _answer(self) -> None:
        self.calls += 1
        if self.calls > self.good:
            if self.hang:
                self.hung += 1
                await trio.sleep_forever()
            raise GpuError("driver says no")
        await trio.lowlevel.checkpoint()

    async def snapshot(self) -> VramSnapshot:
        await self._answer()
        return VramSnapshot.now(16.0, self.used * self.calls)

    async def process_used_bytes(self) -> dict[int, int] | None:
        await self._answer()
        return {os.getpid(): int(self.used * GIB)}

    async def device_name(self) -> str:
        await trio.lowlevel.checkpoint()
        return ""


async def run_job(
    source: HangingSource, *, mode: str, job_seconds: float, **kw: object
) -> tuple[float | None, float]:
    """A job of ``job_seconds``; returns (peak, how long after the job's end the sampler took)."""
    stop = trio.Event()
    out: list[float | None] = []

    async def sampler() -> None:
        out.append(
            await measure_job_peak(
                source,
                pgid=os.getpgrp(),
                marker=None,
                stop=stop,
                mode=mode,
                **kw,  # type: ignore[arg-type]
            )
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sampler)
        await trio.sleep(job_seconds)
        stop.set()
        ended = trio.current_time()
    return out[0], trio.current_time() - ended


@pytest.mark.parametrize("mode", ["global", "nvml", "auto"])
async def test_a_query_that_never_returns_is_a_failed_sample(
    autojump_clock: trio.abc.Clock, mode: str
) -> None:
    source = HangingSource(good=0)
    with trio.fail_after(60):
        peak, late = await run_job(source, mode=mode, job_seconds=30.0)
    assert peak is None  # every sample hung: none succeeded
    assert late <= JOB_SAMPLE_TIMEOUT  # the job ends within one sample's timeout
    assert source.hung >= 30.0 / (JOB_SAMPLE_TIMEOUT + 0.5)  # it kept sampling, each timed out


async def test_a_hang_after_good_samples_keeps_their_peak(autojump_clock: trio.abc.Clock) -> None:
    source = HangingSource(good=3, used=1.5)
    with trio.fail_after(60):
        peak, late = await run_job(
            source, mode="global", job_seconds=20.0, sample_timeout=1.0, interval=0.5
        )
    assert peak == pytest.approx(1.5 * 2)  # global delta: the 3rd sample less the 1st
    assert late <= 1.0
    assert source.hung > 3


async def test_a_failing_query_is_a_failed_sample(autojump_clock: trio.abc.Clock) -> None:
    source = HangingSource(good=1, hang=False, used=1.0)
    with trio.fail_after(60):
        peak, late = await run_job(source, mode="global", job_seconds=3.0)
    assert peak == 0.0  # the baseline sample; the rest failed
    assert late <= 0.5 + 1e-9
    assert source.calls > 3


async def test_shared_view_is_not_wedged_by_a_hung_query(autojump_clock: trio.abc.Clock) -> None:
    """The shared view's lock is released when the hung query's sample times out, so the
    other jobs' samples fail in time too instead of queueing forever."""
    source = HangingSource(good=0)
    shared = SharedProcessView(source, None, max_age=0.25)
    stop = trio.Event()
    peaks: list[float | None] = []

    async def job() -> None:
        peaks.append(
            await measure_job_peak(
                source, pgid=os.getpgrp(), marker=None, stop=stop, shared=shared, mode="nvml"
            )
        )

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(job)
            await trio.sleep(12.0)
            stop.set()
            ended = trio.current_time()
    assert peaks == [None] * 4
    assert trio.current_time() - ended <= JOB_SAMPLE_TIMEOUT
    # One hung query per round, shared by the jobs queued behind it, not one per job.
    assert 2 <= source.hung <= 12.0 / JOB_SAMPLE_TIMEOUT + 2


async def test_sample_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError):
        await measure_job_peak(
            HangingSource(), pgid=1, marker=None, stop=trio.Event(), sample_timeout=0
        )
