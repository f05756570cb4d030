"""The max-runtime / idle watchdog as a sans-IO check (worker-process.md §7)."""

from __future__ import annotations

import attrs

from fleet_trio.durations import go_duration_seconds

WATCHDOG_TICK = 0.1
"""Seconds between two watchdog checks."""


@attrs.frozen
class Watchdog:
    """Decides, from times passed in, whether a limit has tripped.

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


__all__ = ["WATCHDOG_TICK", "Watchdog"]
