"""A run of failures of one recurring request, told in a few lines instead of one per try.

A controller that is gone makes the worker's heartbeat (every ``heartbeat_interval``), its
long poll (every 2 s) and its startup registration (1, 2, 4 … 60 s) fail over and over.
One line per failure buries the one line an operator needs (docs/worker.md "Logs while the
controller is unreachable"). Two sans-IO policies, fed the time and the error:

* :class:`FailureRun` (heartbeats, polls): the first failure at once, then at most one line
  per ``every`` seconds with the count since the last line, and one line when the request
  works again.
* :class:`RegistrationRun` (the startup registration): the first failure at once; after
  ``hint_after`` failures, one line that says what was tried and what to check; then a
  reminder with the count at ``hint_after`` × 2, × 4, × 8 … failures (a backoff on the line
  itself, on top of the retry's).
"""

from __future__ import annotations

import attrs

OUTAGE_LINE_EVERY = 60.0
"""Seconds between two lines of one run of heartbeat or poll failures."""


def _seconds(span: float) -> str:
    span = max(0.0, span)
    if span < 120:
        return f"{span:.0f}s"
    return f"{span / 60:.0f}m"


@attrs.define
class FailureRun:
    """Lines (or ``None``: nothing to log) for consecutive failures of ``what``."""

    what: str
    every: float = OUTAGE_LINE_EVERY
    """Seconds between two lines of one run (after the first)."""
    failures: int = 0
    """Failures in the current run (0: the last try worked)."""
    total: int = 0
    """Failures ever seen."""
    _since: float = 0.0
    _next_line: float = 0.0
    _quiet: int = 0
    """Failures since the last line."""

    def failed(self, now: float, error: str) -> str | None:
        self.total += 1
        self.failures += 1
        if self.failures == 1:
            self._since, self._next_line, self._quiet = now, now + self.every, 0
            return f"{self.what} failed: {error}"
        self._quiet += 1
        if now < self._next_line:
            return None
        line = (
            f"{self.what} failed {self._quiet} more time{'s' if self._quiet != 1 else ''} "
            f"({self.failures} in a row over {_seconds(now - self._since)}); last: {error}"
        )
        self._next_line, self._quiet = now + self.every, 0
        return line

    def succeeded(self, now: float) -> str | None:
        """A line when a run of failures just ended (``None`` when there was none)."""
        if not self.failures:
            return None
        n, self.failures = self.failures, 0
        return (
            f"{self.what} works again after {n} failure{'s' if n != 1 else ''} over "
            f"{_seconds(now - self._since)}"
        )


def registration_hint(url: str, status: int | None, config_path: str) -> str:
    """What to check when registering with ``url`` keeps failing with ``status`` (``None``:
    no answer at all)."""
    where = config_path or "the worker's config"
    if status in (401, 403):
        return (
            f"the controller refuses this worker's token: check token: in {where} (or "
            "$RC_TOKEN) against the controller's worker token"
        )
    if status is None:
        return (
            f"nothing answered there: check that the rc controller is running and that "
            f"controller_url in {where} names it as this host reaches it (host, port, "
            "http/https; a firewall or proxy in between)"
        )
    return (
        f"the controller answers with an error (HTTP {status}): check the controller's log, "
        f"and that controller_url in {where} names an rc controller"
    )


@attrs.define
class RegistrationRun:
    """Lines for the startup registration's failures (see the module docstring)."""

    url: str
    """What was tried: the full registration URL."""
    config_path: str = ""
    hint_after: int = 3
    failures: int = 0
    _since: float = 0.0
    _next_reminder: int = 0

    def failed(self, now: float, error: str, status: int | None, delay: float) -> str | None:
        self.failures += 1
        n = self.failures
        if n == 1:
            self._since = now
            self._next_reminder = 2 * self.hint_after
        span = _seconds(now - self._since)
        if n == 1 and n != self.hint_after:
            return f"registration with {self.url} failed ({error}); retrying in {delay:g}s"
        if n == self.hint_after:
            hint = registration_hint(self.url, status, self.config_path)
            return (
                f"cannot register: POST {self.url} failed {n} times in {span} (last: {error}); "
                f"{hint}. Still retrying (the next such line after {self._next_reminder} "
                "failures)"
            )
        if n >= self.hint_after and n == self._next_reminder:
            self._next_reminder *= 2
            return (
                f"still cannot register: POST {self.url} failed {n} times in {span} "
                f"(last: {error}); retrying in {delay:g}s"
            )
        return None


__all__ = ["OUTAGE_LINE_EVERY", "FailureRun", "RegistrationRun", "registration_hint"]
