"""worker-process.md §11 R123–R124 (the recovery claim at registration) and X128–X131
(worker-level supervision), through the real worker against the simulated controller
(the ``fleet_worker`` fixture of fleet_trio.sim.pytest_plugin)."""

from __future__ import annotations

import os
from typing import Any

import pytest
import trio

import fleet_trio.worker.worker as worker_module
from fleet_trio.proc import RecoveryProof
from fleet_trio.proc.procfs import Predicate, read_proc_stat
from fleet_trio.sim.harness import WorkerHandle
from fleet_trio.worker.client import Assignment
from fleet_trio.worker.worker import HOLD_COMMAND, Worker, job_environment
from tests.helpers import GPUBOX, HOST, PY, config, dev, until_terminal


def _only_the_worker(predicate: Predicate, stop_at_first: bool) -> tuple[list[int], bool]:
    """A ``/proc`` scan that sees nothing but this (the worker's) process."""
    st = read_proc_stat(os.getpid())
    return ([st.pid] if st is not None and predicate(st) else []), True


@pytest.fixture
def scan_sees_only_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    real = worker_module.gather_recovery_proof

    async def gather(self_pid: int, **kw: Any) -> RecoveryProof:
        return await real(self_pid, scan=_only_the_worker, **kw)

    monkeypatch.setattr(worker_module, "gather_recovery_proof", gather)


async def test_process_123_registration_sends_a_proving_survivor_check(
    scan_sees_only_the_worker: None, fleet_worker: WorkerHandle
) -> None:
    ctrl, worker = fleet_worker.controller, fleet_worker.worker
    with trio.fail_after(20):
        body = ctrl.registrations()[0]
        assert body["recovery"] == {"survivors_checked": True}
        reg = await worker.build_registration()
        assert reg.recovery == {"survivors_checked": True}
        assert RecoveryProof(survivors_checked=True).proves


@pytest.mark.parametrize(
    "fleet_worker_config", [{**GPUBOX, "require_manual_clear": True}], ids=["manual-clear"]
)
async def test_process_124_manual_clear_sends_no_recovery_key(
    scan_sees_only_the_worker: None, fleet_worker: WorkerHandle
) -> None:
    ctrl = fleet_worker.controller
    assert "recovery" not in ctrl.registrations()[0]


async def test_process_128_stop_while_a_job_runs_reports_killed_and_returns(
    fleet_worker: WorkerHandle, sleeping_job: str
) -> None:
    ctrl, worker, job = fleet_worker.controller, fleet_worker.worker, sleeping_job
    with trio.fail_after(20):
        t0 = trio.current_time()
        worker.request_shutdown("test: stop while a job runs")
        await ctrl.wait_for(lambda: ctrl.statuses(job) == ["running", "killed"], timeout=10)
        await ctrl.wait_for(lambda: not worker.supervised(), timeout=10)
        assert trio.current_time() - t0 < 10


async def test_process_129_kill_from_the_poll_answer_kills_the_job(
    fleet_worker: WorkerHandle, sleeping_job: str
) -> None:
    ctrl, job = fleet_worker.controller, sleeping_job
    with trio.fail_after(20):
        assert ctrl.kill(job)
        assert await until_terminal(ctrl, job) == ["running", "killed"]
        assert ctrl.status_reports(job)[-1].reason == "cancelled"


async def test_process_130_hold_runs_the_sleeper_not_its_command(
    fleet_worker: WorkerHandle,
) -> None:
    hold = Assignment(
        job_id="h1",
        device_id=f"{HOST}:gpu0",
        command=("/no/such/binary-rc-hold-test",),
        max_runtime_seconds=1,
        kind="hold",
    )
    spec = Worker(config("http://127.0.0.1:1")).job_spec(hold)
    assert spec.command == HOLD_COMMAND and spec.max_runtime == 1.0
    ctrl = fleet_worker.controller
    with trio.fail_after(20):
        job = ctrl.submit(dev("gpu0"), kind="hold", max_runtime_seconds=1)
        assert await until_terminal(ctrl, job) == ["running", "killed"]
        assert ctrl.status_reports(job)[-1].reason.startswith("max_runtime exceeded")


async def test_process_131_cuda_visible_devices_from_the_device_name(
    fleet_worker: WorkerHandle,
) -> None:
    def env_for(device: str, env: dict[str, str] | None = None) -> dict[str, str]:
        a = Assignment(job_id="j", device_id=device, command=("true",), env=env or {})
        return job_environment(a)

    assert env_for("gpubox:gpu1")["CUDA_VISIBLE_DEVICES"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in env_for("gpubox:mydevice")
    assert env_for("gpubox:gpu1", {"CUDA_VISIBLE_DEVICES": "0,1"})["CUDA_VISIBLE_DEVICES"] == "0,1"
    show = [PY, "-c", "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES', '-'))"]
    ctrl = fleet_worker.controller
    with trio.fail_after(20):
        job = ctrl.submit(dev("gpu1"), show)
        await until_terminal(ctrl, job)
        assert ctrl.logs(job) == b"1\n"
        kept = ctrl.submit(dev("gpu1"), show, env={"CUDA_VISIBLE_DEVICES": "0,1"})
        await until_terminal(ctrl, kept)
        assert ctrl.logs(kept) == b"0,1\n"
