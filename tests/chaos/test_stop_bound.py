"""Issue 13 acceptance: the shutdown-bound chaos scenario (docs/chaos.md "Shutdown bound").

Over 50 seeds (25 nodes, 25 workers, each a real process forked from the sim's zygote), with a
tail client that reads nothing, a job that ignores SIGTERM, a controller that stops answering,
GPU queries that hang, and sometimes a second SIGTERM: every process exits within its
documented bound, every acked job ends with exactly one terminal state, no process with a
job's marker survives.
"""

from __future__ import annotations

import os
import signal

import pytest
import trio

from fleet_trio.sim.chaos.runner import scan_markers
from fleet_trio.sim.chaos.schedule import NODE_MARKER
from fleet_trio.sim.chaos_stop import (
    NODE_BOUND,
    MarkedProcess,
    StopRecord,
    StopResult,
    check_stop,
    make_stop_plan,
    play_stop_seed,
    run_stop_seeds,
    stop_verdict,
    worker_bound,
)
from tests.helpers import wait_until

SEEDS = list(range(1, 51))
HUNG_GPU = True
"""Half the node seeds have the fake GPU's queries hang (its ``hang`` file) from just before
the SIGTERM: the samplers' calls then never return, and the stop must not wait for them (they
are abandoned on cancel, as NVML's are)."""


def test_plan_is_a_pure_function_of_the_seed() -> None:
    assert make_stop_plan(7) == make_stop_plan(7)
    plans = [make_stop_plan(s, hung_gpu=True) for s in SEEDS]
    assert {p.role for p in plans} == {"node", "worker"}
    assert all(p.stalled >= 1 and p.jobs for p in plans)
    assert any(p.jobs[0] == "stubborn" for p in plans)
    assert {p.silence for p in plans if p.role == "worker"} == {"never", "window", "until_exit"}
    assert any(p.second_term is not None for p in plans)
    assert any(p.hung_gpu for p in plans) and not any(p.hung_gpu for p in plans if p.role != "node")
    assert not any(make_stop_plan(s).hung_gpu for s in SEEDS)


def _record(**kw: object) -> StopRecord:
    base: dict[str, object] = {
        "plan": make_stop_plan(2),
        "exit_code": 0,
        "seconds": 3.0,
        "bound": NODE_BOUND,
        "jobs": {"j1": ("error:interrupted", "error:interrupted")},
        "marked": (),
    }
    base.update(kw)
    return StopRecord(**base)  # type: ignore[arg-type]


def test_check_stop_catches_each_broken_promise() -> None:
    assert check_stop(_record()) == []
    assert [v.promise for v in check_stop(_record(exit_code=None))] == ["shutdown"]
    assert [v.promise for v in check_stop(_record(seconds=NODE_BOUND + 0.1))] == ["shutdown"]
    assert [v.promise for v in check_stop(_record(exit_code=-9))] == ["shutdown"]
    two = {"j1": ("done", "error:interrupted")}
    assert [v.promise for v in check_stop(_record(jobs=two))] == ["terminal"]
    assert [v.promise for v in check_stop(_record(jobs={"j1": ()}))] == ["terminal"]
    marked = (MarkedProcess(123, "FLEET_JOB_ID", "j1"),)
    assert [v.promise for v in check_stop(_record(marked=marked))] == ["sweep"]
    worker = _record(plan=make_stop_plan(1), bound=worker_bound(), jobs={"r1": ()})
    assert [v.promise for v in check_stop(worker)] == ["terminal"]  # not terminal anywhere
    lost = _record(
        plan=make_stop_plan(1), bound=worker_bound(), jobs={"r1": ()}, final={"r1": "lost"}
    )
    assert check_stop(lost) == []


