"""Restart recovery stops every process the journal's previous runs left behind, found by
the journal's work tag in their ``FLEET_TRIO_SWEEP`` marker, whatever the job's journaled state
(a ``kill -9`` during a drain leaves a job already journaled ``interrupted`` with its processes
running) and whatever node id the previous run had — never a process of another journal."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from fleet_trio.node.jobs import JobTable
from fleet_trio.node.journal import Journal
from fleet_trio.node.recovery import TaggedScan, marker_tag, recover
from fleet_trio.node.tasks import SWEEP_MARKER
from fleet_trio.proc.procfs import pid_alive
from tests.helpers import wait_until
from tests.node.harness import Node

# A job whose leader ignores SIGTERM (so a drain's group stop takes the whole kill_grace) and
# whose child left the job's session first (an escapee only the marker sweep finds). Writes
# "<leader pid> <escapee pid>" to $PIDS/<job id> once both exist.
ESCAPER = """
import os, signal, sys, time
sys.stdin.read()
child = os.fork()
if child == 0:
    os.setsid()
    time.sleep(300)
    os._exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
path = os.path.join(os.environ["PIDS"], os.environ["FLEET_JOB_ID"])
with open(path + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {child}")
os.rename(path + ".tmp", path)
time.sleep(300)
"""


def _node(tmp_path: Path, *args: str, drain: str = "5s", grace: str = "3s") -> Node:
    node = Node(tmp_path)
    pids = tmp_path / "pids"
    pids.mkdir(exist_ok=True)
    cfg = tmp_path / "escape.yaml"
    raw = {
        "node": {"timings": {"drain_timeout": drain, "kill_grace": grace}},
        "tasks": {
            "escape": {"command": [sys.executable, "-c", ESCAPER], "env": {"PIDS": str(pids)}}
        },
    }
    cfg.write_text(__import__("json").dumps(raw))
    node.argv[node.argv.index("-c") + 1] = str(cfg)
    node.argv += ["--journal", str(tmp_path / "journal.sqlite"), *args]
    node.log = tmp_path / "node.log"
    return node


async def _start_job(node: Node, job_id: str) -> tuple[int, int]:
    async with httpx.AsyncClient(base_url=node.url) as c:
        body = {"job_id": job_id, "task_type": "escape", "payload": {}}
        assert (await c.post("/fleet/dispatch", json=body)).status_code == 202
    pid_file = node.tmp_path / "pids" / job_id
    await wait_until(pid_file.exists, what="the job's pid file")
    leader, escapee = map(int, pid_file.read_text().split())
    return leader, escapee


def _kill_all(*pids: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def restart_then_interrupted(node: Node, job_id: str, pids: tuple[int, ...]) -> None:
    """Start ``node`` again: ``job_id`` answers ``error: interrupted``, and its processes were
    stopped before the node served."""
    await node.start()
    async with httpx.AsyncClient(base_url=node.url) as c:
        answer = (await c.get(f"/fleet/jobs/{job_id}")).json()
    assert answer == {"job_id": job_id, "state": "error", "error": "interrupted"}
    assert not any(map(pid_alive, pids)), "stopped before the node served"


def _log(node: Node) -> str:
    assert node.log is not None
    return node.log.read_text(errors="replace") if node.log.exists() else ""


@pytest.mark.slow
async def test_kill_9_during_a_drain_leaves_no_process_behind(tmp_path: Path) -> None:
    """The drain journals ``interrupted`` before it stops anything; a SIGKILL in that window
    leaves a *finished* job (in the journal) with its group and its escapee alive. The restart
    stops them anyway."""
    node = _node(tmp_path, drain="200ms", grace="5s")
    pids: tuple[int, ...] = ()
    try:
        with trio.fail_after(60):
            await node.start()
            pids = await _start_job(node, "d1")
            assert node.proc is not None
            node.proc.send_signal(signal.SIGTERM)  # drain: 200 ms, then interrupted, then stop
            await wait_until(
                lambda: "marked 1 job(s) interrupted" in _log(node), what="the drain's mark"
            )
            await node.kill()  # inside kill_grace: the leader ignores SIGTERM
            assert all(map(pid_alive, pids)), "the crash left the job's processes behind"
            await restart_then_interrupted(node, "d1", pids)
            assert "1 finished job(s) restored" in _log(node)
            assert "2 leftover process(es) of 1 job(s) stopped" in _log(node)
    finally:
        await node.close()
        _kill_all(*pids)


@pytest.mark.slow
async def test_a_changed_node_id_still_sweeps_the_previous_run(tmp_path: Path) -> None:
    node = _node(tmp_path, "--node-id", "alpha.rack1", grace="500ms")
    pids: tuple[int, ...] = ()
    try:
        with trio.fail_after(60):
            await node.start()
            pids = await _start_job(node, "c1")
            await node.kill()
            assert all(map(pid_alive, pids))
            node.argv[node.argv.index("--node-id") + 1] = "beta"  # same journal, new id
            await restart_then_interrupted(node, "c1", pids)
            assert "1 interrupted by the restart, 2 leftover process(es)" in _log(node)
    finally:
        await node.close()
        _kill_all(*pids)


def test_the_marker_tag_is_parsed_from_the_right() -> None:
    tag = "0123456789ab"
    assert marker_tag(f"gpu0/{tag}.rack.{tag}/j1") == tag  # a node id with dots and a slash
    assert marker_tag(f"a.b.{tag}/j.1") == tag
    assert marker_tag(f"n.{tag}/x.other") == tag  # the job id's dots are not the scope's
    assert marker_tag(f"n.other/x.{tag}") == "other"  # a job id holding a tag is no match
    assert marker_tag(f"{tag}/j1") == ""  # no node part
    assert marker_tag(f"n.{tag}/") == ""  # no job id
    assert marker_tag("j1") == ""


async def test_recovery_sweeps_only_this_journals_tag(tmp_path: Path) -> None:
    """Processes under another journal's tag, of a run without a journal, or with a value that
    only contains the tag are never touched, even under the same node id and job id."""
    journal = Journal(str(tmp_path / "j.sqlite"))
    journal.open()
    tag = journal.work_tag
    other = secrets.token_hex(6)
    values = {
        "ours": f"host.{tag}/j1",
        "ours-other-id": f"old.name.{tag}/j2",
        "other-journal": f"host.{other}/j1",
        "no-node": f"{tag}/j1",
        "contains": f"host.{other}/x.{tag}",
    }
    procs: dict[str, trio.Process] = {}
    try:
        for name, value in values.items():
            env = {**os.environ, SWEEP_MARKER: value}
            procs[name] = await trio.lowlevel.open_process(["sleep", "60"], env=env)
        with trio.fail_after(30):
            report = await recover(journal, JobTable(), kill_grace=0.5)
            for name in ("ours", "ours-other-id"):
                await procs[name].wait()
        assert report.swept == {
            values["ours"]: (procs["ours"].pid,),
            values["ours-other-id"]: (procs["ours-other-id"].pid,),
        }
        assert sorted(report.sweep.found) == sorted([procs["ours"].pid, procs["ours-other-id"].pid])
        assert report.sweep.clean()
        for name in ("other-journal", "no-node", "contains"):
            assert procs[name].poll() is None, name
    finally:
        journal.close()
        for proc in procs.values():
            proc.kill()
        with trio.fail_after(10):
            for proc in procs.values():
                await proc.wait()


async def test_many_marker_values_are_one_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leftovers under 40 marker values (jobs, or a process forging values under the tag):
    all stopped by one sweep — its looks, not one sweep per value, walk ``/proc``."""
    journal = Journal(str(tmp_path / "j.sqlite"))
    journal.open()
    looks: list[int] = []
    real = TaggedScan.__call__

    def counted(self: TaggedScan, job_id: str, protected: frozenset[int]) -> Any:
        looks.append(1)
        return real(self, job_id, protected)

    monkeypatch.setattr(TaggedScan, "__call__", counted)
    procs: list[trio.Process] = []
    try:
        for i in range(40):
            env = {**os.environ, SWEEP_MARKER: f"n{i}.{journal.work_tag}/j{i}"}
            procs.append(await trio.lowlevel.open_process(["sleep", "60"], env=env))
        with trio.fail_after(30):
            report = await recover(journal, JobTable(), kill_grace=0.5)
            for proc in procs:
                await proc.wait()
        assert len(report.swept) == 40 and len(report.sweep.found) == 40
        assert len(looks) < 40  # a handful of looks, not one sweep (and its looks) per value
    finally:
        journal.close()
        for proc in procs:
            proc.kill()
        with trio.fail_after(10):
            for proc in procs:
                await proc.wait()
