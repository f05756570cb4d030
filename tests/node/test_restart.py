"""Issue acceptance: a node survives its own crash (``kill -9``, then a restart).

A real ``fleet-trio node`` process with the job journal on: after SIGKILL and a restart, every
acked job still answers its poll — a finished one as before the crash, one that was running as
``error: "interrupted"`` — its processes are gone and its work directory is removed.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from fleet_trio.proc.procfs import pid_alive
from tests.helpers import state_in, wait_until
from tests.node.harness import Node


@pytest.mark.slow
async def test_kill_9_and_restart_acked_jobs_still_answer(tmp_path: Path) -> None:
    node = Node(tmp_path)
    try:
        with trio.fail_after(60):
            await node.start()
            async with httpx.AsyncClient(base_url=node.url) as c:
                body: dict[str, Any] = {"job_id": "q1", "task_type": "quick", "payload": {}}
                assert (await c.post("/fleet/dispatch", json=body)).status_code == 202
                await wait_until(lambda: state_in(c, "q1", "done", "error"))
                assert (await c.get("/fleet/jobs/q1")).json()["state"] == "done"
                body = {"job_id": "s1", "task_type": "sleeper", "payload": {}}
                assert (await c.post("/fleet/dispatch", json=body)).status_code == 202
                pid_file = tmp_path / "pids" / "s1"
                await wait_until(lambda: pid_file.exists() and pid_file.read_text())
                pid = int(pid_file.read_text())
                assert os.listdir(node.work)  # the sleeper's work dir
            await node.kill()
            assert pid_alive(pid)  # the crash left the job's process behind
            await node.start()
            async with httpx.AsyncClient(base_url=node.url) as c:
                q1 = await c.get("/fleet/jobs/q1")
                s1 = await c.get("/fleet/jobs/s1")
                assert q1.status_code == 200, q1.text
                assert q1.json() == {"job_id": "q1", "state": "done", "data": {"v": 7}}
                assert s1.status_code == 200, s1.text
                assert s1.json() == {"job_id": "s1", "state": "error", "error": "interrupted"}
                # a failed job re-dispatched is refused (409), never run again
                again = await c.post(
                    "/fleet/dispatch", json={"job_id": "s1", "task_type": "sleeper"}
                )
                assert again.status_code == 409
            assert not pid_alive(pid)  # stopped before the node served
            assert [d for d in os.listdir(node.work) if d.startswith("fleet-job-")] == []
    finally:
        await node.close()
        pid_file = tmp_path / "pids" / "s1"
        if pid_file.exists() and pid_file.read_text():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
