"""``/proc`` primitives (worker-process.md §2.9, §3.4): stat parsing and the sweep's marker scan."""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest
import trio
from hypothesis import example, given
from hypothesis import strategies as st

from fleet_trio.proc import procfs
from fleet_trio.proc.procfs import (
    ENVIRON_CHUNK,
    Ident,
    MarkerScan,
    ProcStat,
    ancestor_set,
    env_marker_value,
    ident_alive,
    idents_alive,
    parse_proc_stat,
    pid_alive,
    read_proc_file,
    read_proc_stat,
    scan_job_marker,
    signal_ident,
)
from tests.helpers import marker_ready, wait_until

# ------------------------------------------------------------------------------------ parsing

TAIL = b" 0 -1 4194560 12670 310409 0 156 30 81 1167 559 10 -10 11 0 14 36442112 2407\n"


def stat_line(pid: int, comm: bytes, state: bytes, ppid: int, pgid: int, sid: int) -> bytes:
    return b"%d (%s) %s %d %d %d" % (pid, comm, state, ppid, pgid, sid) + TAIL


def test_parses_a_plain_line() -> None:
    assert parse_proc_stat(stat_line(42, b"sleep", b"S", 7, 42, 40)) == ProcStat(
        pid=42, state="S", ppid=7, pgid=42, sid=40
    )


@pytest.mark.parametrize(
    "comm",
    [b"tmux: server", b"a) b (c", b"(sd-pam)", b")", b"(", b") S 1 2 3", b"x)) (y", b""],
)
def test_comm_with_spaces_and_parentheses(comm: bytes) -> None:
    assert parse_proc_stat(stat_line(9, comm, b"R", 1, 9, 9)) == ProcStat(
        pid=9, state="R", ppid=1, pgid=9, sid=9
    )


def test_zombie_state_is_the_first_character_of_field_0() -> None:
    parsed = parse_proc_stat(b"5 (defunct) Z 1 5 5")
    assert parsed is not None and parsed.state == "Z"


def test_pid_text_is_trimmed() -> None:
    assert parse_proc_stat(b"  17  (x) S 1 2 3") == ProcStat(17, "S", 1, 2, 3)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"42 sleep S 1 2 3",  # no "("
        b"42 ) (sleep S 1 2 3",  # the last ")" is before the first "("
        b"42 (sleep)",  # nothing after ")"
        b"42 (sleep) ",  # nothing after ") "
        b"42 (sleep)S 1 2 3",  # no space after ")"
        b"42 (sleep) S 1 2",  # fewer than 4 fields
        b"x (sleep) S 1 2 3",  # pid not an integer
        b"(sleep) S 1 2 3",  # no pid at all
        b"42 (sleep) S one 2 3",  # ppid
        b"42 (sleep) S 1 two 3",  # pgrp
        b"42 (sleep) S 1 2 three",  # session
    ],
)
def test_malformed_lines_are_none(data: bytes) -> None:
    assert parse_proc_stat(data) is None


comms = st.binary(max_size=20).filter(lambda b: b"\n" not in b)
states = st.sampled_from([b"R", b"S", b"D", b"Z", b"T", b"t", b"X", b"I", b"W", b"K", b"P"])
ints = st.integers(min_value=0, max_value=2**31 - 1)


@given(pid=ints, comm=comms, state=states, ppid=ints, pgid=ints, sid=ints)
@example(pid=1, comm=b") Z 9 9 9 (", state=b"S", ppid=0, pgid=1, sid=1)
def test_round_trip(pid: int, comm: bytes, state: bytes, ppid: int, pgid: int, sid: int) -> None:
    assert parse_proc_stat(stat_line(pid, comm, state, ppid, pgid, sid)) == ProcStat(
        pid=pid, state=state.decode(), ppid=ppid, pgid=pgid, sid=sid
    )


@given(st.binary(max_size=80))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    parsed = parse_proc_stat(data)
    assert parsed is None or isinstance(parsed, ProcStat)


