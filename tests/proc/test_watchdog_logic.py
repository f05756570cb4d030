"""The watchdog and stop-token logic without processes, under the autojump clock."""

from __future__ import annotations

import math

import trio
from hypothesis import given
from hypothesis import strategies as st

from fleet_trio.proc.stop import StopToken
from fleet_trio.proc.watchdog import Watchdog


def seconds(most: float) -> st.SearchStrategy[float]:
    """Times and limits: finite, 0 to ``most`` seconds."""
    return st.floats(min_value=0, max_value=most, allow_nan=False)


LIMIT = seconds(1e5)


def test_watchdog_disarmed_never_trips() -> None:
    dog = Watchdog(started=0.0)
    assert not dog.armed
    assert dog.check(1e9, 0.0) is None


def test_watchdog_checks_max_runtime_before_idle_and_is_strict() -> None:
    dog = Watchdog(started=10.0, max_runtime=0.5, idle_timeout=0.7)
    assert dog.check(10.5, 10.0) is None  # exactly at the limit: not yet
    assert dog.check(10.6, 10.0) == "max_runtime exceeded (500ms)"
    dog = Watchdog(started=10.0, idle_timeout=0.7)
    assert dog.check(10.7, 10.0) is None
    assert dog.check(10.71, 10.0) == "idle: no output for 700ms"
    assert dog.check(100.0, 99.5) is None


@given(max_runtime=LIMIT, idle=LIMIT, elapsed=seconds(2e5), quiet=seconds(2e5))
def test_watchdog_reason_matches_the_first_exceeded_limit(
    max_runtime: float, idle: float, elapsed: float, quiet: float
) -> None:
    last_output = elapsed - min(quiet, elapsed)
    quiet = elapsed - last_output  # what the watchdog computes, rounding included
    dog = Watchdog(started=0.0, max_runtime=max_runtime, idle_timeout=idle)
    reason = dog.check(elapsed, last_output)
    if max_runtime > 0 and elapsed > max_runtime:
        assert reason is not None
        assert reason.startswith("max_runtime exceeded (")
    elif idle > 0 and quiet > idle:
        assert reason is not None
        assert reason.startswith("idle: no output for ")
    else:
        assert reason is None


async def test_stop_token_deadline_and_parent(autojump_clock: trio.testing.MockClock) -> None:
    parent = StopToken()
    budget = StopToken.after(5, parent=parent)
    assert not budget.is_set()
    with trio.fail_after(10):
        await budget.wait()
    assert budget.is_set()
    assert budget.expired()
    assert not budget.was_set
    assert trio.current_time() >= 5

    child = parent.child()
    assert child.deadline == math.inf
    parent.set()
    assert child.is_set()
    assert child.was_set
    late = parent.child()
    assert late.is_set()


async def test_stop_token_child_inherits_the_earlier_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    parent = StopToken.after(1)
    child = StopToken.after(100, parent=parent)
    assert child.deadline == parent.deadline
    with trio.fail_after(2):
        await child.wait()


@given(started=seconds(1e7), max_runtime=LIMIT, idle=LIMIT, quiet_from=LIMIT)
def test_watchdog_deadline_is_the_first_tripping_instant(
    started: float, max_runtime: float, idle: float, quiet_from: float
) -> None:
    """The supervisor's scope deadline: ``check`` trips exactly there, never a float before."""
    dog = Watchdog(started=started, max_runtime=max_runtime, idle_timeout=idle)
    last_output = started + quiet_from
    deadline = dog.deadline(last_output)
    if not dog.armed:
        assert deadline == math.inf
        return
    assert dog.check(deadline, last_output) is not None
    assert dog.check(math.nextafter(deadline, -math.inf), last_output) is None


def test_watchdog_deadline_examples() -> None:
    dog = Watchdog(started=10.0, max_runtime=0.5, idle_timeout=0.7)
    assert dog.deadline(10.0) == math.nextafter(10.5, math.inf)
    assert dog.deadline(9.0) == math.nextafter(9.7, math.inf)  # idle is due first
    assert Watchdog(started=0.0).deadline(0.0) == math.inf
