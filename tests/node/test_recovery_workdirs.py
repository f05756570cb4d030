"""Restart recovery removes the work directories its predecessor left, and only those.

A work dir is made at prepare time, before the ack's commit; a crash between the two leaves a
dir that no journal row names. Each node therefore names its dirs ``fleet-job-<tag>-…`` with a
tag kept in its journal, and a restarted node removes every entry under its tag before it
accepts work — never another node's (a different tag), and never through a symlink.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path

import httpx
import trio

from fleet_trio.node.config import config_from_mapping
from fleet_trio.node.jobs import Done, Failed, JobTable
from fleet_trio.node.journal import Journal
from fleet_trio.node.recovery import recover
from fleet_trio.node.tasks import WORK_DIR_PREFIX, TaskRegistry, TaskRunner, work_dir_prefix
from tests.node.harness import Node


def opened(path: Path) -> Journal:
    journal = Journal(str(path))
    journal.open()
    return journal


def registry(work: Path, tag: str = "") -> TaskRegistry:
    """Task ``t`` materializes a payload member, so its dispatch makes its work dir at once
    (a task without files only names it then; the job makes it when it starts)."""
    cfg = config_from_mapping(
        {"tasks": {"t": {"command": ["true"], "materialize": {"graph": "graph.json"}}}}
    )
    return TaskRegistry(cfg.tasks, work_root=str(work), work_tag=tag)


def test_the_work_tag_is_kept_by_the_journal(tmp_path: Path) -> None:
    first = opened(tmp_path / "j.sqlite")
    tag = first.work_tag
    first.close()
    again = opened(tmp_path / "j.sqlite")
    assert again.work_tag == tag and len(tag) == 12
    again.close()
    other = opened(tmp_path / "k.sqlite")
    assert other.work_tag != tag  # another journal, another node: another tag
    other.close()


def test_a_tampered_work_tag_is_a_startup_error(tmp_path: Path) -> None:
    opened(tmp_path / "j.sqlite").close()
    db = sqlite3.connect(tmp_path / "j.sqlite")
    db.execute("UPDATE meta SET value = '../x' WHERE key = 'work_tag'")
    db.commit()
    db.close()
    journal = Journal(str(tmp_path / "j.sqlite"))
    try:
        journal.open()
    except Exception as exc:
        assert "work tag" in str(exc)
    else:
        raise AssertionError("a bad work tag was accepted")


async def test_uncommitted_work_dirs_go_at_restart_and_only_ours(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("not ours to remove")
    journal = opened(tmp_path / "j.sqlite")
    tag = journal.work_tag
    # prepared (its dir exists) but never committed: then the process dies (nothing else runs)
    prepared = registry(work, tag).prepare("t", '{"graph": {}}', "never-acked")
    assert os.path.isdir(prepared.work_dir)
    assert os.path.basename(prepared.work_dir).startswith(work_dir_prefix(tag))
    planted = work / (work_dir_prefix(tag) + "link")  # a symlink under our prefix
    planted.symlink_to(outside, target_is_directory=True)
    stray = work / (work_dir_prefix(tag) + "file")
    stray.write_text("x")
    theirs = registry(work).prepare("t", '{"graph": {}}', "their-job")  # another node, running
    legacy = work / (WORK_DIR_PREFIX + "abcd1234")  # no tag: whose it is is unknown
    legacy.mkdir()
    journal.close()  # the crash: the SIGKILL-equivalent (no cleanup ran)

    journal = opened(tmp_path / "j.sqlite")
    assert journal.work_tag == tag
    report = await recover(journal, JobTable(), kill_grace=0.1, work_root=str(work))
    journal.close()
    assert not os.path.exists(prepared.work_dir)
    assert not os.path.lexists(planted) and not os.path.lexists(stray)
    assert (outside / "keep.txt").read_text() == "not ours to remove"  # the link, not its target
    assert os.path.isdir(theirs.work_dir) and os.path.isdir(legacy)
    assert report.work_dirs_removed == 3
    theirs.cleanup()


async def test_the_previous_work_root_is_swept_too(tmp_path: Path) -> None:
    """A restart with another work root (TMPDIR changed) still finds its predecessor's dirs."""
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    journal = opened(tmp_path / "j.sqlite")
    await recover(journal, JobTable(), kill_grace=0.1, work_root=str(old))  # first start
    left = registry(old, journal.work_tag).prepare("t", '{"graph": {}}', "j1")
    journal.close()
    journal = opened(tmp_path / "j.sqlite")
    report = await recover(journal, JobTable(), kill_grace=0.1, work_root=str(new))
    journal.close()
    assert not os.path.exists(left.work_dir) and report.work_dirs_removed == 1


async def test_kill_9_between_prepare_and_commit_leaves_no_dir(tmp_path: Path) -> None:
    """A real node, SIGKILLed; a dir it made for an ack it never committed is gone at restart,
    a dir of another node on the same host is not."""
    node = Node(tmp_path)
    try:
        with trio.fail_after(60):
            await node.start()
            async with httpx.AsyncClient(base_url=node.url) as c:
                body = {"job_id": "q1", "task_type": "quick", "payload": {}}
                assert (await c.post("/fleet/dispatch", json=body)).status_code == 202
            await node.kill()
            db = sqlite3.connect(next(tmp_path.glob("journal-*.sqlite")))
            (tag,) = db.execute("SELECT value FROM meta WHERE key = 'work_tag'").fetchone()
            db.close()
            ours = node.work / (work_dir_prefix(tag) + "uncommitted")
            ours.mkdir()
            (ours / "payload.json").write_text("{}")
            theirs = node.work / (work_dir_prefix("0123456789ab") + "running")
            theirs.mkdir()
            await node.start()
            assert not ours.exists()
            assert theirs.is_dir()
    finally:
        await node.close()


# -- a task without payload files: its dispatch names the dir, the job makes it ---------------


def _runner() -> TaskRunner:
    return TaskRunner(kill_grace=1.0)


async def test_a_task_without_files_makes_its_work_dir_when_it_starts(tmp_path: Path) -> None:
    probe = (
        "import json, os; st = os.stat(os.environ['FLEET_WORK_DIR']); "
        "print(json.dumps({'mode': oct(st.st_mode)}))"
    )
    cfg = config_from_mapping({"tasks": {"p": {"command": [sys.executable, "-c", probe]}}})
    reg = TaskRegistry(cfg.tasks, work_root=str(tmp_path))
    job = reg.prepare("p", None, "j1")
    assert job.deferred_dir and not os.path.lexists(job.work_dir)  # nothing made at the ack
    assert os.path.basename(job.work_dir).startswith(work_dir_prefix(reg.work_tag))
    with trio.fail_after(30):
        outcome = await _runner().execute(job)
    assert isinstance(outcome, Done) and outcome.data.strip() == b'{"mode": "0o40700"}', outcome
    assert not os.path.lexists(job.work_dir)  # removed when the job ended


async def test_a_deferred_work_dir_somebody_made_first_fails_the_job(tmp_path: Path) -> None:
    cfg = config_from_mapping({"tasks": {"p": {"command": ["true"]}}})
    reg = TaskRegistry(cfg.tasks, work_root=str(tmp_path))
    job = reg.prepare("p", None, "j1")
    target = tmp_path / "elsewhere"
    target.mkdir()
    os.symlink(target, job.work_dir)  # a planted link under the job's name
    with trio.fail_after(30):
        outcome = await _runner().execute(job)
    assert isinstance(outcome, Failed)
    assert outcome.message == "p failed: cannot create its work dir: File exists"
    assert target.is_dir()  # never followed
