"""The journal's protocol on the sans-IO table (a Hypothesis state machine): an ack reserved
but not recorded is invisible; a claimed outcome is the only one that can ever be published;
``finish`` and ``start`` after a claim change nothing; queue depth counts every in-flight entry,
recorded or not."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from fleet_trio.node.jobs import INTERRUPTED, Done, Failed, JobState, JobTable, Outcome

IDS = st.sampled_from(["a", "b", "c", "d"])
OUTCOMES = st.one_of(st.builds(Done, st.binary(max_size=4)), st.builds(Failed, st.text(max_size=3)))


class ClaimMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.table = JobTable(ttl=1e9)
        self.now = 0.0
        self.claims: dict[str, Outcome] = {}
        """The outcome each claimed id will publish (what the store writes to the journal)."""

    @rule(job_id=IDS, recorded=st.booleans())
    def register(self, job_id: str, recorded: bool) -> None:
        if self.table.register(job_id, recorded=recorded).created:
            self.claims.pop(job_id, None)
            assert (self.table.get(job_id) is None) == (not recorded)

    @rule(job_id=IDS)
    def confirm(self, job_id: str) -> None:
        self.table.confirm(job_id)

    @rule(job_id=IDS)
    def forget(self, job_id: str) -> None:
        pending = self.table.pending(job_id)
        assert self.table.forget(job_id) == pending
        if pending:
            assert job_id not in self.table
            self.claims.pop(job_id, None)

    @rule(job_id=IDS)
    def start(self, job_id: str) -> None:
        claimed = job_id in self.claims
        before = self.table.get(job_id)
        moved = self.table.start(job_id)
        if claimed:
            assert not moved
        elif before is not None and before.state is JobState.ACCEPTED:
            assert moved

    @rule(job_id=IDS, outcome=OUTCOMES)
    def claim(self, job_id: str, outcome: Outcome) -> None:
        if self.table.claim(job_id):
            assert job_id not in self.claims
            self.claims[job_id] = outcome

    @rule(job_id=IDS)
    def publish(self, job_id: str) -> None:
        if job_id in self.claims and job_id in self.table:
            self.table.publish(job_id, self.claims[job_id], self.now)

    @rule(job_id=IDS, outcome=OUTCOMES)
    def late_finish(self, job_id: str, outcome: Outcome) -> None:
        if job_id in self.claims:
            assert not self.table.finish(job_id, outcome, self.now)

    @rule()
    def drain(self) -> None:
        self.table.begin_drain()
        for job_id in self.table.claim_in_flight():
            assert job_id not in self.claims
            self.claims[job_id] = Failed(INTERRUPTED)

    @rule()
    def tick(self) -> None:
        self.now += 1.0

    @invariant()
    def published_is_what_was_claimed(self) -> None:
        for job_id in self.table.ids():
            view = self.table.get(job_id)
            if view is None:
                assert self.table.pending(job_id)
                continue
            if view.state.terminal:
                outcome = self.claims[job_id]
                if isinstance(outcome, Done):
                    assert view.state is JobState.DONE and view.data == outcome.data
                else:
                    assert view.error == (outcome.message or "deferred")

    @invariant()
    def queue_depth_counts_every_in_flight_entry(self) -> None:
        assert self.table.queue_depth == len(self.table.in_flight_ids())


ClaimMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
test_claims = ClaimMachine.TestCase
