"""node.md §9, items 102–108 (behaviours specified beyond upstream's tests)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import trio

from fleet_trio.node.app import snapshot_problem
from fleet_trio.node.jobs import INTERRUPTED, JobState
from tests.helpers import dispatch_as, scenario_pause, state_in, wait_until
from tests.node.harness import (
    FakeSampler,
    FakeSnapshot,
    echo_task,
    node_config,
    running_node,
    runs,
    work_dirs,
)


def tasks(tmp_path: Path) -> dict[str, object]:
    return {"image-gen": echo_task(tmp_path, family="sdxl")}


async def test_node_102_superseded_known_ids_reack_through_a_drain(tmp_path: Path) -> None:
    """Item 102 ("503 even for an id that is already done") is superseded (docs/node.md,
    "Dispatch during a drain"): a known id re-acks through a drain — 202 for a running or done
    job, 409 for a failed one — and only a new id gets 503. Nothing runs twice."""
    # a drain long enough for running-1 (1 s) on a loaded machine: the drain ends when it does
    cfg = node_config(tmp_path, tasks(tmp_path), timings={"drain_timeout": "20s"})
    async with running_node(tmp_path, cfg) as h:
        await h.dispatch("done-1", "image-gen", {})
        assert (await h.wait_terminal("done-1"))["state"] == "done"
        await h.dispatch("failed-1", "image-gen", {"exit": 3})
        assert (await h.wait_terminal("failed-1"))["state"] == "error"
        await h.dispatch("running-1", "image-gen", {"sleep": 1.0})
        await wait_until(lambda: state_in(h.client, "running-1", "running"), timeout=5)
        h.node.request_shutdown()
        assert h.node.store.draining
        for job in ("running-1", "done-1"):
            r = await h.dispatch(job, "image-gen", {})
            assert r.status_code == 202, (job, r.text)
            assert r.json() == {"job_id": job, "status": "accepted"}
        r = await h.dispatch("failed-1", "image-gen", {})
        assert r.status_code == 409
        assert r.json()["error"].startswith("job previously failed on this node: ")
        r = await h.dispatch("new-1", "image-gen", {})
        assert r.status_code == 503 and r.json()["error"] == "node draining"
        assert (await h.poll("new-1")).status_code == 404
        assert (await h.poll("done-1")).json()["state"] == "done"  # polls keep working
        assert (await h.wait_terminal("running-1"))["state"] == "done"  # within the drain
    for job in ("done-1", "failed-1", "running-1"):
        assert runs(tmp_path, job) == 1, job
    assert runs(tmp_path, "new-1") == 0


async def test_node_103_health_200_during_drain(tmp_path: Path) -> None:
    async with running_node(tmp_path, node_config(tmp_path, tasks(tmp_path))) as h:
        await h.dispatch("hold", "image-gen", {"sleep": 0.5})
        await wait_until(lambda: state_in(h.client, "hold", "running"), timeout=5)
        h.node.request_shutdown()
        r = await h.client.get("/fleet/health")
        assert r.status_code == 200 and r.json()["queue_depth"] == 1


async def test_node_104_sigterm_drains_like_sigint(tmp_path: Path) -> None:
    for signo in (signal.SIGTERM, signal.SIGINT):
        cfg = node_config(
            tmp_path, tasks(tmp_path), timings={"drain_timeout": "200ms", "kill_grace": "500ms"}
        )
        t0 = trio.current_time()
        async with running_node(tmp_path, cfg, signals=(signal.SIGTERM, signal.SIGINT)) as h:
            job = f"long-{signo.name}"
            assert (await h.dispatch(job, "image-gen", {"sleep": 30})).status_code == 202
            await wait_until(
                lambda j=job: h.node.store.get(j).state is JobState.RUNNING,  # type: ignore[union-attr]
                timeout=5,
            )
            await scenario_pause(0.2, why="the job is well under way when the signal comes")
            os.kill(os.getpid(), signo)
            await wait_until(lambda: bool(h.node.store.draining), timeout=5)
            r = await h.dispatch("after", "image-gen", {})
            assert r.status_code == 503
            node = h.node
        view = node.store.get(job)
        assert view is not None and view.state is JobState.ERROR and view.error == INTERRUPTED
        assert trio.current_time() - t0 < 10


async def test_node_105_json_with_charset_accepted(tmp_path: Path) -> None:
    async with running_node(tmp_path, node_config(tmp_path, tasks(tmp_path))) as h:
        r = await dispatch_as(h.client, "Application/JSON; charset=utf-8", "c1")
        assert r.status_code == 202


async def test_node_106_missing_content_type_accepted(tmp_path: Path) -> None:
    async with running_node(tmp_path, node_config(tmp_path, tasks(tmp_path))) as h:
        r = await dispatch_as(h.client, None, "c2")
        assert "content-type" not in {k.lower() for k in r.request.headers}
        assert r.status_code == 202


async def test_node_107_refused_duplicate_leaves_no_files(tmp_path: Path) -> None:
    task = echo_task(
        tmp_path, materialize={"graph": "graph.json"}, payload={"graph": {"type": "object"}}
    )
    async with running_node(tmp_path, node_config(tmp_path, {"run-graph": task})) as h:
        payload = {"graph": {"1": {}}, "sleep": 0.5}
        assert (await h.dispatch("dup", "run-graph", payload)).status_code == 202
        for _ in range(5):
            assert (await h.dispatch("dup", "run-graph", payload)).status_code == 202
        assert len(work_dirs(tmp_path)) == 1
        await h.wait_terminal("dup")
        await wait_until(lambda: not work_dirs(tmp_path), timeout=2)


def test_node_108_exactly_30s_boundary() -> None:
    snap = FakeSnapshot(16.0, 2.0, 14.0, taken_at=100.0)
    assert snapshot_problem(snap, None, 130.0, 30.0) is None
    assert snapshot_problem(snap, None, 130.000001, 30.0) == "vram snapshot stale"
    assert snapshot_problem(None, "no vram snapshot yet", 0, 30) == "vram snapshot unavailable"
    bad = FakeSnapshot(0.0, 0.0, 0.0, taken_at=100.0)
    assert snapshot_problem(bad, None, 100.0, 30.0) == "vram snapshot unavailable"
    nan = FakeSnapshot(float("nan"), 0.0, float("nan"), taken_at=100.0)
    assert snapshot_problem(nan, None, 100.0, 30.0) == "vram snapshot unavailable"


async def test_node_108_snapshot_near_30s_served(tmp_path: Path) -> None:
    sampler = FakeSampler()
    sampler.max_age = 1e9  # let the node's own staleness rule decide
    async with running_node(tmp_path, node_config(tmp_path, {}), sampler=sampler) as h:
        sampler.publish(16, 2, age=0)
        snap = sampler.snap
        assert snap is not None
        # Freeze "now - taken_at" at exactly 30 s from the handler's point of view.
        snap.taken_at = trio.current_time() - 30.0 + 0.5
        assert (await h.client.get("/fleet/health")).status_code == 200
        snap.taken_at = trio.current_time() - 30.5
        r = await h.client.get("/fleet/health")
        assert r.status_code == 503 and r.json()["error"] == "vram snapshot stale"
