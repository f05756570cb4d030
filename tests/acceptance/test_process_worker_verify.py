"""worker-process.md §11 items that need the whole worker: S25 (the RC_JOB_ID sweep through a
real job) and V63, V64, V66 (verify failure ordering and quarantine, against the sim).

The worker is the real one (``serve_worker``, ``HostHooks``) with a ``verify_dir`` in
``tmp_path``; see ``worker_on_sim`` in ``test_process_hooks.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import trio

from fleet_trio.proc.procfs import job_env_id, list_pids, pid_alive
from fleet_trio.sim import SimController
from tests.acceptance.test_process_hooks import GPU0, WorkerRun, hook, worker_on_sim
from tests.helpers import gone_within, quiet_for, scenario_pause, succeeded, until_terminal

ESCAPEE = (
    "setsid sh -c 'echo $$ > {pidfile}; exec sleep 300' >/dev/null 2>&1 < /dev/null & "
    "while [ ! -s {pidfile} ]; do sleep 0.01; done; exit 0"
)
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


# --------------------------------------------------------------------------------------------
# S25
# --------------------------------------------------------------------------------------------


async def test_process_025_worker_sweeps_a_jobs_escapee_and_still_reports_success(
    tmp_path: Path,
) -> None:
    pidfile = tmp_path / "escapee.pid"
    job_id = ""
    try:
        with trio.fail_after(30):
            async with worker_on_sim(tmp_path, ["gpu0"]) as run:
                await run.ready()
                ctrl = run.ctrl
                job_id = ctrl.submit(GPU0, ["sh", "-c", ESCAPEE.format(pidfile=pidfile)])
                assert await until_terminal(ctrl, job_id, within=20) == ["running", "succeeded"]
                reports = ctrl.status_reports(job_id)
                assert [r.exit_code for r in reports if r.state in TERMINAL] == [0]
                assert reports[-1].reason == ""
                escapee = int(pidfile.read_text().strip())
                assert await gone_within(escapee, 5.0)
                assert not [p for p in list_pids() or [] if job_env_id(p)[0] == job_id]
    finally:
        if pidfile.exists() and pidfile.read_text().strip():
            pid = int(pidfile.read_text().strip())
            if pid_alive(pid) and job_id and job_env_id(pid)[0] == job_id:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)


# --------------------------------------------------------------------------------------------
# V63, V64
# --------------------------------------------------------------------------------------------


async def scenario_verify_failure_faults_the_device_before_the_terminal_report(
    tmp_path: Path,
) -> None:
    async with failing_verify_worker(tmp_path) as (ctrl, _):
        job_id = await succeeded(ctrl, GPU0)
        assert report_order(ctrl, job_id) == ["fault", "terminal"]
        assert ctrl.faults(GPU0) == [VRAM_FAULT]


async def test_process_063_verify_failure_faults_the_device_before_the_terminal_report(
    tmp_path: Path,
) -> None:
    await scenario_verify_failure_faults_the_device_before_the_terminal_report(tmp_path)


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


async def test_process_064_verify_failure_ordering_holds_on_shutdown(tmp_path: Path) -> None:
    await scenario_verify_failure_ordering_holds_on_shutdown(tmp_path)


# --------------------------------------------------------------------------------------------
# V66
# --------------------------------------------------------------------------------------------


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


async def test_process_066_verify_failure_quarantines_then_a_passing_script_returns_it(
    tmp_path: Path,
) -> None:
    await scenario_verify_failure_quarantines_then_a_passing_script_returns_it(tmp_path)


async def scenario_verify_failed_event_names_the_job(tmp_path: Path) -> None:
    async with failing_verify_worker(tmp_path) as (ctrl, _):
        job_id = await succeeded(ctrl, GPU0)
        events = [e for e in ctrl.events() if e.kind == "verify_failed"]
        assert [(e.device_id, e.job_id) for e in events] == [(GPU0, job_id)]


async def test_process_066_verify_failed_event_names_the_job(tmp_path: Path) -> None:
    await scenario_verify_failed_event_names_the_job(tmp_path)
