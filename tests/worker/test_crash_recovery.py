"""Issue acceptance: the worker is SIGKILLed mid-job and restarted; the next registration carries
the right recovery proof (a live job process from the previous run is a survivor)."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
from typing import Any

import trio

from fleet_trio.proc.procfs import job_env_id, pid_alive
from fleet_trio.sim import serve_controller
from tests.helpers import dev, sim, write_worker_yaml


async def _start_worker(cfg: pathlib.Path) -> trio.Process:
    env = {k: v for k, v in os.environ.items() if k != "RC_REQUIRE_MANUAL_CLEAR"}
    return await trio.lowlevel.open_process(
        [sys.executable, "-m", "fleet_trio", "worker", "-c", str(cfg)],
        stdin=subprocess.DEVNULL,
        env=env,
    )


async def _stop(proc: trio.Process) -> None:
    if proc.returncode is None:
        proc.kill()
        await proc.wait()


async def test_worker_sigkilled_mid_job_reports_the_survivor_when_restarted(
    tmp_path: pathlib.Path,
) -> None:
    ctrl = sim()
    survivor = 0
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(serve_controller, ctrl)
            cfg = write_worker_yaml(tmp_path, url)
            first = await _start_worker(cfg)
            try:
                await ctrl.wait_for(lambda: ctrl.polls(), timeout=15)
                job = ctrl.submit(dev("gpu0"), ["sh", "-c", "echo child:$$; exec sleep 60"])
                await ctrl.wait_for(lambda: b"child:" in ctrl.logs(job), timeout=15)
                survivor = int(ctrl.logs(job).split(b"child:")[1].split()[0])
                assert job_env_id(survivor) == (job, None)
                first.send_signal(signal.SIGKILL)  # no shutdown path: the job outlives it
                await first.wait()
            finally:
                await _stop(first)
            assert pid_alive(survivor)

            before = len(ctrl.registrations())
            second = await _start_worker(cfg)
            try:
                await ctrl.wait_for(lambda: len(ctrl.registrations()) > before, timeout=15)
                body: dict[str, Any] = ctrl.registrations()[-1]
                assert body["recovery"] == {"survivors_checked": True, "survivors_found": True}
                assert "isolated" not in body["recovery"]
            finally:
                second.send_signal(signal.SIGTERM)
                with trio.move_on_after(15):
                    await second.wait()
                await _stop(second)
                if pid_alive(survivor):
                    os.kill(survivor, signal.SIGKILL)
            nursery.cancel_scope.cancel()
