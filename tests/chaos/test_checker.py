"""The chaos checker's own tests: each promise on hand-made records, the schedule's
determinism, and a deliberately broken build (the sim's role launcher injects the defect) that
must make it fail."""

from __future__ import annotations

import attrs
import pytest
import trio

from fleet_trio.sim.chaos import (
    Holding,
    MarkedProcess,
    NodeJobRecord,
    RcJobRecord,
    Records,
    Step,
    check,
    check_node_jobs,
    check_rc_jobs,
    check_shutdowns,
    check_sweep,
    check_vram,
    format_schedule,
    make_schedule,
    node_yaml,
    normalized_log,
    rc_command,
    rc_expected_output,
    run_schedule,
)
from fleet_trio.sim.chaos.schedule import NODE_KINDS, STUBBORN_SECONDS
from fleet_trio.sim.dispatcher import LOST_404
from fleet_trio.sim.fleet import ProcessEvent, ShutdownRecord, open_fleet

# -- the schedule ------------------------------------------------------------------------------


def test_schedule_is_a_pure_function_of_the_seed() -> None:
    assert make_schedule(7, 3.0) == make_schedule(7, 3.0)
    assert make_schedule(7, 3.0) != make_schedule(8, 3.0)
    text = format_schedule(7, make_schedule(7, 3.0))
    assert text.startswith("schedule of seed 7:") and "dispatch" in text


def test_schedule_shape() -> None:
    for seed in range(1, 41):
        steps = make_schedule(seed, 3.0)
        assert steps == sorted(steps, key=lambda s: (s.at, s.action, s.ref))
        actions = [s.action for s in steps]
        assert 6 <= actions.count("dispatch") <= 10
        assert 4 <= actions.count("submit") <= 6
        faults = [s for s in steps if s.action.endswith(("crash", "stop", "restart"))]
        assert len(faults) == 1
        if faults[0].action == "node_stop":  # the drained node's link is left clean
            assert all(s.target != f"dispatcher->{faults[0].target}" for s in steps)
        assert all(0 <= s.at <= 4.0 for s in steps)


def test_node_yaml_declares_every_kind() -> None:
    text = node_yaml()
    for kind in NODE_KINDS:
        assert f"  {kind}:" in text
    assert "  escape:" not in node_yaml(escape_task=False)


def test_rc_command_prints_numbered_lines() -> None:
    assert rc_command("lines", 3)[:2] == ["sh", "-c"]
    assert rc_expected_output(2) == b"line 1\nline 2\n"
    assert "setsid sleep 300" in rc_command("escape", 3)[2]
    assert "env -u RC_JOB_ID" in rc_command("leak", 3)[2]


# -- the checks on hand-made records -----------------------------------------------------------


def records(**kw: object) -> Records:
    return Records(seed=1, began=0.0, settled=10.0, **kw)  # type: ignore[arg-type]


def node_job(**kw: object) -> NodeJobRecord:
    """A clean quick node job (acked, ran once, done), with ``kw`` changed."""
    base = dict(ref="n1", job_id="s1-n1", kind="quick", node="node1", runs={"node1": 1})
    base |= dict(acked_at=1.0, states_seen=("running", "done"), terminal_at=1.5)
    return NodeJobRecord(**{**base, "state": "done", "error": None, **kw})  # type: ignore[arg-type]


def rc_job(**kw: object) -> RcJobRecord:
    """A clean two-line rc job on ``worker1`` (assigned, ran, succeeded), with ``kw`` changed."""
    base = dict(ref="r1", job_id="j1", kind="lines", device="chaos-w1:gpu0", worker="worker1")
    base |= dict(lines=2, log_chunks=(b"line 1\n", b"line 2\n"), started_at=1.0, finished_at=2.0)
    base |= dict(reports=(("running", None, ""), ("succeeded", 0, "")), assigned=True)
    return RcJobRecord(**{**base, "state": "succeeded", **kw})  # type: ignore[arg-type]


