"""Issue acceptance: SIGHUP (a closed SSH session) drains a real ``fleet-trio worker`` as
SIGTERM does: the running job is stopped with its grace, its terminal report reaches the
controller, the worker exits 0. Before, the default action killed the worker at once: the
job was orphaned and the controller heard nothing."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys

import trio

from fleet_trio.proc.procfs import pid_alive
from fleet_trio.sim import serve_controller
from tests.helpers import TERMINAL, dev, sim, write_worker_yaml


async def test_sighup_drains_the_worker_and_the_job_is_reported(tmp_path: pathlib.Path) -> None:
    ctrl = sim()
    log_file = tmp_path / "worker.log"
    job_pid = 0
    with trio.fail_after(60), log_file.open("wb") as log:
        async with trio.open_nursery() as nursery:
            url = await nursery.start(serve_controller, ctrl)
            cfg = write_worker_yaml(tmp_path, url)
            env = {k: v for k, v in os.environ.items() if k != "RC_REQUIRE_MANUAL_CLEAR"}
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-m", "fleet_trio", "worker", "-c", str(cfg)],
                stdin=subprocess.DEVNULL,
                stderr=log,
                env=env,
            )
            try:
                await ctrl.wait_for(lambda: ctrl.polls(), timeout=15)
                job = ctrl.submit(dev("gpu0"), ["sh", "-c", "echo child:$$; exec sleep 60"])
                await ctrl.wait_for(lambda: b"child:" in ctrl.logs(job), timeout=15)
                job_pid = int(ctrl.logs(job).split(b"child:")[1].split()[0])
                proc.send_signal(signal.SIGHUP)
                code = await proc.wait()
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
                if job_pid and pid_alive(job_pid):
                    os.kill(job_pid, signal.SIGKILL)
            nursery.cancel_scope.cancel()
    text = log_file.read_text()
    assert code == 0, text
    statuses = ctrl.statuses(job)
    assert statuses[0] == "running" and statuses[-1] in TERMINAL, statuses
    assert not pid_alive(job_pid)
    assert "SIGHUP" in text and "Traceback" not in text, text
