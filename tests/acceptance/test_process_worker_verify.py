"""worker-process.md §11 items that need the whole worker: S25 (the RC_JOB_ID sweep through a
real job) and V63, V64, V66 (verify failure ordering and quarantine, against the sim).

The worker is the real one (``serve_worker``, ``HostHooks``) with a ``verify_dir`` in
``tmp_path``; see ``worker_on_sim`` in ``worker_scenarios.py``. V63–V66 are scenarios there that
a protocol item shares, each bound here to its process item's name.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import trio

from fleet_trio.proc.procfs import job_env_id, list_pids, pid_alive
from tests.acceptance import worker_scenarios as scenarios
from tests.acceptance.worker_scenarios import (
    GPU0,
    TERMINAL,
    worker_on_sim,
)
from tests.helpers import gone_within, until_terminal

ESCAPEE = (
    "setsid sh -c 'echo $$ > {pidfile}; exec sleep 300' >/dev/null 2>&1 < /dev/null & "
    "while [ ! -s {pidfile} ]; do sleep 0.01; done; exit 0"
)


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


test_process_063_verify_failure_faults_the_device_before_the_terminal_report = (
    scenarios.scenario_verify_failure_faults_the_device_before_the_terminal_report
)
test_process_064_verify_failure_ordering_holds_on_shutdown = (
    scenarios.scenario_verify_failure_ordering_holds_on_shutdown
)


# --------------------------------------------------------------------------------------------
# V66
# --------------------------------------------------------------------------------------------


test_process_066_verify_failure_quarantines_then_a_passing_script_returns_it = (
    scenarios.scenario_verify_failure_quarantines_then_a_passing_script_returns_it
)
test_process_066_verify_failed_event_names_the_job = (
    scenarios.scenario_verify_failed_event_names_the_job
)