def test_clean_records_pass() -> None:
    assert check(records(node_jobs=(node_job(),), rc_jobs=(rc_job(),))) == []


def test_node_job_two_terminal_states() -> None:
    bad = node_job(states_seen=("running", "done", "error"))
    (v,) = check_node_jobs(records(node_jobs=(bad,)))
    assert v.promise == "terminal" and "several terminal states" in v.detail


def test_node_job_state_after_terminal() -> None:
    bad = node_job(states_seen=("done", "running"))
    assert any("after the terminal" in v.detail for v in check_node_jobs(records(node_jobs=(bad,))))


def test_node_job_ran_twice() -> None:
    (v,) = check_node_jobs(records(node_jobs=(node_job(runs={"node1": 2}),)))
    assert v.promise == "run-once" and "2 times on node1" in v.detail


def test_node_job_on_two_nodes_is_not_a_double_run() -> None:
    # an ack lost on the wire: the dispatcher placed it again elsewhere (a note, not a breach)
    assert check_node_jobs(records(node_jobs=(node_job(runs={"node1": 1, "node2": 1}),))) == []


def test_node_job_never_visible_on_an_undisturbed_node() -> None:
    bad = node_job(state="running", states_seen=("running",), terminal_at=None)
    (v,) = check_node_jobs(records(node_jobs=(bad,)))
    assert v.promise == "terminal" and "no terminal state was visible" in v.detail


def test_node_job_lost_with_its_crashed_node_is_excused() -> None:
    lost = node_job(state="error", error=LOST_404, states_seen=("running",), terminal_at=5.0)
    crash = ProcessEvent(2.0, "node1", "kill", "SIGKILL")
    assert check_node_jobs(records(node_jobs=(lost,), process_events=(crash,))) == []
    assert check_node_jobs(records(node_jobs=(lost,))) != []  # no crash: a breach


def test_stubborn_job_must_show_interrupted_when_its_node_drains() -> None:
    stop = ProcessEvent(1.2, "node1", "term")
    seen = node_job(
        kind="stubborn",
        state="error",
        error="interrupted",
        states_seen=("running", "error"),
        terminal_at=1.8,
    )
    assert check_node_jobs(records(node_jobs=(seen,), process_events=(stop,))) == []
    # seen only once drain + the whole grace had passed: marked after the kill
    late_mark = attrs.evolve(seen, terminal_at=1.2 + 0.5 + 1.5 + 0.1)
    (v,) = check_node_jobs(records(node_jobs=(late_mark,), process_events=(stop,)))
    assert "before the 1.5s kill grace" in v.detail
    missed = attrs.evolve(seen, state="error", error=LOST_404, states_seen=("running",))
    (v,) = check_node_jobs(records(node_jobs=(missed,), process_events=(stop,)))
    assert 'never saw error "interrupted"' in v.detail
    # a stop that comes when the job is about to end on its own proves nothing
    late = ProcessEvent(1.0 + STUBBORN_SECONDS - 0.2, "node1", "term")
    assert check_node_jobs(records(node_jobs=(missed,), process_events=(late,))) == []


def test_rc_job_without_terminal_report() -> None:
    bad = rc_job(state="running", reports=(("running", None, ""),), finished_at=None)
    (v,) = check_rc_jobs(records(rc_jobs=(bad,)))
    assert v.promise == "report"
    crash = ProcessEvent(1.5, "worker1", "kill", "SIGKILL")
    assert check_rc_jobs(records(rc_jobs=(bad,), process_events=(crash,))) == []
    stop = ProcessEvent(1.5, "worker1", "term")  # a graceful stop still owes the report
    assert check_rc_jobs(records(rc_jobs=(bad,), process_events=(stop,))) != []


def test_rc_job_two_different_terminal_reports() -> None:
    bad = rc_job(reports=(("running", None, ""), ("succeeded", 0, ""), ("failed", 1, "x")))
    (v,) = check_rc_jobs(records(rc_jobs=(bad,)))
    assert "different terminal reports" in v.detail
    resent = rc_job(reports=(("running", None, ""), ("succeeded", 0, ""), ("succeeded", 0, "")))
    assert check_rc_jobs(records(rc_jobs=(resent,))) == []


