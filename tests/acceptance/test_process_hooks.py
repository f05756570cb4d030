"""worker-process.md §11, H — lease hooks (items 31–35, 38–50). Real hook scripts, real processes.

* 31–35: ``run_hook`` / ``hook_env``.
* 38–44: :class:`HostHooks` driven directly (acquire / release / the ``serve`` timer task /
  the startup pass), through the real hook runner. 39–44 are also covered at the book level
  by ``tests/worker/test_lease.py``.
* 45–50 (and 40): the whole worker (``serve_worker``) against the simulated controller; each
  item's test is its scenario from ``worker_scenarios.py``, bound to the item's name.

Hook scripts are ``#!/bin/sh`` files in ``tmp_path`` that append ``"$RC_EVENT $RC_JOB_ID"``
to a log file. They, the worker harness and the scenarios a protocol item restates live in
``worker_scenarios.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from fleet_trio import proc
from fleet_trio.worker.config import DeviceConfig
from fleet_trio.worker.hooks import HostHooks, hook_env, run_hook
from tests.acceptance import worker_scenarios as scenarios
from tests.acceptance.worker_scenarios import (
    GPU0,
    LOG_EVENT,
    acquire,
    hook,
    host_config,
    job,
    linger_hooks,
    read_text,
    serving,
)
from tests.helpers import quiet_for, scenario_pause, wait_until

# --------------------------------------------------------------------------------------------
# 31–35: run_hook / hook_env
# --------------------------------------------------------------------------------------------


async def test_process_031_run_hook_succeeds(tmp_path: Path) -> None:
    path = hook(tmp_path / "ok.sh", "echo did-run; exit 0")
    with trio.fail_after(10):
        error, output = await run_hook(path, hook_env("acquire", GPU0, "j", "s"), 5.0)
    assert error is None
    assert "did-run" in output


async def test_process_032_nonzero_exit_is_a_failure(tmp_path: Path) -> None:
    path = hook(tmp_path / "bad.sh", "echo boom 1>&2; exit 3")
    with trio.fail_after(10):
        error, output = await run_hook(path, hook_env("acquire", GPU0, "j", "s"), 5.0)
    assert error is not None
    assert "exited 3" in error
    assert error == f"hook {path}: exited 3"
    assert "boom" in output


async def test_process_033_timeout_is_a_failure(tmp_path: Path) -> None:
    path = hook(tmp_path / "slow.sh", "sleep 30")
    t0 = trio.current_time()
    with trio.fail_after(10):
        error, _ = await run_hook(path, hook_env("acquire", GPU0, "j", "s"), 0.2)
    assert trio.current_time() - t0 < 5.0
    assert error is not None
    assert error == f"hook {path}: max_runtime exceeded (200ms)"


async def test_process_034_hook_environment(tmp_path: Path) -> None:
    path = hook(
        tmp_path / "env.sh",
        'echo "EVENT=$RC_EVENT DEVICE=$RC_DEVICE JOB=$RC_JOB_ID SUB=$RC_SUBMITTER '
        'CUDA=$CUDA_VISIBLE_DEVICES"',
    )
    env = hook_env("release", "gpubox:gpu1", "job42", "agent-x")
    with trio.fail_after(10):
        error, output = await run_hook(path, env, 5.0)
    assert error is None
    assert output.strip() == ("EVENT=release DEVICE=gpubox:gpu1 JOB=job42 SUB=agent-x CUDA=1")


async def test_process_035_empty_job_and_submitter_for_the_startup_pass(tmp_path: Path) -> None:
    path = hook(
        tmp_path / "env.sh",
        'echo "JOB=[$RC_JOB_ID] SUB=[$RC_SUBMITTER]"; '
        'echo "set:${RC_JOB_ID+yes}:${RC_SUBMITTER+yes}"',
    )
    with trio.fail_after(10):
        error, output = await run_hook(path, hook_env("release", GPU0, "", ""), 5.0)
    assert error is None
    assert output.splitlines() == ["JOB=[] SUB=[]", "set:yes:yes"]


# --------------------------------------------------------------------------------------------
# 38–44: HostHooks through the real hook runner
# --------------------------------------------------------------------------------------------


async def test_process_038_startup_pass_is_bounded(tmp_path: Path) -> None:
    sleeper = hook(tmp_path / "release.sh", "sleep 30")
    cfg = host_config([DeviceConfig(name=n, on_release=sleeper) for n in ("gpu0", "gpu1")])
    hooks = HostHooks(cfg)
    t0 = trio.current_time()
    with trio.fail_after(15):
        await hooks.startup_pass(budget=0.3)
    assert trio.current_time() - t0 < 5.0
    assert hooks.startup_done.is_set()


async def test_startup_pass_budget_is_a_scope_that_reports_the_hook_it_cut(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 13 item 3: the pass budget is a cancel scope. The hook it cuts is torn down
    (SIGTERM, grace, SIGKILL) and its failure still logged as ``cancelled``; the devices not
    reached are logged as skipped; the hook's process is gone."""
    pidfile = tmp_path / "hook.pid"
    sleeper = hook(tmp_path / "release.sh", f"echo $$ > {pidfile}; exec sleep 30")
    cfg = host_config([DeviceConfig(name=n, on_release=sleeper) for n in ("gpu0", "gpu1")])
    hooks = HostHooks(cfg, grace=0.2)
    t0 = trio.current_time()
    with trio.fail_after(15):
        # 1.5 s: time enough for the first hook to start and say so (its pidfile)
        await hooks.startup_pass(budget=1.5)
    assert trio.current_time() - t0 < 5.0
    assert pidfile.exists(), "the budget ran out before the first hook had started"
    text = caplog.text
    assert "release hook for" in text and ": cancelled" in text
    assert "budget of 1.5s spent" in text and "skipped" in text
    assert hooks.startup_done.is_set()
    assert not proc.procfs.pid_alive(int(pidfile.read_text()))


