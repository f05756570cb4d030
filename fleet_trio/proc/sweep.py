"""The RC_JOB_ID sweep (worker-process.md §3).

A job's processes that left its process group and session (``setsid``, double fork, a daemon)
are found by the exact ``RC_JOB_ID`` value they inherited, and killed: SIGTERM for up to
``SWEEP_GRACE`` while re-scanning every ``SWEEP_POLL``, then SIGKILL for up to
``SWEEP_KILL_BOUND``. The worker's own pid and its ancestors are never signalled. The result is a
:class:`SweepReport` — a report only: it never changes a job's ``Result`` fields (§12 L2).

Shape: :class:`SweepBook` is the bookkeeping (phases, signalled sets, found/remaining, passes)
as a plain synchronous class with no I/O and no clock of its own; :func:`sweep_job_survivors`
is the trio shell that runs the scans in a worker thread, sends the signals and sleeps.

Beyond rc (deliberate, changes no checklist item):

* A single ``/proc`` snapshot misses a process forked after the listing. Each scan
  (:func:`~fleet_trio.proc.procfs.scan_job_marker`) therefore *settles*: after reading every
  listed pid it lists ``/proc`` again and reads the pids it had not seen, until a listing brings
  nothing new (skipped when nothing read was doubtful and no pid was allocated during the walk).
  A discovery scan that could not settle is repeated.
* An environ read empty (a process caught inside ``execve`` reads empty for a moment) is read
  once more before the scan ends; rc would have missed such a process.
* After the phases have emptied the box, one confirmation pass is made; if it finds new matches
  the phases run again. At most ``SWEEP_MAX_PASSES`` discovery passes (initial, repeats,
  confirmations) run. Pids first discovered by a later pass are added to ``found`` (rc's
  ``found`` is the initial scan only; without this a report could say ``found=[]`` for a sweep
  that killed something). Pids first seen *during* a phase are signalled but, as in rc, not
  added to ``found``.
* "Could not look" is never turned into "found nothing": a phase scan that failed keeps the
  last known pids (rc would report them as gone), and a later pass that cannot list ``/proc``,
  or scans that never settle within the pass bound, set ``blind`` so the report is not
  ``clean()``.
* The common case (nothing matches) is one scan: one ``environ`` read per process (plus a
  second listing of ``/proc`` when the walk saw anything doubtful).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import os
import signal
from collections.abc import Callable, Iterable

import attrs
import trio

from fleet_trio.proc.procfs import MarkerScan, ancestor_set, scan_job_marker
from fleet_trio.proc.spec import SweepReport

log = logging.getLogger(__name__)

SWEEP_GRACE = 2.0
"""Seconds of the SIGTERM phase (``sweepGrace``)."""
SWEEP_POLL = 0.02
"""Seconds between re-scans inside a phase (``sweepPoll``)."""
SWEEP_KILL_BOUND = 2.0
"""Seconds of the SIGKILL phase (= the straggler wait)."""
SWEEP_MAX_PASSES = 4
"""Discovery passes (the initial scan plus re-scans and confirmation passes) per sweep."""

MarkerScanFn = Callable[[str, frozenset[int]], MarkerScan]
"""``scan(job_id, protected) -> MarkerScan`` (a blocking full ``/proc`` walk)."""
KillFn = Callable[[int, signal.Signals], None]
"""``kill(pid, sig)``; may raise ``ProcessLookupError``/``PermissionError`` (ignored)."""


class Mode(enum.Enum):
    DISCOVER = "discover"
    TERM = "term"
    KILL = "kill"
    DONE = "done"


@attrs.frozen
class Step:
    """What the shell does after feeding a scan: send ``sig`` to ``pids``, then maybe sleep."""

    sig: signal.Signals | None = None
    pids: tuple[int, ...] = ()
    sleep: bool = False


class SweepBook:
    """The sweep's bookkeeping, without I/O. Feed it scans in order; it says what to do next.

    Discovery pass (initial scan, re-scan, confirmation pass):

    * not scanned → first pass: done, ``scanned=False``; later pass: done, ``blind`` (could not
      confirm, so the report claims nothing).
    * matches → add the ones not yet in ``found``; start the SIGTERM phase (deadline = now +
      ``term_bound``); the next scan follows at once.
    * no match, not settled (a fork raced the walk) → another pass if the bound allows, else
      done and ``blind`` (the look was incomplete: no claim of a clean box).
    * no match, settled → done.

    Phase scan (SIGTERM, then SIGKILL): scanned, settled and empty → the phase is over,
    ``remaining`` is empty and a confirmation pass follows if the bound allows. Otherwise
    signal every match not yet signalled in this phase; once the deadline has passed, the
    SIGTERM phase hands the last known pids to the SIGKILL phase and the SIGKILL phase ends the
    sweep with them as ``remaining``. A scan that failed, or found nothing without settling,
    proves nothing: the last known pids stand.
    """

    def __init__(
        self,
        protected: Iterable[int] = (),
        *,
        max_passes: int = SWEEP_MAX_PASSES,
        term_bound: float = SWEEP_GRACE,
        kill_bound: float = SWEEP_KILL_BOUND,
    ) -> None:
        if max_passes < 1:
            raise ValueError("max_passes must be at least 1")
        self.protected = frozenset(protected)
        self.max_passes = max_passes
        self.term_bound = term_bound
        self.kill_bound = kill_bound
        self.mode = Mode.DISCOVER
        self.passes = 0
        """Discovery passes fed so far (≤ ``max_passes``)."""
        self.phases = 0
        """Phases started so far (a SIGTERM and a SIGKILL phase count one each)."""
        self.scanned = False
        self.blind = False
        self.found: list[int] = []
        self.remaining: tuple[int, ...] = ()
        self.signalled: set[int] = set()
        """Pids signalled in the current phase."""
        self.last: tuple[int, ...] = ()
        """The last known matches inside a phase."""
        self.deadline = 0.0

    @property
    def done(self) -> bool:
        return self.mode is Mode.DONE

    def report(self) -> SweepReport:
        return SweepReport(
            scanned=self.scanned,
            found=tuple(self.found),
            remaining=self.remaining,
            blind=self.blind,
        )

    def feed(self, scan: MarkerScan, now: float) -> Step:
        """Record one scan taken at ``now`` and say what to do."""
        if self.mode is Mode.DONE:
            raise RuntimeError("the sweep is over")
        matches = tuple(pid for pid in scan.pids if pid not in self.protected)
        if self.mode is Mode.DISCOVER:
            return self._discover(scan, matches, now)
        return self._phase(scan, matches, now)

    def _discover(self, scan: MarkerScan, matches: tuple[int, ...], now: float) -> Step:
        self.passes += 1
        if not scan.scanned:
            if self.passes > 1:
                self.blind = True
            self.mode = Mode.DONE
            return Step()
        self.scanned = True
        self.blind = self.blind or scan.blind
        if matches:
            known = set(self.found)
            self.found.extend(pid for pid in matches if pid not in known)
            self._start_phase(Mode.TERM, matches, now + self.term_bound)
            return Step()
        if scan.settled:
            self.mode = Mode.DONE
        elif self.passes >= self.max_passes:
            self.blind = True
            self.mode = Mode.DONE
        return Step()

    def _start_phase(self, mode: Mode, last: tuple[int, ...], deadline: float) -> None:
        self.mode = mode
        self.phases += 1
        self.last = last
        self.signalled = set()
        self.deadline = deadline

    def _phase(self, scan: MarkerScan, matches: tuple[int, ...], now: float) -> Step:
        if scan.scanned:
            self.blind = self.blind or scan.blind
            if not matches and scan.settled:
                self.remaining = ()
                self.last = ()
                self.signalled = set()
                self.mode = Mode.DISCOVER if self.passes < self.max_passes else Mode.DONE
                return Step()
            if matches:
                self.last = matches
        sig = signal.SIGTERM if self.mode is Mode.TERM else signal.SIGKILL
        fresh = tuple(pid for pid in matches if pid not in self.signalled)
        self.signalled.update(fresh)
        if now < self.deadline:
            return Step(sig=sig, pids=fresh, sleep=True)
        if self.mode is Mode.TERM:
            self._start_phase(Mode.KILL, self.last, now + self.kill_bound)
        else:
            self.remaining = self.last
            self.mode = Mode.DONE
        return Step(sig=sig, pids=fresh, sleep=False)


def _kill(pid: int, sig: signal.Signals) -> None:
    os.kill(pid, sig)


def _send(kill: KillFn, pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        kill(pid, sig)


async def sweep_job_survivors(
    job_id: str,
    self_pid: int,
    *,
    limiter: trio.CapacityLimiter | None = None,
    grace: float | None = None,
    poll: float | None = None,
    kill_bound: float | None = None,
    max_passes: int | None = None,
    scan: MarkerScanFn | None = None,
    kill: KillFn | None = None,
    marker: str = "RC_JOB_ID",
) -> SweepReport:
    """Find and kill live processes whose ``RC_JOB_ID`` equals ``job_id`` (§3.3); ``marker``
    names another variable (the node's ``FLEET_JOB_ID``).

    ``job_id == ""`` sweeps nothing (``scanned=False``). ``self_pid`` and its ancestors are never
    signalled. Every full ``/proc`` walk runs in ``trio.to_thread.run_sync(..., limiter=limiter)``.
    The timing parameters default to the module constants (read at call time, so tests may
    patch them); ``scan`` and ``kill`` replace the ``/proc`` walk and ``os.kill`` in tests.
    """
    if not job_id:
        return SweepReport()
    grace = SWEEP_GRACE if grace is None else grace
    poll = SWEEP_POLL if poll is None else poll
    kill_bound = SWEEP_KILL_BOUND if kill_bound is None else kill_bound
    max_passes = SWEEP_MAX_PASSES if max_passes is None else max_passes
    key = f"{marker}=".encode()
    scan_fn: MarkerScanFn = (
        functools.partial(scan_job_marker, key=key) if scan is None else scan
    )
    kill_fn: KillFn = _kill if kill is None else kill

    def first_scan() -> tuple[frozenset[int], MarkerScan]:
        protected = frozenset(ancestor_set(self_pid))
        return protected, scan_fn(job_id, protected)

    protected, result = await trio.to_thread.run_sync(first_scan, limiter=limiter)
    book = SweepBook(protected, max_passes=max_passes, term_bound=grace, kill_bound=kill_bound)
    while True:
        step = book.feed(result, trio.current_time())
        if step.sig is not None:
            for pid in step.pids:
                _send(kill_fn, pid, step.sig)
            if step.pids:
                log.debug("sweep %s: %s sent to %s", job_id, step.sig.name, list(step.pids))
        if book.done:
            break
        if step.sleep:
            await trio.sleep(poll)
        result = await trio.to_thread.run_sync(scan_fn, job_id, protected, limiter=limiter)
    report = book.report()
    if log.isEnabledFor(logging.DEBUG):
        log.debug("sweep %s: %d passes, %s", job_id, book.passes, report.to_json())
    return report


__all__ = [
    "SWEEP_GRACE",
    "SWEEP_KILL_BOUND",
    "SWEEP_MAX_PASSES",
    "SWEEP_POLL",
    "KillFn",
    "MarkerScanFn",
    "Mode",
    "Step",
    "SweepBook",
    "sweep_job_survivors",
]