def test_rc_output_out_of_order_or_incomplete() -> None:
    swapped = rc_job(log_chunks=(b"line 2\n", b"line 1\n"))
    (v,) = check_rc_jobs(records(rc_jobs=(swapped,)))
    assert v.promise == "output" and "prefix" in v.detail
    short = rc_job(log_chunks=(b"line 1\n",))
    (v,) = check_rc_jobs(records(rc_jobs=(short,)))
    assert "1 of 2 lines" in v.detail
    killed = rc_job(
        state="killed",
        reports=(("running", None, ""), ("killed", -1, "cancelled")),
        log_chunks=(b"line 1\n",),
    )
    assert check_rc_jobs(records(rc_jobs=(killed,))) == []


def test_resent_chunk_is_tolerated() -> None:
    assert normalized_log([b"line 1\n", b"line 1\n", b"line 2\n"]) == (b"line 1\nline 2\n", 1)
    resent = rc_job(log_chunks=(b"line 1\n", b"line 1\n", b"line 2\n"))
    assert check_rc_jobs(records(rc_jobs=(resent,))) == []


def test_sweep_survivor_of_an_ended_job() -> None:
    survivor = MarkedProcess(4242, "RC_JOB_ID", "j1")
    (v,) = check_sweep(records(rc_jobs=(rc_job(),), marked=(survivor,)))
    assert v.promise == "sweep" and "4242" in v.detail
    node_survivor = MarkedProcess(4343, "FLEET_JOB_ID", "s1-n1")
    assert check_sweep(records(node_jobs=(node_job(),), marked=(node_survivor,)))
    # the job's supervisor never concluded it (crashed): not covered
    lost = rc_job(state="lost", reports=(("running", None, ""),))
    assert check_sweep(records(rc_jobs=(lost,), marked=(survivor,))) == []


def test_vram_held_without_quarantine() -> None:
    held = Holding("chaos-w1:gpu0", 99, 1 << 30, "j1")
    (v,) = check_vram(records(rc_jobs=(rc_job(),), holdings=(held,)))
    assert v.promise == "vram" and "not quarantined" in v.detail
    quarantined = {"chaos-w1:gpu0": "verify failed: 10-fake-vram: exited 1: held"}
    assert check_vram(records(rc_jobs=(rc_job(),), holdings=(held,), quarantined=quarantined)) == []
    other_fault = {"chaos-w1:gpu0": "acquire hook failed"}
    assert check_vram(records(rc_jobs=(rc_job(),), holdings=(held,), quarantined=other_fault))


def test_shutdown_over_its_bound() -> None:
    ok = ShutdownRecord("node1", 0.5, 9.5, 0)
    slow = ShutdownRecord("node2", 10.0, 9.5, 0)
    hung = ShutdownRecord("worker1", 93.0, 93.0, None)
    got = check_shutdowns(records(shutdowns=(ok, slow, hung)))
    assert [v.subject for v in got] == ["node2", "worker1"]
    assert "did not exit" in got[1].detail


# -- a deliberately broken build must fail the checker ----------------------------------------


@pytest.mark.slow
async def test_broken_build_skip_interrupted_is_caught(tmp_path) -> None:
    """A stubborn job in flight when its node drains: the real node marks it interrupted
    where the poller sees it; the node with ``skip-interrupted`` does not, and the check says so."""
    schedule = [
        Step(0.0, "dispatch", kind="stubborn", ref="n1"),
        Step(0.6, "node_stop", "node1"),
    ]
    with trio.fail_after(90):
        async with open_fleet(str(tmp_path), node_yaml=node_yaml(), nodes=1, workers=0) as fleet:
            good = await run_schedule(fleet, 1, schedule)
            assert good.ok, [str(v) for v in good.violations]
            (job,) = good.records.node_jobs
            assert job.error == "interrupted"
            node = fleet.node("node1")
            await node.stop()
            node.defects = ["skip-interrupted"]
            await node.start()
            broken = await run_schedule(fleet, 2, schedule)
    assert not broken.ok
    assert any(v.promise == "terminal" and "interrupted" in v.detail for v in broken.violations), [
        str(v) for v in broken.violations
    ]


