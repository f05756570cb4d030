"""worker-protocol.md §15 items (beyond 1–20, see test_protocol_config.py) that the worker
client and lifecycle cover: the real worker against the simulated controller, real processes."""

from __future__ import annotations

import pathlib
import random

import attrs
import httpx
import trio

from fleet_trio.proc import boot_id
from fleet_trio.worker.client import (
    INSTANCE_HEADER,
    Assignment,
    ContactTracker,
    ControllerClient,
    PollAnswer,
    StatusReport,
    Timings,
)
from fleet_trio.worker.config import DeviceConfig, WorkerConfig
from fleet_trio.worker.worker import Worker
from tests.helpers import (
    FAST,
    HOST,
    PY,
    REG,
    controller,
    dev,
    fleet_trio_process,
    quiet_for,
    running,
    scenario_pause,
    sim,
    sim_worker,
    until_terminal,
    wait_until,
    write_worker_yaml,
)

# --------------------------------------------------------------------------------------------
# §15.2 Registration and identity
# --------------------------------------------------------------------------------------------


def test_protocol_021_boot_id_is_stable_without_newline() -> None:
    assert boot_id() == boot_id()
    assert "\n" not in boot_id()


async def test_protocol_022_first_registration_carries_sheets_and_labels(
    tmp_path: pathlib.Path,
) -> None:
    base = tmp_path
    (base / "host.d").mkdir()
    (base / "host.md").write_text("# gpubox\n")
    (base / "host.d" / "gpu0.md").write_text("# gpu0\n")
    cfg = WorkerConfig(
        controller_url="http://x",
        host=HOST,
        devices=(DeviceConfig(name="gpu0", labels={"rack": "r3"}), DeviceConfig(name="gpu1")),
        sheet_dir=str(base),
    )
    reg = await Worker(cfg).build_registration()
    assert reg.host == HOST
    assert reg.sheet == "# gpubox\n"
    assert reg.device_sheets == {"gpu0": "# gpu0\n", "gpu1": ""}
    assert reg.declared_labels == {"gpu0": {"rack": "r3"}, "gpu1": None}
    assert reg.labels is not None and reg.labels[""]["kernel"]


async def test_protocol_024_require_manual_clear_omits_recovery() -> None:
    cfg = WorkerConfig(controller_url="http://x", host=HOST, devices=(), require_manual_clear=True)
    with trio.fail_after(10):
        async with controller() as (ctrl, client):
            reg = await Worker(cfg).build_registration()
            assert reg.recovery is None
            await client.register(reg)
            assert "recovery" not in ctrl.registrations()[0]


async def test_protocol_036_bad_token_401_client_token_403() -> None:
    with trio.fail_after(10):
        async with controller() as (ctrl, client):
            ctrl.tokens["ctok"] = "client"
            async with httpx.AsyncClient() as raw:
                url = client.base_url + "/v1/workers/register"
                body = b'{"host":"h","devices":[]}'
                r1 = await raw.post(url, content=body, headers={"Authorization": "Bearer bogus"})
                r2 = await raw.post(url, content=body, headers={"Authorization": "Bearer ctok"})
                r3 = await raw.post(url, content=body, headers={"Authorization": "wtok"})
            assert (r1.status_code, r2.status_code, r3.status_code) == (401, 403, 401)


async def test_protocol_037_registration_creates_ready_devices() -> None:
    with trio.fail_after(10):
        async with controller() as (ctrl, client):
            assert await client.register(REG)
            assert ctrl.device(f"{HOST}:gpu0").state == "ready"
            assert ctrl.device(f"{HOST}:gpu1").state == "ready"


async def test_protocol_045_instance_header_on_every_response() -> None:
    with trio.fail_after(10):
        async with controller() as (_, client):
            async with httpx.AsyncClient() as raw:
                r1 = await raw.get(client.base_url + "/v1/workers/x/assignments?wait=1ms")
                r2 = await raw.get(client.base_url + "/nope")
            assert r1.status_code == 401
            assert r1.headers[INSTANCE_HEADER] == r2.headers[INSTANCE_HEADER] != ""


