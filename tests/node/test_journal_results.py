"""Large results in files beside the journal: ``sync: full`` makes the file and its folder
durable before the row naming it commits; a failed write leaves no ``.tmp``; a file that is
missing, empty or torn is a terminal ``error: "result lost: …"`` — at recovery (journal
first) and on a poll — never a 500 on every poll nor an invalid JSON body. And a duplicate
of a dispatch whose ack could not be written is ``503 journal unavailable``, not ``node
draining``."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from fleet_trio.node.app import create_app
from fleet_trio.node.jobs import Done, JobState, JobTable, finish_record
from fleet_trio.node.journal import Accept, Journal, JournalError, JournalWriter, result_problem
from fleet_trio.node.recovery import replay
from tests.helpers import wait_until
from tests.node.harness import make_ctx
from tests.node.store_tree import store_in_tree

BIG = b'{"blob": "' + b"x" * 10_000 + b'"}'


def opened(path: Path, **kw: Any) -> Journal:
    journal = Journal(str(path), **kw)
    journal.open()
    return journal


def _finish_big(journal: Journal, job_id: str = "big") -> str:
    """Ack ``job_id`` and record its large result; returns the result file."""
    journal.apply([Accept(job_id, time.time())])
    path = journal.result_file(job_id)
    assert path is not None
    journal.apply([finish_record(job_id, Done(BIG), time.time(), data_file=path)])
    return path


def _state(journal: Journal, job_id: str) -> str:
    (state,) = journal.db.execute("SELECT state FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
    return str(state)


@pytest.mark.parametrize("sync", ["full", "normal"])
def test_full_sync_makes_the_result_file_durable_before_its_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync: str
) -> None:
    journal = opened(tmp_path / "j.sqlite", inline_max=64, sync=sync)
    synced: list[tuple[str, str]] = []  # (what was fsynced, the row's state at that moment)
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), _state(journal, "big")))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    path = _finish_big(journal)
    assert _state(journal, "big") == "done"
    if sync == "normal":
        assert synced == []  # a crash of the process keeps the page cache: no fsync
        return
    assert synced == [(path + ".tmp", "accepted"), (journal.results_dir, "accepted")]


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_a_failed_result_write_leaves_no_tmp_and_no_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    journal = opened(tmp_path / "j.sqlite", inline_max=64, sync="full")

    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EIO, "Input/output error")

    journal.apply([Accept("big", time.time())])
    monkeypatch.setattr(os, failing, broken)
    path = journal.result_file("big")
    assert path is not None
    with pytest.raises(JournalError, match=r"write failed: .*Input/output error"):
        journal.apply([finish_record("big", Done(BIG), time.time(), data_file=path)])
    monkeypatch.undo()
    assert os.listdir(journal.results_dir) == []
    assert _state(journal, "big") == "accepted"


def _damage(path: str, how: str) -> None:
    if how == "missing":
        os.unlink(path)
    elif how == "empty":
        os.truncate(path, 0)
    elif how == "torn":
        os.truncate(path, len(BIG) // 2)
    else:  # zero-filled blocks after a power cut: all, or from the third page on
        with open(path, "r+b") as f:
            f.seek(8192 if how == "tail-zeros" else 0)
            f.write(b"\0" * len(BIG))


@pytest.mark.parametrize(
    ("how", "error"),
    [
        ("missing", "result lost: result file missing"),
        ("empty", "result lost: result file empty"),
        ("torn", "result lost: result file torn (cut short)"),
        ("zeros", "result lost: result file torn (zero-filled at byte 0)"),
        ("tail-zeros", "result lost: result file torn (zero-filled at byte 8192)"),
    ],
)
def test_recovery_turns_a_lost_result_into_an_error(tmp_path: Path, how: str, error: str) -> None:
    journal = opened(tmp_path / "j.sqlite", inline_max=64)
    path = _finish_big(journal)
    _finish_big(journal, "whole")
    _damage(path, how)
    table = JobTable(ttl=60.0)
    restored, _in_flight, _expired, lost = replay(table, journal, 0.0, time.time())
    assert restored == 2 and lost == ["big"]
    view = table.get("big")
    assert view is not None and view.state is JobState.ERROR and view.error == error
    assert view.data_file is None
    whole = table.get("whole")
    assert whole is not None and whole.state is JobState.DONE and whole.data_file
    rows = {row.job_id: row for row in journal.load()}  # the journal says so too
    assert (rows["big"].state, rows["big"].error, rows["big"].data_file) == ("error", error, None)
    assert not os.path.exists(path)  # a torn file no row names goes
    assert os.listdir(journal.results_dir) == [os.path.basename(whole.data_file)]


@pytest.mark.parametrize(
    ("how", "error"),
    [
        ("missing", "result lost: result file missing"),
        ("empty", "result lost: result file empty"),
        (
            "torn",
            "result lost: result file torn (invalid JSON at byte 9)",
        ),
        ("zeros", "result lost: result file torn (zero-filled at byte 0)"),
    ],
)
async def test_a_poll_of_a_lost_result_is_a_terminal_error(
    tmp_path: Path, how: str, error: str
) -> None:
    journal = opened(tmp_path / "j.sqlite", inline_max=64)
    work = tmp_path / "work"
    work.mkdir()
    async with store_in_tree(journal=JournalWriter(journal), janitor=False) as (store, _tree):

        async def big() -> Done:
            return Done(BIG)

        store.register("big", big)
        view = await wait_until(lambda: (v := store.get("big")) and v.state.terminal and v)
        assert view.data_file is not None
        transport = httpx.ASGITransport(app=create_app(make_ctx(work, store)))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            assert (await client.get("/fleet/jobs/big")).json()["data"] == {"blob": "x" * 10_000}
            _damage(view.data_file, how)
            for _ in range(2):  # every poll: the same answer, valid JSON
                r = await client.get("/fleet/jobs/big")
                assert r.status_code == 200, r.text
                assert r.json() == {"job_id": "big", "state": "error", "error": error}


def test_result_problem() -> None:
    assert result_problem(b'{"a": 1}') is None
    assert result_problem(b"[" * 5000 + b"]" * 5000) is None  # deep, but whole
    assert result_problem(b" \n") == "result file empty"
    assert result_problem(b'{"a": ') == "result file torn (invalid JSON at byte 6)"
    # a restart checks the shape only: cut short, or not an object at all
    assert result_problem(b'{"a": [1, 2', parse=False) == "result file torn (cut short)"
    # cut right after an inner "}": the shape passes; the poll's parse still catches it
    assert result_problem(b'{"a": {}', parse=False) is None
    assert result_problem(b'{"a": {}') == "result file torn (invalid JSON at byte 8)"
    assert result_problem(b'{"a": {}}\n', parse=False) is None
    assert result_problem(b"[1]", parse=False) == "result file torn (cut short)"
    assert result_problem(b'{"a": "\0"}', parse=False) == "result file torn (zero-filled at byte 7)"


async def test_a_duplicate_of_a_failed_ack_is_journal_unavailable(tmp_path: Path) -> None:
    """Two dispatches of one id race; the first one's ack cannot be written. Both get 503
    ``journal unavailable`` — the node is not draining."""
    journal = opened(tmp_path / "j.sqlite")
    work = tmp_path / "work"
    work.mkdir()
    gate = trio.Event()
    token = trio.lowlevel.current_trio_token()

    def failing(records: Any) -> None:
        trio.from_thread.run(gate.wait, trio_token=token)
        raise JournalError(f"journal {journal.path}: write failed: disk I/O error")

    journal.apply = failing  # type: ignore[method-assign]
    async with store_in_tree(journal=JournalWriter(journal), janitor=False) as (store, _tree):
        ctx = make_ctx(work, store)
        transport = httpx.ASGITransport(app=create_app(ctx))
        answers: list[httpx.Response] = []
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:

            async def dispatch() -> None:
                answers.append(
                    await client.post("/fleet/dispatch", json={"job_id": "d", "task_type": "t"})
                )

            async with trio.open_nursery() as nursery:
                nursery.start_soon(dispatch)
                await wait_until(lambda: store.table.pending("d"), what="the first ack pending")
                nursery.start_soon(dispatch)
                await trio.testing.wait_all_tasks_blocked()
                gate.set()
        assert not store.draining
        assert [(r.status_code, r.json()) for r in answers] == [
            (503, {"status": "error", "error": "journal unavailable"})
        ] * 2
