"""More worker-protocol.md §15 items: the recovery claim as registered, the controller-side (X)
facts our worker's messages produce (registration, heartbeats, polls, reports), execution
outcomes as they reach the wire. The sim controller records what was sent; real processes."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import httpx
import pytest
import trio

from fleet_trio.proc.procfs import ProcStat, pid_alive
from fleet_trio.proc.recovery import RecoveryProof, recovery_proof_for
from fleet_trio.sim import SimController
from fleet_trio.sim.controller import SimError
from fleet_trio.worker.client import (
    INSTANCE_HEADER,
    ControllerClient,
    ControllerError,
    DeviceDecl,
    StatusReport,
)
from fleet_trio.worker.worker import WorkerTimings
from tests.helpers import (
    AUTH,
    DEAD_BEEF,
    FAST,
    HOST,
    PY,
    REG,
    FakeScan,
    controller,
    dev,
    gone_within,
    marker_ready,
    running,
    scenario_pause,
    start_marked,
    stop,
    until_terminal,
    with_running_job,
)

# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


async def _registered_recovery(proof: RecoveryProof) -> dict[str, object]:
    """Register with ``proof`` as the worker would; the registration JSON the sim received."""
    async with controller() as (ctrl, client):
        await client.register(attrs.evolve(REG, recovery=proof.to_wire()))
        body: dict[str, object] = ctrl.registrations()[-1]
        return body


async def _raw(
    client: ControllerClient,
    method: str,
    path: str,
    *,
    content: bytes = b"",
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    async with httpx.AsyncClient() as raw:
        return await raw.request(
            method,
            client.base_url + path,
            content=content,
            headers=AUTH if headers is None else headers,
        )


def _status_bodies(ctrl: SimController, job: str) -> list[dict[str, object]]:
    return [r.json() for r in ctrl.requests("status") if r.path == f"/v1/jobs/{job}/status"]


# --------------------------------------------------------------------------------------------
# §15.2 Registration and identity: the recovery claim as it goes on the wire
# --------------------------------------------------------------------------------------------


async def _scan_marked(marker: str, *, as_worker: bool = False) -> tuple[FakeScan, RecoveryProof]:
    """A process carrying ``RC_JOB_ID=marker`` alone in a fake namespace, scanned once its
    environ shows the marker by this process (``as_worker``: by itself, playing the worker),
    then killed and reaped: the scan (still seeing its pid) and the proof it gave."""
    proc = await start_marked(marker)
    scan = FakeScan(ProcStat(pid=proc.pid))
    try:
        await marker_ready(proc.pid, marker)
        proof = recovery_proof_for(proc.pid if as_worker else os.getpid(), scan=scan)
    finally:
        await stop(proc)
    return scan, proof


async def test_protocol_023_clean_scan_registers_survivors_checked() -> None:
    # Not PID 1, no RC_JOB_ID process, every environ readable (a fake namespace of one clean
    # process: the real /proc may hold other test runs' jobs or unreadable environs).
    with trio.fail_after(10):
        _, proof = await _scan_marked("")
        body = await _registered_recovery(proof)
        assert body["recovery"] == {"survivors_checked": True}


async def test_protocol_025_manual_clear_suppresses_provable_isolation() -> None:
    scan = FakeScan(ProcStat(pid=1, state="S"))
    assert recovery_proof_for(1, scan=scan) == RecoveryProof(isolated=True)
    proof = recovery_proof_for(1, require_manual_clear=True, scan=scan)
    with trio.fail_after(10):
        assert "recovery" not in await _registered_recovery(proof)


async def test_protocol_026_pid_one_alone_registers_isolated() -> None:
    proof = recovery_proof_for(1, scan=FakeScan(ProcStat(pid=1, state="S")))
    with trio.fail_after(10):
        assert (await _registered_recovery(proof))["recovery"] == {"isolated": True}


async def test_protocol_027_pid_one_with_company_claims_no_isolation() -> None:
    scan = FakeScan(ProcStat(pid=1, state="S"), ProcStat(pid=42, state="S"))
    proof = recovery_proof_for(1, scan=scan)
    assert not proof.isolated
    with trio.fail_after(10):
        recovery = (await _registered_recovery(proof)).get("recovery")
    assert not isinstance(recovery, dict) or "isolated" not in recovery


def test_protocol_028_not_pid_one_never_scans_for_isolation() -> None:
    from fleet_trio.proc.recovery import isolated_pid_namespace

    scan = FakeScan(ProcStat(pid=4242, state="S"))
    assert isolated_pid_namespace(4242, scan) is False
    assert scan.calls == 0
    assert recovery_proof_for(4242, scan=FakeScan()).isolated is False


async def test_protocol_029_unreadable_proc_claims_nothing() -> None:
    proof = recovery_proof_for(1, scan=FakeScan(scanned=False))
    assert proof == RecoveryProof()
    with trio.fail_after(10):
        assert "recovery" not in await _registered_recovery(proof)


async def test_protocol_030_live_marked_process_is_a_survivor() -> None:
    with trio.fail_after(10):
        _, found = await _scan_marked(DEAD_BEEF)
        assert found == RecoveryProof(survivors_checked=True, survivors_found=True)
        body = await _registered_recovery(found)
        assert body["recovery"] == {"survivors_checked": True, "survivors_found": True}


async def test_protocol_031_reaped_process_is_no_longer_a_survivor() -> None:
    with trio.fail_after(10):
        scan, found = await _scan_marked(DEAD_BEEF)
        assert found.survivors_found  # a survivor while it lived
        gone = recovery_proof_for(os.getpid(), scan=scan)
        assert gone == RecoveryProof(survivors_checked=True)
        assert (await _registered_recovery(gone))["recovery"] == {"survivors_checked": True}


async def test_protocol_032_own_pid_excluded_from_survivor_scan() -> None:
    with trio.fail_after(10):
        # The marked process plays the worker: its own marker does not count.
        _, proof = await _scan_marked(DEAD_BEEF, as_worker=True)
        assert (await _registered_recovery(proof))["recovery"] == {"survivors_checked": True}


async def test_protocol_033_unreadable_environ_claims_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import fleet_trio.proc.recovery as recovery

    def denied(pid: int) -> tuple[bytes | None, OSError | None]:
        return None, PermissionError(13, "Permission denied")

    monkeypatch.setattr(recovery, "_read_environ", denied)
    proof = recovery_proof_for(os.getpid(), scan=FakeScan(ProcStat(pid=1)))
    assert proof == RecoveryProof()
    with trio.fail_after(10):
        assert "recovery" not in await _registered_recovery(proof)


async def test_protocol_034_empty_rc_job_id_is_not_a_survivor() -> None:
    with trio.fail_after(10):
        _, proof = await _scan_marked("")
        assert proof == RecoveryProof(survivors_checked=True)


async def test_protocol_035_vanished_process_is_neither_survivor_nor_error() -> None:
    with trio.fail_after(10):
        proc = await trio.lowlevel.open_process(
            ["true"], env={**os.environ, "RC_JOB_ID": DEAD_BEEF}
        )
        await proc.wait()  # gone (reaped) before the scan looks at it
        proof = recovery_proof_for(os.getpid(), scan=FakeScan(ProcStat(pid=proc.pid)))
        assert proof == RecoveryProof(survivors_checked=True)


# --------------------------------------------------------------------------------------------
# §15.2 (X) what the controller does with our registrations
# --------------------------------------------------------------------------------------------


async def test_protocol_038_declared_ceiling_enforced_and_removable() -> None:
    with trio.fail_after(10):
        async with controller() as (ctrl, client):
            await client.register(REG)  # gpu0 declares max_runtime_seconds 3600
            assert ctrl.registrations()[0]["devices"][0] == {
                "name": "gpu0",
                "max_runtime_seconds": 3600,
            }
            with pytest.raises(SimError, match="runtime_above_ceiling"):
                ctrl.submit(dev("gpu0"), ["true"], max_runtime_seconds=3601)
            await client.register(
                attrs.evolve(REG, devices=(DeviceDecl("gpu0"), DeviceDecl("gpu1")))
            )
            assert ctrl.registrations()[1]["devices"][0] == {"name": "gpu0"}
            assert ctrl.device(dev("gpu0")).max_runtime_seconds == 0
            ctrl.submit(dev("gpu0"), ["true"], max_runtime_seconds=7200)


async def test_protocol_039_reregistering_with_running_job_quarantines() -> None:
    with trio.fail_after(10):
        async with with_running_job() as (ctrl, client, _, job):
            assert ctrl.job(job).state == "running"
            await client.register(attrs.evolve(REG, recovery=None))
            d = ctrl.device(dev("gpu0"))
            assert (d.state, d.reason) == ("unhealthy", "registration")
            j = ctrl.job(job)
            assert j.state == "lost" and j.kill_reason == "worker re-registered"
            assert j.lease_expires is None


async def test_protocol_040_oversized_sheet_413_creates_nothing() -> None:
    with trio.fail_after(10):
        async with controller() as (ctrl, client):
            reg = attrs.evolve(REG, sheet="x" * (64 * 1024 + 1))
            body = client.converter.unstructure(reg)
            r = await _raw(
                client, "POST", "/v1/workers/register", content=json.dumps(body).encode()
            )
            assert r.status_code == 413
            assert r.json()["error"] == "sheet_too_large"
            assert not ctrl.workers()
            assert not ctrl.devices()


async def test_protocol_041_fault_survives_reboot_reregistration() -> None:
    with trio.fail_after(10):
        async with controller() as (ctrl, client):
            await client.register(REG)
            assert await client.report_fault(dev("gpu0"), "xid 79")
            await client.register(attrs.evolve(REG, boot_id="b-2"))
            assert ctrl.registrations()[1]["boot_id"] == "b-2"
            d = ctrl.device(dev("gpu0"))
            assert (d.state, d.reason, d.detail) == ("unhealthy", "fault", "xid 79")
            assert ctrl.device(dev("gpu1")).state == "ready"


@asynccontextmanager
async def _reregistered_isolated() -> AsyncIterator[tuple[SimController, str]]:
    """A job running on gpu0, a controller restart mid-lease, then the worker re-registers
    claiming ``isolated`` (items 42, 44): the controller and the job."""
    with trio.fail_after(10):
        async with with_running_job() as (ctrl, client, _, job):
            ctrl.restart()
            await scenario_pause(0.05, why="the cut connections close before the next request")
            reg = attrs.evolve(REG, recovery=RecoveryProof(isolated=True).to_wire())
            for _ in range(3):  # a pooled connection cut by restart() may fail once
                with contextlib.suppress(ControllerError):
                    await client.register(reg)
                    break
            assert ctrl.registrations()[-1]["recovery"] == {"isolated": True}
            yield ctrl, job


async def test_protocol_042_isolated_reregistration_frees_the_device() -> None:
    async with _reregistered_isolated() as (ctrl, job):
        j = ctrl.job(job)
        assert (j.state, j.kill_reason) == ("lost", "worker re-registered")
        assert ctrl.device(dev("gpu0")).state == "ready"
        assert ctrl.device(dev("gpu1")).state == "ready"


async def test_protocol_044_recovery_emits_one_device_recovered_event() -> None:
    async with _reregistered_isolated() as (ctrl, _):
        recovered = [e for e in ctrl.events() if e.kind == "device_recovered"]
        assert len(recovered) == 1  # one per returned device (gpu1 never left ready)
        assert recovered[0].device_id == dev("gpu0")
        assert recovered[0].detail == "registration isolated"  # old reason, then the proof


@pytest.mark.parametrize(
    "claim", [None, {"survivors_checked": True, "survivors_found": True}], ids=["none", "found"]
)
async def test_protocol_043_no_proof_or_survivors_stays_unhealthy(
    claim: dict[str, bool] | None,
) -> None:
    with trio.fail_after(10):
        async with with_running_job() as (ctrl, client, _, job):
            await client.register(attrs.evolve(REG, recovery=claim))
            assert ctrl.job(job).state == "lost"
            d = ctrl.device(dev("gpu0"))
            assert (d.state, d.reason) == ("unhealthy", "registration")
            assert not [e for e in ctrl.events() if e.kind == "device_recovered"]


# --------------------------------------------------------------------------------------------
# §15.4 Heartbeats (X)
# --------------------------------------------------------------------------------------------


async def test_protocol_063_heartbeat_without_body_is_200() -> None:
    with trio.fail_after(10):
        async with controller() as (ctrl, client):
            worker_id = await client.register(REG)
            r = await _raw(client, "POST", f"/v1/workers/{worker_id}/heartbeat")
            assert r.status_code == 200
            assert r.content == b""
            assert r.headers[INSTANCE_HEADER]
            assert ctrl.requests("heartbeat")[-1].outcome == "handled"


async def test_protocol_065_heartbeat_does_not_lift_fault() -> None:
    with trio.fail_after(10):
        async with with_running_job() as (ctrl, client, worker_id, job):
            assert await client.report_fault(dev("gpu0"), "ecc error")
            assert await client.heartbeat(worker_id, [job])
            assert ctrl.heartbeats()[-1] == {"running_job_ids": [job]}
            d = ctrl.device(dev("gpu0"))
            assert (d.state, d.reason) == ("unhealthy", "fault")


# --------------------------------------------------------------------------------------------
# §15.5 Polling (X)
# --------------------------------------------------------------------------------------------


async def test_protocol_067_idle_long_poll_answers_204_after_wait() -> None:
    with trio.fail_after(10):
        async with controller() as (_, client):
            worker_id = await client.register(REG)
            t0 = trio.current_time()
            r = await _raw(client, "GET", f"/v1/workers/{worker_id}/assignments?wait=300ms")
            assert trio.current_time() - t0 >= 0.29
            assert r.status_code == 204 and r.content == b""
            assert "content-type" not in r.headers


async def test_protocol_068_job_handed_out_once_and_running() -> None:
    with trio.fail_after(10):
        async with with_running_job() as (ctrl, client, worker_id, job):
            assert ctrl.job(job).state == "running"
            again = await client.poll(worker_id, 0.2)
            assert again.assignments == () and again.kills == ()
            assert ctrl.polls()[-1].query.startswith("wait=")


async def _kill_during_a_parked_poll(
    ctrl: SimController, client: ControllerClient, worker_id: str, job: str
) -> tuple[httpx.Response, float]:
    """A poll parked for up to 20 s, and ``job`` killed 0.2 s into it (items 76, 77): the
    poll's answer and how long it took."""
    async with trio.open_nursery() as nursery:

        async def kill_soon() -> None:
            await scenario_pause(0.2, why="the kill comes while the poll is parked")
            ctrl.kill(job)

        nursery.start_soon(kill_soon)
        t0 = trio.current_time()
        r = await _raw(client, "GET", f"/v1/workers/{worker_id}/assignments?wait=20s")
        return r, trio.current_time() - t0


