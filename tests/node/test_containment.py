"""Node jobs under the cgroup backend (docs/containment.md): an escapee that left the job's
session and stripped its markers is killed at the job's end and named in the node's log; a
crashed run's job cgroups are killed and removed at the next start, and the log says so."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from pathlib import Path

import pytest
import trio
from trio_websocket import open_websocket_url

from fleet_trio.errors import NodeStartError
from fleet_trio.node.jobs import JobTable
from fleet_trio.node.journal import Journal
from fleet_trio.node.recovery import recover
from fleet_trio.node.server import cgroup_recovered, open_containment
from fleet_trio.node.tasks import SWEEP_MARKER
from fleet_trio.proc.containment import (
    JOBS_DIR,
    CgroupContainment,
    ContainmentError,
    choose_for_agent,
)
from tests.helpers import gone_within, wait_until
from tests.node.harness import node_config, running_node
from tests.proc.escapes import VARIANTS, escape_command


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
    assert isinstance(chosen, CgroupContainment)
    chosen.release()
    assert said == [
        f"recovery: job cgroup j-crashed: killed 1 process(es) [{survivor.pid}], removed"
    ]
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


async def test_the_cgroup_recovery_replaces_the_journals_marker_sweep(
    cgroup_parent: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A previous run under the cgroup backend (its ``jobs/`` is there): the journal's
    recovery does not run the marker sweep as well; a first start (no ``jobs/`` yet) does."""
    first = choose_for_agent("cgroup", base=cgroup_parent)
    assert isinstance(first, CgroupContainment) and not first.previous
    assert not cgroup_recovered(first)
    first.release()  # as the first run's end does
    again = choose_for_agent("cgroup", base=cgroup_parent)
    again.release()
    assert isinstance(again, CgroupContainment) and again.previous and cgroup_recovered(again)
    journal = Journal(str(tmp_path / "j.sqlite"))
    journal.open()
    marked = await trio.lowlevel.open_process(
        ["sleep", "60"], env={**os.environ, SWEEP_MARKER: f"host.{journal.work_tag}/j1"}
    )
    try:
        with trio.fail_after(30):
            report = await recover(journal, JobTable(), kill_grace=0.5, marker_sweep=False)
        assert report.swept == {} and report.sweep.scope == "cgroup" and report.sweep.clean()
        assert marked.poll() is None  # not swept by marker: the cgroup recovery's job
        assert not [r for r in caplog.records if "could not be walked" in r.getMessage()]
        with trio.fail_after(30):
            report = await recover(journal, JobTable(), kill_grace=0.5)
            await marked.wait()
        assert report.swept  # the marker sweep, when it is not replaced
    finally:
        journal.close()
        marked.kill()
        with trio.fail_after(10):
            await marked.wait()