@pytest.mark.slow
async def test_fifty_seeds_every_process_exits_within_its_bound(tmp_path) -> None:
    with trio.fail_after(300):
        results = await run_stop_seeds(str(tmp_path), SEEDS, hung_gpu=HUNG_GPU, concurrency=10)
    failures = [stop_verdict(r) for r in results if not r.ok]
    assert not failures, "\n\n".join(failures)
    assert len(results) == len(SEEDS)
    records = [r.record for r in results]
    # the faults were really there, not vacuously absent
    assert sum(1 for r in records if r.plan.role == "node") >= 20
    assert sum(1 for r in records if r.plan.role == "worker") >= 20
    assert not any("stalled reader not connected" in n for r in records for n in r.notes)
    # the server's writes to the stalled readers were blocked when the signal came (a loaded
    # machine may keep some from settling within the wait: 6 of 50 with a CPU hog beside a
    # 2-core run, 17 with other test runs on the machine as well; the shutdown is checked
    # anyway, and at least half the seeds must have the fault)
    unblocked = [r.plan.seed for r in records if any("never blocked" in n for n in r.notes)]
    assert len(unblocked) <= len(SEEDS) // 2, unblocked
    assert not any("exited" in n and "before the SIGTERM" in n for r in records for n in r.notes)
    assert any(
        s.startswith("error:interrupted") for r in records for st in r.jobs.values() for s in st
    )
    assert any(r.final and "lost" in r.final.values() for r in records)
    assert any(r.final and "killed" in r.final.values() for r in records)
    assert sum(1 for r in records if r.plan.hung_gpu) >= 5


@pytest.mark.parametrize("why", ["PortTaken", "NotReady"])
async def test_a_seed_that_lost_its_port_is_tried_again(
    tmp_path, monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    """``PortTaken`` is raised inside the play's nursery, so it arrives in an exception group;
    it must still mean "try another port" (it did not: one taken port failed the whole run).
    So must ``NotReady``: a seed whose jobs were not running within the ready bound on a
    loaded machine has no verdict (one such seed failed a whole run)."""
    from fleet_trio.sim import chaos_stop

    calls: list[str] = []

    async def play(plan: object, where: str, spawn: object) -> str:
        calls.append(where)
        if len(calls) == 1:
            async with trio.open_nursery():
                raise getattr(chaos_stop, why)("not this time")
        return "played"

    monkeypatch.setattr(chaos_stop, "play_worker", play)
    plan = next(p for p in map(make_stop_plan, SEEDS) if p.role == "worker")
    assert await chaos_stop.play_stop_seed(plan, str(tmp_path)) == "played"
    assert calls == [str(tmp_path), str(tmp_path / "try1")]


@pytest.mark.slow
async def test_another_run_of_the_same_seed_is_not_taken_for_a_survivor(tmp_path) -> None:
    """Issue 25: the scan for survivors walks the whole host, and a node seed's job ids were a
    function of the seed alone (``stop38-0-stubborn``). Another run of the scenario on the same
    machine (a second checkout's suite, a run killed earlier whose node still runs) holds job
    processes with those very ids: the check reported them as this seed's survivors, and
    SIGKILLed them. Every play's job ids are its own: a live process carrying the ids of an
    earlier play of the same seed is neither reported nor touched."""
    plan = make_stop_plan(2)  # a node; one job that ignores SIGTERM
    assert plan.role == "node"
    with trio.fail_after(120):
        first = await play_stop_seed(plan, str(tmp_path / "first"))
        assert check_stop(first) == [], stop_verdict(StopResult(first, check_stop(first)))
        # what a run killed mid-seed leaves: its job, still running, carrying its job id
        job_id = next(iter(first.jobs))
        leftover = await trio.lowlevel.open_process(
            ["sleep", "60"], env={**os.environ, NODE_MARKER: job_id}, process_group=0
        )
        try:
            await wait_until(
                lambda: job_id in {p.job_id for p in scan_markers({job_id})},
                what="the leftover's marker",
            )
            second = await play_stop_seed(plan, str(tmp_path / "second"))
            assert check_stop(second) == [], stop_verdict(StopResult(second, check_stop(second)))
        finally:
            with trio.CancelScope(shield=True):
                leftover.terminate()
                code = await leftover.wait()
    # ended by our SIGTERM, not by a SIGKILL of the check (a signal it sent came first)
    assert code == -signal.SIGTERM, "the check killed another run's process"
    assert not set(first.jobs) & set(second.jobs)