def test_parses_this_processs_real_stat() -> None:
    st_self = read_proc_stat(os.getpid())
    assert st_self is not None
    assert st_self.pid == os.getpid()
    assert st_self.ppid == os.getppid()
    assert st_self.pgid == os.getpgid(0)
    assert st_self.sid == os.getsid(0)


def test_ancestor_set_contains_self_and_parent() -> None:
    anc = ancestor_set(os.getpid())
    assert {os.getpid(), os.getppid()} <= anc


# ------------------------------------------------------------------------------ marker values


@pytest.mark.parametrize(
    ("environ", "value"),
    [
        (b"A=1\0RC_JOB_ID=abc\0", "abc"),
        (b"RC_JOB_ID=\0RC_JOB_ID=second\0", "second"),  # the first *non-empty* value
        (b"RC_JOB_ID=\0", ""),
        (b"XRC_JOB_ID=abc\0", ""),  # the key must start the entry
        (b"", ""),  # kernel thread or zombie
        (b"RC_JOB_ID=abc", "abc"),  # no trailing NUL
    ],
)
def test_env_marker_value(environ: bytes, value: str) -> None:
    assert env_marker_value(environ) == value


def test_read_proc_file_reads_past_the_first_chunk(tmp_path: Path) -> None:
    big = (b"K=" + b"v" * 100 + b"\0") * (3 * ENVIRON_CHUNK // 100)
    path = tmp_path / "environ"
    path.write_bytes(big)
    assert read_proc_file(str(path)) == big
    path.write_bytes(big[:ENVIRON_CHUNK])
    assert read_proc_file(str(path)) == big[:ENVIRON_CHUNK]


# ---------------------------------------------------------------- the marker scan, fake /proc


def add_proc(
    root: Path,
    pid: int,
    *,
    environ: bytes | None = None,
    state: str | None = "S",
    environ_unreadable: bool = False,
) -> None:
    """A fake ``/proc/<pid>``: ``environ=None`` leaves the file out (gone, ENOENT);
    ``environ_unreadable`` makes it a directory (EISDIR: an error that is not ENOENT/ESRCH, the
    way EACCES would be for a non-root worker); ``state=None`` leaves ``stat`` out."""
    d = root / str(pid)
    d.mkdir()
    if environ_unreadable:
        (d / "environ").mkdir()
    elif environ is not None:
        (d / "environ").write_bytes(environ)
    if state is not None:
        (d / "stat").write_bytes(stat_line(pid, b"x", state.encode(), 1, pid, pid))


@pytest.fixture
def fake_proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    root.mkdir()
    (root / "self").mkdir()
    (root / "sys").mkdir()
    return root


def env(value: str) -> bytes:
    return b"PATH=/bin\0RC_JOB_ID=" + value.encode() + b"\0HOME=/\0"


def test_scan_matches_exactly_and_skips_zombies_gone_and_protected(fake_proc: Path) -> None:
    add_proc(fake_proc, 10, environ=env("job-1"))
    add_proc(fake_proc, 11, environ=env("job-1"), state="Z")  # turned zombie after the read
    add_proc(fake_proc, 12, environ=env("job-1"), state=None)  # gone after the read
    add_proc(fake_proc, 13, environ=env("job-1-later"))
    add_proc(fake_proc, 14, environ=env("job-"))
    add_proc(fake_proc, 15, environ=b"RC_JOB_ID=job-1-x\0RC_JOB_ID=job-1\0")  # first value wins
    add_proc(fake_proc, 16, environ=env("job-1"))  # protected
    add_proc(fake_proc, 17, environ=b"")  # kernel thread / zombie
    add_proc(fake_proc, 18, environ=None, state=None)  # vanished mid-walk
    add_proc(fake_proc, 19, environ=b"RC_JOB_ID=\0")
    res = scan_job_marker("job-1", frozenset({16}), proc=str(fake_proc))
    assert res == MarkerScan(scanned=True, pids=(10,), blind=False, settled=True)


def test_scan_unreadable_environ_is_blind_only_for_a_live_process(fake_proc: Path) -> None:
    add_proc(fake_proc, 20, environ_unreadable=True, state="Z")
    add_proc(fake_proc, 21, environ_unreadable=True, state=None)
    assert scan_job_marker("j", proc=str(fake_proc)) == MarkerScan(scanned=True, settled=True)
    add_proc(fake_proc, 22, environ_unreadable=True, state="S")
    assert scan_job_marker("j", proc=str(fake_proc)) == MarkerScan(
        scanned=True, blind=True, settled=True
    )


def test_scan_protected_unreadable_process_is_not_read(fake_proc: Path) -> None:
    add_proc(fake_proc, 23, environ_unreadable=True)
    res = scan_job_marker("j", frozenset({23}), proc=str(fake_proc))
    assert res == MarkerScan(scanned=True, settled=True)


def test_scan_that_cannot_list_proc_did_not_look(tmp_path: Path) -> None:
    res = scan_job_marker("j", proc=str(tmp_path / "missing"))
    assert res.scanned is False
    assert res.pids == ()


def test_scan_reads_processes_forked_during_the_walk(
    fake_proc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pid that appears in a later listing is read too; the scan settles once none is new."""
    add_proc(fake_proc, 30, environ=b"")
    listings = [[30], [30, 31], [31, 30, 32], [30, 31, 32]]
    add_proc(fake_proc, 31, environ=env("job"))
    add_proc(fake_proc, 32, environ=env("job"))
    calls: list[int] = []

    def fake_list(proc: str) -> list[str] | None:
        calls.append(1)
        return [str(pid) for pid in listings[len(calls) - 1]]

    monkeypatch.setattr(procfs, "_list_pid_names", fake_list)
    res = scan_job_marker("job", proc=str(fake_proc))
    assert res == MarkerScan(scanned=True, pids=(31, 32), settled=True)
    assert len(calls) == 4


def test_scan_that_never_settles_says_so(fake_proc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    counter = iter(range(100, 10_000))

    def fork_storm(proc: str) -> list[str] | None:
        return [str(next(counter))]

    monkeypatch.setattr(procfs, "_list_pid_names", fork_storm)
    res = scan_job_marker("job", proc=str(fake_proc), max_listings=5)
    assert res.scanned is True
    assert res.settled is False


def test_scan_a_relisting_failure_is_not_settled(
    fake_proc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    answers: list[list[str] | None] = [["40"], None]
    add_proc(fake_proc, 40, environ=env("job"))
    monkeypatch.setattr(procfs, "_list_pid_names", lambda proc: answers.pop(0))
    assert scan_job_marker("job", proc=str(fake_proc)) == MarkerScan(
        scanned=True, pids=(40,), settled=False
    )


def test_scan_reads_an_empty_environ_once_more(
    fake_proc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process caught mid-``execve`` reads as an empty environ for a moment."""
    add_proc(fake_proc, 50, environ=b"")
    add_proc(fake_proc, 51, environ=b"", state="Z")
    real = procfs._list_pid_names

    def listing(proc: str) -> list[str] | None:
        (fake_proc / "50" / "environ").write_bytes(env("job"))  # the exec completed meanwhile
        return real(proc)

    monkeypatch.setattr(procfs, "_list_pid_names", listing)
    assert scan_job_marker("job", proc=str(fake_proc)) == MarkerScan(scanned=True, pids=(50,))


def own_namespace(root: Path, last_pid: int = 500) -> None:
    """Make the fake ``/proc`` look like our own namespace's, with a ``loadavg``."""
    (root / "self").rmdir()
    (root / "self").symlink_to(str(os.getpid()))
    (root / "loadavg").write_text(f"0.00 0.01 0.05 1/99 {last_pid}\n")


def counting_listings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = procfs._list_pid_names

    def listing(proc: str) -> list[str] | None:
        calls.append(1)
        return real(proc)

    monkeypatch.setattr(procfs, "_list_pid_names", listing)
    return calls


def test_scan_settles_without_relisting_when_no_pid_was_allocated(
    fake_proc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own_namespace(fake_proc)
    add_proc(fake_proc, 60, environ=env("job"))
    add_proc(fake_proc, 61, environ=env("other"))
    calls = counting_listings(monkeypatch)
    assert scan_job_marker("job", proc=str(fake_proc)) == MarkerScan(scanned=True, pids=(60,))
    assert len(calls) == 1


def test_scan_relists_when_a_pid_was_allocated_during_the_walk(
    fake_proc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own_namespace(fake_proc)
    add_proc(fake_proc, 60, environ=env("job"))
    last = iter([500, 501, 501, 501])
    monkeypatch.setattr(procfs, "_last_pid", lambda proc: next(last))
    calls = counting_listings(monkeypatch)
    assert scan_job_marker("job", proc=str(fake_proc)) == MarkerScan(scanned=True, pids=(60,))
    assert len(calls) == 2


@pytest.mark.parametrize(
    ("environ", "state"),
    [
        (b"", "Z"),  # a zombie: children it forked late may be missing from the listing
        (None, None),  # gone mid-walk
        (env("job"), "Z"),  # matched, then died
    ],
)
def test_scan_relists_after_a_doubtful_read(
    fake_proc: Path, monkeypatch: pytest.MonkeyPatch, environ: bytes | None, state: str | None
) -> None:
    own_namespace(fake_proc)
    add_proc(fake_proc, 70, environ=environ, state=state)
    calls = counting_listings(monkeypatch)
    assert scan_job_marker("job", proc=str(fake_proc), recheck=0) == MarkerScan(scanned=True)
    assert len(calls) == 2


def test_scan_does_not_trust_loadavg_of_another_namespace(
    fake_proc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own_namespace(fake_proc)
    (fake_proc / "self").unlink()
    (fake_proc / "self").symlink_to(str(os.getpid() + 1))
    calls = counting_listings(monkeypatch)
    assert scan_job_marker("job", proc=str(fake_proc)) == MarkerScan(scanned=True)
    assert len(calls) == 2


def test_empty_environ_recheck_waits(fake_proc: Path) -> None:
    add_proc(fake_proc, 80, environ=b"")
    start = time.monotonic()
    scan_job_marker("job", proc=str(fake_proc), recheck=0.05)
    assert time.monotonic() - start >= 0.05


# ---------------------------------------------------------------- the marker scan, real /proc


async def test_real_scan_finds_a_marked_process_and_not_its_zombie() -> None:
    job = f"procfs-{uuid.uuid4()}"
    marked = {**os.environ, "RC_JOB_ID": job}
    with trio.fail_after(10):
        live = await trio.lowlevel.open_process(["sleep", "30"], env=marked)
        dead = await trio.lowlevel.open_process([sys.executable, "-c", "pass"], env=marked)
        try:
            await marker_ready(live.pid, job)
            await wait_until(
                lambda: not (read_proc_stat(dead.pid) is not None and pid_alive(dead.pid))
            )
            assert read_proc_stat(dead.pid) is not None  # the zombie is still listed
            res = scan_job_marker(job, ancestor_set(os.getpid()))
            assert res.scanned and res.settled and not res.blind
            assert res.pids == (live.pid,)
            # A protected pid is never reported.
            assert scan_job_marker(job, {live.pid}).pids == ()
        finally:
            live.send_signal(signal.SIGKILL)
            await live.wait()
            await dead.wait()
    assert not pid_alive(live.pid)


def test_real_scan_for_an_unused_id_finds_nothing() -> None:
    res = scan_job_marker(f"unused-{uuid.uuid4()}", ancestor_set(os.getpid()))
    assert res.scanned is True
    assert res.pids == ()
    if os.geteuid() == 0:
        assert res.blind is False


async def test_real_scan_decodes_non_utf8_ids_like_job_env_id() -> None:
    raw = b"id-\xff-" + uuid.uuid4().hex.encode()
    job = raw.decode("utf-8", errors="surrogateescape")
    marked = {**os.environb, b"RC_JOB_ID": raw}
    with trio.fail_after(10):
        proc = await trio.lowlevel.open_process(["sleep", "30"], env=marked)
        try:
            await marker_ready(proc.pid, job)
            assert scan_job_marker(job).pids == (proc.pid,)
        finally:
            proc.kill()
            await proc.wait()


# ------------------------------------------------------------------------ identity (pid + start)


def test_stat_start_time_is_parsed() -> None:
    st = read_proc_stat(os.getpid())
    assert st is not None and st.start > 0
    line = b"7 (a) b) S 1 7 7 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 98765 0 0"
    parsed = parse_proc_stat(line)
    assert parsed is not None and parsed.start == 98765 and parsed.flags == 4194560


async def test_identity_check_and_signal_never_hit_another_process() -> None:
    with trio.fail_after(10):
        proc = await trio.lowlevel.open_process(["sleep", "30"])
        try:
            st = read_proc_stat(proc.pid)
            assert st is not None
            me, other = Ident(proc.pid, st.start), Ident(proc.pid, st.start + 1)
            assert ident_alive(me) and not ident_alive(other)
            assert idents_alive([me, other]) == {me}
            # A pid now naming another process (another start time) is never signalled.
            assert signal_ident(other, signal.SIGKILL) is False
            assert proc.poll() is None and ident_alive(me)
            assert signal_ident(me, signal.SIGKILL) is True
            await proc.wait()
            assert not ident_alive(me)  # reaped: gone
            assert signal_ident(me, signal.SIGKILL) is False
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def test_a_zombie_is_gone_for_the_identity_check() -> None:
    with trio.fail_after(10):
        proc = await trio.lowlevel.open_process(["sh", "-c", "exit 0"])
        st = read_proc_stat(proc.pid)
        assert st is not None
        me = Ident(proc.pid, st.start)
        await wait_until(lambda: (cur := read_proc_stat(proc.pid)) is None or cur.state == "Z")
        assert not ident_alive(me)  # a zombie, not yet reaped
        await proc.wait()


def test_marker_scan_reports_start_times() -> None:
    res = scan_job_marker(f"none-{uuid.uuid4()}")
    assert res.idents() == ()
    scan = MarkerScan(scanned=True, pids=(4, 5), starts=(40,))
    assert scan.idents() == (Ident(4, 40), Ident(5, 0))


def test_scan_passes_over_kernel_threads_without_a_recheck_or_a_second_listing(
    fake_proc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel thread reads an empty environment for good; its ``stat`` flags say what it
    is, so it is neither re-read after a pause nor a reason to list ``/proc`` again."""
    own_namespace(fake_proc)
    add_proc(fake_proc, 60, environ=env("job"))
    add_proc(fake_proc, 2, environ=b"", state=None)
    kthread_flags = procfs.PF_KTHREAD | 0x8040
    (fake_proc / "2" / "stat").write_bytes(
        b"2 (kthreadd) S 0 0 0 0 -1 %d 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0\n" % kthread_flags
    )
    calls = counting_listings(monkeypatch)
    start = time.monotonic()
    assert scan_job_marker("job", proc=str(fake_proc), recheck=5.0) == MarkerScan(
        scanned=True, pids=(60,)
    )
    assert len(calls) == 1
    assert time.monotonic() - start < 5.0  # no recheck pause for it


def test_an_empty_user_process_is_still_doubtful(
    fake_proc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same empty read from a user process (one inside ``execve``) is re-read and makes
    the scan list ``/proc`` again."""
    own_namespace(fake_proc)
    add_proc(fake_proc, 61, environ=b"")
    calls = counting_listings(monkeypatch)
    assert scan_job_marker("job", proc=str(fake_proc), recheck=0) == MarkerScan(scanned=True)
    assert len(calls) == 2


def test_live_proc_pids_is_the_full_scan_and_exists_stops_at_the_first() -> None:
    """§2.9: ``live_proc_pids`` lists every live match (a full scan); ``live_proc_exists``
    asks the scan to stop at the first."""
    calls: list[bool] = []

    def scan(predicate: procfs.Predicate, stop_at_first: bool) -> tuple[list[int], bool]:
        calls.append(stop_at_first)
        return [7, 9], True

    assert procfs.live_proc_pids(lambda st: True, scan) == ([7, 9], True)
    assert procfs.live_proc_exists(lambda st: True, scan) == (True, True)
    assert calls == [False, True]
    me = os.getpid()
    pids, scanned = procfs.live_proc_pids(lambda st: st.pid == me)
    assert (pids, scanned) == ([me], True)
