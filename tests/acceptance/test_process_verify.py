"""worker-process.md §11, V — verify (items 51–62 and 65). Real scripts, real processes.

Items 63, 64 and 66 need the whole worker (and 66 the controller); they live elsewhere.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest
import trio

from fleet_trio.durations import SECOND
from fleet_trio.worker.client import Assignment
from fleet_trio.worker.config import WorkerConfig
from fleet_trio.worker.verify import (
    NOT_EXECUTABLE_MESSAGE,
    VERIFY_FAILED_PREFIX,
    VerifyOutcome,
    run_verify,
    verify_assignment,
)
from tests.helpers import new_dir, sh_script

PREFIX = "verify failed: "


@pytest.fixture
def verify_d(tmp_path: Path) -> Path:
    """An empty ``verify.d`` beside the test's other files."""
    return new_dir(tmp_path / "verify.d")


async def verify(
    directory: Path,
    *,
    device_id: str = "box:gpu0",
    job_id: str = "job1",
    submitter: str = "agent-a",
    timeout: float = 10.0,  # noqa: ASYNC109 - the per-script max_runtime
    pass_budget: float = 30.0,
    limit: float = 20.0,
) -> VerifyOutcome:
    with trio.fail_after(limit):
        return await run_verify(
            str(directory),
            device_id=device_id,
            job_id=job_id,
            submitter=submitter,
            timeout=timeout,
            pass_budget=pass_budget,
        )


def test_prefix_constant_is_the_contract() -> None:
    assert VERIFY_FAILED_PREFIX == PREFIX


async def test_process_051_every_script_succeeds_passes(tmp_path: Path) -> None:
    sh_script(tmp_path, "10-ok.sh", "exit 0")
    sh_script(tmp_path, "20-ok.sh", "exit 0")
    res = await verify(tmp_path)
    assert res.ok is True
    assert res.reason == ""


async def test_process_052_failure_carries_the_scripts_stderr(tmp_path: Path) -> None:
    sh_script(tmp_path, "10-vram.sh", "echo '72G still allocated' >&2; exit 1")
    res = await verify(tmp_path)
    assert res.ok is False
    assert res.reason.startswith(PREFIX)
    assert "10-vram.sh" in res.reason
    assert "72G still allocated" in res.reason
    assert res.reason == "verify failed: 10-vram.sh: exited 1: 72G still allocated"


async def verify_two(verify_d: Path, first: str, second: str = "") -> tuple[VerifyOutcome, bool]:
    """Verify ``10-first.sh`` running ``first`` and ``20-second.sh`` running ``second``: the
    outcome, and whether the second script ran."""
    ran = verify_d.parent / "second-ran"
    sh_script(verify_d, "10-first.sh", first)
    sh_script(verify_d, "20-second.sh", f'touch "{ran}"\n{second}')
    return await verify(verify_d), ran.exists()


async def test_process_053_every_script_runs_and_any_failure_fails(verify_d: Path) -> None:
    res, second_ran = await verify_two(verify_d, "exit 1")
    assert res.ok is False
    assert second_ran


async def test_process_054_first_failure_reason_wins_but_all_scripts_run(verify_d: Path) -> None:
    res, second_ran = await verify_two(
        verify_d, "echo 'first complaint' >&2; exit 1", 'echo "second complaint" >&2; exit 2'
    )
    assert res.ok is False
    assert second_ran
    assert res.reason.startswith(PREFIX)
    assert "10-first.sh" in res.reason
    assert "first complaint" in res.reason
    assert "20-second.sh" not in res.reason
    assert "second complaint" not in res.reason


async def test_process_055_timed_out_script_is_a_failure(tmp_path: Path) -> None:
    sh_script(tmp_path, "10-hang.sh", "sleep 60")
    started = time.monotonic()
    res = await verify(tmp_path, timeout=0.3, limit=15)
    assert time.monotonic() - started < 10
    assert res.ok is False
    assert res.reason.startswith(PREFIX)
    assert "10-hang.sh" in res.reason
    assert "max_runtime exceeded" in res.reason


async def test_process_056_empty_directory_passes(tmp_path: Path) -> None:
    res = await verify(tmp_path)
    assert res == VerifyOutcome(ok=True, reason="")


async def test_process_057_missing_directory_passes(tmp_path: Path) -> None:
    res = await verify(tmp_path / "does-not-exist")
    assert res == VerifyOutcome(ok=True, reason="")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a chmod 000 directory anyway")
async def test_process_058_unreadable_directory_fails_closed(verify_d: Path) -> None:
    sh_script(verify_d, "10-ok.sh", "exit 0")
    verify_d.chmod(0o000)
    try:
        res = await verify(verify_d)
    finally:
        verify_d.chmod(0o755)
    assert res.ok is False
    assert res.reason.startswith(PREFIX)
    assert "permission denied" in res.reason
    assert res.reason == f"verify failed: read verify_dir: open {verify_d}: permission denied"


@pytest.mark.parametrize("through", [False, True], ids=["is-a-file", "path-through-a-file"])
async def test_unlistable_directory_fails_closed_even_for_root(
    tmp_path: Path, through: bool
) -> None:
    """Item 58's rule (any listing error but ENOENT fails) in a form root also feels."""
    blocker = tmp_path / "verify.d"
    blocker.write_text("not a directory\n")
    target = blocker / "sub" if through else blocker
    res = await verify(target)
    assert res.ok is False
    assert res.reason == f"verify failed: read verify_dir: open {target}: not a directory"


