"""``fleet_trio.backoff``: the delays each retry loop waits are the ones it always waited."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet_trio.backoff import Backoff
from fleet_trio.cli import TAIL_BACKOFF_MAX
from fleet_trio.proc.supervisor import ESCAPE_POLL_MAX
from fleet_trio.worker.client import Timings
from fleet_trio.worker.worker import WorkerTimings


def test_a_sequence_is_walked_then_its_last_value_repeats() -> None:
    backoff = Backoff((1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 60.0))
    assert [backoff.delay(n) for n in range(9)] == [1, 2, 4, 8, 16, 30, 60, 60, 60]
    assert backoff.delay(-1) == 1.0


def test_the_worker_sequences_are_the_configured_timings() -> None:
    register = Backoff(WorkerTimings().register_backoff)
    assert [register.delay(n) for n in range(8)] == [1, 2, 4, 8, 16, 30, 60, 60]
    report = Backoff(Timings().report_backoff)
    assert [report.delay(n) for n in range(6)] == [0.2, 0.4, 0.8, 1.6, 1.6, 1.6]


def test_an_empty_sequence_waits_its_fallback() -> None:
    assert Backoff(()).delay(3) == 0.0
    assert Backoff((), empty=1.0).delay(0) == 1.0  # worker registration with no steps


def test_the_tail_reconnect_is_the_old_formula() -> None:
    """``fleet-trio tail``: ``min(0.5 * 2 ** (failures - 1), 8)`` before this module."""
    backoff = Backoff.exponential(0.5, TAIL_BACKOFF_MAX)
    for failures in range(1, 40):
        assert backoff.delay(failures - 1) == min(0.5 * 2 ** (failures - 1), TAIL_BACKOFF_MAX)


def test_the_escape_poll_is_the_old_doubling() -> None:
    """The supervisor's pause: 0.02 s, doubled after each check, capped at 1 s."""
    backoff = Backoff.exponential(0.02, ESCAPE_POLL_MAX)
    pause = 0.02
    for n in range(20):
        assert backoff.delay(n) == pause
        pause = min(pause * 2, ESCAPE_POLL_MAX)


@given(
    first=st.floats(0.001, 100.0),
    ratio=st.floats(1.0, 1000.0),
    factor=st.floats(1.1, 10.0),
    retry=st.integers(0, 10_000),
)
def test_exponential_is_capped_and_never_shrinks(
    first: float, ratio: float, factor: float, retry: int
) -> None:
    backoff = Backoff.exponential(first, first * ratio, factor)
    assert first <= backoff.delay(retry) <= first * ratio
    assert backoff.delay(retry) <= backoff.delay(retry + 1)
    assert backoff.delay(10_000) == first * ratio


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0])
def test_a_delay_that_is_not_a_finite_number_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="finite number >= 0"):
        Backoff((0.1, bad))


@pytest.mark.parametrize(("first", "cap", "factor"), [(0, 1, 2), (2, 1, 2), (1, 2, 1), (-1, 1, 2)])
def test_exponential_refuses_a_rule_that_does_not_grow(
    first: float, cap: float, factor: float
) -> None:
    with pytest.raises(ValueError):
        Backoff.exponential(first, cap, factor)
