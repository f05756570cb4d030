"""The thinnest worker that still speaks the rc worker protocol: register, long-poll, spawn,
report, and a heartbeat every 10 s (else the controller writes it off). No verify, no
sweep, no log upload, no live log, no retries: the floor
``worker_hold.py`` measures ``fleet-trio worker`` against (issue: worker speed).

    python scripts/bench/thin_worker.py URL TOKEN HOST DEVICE

Each assignment: ``running`` report, the command through ``trio.run_process`` (output
discarded), the terminal report (``succeeded`` or ``failed`` with the exit code). One HTTP
connection kept alive for the reports, one for the long poll. Runs until SIGTERM.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import httpx
import trio


async def heartbeats(http: httpx.AsyncClient, url: str, worker_id: str, running: set[str]) -> None:
    """E3 every 10 s (the controller's default interval), naming the running jobs."""
    while True:
        await trio.sleep(10.0)
        body = {"running_job_ids": sorted(running)} if running else {}
        await http.post(f"{url}/v1/workers/{worker_id}/heartbeat", content=json.dumps(body))


async def run_one(
    http: httpx.AsyncClient, url: str, worker_id: str, a: dict[str, object], running: set[str]
) -> None:
    job_id = str(a["job_id"])
    running.add(job_id)
    path = f"{url}/v1/jobs/{job_id}/status"
    await http.post(path, content=json.dumps({"worker_id": worker_id, "state": "running"}))
    command = [str(c) for c in a.get("command") or []]  # type: ignore[attr-defined]
    done = await trio.run_process(
        command, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    code = done.returncode
    state = "succeeded" if code == 0 else "failed"
    body: dict[str, object] = {"worker_id": worker_id, "state": state, "exit_code": code}
    if code:
        body["reason"] = f"exit status {code}"
    await http.post(path, content=json.dumps(body))
    running.discard(job_id)


async def main(url: str, token: str, host: str, device: str) -> None:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    registration = {
        "host": host,
        "boot_id": str(uuid.uuid4()),
        "recovery": {"survivors_checked": True, "survivors_found": False},
        "devices": [{"name": device, "max_runtime_seconds": 0}],
        "labels": {},
        "declared_labels": {},
        "sheet": "",
        "device_sheets": {},
    }
    async with (
        httpx.AsyncClient(headers=headers, timeout=60.0) as http,
        httpx.AsyncClient(headers=headers, timeout=60.0) as poller,
        trio.open_nursery() as nursery,
    ):
        answer = await http.post(f"{url}/v1/workers/register", content=json.dumps(registration))
        answer.raise_for_status()
        worker_id = answer.json()["worker_id"]
        running: set[str] = set()
        nursery.start_soon(heartbeats, http, url, worker_id, running)
        while True:
            answer = await poller.get(
                f"{url}/v1/workers/{worker_id}/assignments", params={"wait": "30s"}
            )
            if answer.status_code != 200:
                continue
            for a in answer.json().get("assignments") or []:
                nursery.start_soon(run_one, http, url, worker_id, a, running)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        raise SystemExit(__doc__)
    trio.run(main, *sys.argv[1:])  # SIGTERM ends it (the default action)
