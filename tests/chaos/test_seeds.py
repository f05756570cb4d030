"""Fixed chaos seeds (docs/chaos.md), played against two real fleets side by side.

A seed that once broke a promise is added to ``REGRESSION_SEEDS`` (with the duration it failed
at) once the bug is fixed, so it is replayed in every run.
"""

from __future__ import annotations

import pytest
import trio

from fleet_trio.sim.chaos import (
    VERIFY_SCRIPT,
    SeedResult,
    make_schedule,
    node_yaml,
    run_schedule,
    verdict,
)
from fleet_trio.sim.fleet import ShutdownRecord, open_fleet

DURATION = 3.0
SEEDS = list(range(1, 21))
REGRESSION_SEEDS: list[tuple[int, float]] = []
"""``(seed, duration)`` of schedules that once broke a promise."""

BATCHES = [
    [(s, DURATION) for s in SEEDS[0::2]],
    [(s, DURATION) for s in SEEDS[1::2]] + REGRESSION_SEEDS,
]
"""One fleet per batch; the batches run at the same time (most of a seed is waiting)."""


async def play_batch(
    root: str,
    batch: list[tuple[int, float]],
    results: list[tuple[SeedResult, float]],
    shutdowns: list[ShutdownRecord],
) -> None:
    async with open_fleet(
        root, node_yaml=node_yaml(), verify_scripts={"10-fake-vram": VERIFY_SCRIPT}
    ) as fleet:
        for seed, duration in batch:
            result = await run_schedule(fleet, seed, make_schedule(seed, duration))
            results.append((result, duration))
    shutdowns.extend(fleet.shutdowns)


@pytest.mark.slow
async def test_chaos_seeds_keep_every_promise(tmp_path) -> None:
    results: list[tuple[SeedResult, float]] = []
    shutdowns: list[ShutdownRecord] = []
    with trio.fail_after(60 + 12 * max(len(b) for b in BATCHES)):
        async with trio.open_nursery() as nursery:
            for i, batch in enumerate(BATCHES):
                root = tmp_path / f"fleet{i}"
                root.mkdir()
                nursery.start_soon(play_batch, str(root), batch, results, shutdowns)
    failures = [verdict(r, d) for r, d in sorted(results, key=lambda x: x[0].seed) if not r.ok]
    assert not failures, "\n\n".join(failures)
    assert len(results) == sum(len(b) for b in BATCHES)
    # every graceful stop, in the schedules and at the end, within its documented bound
    assert shutdowns and all(s.exit_code is not None and s.seconds <= s.bound for s in shutdowns)
    # the promises were really exercised, not vacuously true
    records = [r.records for r, _ in results]
    assert sum(len(r.node_jobs) + len(r.rc_jobs) for r in records) >= 10 * len(results)
    assert any(j.error == "interrupted" for r in records for j in r.node_jobs)
    assert any(j.state == "done" for r in records for j in r.node_jobs)
    assert any(rc.state == "succeeded" for r in records for rc in r.rc_jobs)
    assert any(rc.state == "killed" for r in records for rc in r.rc_jobs)
    assert any(
        reason.startswith("verify failed") for r in records for reason in r.quarantined.values()
    )
    kinds = {e.kind for r in records for e in r.process_events}
    assert {"kill", "term", "restart"} <= kinds
