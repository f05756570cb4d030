"""Node jobs under the cgroup backend (docs/containment.md): an escapee that left the job's
session and stripped its markers is killed at the job's end and named in the node's log; a
crashed run's job cgroups are killed and removed at the next start, and the log says so."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import trio

from fleet_trio.errors import NodeStartError
from fleet_trio.node.server import open_containment
from fleet_trio.proc.containment import JOBS_DIR, CgroupContainment
from tests.helpers import gone_within, wait_until
from tests.node.harness import node_config, running_node
from tests.proc.test_containment import VARIANTS, escape_command


@pytest.mark.parametrize("variant", VARIANTS)
async def test_a_node_jobs_escapee_dies_with_it(
    variant: str, cgroup_parent: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pidfile = tmp_path / "pid"
    command = escape_command(variant, pidfile).replace("exit 0", "echo '{}'")  # a JSON result
    task = {"command": ["sh", "-c", command]}
    config = node_config(
        tmp_path, {"escape": task}, containment="cgroup", cgroup_base=cgroup_parent
    )
    caplog.set_level(logging.WARNING, logger="fleet_trio.node")
    async with running_node(tmp_path, config) as h:
        assert (await h.dispatch("e1", "escape", {})).status_code == 202
        final = await h.wait_terminal("e1")
        assert final["state"] == "done", final
        pid = int(pidfile.read_text())
        assert await gone_within(pid, 10)
        assert f"processes [{pid}] outlived the group" in caplog.text
        metrics = (await h.client.get("/metrics")).text
        assert 'fleet_trio_containment_info{backend="cgroup"} 1.0' in metrics
    jobs = Path(cgroup_parent, JOBS_DIR)
    assert [p for p in jobs.iterdir() if p.is_dir()] == []  # the job's cgroup was removed


async def test_a_crashed_runs_job_cgroups_are_emptied_and_removed(cgroup_parent: str) -> None:
    jobs = CgroupContainment(jobs_dir=os.path.join(cgroup_parent, JOBS_DIR))
    os.mkdir(jobs.jobs_dir)
    cg = jobs.create("j-crashed")
    survivor = await trio.lowlevel.open_process(
        ["sh", "-c", f"echo 0 > {cg.procs_file}; exec sleep 600"]
    )
    await wait_until(lambda: cg.procs() == [survivor.pid], timeout=10)
    said: list[str] = []
    with trio.fail_after(20):
        chosen = await open_containment("cgroup", cgroup_parent, said.append)
        await survivor.wait()
    assert chosen.name == "cgroup"
    assert (
        said[1] == f"recovery: job cgroup j-crashed: killed 1 process(es) [{survivor.pid}], removed"
    )
    assert not os.path.exists(cg.path)


async def test_containment_cgroup_that_cannot_be_had_fails_the_start(tmp_path: Path) -> None:
    with pytest.raises(
        NodeStartError, match=r"^containment: cgroup: .* is not a cgroup v2 directory$"
    ):
        await open_containment("cgroup", str(tmp_path), lambda line: None)


def test_an_unknown_containment_names_its_key(tmp_path: Path) -> None:
    from fleet_trio.errors import ConfigError

    with pytest.raises(ConfigError, match=r"node\.containment"):
        node_config(tmp_path, {}, containment="jail")