async def test_protocol_076_kill_ends_a_parked_poll() -> None:
    with trio.fail_after(30):
        async with with_running_job() as (ctrl, client, worker_id, job):
            r, took = await _kill_during_a_parked_poll(ctrl, client, worker_id, job)
            assert took < 10  # the kill ended it, long before its 20 s window
            assert r.status_code == 200
            assert r.json() == {"assignments": [], "kills": [job]}


async def test_protocol_077_next_poll_after_the_kill_is_204() -> None:
    with trio.fail_after(30):
        async with with_running_job() as (ctrl, client, worker_id, job):
            r, _ = await _kill_during_a_parked_poll(ctrl, client, worker_id, job)
            assert r.json()["kills"] == [job]  # delivered once; the next poll waits its window
            t0 = trio.current_time()
            r2 = await _raw(client, "GET", f"/v1/workers/{worker_id}/assignments?wait=400ms")
            assert r2.status_code == 204
            assert trio.current_time() - t0 >= 0.39


async def test_protocol_078_delivered_kill_offered_again_after_redelivery_window() -> None:
    with trio.fail_after(10):
        async with with_running_job(kill_redelivery=30.0) as (ctrl, client, worker_id, job):
            ctrl.kill(job)
            first = await client.poll(worker_id, 1.0)
            assert first.kills == (job,)
            # Within the window the kill is not offered again.
            assert (await client.poll(worker_id, 0.1)).kills == ()
            # The sim checks redelivery when a poll wakes (as the reference does): poll anew
            # once the window has passed.
            ctrl.age_kill(job, 30.0)
            second = await client.poll(worker_id, 0.5)
            assert second.kills == (job,)


