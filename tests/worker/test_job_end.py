"""A job's end under a failing or absent controller: the verify fault is as durable as the
terminal report it precedes (and the report is withheld when the fault cannot go out), a
failing log endpoint costs the terminal report at most one chunk's retry budget, the
shutdown's drain gives log chunks one attempt, and a verify pass the shutdown cuts short
quarantines the device (worker-protocol.md §3.5–§3.7, §4.3, §7.3 steps 7–9).

The real worker against the simulated controller, with its fault injection (``fail_next``,
``restart(down_for=…)``, ``latency``)."""

from __future__ import annotations

import logging
from typing import Any

import attrs
import pytest
import trio

from fleet_trio.sim import SimController
from fleet_trio.worker.client import LOG_FLUSH_BYTES, MAX_LOG_CHUNK, Assignment
from fleet_trio.worker.job import VERIFY_CUT_SHORT
from tests.helpers import (
    FAST,
    FAST_CLIENT,
    FakeHooks,
    dev,
    running_with_hooks,
    until_terminal,
    wait_until,
)

DIRTY = "verify failed: gpu-check: ecc errors"


def _handled(ctrl: SimController, endpoint: str, job_id: str = "") -> list[int]:
    """Sequence numbers of the requests to ``endpoint`` the controller acted on."""
    return [r.seq for r in ctrl.requests(endpoint) if job_id in r.path and r.outcome == "handled"]


def _terminal_seq(ctrl: SimController, job_id: str) -> int:
    return _handled(ctrl, "status", job_id)[-1]


# --------------------------------------------------------------------------------------------
# 1. The verify fault is as durable as the terminal report
# --------------------------------------------------------------------------------------------


async def test_verify_fault_outlasting_the_reference_retries_still_precedes_the_report() -> None:
    """Eight 503s on the fault (the reference gives up after 5 tries): the fault is kept and
    delivered, and the terminal report comes after it."""
    with trio.fail_after(30):
        async with running_with_hooks(FakeHooks(verify_fails=DIRTY)) as (ctrl, _):
            ctrl.fail_next("fault", status=503, count=8)
            job = ctrl.submit(dev("gpu0"), ["true"])
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            assert ctrl.faults(dev("gpu0")) == [DIRTY]
            assert _handled(ctrl, "fault")[0] < _terminal_seq(ctrl, job)
            assert ctrl.device(dev("gpu0")).state == "unhealthy"


class OutageAtVerify(FakeHooks):
    """A failing verify pass during which the controller goes down for ``down_for`` seconds."""

    def __init__(self, down_for: float) -> None:
        super().__init__(verify_fails=DIRTY)
        self.ctrl: SimController | None = None
        self.down_for = down_for

    async def verify(self, device_id: str, job: Assignment) -> str | None:
        assert self.ctrl is not None
        ctrl = self.ctrl
        # the pass starts beside the job's end; its single `running` report, sent while the
        # process was spawned, may still be on its way on a loaded machine: let it land first
        await ctrl.wait_for(lambda: "running" in ctrl.statuses(job.job_id), timeout=10)
        ctrl.restart(down_for=self.down_for)
        return await super().verify(device_id, job)


async def test_verify_fault_kept_through_an_outage_quarantines_before_the_report() -> None:
    """The reviewer's case: the controller is down when the verify fault goes out, for longer
    than the reference's fault retries last; once it is back it gets the fault, then the
    report, and the device stays quarantined."""
    hooks = OutageAtVerify(down_for=2.5)
    with trio.fail_after(30):
        async with running_with_hooks(hooks) as (ctrl, _):
            hooks.ctrl = ctrl
            job = ctrl.submit(dev("gpu0"), ["true"])
            assert await until_terminal(ctrl, job, within=20) == ["running", "succeeded"]
            assert ctrl.faults(dev("gpu0")) == [DIRTY]
            assert _handled(ctrl, "fault")[0] < _terminal_seq(ctrl, job)
            device = ctrl.device(dev("gpu0"))
            assert (device.state, device.reason) == ("unhealthy", "fault")


