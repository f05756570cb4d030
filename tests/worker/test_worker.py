"""The real worker as a trio task against the simulated controller, with real job processes.

Timers are shrunk (heartbeat 0.1 s, poll wait 0.5 s); every test runs under ``trio.fail_after``.
The harness (``running``, ``sim``, ``until_terminal``, ...) lives in ``tests/helpers.py``.
"""

from __future__ import annotations

import json
import pathlib

import attrs
import pytest
import trio

from fleet_trio.sim import SimController
from fleet_trio.worker.client import Assignment, StatusReport
from fleet_trio.worker.config import DeviceConfig
from fleet_trio.worker.worker import (
    effective_max_runtime,
    job_environment,
    serve_worker,
)
from tests.helpers import (
    FAST_CLIENT,
    HOST,
    PY,
    FakeHooks,
    dev,
    operated_job,
    quiet_for,
    running,
    running_with_hooks,
    scenario_pause,
    sim,
    sim_worker,
    start_worker,
    until_terminal,
    wait_until,
)

# --------------------------------------------------------------------------------------------
# Pure helpers
# --------------------------------------------------------------------------------------------


def test_job_environment_sets_markers_and_cuda_index() -> None:
    a = Assignment(job_id="j1", device_id="gpubox:gpu1", command=("x",), env={"FOO": "bar"})
    env = job_environment(a)
    assert env == {
        "FOO": "bar",
        "RC_JOB_ID": "j1",
        "RC_DEVICE": "gpubox:gpu1",
        "CUDA_VISIBLE_DEVICES": "1",
    }
    assert "CUDA_VISIBLE_DEVICES" not in job_environment(attrs.evolve(a, device_id="h:mydevice"))
    kept = job_environment(attrs.evolve(a, env={"CUDA_VISIBLE_DEVICES": "0,1"}))
    assert kept["CUDA_VISIBLE_DEVICES"] == "0,1"
    forced = job_environment(attrs.evolve(a, env={"RC_JOB_ID": "evil"}))
    assert forced["RC_JOB_ID"] == "j1"


@pytest.mark.parametrize(
    ("requested", "ceiling", "expected"),
    [(0, 0, 0), (10, 0, 10), (0, 60, 60), (100, 60, 60), (30, 60, 30)],
)
def test_device_ceiling_caps_the_assignment(requested: int, ceiling: int, expected: int) -> None:
    a = Assignment(job_id="j", device_id="h:gpu0", max_runtime_seconds=requested)
    assert effective_max_runtime(a, ceiling) == expected


# --------------------------------------------------------------------------------------------
# Lifecycle against the sim
# --------------------------------------------------------------------------------------------


async def test_register_heartbeat_and_successful_job() -> None:
    with trio.fail_after(20):
        async with running() as (ctrl, worker):
            reg = ctrl.registrations()[0]
            assert reg["host"] == HOST
            assert [d["name"] for d in reg["devices"]] == ["gpu0", "gpu1"]
            assert reg["labels"][""]["cpus"]
            await ctrl.wait_for(lambda: ctrl.heartbeats(), timeout=5)
            assert ctrl.heartbeats()[0] == {}
            job = ctrl.submit(dev("gpu0"), [PY, "-c", "print('one'); print('two')"])
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            report = ctrl.status_reports(job)[-1]
            assert report.exit_code == 0
            assert report.worker_id == worker.worker_id
            assert ctrl.logs(job) == b"one\ntwo\n"
            await ctrl.wait_for(lambda: worker.supervised() == [])


async def test_failing_job_reports_failed_with_exit_code() -> None:
    with trio.fail_after(20):
        async with running() as (ctrl, _):
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", "echo oops; exit 3"])
            assert await until_terminal(ctrl, job) == ["running", "failed"]
            assert ctrl.status_reports(job)[-1].exit_code == 3
            assert ctrl.logs(job) == b"oops\n"


async def test_start_failure_reports_failed_minus_one() -> None:
    with trio.fail_after(20):
        async with running() as (ctrl, _):
            job = ctrl.submit(dev("gpu0"), ["/nonexistent/binary"])
            assert await until_terminal(ctrl, job) == ["running", "failed"]
            report = ctrl.status_reports(job)[-1]
            assert report.exit_code == -1
            assert report.reason