# --------------------------------------------------------------------------------------------
# §15.6 Status reports and kills (X)
# --------------------------------------------------------------------------------------------


async def test_protocol_085_status_from_other_worker_is_403() -> None:
    with trio.fail_after(10):
        async with with_running_job() as (ctrl, client, _, job):
            other = await client.register(attrs.evolve(REG, host="otherbox", devices=()))
            body = client.converter.unstructure(StatusReport(other, "succeeded", 0))
            r = await _raw(
                client, "POST", f"/v1/jobs/{job}/status", content=json.dumps(body).encode()
            )
            assert r.status_code == 403
            assert r.json()["error"] == "not_job_owner"
            assert ctrl.job(job).state == "running"
            assert ctrl.device(dev("gpu0")).state == "busy"
            assert ctrl.statuses(job) == []


async def test_protocol_086_status_for_unknown_job_is_404() -> None:
    with trio.fail_after(10):
        async with controller() as (_, client):
            worker_id = await client.register(REG)
            body = json.dumps({"worker_id": worker_id, "state": "failed", "exit_code": 1})
            r = await _raw(client, "POST", "/v1/jobs/nosuchjob/status", content=body.encode())
            assert r.status_code == 404
            assert r.json()["message"] == "job not found"


async def test_protocol_087_fault_auth_and_unknown_device() -> None:
    with trio.fail_after(10):
        async with controller() as (ctrl, client):
            ctrl.tokens["ctok"] = "client"
            ctrl.tokens["atok"] = "admin"
            await client.register(REG)
            body = json.dumps({"reason": "xid"}).encode()

            def auth(tok: str) -> dict[str, str]:
                return {"Authorization": f"Bearer {tok}"}

            path0 = f"/v1/devices/{dev('gpu0')}/fault"
            path1 = f"/v1/devices/{dev('gpu1')}/fault"
            r404 = await _raw(client, "POST", f"/v1/devices/{HOST}:nope/fault", content=body)
            assert r404.status_code == 404
            assert ctrl.device(dev("gpu0")).state == "ready"
            r403 = await _raw(client, "POST", path0, content=body, headers=auth("ctok"))
            r401 = await _raw(client, "POST", path0, content=body, headers=auth("bogus"))
            assert (r403.status_code, r401.status_code) == (403, 401)
            assert ctrl.device(dev("gpu0")).state == "ready"
            assert (
                await _raw(client, "POST", path1, content=body, headers=auth("atok"))
            ).status_code == 200
            assert await client.report_fault(dev("gpu0"), "xid 48")
            d = ctrl.device(dev("gpu0"))
            assert (d.state, d.reason, d.detail) == ("unhealthy", "fault", "xid 48")
            assert ctrl.faults(dev("gpu0")) == ["xid 48"]
            assert ctrl.device(dev("gpu1")).state == "unhealthy"


