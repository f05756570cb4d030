"""The survivor check after a crash (worker-process.md §9.3: "an exited pid is neither a
survivor nor an error"): a zombie that nobody reaps, anywhere on the host, must not keep the
check from settling (it did: every listing saw it and listed again, then claimed nothing, so
quarantined devices never recovered by themselves)."""

from __future__ import annotations

import pytest

from fleet_trio.proc import recovery
from fleet_trio.proc.procfs import ProcStat
from tests.helpers import FakeScan, wait_until

ZOMBIE = ProcStat(pid=4242, state="Z", start=77)


def test_a_lasting_zombie_lets_the_survivor_check_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    scan = FakeScan(ZOMBIE)
    listings: list[int] = []

    def list_pids() -> list[int]:
        listings.append(1)
        return [ZOMBIE.pid]

    monkeypatch.setattr(recovery, "scan_live_procs", scan)  # the real scan's later listings
    monkeypatch.setattr(recovery, "list_pids", list_pids)
    monkeypatch.setattr(recovery, "read_proc_stat", lambda pid: ZOMBIE)
    monkeypatch.setattr(recovery, "stat_live", lambda st: st.state != "Z")
    assert recovery.survivors_from_previous_run(1, scan) == (True, False)
    assert len(listings) == 2  # listed again once after it was first seen, then settled


async def test_a_leader_whose_threads_run_on_is_a_survivor(tmp_path: object) -> None:
    """A process whose main thread called ``pthread_exit`` shows ``Z`` while its other threads
    run, and its own ``environ`` reads empty: it is judged by its threads' environment, and a
    marked one is a survivor (it was "doubt" forever before, and escaped the job sweep)."""
    import os
    import sys
    import uuid

    import trio

    from fleet_trio.proc.procfs import read_proc_stat

    code = (
        "import ctypes, threading, time; "
        "threading.Thread(target=time.sleep, args=(30,)).start(); "
        "ctypes.CDLL(None).pthread_exit(None)"
    )
    marker = f"survivor-{uuid.uuid4()}"
    with trio.fail_after(20):
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-c", code], env={**os.environ, "RC_JOB_ID": marker}
        )
        try:
            await wait_until(
                lambda: (st := read_proc_stat(proc.pid)) is not None and st.state == "Z",
                what="the leader's exit",
            )
            checked, found = await trio.to_thread.run_sync(
                recovery.survivors_from_previous_run, os.getpid()
            )
            assert (checked, found) == (True, True)
        finally:
            proc.kill()
            await proc.wait()


def test_a_process_that_keeps_going_away_still_claims_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bound stays: new processes that are gone by the time they are read, listing after
    listing, are doubt every time (a fork-and-exit loop may hide a child)."""
    scan = FakeScan()
    pids = iter(range(5000, 6000))
    monkeypatch.setattr(recovery, "scan_live_procs", scan)
    monkeypatch.setattr(recovery, "list_pids", lambda: [next(pids)])
    monkeypatch.setattr(recovery, "read_proc_stat", lambda pid: None)
    assert recovery.survivors_from_previous_run(1, scan) == (False, False)


async def test_other_threads_live_sees_a_leader_that_left_its_threads_running() -> None:
    """On a real process: the main thread calls ``pthread_exit`` while another thread sleeps;
    ``stat`` says ``Z``, yet the process runs on."""
    import sys

    import trio

    from fleet_trio.proc.procfs import other_threads_live, read_proc_stat

    code = (
        "import ctypes, threading, time; "
        "threading.Thread(target=time.sleep, args=(30,)).start(); "
        "ctypes.CDLL(None).pthread_exit(None)"
    )
    with trio.fail_after(20):
        proc = await trio.lowlevel.open_process([sys.executable, "-c", code])
        try:
            await wait_until(
                lambda: (st := read_proc_stat(proc.pid)) is not None and st.state == "Z",
                what="the leader's exit",
            )
            assert other_threads_live(proc.pid)
        finally:
            proc.kill()
            await proc.wait()
    assert not other_threads_live(proc.pid)