# --------------------------------------------------------------------------------------------
# §15.3 Reconnection (the tracker, then the loop)
# --------------------------------------------------------------------------------------------


def _tracker(*seen: tuple[float, str | None], **kw: float) -> ContactTracker:
    """A tracker (seeded jitter) that has observed these ``(time, instance)`` exchanges."""
    t = ContactTracker(rng=random.Random(1), **kw)
    for at, instance in seen:
        t.observe(at, instance)
    return t


def test_protocol_046_first_exchange_owes_nothing() -> None:
    t = _tracker((0.0, "A"))
    assert not t.owed


def test_protocol_047_ninety_second_gap_owes_nothing() -> None:
    t = _tracker((0.0, "A"), (90.0, "A"))
    assert not t.owed


def test_protocol_048_five_minute_gap_owes_after_jitter() -> None:
    t = _tracker((0.0, "A"), (300.0, "A"), jitter_window=30.0)
    assert t.owed and t.due_at is not None
    jitter = t.due_at - 300.0
    assert 0 <= jitter < 30.0
    if jitter > 0:
        assert not t.due(300.0 + jitter / 2, busy=False)
    assert t.due(300.0 + jitter, busy=False)


def test_protocol_049_changed_identity_owes() -> None:
    t = _tracker((0.0, "A"), (1.0, "B"))
    assert t.owed


def test_protocol_050_missing_header_is_not_a_change() -> None:
    t = _tracker((0.0, "A"), (1.0, None), (2.0, ""))
    assert not t.owed and t.instance == "A"
    t.observe(3.0, "A")
    assert not t.owed


def test_protocol_051_nothing_owed_after_success() -> None:
    t = _tracker((0.0, "A"), (1.0, "B"), jitter_window=0.0)
    assert t.due(1.0, busy=False)
    t.attempt(1.0)
    t.observe(1.1, "B")
    t.succeeded()
    t.observe(2.0, "B")
    assert not t.owed


def test_protocol_052_failed_attempt_owed_again_after_a_minute() -> None:
    t = _tracker((0.0, "A"), (1.0, "B"), jitter_window=0.0)
    t.attempt(1.0)
    assert t.owed
    assert not t.due(60.9, busy=False)
    assert t.due(61.0, busy=False)


def test_protocol_053_jitter_varies_within_window() -> None:
    t = _tracker(jitter_window=30.0)
    draws = {t.jitter() for _ in range(50)}
    assert len(draws) > 10
    assert all(0 <= d <= 30.0 for d in draws)


def test_protocol_054_shipped_thresholds() -> None:
    t = ContactTracker()
    assert (t.silence, t.jitter_window, t.retry_pacing) == (300.0, 30.0, 60.0)
    from fleet_trio.worker.worker import WorkerTimings

    w = WorkerTimings()
    assert (w.reregister_silence, w.reregister_jitter, w.reregister_pacing) == (300, 30, 60)


def test_protocol_055_header_name() -> None:
    from fleet_trio.sim import INSTANCE_HEADER as SIM_HEADER

    assert INSTANCE_HEADER == SIM_HEADER == "Rc-Controller-Instance"


async def test_protocol_056_identity_change_reregisters_identically() -> None:
    with trio.fail_after(20):
        async with running(manual_clear=True) as (ctrl, _):
            ctrl.restart()
            await ctrl.wait_for(lambda: len(ctrl.registrations()) >= 2, timeout=10)
            first, second = ctrl.registrations()[:2]
            for key in ("host", "boot_id", "recovery", "devices"):
                assert first.get(key) == second.get(key)


async def test_protocol_057_short_outage_does_not_reregister() -> None:
    with trio.fail_after(20):
        async with running() as (ctrl, _):
            ctrl.drop_next("assignments", count=2)
            ctrl.drop_next("heartbeat", count=2)
            await quiet_for(1.0, reason="a short outage does not make the worker re-register")
            assert len(ctrl.registrations()) == 1


