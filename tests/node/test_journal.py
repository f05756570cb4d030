"""The job journal: startup errors (corrupt, locked, unwritable, not a file), a full disk
mid-run, large results in files, retention across a restart."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from fleet_trio.cli import main
from fleet_trio.gpu.fake import init_device
from fleet_trio.node.app import create_app
from fleet_trio.node.jobs import INTERRUPTED, Done, Failed, JobState, JobTable
from fleet_trio.node.journal import Accept, Finish, Journal, JournalError, JournalWriter, Start
from fleet_trio.node.recovery import replay
from tests.helpers import wait_until
from tests.node.harness import make_ctx
from tests.node.store_tree import store_in_tree


def opened(path: Path, **kw: Any) -> Journal:
    journal = Journal(str(path), **kw)
    journal.open()
    return journal


# -- startup errors: one line, naming the file -------------------------------------------------


def test_corrupt_journal_is_a_startup_error(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    path.write_bytes(b"this is not a database, " * 100)
    with pytest.raises(JournalError) as err:
        opened(path)
    text = str(err.value)
    assert text.startswith(f"journal {path}: ") and "not a database" in text
    assert "\n" not in text


def test_locked_journal_is_a_startup_error(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    first = opened(path)
    try:
        with pytest.raises(JournalError) as err:
            opened(path)
        assert "locked" in str(err.value) and "another fleet-trio node" in str(err.value)
    finally:
        first.close()
    opened(path).close()  # released with its holder


def test_unwritable_place_is_a_startup_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(JournalError) as err:
        opened(blocker / "sub" / "j.sqlite")  # its folder would be inside a file
    assert "cannot create its folder" in str(err.value)


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    os.mkfifo(path)
    with pytest.raises(JournalError, match="not a regular file"):
        opened(path)


def test_cli_refuses_a_corrupt_journal_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpu = tmp_path / "gpu"
    init_device(str(gpu))
    bad = tmp_path / "j.sqlite"
    bad.write_bytes(b"\x00garbage" * 512)
    argv = ["node", "--gpu", "fake", "--fake-gpu-dir", str(gpu), "--listen", "127.0.0.1:0"]
    assert main([*argv, "--journal", str(bad), "--footprints", str(tmp_path / "fp.json")]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(err) == 1 and f"journal {bad}" in err[0], err


# -- what is written, what is read back --------------------------------------------------------


def test_journal_rules_match_the_table(tmp_path: Path) -> None:
    journal = opened(tmp_path / "j.sqlite")
    w = time.time()
    journal.apply([Accept("a", w), Start("a"), Finish("a", "done", w, data=b'{"x":1}')])
    # write-once: a late outcome and a late start change nothing
    journal.apply([Finish("a", "error", w, error="late"), Start("a")])
    (row,) = journal.load()
    assert (row.state, row.data, row.error) == ("done", b'{"x":1}', None)


def test_retention_follows_the_ttl_across_a_restart(tmp_path: Path) -> None:
    journal = opened(tmp_path / "j.sqlite")
    now_wall = time.time()
    journal.apply(
        [
            Accept("old", now_wall - 100),
            Finish("old", "done", now_wall - 61, data=b"{}"),
            Accept("new", now_wall - 10),
            Finish("new", "error", now_wall - 5, error="boom"),
            Accept("busy", now_wall - 1),
            Start("busy"),
        ]
    )
    table = JobTable(ttl=60.0)
    restored, in_flight, expired, _lost = replay(table, journal, 1000.0, now_wall)
    assert (restored, [r.job_id for r in in_flight], expired) == (1, ["busy"], 1)
    assert table.get("old") is None
    new = table.get("new")
    assert new is not None and new.error == "boom" and new.terminal_at == pytest.approx(995.0, 0.1)
    busy = table.get("busy")
    assert busy is not None and busy.state is JobState.ERROR and busy.error == INTERRUPTED
    assert {r.job_id for r in journal.load()} == {"new", "busy"}  # "old" is gone for good
    assert [r.state for r in journal.load() if r.job_id == "busy"] == ["error"]


def terminal_view(store: Any, job_id: str) -> Any:
    """The job's view once it is terminal; else ``None`` (a predicate for ``wait_until``)."""
    view = store.get(job_id)
    return view if view is not None and view.state.terminal else None


async def test_the_journal_and_its_results_are_private_whatever_the_umask(
    tmp_path: Path,
) -> None:
    """The journal holds every result: other local users must not read what the token
    protects on the wire (0600 files, a 0700 results folder, even under umask 000)."""
    old = os.umask(0)
    try:
        journal = opened(tmp_path / "j.sqlite", inline_max=8)
        async with store_in_tree(journal=JournalWriter(journal), janitor=False) as (store, _):

            async def work() -> Done:
                return Done(b'{"secret": "' + b"s" * 100 + b'"}')

            store.register("p1", work)
            view = await wait_until(lambda: terminal_view(store, "p1"), timeout=5)
        assert view.data_file is not None
    finally:
        os.umask(old)
    for name in ("j.sqlite", "j.sqlite-wal", view.data_file):
        path = tmp_path / name
        if path.exists():
            assert path.stat().st_mode & 0o077 == 0, (name, oct(path.stat().st_mode))
    assert (tmp_path / "j.sqlite.results").stat().st_mode & 0o077 == 0


