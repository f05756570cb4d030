"""Issue acceptance: a node survives its own crash (``kill -9``, then a restart).

A real ``fleet-trio node`` process with the job journal on: after SIGKILL and a restart, every
acked job still answers its poll — a finished one as before the crash, one that was running as
``error: "interrupted"`` — its processes are gone and its work directory is removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import httpx
import trio

from fleet_trio.gpu.fake import init_device
from tests.helpers import healthy, state_in, wait_until

SLEEPER = (
    "import os, sys, time; sys.stdin.read(); "
    "open(os.path.join(os.environ['PIDS'], os.environ['FLEET_JOB_ID']), 'w')"
    ".write(str(os.getpid())); time.sleep(120)"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


QUICK = "import sys; sys.stdin.read(); print('{\"v\": 7}')"


def _config(tmp_path: Path) -> Path:
    pids = tmp_path / "pids"
    pids.mkdir(exist_ok=True)
    cfg = tmp_path / "node.yaml"
    raw = {
        "node": {"timings": {"drain_timeout": "500ms", "kill_grace": "500ms"}},
        "tasks": {
            "sleeper": {"command": [sys.executable, "-c", SLEEPER], "env": {"PIDS": str(pids)}},
            "quick": {"command": [sys.executable, "-c", QUICK]},
        },
    }
    cfg.write_text(json.dumps(raw))  # JSON is YAML
    return cfg


class Node:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        gpu_dir = tmp_path / "gpu"
        init_device(str(gpu_dir))
        self.port = _free_port()
        self.work = tmp_path / "work"
        self.work.mkdir(exist_ok=True)
        self.argv = [
            sys.executable, "-m", "fleet_trio", "node", "-c", str(_config(tmp_path)),
            "--gpu", "fake", "--fake-gpu-dir", str(gpu_dir),
            "--listen", f"127.0.0.1:{self.port}", "--footprints", str(tmp_path / "fp.json"),
        ]  # fmt: skip
        self.proc: trio.Process | None = None

    async def start(self) -> None:
        env = {**os.environ, "TMPDIR": str(self.work)}
        self.proc = await trio.lowlevel.open_process(self.argv, env=env)
        async with httpx.AsyncClient(base_url=self.url) as client:
            proc = self.proc

            async def up() -> bool:
                assert proc.returncode is None, "the node exited at start"
                return await healthy(client)

            await wait_until(up, what="the node's health answering 200")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    async def close(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1].split()[0] != "Z"
    except OSError:
        return False


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
            assert _alive(pid)  # the crash left the job's process behind
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
            assert not _alive(pid)  # stopped before the node served
            assert [d for d in os.listdir(node.work) if d.startswith("fleet-job-")] == []
    finally:
        await node.close()
        pid_file = tmp_path / "pids" / "s1"
        if pid_file.exists() and pid_file.read_text():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