async def test_protocol_058_long_silence_reregisters() -> None:
    timings = attrs.evolve(FAST, reregister_silence=0.4, poll_error_delay=0.05)
    with trio.fail_after(20):
        async with running(timings=timings) as (ctrl, worker):
            instance = worker.tracker.instance
            ctrl.drop_next("assignments", count=14)
            ctrl.drop_next("heartbeat", count=8)
            await ctrl.wait_for(lambda: len(ctrl.registrations()) >= 2, timeout=10)
            assert worker.tracker.instance == instance == ctrl.instances[-1]


async def test_protocol_059_busy_worker_defers_reregistration() -> None:
    with trio.fail_after(20):
        async with running() as (ctrl, worker):
            job = ctrl.submit(dev("gpu0"), ["sleep", "1.5"])
            await ctrl.wait_for(lambda: job in worker.supervised() and ctrl.statuses(job))
            ctrl.restart()
            await quiet_for(0.8, reason="a restart alone does not make the worker re-register")
            assert len(ctrl.registrations()) == 1
            assert worker.tracker.owed
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            await ctrl.wait_for(lambda: len(ctrl.registrations()) >= 2, timeout=10)


# --------------------------------------------------------------------------------------------
# §15.4 Heartbeats, §15.5 polling, §15.6 reports and kills
# --------------------------------------------------------------------------------------------


async def test_protocol_060_heartbeats_name_exactly_the_running_job() -> None:
    with trio.fail_after(20):
        async with running() as (ctrl, worker):
            job = ctrl.submit(dev("gpu0"), ["sleep", "0.8"])
            await ctrl.wait_for(
                lambda: any(h.get("running_job_ids") == [job] for h in ctrl.heartbeats())
            )
            await until_terminal(ctrl, job)
            await ctrl.wait_for(lambda: not worker.supervised())
            n = len(ctrl.heartbeats())
            await ctrl.wait_for(lambda: len(ctrl.heartbeats()) >= n + 2)
            assert ctrl.heartbeats()[-1] == {}
            assert all(h.get("running_job_ids", [job]) == [job] for h in ctrl.heartbeats())


async def test_protocol_069_resent_assignment_runs_once() -> None:
    with trio.fail_after(20):
        async with running() as (ctrl, worker):
            job = ctrl.submit(dev("gpu0"), [PY, "-c", "print('ran')"])
            await until_terminal(ctrl, job)
            await ctrl.wait_for(lambda: not worker.supervised())
            again = Assignment(job_id=job, device_id=dev("gpu0"), command=(PY, "-c", "1"))
            for _ in range(3):
                assert worker.handle_answer(PollAnswer(assignments=(again,))) is False
            await quiet_for(0.3, reason="a re-sent assignment does not run again")
            assert ctrl.statuses(job) == ["running", "succeeded"]
            assert ctrl.logs(job) == b"ran\n"


async def test_protocol_070_idle_poll_floor() -> None:
    timings = attrs.evolve(FAST, idle_poll_floor=0.25, poll_wait=0.001)
    with trio.fail_after(20):
        async with running(timings=timings) as (ctrl, _):
            n = len(ctrl.polls())
            await scenario_pause(1.2, why="polls are counted over 1.2 s")
            assert len(ctrl.polls()) - n < 20


async def test_protocol_071_pre_killed_assignment_never_runs() -> None:
    with trio.fail_after(20):
        async with running() as (ctrl, worker):
            ctrl.latency("assignments", 0.4)
            n = len(ctrl.polls())
            await ctrl.wait_for(lambda: len(ctrl.polls()) > n + 1, timeout=5)
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", "echo RAN"])
            ctrl.kill(job)
            await ctrl.wait_for(lambda: ctrl.statuses(job), timeout=5)
            ctrl.latency("assignments", 0)
            await quiet_for(0.3, reason="the job killed before it ran never runs")
            reports = ctrl.status_reports(job)
            assert [r.state for r in reports] == ["killed"]
            assert reports[0].worker_id == worker.worker_id
            assert reports[0].reason == "killed before this worker started it"
            assert reports[0].exit_code is None
            assert ctrl.logs(job) == b""


