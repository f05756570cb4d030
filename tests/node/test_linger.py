"""The poll linger: after the drain the node answers ``GET /fleet/jobs/{id}`` (only) until
every job the shutdown ended has been polled in its terminal state, or ``poll_linger`` passes."""

from __future__ import annotations

from pathlib import Path

import trio

from fleet_trio.node.jobs import JobState
from tests.helpers import answer, wait_until
from tests.node.harness import Harness, echo_task, node_config, running_node


def config(tmp_path: Path, linger: str) -> object:
    return node_config(
        tmp_path,
        {"image-gen": echo_task(tmp_path)},
        timings={"drain_timeout": "200ms", "kill_grace": "500ms", "poll_linger": linger},
    )


async def running(h: Harness, job_id: str) -> None:
    assert (await h.dispatch(job_id, "image-gen", {"sleep": 30})).status_code == 202
    await wait_until(lambda: h.node.store.get(job_id) is not None, timeout=5)
    await wait_until(lambda: h.node.store.get(job_id).state is JobState.RUNNING, timeout=5)  # type: ignore[union-attr]


async def wait_gone(h: Harness) -> float:
    """Poll until the listener closes; the time it took."""
    t0 = trio.current_time()

    async def closed() -> bool:
        return await answer(h.client, "/fleet/jobs/none", timeout=1) is None

    await wait_until(closed, timeout=30, interval=0.02, what="the listener closed")
    return trio.current_time() - t0


async def test_linger_serves_polls_only_and_ends_once_polled(tmp_path: Path) -> None:
    async with running_node(tmp_path, config(tmp_path, "20s")) as h:  # type: ignore[arg-type]
        await running(h, "j1")
        await h.dispatch("done-1", "image-gen", {})
        await h.wait_terminal("done-1")
        h.node.request_shutdown()
        await wait_until(lambda: bool(h.node.context.linger.active), timeout=10)
        # the linger: health, metrics and new dispatches are refused, polls are answered
        health = await h.client.get("/fleet/health")
        assert health.status_code == 503 and health.json()["error"] == "node draining"
        assert (await h.client.get("/metrics")).status_code == 503
        assert (await h.dispatch("new", "image-gen", {})).status_code == 503
        assert (await h.dispatch("done-1", "image-gen", {})).status_code == 202  # known: re-ack
        assert (await h.poll("done-1")).json()["state"] == "done"
        assert (await h.client.get("/fleet/jobs/zzz")).status_code == 404
        # the job the shutdown ended: one poll reads its terminal state, and the linger ends
        r = await h.poll("j1")
        assert r.json() == {"job_id": "j1", "state": "error", "error": "interrupted"}
        assert await wait_gone(h) < 5.0  # far below the 20 s linger


async def test_linger_is_bounded_without_pollers(tmp_path: Path) -> None:
    async with running_node(tmp_path, config(tmp_path, "1500ms")) as h:  # type: ignore[arg-type]
        await running(h, "j1")
        h.node.request_shutdown()
        await wait_until(lambda: bool(h.node.context.linger.active), timeout=10)
        gone = await wait_gone(h)  # polls of other ids do not end it
        # The lower bound is the linger's; the upper bound only says "bounded, not hung", with
        # slack for a loaded 2-core machine.
        assert 1.0 <= gone < 1.5 + 5.0, gone
        assert h.node.tree.shutdown_bound >= 1.5


async def test_no_linger_when_no_job_was_in_flight(tmp_path: Path) -> None:
    async with running_node(tmp_path, config(tmp_path, "20s")) as h:  # type: ignore[arg-type]
        await h.dispatch("done-1", "image-gen", {})
        await h.wait_terminal("done-1")
        h.node.request_shutdown()
        assert await wait_gone(h) < 10.0  # far below the 20 s linger, slack for a loaded box


async def test_second_request_ends_the_linger(tmp_path: Path) -> None:
    async with running_node(tmp_path, config(tmp_path, "20s")) as h:  # type: ignore[arg-type]
        await running(h, "j1")
        h.node.request_shutdown()
        await wait_until(lambda: bool(h.node.context.linger.active), timeout=10)
        h.node.request_shutdown("second signal")
        assert await wait_gone(h) < 10.0  # far below the 20 s linger, slack for a loaded box
