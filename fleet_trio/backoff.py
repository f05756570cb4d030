"""The one backoff of every retry loop: a capped sequence of delays, the last one repeating.

Worker registration (``register_backoff``: 1, 2, 4, 8, 16, 30, 60 s) and controller reports
(``report_backoff``: 0.2 → 1.6 s) walk their configured sequences; ``fleet-trio tail``'s
reconnect (0.5 → 8 s) and the supervisor's escape poll (0.02 → 1 s) are :meth:`Backoff.exponential`.
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
