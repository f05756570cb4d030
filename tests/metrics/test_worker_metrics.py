"""``GET /metrics`` on a real worker's listener (``tail_listen``) against the sim controller,
scraped while a real job runs and after it ends."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from fleet_trio.worker.config import DeviceConfig, WorkerConfig
from fleet_trio.worker.worker import Worker
from tests.helpers import dev, logged, running, sim, until_terminal, wait_until
from tests.metrics.scrape import Samples, scrape, total, value

GPU0 = dev("gpu0")


def gated(gate: Path) -> list[str]:
    """A job that writes 1000 bytes, waits for ``gate`` to exist, then writes ``bye``."""
    script = (
        "head -c 999 /dev/zero | tr '\\0' x; echo; "
        f"while [ ! -e '{gate}' ]; do sleep 0.01; done; echo bye"
    )
    return ["sh", "-c", script]


def listening(token: str = "", **changes: Any) -> Callable[[WorkerConfig], WorkerConfig]:
    def configure(c: WorkerConfig) -> WorkerConfig:
        return attrs.evolve(c, tail_listen="127.0.0.1:0", tail_token=token, **changes)

    return configure


async def metrics_of(worker: Worker, **headers: str) -> Samples:
    assert worker.tail_url is not None
    async with httpx.AsyncClient(base_url=worker.tail_url, timeout=10) as client:
        return await scrape(client, **headers)


async def _beats(worker: Worker) -> float:
    return value(await metrics_of(worker), "fleet_trio_worker_heartbeats_total") or 0


async def test_counters_follow_a_real_job_on_the_worker(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running(configure=listening()) as (ctrl, worker):
            before = await metrics_of(worker)
            assert value(before, "fleet_trio_build_info", role="worker", version="0.1.0") == 1
            assert value(before, "fleet_trio_worker_jobs_running", device=GPU0) == 0
            assert value(before, "fleet_trio_worker_registrations_total") == 1
            ok = {"endpoint": "register", "code": "200"}
            assert value(before, "fleet_trio_controller_requests_total", **ok) == 1
            assert total(before, "fleet_trio_probe_passes_total") >= 1  # the registration's
            assert total(before, "fleet_trio_worker_jobs_finished_total") == 0
            contact = value(before, "fleet_trio_controller_last_contact_age_seconds")
            assert contact is not None and contact >= 0

            gate = tmp_path / "gate"
            job = ctrl.submit(GPU0, gated(gate))
            await ctrl.wait_for(lambda: "running" in ctrl.statuses(job), timeout=10)
            await wait_until(lambda: logged(worker.bus, job, 1000), what="1000 bytes logged")
            mid = await metrics_of(worker)
            assert value(mid, "fleet_trio_worker_jobs_running", device=GPU0) == 1
            assert value(mid, "fleet_trio_worker_jobs_running", device=dev("gpu1")) == 0
            assert total(mid, "fleet_trio_worker_jobs_finished_total") == 0
            assert value(mid, "fleet_trio_log_jobs", state="running") == 1
            log_bytes = value(mid, "fleet_trio_log_retained_bytes")
            assert log_bytes is not None and log_bytes >= 1000
            assert total(mid, "fleet_trio_log_bytes_total") >= 1000
            requests = "fleet_trio_controller_requests_total"
            polls_before = total(before, requests, endpoint="assignments")
            assert total(mid, requests, endpoint="assignments") > polls_before  # it came by poll

            gate.write_text("go")
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            after = await metrics_of(worker)
            assert value(after, "fleet_trio_worker_jobs_running", device=GPU0) == 0
            done = {"device": GPU0, "state": "succeeded"}
            assert value(after, "fleet_trio_worker_jobs_finished_total", **done) == 1
            assert value(after, "fleet_trio_worker_job_duration_seconds_count", **done) == 1
            assert (value(after, "fleet_trio_worker_job_duration_seconds_sum", **done) or 0) > 0
            assert value(after, "fleet_trio_sweeps_total") == 1  # the job's RC_JOB_ID sweep
            assert value(after, "fleet_trio_sweep_found_processes_total") == 0
            assert value(after, "fleet_trio_sweep_remaining_processes_total") == 0
            # the controller requests grew with the job: its running + terminal reports, logs
            status = total(after, "fleet_trio_controller_requests_total", endpoint="status")
            assert status >= 2
            assert total(after, "fleet_trio_controller_requests_total", endpoint="logs") >= 1
            # at least the log chunk of what the job printed after the gate, and the terminal
            # report (the running report and earlier chunks may precede `mid`)
            assert total(after, "fleet_trio_controller_request_duration_seconds_count") >= (
                total(mid, "fleet_trio_controller_request_duration_seconds_count") + 2
            )
            assert total(after, "fleet_trio_controller_request_errors_total") == 0
            assert (value(after, "fleet_trio_log_retained_bytes") or 0) >= log_bytes + 4
            assert value(after, "fleet_trio_log_jobs", state="ended") == 1
            # heartbeats every 0.1 s: the whole job can fit before the first one, so wait for it
            beat = await wait_until(lambda: _beats(worker), timeout=10, what="a heartbeat counted")
            assert beat >= 1
            assert value(await metrics_of(worker), "fleet_trio_worker_heartbeats_missed_total") == 0


async def test_missed_heartbeats_and_request_errors_by_endpoint() -> None:
    ctrl = sim()
    with trio.fail_after(30):
        async with running(ctrl, configure=listening()) as (ctrl, worker):
            handled = len(ctrl.heartbeats())
            ctrl.fail_next("heartbeat", 503, count=2)
            ctrl.drop_next("heartbeat")
            await ctrl.wait_for(lambda: len(ctrl.heartbeats()) > handled, timeout=10)
            samples = await metrics_of(worker)
            assert value(samples, "fleet_trio_worker_heartbeats_missed_total") == 3
            assert (value(samples, "fleet_trio_worker_heartbeats_total") or 0) >= 4
            errors = "fleet_trio_controller_request_errors_total"
            assert value(samples, errors, endpoint="heartbeat") == 3
            refused = {"endpoint": "heartbeat", "code": "503"}
            assert value(samples, "fleet_trio_controller_requests_total", **refused) == 2
            dropped = {"endpoint": "heartbeat", "code": "error"}
            assert value(samples, "fleet_trio_controller_requests_total", **dropped) == 1
            assert total(samples, errors, endpoint="assignments") == 0


async def test_hook_and_verify_outcomes(tmp_path: Path) -> None:
    hook = tmp_path / "acquire.sh"
    hook.write_text("#!/bin/sh\necho acquiring\n")
    verify_dir = tmp_path / "verify.d"
    verify_dir.mkdir()
    check = verify_dir / "10-check"
    check.write_text("#!/bin/sh\necho dirty >&2\nexit 1\n")
    for path in (hook, check):
        os.chmod(path, 0o755)
    devices = [DeviceConfig(name="gpu0", on_acquire=str(hook)), "gpu1"]
    configure = listening(verify_dir=str(verify_dir))
    with trio.fail_after(30):
        async with running(devices=devices, configure=configure) as (ctrl, worker):
            job = ctrl.submit(GPU0, ["true"])
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            samples = await metrics_of(worker)
            acquired = {"device": GPU0, "event": "acquire", "outcome": "ok"}
            assert value(samples, "fleet_trio_hook_runs_total", **acquired) == 1
            timed = {"device": GPU0, "event": "acquire"}
            assert value(samples, "fleet_trio_hook_duration_seconds_count", **timed) == 1
            failed = {"device": GPU0, "outcome": "failed"}
            assert value(samples, "fleet_trio_verify_passes_total", **failed) == 1
            assert value(samples, "fleet_trio_verify_duration_seconds_count", device=GPU0) == 1
            done = {"device": GPU0, "state": "succeeded"}
            assert value(samples, "fleet_trio_worker_jobs_finished_total", **done) == 1


async def test_worker_metrics_need_the_tail_token_when_set() -> None:
    with trio.fail_after(30):
        async with running(configure=listening(token="t0k")) as (_ctrl, worker):
            assert worker.tail_url is not None
            async with httpx.AsyncClient(base_url=worker.tail_url, timeout=10) as client:
                refused = await client.get("/metrics")
                assert refused.status_code == 401
                assert refused.json() == {"status": "error", "error": "unauthorized"}
            samples = await metrics_of(worker, Authorization="Bearer t0k")
            assert value(samples, "fleet_trio_worker_registrations_total") == 1