async def test_eacces_reason_text_even_for_root(
    verify_d: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 58's exact reason, with EACCES injected at the listing (runs as root too)."""
    real_scandir = os.scandir

    def scandir(path: str) -> object:
        if os.fspath(path) == str(verify_d):
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    res = await verify(verify_d)
    assert res.ok is False
    assert res.reason == f"verify failed: read verify_dir: open {verify_d}: permission denied"


async def test_process_059_script_sees_the_device_and_job(tmp_path: Path) -> None:
    sh_script(
        tmp_path,
        "10-env.sh",
        '[ "$RC_DEVICE" = "box:gpu0" ] && [ "$RC_JOB_ID" = "job1" ] '
        '&& [ "$RC_SUBMITTER" = "agent-a" ] && [ "$RC_EVENT" = "verify" ] '
        '&& [ "$CUDA_VISIBLE_DEVICES" = "0" ] || '
        '{ echo "env: $RC_DEVICE $RC_JOB_ID $RC_SUBMITTER" >&2; exit 1; }',
    )
    res = await verify(tmp_path, device_id="box:gpu0", job_id="job1", submitter="agent-a")
    assert res.ok is True, res.reason


async def test_process_060_script_sees_the_submitter_from_the_assignment(
    tmp_path: Path,
    verify_d: Path,
) -> None:
    seen = tmp_path / "seen"
    sh_script(verify_d, "10-who.sh", f'printf %s "$RC_SUBMITTER" > "{seen}"')
    cfg = WorkerConfig(
        verify_dir=str(verify_d), verify_timeout=10 * SECOND, verify_pass_budget=30 * SECOND
    )
    job = Assignment(job_id="j60", device_id="box:gpu1", submitter="alice@lab")
    with trio.fail_after(20):
        res = await verify_assignment(cfg, job)
    assert res.ok is True, res.reason
    assert seen.read_text() == "alice@lab"


async def test_process_061_unstatable_script_fails(tmp_path: Path, verify_d: Path) -> None:
    (verify_d / "10-dangling.sh").symlink_to(tmp_path / "gone")
    res = await verify(verify_d)
    assert res.ok is False
    assert res.reason.startswith(PREFIX)
    assert "10-dangling.sh" in res.reason
    assert "no such file or directory" in res.reason


async def test_process_062_pass_budget_exceeded_fails(tmp_path: Path) -> None:
    sh_script(tmp_path, "10-slow.sh", "sleep 5")
    sh_script(tmp_path, "20-slow.sh", "sleep 5")
    started = time.monotonic()
    res = await verify(tmp_path, timeout=10, pass_budget=0.5, limit=15)
    assert time.monotonic() - started < 10
    assert res.ok is False
    assert res.reason.startswith(PREFIX)
    assert "budget" in res.reason
    assert res.reason == "verify failed: pass exceeded its 500ms budget"


async def test_budget_cutting_the_last_script_is_attributed_to_the_budget(
    tmp_path: Path,
) -> None:
    sh_script(tmp_path, "10-slow.sh", "echo 'half-finished' >&2; sleep 5")
    res = await verify(tmp_path, timeout=10, pass_budget=0.3, limit=15)
    assert res.reason == "verify failed: pass exceeded its 300ms budget"


async def test_budget_does_not_hide_an_earlier_failure(tmp_path: Path) -> None:
    """First failure wins over the budget reason recorded after it (§5.1 ``fail_once``)."""
    sh_script(tmp_path, "10-bad.sh", "echo 'dirty' >&2; exit 1")
    sh_script(tmp_path, "20-slow.sh", "sleep 5")
    res = await verify(tmp_path, timeout=10, pass_budget=0.5, limit=15)
    assert res.reason == "verify failed: 10-bad.sh: exited 1: dirty"


async def test_process_065_non_executable_file_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="fleet_trio.worker.verify")
    sh_script(tmp_path, "10-readme.sh", "exit 1", mode=0o644)
    sh_script(tmp_path, "20-ok.sh", "exit 0")
    res = await verify(tmp_path)
    assert res == VerifyOutcome(ok=True, reason="")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("verify script is not executable" in r.getMessage() for r in warnings)
    record = next(r for r in warnings if NOT_EXECUTABLE_MESSAGE in r.getMessage())
    assert "10-readme.sh" in record.getMessage()
    assert "-rw-r--r--" in record.getMessage()


async def test_stderr_tail_is_the_last_200_bytes(tmp_path: Path) -> None:
    sh_script(
        tmp_path,
        "10-noisy.sh",
        "i=0; while [ $i -lt 100 ]; do echo noise $i >&2; "
        "i=$((i+1)); done; echo 'the real complaint' >&2; exit 3",
    )
    res = await verify(tmp_path)
    assert res.reason.startswith("verify failed: 10-noisy.sh: exited 3: ...(truncated)")
    assert res.reason.endswith("the real complaint")
    tail = res.reason.split("...(truncated)", 1)[1]
    assert len(tail.encode()) == 200