async def test_a_node_jobs_cpu_time_is_logged_sent_and_counted(
    cgroup_parent: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """At the job's end its cgroup's ``cpu.stat`` is read: the node's log line, the tail's
    ``end`` frame (``cpu_seconds``) and ``fleet_trio_node_job_cpu_seconds_total``."""
    burn = (
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
        "print('{}')\n"
    )
    task = {"command": [sys.executable, "-c", burn]}
    config = node_config(tmp_path, {"burn": task}, containment="cgroup", cgroup_base=cgroup_parent)
    caplog.set_level(logging.INFO, logger="fleet_trio.node")
    async with running_node(tmp_path, config) as h:
        assert (await h.dispatch("c1", "burn", {})).status_code == 202
        final = await h.wait_terminal("c1")
        assert final["state"] == "done", final
        url = h.node.url.replace("http://", "ws://") + "/fleet/jobs/c1/tail"
        async with open_websocket_url(url) as ws:
            frames = [json.loads(await ws.get_message())]
            while frames[-1]["type"] != "end":
                frames.append(json.loads(await ws.get_message()))
        end = frames[-1]
        assert end["cpu_seconds"] >= 0.3, end
        assert re.search(r"job c1: used cpu \d+\.\d\d s \(user ", caplog.text), caplog.text
        metrics = (await h.client.get("/metrics")).text
        counted = re.search(
            r'fleet_trio_node_job_cpu_seconds_total\{task_type="burn"\} (\S+)', metrics
        )
        assert counted and float(counted.group(1)) >= 0.3, metrics


def test_a_second_agent_never_takes_the_first_ones_jobs_cgroups(cgroup_parent: str) -> None:
    """Two nodes (or workers) in one delegated cgroup would share its ``jobs/``: the second's
    recovery would take the first's running jobs for a crashed run's and kill them. The first
    holds ``jobs/``; the second cannot have the cgroup backend there (``auto``: the marker
    backend, saying why)."""
    first = choose_for_agent("cgroup", base=cgroup_parent)
    try:
        with pytest.raises(ContainmentError, match="in use by another fleet-trio node or worker"):
            choose_for_agent("cgroup", base=cgroup_parent)
        fallback = choose_for_agent("auto", base=cgroup_parent)
        assert fallback.name == "marker" and "in use by another" in fallback.reason
    finally:
        first.release()
    after = choose_for_agent("cgroup", base=cgroup_parent)  # the first gone: free again
    after.release()


def test_a_tasks_limits_are_checked_at_load(tmp_path: Path) -> None:
    from fleet_trio.errors import ConfigError
    from fleet_trio.node.config import task_limits

    task = {"command": ["true"], "memory_max": "8G", "pids_max": 64, "cpu_weight": 200}
    config = node_config(tmp_path, {"t": task})
    limits = task_limits(config.tasks[0])
    assert (limits.memory_max, limits.memory_max_text) == (8 * 10**9, "8G")
    assert (limits.pids_max, limits.cpu_weight) == (64, 200)
    for key, bad in (("memory_max", "lots"), ("pids_max", 0), ("cpu_weight", 10001)):
        with pytest.raises(ConfigError) as caught:
            node_config(tmp_path, {"t": {"command": ["true"], key: bad}})
        assert caught.value.key == f"tasks.t.{key}"
        assert str(tmp_path / "node.yaml") in str(caught.value)


async def test_a_tasks_limit_under_the_marker_backend_fails_the_start(tmp_path: Path) -> None:
    from fleet_trio.node.server import configured_limits

    config = node_config(tmp_path, {"t": {"command": ["true"], "pids_max": 5}})
    with pytest.raises(NodeStartError) as caught:
        await open_containment("marker", "", lambda line: None, configured_limits(config))
    assert str(caught.value) == (
        f"tasks.t in {tmp_path / 'node.yaml'}: pids_max needs the cgroup backend"
        " (containment is marker; docs/containment.md)"
    )


async def test_a_tasks_limit_without_its_controller_fails_the_start(
    cgroup_parent: str, tmp_path: Path
) -> None:
    """Real: this cgroup v2 subtree lacks the controller (skipped where it has them all)."""
    from fleet_trio.node.server import configured_limits

    offered = Path(cgroup_parent, "cgroup.controllers").read_text().split()
    missing = [
        (k, c)
        for k, c in (("memory_max", "memory"), ("pids_max", "pids"), ("cpu_weight", "cpu"))
        if c not in offered
    ]
    if not missing:
        pytest.skip(f"the cgroup v2 subtree offers every limit's controller ({offered})")
    key, controller = missing[0]
    value: object = "1GiB" if key == "memory_max" else 64
    config = node_config(tmp_path, {"t": {"command": ["true"], key: value}})
    with pytest.raises(NodeStartError) as caught:
        await open_containment(
            "cgroup", cgroup_parent, lambda line: None, configured_limits(config)
        )
    text = str(caught.value)
    assert text.startswith(
        f"tasks.t in {tmp_path / 'node.yaml'}: {key} needs the {controller} controller,"
        " which is not enabled for the job cgroups ("
    ), text
    assert "\n" not in text
    again = await open_containment("cgroup", cgroup_parent, lambda line: None)
    assert isinstance(again, CgroupContainment)  # the failed start gave jobs/ back
    again.release()
