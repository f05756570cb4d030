"""A tail client that stops reading cannot hold a shutdown (issue 13, item 2).

A job floods stderr, a websocket tail client connects and never reads (so the server's writes
to it block; for the node, a half-open request as well), the process gets SIGTERM: it exits
within its shutdown bound. Real processes,
real sockets, real signals: ``fleet-trio node`` and ``fleet-trio worker`` (its tail listener).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from fleet_trio.gpu.fake import init_device
from fleet_trio.nursery.tree import DEFAULT_INTERRUPT_BUDGET, JOBS_CLOSED_BUDGET, SHUTDOWN_SLACK
from fleet_trio.sim import serve_controller
from fleet_trio.sim.controller import SimController
from fleet_trio.sim.fleet import free_port, wait_exit, worker_yaml
from fleet_trio.sim.stall import StalledTailClient, open_stalled_tail, wait_server_blocked
from tests.helpers import healthy, wait_until

DRAIN = 0.5
GRACE = 0.5
NODE_BOUND = DRAIN + DEFAULT_INTERRUPT_BUDGET + GRACE + SHUTDOWN_SLACK + JOBS_CLOSED_BUDGET
"""docs/node.md "Stopping" with this config's drain and grace."""

FLOOD = "while :; do head -c 1000000 /dev/urandom; sleep 0.05; done >&2"
"""Binary noise on stderr, forever (base64 in the tail frames: they are big), at up to
20 MB/s: far more than a client that stopped reading takes, without the job and the node
taking a whole CPU from the rest of the suite as an unpaced flood did."""


async def sigterm_past_a_stalled_tail(
    proc: trio.Process, stalled: StalledTailClient, port: int, bound: float
) -> tuple[int | None, float]:
    """Once the server on ``port`` is blocked writing to ``stalled``, SIGTERM ``proc``: its exit
    code (None: still running after ``bound``, then SIGKILLed) and the seconds it took. Closes
    ``stalled`` in any case."""
    try:
        await wait_server_blocked(stalled, port)
        proc.send_signal(signal.SIGTERM)
        return await wait_exit(proc, bound)
    finally:
        stalled.close()


@pytest.mark.slow
async def test_node_exits_within_its_bound_with_a_tail_client_that_stopped_reading(
    tmp_path: Path,
) -> None:
    gpu_dir = tmp_path / "gpu"
    init_device(str(gpu_dir))
    cfg = tmp_path / "node.yaml"
    cfg.write_text(
        "node:\n  timings:\n"
        f"    drain_timeout: {int(DRAIN * 1000)}ms\n    kill_grace: {int(GRACE * 1000)}ms\n"
        f"tasks:\n  flood:\n    command: [sh, -c, {FLOOD!r}]\n"
    )
    port = free_port()
    argv = [
        sys.executable, "-m", "fleet_trio", "node", "-c", str(cfg), "--gpu", "fake",
        "--fake-gpu-dir", str(gpu_dir), "--listen", f"127.0.0.1:{port}",
        "--footprints", str(tmp_path / "fp.json"),
    ]  # fmt: skip
    with trio.fail_after(NODE_BOUND + 60):
        proc = await trio.lowlevel.open_process(
            argv, env=dict(os.environ), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
        )
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                await wait_until(lambda: healthy(client), what="the node's health answering 200")
                body = {"job_id": "flood-1", "task_type": "flood", "payload": {}}
                assert (await client.post("/fleet/dispatch", json=body)).status_code == 202
            stalled = await trio.to_thread.run_sync(
                open_stalled_tail, "127.0.0.1", port, "/fleet/jobs/flood-1/tail"
            )
            # and a half-open request: the head of a request, never finished
            half_open = trio.socket.socket()
            await half_open.connect(("127.0.0.1", port))
            await half_open.send(b"GET /fleet/health HTTP/1.1\r\nHost: x\r\n")
            try:
                code, took = await sigterm_past_a_stalled_tail(proc, stalled, port, NODE_BOUND)
            finally:
                half_open.close()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert code == 0, f"still running {took:.1f}s after SIGTERM (bound {NODE_BOUND:g}s)"
    assert took <= NODE_BOUND


WORKER_LIMIT = 20.0
"""The job ends at the SIGTERM (its report goes out at once), so the drain ends at once: what
remains of the worker's bound is the kill grace, the tree's slack and the tails' close."""


@pytest.mark.slow
async def test_worker_exits_promptly_with_a_tail_client_that_stopped_reading(
    tmp_path: Path,
) -> None:
    ctrl = SimController(token="wtok", reaper_interval=0.05, startup_grace=0.0)
    tail_port = free_port()
    for sub in ("probe.d", "sheets", "verify.d"):
        (tmp_path / sub).mkdir()
    async with trio.open_nursery() as nursery:
        url: str = await nursery.start(serve_controller, ctrl)
        cfg = tmp_path / "worker.yaml"
        cfg.write_text(
            worker_yaml(
                controller_url=url,
                host="stallbox",
                devices=["gpu0"],
                state_dir=str(tmp_path),
                verify_dir=str(tmp_path / "verify.d"),
            )
            + f"tail_listen: 127.0.0.1:{tail_port}\n"
        )
        argv = [sys.executable, "-m", "fleet_trio", "worker", "-c", str(cfg)]
        with trio.fail_after(WORKER_LIMIT + 60):
            proc = await trio.lowlevel.open_process(
                argv, env=dict(os.environ), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
            )
            try:
                await ctrl.wait_for(lambda: bool(ctrl.registrations()), timeout=30)
                job_id = ctrl.submit("stallbox:gpu0", ["sh", "-c", FLOOD])
                await ctrl.wait_for(lambda: "running" in ctrl.statuses(job_id), timeout=30)

                async def tail_opened() -> object:
                    try:  # the listener opens the job's log when it starts it
                        return await trio.to_thread.run_sync(
                            open_stalled_tail,
                            "127.0.0.1",
                            tail_port,
                            f"/fleet/jobs/{job_id}/tail",
                        )
                    except (ConnectionError, OSError):
                        return None

                stalled = await wait_until(tail_opened, interval=0.1, what="a stalled tail open")
                code, took = await sigterm_past_a_stalled_tail(
                    proc, stalled, tail_port, WORKER_LIMIT
                )
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
        nursery.cancel_scope.cancel()
    assert code == 0, f"still running {took:.1f}s after SIGTERM"
    assert took <= WORKER_LIMIT
    assert ctrl.statuses(job_id)[-1] == "killed"