async def test_an_undelivered_verify_fault_withholds_the_terminal_report(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A fault the controller refuses (a 4xx is final, §3.7) is not delivered: the report that
    would free the device is withheld, loudly; the job still ends here (release armed, no
    longer supervised) and the controller reconciles it as lost."""
    hooks = FakeHooks(verify_fails=DIRTY)
    with trio.fail_after(30):
        async with running_with_hooks(hooks) as (ctrl, worker):
            ctrl.fail_next("fault", status=404, count=1)
            job = ctrl.submit(dev("gpu0"), ["true"])
            await ctrl.wait_for(lambda: ("release", job) in hooks.calls, timeout=10)
            await ctrl.wait_for(lambda: job not in worker.supervised(), timeout=5)
            assert ctrl.statuses(job) == ["running"]
            assert [r.outcome for r in ctrl.requests("fault")] == ["injected"]
            assert len([r for r in ctrl.requests("status") if job in r.path]) == 1
            assert any("WITHHELD" in r.getMessage() for r in caplog.records)


async def test_acquire_hook_fault_is_kept_like_the_report_before_it() -> None:
    """The acquire fault follows its ``failed`` report (§7.2); a 5xx burst longer than the
    reference's five tries no longer loses it (the report has freed the device)."""
    hooks = FakeHooks(acquire_fails="exit status 3")
    with trio.fail_after(30):
        async with running_with_hooks(hooks) as (ctrl, _):
            ctrl.fail_next("fault", status=503, count=8)
            job = ctrl.submit(dev("gpu0"), ["true"])
            await ctrl.wait_for(lambda: ctrl.faults(dev("gpu0")), timeout=15)
            assert ctrl.statuses(job) == ["failed"]
            assert ctrl.faults(dev("gpu0")) == ["acquire hook failed: exit status 3"]
            assert _terminal_seq(ctrl, job) < _handled(ctrl, "fault")[0]


# --------------------------------------------------------------------------------------------
# 2. A failing log endpoint, and the shutdown drain
# --------------------------------------------------------------------------------------------

BACKLOG = 5 * LOG_FLUSH_BYTES - 1000
"""A job's output: five chunks' worth."""


async def test_a_given_up_log_chunk_drops_the_backlog_so_the_report_does_not_wait(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """/logs answers 500 ``log_error``: the first chunk spends its 5xx budget, then the whole
    backlog behind it is dropped at once (one log line with the byte count), and the terminal
    report goes out: one chunk's budget, not one per chunk."""
    client_timings = attrs.evolve(FAST_CLIENT, report_attempts_5xx=3)
    with trio.fail_after(30):
        async with running_with_hooks(FakeHooks(), client_timings=client_timings) as (ctrl, _):
            ctrl.fail_next("logs", status=500, count=10_000)
            # the shipper sends nothing before `running` is answered: by then the whole
            # output is queued behind the first chunk
            ctrl.latency("status", 1.0)
            job = ctrl.submit(dev("gpu0"), ["head", "-c", str(BACKLOG), "/dev/zero"])
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            sent = [r for r in ctrl.requests("logs") if job in r.path]
            assert len(sent) == 3  # one chunk, three 500s: the rest never tried
            assert all(len(r.body) <= MAX_LOG_CHUNK for r in sent)
            lines = [r.getMessage() for r in caplog.records if "was given up" in r.getMessage()]
            assert len(lines) == 1
            assert f"dropping the {BACKLOG - len(sent[0].body)} B" in lines[0]


async def test_the_shutdown_drain_gives_log_chunks_one_attempt() -> None:
    """A chunk the controller keeps refusing (a 5xx budget that never runs out) is retried
    until the shutdown begins; then it gets no more retries, the backlog is dropped, and the
    ``killed`` report goes out well inside the drain."""
    client_timings = attrs.evolve(FAST_CLIENT, report_attempts_5xx=1_000_000)
    timings = attrs.evolve(FAST, shutdown_drain=8.0)
    script = f"head -c {BACKLOG} /dev/zero; exec sleep 30"
    with trio.fail_after(30):
        async with running_with_hooks(
            FakeHooks(), timings=timings, client_timings=client_timings
        ) as (ctrl, worker):
            ctrl.fail_next("logs", status=500, count=1_000_000)
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", script])
            await ctrl.wait_for(
                lambda: len([r for r in ctrl.requests("logs") if job in r.path]) >= 3
            )
            t0 = trio.current_time()
            worker.request_shutdown("test")
            assert await until_terminal(ctrl, job, within=20) == ["running", "killed"]
            assert trio.current_time() - t0 < timings.shutdown_drain


# --------------------------------------------------------------------------------------------
# 3. A verify pass the shutdown cuts short
# --------------------------------------------------------------------------------------------


class EndlessVerify(FakeHooks):
    """A verify pass that never ends by itself (a hung check)."""

    def __init__(self) -> None:
        super().__init__()
        self.started = trio.Event()

    async def verify(self, device_id: str, job: Assignment) -> str | None:
        self.calls.append(("verify", job.job_id))
        self.started.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")


async def _shutdown_during_verify(ctrl: SimController, worker: Any, hooks: EndlessVerify) -> str:
    """A running job, then a shutdown request; returns once the verify pass has begun."""
    job = ctrl.submit(dev("gpu0"), ["sleep", "30"])
    await ctrl.wait_for(lambda: ctrl.statuses(job) == ["running"])
    worker.request_shutdown("test")
    with trio.fail_after(10):
        await hooks.started.wait()
    return job


async def test_a_verify_pass_cut_short_by_the_shutdown_faults_the_device(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """SIGTERM while the verify pass runs: the drain ends, the pass is cut short leaving its
    fault one attempt's room before the hurry deadline, the device is faulted ``verify failed:
    cut short by the shutdown`` and then the ``killed`` report goes out."""
    hooks = EndlessVerify()
    timings = attrs.evolve(FAST, shutdown_drain=1.0, hurry_budget=2.0)
    with trio.fail_after(30):
        async with running_with_hooks(hooks, timings=timings) as (ctrl, worker):
            job = await _shutdown_during_verify(ctrl, worker, hooks)
            assert await until_terminal(ctrl, job, within=10) == ["running", "killed"]
            assert ctrl.faults(dev("gpu0")) == [VERIFY_CUT_SHORT]
            assert _handled(ctrl, "fault")[0] < _terminal_seq(ctrl, job)
            messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
            assert any("verify pass cut short by the shutdown" in m for m in messages)


async def test_a_second_request_after_the_drain_still_lets_the_cut_short_fault_out() -> None:
    """A second shutdown request after the drain cuts the remaining budgets, but not the
    verify fault: the hurry deadline still bounds it, and the device is quarantined."""
    hooks = EndlessVerify()
    timings = attrs.evolve(FAST, shutdown_drain=0.5, hurry_budget=2.0)
    with trio.fail_after(30):
        async with running_with_hooks(hooks, timings=timings) as (ctrl, worker):
            await _shutdown_during_verify(ctrl, worker, hooks)
            tree = worker._tree
            assert tree is not None
            await wait_until(lambda: worker._hurry, timeout=10, what="the drain's end")
            worker.request_shutdown("again")
            assert tree.hurried
            await ctrl.wait_for(lambda: ctrl.faults(dev("gpu0")), timeout=10)
            assert ctrl.faults(dev("gpu0")) == [VERIFY_CUT_SHORT]