async def test_protocol_088_oversized_log_chunk_is_413_and_not_stored() -> None:
    with trio.fail_after(10):
        async with with_running_job() as (ctrl, client, _, job):
            chunk = b"x" * (1024 * 1024 + 1)
            r = await _raw(client, "POST", f"/v1/jobs/{job}/logs", content=chunk)
            assert r.status_code == 413
            assert r.json()["error"] == "chunk_too_large"
            assert ctrl.logs(job) == b""
            ok = await _raw(client, "POST", f"/v1/jobs/{job}/logs", content=b"x" * (1024 * 1024))
            assert ok.status_code == 200
            assert len(ctrl.logs(job)) == 1024 * 1024


# --------------------------------------------------------------------------------------------
# §15.7 Execution outcomes on the wire (real worker, real processes)
# --------------------------------------------------------------------------------------------

TRAP_EXIT0 = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
    "print('ready', flush=True)\n"
    "time.sleep(30)\n"
)
IGNORE_TERM = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(30)\n"
)
SHORT_GRACE = attrs.evolve(FAST, kill_grace=1.0)


async def test_protocol_090_sweep_spares_prefix_relatives() -> None:
    with trio.fail_after(20):
        async with running() as (ctrl, worker):
            job = ctrl.submit(dev("gpu0"), ["sleep", "0.6"])
            await ctrl.wait_for(lambda: job in worker.supervised() and ctrl.statuses(job))
            relatives = [await start_marked(v) for v in (job + "x", job[:-1], "x" + job)]
            try:
                assert await until_terminal(ctrl, job) == ["running", "succeeded"]
                await ctrl.wait_for(lambda: not worker.supervised())
                assert all(pid_alive(p.pid) for p in relatives)
                assert ctrl.status_reports(job)[-1].reason in (None, "")
            finally:
                for p in relatives:
                    await stop(p)


