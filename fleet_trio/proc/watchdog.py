"""The max-runtime / idle limits as a sans-IO decision (worker-process.md §7).

The supervisor does not poll: it waits in a cancel scope whose deadline is
:meth:`Watchdog.deadline`, and asks :meth:`Watchdog.check` for the reason when it is reached.
"""

from __future__ import annotations

import math

import attrs

from fleet_trio.durations import go_duration_seconds

_MAX_STEPS = 64
"""Float steps :meth:`Watchdog.deadline` takes past a limit to reach its first tripping instant."""


@attrs.frozen
class Watchdog:
    """Decides, from times passed in, whether a limit has tripped, and when one will.

    ``started`` is when supervision began; ``max_runtime``/``idle_timeout`` of 0 disable the
    limit. Comparisons are strict and ``max_runtime`` is checked first.
    """

    started: float
    max_runtime: float = 0.0
    idle_timeout: float = 0.0

    @property
    def armed(self) -> bool:
        return self.max_runtime > 0 or self.idle_timeout > 0

    def check(self, now: float, last_output: float) -> str | None:
        """The trip reason at ``now``, or ``None``."""
        if self.max_runtime > 0 and now - self.started > self.max_runtime:
            return f"max_runtime exceeded ({go_duration_seconds(self.max_runtime)})"
        if self.idle_timeout > 0 and now - last_output > self.idle_timeout:
            return f"idle: no output for {go_duration_seconds(self.idle_timeout)}"
        return None

    def deadline(self, last_output: float) -> float:
        """The first instant at which :meth:`check` trips, given no output after
        ``last_output``; ``math.inf`` when disarmed. (Strict limits: the first float *after*
        the limit, found by stepping, so the caller's scope never wakes a moment too soon.)"""
        out = math.inf
        if self.max_runtime > 0:
            out = min(out, _first_over(self.started, self.max_runtime))
        if self.idle_timeout > 0:
            out = min(out, _first_over(last_output, self.idle_timeout))
        return out


def _first_over(since: float, limit: float) -> float:
    """The least float ``t`` with ``t - since > limit`` (within a few steps of the sum)."""
    t = since + limit
    if not math.isfinite(t):
        return t
    for _ in range(_MAX_STEPS):
        if t - since > limit:
            return t
        t = math.nextafter(t, math.inf)
    return t


__all__ = ["Watchdog"]
