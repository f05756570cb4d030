"""worker-process.md §11, H — lease hooks (items 31–35, 38–50). Real hook scripts, real processes.

* 31–35: ``run_hook`` / ``hook_env``.
* 38–44: :class:`HostHooks` driven directly (acquire / release / the ``serve`` timer task /
  the startup pass), through the real hook runner. 39–44 are also covered at the book level
  by ``tests/worker/test_lease.py``.
* 45–50: the whole worker (``serve_worker``) against the simulated controller.

Hook scripts are ``#!/bin/sh`` files in ``tmp_path`` that append ``"$RC_EVENT $RC_JOB_ID"``
to a log file. ``worker_on_sim`` is shared with ``test_process_worker_verify.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio

from fleet_trio import proc
from fleet_trio.durations import MILLISECOND, SECOND
from fleet_trio.sim import SimController, serve_controller
from fleet_trio.worker.client import Assignment
from fleet_trio.worker.config import DeviceConfig, HooksConfig, WorkerConfig
from fleet_trio.worker.hooks import HostHooks, hook_env, run_hook
from fleet_trio.worker.worker import Worker
from tests.helpers import (
    FAST,
    FAST_CLIENT,
    HOST,
    config,
    dev,
    quiet_for,
    scenario_pause,
    sim,
    start_worker,
    succeeded,
    until_terminal,
    wait_until,
)

GPU0 = dev("gpu0")
LOG_EVENT = 'echo "$RC_EVENT $RC_JOB_ID" >> "{log}"'


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def hook(path: Path, body: str) -> str:
    """Write an executable ``#!/bin/sh`` script; returns its path as a string."""
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def read_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def read_text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def job(job_id: str, device_id: str = GPU0, submitter: str = "agent-x") -> Assignment:
    return Assignment(job_id=job_id, device_id=device_id, submitter=submitter)


def host_config(devices: Sequence[DeviceConfig], **kw: object) -> WorkerConfig:
    return WorkerConfig(host=HOST, devices=tuple(devices), sheet_dir="/nonexistent", **kw)  # type: ignore[arg-type]


@asynccontextmanager
async def serving(hooks: HostHooks) -> AsyncIterator[HostHooks]:
    """``hooks`` with its release-linger timer task running."""
    async with trio.open_nursery() as nursery:
        await nursery.start(hooks.serve)
        yield hooks
        nursery.cancel_scope.cancel()


@attrs.define
class WorkerRun:
    """A worker served against a sim controller (see :func:`worker_on_sim`)."""

    ctrl: SimController
    worker: Worker
    done: trio.Event

    async def ready(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        """Registered and polling."""
        await self.ctrl.wait_for(
            lambda: self.worker.registrations >= 1 and self.ctrl.polls(), timeout=timeout
        )

    async def stop(self, within: float = 20.0) -> float:
        """Request shutdown; wait (at most ``within``) for ``serve_worker`` to return; the
        seconds it took."""
        t0 = trio.current_time()
        self.worker.request_shutdown("test stops the worker")
        with trio.fail_after(within):
            await self.done.wait()
        return trio.current_time() - t0


@asynccontextmanager
async def worker_on_sim(
    tmp_path: Path,
    devices: Sequence[str | DeviceConfig] = ("gpu0",),
    *,
    hooks: HooksConfig | None = None,
    verify_dir: Path | None = None,
    ctrl: SimController | None = None,
) -> AsyncIterator[WorkerRun]:
    """A sim controller and a real worker (``HostHooks`` by default) whose config carries the
    given devices (with their hooks), host-level hook settings and ``verify_dir`` (default: a
    path in ``tmp_path`` that does not exist, i.e. verify off). Yields at once (before
    registration, see :meth:`WorkerRun.ready`); the worker is stopped at exit."""
    ctrl = ctrl if ctrl is not None else sim()
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_controller, ctrl)
        cfg = config(
            url,
            devices,
            hooks=hooks if hooks is not None else HooksConfig(),
            verify_dir=str(verify_dir if verify_dir is not None else tmp_path / "no-verify.d"),
        )
        worker = Worker(cfg, timings=FAST, client_timings=FAST_CLIENT)
        done = start_worker(nursery, worker)
        run = WorkerRun(ctrl, worker, done)
        try:
            yield run
        finally:
            if not done.is_set():
                worker.request_shutdown("test over")
                with trio.move_on_after(20, shield=True):
                    await done.wait()
            nursery.cancel_scope.cancel()


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
        await hooks.startup_pass(budget=0.5)
    assert trio.current_time() - t0 < 3.0
    text = caplog.text
    assert "release hook for" in text and ": cancelled" in text
    assert "budget of 0.5s spent" in text and "skipped" in text
    assert hooks.startup_done.is_set()
    assert not proc.procfs.pid_alive(int(pidfile.read_text()))