async def test_protocol_092_cancelled_job_trapping_term_exit0_is_killed_cancelled() -> None:
    with trio.fail_after(20):
        async with running() as (ctrl, _):
            job = ctrl.submit(dev("gpu0"), [PY, "-c", TRAP_EXIT0])
            await ctrl.wait_for(lambda: b"ready" in ctrl.logs(job))
            ctrl.kill(job)
            assert await until_terminal(ctrl, job) == ["running", "killed"]
            assert _status_bodies(ctrl, job)[-1] == {
                "worker_id": ctrl.status_reports(job)[-1].worker_id,
                "state": "killed",
                "exit_code": 0,
                "reason": "cancelled",
            }


async def test_protocol_093_cancel_racing_exit_is_never_silent_success() -> None:
    with trio.fail_after(20):
        async with running() as (ctrl, worker):
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", "sleep 0.3; exit 0"])
            await ctrl.wait_for(lambda: ctrl.statuses(job))
            await scenario_pause(0.28, why="the kill comes just before the job exits by itself")
            ctrl.kill(job)
            await until_terminal(ctrl, job)
            last = _status_bodies(ctrl, job)[-1]
            assert last["worker_id"] == worker.worker_id
            if last["state"] == "killed":
                assert last["reason"] == "cancelled"
            else:
                assert last == {"worker_id": worker.worker_id, "state": "succeeded", "exit_code": 0}


