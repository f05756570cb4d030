"""The simulated Fleet Dispatcher against real in-process nodes (fake GPU, real child jobs)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from fleet_trio.sim.dispatcher import LOST_404, SimDispatcher, serve_dispatcher
from fleet_trio.sim.faults import FaultyLink, serve_link
from tests.helpers import quiet_for, scenario_pause, wait_until
from tests.node.conftest import PY, TASK_SCRIPT
from tests.node.harness import FakeFootprints, FakeSampler, Harness, node_config, running_node

FAST = {"health_interval": 0.1, "poll_interval": 0.03, "request_timeout": 3.0}


def tasks(*names: str) -> dict[str, Any]:
    return {name: {"command": [PY, "-c", TASK_SCRIPT]} for name in names}


@asynccontextmanager
async def nodes(tmp_path: Path, **specs: dict[str, Any]) -> AsyncIterator[dict[str, Harness]]:
    """One running node per keyword; spec keys: ``tasks`` (names), ``free`` (GiB),
    ``footprints``, ``token``."""
    out = {}
    async with AsyncExitStack() as stack:
        for name, spec in specs.items():
            root = tmp_path / name
            root.mkdir()
            free = spec.get("free", 12.0)
            out[name] = await stack.enter_async_context(
                running_node(
                    root,
                    node_config(root, tasks(*spec.get("tasks", ("gen",)))),
                    node_id=name,
                    sampler=FakeSampler(total=16.0, used=16.0 - free),
                    footprints=FakeFootprints(spec.get("footprints", ())),
                    token=spec.get("token"),
                )
            )
        yield out


async def test_placement_skips_unsupported_and_full_nodes_and_prefers_free_vram(
    tmp_path: Path,
) -> None:
    fp = [{"model_family": "sdxl", "task_type": "gen", "vram_peak_gb": 9.6}]
    async with (
        nodes(
            tmp_path,
            other=dict(tasks=("stt",), free=15.0),  # task not supported
            full=dict(free=14.0, footprints=[{**fp[0], "vram_peak_gb": 14.5}]),  # no room
            roomy=dict(free=12.0, footprints=fp),
            small=dict(free=10.0, footprints=fp),
        ) as n,
        trio.open_nursery() as nursery,
    ):
        disp = SimDispatcher([h.node.url for h in n.values()], **FAST)
        await nursery.start(serve_dispatcher, disp)
        assert disp.health(n["roomy"].node.url)["node_id"] == "roomy"  # type: ignore[index]

        rec = await disp.submit(
            "gen", model_family="sdxl", payload={"result": {"ok": 1}}, job_id="job-1"
        )
        assert rec.state in ("acked", "running")
        assert rec.node == n["roomy"].node.url
        assert rec.attempts == [(n["roomy"].node.url, 202, "accepted")]
        done = await disp.wait("job-1", timeout=15)
        assert done is rec and rec.state == "done" and rec.result == {"ok": 1}
        assert rec.states_seen[-1] == "done" and rec.terminal_polls == 1
        assert disp.record("job-1") is rec and disp.records() == [rec]

        # with the footprint margin, 12 GiB free no longer covers 9.6 + 3 either: unplaced
        disp.vram_margin_gb = 3.0
        rec2 = await disp.submit("gen", model_family="sdxl", job_id="job-2")
        assert rec2.state == "unplaced" and rec2.attempts == []
        assert rec2.error is not None
        assert "not supported" in rec2.error and "12.6 GiB" in rec2.error
        # no model_family: no footprint applies, the node with most free VRAM that has the
        # task wins
        rec3 = await disp.submit("gen", payload={"result": {}})
        assert rec3.node == n["full"].node.url and len(rec3.job_id) == 32
        await disp.wait(rec3.job_id, timeout=15)
        nursery.cancel_scope.cancel()

    kinds = {(o.node, o.kind) for o in disp.observations()}
    for h in n.values():
        assert (h.node.url, "health") in kinds
    polls = [o for o in disp.observations(n["roomy"].node.url) if o.kind == "poll"]
    assert polls and polls[-1].detail == "done" and polls[-1].status == 200
    assert all(o.job_id == "job-1" for o in polls)
    assert [o.kind for o in disp.observations(n["other"].node.url)] == ["health"] * len(
        disp.observations(n["other"].node.url)
    )


async def test_refusals_move_on_and_states_seen_in_order(tmp_path: Path) -> None:
    async with (
        nodes(tmp_path, draining=dict(free=15.0), ok=dict(free=8.0)) as n,
        trio.open_nursery() as nursery,
    ):
        n["draining"].node.store.begin_drain()  # dispatch answers 503 "node draining"
        disp = SimDispatcher([n["draining"].node.url, n["ok"].node.url], **FAST)
        await nursery.start(serve_dispatcher, disp)
        rec = await disp.submit("gen", payload={"sleep": 0.6, "result": {"v": 2}}, job_id="j")
        assert rec.attempts == [
            (n["draining"].node.url, 503, "node draining"),
            (n["ok"].node.url, 202, "accepted"),
        ]
        await disp.wait("j", timeout=15)
        assert rec.state == "done" and rec.result == {"v": 2}
        assert "running" in rec.states_seen and rec.states_seen[-1] == "done"
        order = ["accepted", "running", "done"]
        assert [s for s in order if s in rec.states_seen] == rec.states_seen
        # a failing job: error with the node's text
        bad = await disp.submit("gen", payload={"exit": 3}, job_id="bad")
        await disp.wait("bad", timeout=15)
        assert bad.state == "error" and bad.error and bad.states_seen[-1] == "error"
        # nothing accepts: unplaced, and the summary names the refusal
        none = SimDispatcher([n["draining"].node.url], **FAST)
        lone = await none.submit("gen", job_id="x")
        assert lone.state == "unplaced" and lone.error and "node draining" in lone.error
        assert (await none.wait("x", timeout=1)) is lone
        nursery.cancel_scope.cancel()
    refusals = [o for o in disp.observations() if o.kind == "dispatch" and o.status == 503]
    assert [o.job_id for o in refusals] == ["j", "bad"]


async def test_injected_5xx_on_a_link_makes_it_try_the_next_node(tmp_path: Path) -> None:
    async with (
        nodes(tmp_path, a=dict(free=15.0), b=dict(free=4.0)) as n,
        trio.open_nursery() as nursery,
    ):
        port = int(n["a"].node.url.rsplit(":", 1)[1])
        link = FaultyLink("127.0.0.1", port, name="to-a")
        await nursery.start(serve_link, link)
        # slow health refresh, so the injected failure meets the dispatch, not a probe
        disp = SimDispatcher([link.url, n["b"].node.url], health_interval=60, poll_interval=0.03)
        await nursery.start(serve_dispatcher, disp)
        link.fail_http(502)
        link.drop_all()  # the pooled health connection would otherwise carry the dispatch
        await scenario_pause(0.05, why="the dropped connections close")
        rec = await disp.submit("gen", payload={"result": {}}, job_id="via-link")
        assert rec.attempts[0] == (link.url, 502, "injected")
        assert rec.node == n["b"].node.url
        await disp.wait("via-link", timeout=15)
        assert rec.state == "done"
        # a connection error counts as a refusal as well
        link.drop(5)
        link.drop_all()
        await scenario_pause(0.05, why="the dropped connections close")
        rec2 = await disp.submit("gen", payload={"result": {}}, job_id="dropped")
        assert rec2.attempts[0][0] == link.url and rec2.attempts[0][1] is None
        assert rec2.node == n["b"].node.url
        nursery.cancel_scope.cancel()


async def test_submit_and_wait_work_without_serve_and_with_a_token(tmp_path: Path) -> None:
    async with nodes(tmp_path, a=dict(token="s3cret")) as n:
        url = n["a"].node.url
        disp = SimDispatcher([url], token="s3cret", poll_interval=0.03)
        rec = await disp.submit("gen", payload={"result": {"x": 1}}, job_id="nosrv")
        assert rec.node == url and disp.health(url) is not None
        await disp.wait("nosrv", timeout=15)
        assert rec.state == "done" and rec.result == {"x": 1}
        # without the token: health is 401, so the node is skipped with the reason
        anon = SimDispatcher([url])
        rec2 = await anon.submit("gen", job_id="anon")
        assert rec2.state == "unplaced" and rec2.error and "401" in rec2.error
        assert anon.observations(url)[0].status == 401


async def test_job_forgotten_by_a_restarted_node_ends_lost(tmp_path: Path) -> None:
    async with nodes(tmp_path, a={}, b={}) as n, trio.open_nursery() as nursery:
        port_a = int(n["a"].node.url.rsplit(":", 1)[1])
        port_b = int(n["b"].node.url.rsplit(":", 1)[1])
        link = FaultyLink("127.0.0.1", port_a)
        await nursery.start(serve_link, link)
        disp = SimDispatcher([link.url], lost_after=0.3, **FAST)
        await nursery.start(serve_dispatcher, disp)
        rec = await disp.submit("gen", payload={"sleep": 5}, job_id="long")
        assert rec.node == link.url
        await disp.wait_for(lambda: rec.states_seen)
        # "the node restarted": the link now leads to a node that never saw the job
        link.retarget("127.0.0.1", port_b)
        link.drop_all()
        await disp.wait("long", timeout=10)
        assert rec.state == "error" and rec.error == LOST_404
        assert any(o.status == 404 for o in disp.observations(link.url) if o.kind == "poll")
        n["a"].node.request_shutdown("test over")  # do not wait out the 5 s job
        nursery.cancel_scope.cancel()


async def test_connection_errors_never_end_a_job(tmp_path: Path) -> None:
    async with nodes(tmp_path, a={}) as n, trio.open_nursery() as nursery:
        port = int(n["a"].node.url.rsplit(":", 1)[1])
        link = FaultyLink("127.0.0.1", port)
        await nursery.start(serve_link, link)
        disp = SimDispatcher([link.url], lost_after=0.1, terminal_confirmations=3, **FAST)
        await nursery.start(serve_dispatcher, disp)
        rec = await disp.submit("gen", payload={"sleep": 0.5, "result": {}}, job_id="j")
        link.drop(1000)
        link.drop_all()

        def poll_errors() -> list[Any]:
            return [o for o in disp.observations(link.url) if o.kind == "poll" and o.status is None]

        def failing_past_lost_after() -> bool:
            # failed polls (each one retried) for three times ``lost_after``: a 404 run that
            # long would have ended the job
            counted = [o for o in poll_errors() if not o.detail.endswith("(retried)")]
            return len(counted) >= 2 and counted[-1].at - poll_errors()[0].at >= 0.3

        await wait_until(failing_past_lost_after, timeout=15)
        assert rec.state in ("acked", "running")
        errors = poll_errors()
        # each failed poll was retried once on a new connection before it counted
        assert errors and errors[0].detail.endswith("(retried)")
        assert not errors[1].detail.endswith("(retried)") and errors[1].job_id == "j"
        link.heal()
        await disp.wait("j", timeout=15)
        assert rec.state == "done"
        # terminal_confirmations=3: three terminal polls, then polling stops
        await disp.wait_for(lambda: rec.terminal_polls >= 3, timeout=5)
        await quiet_for(0.2, reason="polling stops after three terminal polls")
        done_polls = [o for o in disp.observations() if o.kind == "poll" and o.detail == "done"]
        assert len(done_polls) == 3 and rec.terminal_polls == 3
        nursery.cancel_scope.cancel()


async def test_duplicate_job_id_is_refused() -> None:
    disp = SimDispatcher([])
    rec = await disp.submit("gen", job_id="same")
    assert rec.state == "unplaced" and rec.error and "no nodes" in rec.error
    again = await disp.submit("gen", job_id="same")  # an unplaced job may be retried
    assert again is rec
    rec.state = "acked"
    with pytest.raises(ValueError, match="already submitted"):
        await disp.submit("gen", job_id="same")


async def test_add_a_node_while_serving(tmp_path: Path) -> None:
    async with nodes(tmp_path, a={}) as n, trio.open_nursery() as nursery:
        disp = SimDispatcher(**FAST)
        await nursery.start(serve_dispatcher, disp)
        disp.add_node(n["a"].node.url + "/")
        assert disp.nodes == [n["a"].node.url]
        await disp.wait_for(lambda: disp.healthy(n["a"].node.url), timeout=5)
        nursery.cancel_scope.cancel()
