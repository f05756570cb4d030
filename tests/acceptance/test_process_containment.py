"""Issue acceptance: containment by the kernel (docs/containment.md). Real cgroups under the
test's own parent; skipped where none can be had.

* ``fleet-trio exec --json``: the issue's example, and every escape variant, is killed and
  listed in ``sweep.found`` (scope ``cgroup``); ``--containment cgroup`` that cannot be had
  fails the start in one line.
* A real ``fleet-trio node`` started inside a delegated cgroup moves itself into ``agent/``
  and runs its jobs in ``jobs/<id>``; after ``kill -9`` and a restart, the crashed run's
  contained survivors (an escapee that stripped its markers included) are killed and their
  cgroups removed, and the log says so.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
import trio

from fleet_trio.proc.containment import AGENT_LEAF, JOBS_DIR
from fleet_trio.proc.procfs import pid_alive
from tests.helpers import CLI, fleet, gone_within, state_in, wait_until
from tests.node.harness import Node
from tests.proc.escapes import STRIP, VARIANTS, escape_command

ISSUE_EXAMPLE = (
    "setsid env -u RC_JOB_ID -u FLEET_JOB_ID -u FLEET_TRIO_SWEEP sleep 4321 >/dev/null 2>&1 & "
    "sleep 0.3; exit 0"
)


async def test_the_issues_example_reports_and_kills_the_escapee(cgroup_parent: str) -> None:
    done = await fleet("exec", "--job-id", "e1", "--json", "--", "sh", "-c", ISSUE_EXAMPLE)
    report = json.loads(done.stdout.decode().splitlines()[-1])
    assert done.returncode == 0, done.stderr
    assert report["sweep"]["scope"] == "cgroup", report
    assert len(report["sweep"]["found"]) == 1 and report["sweep"]["clean"], report
    assert await gone_within(report["sweep"]["found"][0], 10)


@pytest.mark.parametrize("variant", VARIANTS)
async def test_exec_kills_and_lists_every_escape_variant(
    variant: str, cgroup_parent: str, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pid"
    done = await fleet(
        "exec", "--job-id", "e2", "--json", "--containment", "cgroup",
        "--cgroup-base", cgroup_parent, "--", "sh", "-c", escape_command(variant, pidfile),
    )  # fmt: skip
    report = json.loads(done.stdout.decode().splitlines()[-1])
    pid = int(pidfile.read_text())
    assert done.returncode == 0, done.stderr
    assert pid in report["sweep"]["found"] and report["sweep"]["scope"] == "cgroup", report
    assert await gone_within(pid, 10)


async def test_containment_cgroup_that_cannot_be_had_fails_in_one_line(tmp_path: Path) -> None:
    done = await fleet(
        "exec", "--containment", "cgroup", "--cgroup-base", str(tmp_path), "--", "true"
    )
    assert done.returncode == 127
    assert done.stderr.decode().splitlines() == [
        f"fleet-trio exec: --containment cgroup: {tmp_path} is not a cgroup v2 directory"
    ]


@pytest.mark.slow
async def test_kill_9_of_the_node_then_restart_kills_the_contained_survivors(
    cgroup_parent: str, tmp_path: Path
) -> None:
    node = Node(tmp_path)
    node.log = tmp_path / "node.log"
    config = tmp_path / "node.yaml"
    raw = json.loads(config.read_text())
    pidfile = tmp_path / "escapee"
    escaper = (
        f"setsid {STRIP} sh -c 'echo $$ > {pidfile}; exec sleep 4321' </dev/null >/dev/null 2>&1 &"
        "\nexec sleep 600"
    )
    raw["tasks"]["escaper"] = {"command": ["sh", "-c", escaper]}
    config.write_text(json.dumps(raw))
    procs = os.path.join(cgroup_parent, "cgroup.procs")
    node.argv = ["sh", "-c", 'echo 0 > "$0" && exec "$@"', procs, *node.argv]
    try:
        with trio.fail_after(90):
            await node.start()
            assert node.proc is not None
            agent = Path(cgroup_parent, AGENT_LEAF, "cgroup.procs").read_text().split()
            assert str(node.proc.pid) in agent  # the node moved itself into agent/
            async with httpx.AsyncClient(base_url=node.url) as c:
                body = {"job_id": "k1", "task_type": "escaper", "payload": {}}
                assert (await c.post("/fleet/dispatch", json=body)).status_code == 202
                await wait_until(lambda: pidfile.exists() and pidfile.read_text().strip())
            escapee = int(pidfile.read_text())
            job_cgroup = Path(cgroup_parent, JOBS_DIR, "k1")
            assert str(escapee) in (job_cgroup / "cgroup.procs").read_text().split()
            await node.kill()
            assert pid_alive(escapee)  # the crash left it behind
            await node.start()
            assert not pid_alive(escapee)  # killed before the node served
            assert not job_cgroup.exists()
            log = node.log.read_text()
            assert "recovery: job cgroup k1: killed 2 process(es)" in log, log
            assert "; containment: cgroup)" in log, log  # named in the serving line
            async with httpx.AsyncClient(base_url=node.url) as c:
                assert await state_in(c, "k1", "error")
    finally:
        await node.close()


async def test_an_exec_killed_with_kill_9_is_cleaned_up_by_the_next_exec(
    cgroup_parent: str, tmp_path: Path
) -> None:
    """``fleet-trio exec`` killed with ``kill -9`` cannot remove its job cgroup; what ran in
    it lives on. The next exec with the cgroup backend in the same cgroup kills and removes
    it, and says so; a live exec's cgroup (its lock held) is never taken."""
    pidfile = tmp_path / "pid"
    flags = ("--containment", "cgroup", "--cgroup-base", cgroup_parent)
    script = f"echo $$ > {pidfile}; exec sleep 600"
    with trio.fail_after(60):
        victim = await trio.lowlevel.open_process(
            [*CLI, "exec", "--job-id", "k9", *flags, "--", "sh", "-c", script]
        )
        live = await trio.lowlevel.open_process(
            [*CLI, "exec", "--job-id", "alive", *flags, "--", "sleep", "600"]
        )
        try:
            job_pid = int(await wait_until(lambda: pidfile.exists() and pidfile.read_text()))
            left = Path(cgroup_parent, f"fleet-trio-exec-{victim.pid}-k9")
            mine = Path(cgroup_parent, f"fleet-trio-exec-{live.pid}-alive")
            await wait_until(lambda: mine.is_dir() and (mine / "cgroup.procs").read_text())
            victim.kill()
            await victim.wait()
            assert pid_alive(job_pid) and left.is_dir()  # left behind, with its job
            done = await fleet("exec", *flags, "--", "true")
            assert done.returncode == 0, done.stderr
            said = done.stderr.decode()
            assert f"cgroup fleet-trio-exec-{victim.pid}-k9 of an exec that is gone" in said
            assert "killed 1 process(es)" in said and "removed" in said, said
            assert await gone_within(job_pid, 10)
            assert not left.exists()
            assert mine.is_dir() and live.poll() is None  # the live exec's is not touched
        finally:
            for proc in (victim, live):
                if proc.poll() is None:
                    proc.terminate()
                    await proc.wait()
