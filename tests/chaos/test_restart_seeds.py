"""The restart chaos scenario (``fleet_trio.sim.chaos_restart``, docs/chaos.md): a node
SIGKILLed and restarted at random moments while the dispatcher keeps polling. 30 fixed seeds
on three node lineages side by side; the checker itself is tested on recorded facts, and on a
node without its journal (which must fail)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from fleet_trio.sim.chaos_restart import (
    Leftover,
    RestartRecords,
    RestartResult,
    check_restart,
    make_restart_schedule,
    restart_verdict,
    run_restart_seeds,
)
from fleet_trio.sim.dispatcher import DispatchRecord, Observation

SEEDS = list(range(1, 31))
LINEAGES = [SEEDS[0::3], SEEDS[1::3], SEEDS[2::3]]


@pytest.mark.slow
async def test_restart_seeds_keep_every_promise(tmp_path: Path) -> None:
    results: list[RestartResult] = []

    async def lineage(i: int, seeds: list[int]) -> None:
        root = tmp_path / f"lineage{i}"
        root.mkdir()
        results.extend(await run_restart_seeds(str(root), seeds))

    with trio.fail_after(150):
        async with trio.open_nursery() as nursery:
            for i, seeds in enumerate(LINEAGES):
                nursery.start_soon(lineage, i, seeds)
    assert sorted(r.seed for r in results) == SEEDS
    assert sum(r.acked for r in results) >= 3 * len(SEEDS)  # the seeds do dispatch work
    assert sum(r.restarts for r in results) >= len(SEEDS)
    failures = [restart_verdict(r) for r in sorted(results, key=lambda r: r.seed) if not r.ok]
    assert not failures, "\n\n".join(failures)


@pytest.mark.slow
async def test_without_the_journal_the_checker_fails(tmp_path: Path) -> None:
    with trio.fail_after(60):
        results = await run_restart_seeds(str(tmp_path), [3], journal=False)
    rules = {v.rule for r in results for v in r.violations}
    assert "unknown-job" in rules, [restart_verdict(r) for r in results]


def test_schedules_are_seeded() -> None:
    assert make_restart_schedule(7) == make_restart_schedule(7)
    assert make_restart_schedule(7) != make_restart_schedule(8)
    for seed in SEEDS:
        kinds = [s.kind for s in make_restart_schedule(seed)]
        assert "kill" in kinds and kinds[-1] == "resubmit" and kinds.count("submit") >= 5


def _record(job_id: str, state: str, error: str | None = None) -> DispatchRecord:
    rec = DispatchRecord(job_id, "quick", None, {}, node="n", state=state, error=error)
    rec.attempts.append(("n", 202, "accepted"))
    return rec


def _poll(job_id: str, status: int, detail: str, at: float = 0.0) -> Observation:
    return Observation(at, "n", "poll", status, detail, job_id)


def test_checker_names_each_broken_promise() -> None:
    records = [_record("a", "done"), _record("b", "error", "interrupted"), _record("c", "done")]
    good = RestartRecords(
        seed=1,
        records=records,
        observations=[
            _poll("a", 200, "running"),
            _poll("a", 200, "done"),
            _poll("a", 200, "done"),
            _poll("b", None, "connection refused"),  # type: ignore[arg-type]
            _poll("b", 200, "error"),
            _poll("c", 200, "done"),
        ],
        runs={"a": 1, "b": 1, "c": 1},
        acked={"a", "b", "c"},
    )
    assert check_restart(good) == []
    bad = RestartRecords(
        seed=1,
        records=[*records, _record("d", "running")],
        observations=[
            *good.observations,
            _poll("a", 404, "unknown job"),
            _poll("c", 200, "running"),
        ],
        runs={"a": 2, "b": 1, "c": 1},
        leftovers=[Leftover(123, "b", 1.0)],
        leftover_dirs=["fleet-job-0123456789ab-x1"],
        acked={"a", "b", "c", "d"},
    )
    found = {(v.rule, v.job_id) for v in check_restart(bad)}
    assert found == {
        ("unknown-job", "a"),
        ("terminal-changed", "c"),
        ("ran-twice", "a"),
        ("outlived-node", "b"),
        ("no-terminal", "d"),
        ("workdir-left", "fleet-job-0123456789ab-x1"),
    }