async def test_protocol_094_exited_background_child_is_not_a_straggler() -> None:
    with trio.fail_after(20):
        async with running() as (ctrl, worker):
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", "true & sleep 0.3; echo ok"])
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            bodies = _status_bodies(ctrl, job)
            assert bodies == [
                {"worker_id": worker.worker_id, "state": "running"},
                {"worker_id": worker.worker_id, "state": "succeeded", "exit_code": 0},
            ]


async def test_protocol_095_live_detached_group_member_reaped_and_killed() -> None:
    script = "sleep 30 </dev/null >/dev/null 2>&1 & echo child:$!"
    with trio.fail_after(20):
        async with running() as (ctrl, _):
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", script])
            assert await until_terminal(ctrl, job) == ["running", "killed"]
            last = _status_bodies(ctrl, job)[-1]
            assert last["state"] == "killed"
            assert last["reason"] == "stragglers reaped after exit"
            m = re.search(rb"child:(\d+)", ctrl.logs(job))
            assert m is not None
            assert await gone_within(int(m.group(1)), 2.0)


async def test_protocol_096_term_trapping_job_sigkilled_at_grace() -> None:
    assert WorkerTimings().kill_grace == 10.0
    with trio.fail_after(20):
        async with running(timings=SHORT_GRACE) as (ctrl, _):
            job = ctrl.submit(dev("gpu0"), [PY, "-c", IGNORE_TERM])
            await ctrl.wait_for(lambda: b"ready" in ctrl.logs(job))
            ctrl.kill(job)
            t0 = trio.current_time()
            assert await until_terminal(ctrl, job) == ["running", "killed"]
            elapsed = trio.current_time() - t0
            # at the 1 s grace, not before; bounded (slack for a loaded 2-core machine)
            assert 0.9 <= elapsed < 1.0 + 5.0
            last = _status_bodies(ctrl, job)[-1]
            assert (last["state"], last["reason"]) == ("killed", "cancelled")


async def test_protocol_097_cancel_kills_grandchild_ignoring_term() -> None:
    gc = (
        f'{PY} -c "import os,signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); '
        "print('child:%d' % os.getpid(), flush=True); time.sleep(30)\""
    )
    with trio.fail_after(20):
        async with running(timings=SHORT_GRACE) as (ctrl, _):
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", f"{gc} & wait"])
            await ctrl.wait_for(lambda: b"child:" in ctrl.logs(job))
            m = re.search(rb"child:(\d+)", ctrl.logs(job))
            assert m is not None
            ctrl.kill(job)
            assert await until_terminal(ctrl, job) == ["running", "killed"]
            assert _status_bodies(ctrl, job)[-1]["reason"] == "cancelled"
            assert await gone_within(int(m.group(1)), 2.0)


async def test_protocol_101_no_limits_job_runs_to_completion() -> None:
    with trio.fail_after(20):
        async with running() as (ctrl, worker):
            job = ctrl.submit(dev("gpu1"), ["sh", "-c", "sleep 1; echo done"])
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            assert ctrl.logs(job) == b"done\n"
            assert _status_bodies(ctrl, job)[-1] == {
                "worker_id": worker.worker_id,
                "state": "succeeded",
                "exit_code": 0,
            }


