"""The node's sweep finds a job's escapees by ``FLEET_TRIO_SWEEP=<node id>/<job id>``, so a
dispatch that reuses an id can never make it signal a process that is not one of its jobs'
(another node's job on the same host, or any process that sets ``FLEET_JOB_ID`` itself)."""

from __future__ import annotations

import os
from pathlib import Path

import trio

from fleet_trio.node.tasks import SWEEP_MARKER, sweep_value
from tests.helpers import wait_until
from tests.node.harness import echo_task, node_config, running_node


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