@pytest.mark.slow
async def test_broken_build_skip_sweep_is_caught(tmp_path) -> None:
    """An rc job whose child escapes with setsid: the real worker sweeps it by RC_JOB_ID; the
    worker with ``skip-sweep`` leaves it alive, and the check says so."""
    schedule = [Step(0.0, "submit", "chaos-w1:gpu0", "escape", "r1", 3.0)]
    with trio.fail_after(90):
        async with open_fleet(str(tmp_path), node_yaml=node_yaml(), nodes=0, workers=1) as fleet:
            good = await run_schedule(fleet, 1, schedule)
            assert good.ok, [str(v) for v in good.violations]
            worker = fleet.worker("worker1")
            await worker.stop()
            worker.defects = ["skip-sweep"]
            await worker.start()
            # the restarted worker's device must be ready again, or the job is never assigned
            await fleet.ctrl.wait_for(
                lambda: fleet.ctrl.device("chaos-w1:gpu0").state == "ready", timeout=20
            )
            broken = await run_schedule(fleet, 2, schedule)
    assert not broken.ok, (broken.records, broken.notes)
    assert broken.records.rc_jobs[0].assigned
    assert [v.promise for v in broken.violations] == ["sweep"], [str(v) for v in broken.violations]
    assert any("killed 1 leftover" in n for n in broken.notes)  # and it was cleaned up


# -- the command ---------------------------------------------------------------------------------


def test_cli_rejects_bad_arguments(capsys) -> None:
    from fleet_trio.cli import main

    assert main(["sim", "chaos", "--seeds", "0"]) == 2
    assert main(["sim", "chaos", "--duration", "0"]) == 2
    assert main(["sim"]) == 2
    assert "chaos" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_fails_loudly_with_the_seed_to_reproduce(monkeypatch, capsys) -> None:
    """Seed 3 has an escaping rc job; with the sweep switched off the command must exit 1,
    name the broken promise and say how to reproduce it."""
    from fleet_trio.cli import main

    assert main(["sim", "chaos", "--seed", "3", "--quiet", "--defect", "skip-sweep"]) == 1
    out = capsys.readouterr().out
    assert "schedule of seed 3:" in out and "escape" in out
    assert "[sweep]" in out
    assert "reproduce: fleet-trio sim chaos --seed 3 --duration 3" in out


@pytest.mark.slow
async def test_node_job_escaping_its_process_group_is_swept(tmp_path) -> None:
    schedule = [Step(0.0, "dispatch", kind="escape", ref="n1")]
    with trio.fail_after(60):
        async with open_fleet(
            str(tmp_path), node_yaml=node_yaml(escape_task=True), nodes=1, workers=0
        ) as fleet:
            result = await run_schedule(fleet, 1, schedule)
    assert result.records.node_jobs[0].state == "done"
    assert result.ok, [str(v) for v in result.violations]


def test_two_plays_of_a_seed_never_share_a_node_job_id() -> None:
    """Issue 25: the sweep promise is checked by a scan of the whole host for the jobs' ids;
    an id made of the seed and the step alone (``s7-n1``) is carried as well by the job of
    another run of seed 7 on the same machine. Each play's ids are its own."""
    from fleet_trio.sim.chaos.runner import _Play

    one, two = (_Play(None, 7, print) for _ in range(2))  # type: ignore[arg-type]
    assert one.node_job_id("n1") != two.node_job_id("n1")
    assert one.node_job_id("n1").startswith("s7-") and one.node_job_id("n1").endswith("-n1")
