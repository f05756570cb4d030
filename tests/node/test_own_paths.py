"""Issue acceptance: no path the node owns is followed through a symbolic link.

A symlinked results folder was followed: the node chmodded its target to 0700 and removed
every file there that no job referred to. A link where the node keeps its own file or folder
(the journal, SQLite's files beside it, the results folder, the footprint store, a work root)
is now a start error, one line naming the path, exit 1; the link's target is untouched.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest
import trio

from fleet_trio.errors import NodeStartError
from fleet_trio.gpu.fake import init_device
from fleet_trio.node.config import NodeConfig
from fleet_trio.node.journal import Journal, JournalError
from fleet_trio.node.recovery import remove_tagged
from fleet_trio.node.server import NodeOptions, serve_node
from fleet_trio.node.tasks import work_dir_prefix
from fleet_trio.statedir import symlink_problem


def _someone_elses_folder(tmp_path: Path) -> Path:
    """A folder with mode 0755 and a file in it: what the link points at."""
    target = tmp_path / "elsewhere"
    target.mkdir()
    target.chmod(0o755)
    (target / "keep.txt").write_text("not the node's\n")
    return target


def _untouched(target: Path) -> None:
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert sorted(p.name for p in target.iterdir()) == ["keep.txt"]
    assert (target / "keep.txt").read_text() == "not the node's\n"


async def _node(tmp_path: Path, *flags: str) -> tuple[int, str]:
    gpu = tmp_path / "gpu"
    if not gpu.exists():
        init_device(str(gpu))
    argv = [
        sys.executable, "-m", "fleet_trio", "node", "--gpu", "fake", "--fake-gpu-dir", str(gpu),
        "--listen", "127.0.0.1:0", *flags,
    ]  # fmt: skip
    with trio.fail_after(60):
        done = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False)
    return done.returncode, done.stderr.decode()


def _one_error_line(err: str, path: Path) -> None:
    assert "Traceback" not in err, err
    [line] = err.splitlines()
    assert line.startswith("error: ") and str(path) in line and "symbolic link" in line, line


@pytest.mark.slow
async def test_a_symlinked_results_folder_is_a_start_error_and_its_target_untouched(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "state" / "journal.sqlite"
    journal.parent.mkdir()
    target = _someone_elses_folder(tmp_path)
    link = Path(str(journal) + ".results")
    link.symlink_to(target)
    code, err = await _node(
        tmp_path, "--journal", str(journal), "--footprints", str(tmp_path / "fp.json")
    )
    assert code == 1, err
    _one_error_line(err, link)
    _untouched(target)
    assert link.is_symlink()


@pytest.mark.slow
async def test_a_symlinked_journal_is_a_start_error_and_its_target_untouched(
    tmp_path: Path,
) -> None:
    target = tmp_path / "precious.db"
    target.write_bytes(b"someone's data\n")
    target.chmod(0o644)
    link = tmp_path / "journal.sqlite"
    link.symlink_to(target)
    code, err = await _node(tmp_path, "--journal", str(link), "--footprints", str(tmp_path / "f"))
    assert code == 1, err
    _one_error_line(err, link)
    assert target.read_bytes() == b"someone's data\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert not (tmp_path / "precious.db.results").exists()


@pytest.mark.slow
async def test_a_symlinked_footprint_store_is_a_start_error_and_its_target_untouched(
    tmp_path: Path,
) -> None:
    target = tmp_path / "other.json"
    target.write_text("{}\n")
    link = tmp_path / "footprints.json"
    link.symlink_to(target)
    code, err = await _node(tmp_path, "--no-journal", "--footprints", str(link))
    assert code == 1, err
    _one_error_line(err, link)
    assert target.read_text() == "{}\n"


@pytest.mark.parametrize("sibling", ["-wal", "-shm", "-journal"])
def test_a_symlink_beside_the_journal_refuses_the_open(tmp_path: Path, sibling: str) -> None:
    """SQLite opens its own files beside the database, following links: refused first."""
    target = tmp_path / "victim"
    target.write_bytes(b"x")
    path = tmp_path / "journal.sqlite"
    Path(str(path) + sibling).symlink_to(target)
    with pytest.raises(JournalError, match="symbolic link"):
        Journal(str(path)).open()
    assert target.read_bytes() == b"x"
    assert not path.exists()


def test_a_results_folder_made_a_link_after_the_start_loses_nothing(tmp_path: Path) -> None:
    """Swapped in while the node runs: the stale-file sweep removes nothing through it."""
    path = tmp_path / "journal.sqlite"
    journal = Journal(str(path))
    journal.open()
    try:
        results = Path(journal.results_dir)
        results.rmdir()
        target = _someone_elses_folder(tmp_path)
        results.symlink_to(target)
        assert journal.drop_stale_files(keep=()) == 0
        _untouched(target)
    finally:
        journal.close()


async def test_a_symlinked_work_root_is_a_start_error(tmp_path: Path) -> None:
    target = _someone_elses_folder(tmp_path)
    link = tmp_path / "work"
    link.symlink_to(target)
    with trio.fail_after(30), pytest.raises(NodeStartError, match="symbolic link") as caught:
        await serve_node(NodeConfig(), NodeOptions(no_journal=True), work_root=str(link))
    assert str(link) in str(caught.value)
    _untouched(target)


def test_a_recorded_work_root_that_became_a_link_is_not_swept(tmp_path: Path) -> None:
    """The previous run's root, read from the journal, is now a link: nothing removed."""
    target = tmp_path / "elsewhere"
    target.mkdir()
    tagged = target / (work_dir_prefix("0123456789ab") + "x")
    tagged.mkdir()
    link = tmp_path / "root"
    link.symlink_to(target)
    assert remove_tagged([str(link)], "0123456789ab") == 0
    assert tagged.is_dir()


