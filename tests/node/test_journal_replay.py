"""A Hypothesis state machine over the job table and its journal: after any prefix of
operations, replaying the journal into a fresh table (a restart) yields the same visible
states, except that ``accepted``/``running`` jobs read ``error: "interrupted"``.

The operations follow the store's protocol (``fleet_trio.node.jobs.JobStore``): an ack is
written, then confirmed; a start is written, then shown; an outcome is claimed, written, then
published; the drain claims every in-flight job, writes the interruptions, then publishes
them; the janitor evicts and writes the evictions. The journal is a real SQLite file (WAL).
"""

from __future__ import annotations

import json
import shutil
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fleet_trio.node.jobs import INTERRUPTED, Done, Failed, JobState, JobTable, finish_record
from fleet_trio.node.journal import Accept, Evict, Journal, Start
from fleet_trio.node.recovery import replay

IDS = st.sampled_from(["a", "b", "c", "d", "e/f", "ü"])
TTL = 50.0


class JournalReplayMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="journal-replay-")
        # inline_max 16: a result may be kept inline or in a file
        self.journal = Journal(f"{self.dir}/j.sqlite", inline_max=16)
        self.journal.open()
        self.table = JobTable(ttl=TTL)
        self.now = 1000.0

    def teardown(self) -> None:
        self.journal.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(job_id=IDS)
    def register(self, job_id: str) -> None:
        if self.table.register(job_id, recorded=False).created:
            self.journal.apply([Accept(job_id, self.now)])
            self.table.confirm(job_id)

    @rule(job_id=IDS)
    def start(self, job_id: str) -> None:
        if job_id in self.table:
            self.journal.apply([Start(job_id)])
            self.table.start(job_id)

    # a done job's data is its result, a JSON object's text (outcome_of checks it is one)
    @rule(
        job_id=IDS,
        data=st.text(max_size=12).map(lambda t: json.dumps({"v": t}).encode()),
        fail=st.text(max_size=5),
        ok=st.booleans(),
    )
    def finish(self, job_id: str, data: bytes, fail: str, ok: bool) -> None:
        outcome = Done(data) if ok else Failed(fail)
        if not self.table.claim(job_id):
            return
        big = ok and len(data) > self.journal.inline_max
        data_file = self.journal.result_file(job_id) if big else None
        self.journal.apply([finish_record(job_id, outcome, self.now, data_file=data_file)])
        self.table.publish(job_id, outcome, self.now, data_file=data_file)

    @precondition(lambda self: not self.table.draining)
    @rule()
    def drain(self) -> None:
        self.table.begin_drain()
        marked = self.table.claim_in_flight()
        interrupted = Failed(INTERRUPTED)
        self.journal.apply([finish_record(j, interrupted, self.now) for j in marked])
        for job_id in marked:
            self.table.publish(job_id, interrupted, self.now)

    @rule(seconds=st.floats(0, 40))
    def tick(self, seconds: float) -> None:
        self.now += seconds

    @rule()
    def janitor(self) -> None:
        removed = self.table.evict(self.table.expired(self.now))
        if removed:
            self.journal.apply([Evict(v.job_id, v.data_file) for v in removed])

    @invariant()
    def replay_shows_the_same_states(self) -> None:
        copy = Journal(":memory:")
        copy.open()
        self.journal.db.backup(copy.db)
        copy.results_dir = self.journal.results_dir  # the restarted node reads the same files
        restarted = JobTable(ttl=TTL)
        replay(restarted, copy, self.now, self.now)
        # the restart forgets exactly what the TTL allows, and nothing else
        expected_ids = {
            job_id
            for job_id in self.table.ids()
            if (view := self.table.get(job_id)) is not None
            and not (view.terminal_at is not None and view.terminal_at < self.now - TTL)
        }
        restored_ids = {j for j in restarted.ids() if restarted.get(j) is not None}
        assert restored_ids == expected_ids
        for job_id in expected_ids:
            before = self.table.get(job_id)
            after = restarted.get(job_id)
            assert before is not None and after is not None
            if before.state.terminal:
                assert (after.state, after.error) == (before.state, before.error)
                assert after.terminal_at == before.terminal_at
                if before.data_file is not None:
                    assert after.data_file == before.data_file and after.data is None
                    with open(after.data_file, "rb") as f:
                        assert before.state is JobState.DONE and f.read()
                else:
                    assert after.data == before.data
            else:
                assert after.state is JobState.ERROR and after.error == INTERRUPTED
        copy.close()


JournalReplayMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None
)
test_journal_replay = JournalReplayMachine.TestCase


@given(
    st.lists(
        st.tuples(st.sampled_from(["accept", "start", "done", "evict"]), st.integers(0, 30)),
        max_size=300,
    )
)
@settings(max_examples=40, deadline=None)
def test_a_batch_in_runs_writes_what_one_record_at_a_time_writes(
    ops: list[tuple[str, int]],
) -> None:
    """``Journal.apply`` writes runs of acks, starts and evictions as multi-row statements (a
    busy event loop makes every statement's GIL retake slow); the rows are those that one
    statement per record writes, whatever the mix, duplicates and chunk boundaries."""
    from fleet_trio.node.journal import Accept, Evict, Finish, Journal, Start

    records = []
    for kind, n in ops:
        job_id = f"j{n}"
        if kind == "accept":
            records.append(Accept(job_id, float(len(records)), f"/w/{n}"))
        elif kind == "start":
            records.append(Start(job_id))
        elif kind == "done":
            records.append(Finish(job_id, "done", float(len(records)), data=b"1"))
        else:
            records.append(Evict(job_id))
    batched, single = Journal(":memory:"), Journal(":memory:")
    batched.open()
    single.open()
    batched.apply(records)
    for rec in records:
        single.apply([rec])
    assert batched.load() == single.load()
