"""Issue acceptance: SIGTERM with jobs in flight, against a real ``fleet-trio node`` process.

Every poller sees a terminal state before the process exits, and the exit is bounded by the
drain and the kill grace: the stubborn job would otherwise keep the node alive for 60 s. The
slack above drain + grace covers the interpreter's start-up work being done on a loaded CI
machine (the exit takes about drain + grace + 0.3 s on a quiet one).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest
import trio

from fleet_trio.gpu.fake import init_device
from fleet_trio.sim.fleet import free_port
from tests.helpers import healthy, scenario_pause, state_in, wait_until

DRAIN = 1.0
GRACE = 1.0
# Interpreter teardown, the poll linger's last answers and a busy 2-core CI machine: seen at
# 1.8 s there. Far below the 60 s the stubborn job would hold the node without the bound.
SLACK = 6.0

# A job that ignores SIGTERM: only the SIGKILL after the grace ends it.
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"


def _config(tmp_path: Path) -> Path:
    cfg = tmp_path / "node.yaml"
    cfg.write_text(
        "node:\n"
        "  timings:\n"
        f"    drain_timeout: {int(DRAIN * 1000)}ms\n"
        f"    kill_grace: {int(GRACE * 1000)}ms\n"
        "tasks:\n"
        "  stubborn:\n"
        f"    command: [{sys.executable!r}, '-c', {STUBBORN!r}]\n"
        "  quick:\n"
        f"    command: [{sys.executable!r}, '-c', 'print(1)']\n"
    )
    return cfg


@pytest.mark.slow
async def test_sigterm_with_jobs_in_flight_every_poller_sees_a_terminal_state(
    tmp_path: Path,
) -> None:
    gpu_dir = tmp_path / "gpu"
    init_device(str(gpu_dir))
    port = free_port()
    argv = [
        sys.executable, "-m", "fleet_trio", "node", "-c", str(_config(tmp_path)),
        "--gpu", "fake", "--fake-gpu-dir", str(gpu_dir), "--listen", f"127.0.0.1:{port}",
        "--footprints", str(tmp_path / "fp.json"),
    ]  # fmt: skip
    jobs = [f"stubborn-{i}" for i in range(4)]
    last_seen: dict[str, str] = {}
    with trio.fail_after(40):
        proc = await trio.lowlevel.open_process(argv, env=dict(os.environ))
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                await wait_until(lambda: healthy(client), what="the node's health answering 200")
                for job in jobs:
                    body = {"job_id": job, "task_type": "stubborn", "payload": {}}
                    assert (await client.post("/fleet/dispatch", json=body)).status_code == 202
                for job in jobs:
                    await wait_until(lambda j=job: state_in(client, j, "running"))  # type: ignore[misc]

                async def poll(job: str) -> None:
                    # Poll until the listener goes away; remember the last state seen.
                    while True:
                        try:
                            r = await client.get(f"/fleet/jobs/{job}")
                        except httpx.TransportError:
                            return
                        last_seen[job] = r.json()["state"] + ":" + str(r.json().get("error"))
                        await scenario_pause(0.02, why="a client polling every 20 ms")

                async with trio.open_nursery() as nursery:
                    for job in jobs:
                        nursery.start_soon(poll, job)
                    await scenario_pause(0.2, why="the pollers are under way before the signal")
                    signalled = time.monotonic()
                    proc.send_signal(signal.SIGTERM)
                    code = await proc.wait()
                    exited = time.monotonic() - signalled
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert code == 0
    assert exited <= DRAIN + GRACE + SLACK, exited
    assert last_seen == {job: "error:interrupted" for job in jobs}
