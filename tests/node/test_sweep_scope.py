"""The node's sweep finds a job's escapees by ``FLEET_TRIO_SWEEP=<node id>.<work tag>/<job id>``,
so a dispatch that reuses an id can never make it signal a process that is not one of its jobs'
(another node's job on the same host, even under the same node id, or any process that sets
``FLEET_JOB_ID`` itself)."""

from __future__ import annotations

import os
from pathlib import Path

import trio

from fleet_trio.node.tasks import SWEEP_MARKER, sweep_value
from tests.helpers import wait_until
from tests.node.harness import Harness, echo_task, node_config, running_node


def _alive(proc: trio.Process) -> bool:
    return proc.poll() is None


async def test_a_reused_job_id_never_sweeps_a_stranger(tmp_path: Path) -> None:
    env = dict(os.environ, FLEET_JOB_ID="victim1", **{SWEEP_MARKER: "other-node/victim1"})
    stranger = await trio.lowlevel.open_process(["sleep", "60"], env=env)  # another node's job
    try:
        config = node_config(tmp_path, {"echo": echo_task(tmp_path)})
        async with running_node(tmp_path, config) as h:
            assert (await h.dispatch("victim1", "echo", {"x": 1})).status_code == 202
            assert (await h.wait_terminal("victim1"))["state"] == "done"
            with trio.move_on_after(0.5):  # the job's sweep has run by its end: check it held
                await wait_until(lambda: not _alive(stranger))
            assert _alive(stranger)
    finally:
        stranger.kill()
        with trio.fail_after(10):
            await stranger.wait()


def test_the_sweep_value_names_the_node() -> None:
    assert sweep_value("vm1", "j1") == "vm1/j1"
    assert sweep_value("", "j1") == "j1"


async def test_two_nodes_under_one_id_never_sweep_each_others_jobs(tmp_path: Path) -> None:
    """Two nodes on one host under the same node id (the hostname is the default), each with
    its own journal, both run a job ``j1``: the end of one's ``j1`` sweeps its own processes
    only, and the other's ``j1`` runs on."""
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    slow = {"command": ["sh", "-c", "sleep 30"]}
    forks = {"command": ["sh", "-c", "/bin/true; echo {}"]}  # a fork: the sweep walks /proc
    async with running_node(b_dir, node_config(b_dir, {"slow": slow})) as b:
        assert (await b.dispatch("j1", "slow", {})).status_code == 202
        await wait_until(lambda: _state(b, "j1"), what="b's j1 running")
        async with running_node(a_dir, node_config(a_dir, {"forks": forks})) as a:
            assert a.node.url != b.node.url
            assert (await a.dispatch("j1", "forks", {})).status_code == 202
            assert (await a.wait_terminal("j1"))["state"] == "done"
        with trio.move_on_after(0.5):  # a's sweep has run by its job's end: check b's job held
            await wait_until(lambda: _state(b, "j1", "error"))
        assert (await b.client.get("/fleet/jobs/j1")).json()["state"] == "running"


async def _state(h: Harness, job_id: str, want: str = "running") -> bool:
    return bool((await h.client.get(f"/fleet/jobs/{job_id}")).json()["state"] == want)
