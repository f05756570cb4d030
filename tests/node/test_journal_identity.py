"""The journal's identity: it records a journal id, the node id and the path it was created at;
a copy (another path) drops its jobs and takes a new work tag; a journal deleted, replaced or
moved under the open connection is *lost*: nothing more is written, and what it held is saved
where a restart finds it (never over another file)."""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from fleet_trio.node.journal import (
    Accept,
    Finish,
    Journal,
    JournalError,
    JournalLost,
    JournalWriter,
    Record,
    Statement,
)
from tests.helpers import wait_until


def opened(path: Path, **kw: Any) -> Journal:
    journal = Journal(str(path), **kw)
    journal.open()
    return journal


def ids(path: Path) -> list[str]:
    """The job ids in the journal at ``path`` (opened and closed again)."""
    journal = opened(path)
    try:
        return [row.job_id for row in journal.load()]
    finally:
        journal.close()


def meta(path: Path) -> dict[str, str]:
    db = sqlite3.connect(str(path))
    try:
        return dict(db.execute("SELECT key, value FROM meta").fetchall())
    finally:
        db.close()


def test_a_new_journal_records_its_identity(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    journal = opened(path, node_id="gpu0")
    first = journal.identity
    journal.close()
    assert first is not None and first.node_id == "gpu0" and first.path == str(path)
    assert len(first.journal_id) == 16
    again = opened(path, node_id="gpu0")
    assert again.identity == first and again.copied is None and not again.migrated
    again.close()
    m = meta(path)
    assert (m["journal_id"], m["node_id"], m["path"]) == (first.journal_id, "gpu0", str(path))


def test_an_older_journal_is_its_own_and_gets_the_record(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    journal = opened(path, node_id="gpu0")
    journal.apply([Accept("a1", 1.0)])
    tag = journal.work_tag
    journal.close()
    db = sqlite3.connect(str(path))  # as a journal written before the identity record
    db.execute("DELETE FROM meta WHERE key IN ('journal_id', 'node_id', 'path')")
    db.commit()
    db.close()
    old = opened(path, node_id="gpu0")
    assert old.migrated and old.copied is None and old.work_tag == tag
    assert [row.job_id for row in old.load()] == ["a1"]
    old.close()
    assert meta(path)["path"] == str(path)


def test_a_copied_journal_drops_its_jobs_and_takes_a_new_tag(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    journal = opened(a / "j.sqlite", node_id="gpu0")
    journal.apply([Accept("a1", 1.0, str(tmp_path / "fleet-job-x")), Accept("a2", 2.0)])
    journal.apply([Finish("a2", "done", 3.0, data=b"{}")])
    journal.set_meta("work_root", str(tmp_path))
    original = journal.identity
    tag = journal.work_tag
    shutil.copytree(a, b)  # while the original runs (`cp -a` of a state folder)
    journal.close()
    copy = opened(b / "j.sqlite", node_id="gpu0")
    assert copy.copied is not None and copy.copied.original == original
    assert copy.copied.jobs == 2
    assert copy.load() == [] and copy.previous_work_root is None
    assert copy.work_tag != tag and copy.identity is not None
    assert copy.identity.path == str(b / "j.sqlite")
    assert copy.identity.journal_id != original.journal_id  # type: ignore[union-attr]
    text = copy.copied.describe(copy.path, copy.work_tag)
    assert str(a / "j.sqlite") in text and "dropped" in text and copy.work_tag in text
    copy.close()
    assert ids(a / "j.sqlite") == ["a1", "a2"]  # the original keeps its own
    assert opened(b / "j.sqlite", node_id="gpu0").copied is None  # the copy is its own now


def test_a_journal_moved_with_journal_moved_keeps_its_jobs_and_tag(tmp_path: Path) -> None:
    """A state folder moved (the node stopped) to a bigger disk is no copy when its operator
    says so (``--journal-moved``): its jobs and work tag stay the node's, and the recorded
    path is the new one (a later start needs no flag)."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    journal = opened(a / "j.sqlite", node_id="gpu0")
    journal.apply([Accept("a1", 1.0), Accept("a2", 2.0)])
    journal.apply([Finish("a2", "done", 3.0, data=b"{}")])
    original, tag = journal.identity, journal.work_tag
    journal.close()
    shutil.move(str(a), str(b))
    moved = opened(b / "j.sqlite", node_id="gpu0", moved=True)
    assert moved.copied is None and moved.moved_from == str(a / "j.sqlite")
    assert [r.job_id for r in moved.load()] == ["a1", "a2"] and moved.work_tag == tag
    assert moved.identity is not None and original is not None
    assert moved.identity.journal_id == original.journal_id
    assert moved.identity.path == str(b / "j.sqlite")
    moved.close()
    again = opened(b / "j.sqlite", node_id="gpu0")  # no flag needed any more
    assert again.copied is None and again.moved_from is None and again.work_tag == tag
    again.close()
    # a copy's WARN line says how to keep the jobs of a moved folder
    shutil.copytree(b, tmp_path / "c")
    copy = opened(tmp_path / "c" / "j.sqlite", node_id="gpu0")
    assert copy.copied is not None
    assert "--journal-moved" in copy.copied.describe(copy.path, copy.work_tag)
    copy.close()


def test_a_renamed_node_keeps_its_journal(tmp_path: Path) -> None:
    """Same path, another node id: the node's own journal (see docs/node.md)."""
    path = tmp_path / "j.sqlite"
    journal = opened(path, node_id="alpha")
    journal.apply([Accept("a1", 1.0)])
    tag = journal.work_tag
    journal.close()
    renamed = opened(path, node_id="beta")
    assert renamed.copied is None and renamed.renamed_from == "alpha"
    assert renamed.work_tag == tag and [r.job_id for r in renamed.load()] == ["a1"]
    renamed.close()
    assert meta(path)["node_id"] == "beta"


# -- lost under a running node ---------------------------------------------------------------


def test_a_deleted_journal_refuses_writes_and_is_saved_at_its_path(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    journal = opened(path, node_id="gpu0")
    identity, tag = journal.identity, journal.work_tag
    journal.apply([Accept("a1", 1.0)])
    os.unlink(path)
    with pytest.raises(JournalLost) as lost:
        journal.apply([Accept("a2", 2.0)])  # checked before the batch: never written
    text = str(lost.value)
    assert text.startswith(f"journal {path} lost: its file was deleted") and "\n" not in text
    assert f"saved to a new {path}" in text
    with pytest.raises(JournalLost):
        journal.apply([Accept("a3", 3.0)])  # and never again
    assert journal.close() is None
    again = opened(path, node_id="gpu0")
    assert [r.job_id for r in again.load()] == ["a1"]
    assert again.identity == identity and again.work_tag == tag and again.copied is None
    again.close()


def test_a_deleted_wal_is_checkpointed_into_the_journal(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    journal = opened(path)
    journal.apply([Accept("a1", 1.0)])
    journal.apply([Accept("a2", 2.0)])
    os.unlink(f"{path}-wal")  # the acks are in the WAL only
    with pytest.raises(JournalLost) as lost:
        journal.verify()
    assert "its -wal file was deleted" in str(lost.value)
    assert "checkpointed" in str(lost.value)
    shutil.copy(path, tmp_path / "peek.sqlite")  # as a kill -9 now would leave it
    journal.close()
    db = sqlite3.connect(str(tmp_path / "peek.sqlite"))  # read raw: a copy opened is emptied
    assert [r[0] for r in db.execute("SELECT job_id FROM jobs ORDER BY rowid")] == ["a1", "a2"]
    db.close()


def test_a_replaced_journal_is_kept_and_ours_saved_beside_it(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    journal = opened(path)
    journal.apply([Accept("a1", 1.0)])
    other = tmp_path / "other"
    other.write_bytes(b"somebody else's file")
    os.replace(other, path)
    with pytest.raises(JournalLost) as lost:
        journal.apply([Accept("a2", 2.0)])
    assert "replaced by another file" in str(lost.value)
    assert f"saved to {path}.lost" in str(lost.value)
    assert not os.path.exists(f"{path}-wal")  # our WAL never replays into their file
    journal.close()
    assert path.read_bytes() == b"somebody else's file"
    os.replace(f"{path}.lost", path)
    assert ids(path) == ["a1"]


def test_a_file_already_at_the_side_name_is_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    journal = opened(path)
    journal.apply([Accept("a1", 1.0)])
    Path(f"{path}.lost").write_bytes(b"keep me")
    path.unlink()
    path.write_bytes(b"new")
    with pytest.raises(JournalLost) as lost:
        journal.verify()
    assert "could not be saved" in str(lost.value)
    journal.close()
    assert Path(f"{path}.lost").read_bytes() == b"keep me" and path.read_bytes() == b"new"
    assert sorted(os.listdir(tmp_path)) == ["j.sqlite", "j.sqlite.lost", "j.sqlite.results"]


class DeletedMidBatch(Journal):
    """The journal's file is deleted while a batch is written (after the check before it)."""

    delete = False

    @classmethod
    def _statements(cls, run: Any) -> list[Statement]:
        if cls.delete:
            os.unlink(cls.victim)
        return super()._statements(run)

    victim = ""


def test_a_loss_during_a_commit_refuses_that_batch_and_saves_without_it(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    journal = DeletedMidBatch(str(path))
    journal.open()
    journal.apply([Accept("a1", 1.0)])
    DeletedMidBatch.victim, DeletedMidBatch.delete = str(path), True
    try:
        with pytest.raises(JournalLost):
            journal.apply([Accept("a2", 2.0)])  # committed into the unlinked file: refused
    finally:
        DeletedMidBatch.delete = False
    journal.close()
    assert ids(path) == ["a1"]  # a2 answered 503: it must not come back at a restart


def test_close_keeps_a_foreign_file_at_the_wal_name(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    journal = opened(path)
    journal.apply([Accept("a1", 1.0)])
    os.unlink(f"{path}-wal")
    Path(f"{path}-wal").write_bytes(b"not ours")
    found = journal.close()  # SQLite's close deletes <journal>-wal by its name
    assert found is not None and "its -wal file was replaced" in found
    assert Path(f"{path}-wal").read_bytes() == b"not ours"
    assert [n for n in os.listdir(tmp_path) if n.endswith(".keep")] == []


async def test_the_writer_finds_a_loss_on_its_timer_and_logs_one_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "j.sqlite"
    journal = opened(path)
    writer = JournalWriter(journal, check_interval=0.05)
    errors: list[Any] = []
    with caplog.at_level(logging.WARNING), trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.serve)
            assert await writer.submit([Accept("a1", 1.0)]).wait() is None
            assert not writer.lost
            os.unlink(path)
            await wait_until(lambda: writer.lost, what="the timer's check")
            assert os.path.exists(path)  # saved at once, before any commit came
            records: list[Record] = [Accept("a2", 2.0)]
            for _ in range(3):
                errors.append(await writer.submit(records).wait())
            nursery.cancel_scope.cancel()
        writer.close()
    assert all(isinstance(e, JournalLost) for e in errors)
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and lines[0].levelno == logging.ERROR, caplog.text
    assert ids(path) == ["a1"]


def test_a_journal_replaced_while_it_is_opened_is_never_taken_for_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replaced between SQLite's open and the node taking its device and inode (the open's
    checks can take seconds on a large journal): the open fails (a start error), so no ack is
    ever written into the unlinked file as if it were the journal."""
    import fleet_trio.node.journal as journal_module

    path = tmp_path / "journal.sqlite"
    first = Journal(str(path))
    first.open()
    first.close()
    real = journal_module._chmod_own_dir

    def swap(folder: str, mode: int) -> None:  # runs after the connection is open
        other = tmp_path / "other.sqlite"
        other.write_bytes(b"")
        os.replace(other, path)
        real(folder, mode)

    monkeypatch.setattr(journal_module, "_chmod_own_dir", swap)
    journal = Journal(str(path))
    with pytest.raises(JournalError, match="replaced by another file while it was opened"):
        journal.open()
    monkeypatch.undo()
    assert path.read_bytes() == b""  # the file put there is left alone