async def _scenario_072_073() -> None:
    with trio.fail_after(20):
        async with running() as (ctrl, worker):
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", "echo hello; exit 7"])
            assert await until_terminal(ctrl, job) == ["running", "failed"]
            reports = ctrl.status_reports(job)
            assert reports[-1].exit_code == 7
            assert {r.worker_id for r in reports} == {worker.worker_id}
            assert ctrl.logs(job) == b"hello\n"


async def test_protocol_074_cuda_visible_devices() -> None:
    script = "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES', 'unset'))"
    with trio.fail_after(20):
        async with running(devices=("gpu1", "mydevice")) as (ctrl, _):
            j1 = ctrl.submit(dev("gpu1"), [PY, "-c", script])
            j2 = ctrl.submit(dev("mydevice"), [PY, "-c", script])
            await until_terminal(ctrl, j1)
            j3 = ctrl.submit(dev("gpu1"), [PY, "-c", script], env={"CUDA_VISIBLE_DEVICES": "0,1"})
            await until_terminal(ctrl, j2)
            await until_terminal(ctrl, j3)
            assert (ctrl.logs(j1), ctrl.logs(j2), ctrl.logs(j3)) == (b"1\n", b"unset\n", b"0,1\n")


async def test_protocol_075_hold_runs_own_sleeper() -> None:
    with trio.fail_after(20):
        async with running() as (ctrl, _):
            job = ctrl.submit(dev("gpu0"), kind="hold", max_runtime_seconds=1)
            assert await until_terminal(ctrl, job) == ["running", "killed"]
            assert "max_runtime exceeded" in ctrl.status_reports(job)[-1].reason


async def test_protocol_079_kill_during_sleep() -> None:
    with trio.fail_after(20):
        async with running() as (ctrl, worker):
            job = ctrl.submit(dev("gpu0"), ["sleep", "30"])
            await ctrl.wait_for(lambda: job in worker.supervised() and ctrl.statuses(job))
            ctrl.kill(job)
            assert await until_terminal(ctrl, job) == ["running", "killed"]


async def test_protocol_080_terminal_report_500_retried() -> None:
    with trio.fail_after(20):
        async with running() as (ctrl, worker):
            job = ctrl.submit(dev("gpu0"), ["sleep", "0.3"])
            await ctrl.wait_for(lambda: job in worker.supervised() and ctrl.statuses(job))
            ctrl.fail_next("status", status=500, count=3)
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]


async def test_protocol_081_blackholed_terminal_report_bounded() -> None:
    timings = Timings(report_attempt_timeout=0.2, report_backoff=(0.2, 0.4), patience=1.5)
    with trio.fail_after(10):
        async with controller(timings) as (ctrl, client):
            ctrl.latency("status", 60.0)
            t0 = trio.current_time()
            assert not await client.report_terminal("j", StatusReport("w", "failed", 1))
            assert trio.current_time() - t0 < 1.5 + 0.2 + 1.0 + 0.4 + 0.5


async def test_protocol_082_fault_503_twice_then_ok() -> None:
    with trio.fail_after(10):
        async with controller() as (ctrl, client):
            await client.register(REG)
            ctrl.fail_next("fault", status=503, count=2)
            assert await client.report_fault(f"{HOST}:gpu0", "acquire hook failed: x")
            assert len(ctrl.requests("fault")) == 3


async def test_protocol_083_fault_404_made_once() -> None:
    with trio.fail_after(10):
        async with controller() as (ctrl, client):
            await client.register(REG)
            assert not await client.report_fault(f"{HOST}:nope", "boom")
            assert len(ctrl.requests("fault")) == 1


async def test_protocol_091_self_sigkill_reports_137() -> None:
    with trio.fail_after(20):
        async with running() as (ctrl, _):
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", "kill -9 $$"])
            assert await until_terminal(ctrl, job) == ["running", "killed"]
            report = ctrl.status_reports(job)[-1]
            assert (report.exit_code, report.reason) == (137, "signal: killed")