@asynccontextmanager
async def linger_hooks(
    tmp_path: Path,
    linger_ms: int,
    *,
    acquire: str | None = LOG_EVENT,
    release: str | None = LOG_EVENT,
) -> AsyncIterator[tuple[HostHooks, Path, Path]]:
    """Served hooks for one device ``gpu0`` whose acquire and release hooks log to separate
    files (yielded after the hooks); the block is guarded by a 15 s ``fail_after``."""
    acq_log, rel_log = tmp_path / "acquire.log", tmp_path / "release.log"
    device = DeviceConfig(
        name="gpu0",
        on_acquire=hook(tmp_path / "acquire.sh", acquire.format(log=acq_log)) if acquire else "",
        on_release=hook(tmp_path / "release.sh", release.format(log=rel_log)) if release else "",
        release_linger=linger_ms * MILLISECOND,
        timeout=10 * SECOND,
    )
    with trio.fail_after(15):
        async with serving(HostHooks(host_config([device]))) as hooks:
            yield hooks, acq_log, rel_log


async def acquire(hooks: HostHooks, name: str) -> str | None:
    """``gpu0``'s acquire for job ``name``: the error, or None."""
    return await hooks.acquire(GPU0, job(name), proc.StopToken())


async def test_process_039_back_to_back_jobs_within_linger_one_acquire_one_release(
    tmp_path: Path,
) -> None:
    async with linger_hooks(tmp_path, 300) as (hooks, acq_log, rel_log):
        assert await acquire(hooks, "job1") is None
        assert read_text(acq_log) == "acquire job1\n"
        await hooks.release(GPU0, job("job1"))
        await scenario_pause(0.05, why="job2 arrives inside job1's linger")
        assert await acquire(hooks, "job2") is None
        await hooks.release(GPU0, job("job2"))
        assert read_text(acq_log) == "acquire job1\n"
        await quiet_for(0.1, reason="no release hook fires inside the linger")
        assert read_text(rel_log) == ""
        await wait_until(lambda: read_text(rel_log), timeout=5)
        await quiet_for(0.2, reason="no second release hook fires")
        assert read_text(rel_log) == "release job2\n"
        assert read_text(acq_log) == "acquire job1\n"


async def scenario_delayed_release_of_a_finished_job_never_fires_during_the_next(
    tmp_path: Path,
) -> None:
    async with linger_hooks(tmp_path, 100) as (hooks, acq_log, rel_log):
        assert await acquire(hooks, "job1") is None
        assert await acquire(hooks, "job2") is None  # skips
        assert read_text(acq_log) == "acquire job1\n"
        await hooks.release(GPU0, job("job1"))  # job1's late release: epoch 1, stale
        lease = hooks.book.lease(GPU0)
        assert lease is not None and lease.held and lease.pending is None
        await quiet_for(0.4, reason="the stale release never fires")
        assert read_text(rel_log) == ""
        await hooks.release(GPU0, job("job2"))
        await wait_until(lambda: read_text(rel_log), timeout=5)
        await quiet_for(0.2, reason="no second release hook fires")
        assert read_text(rel_log) == "release job2\n"


async def test_process_040_delayed_release_of_a_finished_job_never_fires_during_the_next(
    tmp_path: Path,
) -> None:
    await scenario_delayed_release_of_a_finished_job_never_fires_during_the_next(tmp_path)


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


def logging_device(tmp_path: Path, log: Path, **kw: object) -> DeviceConfig:
    """``gpu0`` with one script as both ``on_acquire`` and ``on_release``."""
    script = hook(tmp_path / "hook.sh", LOG_EVENT.format(log=log))
    return DeviceConfig(name="gpu0", on_acquire=script, on_release=script, **kw)  # type: ignore[arg-type]


@asynccontextmanager
async def logging_worker(
    tmp_path: Path, linger: int
) -> AsyncIterator[tuple[SimController, WorkerRun, Path]]:
    """A registered worker on the sim whose ``gpu0`` logs every hook to the yielded file, with
    this ``release_linger``; the whole block is guarded by a 30 s ``fail_after``."""
    log = tmp_path / "hooks.log"
    device = logging_device(tmp_path, log)
    hooks = HooksConfig(release_linger=linger)
    with trio.fail_after(30):
        async with worker_on_sim(tmp_path, [device], hooks=hooks) as run:
            await run.ready()
            yield run.ctrl, run, log


async def scenario_back_to_back_jobs_through_the_worker(tmp_path: Path) -> None:
    async with logging_worker(tmp_path, 500 * MILLISECOND) as (ctrl, _run, log):
        job1 = ctrl.submit(GPU0, ["true"])
        job2 = ctrl.submit(GPU0, ["true"])
        assert await until_terminal(ctrl, job1) == ["running", "succeeded"]
        assert await until_terminal(ctrl, job2) == ["running", "succeeded"]
        await wait_until(lambda: f"release {job2}" in read_lines(log), timeout=5)
        await quiet_for(0.7, reason="an idle linger fires no further hook")
        assert read_lines(log) == ["release ", f"acquire {job1}", f"release {job2}"]


async def test_process_045_back_to_back_jobs_through_the_worker(tmp_path: Path) -> None:
    await scenario_back_to_back_jobs_through_the_worker(tmp_path)