def test_symlink_problem_names_the_path_and_leaves_real_paths_and_missing_ones_alone(
    tmp_path: Path,
) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert symlink_problem(str(tmp_path / "real")) is None
    assert symlink_problem(str(tmp_path / "missing")) is None
    problem = symlink_problem(str(tmp_path / "link"))
    assert problem is not None and problem.startswith(f"{tmp_path / 'link'} is a symbolic link")
    # a link above the path is fine: only the node's own last component is checked
    assert symlink_problem(os.path.join(tmp_path / "link", "journal.sqlite")) is None


@pytest.mark.parametrize("sibling", ["-wal", "-shm", "-journal"])
def test_a_fifo_beside_an_existing_journal_is_a_clear_open_error(
    tmp_path: Path, sibling: str
) -> None:
    """A FIFO (or any non-file) where SQLite keeps its own file: one line naming that file,
    not 'database is locked (another node?)', a 'disk I/O error' at the first ack, or a hang."""
    path = tmp_path / "journal.sqlite"
    journal = Journal(str(path))
    journal.open()
    journal.close()
    fifo = Path(str(path) + sibling)
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    with pytest.raises(JournalError, match="not a regular file") as err:
        Journal(str(path)).open()
    assert str(fifo) in str(err.value)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)  # left as it was


def test_a_results_folder_made_a_link_after_the_start_gets_no_write_and_no_unlink(
    tmp_path: Path,
) -> None:
    """Swapped in while the node runs: a large result is not written through the link (the
    write fails: the outcome stays in memory, logged) and an eviction removes nothing there."""
    from fleet_trio.node.journal import Accept, Evict, Finish, Start

    path = tmp_path / "journal.sqlite"
    journal = Journal(str(path))
    journal.open()
    try:
        results = Path(journal.results_dir)
        name = journal.result_file("big")
        assert name is not None
        journal.apply([Accept("big", 1.0), Start("big")])
        results.rmdir()
        target = _someone_elses_folder(tmp_path)
        results.symlink_to(target)
        with pytest.raises(JournalError, match="write failed"):
            journal.apply([Finish("big", "done", 2.0, data_file=name, file_data=b'{"v": 1}')])
        _untouched(target)
        planted = target / os.path.basename(name)  # a file of that name, not the node's
        planted.write_text("{}")
        journal.apply([Accept("e", 1.0), Finish("e", "error", 2.0, error="x")])
        journal.apply([Evict("e", data_file=name)])
        assert planted.read_text() == "{}"
    finally:
        journal.close()