# --------------------------------------------------------------------------------------------
# §15.8 Shutdown
# --------------------------------------------------------------------------------------------


async def test_protocol_104_cancelled_worker_waits_for_job_reports() -> None:
    from fleet_trio.worker.worker import serve_worker

    with trio.fail_after(20):
        ctrl = sim()
        async with trio.open_nursery() as nursery:
            worker = await sim_worker(nursery, ctrl)
            returned = trio.Event()
            scope = trio.CancelScope()

            async def run_worker() -> None:
                with scope:
                    await serve_worker(worker)
                returned.set()

            nursery.start_soon(run_worker)
            await ctrl.wait_for(lambda: worker.registrations >= 1)
            job = ctrl.submit(dev("gpu0"), ["sleep", "5"])
            await ctrl.wait_for(lambda: job in worker.supervised() and ctrl.statuses(job))
            scope.cancel()
            await returned.wait()
            assert ctrl.statuses(job) == ["running", "killed"]
            assert {r.worker_id for r in ctrl.status_reports(job)} == {worker.worker_id}
            nursery.cancel_scope.cancel()


async def test_protocol_105_idle_worker_stops_promptly() -> None:
    with trio.fail_after(20):
        async with running() as (_, worker):
            t0 = trio.current_time()
            worker.request_shutdown("test")
        assert trio.current_time() - t0 < 2.0


async def test_client_strips_trailing_slash() -> None:
    client = ControllerClient("http://h:1/", "t")
    assert client.base_url == "http://h:1"
    await client.aclose()


async def test_protocol_089_setsid_escapee_swept_job_succeeds() -> None:
    script = "setsid sleep 60 >/dev/null 2>&1 < /dev/null & echo started"
    with trio.fail_after(30):
        async with running() as (ctrl, _):
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", script])
            assert await until_terminal(ctrl, job, within=20) == ["running", "succeeded"]
            report = ctrl.status_reports(job)[-1]
            assert (report.exit_code, report.reason) == (0, "")
            from fleet_trio.proc.procfs import job_env_id, list_pids

            pids = list_pids() or []
            assert not [p for p in pids if job_env_id(p)[0] == job]


async def test_protocol_129_labels_pushed_to_the_labels_route() -> None:
    timings = attrs.evolve(FAST, probe_interval=0.3)
    with trio.fail_after(20):
        async with running(timings=timings) as (ctrl, _):
            await ctrl.wait_for(lambda: ctrl.label_pushes(), timeout=5)
            push = ctrl.label_pushes()[0]
            assert push["host"] == HOST
            assert push["devices"] == ["gpu0", "gpu1"]
            assert push["labels"][""]
            assert "boot_id" not in push and "recovery" not in push
            assert len(ctrl.registrations()) == 1


async def _scenario_104_105(
    tmp_path: pathlib.Path,
) -> None:
    import os
    import subprocess

    from fleet_trio.sim import serve_controller

    ctrl = sim()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(serve_controller, ctrl)
            cfg = write_worker_yaml(tmp_path, url)
            async with fleet_trio_process(
                ["worker", "-c", str(cfg)],
                stdin=subprocess.DEVNULL,
                env={**os.environ, "RC_REQUIRE_MANUAL_CLEAR": "1"},
            ):
                await ctrl.wait_for(lambda: ctrl.polls(), timeout=15)
                job = ctrl.submit(dev("gpu0"), ["sleep", "30"])
                await ctrl.wait_for(lambda: ctrl.statuses(job), timeout=10)
                await scenario_pause(0.3, why="the job runs a while before SIGTERM")
            assert ctrl.statuses(job) == ["running", "killed"]
            assert ctrl.status_reports(job)[-1].reason == "cancelled"
            nursery.cancel_scope.cancel()


