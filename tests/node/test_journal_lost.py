"""Issue acceptance: a journal is trusted by its identity, never by its name.

Real ``fleet-trio node`` processes with the journal on:

- the journal (or only its ``-wal``) deleted, or replaced by another file, under a running
  node: health and dispatch answer 503 ``journal lost`` (a dispatch right after the deletion
  too: the check runs before each commit batch, so no 202 is given off an unlinked file), the
  node logs exactly one ERROR line, running jobs go on; after ``kill -9`` and a restart every
  job acked with a 202 before the deletion answers its poll, and the crashed run's job
  processes are stopped;
- a copied state folder started as a second node on the same host: the original's running job
  is not signalled, its work dir is untouched, and the copy answers no poll for its jobs.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
from pathlib import Path

import httpx
import pytest
import trio

from fleet_trio.proc.procfs import pid_alive
from tests.helpers import state_in, wait_until
from tests.node.harness import Node

ERROR_LINE = re.compile(r"^\S+ ERROR ", re.M)
LOST = {"status": "error", "error": "journal lost"}


def _journal(node: Node) -> Path:
    """The node's journal: ``journal-<node id>.sqlite`` in its state folder (the harness's
    footprint store's folder), the node id being the hostname."""
    (found,) = node.tmp_path.glob("journal-*.sqlite")
    return found


def _log(node: Node) -> str:
    assert node.log is not None
    return node.log.read_text(errors="replace") if node.log.exists() else ""


async def _dispatch(c: httpx.AsyncClient, job_id: str, task: str) -> httpx.Response:
    return await c.post("/fleet/dispatch", json={"job_id": job_id, "task_type": task})


async def _sleeper_pid(node: Node, job_id: str) -> int:
    pid_file = node.tmp_path / "pids" / job_id
    await wait_until(lambda: pid_file.exists() and pid_file.read_text(), what=f"{job_id}'s pid")
    return int(pid_file.read_text())


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def _lost(c: httpx.AsyncClient) -> bool:
    r = await c.get("/fleet/health")
    return r.status_code == 503 and r.json() == LOST


async def _acked_run(node: Node, c: httpx.AsyncClient, pids: list[int]) -> None:
    """One finished job and two running ones, each acked with a 202."""
    assert (await _dispatch(c, "q1", "quick")).status_code == 202
    await wait_until(lambda: state_in(c, "q1", "done"), what="q1 done")
    for job_id in ("s1", "s2"):
        assert (await _dispatch(c, job_id, "sleeper")).status_code == 202
        pids.append(await _sleeper_pid(node, job_id))


async def _lost_then_restart(node: Node, c: httpx.AsyncClient, pids: list[int]) -> None:
    """The node answers 503 ``journal lost`` to health and to a new dispatch, a known id still
    re-acks, running jobs still answer; one ERROR line. Then ``kill -9`` and a restart: every
    202 is recovered and the crashed run's processes are stopped."""
    r = await _dispatch(c, "n2", "quick")
    assert r.status_code == 503 and r.json() == LOST
    assert await _lost(c)
    assert (await _dispatch(c, "s1", "sleeper")).status_code == 202  # a duplicate: re-acked
    assert (await c.get("/fleet/jobs/s1")).json()["state"] == "running"
    assert (await c.get("/fleet/jobs/n2")).status_code == 404
    assert all(map(pid_alive, pids))  # acked jobs go on
    text = _log(node)
    assert len(ERROR_LINE.findall(text)) == 1, text
    assert "lost: " in text and "restart the node" in text
    await node.kill()
    await node.start()
    async with httpx.AsyncClient(base_url=node.url) as again:
        q1 = await again.get("/fleet/jobs/q1")
        assert q1.json() == {"job_id": "q1", "state": "done", "data": {"v": 7}}, q1.text
        for job_id in ("s1", "s2"):
            body = (await again.get(f"/fleet/jobs/{job_id}")).json()
            assert body == {"job_id": job_id, "state": "error", "error": "interrupted"}
        for job_id in ("n1", "n2"):
            assert (await again.get(f"/fleet/jobs/{job_id}")).status_code == 404
        assert (await _dispatch(again, "n1", "quick")).status_code == 202  # refused: fresh
    assert not any(map(pid_alive, pids)), "the crashed run's processes are swept"


@pytest.mark.slow
async def test_journal_deleted_under_a_running_node(tmp_path: Path) -> None:
    """Detected by the timer (no dispatch comes), then every 202 survives ``kill -9``."""
    node = Node(tmp_path)
    node.log = tmp_path / "node.log"
    pids: list[int] = []
    try:
        with trio.fail_after(90):
            await node.start()
            async with httpx.AsyncClient(base_url=node.url) as c:
                await _acked_run(node, c, pids)
                journal = _journal(node)
                journal.unlink()
                await wait_until(lambda: _lost(c), what="health 503 journal lost")
                r = await _dispatch(c, "n1", "quick")
                assert r.status_code == 503 and r.json() == LOST
                await _lost_then_restart(node, c, pids)
    finally:
        await node.close()
        _kill(pids)