async def test_protocol_098_wall_clock_watchdog_kills_overrunning_job() -> None:
    with trio.fail_after(20):
        async with running() as (ctrl, worker):
            job = ctrl.submit(dev("gpu1"), ["sleep", "30"], max_runtime_seconds=1)
            assert await until_terminal(ctrl, job) == ["running", "killed"]
            final = _status_bodies(ctrl, job)[-1]
            assert final["worker_id"] == worker.worker_id
            assert "max_runtime" in str(final.get("reason", ""))
            assert "max_runtime" in (ctrl.job(job).kill_reason or "")


async def test_protocol_099_idle_watchdog_kills_silent_job_keeping_output() -> None:
    with trio.fail_after(20):
        async with running() as (ctrl, _):
            job = ctrl.submit(
                dev("gpu1"), ["sh", "-c", "echo before-silence; sleep 30"], idle_timeout_seconds=1
            )
            assert await until_terminal(ctrl, job) == ["running", "killed"]
            assert "idle" in (ctrl.job(job).kill_reason or "")
            assert ctrl.logs(job) == b"before-silence\n"


async def test_protocol_100_chatty_job_is_never_idle_tripped() -> None:
    chatty = ["sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do echo tick $i; sleep 0.3; done"]
    with trio.fail_after(30):
        async with running() as (ctrl, _):
            # a 3 s idle limit against a tick every 0.3 s: on a starved 2-core machine a tick
            # has reached the worker over a second late
            job = ctrl.submit(dev("gpu1"), chatty, idle_timeout_seconds=3)
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            assert _status_bodies(ctrl, job)[-1]["exit_code"] == 0
            assert ctrl.logs(job).count(b"tick") == 10


async def test_protocol_064_retention_unnamed_job_keeps_device_unknown_and_kill_finalizes() -> None:
    with trio.fail_after(10):
        async with with_running_job(retain_disconnected_jobs=True, heartbeat_timeout=0.2) as (
            ctrl,
            client,
            worker_id,
            job,
        ):
            gpu0 = dev("gpu0")
            await ctrl.wait_for(lambda: ctrl.device(gpu0).state == "unknown")
            assert await client.heartbeat(worker_id, [])  # back, but not naming the job
            assert ctrl.device(gpu0).state == "unknown"  # not promoted: no retained-job proof
            assert ctrl.job(job).state == "running"
            assert ctrl.kill(job)
            finalized = ctrl.job(job)
            assert finalized.state == "killed"  # finalized on the spot, no worker report
            assert ctrl.status_reports(job) == []
            assert ctrl.device(gpu0).state == "unknown"  # kept out of the pool


async def test_protocol_066_named_finalized_kill_stays_deliverable_until_unnamed() -> None:
    with trio.fail_after(10):
        # Long timers, aged on purpose: the reaper never acts between two steps of the test.
        async with with_running_job(
            retain_disconnected_jobs=True, heartbeat_timeout=30.0, kill_redelivery=30.0
        ) as (ctrl, client, worker_id, job):
            gpu0 = dev("gpu0")
            ctrl.silence(worker_id, 31.0)  # past the heartbeat timeout: the device is unknown
            assert ctrl.device(gpu0).state == "unknown"
            assert ctrl.kill(job) and ctrl.job(job).state == "killed"
            # the worker returns still naming the job: the device stays out, the kill is offered
            assert await client.heartbeat(worker_id, [job])
            assert ctrl.device(gpu0).state == "unknown"
            assert (await client.poll(worker_id, 0.05)).kills == (job,)
            assert (await client.poll(worker_id, 0.05)).kills == ()  # within the window
            ctrl.age_kill(job, 30.0)  # the redelivery window passes
            assert await client.heartbeat(worker_id, [job])
            assert (await client.poll(worker_id, 0.05)).kills == (job,)  # re-delivered
            # it stops naming the job: the flag is cleared, the device returns to the pool
            assert await client.heartbeat(worker_id, [])
            assert ctrl.device(gpu0).state == "ready"
            ctrl.age_kill(job, 30.0)  # the redelivery window passes
            assert (await client.poll(worker_id, 0.05)).kills == ()


async def test_protocol_103_watchdog_kill_emits_one_watchdog_trip_event() -> None:
    with trio.fail_after(20):
        async with running() as (ctrl, _):
            job = ctrl.submit(dev("gpu1"), ["sleep", "30"], max_runtime_seconds=1)
            assert await until_terminal(ctrl, job) == ["running", "killed"]
            trips = [e for e in ctrl.events() if e.kind == "watchdog_trip"]
            assert len(trips) == 1
            assert (trips[0].job_id, trips[0].device_id) == (job, dev("gpu1"))
