"""The one backoff of every retry loop: a capped sequence of delays, the last one repeating.

A :class:`Backoff` is a plain value; a loop asks it for the delay before retry ``n``
(0-based) with :meth:`Backoff.delay`. The sequences in use:

- worker registration at startup (``register_backoff``): 1, 2, 4, 8, 16, 30, 60 s, then 60 s;
- controller reports, log chunks and fault reports (``report_backoff``): 0.2, 0.4, 0.8,
  1.6 s, then 1.6 s;
- ``fleet-trio tail`` reconnecting: 0.5, 1, 2, 4, 8 s, then 8 s
  (:meth:`Backoff.exponential`);
- the supervisor's check of a group whose pipes an escaped process holds: 0.02 s doubling to
  1 s.

The worker's two sequences are configurable timings (tuples); an exponential one is the same
thing written as a rule.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import attrs


def _steps(values: Iterable[float]) -> tuple[float, ...]:
    steps = tuple(float(v) for v in values)
    for v in steps:
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"a backoff delay must be a finite number >= 0, got {v!r}")
    return steps


@attrs.frozen
class Backoff:
    """Delays before retry 0, 1, 2, …: ``steps[n]``, and the last step once past the end
    (``empty`` when there are no steps)."""

    steps: tuple[float, ...] = attrs.field(converter=_steps)
    empty: float = 0.0
    """The delay when ``steps`` is empty."""

    @classmethod
    def exponential(cls, first: float, cap: float, factor: float = 2.0) -> Backoff:
        """``first``, ``first * factor``, … while below ``cap``, then ``cap``."""
        if not (first > 0 and cap >= first and factor > 1):
            raise ValueError(f"want 0 < first <= cap and factor > 1, got {first}, {cap}, {factor}")
        steps = []
        value = first
        while value < cap:
            steps.append(value)
            value *= factor
        return cls((*steps, cap))

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry ``retry`` (0 = the first retry)."""
        if not self.steps:
            return self.empty
        return self.steps[min(max(retry, 0), len(self.steps) - 1)]


__all__ = ["Backoff"]
