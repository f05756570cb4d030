"""The sans-IO job table: unit tests and a Hypothesis state machine (design.md §4)."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fleet_trio.node.jobs import (
    DEFERRED,
    INTERRUPTED,
    Done,
    Failed,
    JobState,
    JobTable,
    Registration,
)

IDS = st.sampled_from(["a", "b", "c", "d", "e"])


def test_failed_with_empty_message_reads_deferred() -> None:
    t = JobTable()
    assert t.register("x") is Registration.CREATED
    t.finish("x", Failed(""), 1.0)
    view = t.get("x")
    assert view is not None and view.state is JobState.ERROR and view.error == DEFERRED


def test_draining_refuses_even_new_ids() -> None:
    t = JobTable()
    t.begin_drain()
    assert t.register("new") is Registration.DRAINING
    assert t.get("new") is None


def test_sweep_boundary_is_strict() -> None:
    t = JobTable(ttl=10.0)
    t.register("x")
    t.finish("x", Done(b"{}"), 100.0)
    assert t.sweep(110.0) == []  # terminal_at == now - ttl: kept
    assert t.sweep(110.000001) == ["x"]


class JobTableMachine(RuleBasedStateMachine):
    """Every acked job reaches exactly one terminal state; terminal never changes; a duplicate
    never starts a second run; queue depth = accepted + running."""

    def __init__(self) -> None:
        super().__init__()
        self.table = JobTable(ttl=100.0)
        self.now = 0.0
        self.acked: set[str] = set()
        self.runs: dict[str, int] = {}
        self.terminal: dict[str, tuple[JobState, bytes | None, str | None]] = {}
        self.evicted: set[str] = set()

    @rule(job_id=IDS)
    def register(self, job_id: str) -> None:
        before = self.table.get(job_id)
        outcome = self.table.register(job_id)
        if self.table.draining:
            assert outcome is Registration.DRAINING
        elif before is not None:
            assert outcome is Registration.EXISTS
        else:
            assert outcome is Registration.CREATED
        if outcome.created:
            # A re-registration after eviction is a new run (the documented TTL limit).
            self.acked.add(job_id)
            self.runs[job_id] = self.runs.get(job_id, 0) + 1
            self.terminal.pop(job_id, None)
            self.evicted.discard(job_id)

    @rule(job_id=IDS)
    def start(self, job_id: str) -> None:
        before = self.table.get(job_id)
        moved = self.table.start(job_id)
        assert moved == (before is not None and before.state is JobState.ACCEPTED)

    @rule(job_id=IDS)
    def withdraw(self, job_id: str) -> None:
        """An ack whose 202 never reached its client: only an ``accepted`` entry goes (never
        a running, finished or drain-marked one), and its id is unknown again."""
        before = self.table.get(job_id)
        depth = self.table.queue_depth
        withdrawn = self.table.withdraw(job_id)
        # (no rule here claims without publishing: an accepted entry is never claimed)
        may = before is not None and before.state is JobState.ACCEPTED
        if withdrawn:
            assert before is not None and before.state is JobState.ACCEPTED
            assert job_id not in self.table and self.table.queue_depth == depth - 1
            self.acked.discard(job_id)  # never acked after all: a re-dispatch is a new job
            self.runs[job_id] -= 1
        else:
            assert not may  # refused only when it is not withdrawable
            assert self.table.get(job_id) == before

    @rule(job_id=IDS, data=st.binary(max_size=8))
    def succeed(self, job_id: str, data: bytes) -> None:
        self.table.finish(job_id, Done(data), self.now)

    @rule(job_id=IDS, message=st.text(max_size=5))
    def fail(self, job_id: str, message: str) -> None:
        self.table.finish(job_id, Failed(message), self.now)

    @rule(dt=st.floats(min_value=0, max_value=60))
    def tick(self, dt: float) -> None:
        self.now += dt

    @rule()
    def sweep(self) -> None:
        in_flight = set(self.table.in_flight_ids())
        evicted = self.table.sweep(self.now)
        assert not in_flight & set(evicted)
        self.evicted.update(evicted)
        for job_id in evicted:
            self.terminal.pop(job_id, None)

    @precondition(lambda self: not self.table.draining)
    @rule()
    def drain(self) -> None:
        self.table.begin_drain()

    @precondition(lambda self: self.table.draining)
    @rule()
    def interrupt(self) -> None:
        marked = self.table.mark_interrupted(self.now)
        for job_id in marked:
            view = self.table.get(job_id)
            assert view is not None and view.error == INTERRUPTED
        assert self.table.queue_depth == 0

    @invariant()
    def terminal_never_changes(self) -> None:
        for job_id in self.table.ids():
            view = self.table.get(job_id)
            assert view is not None
            if view.state.terminal:
                snap = (view.state, view.data, view.error)
                assert self.terminal.setdefault(job_id, snap) == snap
                assert view.terminal_at is not None
                if view.state is JobState.DONE:
                    assert view.error is None
                else:
                    assert view.data is None and view.error

    @invariant()
    def queue_depth_counts_in_flight(self) -> None:
        states = [self.table.get(i) for i in self.table.ids()]
        live = sum(1 for v in states if v is not None and not v.state.terminal)
        assert self.table.queue_depth == live

    @invariant()
    def every_acked_job_is_known_or_evicted_after_terminal(self) -> None:
        for job_id in self.acked:
            assert job_id in self.table or job_id in self.evicted
        for job_id, n in self.runs.items():
            # A second run of an id happens only after it was evicted.
            assert n <= 1 or job_id in self.table or job_id in self.evicted

    def teardown(self) -> None:
        # Drain to the end: every acked job present reaches exactly one terminal state.
        self.table.begin_drain()
        self.table.mark_interrupted(self.now)
        for job_id in self.table.ids():
            view = self.table.get(job_id)
            assert view is not None and view.state.terminal


TestJobTableMachine = JobTableMachine.TestCase
TestJobTableMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