@pytest.mark.slow
async def test_journal_wal_deleted_then_a_dispatch_at_once(tmp_path: Path) -> None:
    """Only the ``-wal`` removed (the acks live there until a checkpoint); the very next
    dispatch is refused: the check runs before its commit."""
    node = Node(tmp_path)
    node.log = tmp_path / "node.log"
    pids: list[int] = []
    try:
        with trio.fail_after(90):
            await node.start()
            async with httpx.AsyncClient(base_url=node.url) as c:
                await _acked_run(node, c, pids)
                wal = Path(f"{_journal(node)}-wal")
                assert wal.exists()
                wal.unlink()
                r = await _dispatch(c, "n1", "quick")
                assert r.status_code == 503 and r.json() == LOST
                await _lost_then_restart(node, c, pids)
    finally:
        await node.close()
        _kill(pids)


@pytest.mark.slow
async def test_journal_replaced_under_a_running_node(tmp_path: Path) -> None:
    """Another file renamed over the journal: kept as it is; the node's journal is saved
    beside it as ``<journal>.lost``, and put back by hand it restores every 202."""
    node = Node(tmp_path)
    node.log = tmp_path / "node.log"
    pids: list[int] = []
    try:
        with trio.fail_after(90):
            await node.start()
            async with httpx.AsyncClient(base_url=node.url) as c:
                await _acked_run(node, c, pids)
                journal = _journal(node)
                other = tmp_path / "other"
                other.write_bytes(b"an operator's file")
                os.replace(other, journal)
                await wait_until(lambda: _lost(c), what="health 503 journal lost")
                r = await _dispatch(c, "n1", "quick")
                assert r.status_code == 503 and r.json() == LOST
                assert journal.read_bytes() == b"an operator's file"
                assert f"saved to {journal}.lost" in _log(node)
                # after the crash below, the operator puts the saved journal back
                await _lost_then_restart_after(node, c, pids, journal)
    finally:
        await node.close()
        _kill(pids)


async def _lost_then_restart_after(
    node: Node, c: httpx.AsyncClient, pids: list[int], journal: Path
) -> None:
    original_start = node.start

    async def start() -> None:  # the operator puts the saved journal back first
        os.replace(f"{journal}.lost", journal)
        await original_start()

    node.start = start  # type: ignore[method-assign]
    await _lost_then_restart(node, c, pids)


@pytest.mark.slow
async def test_a_copied_state_folder_never_touches_the_original(tmp_path: Path) -> None:
    """``cp -a`` of node A's state folder started as node B on the same host (same node id,
    the hostname; same work folder): A's running job keeps running, its work dir stays, and B
    answers no poll for A's jobs."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = Node(tmp_path / "a")
    b = Node(tmp_path / "b")
    b.work = a.work  # one TMPDIR for both, as on one host
    b.log = tmp_path / "b.log"
    pids: list[int] = []
    try:
        with trio.fail_after(90):
            await a.start()
            async with httpx.AsyncClient(base_url=a.url) as ca:
                await _acked_run(a, ca, pids)
                dirs = sorted(os.listdir(a.work))
                assert len(dirs) == 2  # the sleepers' work dirs
                journal = _journal(a)
                for name in os.listdir(a.tmp_path):
                    if name.startswith(journal.name):  # the journal, its -wal, its results
                        src, dst = a.tmp_path / name, b.tmp_path / name
                        if src.is_dir():
                            shutil.copytree(src, dst)
                        else:
                            shutil.copy2(src, dst)
                await b.start()
                assert all(map(pid_alive, pids)), "A's jobs were signalled"
                assert set(dirs) <= set(os.listdir(a.work)), "A's work dirs were removed"
                async with httpx.AsyncClient(base_url=b.url) as cb:
                    for job_id in ("q1", "s1", "s2"):
                        assert (await cb.get(f"/fleet/jobs/{job_id}")).status_code == 404
                    assert (await _dispatch(cb, "q1", "quick")).status_code == 202  # its own
                    await wait_until(lambda: state_in(cb, "q1", "done"), what="B's q1 done")
                assert all(map(pid_alive, pids)), "A's jobs were signalled"
                assert set(dirs) <= set(os.listdir(a.work)), "A's work dirs were removed"
                assert (await ca.get("/fleet/jobs/s1")).json()["state"] == "running"
                text = b.log.read_text()
                assert "a copy of journal" in text and "dropped" in text, text
    finally:
        await b.close()
        await a.close()
        _kill(pids)