async def test_process_039_back_to_back_jobs_within_linger_one_acquire_one_release(
    tmp_path: Path,
) -> None:
    """The item's 300 ms linger is 60 s here, so that job2 surely comes inside it whatever
    the machine's load; the release it leaves pending is then fired by the shutdown drain
    (§4.7) rather than by its timer (whose firing items 41 and 44 show)."""
    async with linger_hooks(tmp_path, 60_000) as (hooks, acq_log, rel_log):
        assert await acquire(hooks, "job1") is None
        assert read_text(acq_log) == "acquire job1\n"
        await hooks.release(GPU0, job("job1"))
        await scenario_pause(0.05, why="job2 arrives inside job1's linger")
        assert await acquire(hooks, "job2") is None
        await hooks.release(GPU0, job("job2"))
        assert read_text(acq_log) == "acquire job1\n"
        await quiet_for(0.1, reason="no release hook fires inside the linger")
        assert read_text(rel_log) == ""
        lease = hooks.book.lease(GPU0)
        assert lease is not None and lease.held
        assert lease.pending is not None and lease.pending.job_id == "job2"
        await hooks.drain()
        assert read_text(rel_log) == "release job2\n"
        assert read_text(acq_log) == "acquire job1\n"
        assert not lease.held and lease.pending is None


test_process_040_delayed_release_of_a_finished_job_never_fires_during_the_next = (
    scenarios.scenario_delayed_release_of_a_finished_job_never_fires_during_the_next
)


async def test_process_041_job_after_the_linger_gets_its_own_acquire(tmp_path: Path) -> None:
    async with linger_hooks(tmp_path, 100) as (hooks, acq_log, rel_log):
        assert await acquire(hooks, "job1") is None
        await hooks.release(GPU0, job("job1"))
        await wait_until(lambda: read_text(rel_log) == "release job1\n", timeout=5)
        await wait_until(lambda: not hooks.book.lease(GPU0).held, timeout=5)  # type: ignore[union-attr]
        assert await acquire(hooks, "job2") is None
        assert read_text(acq_log) == "acquire job1\nacquire job2\n"


async def test_process_042_failing_acquire_leaves_the_device_unheld(tmp_path: Path) -> None:
    failing = LOG_EVENT + "; echo acquire-broke >&2; exit 1"
    async with linger_hooks(tmp_path, 100, acquire=failing) as (hooks, acq_log, rel_log):
        error = await acquire(hooks, "job1")
        assert error is not None
        assert "exited 1" in error and "acquire-broke" in error
        await hooks.release(GPU0, job("job1"))  # a no-op: not held, no timer
        lease = hooks.book.lease(GPU0)
        assert lease is not None
        assert not lease.held and lease.pending is None
        error2 = await acquire(hooks, "job2")
        assert error2 is not None
        assert read_text(acq_log) == "acquire job1\nacquire job2\n"
        await quiet_for(0.3, reason="no release hook fires after a failed acquire")
        assert read_text(rel_log) == ""


async def test_process_043_device_without_hooks_is_a_no_op(tmp_path: Path) -> None:
    cfg = host_config([DeviceConfig(name="gpu0")])
    with trio.fail_after(10):
        async with serving(HostHooks(cfg)) as hooks:
            assert hooks.book.lease(GPU0) is None
            assert await acquire(hooks, "job1") is None
            await hooks.release(GPU0, job("job1"))
            assert hooks.book.lease(GPU0) is None
            assert list(hooks.book.leases()) == []
            assert list(tmp_path.iterdir()) == []


async def test_process_044_only_on_release_configured(tmp_path: Path) -> None:
    async with linger_hooks(tmp_path, 100, acquire=None) as (hooks, acq_log, rel_log):
        assert await acquire(hooks, "job1") is None
        lease = hooks.book.lease(GPU0)
        assert lease is not None and lease.held
        assert not acq_log.exists()  # no acquire hook ran
        await hooks.release(GPU0, job("job1"))
        assert read_text(rel_log) == ""  # not before the linger
        await wait_until(lambda: read_text(rel_log), timeout=5)
        await quiet_for(0.1, reason="the release hook fires once")
        assert read_text(rel_log) == "release job1\n"
        assert not hooks.book.lease(GPU0).held  # type: ignore[union-attr]


# --------------------------------------------------------------------------------------------
# 45–50: the whole worker against the simulated controller
# --------------------------------------------------------------------------------------------


test_process_045_back_to_back_jobs_through_the_worker = (
    scenarios.scenario_back_to_back_jobs_through_the_worker
)
test_process_046_job_after_the_linger_through_the_worker = (
    scenarios.scenario_job_after_the_linger_through_the_worker
)
test_process_047_acquire_failure_quarantines_the_device_and_skips_the_job = (
    scenarios.scenario_acquire_failure_quarantines_the_device_and_skips_the_job
)
test_process_048_shutdown_during_acquire_cancels_without_a_fault = (
    scenarios.scenario_shutdown_during_acquire_cancels_without_a_fault
)
test_process_049_pending_release_fires_on_shutdown = (
    scenarios.scenario_pending_release_fires_on_shutdown
)


test_process_050_startup_runs_release_hooks_before_the_first_poll = (
    scenarios.scenario_startup_runs_release_hooks_before_the_first_poll
)