async def scenario_job_after_the_linger_through_the_worker(tmp_path: Path) -> None:
    async with logging_worker(tmp_path, 100 * MILLISECOND) as (ctrl, _run, log):
        job1 = await succeeded(ctrl, GPU0)
        await wait_until(lambda: f"release {job1}" in read_lines(log), timeout=5)
        await scenario_pause(0.2, why="job2 comes after job1's linger has ended")
        job2 = await succeeded(ctrl, GPU0)
        await wait_until(lambda: f"release {job2}" in read_lines(log), timeout=5)
        await quiet_for(0.2, reason="no further hook fires")
        assert read_lines(log) == [
            "release ",
            f"acquire {job1}",
            f"release {job1}",
            f"acquire {job2}",
            f"release {job2}",
        ]


async def test_process_046_job_after_the_linger_through_the_worker(tmp_path: Path) -> None:
    await scenario_job_after_the_linger_through_the_worker(tmp_path)


async def scenario_acquire_failure_quarantines_the_device_and_skips_the_job(tmp_path: Path) -> None:
    failing = hook(tmp_path / "acquire.sh", "echo boom-output >&2; exit 1")
    artifact = tmp_path / "artifact"
    device = DeviceConfig(name="gpu0", on_acquire=failing)
    with trio.fail_after(30):
        async with worker_on_sim(tmp_path, [device]) as run:
            await run.ready()
            ctrl = run.ctrl
            job1 = ctrl.submit(GPU0, ["touch", str(artifact)])
            await ctrl.wait_for(lambda: ctrl.statuses(job1) and ctrl.faults(GPU0), timeout=10)
            await quiet_for(0.3, reason="nothing more arrives")
            faults = ctrl.faults(GPU0)
            assert len(faults) == 1
            assert "boom-output" in faults[0]
            reports = ctrl.status_reports(job1)
            assert [r.state for r in reports] == ["failed"]
            assert "boom-output" in reports[0].reason
            assert reports[0].reason.startswith(f"acquire hook failed: hook {failing}: exited 1")
            assert not artifact.exists()
            assert ctrl.logs(job1) == b""
            assert ctrl.device(GPU0).state == "unhealthy"


async def test_process_047_acquire_failure_quarantines_the_device_and_skips_the_job(
    tmp_path: Path,
) -> None:
    await scenario_acquire_failure_quarantines_the_device_and_skips_the_job(tmp_path)


async def scenario_shutdown_during_acquire_cancels_without_a_fault(tmp_path: Path) -> None:
    started = tmp_path / "started"
    slow = hook(tmp_path / "acquire.sh", f'touch "{started}"; sleep 30')
    device = DeviceConfig(name="gpu0", on_acquire=slow, timeout=60 * SECOND)
    with trio.fail_after(40):
        async with worker_on_sim(tmp_path, [device]) as run:
            await run.ready()
            ctrl = run.ctrl
            job1 = ctrl.submit(GPU0, ["true"])
            await wait_until(started.exists, timeout=10)
            assert await run.stop(within=20) < 20
            assert ctrl.faults(GPU0) == []
            reports = ctrl.status_reports(job1)
            assert [r.state for r in reports] == ["killed"]
            assert reports[0].reason.startswith("cancelled during acquire hook: ")
            assert ctrl.device(GPU0).state != "unhealthy"


async def test_process_048_shutdown_during_acquire_cancels_without_a_fault(tmp_path: Path) -> None:
    await scenario_shutdown_during_acquire_cancels_without_a_fault(tmp_path)


async def scenario_pending_release_fires_on_shutdown(tmp_path: Path) -> None:
    async with logging_worker(tmp_path, 60 * SECOND) as (ctrl, run, log):
        job1 = await succeeded(ctrl, GPU0)
        await wait_until(lambda: run.worker.supervised() == [], timeout=5)
        assert read_lines(log) == ["release ", f"acquire {job1}"]
        assert await run.stop(within=15) < 15
        assert read_lines(log) == ["release ", f"acquire {job1}", f"release {job1}"]


async def test_process_049_pending_release_fires_on_shutdown(tmp_path: Path) -> None:
    await scenario_pending_release_fires_on_shutdown(tmp_path)


async def scenario_startup_runs_release_hooks_before_the_first_poll(tmp_path: Path) -> None:
    marker = tmp_path / "released"
    # slow enough that a poll sent before the pass ended would be seen without the marker
    release = hook(tmp_path / "release.sh", f'sleep 0.5; touch "{marker}"')
    device = DeviceConfig(name="gpu0", on_release=release)
    seen: list[bool] = []

    def first_poll() -> bool:
        if run.ctrl.polls():
            seen.append(marker.exists())
            return True
        return False

    with trio.fail_after(30):
        async with worker_on_sim(tmp_path, [device]) as run:
            await run.ctrl.wait_for(lambda: run.worker.registrations >= 1, timeout=10)
            assert not run.ctrl.polls()
            await run.ctrl.wait_for(first_poll, timeout=10)
            assert seen == [True]


async def test_process_050_startup_runs_release_hooks_before_the_first_poll(tmp_path: Path) -> None:
    await scenario_startup_runs_release_hooks_before_the_first_poll(tmp_path)
