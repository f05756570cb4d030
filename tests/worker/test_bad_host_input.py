"""Bad input on the host side (hooks, probes, verify): the documented outcome, a log line that
names the script, and the worker keeps serving."""

from __future__ import annotations

import logging
from pathlib import Path

import attrs
import pytest
import trio

from fleet_trio.durations import SECOND
from fleet_trio.worker.config import DeviceConfig, WorkerConfig
from tests.helpers import dev, new_dir, running, sh_script, succeeded, until_terminal


async def test_missing_hook_path_fails_the_job_faults_the_device_and_keeps_serving(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = str(tmp_path / "no-such-hook.sh")
    devices = (DeviceConfig(name="gpu0", on_acquire=missing), DeviceConfig(name="gpu1"))
    with trio.fail_after(20):
        async with running(devices=devices) as (ctrl, _):
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", f"touch {tmp_path}/ran"])
            assert await until_terminal(ctrl, job) == ["failed"]
            reason = ctrl.status_reports(job)[-1].reason
            assert reason.startswith(f"acquire hook failed: hook {missing}: start: ")
            await ctrl.wait_for(lambda: ctrl.faults(dev("gpu0")))  # after the terminal report
            assert ctrl.faults(dev("gpu0")) == [reason]
            assert not (tmp_path / "ran").exists()
            assert missing in caplog.text
            await succeeded(ctrl, dev("gpu1"))


async def test_probe_printing_10_mib_is_skipped_named_and_the_rest_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    probes = new_dir(tmp_path / "probe.d")
    sh_script(probes, "10-flood", "head -c 10485760 /dev/zero | tr '\\0' x")
    sh_script(probes, "20-good", 'echo \'{"rack": "r7"}\'')
    sh_script(probes, "30-garbage", "echo 'not json at all'")

    def configure(cfg: WorkerConfig) -> WorkerConfig:
        return attrs.evolve(cfg, probe_dir=str(probes), probe_timeout=10 * SECOND)

    caplog.set_level(logging.WARNING)
    with trio.fail_after(30):
        async with running(configure=configure) as (ctrl, _):
            labels = ctrl.registrations()[0]["labels"]
            assert labels[""]["rack"] == "r7"
            assert "x" not in labels[""] and "not" not in labels[""]
            assert "10-flood" in caplog.text and "30-garbage" in caplog.text
            await succeeded(ctrl, dev("gpu0"))


async def test_unreadable_verify_dir_fails_closed_and_keeps_serving(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    not_a_dir = tmp_path / "verify.d"
    not_a_dir.write_text("a file where the verify folder should be\n")

    def configure(cfg: WorkerConfig) -> WorkerConfig:
        return attrs.evolve(cfg, verify_dir=str(not_a_dir))

    with trio.fail_after(20):
        async with running(configure=configure) as (ctrl, _):
            await succeeded(ctrl, dev("gpu0"))
            (fault,) = ctrl.faults(dev("gpu0"))
            assert fault.startswith("verify failed: ") and str(not_a_dir) in fault
            assert str(not_a_dir) in caplog.text
            await succeeded(ctrl, dev("gpu1"))


async def test_lone_surrogates_from_the_controller_are_replaced_as_go_does(
    tmp_path: Path,
) -> None:
    """A job submitted with a lone surrogate in its command, environment or working directory
    reaches the worker with U+FFFD in its place (Go's encoder in the controller; a raw
    ``"\\ud800"`` escape is read the same way by the worker: test_hostile_answers.py): an
    ordinary start error or run, not an encoding error of the sim's or the worker's own."""
    seen = tmp_path / "seen"
    with trio.fail_after(30):
        async with running() as (ctrl, _):
            job = ctrl.submit(dev("gpu0"), ["tr\ud800ue"])
            assert await until_terminal(ctrl, job) == ["running", "failed"]
            reason = ctrl.status_reports(job)[-1].reason
            assert reason == 'start: exec: "tr\ufffdue": executable file not found in $PATH'
            job = ctrl.submit(
                dev("gpu0"),
                ["sh", "-c", f'printf %s "$A" > {seen}'],
                env={"A": "x\udc80y"},
            )
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            assert seen.read_text(encoding="utf-8") == "x\ufffdy"
            job = ctrl.submit(dev("gpu0"), ["true"], cwd=str(tmp_path / "d\ud800"))
            assert await until_terminal(ctrl, job) == ["running", "failed"]
            assert "d\ufffd" in ctrl.status_reports(job)[-1].reason
            await succeeded(ctrl, dev("gpu1"))


async def test_the_workers_token_in_its_environment_is_not_passed_to_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``RC_TOKEN`` in the worker's environment (the token it authenticates with) reached
    every job: any user who can submit a job could then act as the worker (report faults and
    statuses, register). Jobs no longer inherit it; an assignment's own ``env`` may set it."""
    monkeypatch.setenv("RC_TOKEN", "s3cret-worker-token")
    monkeypatch.setenv("FLEET_TRIO_TOKEN", "s3cret-node-token")
    seen = tmp_path / "seen"
    script = f'printf "%s|%s|%s" "${{RC_TOKEN-unset}}" "${{FLEET_TRIO_TOKEN-unset}}" "$K" > {seen}'
    with trio.fail_after(30):
        async with running() as (ctrl, _):
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", script], env={"K": "kept"})
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            assert seen.read_text() == "unset|unset|kept"
            job = ctrl.submit(dev("gpu0"), ["sh", "-c", script], env={"RC_TOKEN": "own"})
            assert await until_terminal(ctrl, job) == ["running", "succeeded"]
            assert seen.read_text() == "own|unset|"