async def test_protocol_062_named_job_keeps_its_lease(tmp_path: pathlib.Path) -> None:
    """The worker's heartbeats name the running job, and each one renews its lease: the expiry
    moves past the lease the job was assigned with, then forward again, while the job is held
    on a go-file; released, the job ends ``succeeded``, never ``lost``."""
    go = tmp_path / "go"
    ctrl = sim(lease_no_limit=5.0, lease_renewal=15.0)
    with trio.fail_after(30):
        async with running(ctrl) as (ctrl, _):
            job = ctrl.submit(
                dev("gpu0"), ["sh", "-c", f'while [ ! -e "{go}" ]; do sleep 0.05; done']
            )
            assigned = ctrl.job(job).lease_expires
            assert assigned is not None
            expiries = [assigned]

            def renewed_twice() -> bool:
                expiry = ctrl.job(job).lease_expires
                if expiry is not None and expiry > expiries[-1]:
                    expiries.append(expiry)
                return len(expiries) >= 3

            await wait_until(renewed_twice, timeout=20, what="two renewals of the job's lease")
            assert ctrl.job(job).state == "running"
            assert any(job in (beat or {}).get("running_job_ids", []) for beat in ctrl.heartbeats())
            go.touch()
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            assert ctrl.job(job).state == "succeeded"


async def test_protocol_062_unnamed_job_loses_its_lease() -> None:
    """The other half, on the controller's side: heartbeats that do not name the job leave its
    lease to expire; the job becomes ``lost`` and the device is quarantined."""
    with trio.fail_after(20):
        async with controller(lease_no_limit=1.0) as (ctrl, client):
            worker_id = await client.register(attrs.evolve(REG, recovery=None))
            job = ctrl.submit(dev("gpu1"), ["sleep", "30"])  # gpu1: no ceiling, lease 1 s
            assert [a.job_id for a in (await client.poll(worker_id, 0.5)).assignments] == [job]
            assert await client.heartbeat(worker_id, [])  # would renew it by 15 min if named
            await ctrl.wait_for(lambda: ctrl.job(job).state == "lost", timeout=10)
            assert ctrl.job(job).kill_reason == "lease expired"
            device = ctrl.device(dev("gpu1"))
            assert (device.state, device.reason) == ("unhealthy", "lease_expired")


async def test_protocol_084_terminal_report_frees_the_device() -> None:
    with trio.fail_after(20):
        async with running() as (ctrl, _):
            job = ctrl.submit(dev("gpu0"), ["sleep", "0.3"])
            await ctrl.wait_for(lambda: ctrl.device(dev("gpu0")).state == "busy")
            await until_terminal(ctrl, job)
            await ctrl.wait_for(lambda: ctrl.device(dev("gpu0")).state == "ready")


async def test_protocol_102_device_ceiling_kills_overrunning_job() -> None:
    one_second = DeviceConfig(name="gpu0", max_runtime=1_000_000_000)
    with trio.fail_after(20):
        async with running(devices=(one_second,)) as (ctrl, _):
            assert ctrl.registrations()[0]["devices"] == [
                {"name": "gpu0", "max_runtime_seconds": 1}
            ]
            job = ctrl.submit(dev("gpu0"), ["sleep", "30"])
            assert await until_terminal(ctrl, job) == ["running", "killed"]
            assert "max_runtime" in (ctrl.job(job).kill_reason or "")
            await ctrl.wait_for(lambda: ctrl.device(dev("gpu0")).state == "ready")


async def test_protocol_072_failing_job_output() -> None:
    """One scenario covers this item and its neighbour: ``_scenario_072_073``."""
    await _scenario_072_073()


async def test_protocol_073_reports_carry_worker_id() -> None:
    """One scenario covers this item and its neighbour: ``_scenario_072_073``."""
    await _scenario_072_073()


async def test_protocol_104_sigterm_kills_the_running_job_and_reports_it(
    tmp_path: pathlib.Path,
) -> None:
    """One scenario covers this item and its neighbour: ``_scenario_104_105``."""
    await _scenario_104_105(tmp_path)


async def test_protocol_105_worker_exits_zero_after_sigterm(
    tmp_path: pathlib.Path,
) -> None:
    """One scenario covers this item and its neighbour: ``_scenario_104_105``."""
    await _scenario_104_105(tmp_path)