async def test_large_result_lives_in_a_file(tmp_path: Path) -> None:
    journal = opened(tmp_path / "j.sqlite", inline_max=64)
    big = b'{"blob": "' + b"x" * 10_000 + b'"}'
    async with store_in_tree(journal=JournalWriter(journal), ttl=60.0, janitor=False) as (
        store,
        _tree,
    ):

        async def work() -> Done:
            return Done(big)

        store.register("big", work)
        view = await wait_until(lambda: terminal_view(store, "big"), timeout=5)
        assert view.data is None and view.data_file is not None  # not in RAM
        assert await store.read_data(view) == big
        (row,) = await trio.to_thread.run_sync(journal.load)
        assert row.data is None and row.data_file == view.data_file
        # after a restart it answers from the same file
        table = JobTable(ttl=60.0)
        await trio.to_thread.run_sync(replay, table, journal, 0.0, time.time())
        again = table.get("big")
        assert again is not None and again.data_file == view.data_file
        # eviction removes the file too
        store.sweep(trio.current_time() + 3600)
        await wait_until(lambda: not os.path.exists(view.data_file), timeout=5)


# -- a full disk mid-run ---------------------------------------------------------------------


async def test_disk_full_refuses_new_dispatches_with_503(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    journal = opened(tmp_path / "j.sqlite", max_pages=8)  # a tiny "disk"
    work = tmp_path / "work"
    work.mkdir()
    async with store_in_tree(journal=JournalWriter(journal), janitor=False) as (store, _tree):
        ctx = make_ctx(work, store)
        transport = httpx.ASGITransport(app=create_app(ctx))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            answers: dict[int, int] = {}
            with caplog.at_level(logging.ERROR):
                for i in range(400):
                    body = {"job_id": f"j{i:04d}-" + "p" * 200, "task_type": "t"}
                    r = await client.post("/fleet/dispatch", json=body)
                    answers[r.status_code] = answers.get(r.status_code, 0) + 1
                    if r.status_code == 503:
                        assert r.json() == {"status": "error", "error": "journal unavailable"}
                        refused = body["job_id"]
                        break
            assert answers.get(202) and answers.get(503) == 1, answers
            assert "database or disk is full" in caplog.text
            # the refused id never ran, is unknown, and left no work dir
            assert (await client.get(f"/fleet/jobs/{refused}")).status_code == 404
            assert refused not in ctx.runner.runs  # type: ignore[attr-defined]
            await wait_until(lambda: not os.listdir(work), timeout=5)
            # every acked job is still answered
            for job_id in ctx.runner.runs:  # type: ignore[attr-defined]
                assert (await client.get(f"/fleet/jobs/{job_id}")).status_code == 200


def test_sqlite_full_is_a_journal_error(tmp_path: Path) -> None:
    journal = opened(tmp_path / "j.sqlite", max_pages=6)
    with pytest.raises(JournalError, match="write failed: database or disk is full"):
        for i in range(1000):
            journal.apply([Accept(f"{i}-" + "z" * 500, time.time())])
    assert isinstance(journal.db, sqlite3.Connection)  # still usable for reads
    assert journal.load()


async def test_failed_outcome_write_is_logged_and_still_shown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    journal = opened(tmp_path / "j.sqlite")
    writer = JournalWriter(journal)
    async with store_in_tree(journal=writer, janitor=False) as (store, _tree):
        release = trio.Event()

        async def work() -> Failed:
            await release.wait()
            return Failed("boom")

        store.register("j", work)
        assert await store.wait_recorded("j")
        original = journal.apply

        def broken(records: Any) -> None:
            raise JournalError(f"journal {journal.path}: write failed: disk I/O error")

        journal.apply = broken  # type: ignore[method-assign]
        with caplog.at_level(logging.ERROR):
            release.set()
            view = await wait_until(lambda: terminal_view(store, "j"), timeout=5)
        assert view.error == "boom"  # a poll never hangs on the disk
        assert "outcome not recorded" in caplog.text
        journal.apply = original  # type: ignore[method-assign]


async def test_an_ack_is_invisible_and_nothing_runs_until_it_is_committed(tmp_path: Path) -> None:
    journal = opened(tmp_path / "j.sqlite")
    gate = threading.Event()
    entered = threading.Event()
    original = journal.apply

    def slow(records: Any) -> None:
        entered.set()
        gate.wait(10)
        original(records)

    journal.apply = slow  # type: ignore[method-assign]
    ran: list[str] = []
    async with store_in_tree(journal=JournalWriter(journal), janitor=False) as (store, _tree):

        async def work() -> Done:
            ran.append("j")
            return Done(b"{}")

        store.register("j", work)
        # the commit is in progress (and held); everything else that could run has run
        assert await trio.to_thread.run_sync(entered.wait, 10)
        await trio.testing.wait_all_tasks_blocked()
        assert store.get("j") is None and store.table.pending("j") and ran == []
        gate.set()
        assert await store.wait_recorded("j")
        await wait_until(lambda: terminal_view(store, "j"), timeout=5)
    assert ran == ["j"]
    rows = journal.load()
    assert [(r.job_id, r.state) for r in rows] == [("j", "done")]
