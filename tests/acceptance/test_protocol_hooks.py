"""worker-protocol.md §15.9: lease hooks and verify as the controller sees them (items 106–117).

Most items restate a worker-process.md §11 item that already runs the whole worker against the
simulated controller; such an item's test is the process item's scenario from
``worker_scenarios.py`` bound to the protocol item's name (the same behaviour, seen from the
protocol's checklist; pytest collects it under that name). Items 115–117 have bodies of their
own here.
"""

from __future__ import annotations

from pathlib import Path

import trio

from fleet_trio.durations import SECOND
from fleet_trio.worker.config import DeviceConfig, HooksConfig
from tests.acceptance import worker_scenarios as scenarios
from tests.acceptance.worker_scenarios import (
    GPU0,
    LOG_EVENT,
    hook,
    read_lines,
    worker_on_sim,
)
from tests.helpers import until_terminal, wait_until

test_protocol_106_release_armed_before_shutdown_fires_during_it = (
    scenarios.scenario_pending_release_fires_on_shutdown
)
test_protocol_107_shutdown_interrupting_acquire_reports_killed_once_no_fault = (
    scenarios.scenario_shutdown_during_acquire_cancels_without_a_fault
)
test_protocol_108_verify_fault_precedes_terminal_report_on_shutdown = (
    scenarios.scenario_verify_failure_ordering_holds_on_shutdown
)
test_protocol_109_acquire_failure_one_failed_status_one_fault_command_never_runs = (
    scenarios.scenario_acquire_failure_quarantines_the_device_and_skips_the_job
)
test_protocol_110_startup_release_pass_finishes_before_the_first_poll = (
    scenarios.scenario_startup_runs_release_hooks_before_the_first_poll
)
test_protocol_111_back_to_back_jobs_one_acquire_one_release_naming_job2 = (
    scenarios.scenario_back_to_back_jobs_through_the_worker
)
test_protocol_112_linger_elapsed_each_job_own_acquire_and_release = (
    scenarios.scenario_job_after_the_linger_through_the_worker
)
test_protocol_113_stale_release_never_fires_during_the_later_job = (
    scenarios.scenario_delayed_release_of_a_finished_job_never_fires_during_the_next
)
test_protocol_114_verify_failure_fault_before_terminal = (
    scenarios.scenario_verify_failure_faults_the_device_before_the_terminal_report
)


async def test_protocol_115_verify_script_sees_the_assignments_submitter(tmp_path: Path) -> None:
    seen = tmp_path / "submitter.txt"
    verify_dir = tmp_path / "verify.d"
    verify_dir.mkdir()
    hook(verify_dir / "10-who.sh", f'printf "%s" "$RC_SUBMITTER" > "{seen}"')
    with trio.fail_after(20):
        async with worker_on_sim(tmp_path, verify_dir=verify_dir) as run:
            await run.ready()
            job = run.ctrl.submit(GPU0, ["true"], submitter="alice@lab")
            assert await until_terminal(run.ctrl, job) == ["running", "succeeded"]
            assert seen.read_text() == "alice@lab"
            assert run.ctrl.faults(GPU0) == []


async def test_protocol_116_verify_failure_quarantines_and_event_names_device_job_script(
    tmp_path: Path,
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for part in (a, b):
        part.mkdir()
    await scenarios.scenario_verify_failure_quarantines_then_a_passing_script_returns_it(a)
    await scenarios.scenario_verify_failed_event_names_the_job(b)


async def test_protocol_117_hold_then_queued_job_inside_linger_one_acquire_one_release(
    tmp_path: Path,
) -> None:
    log = tmp_path / "hooks.log"
    script = hook(tmp_path / "hook.sh", LOG_EVENT.format(log=log))
    device = DeviceConfig(name="gpu0", on_acquire=script, on_release=script)
    with trio.fail_after(30):
        async with worker_on_sim(
            tmp_path, [device], hooks=HooksConfig(release_linger=2 * SECOND)
        ) as run:
            await run.ready()
            ctrl = run.ctrl
            held = ctrl.submit(GPU0, kind="hold", max_runtime_seconds=1)
            queued = ctrl.submit(GPU0, ["true"])
            assert ctrl.job(queued).state == "queued"  # behind the hold
            assert await until_terminal(ctrl, held) == ["running", "killed"]
            assert await until_terminal(ctrl, queued) == ["running", "succeeded"]
            await wait_until(lambda: f"release {queued}" in read_lines(log), timeout=10)
            assert read_lines(log) == ["release ", f"acquire {held}", f"release {queued}"]
