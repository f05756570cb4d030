"""Issue acceptance: a frozen node never runs a job whose client gave up before its 202.

A real ``fleet-trio node`` process is frozen (SIGSTOP) while a dispatch is sent to it with a
short client timeout; the client times out and closes its connection; the node is resumed
(SIGCONT). The dispatcher has, by then, placed the job elsewhere: the node must not run it.
The id stays unknown (poll 404, nothing in the work root), and a later re-dispatch of the
same id to the same node is a fresh ack (202) that runs exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
from pathlib import Path

import httpx
import pytest
import trio

from tests.helpers import state_in, wait_until
from tests.node.harness import Node

ONCE = (
    "import os, sys; sys.stdin.read(); "
    "open(os.path.join(os.environ['RUNS'], os.environ['FLEET_JOB_ID']), 'a').write('x'); "
    "print('{\"ran\": true}')"
)


def _config(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    runs.mkdir(exist_ok=True)
    cfg = tmp_path / "acks.yaml"
    raw = {
        "node": {"timings": {"drain_timeout": "500ms", "kill_grace": "500ms"}},
        "tasks": {"once": {"command": [sys.executable, "-c", ONCE], "env": {"RUNS": str(runs)}}},
    }
    cfg.write_text(json.dumps(raw))  # JSON is YAML
    return cfg


def _runs(tmp_path: Path, job_id: str) -> int:
    path = tmp_path / "runs" / job_id
    return len(path.read_text()) if path.exists() else 0


def _job_dirs(node: Node) -> list[str]:
    return [d for d in os.listdir(node.work) if d.startswith("fleet-job-")]


@pytest.mark.slow
async def test_a_dispatch_whose_client_gave_up_during_a_freeze_never_runs(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path)
    node.argv[node.argv.index("-c") + 1] = str(_config(tmp_path))
    node.log = tmp_path / "node.log"
    body = {"job_id": "frozen-1", "task_type": "once", "payload": {}}
    try:
        with trio.fail_after(60):
            await node.start()
            assert node.proc is not None
            pid = node.proc.pid
            os.kill(pid, signal.SIGSTOP)
            try:
                # the kernel completes the connection and takes the request; nobody answers
                async with httpx.AsyncClient(base_url=node.url, timeout=1.0) as frozen:
                    with pytest.raises(httpx.TimeoutException):
                        await frozen.post("/fleet/dispatch", json=body)
                # the client is gone: its connection is closed (the pool closed on exit)
            finally:
                os.kill(pid, signal.SIGCONT)

            def log_text() -> str:
                assert node.log is not None
                return node.log.read_text(errors="replace")

            # the node decides: either it says it did not ack (the fix) or the job runs (the
            # defect); either way this wait ends on a fact
            await wait_until(
                lambda: "frozen-1" in log_text() or _runs(tmp_path, "frozen-1"),
                timeout=20,
                what="the node's decision on frozen-1 (a log line, or a run)",
            )
            async with httpx.AsyncClient(base_url=node.url, timeout=10) as c:
                poll = await c.get("/fleet/jobs/frozen-1")
                assert _runs(tmp_path, "frozen-1") == 0, "the job ran without a delivered 202"
                assert poll.status_code == 404, poll.text
                await wait_until(lambda: not _job_dirs(node), what="the work root empty")
                lines = [ln for ln in log_text().splitlines() if "frozen-1" in ln]
                assert len(lines) == 1, lines
                assert "not acked" in lines[0] and "client" in lines[0], lines[0]

                # the dispatcher's retry of the same id to this node: a fresh ack, run once
                again = await c.post("/fleet/dispatch", json=body)
                assert again.status_code == 202, again.text
                assert again.json() == {"job_id": "frozen-1", "status": "accepted"}
                await wait_until(lambda: state_in(c, "frozen-1", "done", "error"))
                done = (await c.get("/fleet/jobs/frozen-1")).json()
                assert done == {"job_id": "frozen-1", "state": "done", "data": {"ran": True}}
                assert _runs(tmp_path, "frozen-1") == 1
    finally:
        await node.close()


@pytest.mark.slow
async def test_a_client_that_resets_right_after_reading_its_202_has_its_job_run_once(
    tmp_path: Path,
) -> None:
    """Clients that close abortively (an RST: ``SO_LINGER`` 0) the moment they have read
    their 202: every job so acked runs, once — never a 202 then 404."""
    node = Node(tmp_path)
    node.argv[node.argv.index("-c") + 1] = str(_config(tmp_path))
    ids = [f"rst-{i}" for i in range(5)]

    def dispatch_and_reset(job_id: str) -> bytes:
        body = json.dumps({"job_id": job_id, "task_type": "once", "payload": {}}).encode()
        head = (
            f"POST /fleet/dispatch HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        with socket.create_connection(("127.0.0.1", node.port), timeout=10) as s:
            s.sendall(head + body)
            answer = b""
            while b"accepted" not in answer and b"error" not in answer:
                data = s.recv(4096)
                if not data:
                    break
                answer += data
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return answer

    try:
        with trio.fail_after(60):
            await node.start()
            for job_id in ids:
                answer = await trio.to_thread.run_sync(dispatch_and_reset, job_id)
                assert answer.startswith(b"HTTP/1.1 202"), answer
            async with httpx.AsyncClient(base_url=node.url, timeout=10) as c:
                for job_id in ids:
                    await wait_until(
                        lambda j=job_id: state_in(c, j, "done", "error"),
                        what=job_id,
                    )
                    done = (await c.get(f"/fleet/jobs/{job_id}")).json()
                    assert done["state"] == "done", done
                    assert _runs(tmp_path, job_id) == 1
    finally:
        await node.close()