async def test_kill_running_job() -> None:
    with trio.fail_after(20):
        async with running() as (ctrl, worker):
            job = ctrl.submit(dev("gpu0"), ["sleep", "30"])
            await ctrl.wait_for(lambda: job in worker.supervised() and ctrl.statuses(job))
            await scenario_pause(0.2, why="the job runs a moment before the kill")
            ctrl.kill(job)
            assert await until_terminal(ctrl, job) == ["running", "killed"]
            assert ctrl.status_reports(job)[-1].reason == "cancelled"


async def test_cuda_visible_devices_and_env() -> None:
    with trio.fail_after(20):
        async with running(devices=("gpu1", "mydevice")) as (ctrl, _):
            script = (
                "import os; "
                "print(os.environ.get('CUDA_VISIBLE_DEVICES', '-'), os.environ['RC_JOB_ID'])"
            )
            j1 = ctrl.submit(dev("gpu1"), [PY, "-c", script])
            j2 = ctrl.submit(dev("mydevice"), [PY, "-c", script])
            await until_terminal(ctrl, j1)
            await until_terminal(ctrl, j2)
            assert ctrl.logs(j1) == f"1 {j1}\n".encode()
            assert ctrl.logs(j2) == f"- {j2}\n".encode()


async def test_hold_runs_the_sleeper() -> None:
    with trio.fail_after(20):
        async with running() as (ctrl, _):
            job = ctrl.submit(dev("gpu0"), kind="hold", max_runtime_seconds=1)
            assert await until_terminal(ctrl, job) == ["running", "killed"]
            assert ctrl.status_reports(job)[-1].reason.startswith("max_runtime exceeded (1s)")


async def test_device_ceiling_applied_locally() -> None:
    ceiling = DeviceConfig(name="gpu0", max_runtime=1_000_000_000)
    with trio.fail_after(20):
        async with running(devices=(ceiling,)) as (ctrl, _):
            job = ctrl.submit(dev("gpu0"), ["sleep", "30"])
            assert await until_terminal(ctrl, job) == ["running", "killed"]
            assert "max_runtime exceeded" in ctrl.status_reports(job)[-1].reason


async def test_shutdown_with_running_job_reports_killed_and_returns() -> None:
    with trio.fail_after(20):
        ctrl = sim()
        async with trio.open_nursery() as nursery:
            worker = await sim_worker(nursery, ctrl)
            done = start_worker(nursery, worker)
            job = ""
            await ctrl.wait_for(lambda: worker.registrations >= 1)
            job = ctrl.submit(dev("gpu0"), ["sleep", "30"])
            await ctrl.wait_for(lambda: job in worker.supervised() and ctrl.statuses(job))
            t0 = trio.current_time()
            worker.request_shutdown("test")
            await done.wait()
            assert trio.current_time() - t0 < 4.0
            assert ctrl.statuses(job) == ["running", "killed"]
            assert ctrl.status_reports(job)[-1].reason == "cancelled"
            nursery.cancel_scope.cancel()


async def test_cancelled_worker_still_reports_killed() -> None:
    with trio.fail_after(20):
        ctrl = sim()
        async with trio.open_nursery() as nursery:
            worker = await sim_worker(nursery, ctrl)
            with trio.CancelScope() as scope:
                nursery.start_soon(ctrl.wait_for, lambda: False, 30.0)
                inner = trio.CancelScope()

                async def run_worker() -> None:
                    with inner:
                        await serve_worker(worker)

                nursery.start_soon(run_worker)
                await ctrl.wait_for(lambda: worker.registrations >= 1)
                job = ctrl.submit(dev("gpu0"), ["sleep", "5"])
                await ctrl.wait_for(lambda: job in worker.supervised() and ctrl.statuses(job))
                inner.cancel()
                await ctrl.wait_for(lambda: len(ctrl.statuses(job)) >= 2, timeout=10)
                scope.cancel()
            assert ctrl.statuses(job) == ["running", "killed"]
            nursery.cancel_scope.cancel()


