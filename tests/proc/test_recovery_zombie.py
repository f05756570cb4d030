"""The survivor check after a crash (worker-process.md §9.3: "an exited pid is neither a
survivor nor an error"): a zombie that nobody reaps, anywhere on the host, must not keep the
check from settling (it did: every listing saw it and listed again, then claimed nothing, so
quarantined devices never recovered by themselves)."""

from __future__ import annotations

import pytest

from fleet_trio.proc import recovery
from fleet_trio.proc.procfs import ProcStat
from tests.helpers import FakeScan

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
    assert recovery.survivors_from_previous_run(1, scan) == (True, False)
    assert len(listings) == 2  # listed again once after it was first seen, then settled


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
