"""The timestamping proxy of ``scripts/bench/worker_hold.py --go`` (``rc_proxy.py``): which
exchanges it reads as an assignment and a terminal report, and that it answers a worker whole
(one message, its body's length in the headers) with the times recorded, in front of the
simulated controller."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys
import uuid
from types import ModuleType

import httpx
import trio

from fleet_trio.sim import SimController, serve_controller

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "bench" / "rc_proxy.py"


def load_proxy() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_rc_proxy", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_rc_proxy", module)
    spec.loader.exec_module(module)
    return module


rc_proxy = load_proxy()
POLL = "/v1/workers/w-1/assignments?wait=30s"


def test_assignment_ids_reads_only_a_poll_answer_that_hands_out_jobs() -> None:
    body = json.dumps({"assignments": [{"job_id": "j1", "command": ["true"]}, {"job_id": "j2"}]})
    assert rc_proxy.assignment_ids(POLL, 200, body.encode()) == ["j1", "j2"]
    assert rc_proxy.assignment_ids(POLL, 204, b"") == []
    assert rc_proxy.assignment_ids("/v1/workers/w-1/heartbeat", 200, body.encode()) == []
    assert rc_proxy.assignment_ids(POLL, 200, b"not json") == []
    assert rc_proxy.assignment_ids(POLL, 200, b'{"assignments": null, "kills": []}') == []
    assert rc_proxy.assignment_ids(POLL, 200, b'{"assignments": [7, {"x": 1}]}') == []


def test_terminal_job_reads_only_a_terminal_status_report() -> None:
    path = "/v1/jobs/j1/status"
    for state in ("succeeded", "failed", "killed", "lost"):
        body = json.dumps({"worker_id": "w", "state": state}).encode()
        assert rc_proxy.terminal_job("POST", path, body) == "j1"
    assert rc_proxy.terminal_job("POST", path, b'{"state": "running"}') is None
    assert rc_proxy.terminal_job("GET", path, b'{"state": "succeeded"}') is None
    assert rc_proxy.terminal_job("POST", "/v1/jobs/j1/logs", b'{"state": "failed"}') is None
    assert rc_proxy.terminal_job("POST", path, b"\xff") is None


async def test_the_proxy_records_a_jobs_assignment_and_terminal_report() -> None:
    ctrl = SimController(token="wtok", reaper_interval=1.0, startup_grace=0.0)
    stamps = rc_proxy.Stamps()
    headers = {"Authorization": "Bearer wtok", "Content-Type": "application/json"}
    registration = {
        "host": "bench",
        "boot_id": str(uuid.uuid4()),
        "recovery": {"survivors_checked": True, "survivors_found": False},
        "devices": [{"name": "gpu0", "max_runtime_seconds": 0}],
        "labels": {},
        "declared_labels": {},
        "sheet": "",
        "device_sheets": {},
    }
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(serve_controller, ctrl)
            port = int(url.rsplit(":", 1)[1])
            proxy_port = await nursery.start(rc_proxy.serve_proxy, port, stamps)
            base = f"http://127.0.0.1:{proxy_port}"
            async with httpx.AsyncClient(headers=headers, timeout=20.0) as http:
                answer = await http.post(f"{base}/v1/workers/register", json=registration)
                assert answer.status_code == 200
                worker_id = answer.json()["worker_id"]
                job_id = ctrl.submit("bench:gpu0", ["true"])
                answer = await http.get(
                    f"{base}/v1/workers/{worker_id}/assignments", params={"wait": "5s"}
                )
                assert answer.status_code == 200
                assert answer.headers["content-length"] == str(len(answer.content))
                assert [a["job_id"] for a in answer.json()["assignments"]] == [job_id]
                assert job_id in stamps.assigned and stamps.polls == 1
                status = f"{base}/v1/jobs/{job_id}/status"
                for state in ("running", "succeeded"):
                    body = {"worker_id": worker_id, "state": state}
                    if state == "succeeded":
                        assert job_id not in stamps.terminal
                        body["exit_code"] = 0  # type: ignore[assignment]
                    answer = await http.post(status, json=body)
                    assert answer.status_code == 200
            assert ctrl.statuses(job_id)[-1] == "succeeded"
            assert stamps.hold_ms(job_id) >= 0.0
            nursery.cancel_scope.cancel()
