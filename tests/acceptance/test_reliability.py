"""worker-protocol.md §16: the reference's incidents, each turned into a requirement with a test.

Most requirements are already the subject of a checklist test; ``REQUIREMENTS`` names, per
incident, the tests that show fleet-trio meets it, and the first test below checks that every
named test exists (so a renamed or deleted test cannot silently leave an
incident uncovered). Requirements with no checklist item of their own get a test here.

Rows about lease hooks, probes and labels, verify scripts and the interactive relay belong to
the worker's host features and are listed in ``HOST_FEATURE_ROWS``; the glibc row is about the
reference's container image and has no counterpart in a Python package.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import trio

from tests.helpers import dev, running, until_terminal

ROOT = Path(__file__).resolve().parents[2]

REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "acfc274 never start a job id twice; a never-cleared started set": (
        "test_protocol_worker:test_protocol_069_resent_assignment_runs_once",
    ),
    "acfc274 shutdown kills and waits for jobs; reports on an uncancelled scope": (
        "test_protocol_worker:test_protocol_104_cancelled_worker_waits_for_job_reports",
        "test_protocol_worker:test_protocol_104_sigterm_kills_the_running_job_and_reports_it",
    ),
    "acfc274 only 2xx is success; terminal reports retried; log sends serialised": (
        "test_protocol_worker:test_protocol_080_terminal_report_500_retried",
        "test_protocol_sheets:test_protocol_118_final_log_flush_precedes_the_terminal_report",
        "test_reliability:test_reliability_log_chunks_arrive_in_order_through_failures",
    ),
    "fb69bc1 registration means 'I run nothing': never register while supervising": (
        "test_protocol_worker:test_protocol_059_busy_worker_defers_reregistration",
        "test_protocol_more:test_protocol_039_reregistering_with_running_job_quarantines",
    ),
    "775d017 CUDA_VISIBLE_DEVICES derived; 5 s report attempts; 250 ms idle-poll floor": (
        "test_protocol_worker:test_protocol_074_cuda_visible_devices",
        "test_protocol_worker:test_protocol_081_blackholed_terminal_report_bounded",
        "test_protocol_worker:test_protocol_070_idle_poll_floor",
    ),
    "2b7f06a/1ac6e23 a run is killed/cancelled whenever our SIGTERM reached something": (
        "test_protocol_more:test_protocol_092_cancelled_job_trapping_term_exit0_is_killed_cancelled",
        "test_protocol_more:test_protocol_093_cancel_racing_exit_is_never_silent_success",
    ),
    "7aab8a2 the whole group reaped with SIGKILL follow-up; 128+signal": (
        "test_protocol_more:test_protocol_097_cancel_kills_grandchild_ignoring_term",
        "test_protocol_worker:test_protocol_091_self_sigkill_reports_137",
    ),
    "50e741f worker_id always sent; 403 not_job_owner otherwise": (
        "test_protocol_worker:test_protocol_073_reports_carry_worker_id",
        "test_protocol_more:test_protocol_085_status_from_other_worker_is_403",
    ),
    "65b7241 a kill in the same answer as its assignment: never started, reported killed": (
        "test_protocol_worker:test_protocol_071_pre_killed_assignment_never_runs",
    ),
    "baaf301 heartbeats name only jobs truly supervised": (
        "test_protocol_worker:test_protocol_060_heartbeats_name_exactly_the_running_job",
    ),
    "1503241 the boot id is always sent": (
        "test_protocol_worker:test_protocol_021_boot_id_is_stable_without_newline",
        "test_protocol_worker:test_protocol_022_first_registration_carries_sheets_and_labels",
    ),
    "67e11d9 rune-safe sheet truncation; 404/400 on the labels route": (
        "test_protocol_sheets:test_protocol_138_oversized_sheet_is_cut_on_a_character_boundary",
        "test_protocol_worker:test_protocol_129_labels_pushed_to_the_labels_route",
    ),
    "6ef231c RC_TOKEN read when the file has no token": (
        "test_protocol_config:test_protocol_012_rc_token_used_without_file_token",
    ),
    "337e23d a zombie is not alive: only non-Z processes are stragglers": (
        "test_protocol_more:test_protocol_094_exited_background_child_is_not_a_straggler",
    ),
    "940d980 the recovery proof at every registration; isolation derived": (
        "test_protocol_more:test_protocol_023_clean_scan_registers_survivors_checked",
        "test_protocol_worker:test_protocol_056_identity_change_reregisters_identically",
        "test_protocol_more:test_protocol_026_pid_one_alone_registers_isolated",
    ),
    "16eda41 quarantine is operator-visible; rc clear documented": (
        "test_reliability:test_reliability_quarantine_and_rc_clear_are_documented",
    ),
    "c30d2de sweep by exact RC_JOB_ID after every job, outcome unchanged": (
        "test_protocol_worker:test_protocol_089_setsid_escapee_swept_job_succeeds",
        "test_protocol_more:test_protocol_090_sweep_spares_prefix_relatives",
    ),
    "b2e98bf after a controller restart: heartbeat promptly, keep naming jobs": (
        "test_reliability:test_reliability_heartbeats_resume_naming_the_job_after_a_restart",
    ),
    "945af3b re-register on instance change or 5 min silence, jittered, only when idle": (
        "test_protocol_worker:test_protocol_056_identity_change_reregisters_identically",
        "test_protocol_worker:test_protocol_058_long_silence_reregisters",
        "test_protocol_worker:test_protocol_059_busy_worker_defers_reregistration",
    ),
    "95dc233 name a job in heartbeats iff still supervised (retention mode)": (
        "test_protocol_more:test_protocol_064_retention_unnamed_job_keeps_device_unknown_and_kill_finalizes",
        "test_protocol_more:test_protocol_066_named_finalized_kill_stays_deliverable_until_unnamed",
    ),
    "c2d124a the controller's wire format tracked; field names exact": (
        "test_protocol_worker:test_protocol_045_instance_header_on_every_response",
    ),
}

HOST_FEATURE_ROWS = (
    "1797146 epoch-pinned releases, interrupted acquire, release drain, fault retries",
    "67e11d9 per-device omission of failed probe labels",
    "5157861 probe failures attributed per source",
    "96139f6 verify fails closed; RC_SUBMITTER passed",
    "fe5a790 relay halves opened only when the job runs",
    "414f159 interactive sessions reaped; PTY 24x80; 0x0 resizes ignored",
)


def _find(test: str) -> bool:
    """Whether ``module:function`` names a test function in ``tests/acceptance``."""
    module, name = test.split(":")
    mod = importlib.import_module(f"tests.acceptance.{module}")
    return callable(getattr(mod, name, None))


def test_reliability_every_requirement_has_a_test() -> None:
    missing = [t for tests in REQUIREMENTS.values() for t in tests if not _find(t)]
    assert missing == []
    assert all(REQUIREMENTS.values())


async def test_reliability_heartbeats_resume_naming_the_job_after_a_restart() -> None:
    """b2e98bf: once the controller is back, the worker's next heartbeat names its running job
    (so the new process renews the lease instead of expiring it), promptly."""
    with trio.fail_after(30):
        async with running() as (ctrl, worker):
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", "sleep 3"])
            await ctrl.wait_for(lambda: job in worker.supervised() and ctrl.statuses(job))
            restarted_as = ctrl.restart(down_for=0.5)
            back_at = trio.current_time() + 0.5

            def first_beat_after_restart() -> object:
                beats = [
                    r
                    for r in ctrl.requests("heartbeat")
                    if r.instance == restarted_as and r.outcome == "handled"
                ]
                return beats[0] if beats else None

            beat = await ctrl.wait_for(first_beat_after_restart, timeout=10)
            assert beat.json() == {"running_job_ids": [job]}
            assert beat.at - back_at < worker.heartbeat_interval + 1.0
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]


async def test_reliability_log_chunks_arrive_in_order_through_failures() -> None:
    """acfc274: log sends are serialised end to end; failed sends are retried in order, so
    the controller's copy is the job's output, byte for byte."""
    script = "for i in $(seq 1 40); do echo line-$i; sleep 0.02; done"
    with trio.fail_after(30):
        async with running() as (ctrl, _):
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", script])
            await ctrl.wait_for(lambda: b"line-3\n" in ctrl.logs(job))
            ctrl.fail_next("logs", status=503, count=2)
            ctrl.drop_next("logs", count=1)
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            expected = "".join(f"line-{i}\n" for i in range(1, 41)).encode()
            assert ctrl.logs(job) == expected


def test_reliability_quarantine_and_rc_clear_are_documented() -> None:
    """16eda41: an operator can find out why a device is out of the pool and how to bring it
    back; the worker guide says so."""
    text = (ROOT / "docs" / "worker.md").read_text(encoding="utf-8")
    assert "rc clear" in text
    for reason in ("worker_lost", "lease_expired", "registration", "fault"):
        assert re.search(rf"`{reason}`", text), reason