async def test_startup_registration_is_retried() -> None:
    ctrl = sim()
    ctrl.fail_next("register", status=503, count=2)
    with trio.fail_after(20):
        async with running(ctrl) as (ctrl, worker):
            assert worker.registrations == 1
            assert len(ctrl.requests("register")) == 3


async def test_controller_restart_mid_job_reports_then_reregisters_when_idle() -> None:
    with trio.fail_after(30):
        async with running(manual_clear=True) as (ctrl, worker):
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", "echo start; sleep 1.5; echo end"])
            await ctrl.wait_for(lambda: job in worker.supervised() and ctrl.statuses(job))
            ctrl.restart(down_for=0.3)
            await until_terminal(ctrl, job)
            assert ctrl.statuses(job) == ["running", "succeeded"]
            assert ctrl.logs(job) == b"start\nend\n"
            await ctrl.wait_for(lambda: len(ctrl.registrations()) >= 2, timeout=10)
            second = [r for r in ctrl.requests("register") if r.outcome == "handled"][-1]
            # The second registration came after the terminal report: the worker was idle.
            report_at = [r for r in ctrl.requests("status") if r.outcome == "handled"][-1].at
            assert second.at > report_at
            first, again = ctrl.registrations()[0], ctrl.registrations()[-1]
            for key in ("host", "boot_id", "recovery", "devices"):
                assert first.get(key) == again.get(key)
            job2 = ctrl.submit(dev("gpu0"), ["true"])
            assert await until_terminal(ctrl, job2) == ["running", "succeeded"]


async def test_outage_during_terminal_report_loses_nothing() -> None:
    with trio.fail_after(30):
        async with running() as (ctrl, worker):
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", "echo a; sleep 0.6; echo b"])
            await ctrl.wait_for(lambda: job in worker.supervised() and ctrl.statuses(job))
            await ctrl.wait_for(lambda: ctrl.logs(job) == b"a\n")
            ctrl.fail_next("logs", status=503, count=3)
            ctrl.fail_next("status", status=503, count=3)
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            assert ctrl.logs(job) == b"a\nb\n"


