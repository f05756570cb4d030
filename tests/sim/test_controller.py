"""The simulated rc controller, driven over real HTTP the way a worker drives it.

Request bodies are copied from rc-wire-capture.md. Timers are shrunk to fractions of a
second (real sockets: no autojump clock).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio

from fleet_trio.sim import SimController, SimError, serve_controller
from tests.helpers import scenario_pause

WTOK, CTOK, ATOK = "wtok", "ctok", "atok"
HEADERS = {"Authorization": f"Bearer {WTOK}", "Content-Type": "application/json"}
WORKER_ID = "fd5e9c3a-c827-51f7-8a85-b02a2f888a40"  # the capture's id for host "fakehost"
DEVICE = "fakehost:gpu0"

# The register and labels bodies of the capture share the host's facts (but for the free disk,
# which moved between the two), gpu0's facts, the declared labels and the sheets.
HOST_FACTS = {"cpus": "2", "kernel": "6.18.44-fc-v669", "mem_total_bytes": "25276502016"}
DESCRIBED = {
    "declared_labels": {"gpu0": {"rack": "r3"}},
    "sheet": "# fakehost\nA fake host for wire capture.\n",
    "device_sheets": {"gpu0": "# gpu0\nFake device.\n"},
}
GPU0_FACTS = {"vendor": "fake", "vram": "24G"}
REGISTER = {
    "host": "fakehost",
    "boot_id": "1430be4b-f4e4-438a-abd1-f49b019f7217",
    "recovery": {"survivors_checked": True, "survivors_found": True},
    "devices": [{"name": "gpu0", "max_runtime_seconds": 3600}],
    "labels": {"": {**HOST_FACTS, "disk_free_bytes": "84791074816"}, "gpu0": GPU0_FACTS},
    **DESCRIBED,
}
LABELS = {
    "host": "fakehost",
    "devices": ["gpu0"],
    "labels": {"": {**HOST_FACTS, "disk_free_bytes": "84790738944"}, "gpu0": GPU0_FACTS},
    **DESCRIBED,
}
CMD = [
    "sh",
    "-c",
    "echo hello-stdout; echo hello-stderr >&2; echo CVD=$CUDA_VISIBLE_DEVICES "
    "JOB=$RC_JOB_ID; sleep 1; echo done",
]

Sim = tuple[SimController, httpx.AsyncClient]


async def _serve(nursery: trio.Nursery, heartbeat_timeout: float, lost_after: float) -> Sim:
    ctrl = SimController(
        token=WTOK,
        tokens={CTOK: "client", ATOK: "admin"},
        reaper_interval=0.05,
        heartbeat_timeout=heartbeat_timeout,
        worker_lost_after=lost_after,
        startup_grace=0.0,
    )
    url = await nursery.start(serve_controller, ctrl)
    return ctrl, httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=5.0)


@pytest.fixture
async def sim(nursery: trio.Nursery) -> AsyncIterator[Sim]:
    """A controller whose reaper never fires within a test, however loaded the machine: a
    test that walks the protocol step by step is not a test of heartbeat timing."""
    ctrl, client = await _serve(nursery, heartbeat_timeout=60.0, lost_after=120.0)
    async with client:
        yield ctrl, client


def dumps(obj: Any) -> bytes:
    return json.dumps(obj).encode()


async def register(client: httpx.AsyncClient, body: dict[str, Any] | None = None) -> str:
    r = await client.post("/v1/workers/register", content=dumps(body or REGISTER))
    assert r.status_code == 200, r.text
    return str(r.json()["worker_id"])


async def test_full_job_cycle_matches_capture(sim: Sim) -> None:
    ctrl, client = sim
    r = await client.post("/v1/workers/register", content=dumps(REGISTER))
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert r.content == b'{"worker_id":"' + WORKER_ID.encode() + b'"}\n'
    assert r.headers["content-length"] == "53"
    assert ctrl.device(DEVICE).state == "ready"
    assert ctrl.device(DEVICE).max_runtime_seconds == 3600
    assert ctrl.device(DEVICE).detected_labels["vram"] == "24G"
    assert ctrl.device(DEVICE).detected_labels["cpus"] == "2"  # host facts merged in
    assert ctrl.device(DEVICE).declared_labels == {"rack": "r3"}
    assert ctrl.registrations() == [REGISTER]

    r = await client.post(f"/v1/workers/{WORKER_ID}/labels", content=dumps(LABELS))
    assert (r.status_code, r.content) == (200, b"")
    assert "content-type" not in r.headers
    assert r.headers["content-length"] == "0"
    assert ctrl.label_pushes() == [LABELS]

    r = await client.post(f"/v1/workers/{WORKER_ID}/heartbeat", content=b"{}")
    assert (r.status_code, r.content) == (200, b"")

    job_id = ctrl.submit(DEVICE, CMD, submitter="probe@fakehost")
    assert ctrl.job(job_id).state == "assigned"
    assert ctrl.device(DEVICE).state == "busy"
    r = await client.get(f"/v1/workers/{WORKER_ID}/assignments", params={"wait": "10s"})
    assert r.status_code == 200
    assert r.json() == {
        "assignments": [
            {
                "job_id": job_id,
                "device_id": DEVICE,
                "command": CMD,
                "max_runtime_seconds": 3600,
                "submitter": "probe@fakehost",
                "kind": "job",
            }
        ]
    }
    assert r.headers["content-length"] == "307"  # Go's HTML-safe encoding of ">&2"
    assert b"\\u003e\\u00262" in r.content
    assert ctrl.job(job_id).state == "running"  # flipped at handout

    running = {"state": "running", "worker_id": WORKER_ID}
    r = await client.post(f"/v1/jobs/{job_id}/status", content=dumps(running))
    assert (r.status_code, r.content) == (200, b"")
    beat = {"running_job_ids": [job_id]}
    r = await client.post(f"/v1/workers/{WORKER_ID}/heartbeat", content=dumps(beat))
    assert r.status_code == 200
    chunk1 = f"hello-stdout\nhello-stderr\nCVD=0 JOB={job_id}\n".encode()
    for chunk in (chunk1, b"done\n"):
        r = await client.post(f"/v1/jobs/{job_id}/logs", content=chunk)
        assert (r.status_code, r.content) == (200, b"")
    done = {"exit_code": 0, "state": "succeeded", "worker_id": WORKER_ID}
    r = await client.post(f"/v1/jobs/{job_id}/status", content=dumps(done))
    assert r.status_code == 200

    assert ctrl.statuses(job_id) == ["running", "succeeded"]
    assert ctrl.logs(job_id) == chunk1 + b"done\n"
    assert ctrl.log_chunks(job_id) == [chunk1, b"done\n"]
    job = ctrl.job(job_id)
    assert (job.state, job.exit_code, job.lease_expires) == ("succeeded", 0, None)
    assert ctrl.device(DEVICE).state == "ready"
    assert ctrl.heartbeats(WORKER_ID) == [{}, beat]
    every = [(rec.method, rec.endpoint) for rec in ctrl.requests()]
    assert every[:3] == [("POST", "register"), ("POST", "labels"), ("POST", "heartbeat")]
    assert {rec.instance for rec in ctrl.requests()} == {ctrl.instance}


async def test_failed_exit_and_terminal_idempotent(sim: Sim) -> None:
    ctrl, client = sim
    await register(client)
    job_id = ctrl.submit(DEVICE, ["sh", "-c", "echo failing; exit 3"])
    await client.get(f"/v1/workers/{WORKER_ID}/assignments?wait=1s")
    failed = {"exit_code": 3, "state": "failed", "worker_id": WORKER_ID}
    for _ in range(2):
        r = await client.post(f"/v1/jobs/{job_id}/status", content=dumps(failed))
        assert r.status_code == 200
    assert ctrl.job(job_id).state == "failed"
    assert ctrl.job(job_id).exit_code == 3


async def test_kill_is_delivered_in_kills(sim: Sim) -> None:
    ctrl, client = sim
    await register(client)
    job_id = ctrl.submit(DEVICE, ["sh", "-c", "echo long; sleep 30; echo never"])
    r = await client.get(f"/v1/workers/{WORKER_ID}/assignments?wait=1s")
    assert [a["job_id"] for a in r.json()["assignments"]] == [job_id]

    async def kill_soon() -> None:
        await scenario_pause(0.2, why="the kill comes while the poll is parked")
        assert ctrl.kill(job_id)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(kill_soon)
        start = trio.current_time()
        r = await client.get(f"/v1/workers/{WORKER_ID}/assignments?wait=10s")
        took = trio.current_time() - start
    assert 0.1 < took < 8.0  # the kill ended the long poll, well before its 10 s window
    assert r.status_code == 200
    assert r.content == b'{"assignments":[],"kills":["' + job_id.encode() + b'"]}\n'
    assert r.headers["content-length"] == "68"

    killed = {"exit_code": 143, "reason": "cancelled", "state": "killed", "worker_id": WORKER_ID}
    r = await client.post(f"/v1/jobs/{job_id}/status", content=dumps(killed))
    assert r.status_code == 200
    job = ctrl.job(job_id)
    assert (job.state, job.exit_code, job.kill_reason) == ("killed", 143, "cancelled")
    # delivered once: the next poll waits its full window
    r = await client.get(f"/v1/workers/{WORKER_ID}/assignments?wait=200ms")
    assert r.status_code == 204


async def test_same_response_assignment_and_kill(sim: Sim) -> None:
    ctrl, client = sim
    await register(client)
    job_id = ctrl.submit(DEVICE, ["true"])
    ctrl.kill(job_id)
    r = await client.get(f"/v1/workers/{WORKER_ID}/assignments?wait=1s")
    body = r.json()
    assert [a["job_id"] for a in body["assignments"]] == [job_id]
    assert body["kills"] == [job_id]


async def test_long_poll_times_out_with_204(sim: Sim) -> None:
    ctrl, client = sim
    await register(client)
    start = trio.current_time()
    r = await client.get(f"/v1/workers/{WORKER_ID}/assignments?wait=300ms")
    took = trio.current_time() - start
    assert r.status_code == 204
    assert r.content == b""
    assert "content-type" not in r.headers
    assert r.headers["rc-controller-instance"] == ctrl.instance
    assert 0.25 < took < 2.0
    # unknown worker: 204 after the wait too
    r = await client.get("/v1/workers/nobody/assignments?wait=100ms")
    assert r.status_code == 204


async def test_long_poll_wakes_on_submit(sim: Sim) -> None:
    ctrl, client = sim
    await register(client)
    results: list[httpx.Response] = []

    async def poll() -> None:
        results.append(await client.get(f"/v1/workers/{WORKER_ID}/assignments?wait=10s"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll)
        await ctrl.wait_for(lambda: ctrl.polls())
        await scenario_pause(0.05, why="the poll is parked before the submit")
        job_id = ctrl.submit(DEVICE, ["true"])
    assert results[0].json()["assignments"][0]["job_id"] == job_id


async def test_auth(sim: Sim) -> None:
    ctrl, client = sim
    path = "/v1/workers/register"
    cases = [
        ({"Authorization": "Bearer nope"}, 401),
        ({"Authorization": "Bearer"}, 401),
        ({"Authorization": WTOK}, 401),
        ({"Authorization": f"bearer {WTOK}"}, 401),
        ({"Authorization": f"Bearer {CTOK}"}, 403),
        ({"Authorization": f"Bearer {ATOK}"}, 200),
    ]
    for headers, status in cases:
        r = await client.post(path, content=dumps(REGISTER), headers=headers)
        assert r.status_code == status, headers
        assert r.headers["rc-controller-instance"] == ctrl.instance
    r = await client.post(path, content=dumps(REGISTER), headers={"Authorization": "Bearer x"})
    assert r.json() == {"error": "unauthorized", "message": "unknown or missing token"}
    client_auth = {"Authorization": f"Bearer {CTOK}"}
    r = await client.post(path, content=dumps(REGISTER), headers=client_auth)
    assert r.json() == {
        "error": "forbidden",
        "message": "token role client may not call a worker route",
    }
    async with httpx.AsyncClient(base_url=ctrl.base_url) as bare:
        r = await bare.post(path, content=dumps(REGISTER))
    assert r.status_code == 401


async def test_instance_header_everywhere_and_restart(sim: Sim) -> None:
    ctrl, client = sim
    first = ctrl.instance
    uuid.UUID(first)
    r1 = await client.get("/v1/nowhere")
    r2 = await client.get("/v1/workers/register")  # wrong method
    r3 = await client.post("/v1/workers/register", content=dumps(REGISTER))
    assert (r1.status_code, r2.status_code, r3.status_code) == (404, 405, 200)
    assert {r.headers["rc-controller-instance"] for r in (r1, r2, r3)} == {first}
    new = ctrl.restart()
    assert new != first and ctrl.instance == new
    await scenario_pause(0.1, why="the cut keep-alive connection closes before it is reused")
    r = await client.post(f"/v1/workers/{WORKER_ID}/heartbeat", content=b"{}")
    assert r.headers["rc-controller-instance"] == new
    # durable state survives the restart
    assert ctrl.device(DEVICE).state == "ready"
    assert ctrl.instances == [first, new]


async def test_restart_cuts_a_parked_long_poll(sim: Sim) -> None:
    ctrl, client = sim
    await register(client)
    errors: list[BaseException] = []

    async def poll() -> None:
        try:
            await client.get(f"/v1/workers/{WORKER_ID}/assignments?wait=10s")
        except httpx.TransportError as exc:
            errors.append(exc)

    with trio.fail_after(3):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(poll)
            await ctrl.wait_for(lambda: ctrl.polls())
            await scenario_pause(0.05, why="the poll is parked before the restart")
            ctrl.restart()
    assert len(errors) == 1


async def test_restart_wipe_forgets_workers(sim: Sim) -> None:
    ctrl, client = sim
    await register(client)
    ctrl.restart(wipe=True)
    await scenario_pause(0.1, why="the cut connections close")
    assert ctrl.workers() == [] and ctrl.devices() == []
    r = await client.post(f"/v1/workers/{WORKER_ID}/heartbeat", content=b"{}")
    assert r.status_code == 200  # unknown worker: silent no-op (§17.17)
    r = await client.post(f"/v1/workers/{WORKER_ID}/labels", content=dumps(LABELS))
    assert r.status_code == 404


async def test_injected_5xx(sim: Sim) -> None:
    ctrl, client = sim
    await register(client)
    ctrl.fail_next("heartbeat", status=500, count=2)
    codes = []
    for _ in range(3):
        r = await client.post(f"/v1/workers/{WORKER_ID}/heartbeat", content=b"{}")
        codes.append(r.status_code)
        assert r.headers["rc-controller-instance"] == ctrl.instance
    assert codes == [500, 500, 200]
    assert [rec.outcome for rec in ctrl.requests("heartbeat")] == ["injected"] * 2 + ["handled"]
    assert ctrl.heartbeats() == [{}]


async def test_dropped_connection(sim: Sim) -> None:
    ctrl, client = sim
    await register(client)
    ctrl.drop_next("status")
    job_id = ctrl.submit(DEVICE, ["true"])
    await client.get(f"/v1/workers/{WORKER_ID}/assignments?wait=1s")
    done = {"exit_code": 0, "state": "succeeded", "worker_id": WORKER_ID}
    with pytest.raises(httpx.TransportError):
        await client.post(f"/v1/jobs/{job_id}/status", content=dumps(done))
    assert ctrl.job(job_id).state == "running"
    assert [rec.outcome for rec in ctrl.requests("status")] == ["dropped"]
    r = await client.post(f"/v1/jobs/{job_id}/status", content=dumps(done))
    assert r.status_code == 200
    assert ctrl.statuses(job_id) == ["succeeded"]


async def test_latency(sim: Sim) -> None:
    ctrl, client = sim
    await register(client)
    ctrl.latency("heartbeat", 0.3)
    start = trio.current_time()
    r = await client.post(f"/v1/workers/{WORKER_ID}/heartbeat", content=b"{}")
    assert r.status_code == 200
    assert trio.current_time() - start >= 0.3
    ctrl.latency("heartbeat", 0)
    with pytest.raises(ValueError):
        ctrl.latency("nope", 1)


async def test_gate_holds_requests_until_opened(sim: Sim) -> None:
    ctrl, client = sim
    await register(client)
    heard = ctrl.worker(WORKER_ID).last_heartbeat
    ctrl.gate("heartbeat")
    answers: list[int] = []

    async def beat() -> None:
        r = await client.post(f"/v1/workers/{WORKER_ID}/heartbeat", content=b"{}")
        answers.append(r.status_code)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(beat)
        nursery.start_soon(beat)
        await ctrl.wait_for(lambda: len(ctrl.requests("heartbeat")) == 2, timeout=10)
        # recorded on arrival, neither handled nor answered while the gate is closed
        assert answers == [] and ctrl.worker(WORKER_ID).last_heartbeat == heard
        ctrl.open_gate("heartbeat")
    assert answers == [200, 200]
    assert ctrl.worker(WORKER_ID).last_heartbeat > heard
    # open: later requests pass at once; other routes were never held
    r = await client.post(f"/v1/workers/{WORKER_ID}/heartbeat", content=b"{}")
    assert r.status_code == 200
    ctrl.open_gate("heartbeat")  # not gated: a no-op
    with pytest.raises(ValueError):
        ctrl.gate("nope")


async def test_age_kill_passes_the_redelivery_window(sim: Sim) -> None:
    ctrl, client = sim  # kill_redelivery: the reference's 30 s
    await register(client)
    job_id = ctrl.submit(DEVICE, ["sleep", "30"])
    await client.get(f"/v1/workers/{WORKER_ID}/assignments?wait=1s")
    ctrl.age_kill(job_id, 60.0)  # not delivered yet: nothing to age
    assert ctrl.job(job_id).kill_delivered_at is None
    assert ctrl.kill(job_id)
    r = await client.get(f"/v1/workers/{WORKER_ID}/assignments?wait=1s")
    assert r.json()["kills"] == [job_id]
    r = await client.get(f"/v1/workers/{WORKER_ID}/assignments?wait=100ms")
    assert r.status_code == 204  # within the window
    ctrl.age_kill(job_id, 20.0)
    r = await client.get(f"/v1/workers/{WORKER_ID}/assignments?wait=100ms")
    assert r.status_code == 204  # still within it: ages add up
    ctrl.age_kill(job_id, 10.0)
    r = await client.get(f"/v1/workers/{WORKER_ID}/assignments?wait=1s")
    assert r.json()["kills"] == [job_id]


async def test_fault_quarantines_device(sim: Sim) -> None:
    ctrl, client = sim
    await register(client)
    reason = "verify failed: gpu-check exited 1"
    r = await client.post(f"/v1/devices/{DEVICE}/fault", content=dumps({"reason": reason}))
    assert (r.status_code, r.content) == (200, b"")
    dev = ctrl.device(DEVICE)
    assert (dev.state, dev.reason, dev.detail) == ("unhealthy", "fault", reason)
    assert ctrl.faults(DEVICE) == [reason]
    assert [e.kind for e in ctrl.events()] == ["verify_failed"]
    r = await client.post("/v1/devices/fakehost:gpu9/fault", content=dumps({"reason": "x"}))
    assert r.status_code == 404
    assert r.json() == {"error": "not_found", "message": "device not found"}
    r = await client.post(f"/v1/devices/{DEVICE}/fault", content=dumps({"reason": ""}))
    assert r.json() == {"error": "bad_request", "message": "reason required"}
    # a fault survives a re-registration, even one proving a reboot and no survivors
    rebooted = {**REGISTER, "boot_id": "other", "recovery": {"survivors_checked": True}}
    await register(client, rebooted)
    assert ctrl.device(DEVICE).state == "unhealthy"
    # a queued job waits; an admin clear frees the device and it is handed out
    job_id = ctrl.submit(DEVICE, ["true"])
    assert ctrl.job(job_id).state == "queued"
    ctrl.clear(DEVICE)
    assert ctrl.job(job_id).state == "assigned"


async def test_reaper_unknown_then_worker_lost(sim: Sim) -> None:
    """The reaper's two thresholds (unknown at 60 s of silence, lost at 120 s here), each
    crossed by ``silence()``: the reaper never acts on its own between two steps."""
    ctrl, client = sim
    await register(client)
    job_id = ctrl.submit(DEVICE, ["sleep", "30"])
    await client.get(f"/v1/workers/{WORKER_ID}/assignments?wait=1s")
    ctrl.silence(WORKER_ID, 59.0)  # below the heartbeat timeout: nothing changes
    assert ctrl.device(DEVICE).state == "busy"
    ctrl.silence(WORKER_ID, 61.0)
    assert ctrl.device(DEVICE).state == "unknown"
    assert ctrl.job(job_id).state == "running"
    # a heartbeat naming the job brings the leased device back to busy
    beat = {"running_job_ids": [job_id]}
    await client.post(f"/v1/workers/{WORKER_ID}/heartbeat", content=dumps(beat))
    assert ctrl.device(DEVICE).state == "busy"
    ctrl.silence(WORKER_ID, 119.0)  # unknown again, not yet lost
    assert ctrl.device(DEVICE).state == "unknown"
    assert ctrl.job(job_id).state == "running"
    ctrl.silence(WORKER_ID, 121.0)
    assert ctrl.device(DEVICE).state == "unhealthy"
    dev, job = ctrl.device(DEVICE), ctrl.job(job_id)
    assert dev.reason == "worker_lost"
    assert (job.state, job.kill_reason, job.lease_expires) == ("lost", "worker lost", None)
    # a late terminal report is a harmless 200; the device stays quarantined
    done = {"exit_code": 0, "state": "succeeded", "worker_id": WORKER_ID}
    r = await client.post(f"/v1/jobs/{job_id}/status", content=dumps(done))
    assert r.status_code == 200
    assert ctrl.job(job_id).state == "lost"
    # a re-registration with the proof brings it back (§10.3)
    await register(client, {**REGISTER, "recovery": {"survivors_checked": True}})
    assert ctrl.device(DEVICE).state == "ready"
    assert [e.kind for e in ctrl.events()] == ["device_recovered"]


async def test_served_reaper_sweeps_on_its_own(nursery: trio.Nursery) -> None:
    """``serve_controller`` runs the reaper every ``reaper_interval``: a silent worker's device
    goes unknown with no test call, once the heartbeat timeout has passed."""
    ctrl, client = await _serve(nursery, heartbeat_timeout=0.3, lost_after=120.0)
    async with client:
        await register(client)
        heard = ctrl.worker(WORKER_ID).last_heartbeat
        await ctrl.wait_for(lambda: ctrl.device(DEVICE).state == "unknown", timeout=10)
        assert trio.current_time() - heard >= 0.3


async def test_reregistration_reconciles_running_job(sim: Sim) -> None:
    ctrl, client = sim
    await register(client)
    job_id = ctrl.submit(DEVICE, ["sleep", "30"])
    await client.get(f"/v1/workers/{WORKER_ID}/assignments?wait=1s")
    await register(client)  # same boot id, survivors found: proves nothing
    job, dev = ctrl.job(job_id), ctrl.device(DEVICE)
    assert (job.state, job.kill_reason) == ("lost", "worker re-registered")
    assert (dev.state, dev.reason) == ("unhealthy", "registration")


async def test_status_errors(sim: Sim) -> None:
    ctrl, client = sim
    await register(client)
    job_id = ctrl.submit(DEVICE, ["true"])
    other = {"state": "running", "worker_id": "someone-else"}
    r = await client.post(f"/v1/jobs/{job_id}/status", content=dumps(other))
    assert r.status_code == 403
    assert r.json()["error"] == "not_job_owner"
    bad = {"state": "queued", "worker_id": WORKER_ID}
    r = await client.post(f"/v1/jobs/{job_id}/status", content=dumps(bad))
    assert r.json() == {"error": "bad_request", "message": "state must be running or terminal"}
    r = await client.post("/v1/jobs/nope/status", content=dumps({"state": "running"}))
    assert r.status_code == 404
    r = await client.post(f"/v1/jobs/{job_id}/status", content=b"{not json")
    assert r.status_code == 400
    r = await client.post(f"/v1/jobs/{job_id}/logs", content=b"x" * (1048576 + 1))
    assert r.status_code == 413
    assert ctrl.logs(job_id) == b""


async def test_submit_rules_and_hold(sim: Sim) -> None:
    ctrl, client = sim
    with pytest.raises(SimError):
        ctrl.submit(DEVICE, ["true"])  # no such device yet
    await register(client)
    with pytest.raises(SimError, match="runtime_above_ceiling"):
        ctrl.submit(DEVICE, ["true"], max_runtime_seconds=7200)
    hold = ctrl.submit(DEVICE, kind="hold", max_runtime_seconds=60)
    queued = ctrl.submit(
        DEVICE, ["env"], env={"A": "<b>"}, idle_timeout_seconds=5, stdio="pipe", cwd="/src"
    )
    assert ctrl.job(queued).state == "queued"  # one lease per device
    r = await client.get(f"/v1/workers/{WORKER_ID}/assignments?wait=1s")
    assert r.json()["assignments"] == [
        {
            "job_id": hold,
            "device_id": DEVICE,
            "command": ["hold"],
            "max_runtime_seconds": 60,
            "submitter": "sim@test",
            "kind": "hold",
        }
    ]
    killed = {"exit_code": 143, "reason": "max_runtime exceeded (1m0s)", "state": "killed"}
    r = await client.post(
        f"/v1/jobs/{hold}/status", content=dumps({**killed, "worker_id": WORKER_ID})
    )
    assert r.status_code == 200
    assert ctrl.events() == []  # holds never raise watchdog_trip
    r = await client.get(f"/v1/workers/{WORKER_ID}/assignments?wait=1s")
    (a,) = r.json()["assignments"]
    assert a == {
        "job_id": queued,
        "device_id": DEVICE,
        "command": ["env"],
        "cwd": "/src",
        "env": {"A": "<b>"},
        "max_runtime_seconds": 3600,
        "idle_timeout_seconds": 5,
        "submitter": "sim@test",
        "kind": "job",
        "stdio": "pipe",
    }
