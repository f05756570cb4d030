"""ShutdownState: the sans-IO phase bookkeeping, driven by a Hypothesis state machine."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from fleet_trio.nursery import Phase, PhaseError, RequestOutcome, ShutdownState


class ShutdownStateMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = ShutdownState()
        self.seen_phase = Phase.RUNNING
        self.was_escalated = False
        self.model_live = 0

    def _illegal(self, action: str) -> None:
        """An illegal transition raises PhaseError and changes nothing."""
        before = (self.state.phase, self.state.live, self.state.escalated, self.state.requests)
        with pytest.raises(PhaseError):
            getattr(self.state, action)()
        after = (self.state.phase, self.state.live, self.state.escalated, self.state.requests)
        assert before == after

    @rule()
    def request(self) -> None:
        phase = self.state.phase
        escalated = self.state.escalated
        outcome = self.state.request()
        if phase == Phase.RUNNING:
            assert outcome is RequestOutcome.STARTED
            assert self.state.phase == Phase.STOPPING
        elif phase in (Phase.STOPPING, Phase.DRAINING) and not escalated:
            assert outcome is RequestOutcome.ESCALATED
            assert self.state.escalated
            assert self.state.drain_over
        else:
            assert outcome is RequestOutcome.REPEATED
            assert self.state.phase == phase

    @rule()
    def begin_stop(self) -> None:
        phase = self.state.phase
        moved = self.state.begin_stop()
        assert moved == (phase == Phase.RUNNING)
        assert self.state.stopping

    def _move(self, action: str, legal: bool, to: Phase) -> None:
        """A legal ``action`` moves the state to phase ``to``; an illegal one is refused."""
        if legal:
            getattr(self.state, action)()
            assert self.state.phase == to
        else:
            self._illegal(action)

    @rule()
    def begin_drain(self) -> None:
        self._move("begin_drain", self.state.phase == Phase.STOPPING, Phase.DRAINING)

    @rule()
    def begin_interrupt(self) -> None:
        legal = self.state.phase in (Phase.STOPPING, Phase.DRAINING)
        self._move("begin_interrupt", legal, Phase.INTERRUPTING)

    @rule()
    def begin_cancel(self) -> None:
        legal = self.state.phase < Phase.CANCELLING
        self._move("begin_cancel", legal, Phase.CANCELLING)
        if legal:
            assert not self.state.accepting_jobs

    @rule()
    def finish(self) -> None:
        legal = self.state.phase == Phase.CANCELLING and self.state.live == 0
        self._move("finish", legal, Phase.DONE)

    @rule(n=st.integers(min_value=1, max_value=3))
    def job_started(self, n: int) -> None:
        for _ in range(n):
            if self.state.phase < Phase.CANCELLING:
                self.state.job_started()
                self.model_live += 1
            else:
                self._illegal("job_started")

    @rule()
    def job_finished(self) -> None:
        if self.model_live > 0:
            self.state.job_finished()
            self.model_live -= 1
        else:
            self._illegal("job_finished")

    @invariant()
    def phase_never_moves_backwards(self) -> None:
        assert self.state.phase >= self.seen_phase
        self.seen_phase = self.state.phase

    @invariant()
    def live_count_is_exact_and_never_negative(self) -> None:
        assert self.state.live == self.model_live >= 0

    @invariant()
    def escalation_is_sticky_and_only_after_stopping(self) -> None:
        if self.was_escalated:
            assert self.state.escalated
        if self.state.escalated:
            assert self.state.phase >= Phase.STOPPING
            assert self.state.requests >= 1
        self.was_escalated = self.state.escalated

    @invariant()
    def a_request_means_stopping(self) -> None:
        if self.state.requests >= 1:
            assert self.state.stopping

    @invariant()
    def done_means_no_live_job(self) -> None:
        if self.state.phase == Phase.DONE:
            assert self.state.live == 0

    @invariant()
    def flags_follow_the_phase(self) -> None:
        assert self.state.stopping == (self.state.phase >= Phase.STOPPING)
        assert self.state.accepting_jobs == (self.state.phase < Phase.CANCELLING)
        assert self.state.drain_over == (self.state.live == 0 or self.state.escalated)


ShutdownStateMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None
)
TestShutdownState = ShutdownStateMachine.TestCase


def test_full_happy_sequence() -> None:
    state = ShutdownState()
    state.job_started()
    assert state.request() is RequestOutcome.STARTED
    state.begin_drain()
    assert not state.drain_over
    assert state.request() is RequestOutcome.ESCALATED
    assert state.drain_over
    assert state.request() is RequestOutcome.REPEATED
    state.begin_interrupt()
    state.begin_cancel()
    with pytest.raises(PhaseError):
        state.finish()  # a job is still live
    state.job_finished()
    state.finish()
    assert state.phase == Phase.DONE
    with pytest.raises(PhaseError):
        state.begin_drain()


def test_a_request_after_the_body_ended_on_its_own_escalates() -> None:
    state = ShutdownState()
    assert state.begin_stop()
    state.begin_drain()
    assert state.request() is RequestOutcome.ESCALATED