def test_cli_check_prints_resolved_settings(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fleet_trio.cli import main

    path = tmp_path / "worker.yaml"
    path.write_text("controller_url: http://127.0.0.1:1/\ntoken: secret\ndevices:\n  - gpu3\n")
    assert main(["worker", "-c", str(path), "--check"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["controller_url"] == "http://127.0.0.1:1"
    assert summary["token"] == "(redacted)"
    assert summary["devices"][0]["cuda_visible_devices"] == "3"
    assert main(["worker", "-c", str(path) + ".missing", "--check"]) == 1


def test_cli_worker_default_config_path() -> None:
    from fleet_trio.cli import build_parser

    args = build_parser().parse_args(["worker"])
    assert args.config == "/etc/rc/worker.yaml"
    assert not args.check


def test_terminal_report_precedence() -> None:
    from fleet_trio.proc import Result
    from fleet_trio.worker.worker import terminal_report

    assert terminal_report("w", Result(exit_code=0)) == StatusReport("w", "succeeded", 0, "")
    assert terminal_report("w", Result(exit_code=7)) == StatusReport("w", "failed", 7, "")
    assert terminal_report("w", Result(exit_code=-1, err="start: x")) == StatusReport(
        "w", "failed", -1, "start: x"
    )
    killed = Result(exit_code=143, killed=True, reason="cancelled")
    assert terminal_report("w", killed) == StatusReport("w", "killed", 143, "cancelled")


async def test_hook_seams_in_execute_order() -> None:
    hooks = FakeHooks()
    with trio.fail_after(20):
        async with running_with_hooks(hooks) as (ctrl, _):
            job = ctrl.submit(dev("gpu0"), ["true"])
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            await ctrl.wait_for(lambda: len(hooks.calls) == 3 or None, timeout=5)
            assert hooks.calls == [("acquire", job), ("verify", job), ("release", job)]


async def test_failed_acquire_reports_failed_only_then_fault() -> None:
    hooks = FakeHooks(acquire_fails="exit status 3")
    with trio.fail_after(20):
        async with running_with_hooks(hooks) as (ctrl, _):
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", "echo RAN"])
            await ctrl.wait_for(lambda: ctrl.statuses(job) and ctrl.faults(dev("gpu0")))
            reports = ctrl.status_reports(job)
            assert [(r.state, r.exit_code) for r in reports] == [("failed", None)]
            assert reports[0].reason == "acquire hook failed: exit status 3"
            assert ctrl.faults(dev("gpu0")) == ["acquire hook failed: exit status 3"]
            assert ctrl.logs(job) == b""


async def test_failed_verify_faults_before_terminal_report() -> None:
    hooks = FakeHooks(verify_fails="verify failed: gpu-check: ecc errors")
    with trio.fail_after(20):
        async with running_with_hooks(hooks) as (ctrl, _):
            job = ctrl.submit(dev("gpu0"), ["true"])
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            fault = next(r for r in ctrl.requests("fault") if r.outcome == "handled")
            final = [r for r in ctrl.requests("status") if r.outcome == "handled"][-1]
            assert fault.seq < final.seq
            assert ctrl.faults(dev("gpu0")) == ["verify failed: gpu-check: ecc errors"]


class StampingHooks(FakeHooks):
    """FakeHooks that also note when verify ran and what the controller had seen by then."""

    def __init__(self, **kw: str | None) -> None:
        super().__init__(**kw)
        self.ctrl: SimController | None = None
        self.verify_at: float | None = None
        self.statuses_at_verify: list[str] | None = None

    async def verify(self, device_id: str, job: Assignment) -> str | None:
        assert self.ctrl is not None
        self.verify_at = trio.current_time()
        self.statuses_at_verify = self.ctrl.statuses(job.job_id)
        return await super().verify(device_id, job)


def _arrivals(ctrl: SimController, endpoint: str, job_id: str = "") -> list[float]:
    return [r.at for r in ctrl.requests(endpoint) if job_id in r.path and r.outcome == "handled"]


PATIENT_CLIENT = attrs.evolve(FAST_CLIENT, request_timeout=30.0, report_attempt_timeout=30.0)
"""Client timings under which a request the sim holds at a gate is waited for, not retried."""


async def test_running_report_overlaps_the_run_yet_leads_every_chunk_and_the_terminal() -> None:
    """Logs mode: the process runs (and verify starts) while the ``running`` report is still
    unanswered, yet the controller sees running → log chunks → terminal (§7.3 steps 3, 7, 9).
    The sim holds every status report until verify has run."""
    with trio.fail_after(45):
        hooks = StampingHooks()
        async with running_with_hooks(hooks, client_timings=PATIENT_CLIENT) as (ctrl, _):
            hooks.ctrl = ctrl
            ctrl.gate("status")
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", "echo out"])
            await wait_until(
                lambda: hooks.verify_at is not None,
                what="verify to run while the running report is unanswered",
            )
            assert hooks.statuses_at_verify == []
            # the running report, held (on a loaded machine it may reach the sim after verify)
            await wait_until(lambda: _arrivals(ctrl, "status", job), what="the running report")
            opened = trio.current_time()
            ctrl.open_gate("status")
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            (running_in, terminal_in) = _arrivals(ctrl, "status", job)
            logs_in = _arrivals(ctrl, "logs", job)
            assert logs_in and ctrl.logs(job) == b"out\n"
            # nothing was sent before the running report was answered
            assert running_in < opened <= min(logs_in)
            assert terminal_in >= max(logs_in)


async def test_verify_runs_beside_the_final_flush_and_its_fault_follows_the_flush() -> None:
    """The sim holds the job's log chunk: verify runs while it is unanswered, and the fault
    (then the terminal report) is sent only once it is answered."""
    with trio.fail_after(45):
        hooks = StampingHooks(verify_fails="verify failed: gpu-check: dirty")
        async with running_with_hooks(hooks, client_timings=PATIENT_CLIENT) as (ctrl, _):
            hooks.ctrl = ctrl
            ctrl.gate("logs")
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", "echo out"])
            await wait_until(
                lambda: hooks.verify_at is not None and _arrivals(ctrl, "logs", job),
                what="verify to run while the final flush is unanswered",
            )
            opened = trio.current_time()
            ctrl.open_gate("logs")
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            (log_in,) = _arrivals(ctrl, "logs", job)
            (fault_in,) = _arrivals(ctrl, "fault")
            terminal_in = _arrivals(ctrl, "status", job)[-1]
            assert log_in < opened <= fault_in <= terminal_in  # flush → fault → terminal


async def test_tty_job_through_the_worker_and_the_relay() -> None:
    """A ``stdio: tty`` assignment: the worker opens both relay halves, runs the shell under a
    PTY, the operator's typing reaches it, its output reaches the operator and never the log
    endpoint, and ``exit`` ends it ``succeeded``."""
    with trio.fail_after(20):
        async with running() as (ctrl, _):
            job, _ = await operated_job(
                ctrl, ["/bin/sh"], "tty", b"echo tty-$((6 * 7))\n", b"tty-42"
            )
            assert ctrl.logs(job) == b""


async def test_pipe_job_through_the_worker_sends_stderr_to_the_log() -> None:
    script = "cat; echo to-stderr >&2"
    with trio.fail_after(20):
        async with running() as (ctrl, _):
            typed = b"line-one\nline\rtwo\xffend\n"
            job, term = await operated_job(ctrl, ["sh", "-c", script], "pipe", typed, b"end\n")
            assert term.output() == typed
            await ctrl.wait_for(lambda: ctrl.logs(job) == b"to-stderr\n")


async def test_job_ending_during_outage_delivers_everything_after() -> None:
    with trio.fail_after(30):
        async with running() as (ctrl, worker):
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", "echo one; sleep 0.5; echo two"])
            await ctrl.wait_for(lambda: ctrl.logs(job) == b"one\n")
            await scenario_pause(
                0.1, why="the chunk's answer reaches the worker (a lost answer means one resend)"
            )
            ctrl.restart(down_for=1.5)
            await scenario_pause(1.0, why="the job ends while the controller is still down")
            assert job in worker.supervised()  # still named in heartbeats, report kept
            assert await until_terminal(ctrl, job, within=15) == ["running", "succeeded"]
            assert ctrl.logs(job) == b"one\ntwo\n"
            await ctrl.wait_for(lambda: not worker.supervised())
            await ctrl.wait_for(lambda: len(ctrl.registrations()) >= 2, timeout=10)


@pytest.mark.slow
async def test_outage_beyond_patience_gives_up_and_frees_the_worker() -> None:
    client_timings = attrs.evolve(FAST_CLIENT, patience=0.8)
    with trio.fail_after(30):
        async with running(client_timings=client_timings) as (ctrl, worker):
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", "sleep 0.3; echo late"])
            await ctrl.wait_for(lambda: job in worker.supervised() and ctrl.statuses(job))
            ctrl.restart(down_for=6.0)
            # given up (patience 0.8 s) before the controller is back (6 s: room for a loaded
            # machine to finish the job and spend the patience first)
            await wait_until(lambda: job not in worker.supervised(), timeout=5.0)
            await ctrl.wait_for(lambda: len(ctrl.registrations()) >= 2, timeout=10)
            assert ctrl.statuses(job) == ["running"]


async def test_wiped_controller_gets_a_new_registration_and_runs_jobs() -> None:
    with trio.fail_after(30):
        async with running() as (ctrl, worker):
            ctrl.restart(wipe=True)
            await ctrl.wait_for(lambda: len(ctrl.registrations()) >= 2, timeout=10)
            await ctrl.wait_for(lambda: ctrl.device(dev("gpu0")) is not None, timeout=5)
            job = ctrl.submit(dev("gpu0"), ["true"])
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            assert worker.registrations == 2


async def test_worker_acts_on_a_kill_for_a_job_the_controller_already_finalized() -> None:
    """Retention mode (§5.5): ``rc kill`` on a disconnected device finalizes the job at once and
    keeps the kill flag; the worker, still supervising the job, kills it when the kill arrives,
    sends its terminal report (a harmless 200), stops naming it, and the device returns."""
    ctrl = sim(retain_disconnected_jobs=True)
    with trio.fail_after(20):
        async with running(ctrl) as (ctrl, worker):
            job = ctrl.submit(dev("gpu0"), ["sleep", "30"])
            await ctrl.wait_for(lambda: ctrl.statuses(job) == ["running"])
            ctrl.silence(worker.worker_id, 31.0)  # the reaper marks the device unknown
            assert ctrl.device(dev("gpu0")).state == "unknown"
            assert ctrl.kill(job)
            assert ctrl.job(job).state == "killed" and ctrl.statuses(job) == ["running"]
            await ctrl.wait_for(lambda: ctrl.statuses(job) == ["running", "killed"])
            assert ctrl.status_reports(job)[-1].worker_id == worker.worker_id
            await ctrl.wait_for(lambda: ctrl.device(dev("gpu0")).state == "ready")
            assert all(job not in hb.get("running_job_ids", []) for hb in ctrl.heartbeats()[-1:])


async def test_bad_poll_answers_are_logged_and_skipped_never_crash_or_rerun(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Malformed JSON, wrong shapes, unknown fields and every kind of non-2xx answer on the
    poll: the worker logs, backs off and polls again; it never crashes and never runs a job
    twice (the good assignment after the garbage runs exactly once)."""
    bad_answers: list[tuple[int, bytes | None]] = [
        (200, b"{not json"),
        (200, b'{"assignments": "nope"}'),
        (200, b'{"assignments": [{"job_id": 7}]}'),
        (200, b"[]"),
        (400, None),
        (401, None),
        (404, None),
        (409, None),
        (500, None),
        (502, None),
        (503, None),
        (302, b""),
    ]
    with trio.fail_after(30):
        async with running() as (ctrl, worker):
            for status, body in bad_answers:
                ctrl.fail_next("assignments", status=status, body=body)
            n = len(ctrl.polls())
            await ctrl.wait_for(lambda: len(ctrl.polls()) >= n + len(bad_answers) + 1, timeout=20)
            assert "poll failed" in caplog.text
            # unknown fields in an otherwise good answer are ignored; the job runs once
            job = ctrl.submit(dev("gpu0"), [PY, "-c", "print('once')"])
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            assert ctrl.logs(job) == b"once\n"
            extra = json.dumps(
                {
                    "assignments": [{"job_id": job, "device_id": dev("gpu0"), "command": ["x"]}],
                    "surprise": {"new": "field"},
                }
            ).encode()
            ctrl.fail_next("assignments", status=200, body=extra)  # a re-send: must not rerun
            await ctrl.wait_for(lambda: ctrl.requests("assignments")[-1].outcome == "injected")
            await quiet_for(0.3, reason="a re-sent assignment does not run again")
            assert ctrl.statuses(job) == ["running", "succeeded"]
            assert worker.supervised() == []


@pytest.mark.slow  # 30 s of real time: the job is a real process living through the outage
async def test_controller_unreachable_30s_mid_job_loses_and_repeats_nothing() -> None:
    """The controller is down for 30 s while a job runs: the job keeps running, the output it
    printed during the outage and its terminal state arrive after the reconnect, in order, and
    nothing is reported twice."""
    script = "echo before; sleep 3; echo during; sleep 30; echo after"
    with trio.fail_after(60):
        async with running() as (ctrl, worker):
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", script])
            await ctrl.wait_for(lambda: ctrl.logs(job) == b"before\n")
            # The outage cuts every open connection without an answer: give the chunk's
            # answer its way back first (the sim records no fact for "answer delivered").
            await scenario_pause(0.2, why="the log chunk's answer reaches the worker")
            ctrl.restart(down_for=30.0)
            await quiet_for(29.0, reason="the job outlives 29 s of outage, still ours")
            assert job in worker.supervised()  # still running, still ours
            assert ctrl.statuses(job) == ["running"]
            assert await until_terminal(ctrl, job, within=20) == ["running", "succeeded"]
            assert ctrl.logs(job) == b"before\nduring\nafter\n"
            assert [r.state for r in ctrl.status_reports(job)] == ["running", "succeeded"]


async def test_a_swept_escapee_is_logged_as_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """worker-process.md §3.6: found (and nothing remaining) → a WARN line naming the pids."""
    caplog.set_level("WARNING", logger="fleet_trio.worker.worker")
    with trio.fail_after(30):
        async with running() as (ctrl, _worker):
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", "setsid sleep 300 & exit 0"])
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
    lines = [r for r in caplog.records if "outlived the group" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelname == "WARNING"
    assert job in lines[0].getMessage()
