"""worker-protocol.md §15.10–§15.11 (X): controller-side label storage and end-to-end runs.

These items are facts about the controller; here they run against the simulated controller
(``fleet_trio.sim``), through the worker's own client or the real worker, so they pin both the
worker's messages and the simulation that the rest of the suite trusts. The end-to-end items
(143–146) use the ``fleet_worker`` fixture (fleet_trio.sim.pytest_plugin).
"""

from __future__ import annotations

import json

import attrs
import httpx
import trio

from fleet_trio.sim import SimController
from fleet_trio.sim.harness import WorkerHandle
from tests.helpers import (
    AUTH,
    HOST,
    REG,
    controller,
    dev,
    quiet_for,
    until_terminal,
    with_running_job,
)


async def test_protocol_140_registration_stores_labels_by_source_with_host_facts() -> None:
    reg = attrs.evolve(
        REG,
        devices=(*REG.devices, attrs.evolve(REG.devices[0], name="gpu2")),
        labels={"": {"cpus": "2", "kernel": "6.1"}, "gpu0": {"cpus": "dev-wins"}, "gpu1": {}},
        declared_labels={"": {"site": "lab"}, "gpu0": {"rack": "r3"}},
    )
    with trio.fail_after(10):
        async with controller() as (ctrl, client):
            await client.register(reg)
            gpu0, gpu1, gpu2 = (ctrl.device(dev(n)) for n in ("gpu0", "gpu1", "gpu2"))
            # host facts reach every device present in the map; device values win collisions
            assert gpu0.detected_labels == {"cpus": "dev-wins", "kernel": "6.1"}
            assert gpu1.detected_labels == {"cpus": "2", "kernel": "6.1"}
            # the two sources are stored apart
            assert gpu0.declared_labels == {"site": "lab", "rack": "r3"}
            # absent from the map: untouched, not even the host facts
            assert gpu2.detected_labels == {} and gpu2.declared_labels == {}
            assert gpu1.declared_labels == {}


async def test_protocol_141_empty_device_map_clears_and_absent_labels_keep() -> None:
    with trio.fail_after(10):
        async with controller() as (ctrl, client):
            first = attrs.evolve(REG, labels={"gpu0": {"model": "H200"}, "gpu1": {"x": "1"}})
            await client.register(first)
            assert ctrl.device(dev("gpu0")).detected_labels == {"model": "H200"}
            # a registration without the labels field keeps what is stored
            await client.register(attrs.evolve(REG, labels=None))
            assert ctrl.device(dev("gpu0")).detected_labels == {"model": "H200"}
            # an explicit empty device map clears it
            await client.register(attrs.evolve(REG, labels={"gpu0": {}}))
            assert ctrl.device(dev("gpu0")).detected_labels == {}
            assert ctrl.device(dev("gpu1")).detected_labels == {"x": "1"}


async def test_protocol_142_push_route_stores_without_disturbing_and_checks_input() -> None:
    with trio.fail_after(10):
        async with with_running_job() as (ctrl, client, worker_id, job):
            push = attrs.evolve(REG, labels={"gpu0": {"model": "H200"}}, sheet="old sheet")
            assert await client.push_labels(worker_id, push)
            assert ctrl.device(dev("gpu0")).detected_labels == {"model": "H200"}
            assert ctrl.worker(worker_id).sheet == "old sheet"
            # the running job and its busy device are not disturbed
            assert ctrl.job(job).state == "running"
            assert ctrl.device(dev("gpu0")).state == "busy"
            url = f"{client.base_url}/v1/workers/{worker_id}/labels"

            async def raw(body: dict[str, object], path: str = url) -> httpx.Response:
                async with httpx.AsyncClient() as http:
                    return await http.post(path, content=json.dumps(body), headers=AUTH)

            exactly = "x" * 65536
            assert (await raw({"host": HOST, "sheet": exactly})).status_code == 200
            assert ctrl.worker(worker_id).sheet == exactly
            too_big = await raw({"host": HOST, "sheet": exactly + "y"})
            assert too_big.status_code == 413
            assert ctrl.worker(worker_id).sheet == exactly  # the old sheet stays
            unknown = url.replace(worker_id, "00000000-0000-0000-0000-000000000000")
            assert (await raw({"host": HOST}, unknown)).status_code == 404
            mismatch = await raw({"host": "another-host"})
            assert mismatch.status_code == 400
            assert "host does not match" in mismatch.json()["message"]


def queued_behind(ctrl: SimController, first: list[str], second: list[str]) -> tuple[str, str]:
    """Submit ``first`` then ``second`` on gpu0; the second waits queued behind the first."""
    a = ctrl.submit(dev("gpu0"), first)
    b = ctrl.submit(dev("gpu0"), second)
    assert ctrl.job(b).state == "queued"
    return a, b


async def test_protocol_143_submit_run_stream_succeed_then_next_job(
    fleet_worker: WorkerHandle,
) -> None:
    ctrl = fleet_worker.controller
    with trio.fail_after(20):
        first = ctrl.submit(dev("gpu0"), ["sh", "-c", "echo streamed; sleep 0.5"])
        await ctrl.wait_for(lambda: ctrl.logs(first) == b"streamed\n")
        assert ctrl.job(first).state == "running"  # streamed while it runs
        assert ctrl.device(dev("gpu0")).state == "busy"
        assert await until_terminal(ctrl, first) == ["running", "succeeded"]
        assert ctrl.job(first).exit_code == 0
        await ctrl.wait_for(lambda: ctrl.device(dev("gpu0")).state == "ready")
        second = ctrl.submit(dev("gpu0"), ["true"])
        assert await until_terminal(ctrl, second) == ["running", "succeeded"]


async def test_protocol_144_two_jobs_on_one_device_run_one_after_the_other(
    fleet_worker: WorkerHandle,
) -> None:
    ctrl = fleet_worker.controller
    with trio.fail_after(20):
        a, b = queued_behind(ctrl, ["sleep", "0.4"], ["sleep", "0.1"])
        await until_terminal(ctrl, a)
        await until_terminal(ctrl, b)
        ja, jb = ctrl.job(a), ctrl.job(b)
        assert ja.finished_at is not None and jb.started_at is not None
        assert jb.started_at >= ja.finished_at


async def test_protocol_145_killed_queued_job_never_runs(
    fleet_worker: WorkerHandle,
) -> None:
    ctrl = fleet_worker.controller
    with trio.fail_after(20):
        a, b = queued_behind(ctrl, ["sleep", "0.3"], ["sh", "-c", "echo RAN"])
        assert ctrl.kill(b)
        assert ctrl.job(b).state == "killed"
        await until_terminal(ctrl, a)
        await quiet_for(0.3, reason="a job killed while queued never runs")
        assert ctrl.statuses(b) == [] and ctrl.logs(b) == b""


async def test_protocol_146_raw_reregistration_during_a_job_quarantines_and_loses_it(
    fleet_worker: WorkerHandle, sleeping_job: str
) -> None:
    ctrl, worker, job = fleet_worker.controller, fleet_worker.worker, sleeping_job
    with trio.fail_after(20):
        body = dict(ctrl.registrations()[0])
        body.pop("recovery", None)
        async with httpx.AsyncClient() as http:
            r = await http.post(
                f"{ctrl.base_url}/v1/workers/register", content=json.dumps(body), headers=AUTH
            )
        assert r.status_code == 200
        assert ctrl.job(job).state == "lost"
        d = ctrl.device(dev("gpu0"))
        assert (d.state, d.reason) == ("unhealthy", "registration")
        assert job in worker.supervised()  # the real worker still runs it
