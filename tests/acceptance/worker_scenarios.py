"""The lease-hook and verify scenarios of the whole worker against the simulated controller,
shared by the worker-process.md §11 items (``test_process_hooks.py``,
``test_process_worker_verify.py``) and the worker-protocol.md §15.9 items that restate them
(``test_protocol_hooks.py``).

* Hook scripts: :func:`hook` writes a ``#!/bin/sh`` file; ``LOG_EVENT`` appends
  ``"$RC_EVENT $RC_JOB_ID"`` to a log; :func:`read_lines` / :func:`read_text` read it back.
* :class:`HostHooks` driven directly: :func:`host_config`, :func:`serving`,
  :func:`linger_hooks`, :func:`acquire`, :func:`job`.
* The whole worker on the sim: :func:`worker_on_sim` (a :class:`WorkerRun`),
  :func:`logging_worker`, :func:`failing_verify_worker`, :func:`report_order`.
* ``scenario_*``: one checklist behaviour each, the test of a process item and of a protocol
  item: each test module binds the scenario to its item's name (``test_process_045_… =
  scenario_…``), so the body lives once and every item keeps a named test.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio

from fleet_trio import proc
from fleet_trio.durations import MILLISECOND, SECOND
from fleet_trio.sim import SimController, serve_controller
from fleet_trio.worker.client import Assignment
from fleet_trio.worker.config import DeviceConfig, HooksConfig, WorkerConfig
from fleet_trio.worker.hooks import HostHooks
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
    """The items' 500 ms linger is 60 s here, so that job2 surely comes inside job1's linger
    whatever the machine's load; the one release left pending (job2's) is then fired by the
    shutdown (§4.7, as in :func:`scenario_pending_release_fires_on_shutdown`)."""
    async with logging_worker(tmp_path, 60 * SECOND) as (ctrl, run, log):
        job1 = ctrl.submit(GPU0, ["true"])
        job2 = ctrl.submit(GPU0, ["true"])
        assert await until_terminal(ctrl, job1) == ["running", "succeeded"]
        assert await until_terminal(ctrl, job2) == ["running", "succeeded"]
        await wait_until(lambda: run.worker.supervised() == [], timeout=5)
        assert read_lines(log) == ["release ", f"acquire {job1}"]
        assert await run.stop(within=15) < 15
        assert read_lines(log) == ["release ", f"acquire {job1}", f"release {job2}"]


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


async def scenario_pending_release_fires_on_shutdown(tmp_path: Path) -> None:
    async with logging_worker(tmp_path, 60 * SECOND) as (ctrl, run, log):
        job1 = await succeeded(ctrl, GPU0)
        await wait_until(lambda: run.worker.supervised() == [], timeout=5)
        assert read_lines(log) == ["release ", f"acquire {job1}"]
        assert await run.stop(within=15) < 15
        assert read_lines(log) == ["release ", f"acquire {job1}", f"release {job1}"]


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


VRAM_COMPLAINT = "72G still allocated"


VRAM_FAULT = f"verify failed: 10-vram-free.sh: exited 1: {VRAM_COMPLAINT}"


TERMINAL = frozenset({"succeeded", "failed", "killed", "lost"})


def failing_verify(tmp_path: Path) -> Path:
    verify_dir = tmp_path / "verify.d"
    verify_dir.mkdir()
    hook(verify_dir / "10-vram-free.sh", f'echo "{VRAM_COMPLAINT}" >&2; exit 1')
    return verify_dir


@contextlib.asynccontextmanager
async def failing_verify_worker(tmp_path: Path) -> AsyncIterator[tuple[SimController, WorkerRun]]:
    """A registered worker on the sim whose one verify script always fails: the controller and
    the worker. The block is guarded by a 30 s ``fail_after``."""
    with trio.fail_after(30):
        async with worker_on_sim(tmp_path, verify_dir=failing_verify(tmp_path)) as run:
            await run.ready()
            yield run.ctrl, run


def report_order(ctrl: SimController, job_id: str) -> list[str]:
    """Handled fault reports and terminal status reports for ``job_id``, in arrival order."""
    order: list[str] = []
    for r in ctrl.requests():
        if r.outcome != "handled":
            continue
        if r.endpoint == "fault":
            order.append("fault")
        elif r.endpoint == "status" and job_id in r.path and r.json()["state"] in TERMINAL:
            order.append("terminal")
    return order


async def scenario_verify_failure_faults_the_device_before_the_terminal_report(
    tmp_path: Path,
) -> None:
    async with failing_verify_worker(tmp_path) as (ctrl, _):
        job_id = await succeeded(ctrl, GPU0)
        assert report_order(ctrl, job_id) == ["fault", "terminal"]
        assert ctrl.faults(GPU0) == [VRAM_FAULT]


async def scenario_verify_failure_ordering_holds_on_shutdown(tmp_path: Path) -> None:
    async with failing_verify_worker(tmp_path) as (ctrl, run):
        job_id = ctrl.submit(GPU0, ["sleep", "5"])
        await ctrl.wait_for(
            lambda: ctrl.statuses(job_id) == ["running"] and job_id in run.worker.supervised(),
            timeout=10,
        )
        await scenario_pause(0.2, why="the job runs a moment before the shutdown")
        assert await run.stop(within=10) < 10
        assert ctrl.statuses(job_id) == ["running", "killed"]
        assert report_order(ctrl, job_id) == ["fault", "terminal"]
        assert ctrl.faults(GPU0)[0].startswith("verify failed: 10-vram-free.sh: ")


async def scenario_verify_failure_quarantines_then_a_passing_script_returns_it(
    tmp_path: Path,
) -> None:
    verify_dir = failing_verify(tmp_path)
    with trio.fail_after(30):
        async with worker_on_sim(tmp_path, verify_dir=verify_dir) as run:
            await run.ready()
            ctrl = run.ctrl
            job_id = ctrl.submit(GPU0, ["sh", "-c", "echo job-ran; exit 0"])
            at_terminal: list[tuple[str, str, str, object]] = []

            def terminal() -> bool:
                job = ctrl.job(job_id)
                if job.state not in TERMINAL:
                    return False
                device = ctrl.device(GPU0)
                at_terminal.append((job.state, device.state, device.reason, job.lease_expires))
                return True

            await ctrl.wait_for(terminal, timeout=10)
            # at the moment it is terminal the device is already quarantined, with no holder
            assert at_terminal == [("succeeded", "unhealthy", "fault", None)]
            assert ctrl.job(job_id).exit_code == 0
            assert ctrl.statuses(job_id) == ["running", "succeeded"]
            assert ctrl.logs(job_id) == b"job-ran\n"

            events = [e for e in ctrl.events() if e.kind == "verify_failed"]
            assert len(events) == 1
            assert events[0].device_id == GPU0
            assert "10-vram-free.sh" in events[0].detail
            assert VRAM_COMPLAINT in events[0].detail

            # the quarantined device is not handed out (the sim has no no-wait submit)
            next_job = ctrl.submit(GPU0, ["sh", "-c", "echo next-ran"])
            await quiet_for(0.5, reason="the quarantined device is not handed out")
            assert ctrl.job(next_job).state == "queued"
            assert ctrl.statuses(next_job) == []

            # a passing script, then an admin clear: the next job runs and the device returns
            hook(verify_dir / "10-vram-free.sh", "exit 0")
            ctrl.clear(GPU0)
            assert await until_terminal(ctrl, next_job) == ["running", "succeeded"]
            assert ctrl.logs(next_job) == b"next-ran\n"
            await ctrl.wait_for(lambda: ctrl.device(GPU0).state == "ready", timeout=5)
            assert ctrl.faults(GPU0) == [VRAM_FAULT]


async def scenario_verify_failed_event_names_the_job(tmp_path: Path) -> None:
    async with failing_verify_worker(tmp_path) as (ctrl, _):
        job_id = await succeeded(ctrl, GPU0)
        events = [e for e in ctrl.events() if e.kind == "verify_failed"]
        assert [(e.device_id, e.job_id) for e in events] == [(GPU0, job_id)]
