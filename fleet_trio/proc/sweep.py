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
  confirmations) run, plus one: a SIGKILL phase is always followed by a confirmation pass, one
  poll later (a child forked, or still inside ``execve``, as its parent was killed is not seen
  by the look that ended the phase). Pids first discovered by a later pass are added to
  ``found`` (rc's ``found`` is the initial scan only; without this a report could say
  ``found=[]`` for a sweep that killed something). Pids first seen *during* a phase are
  signalled but, as in rc, not added to ``found``.
* Honest bookkeeping (issue 13): every process a scan ever matched stays attributed to the job
  until an identity check sees it gone (see :class:`SweepBook`, *Attribution*); one that
  outlives the phases is ``remaining`` and the report is not ``clean()``. rc signals only what
  the latest scan still sees, and reports the rest as gone. Signals go through ``pidfd_open`` +
  a start-time check, so a reused pid is never hit.
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
import signal
from collections.abc import Callable, Collection, Iterable

import attrs
import trio

from fleet_trio.proc.procfs import (
    Ident,
    MarkerScan,
    ancestor_set,
    forks_since_boot,
    idents_alive,
    scan_job_marker,
    signal_ident,
)
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
CheckFn = Callable[[Collection[Ident]], frozenset[Ident] | None]
"""``check(idents) -> alive``: which of ``idents`` are still the same live process (blocking);
``None`` when it could not tell (then nothing counts as gone)."""
SignalFn = Callable[[Ident, signal.Signals], object]
"""``signal(ident, sig)``: send ``sig`` to ``ident`` only if its pid still names that process.
Must not raise for a process that is gone."""


class Mode(enum.Enum):
    DISCOVER = "discover"
    TERM = "term"
    KILL = "kill"
    DONE = "done"


@attrs.frozen
class Step:
    """What the shell does after feeding a scan: send ``sig`` to ``idents``, then maybe sleep."""

    sig: signal.Signals | None = None
    idents: tuple[Ident, ...] = ()
    sleep: bool = False

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(ident.pid for ident in self.idents)


class SweepBook:
    """The sweep's bookkeeping, without I/O. Feed it looks in order; it says what to do next.

    A *look* is one marker scan plus an identity check, made right after it, of every process
    the book watches and every process the scan matched: ``feed(scan, now, live)``, where
    ``live`` is the subset still the same live process (``None``: the check could not tell).

    **Attribution.** Every live match of every scan is *attributed* to the job, by identity
    (pid + start time, :class:`~fleet_trio.proc.procfs.Ident`). An attributed process is
    *watched* until a check proves it gone (gone, a zombie, or its pid now names another
    process); it is then *reaped*. Nothing leaves the watch any other way: a process that drops
    its marker (``unset RC_JOB_ID; exec …``) is still watched, still signalled, and reported
    ``remaining`` if it outlives the phases.

    Discovery pass (initial scan, re-scan, confirmation pass):

    * not scanned → first pass: done, ``scanned=False``; later pass: done, ``blind`` (could not
      confirm, so the report claims nothing).
    * matches → add the pids not yet in ``found``; start the SIGTERM phase (deadline = now +
      ``term_bound``) and SIGTERM every watched process at once.
    * no match, not settled (a fork raced the walk) → another pass if the bound allows, else
      done and ``blind`` (the look was incomplete: no claim of a clean box).
    * no match, settled → done.

    Phase look (SIGTERM, then SIGKILL): scanned, settled, no live match and nothing watched →
    the phase is over and a confirmation pass follows if the bound allows; after a SIGKILL
    phase one always follows (once beyond the bound: at most ``max_passes + 1`` passes), after
    a poll. Otherwise signal
    every watched process not yet signalled in this phase; once the deadline has passed, the
    SIGTERM phase hands over to the SIGKILL phase and the SIGKILL phase ends the sweep with
    every still-watched pid as ``remaining`` (``blind`` when none is left: no settled scan showed
    the box empty). A scan that failed, or found nothing without
    settling, proves nothing; a check that failed proves nothing gone.
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
        """Discovery passes fed so far (≤ ``max_passes``, + 1 after a SIGKILL phase)."""
        self.phases = 0
        """Phases started so far (a SIGTERM and a SIGKILL phase count one each)."""
        self.scanned = False
        self.blind = False
        self.found: list[int] = []
        self.remaining: tuple[int, ...] = ()
        self.watch: dict[Ident, None] = {}
        """Attributed processes not (yet) proven gone, in attribution order."""
        self.reaped: dict[Ident, None] = {}
        """Attributed processes a check has proven gone."""
        self.signalled: set[Ident] = set()
        """Processes signalled in the current phase."""
        self.deadline = 0.0
        self.final_look = False
        """The one confirmation pass beyond ``max_passes`` after a SIGKILL phase was granted."""

    @property
    def done(self) -> bool:
        return self.mode is Mode.DONE

    @property
    def watched(self) -> tuple[Ident, ...]:
        """What the next look must check (with the scan's own matches)."""
        return tuple(self.watch)

    def report(self) -> SweepReport:
        return SweepReport(
            scanned=self.scanned,
            found=tuple(self.found),
            remaining=self.remaining,
            blind=self.blind,
        )

    def feed(self, scan: MarkerScan, now: float, live: Collection[Ident] | None = None) -> Step:
        """Record one look taken at ``now`` and say what to do.

        ``live``: which of :attr:`watched` and of the scan's matches the identity check, made
        after the scan, found still alive; ``None`` when it could not tell.
        """
        if self.mode is Mode.DONE:
            raise RuntimeError("the sweep is over")
        matches = tuple(ident for ident in scan.idents() if ident.pid not in self.protected)
        if live is not None:
            matches = tuple(ident for ident in matches if ident in live)
            for ident in list(self.watch):
                if ident not in live:
                    del self.watch[ident]
                    self.reaped[ident] = None
        for ident in matches:
            self.watch[ident] = None
            self.reaped.pop(ident, None)
        if self.mode is Mode.DISCOVER:
            return self._discover(scan, matches, now)
        return self._phase(scan, matches, now)

    def _discover(self, scan: MarkerScan, matches: tuple[Ident, ...], now: float) -> Step:
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
            for ident in matches:
                if ident.pid not in known:
                    known.add(ident.pid)
                    self.found.append(ident.pid)
            self._start_phase(Mode.TERM, now + self.term_bound)
            return self._signal_fresh(signal.SIGTERM, sleep=True)
        if scan.settled:
            self.mode = Mode.DONE
        elif self.passes >= self.max_passes:
            self.blind = True
            self.mode = Mode.DONE
        return Step()

    def _start_phase(self, mode: Mode, deadline: float) -> None:
        self.mode = mode
        self.phases += 1
        self.signalled = set()
        self.deadline = deadline

    def _signal_fresh(self, sig: signal.Signals, *, sleep: bool) -> Step:
        fresh = tuple(ident for ident in self.watch if ident not in self.signalled)
        self.signalled.update(fresh)
        return Step(sig=sig, idents=fresh, sleep=sleep)

    def _phase(self, scan: MarkerScan, matches: tuple[Ident, ...], now: float) -> Step:
        if scan.scanned:
            self.blind = self.blind or scan.blind
            if not matches and scan.settled and not self.watch:
                killed = self.mode is Mode.KILL
                self.remaining = ()
                self.signalled = set()
                if self.passes < self.max_passes or (killed and not self.final_look):
                    # After SIGKILL, one confirmation pass always follows, a poll later: a
                    # child forked (or still inside execve) as its parent died is seen there.
                    self.final_look = self.final_look or self.passes >= self.max_passes
                    self.mode = Mode.DISCOVER
                    return Step(sleep=killed)
                self.mode = Mode.DONE
                return Step()
        sig = signal.SIGTERM if self.mode is Mode.TERM else signal.SIGKILL
        if now < self.deadline:
            return self._signal_fresh(sig, sleep=True)
        step = self._signal_fresh(sig, sleep=False)
        if self.mode is Mode.TERM:
            self._start_phase(Mode.KILL, now + self.kill_bound)
        else:
            self.remaining = tuple(ident.pid for ident in self.watch)
            if not self.remaining:
                # Everything watched was proven gone, but no settled scan ended the phase:
                # another escapee may be there unseen, so the report claims nothing.
                self.blind = True
            self.mode = Mode.DONE
        return step


def _signal(ident: Ident, sig: signal.Signals) -> bool:
    return signal_ident(ident, sig)


def _check(idents: Collection[Ident]) -> frozenset[Ident] | None:
    return idents_alive(idents)


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
    check: CheckFn | None = None,
    kill: SignalFn | None = None,
    marker: str = "RC_JOB_ID",
    forks_before: int | None = None,
) -> SweepReport:
    """Find and kill live processes whose ``RC_JOB_ID`` equals ``job_id`` (§3.3); ``marker``
    names another variable (the node's ``FLEET_JOB_ID``).

    ``job_id == ""`` sweeps nothing (``scanned=False``). ``self_pid`` and its ancestors are never
    signalled. Every process a scan ever matched is signalled (by identity: pid + start time)
    and counts as reaped only once a check has seen it gone; one that outlives both phases is
    ``remaining``. Every full ``/proc`` walk and every identity check runs in
    ``trio.to_thread.run_sync(..., limiter=limiter)``. The timing parameters default to the
    module constants (read at call time, so tests may patch them); ``scan``, ``check`` and
    ``kill`` replace the ``/proc`` walk, the identity check and the signal in tests.

    ``forks_before``: :func:`~fleet_trio.proc.procfs.forks_since_boot` read just before the
    job's leader was spawned. When the counter has since grown by exactly one (the leader's own
    creation), nothing else was forked or cloned anywhere on the host: the leader (the caller
    passes the counter only once the leader is reaped) was the only process that ever carried
    the marker, and the sweep is a settled scan that found nothing, without walking ``/proc``
    (and without a thread hop). Any other count,
    or a counter that cannot be read, takes the full walk.

    Cancellation: the sweep is cancellable at every scan and sleep; a cancelled sweep raises
    ``Cancelled`` and reports nothing (what it had signalled stays signalled). Supervisors run
    it in a shielded scope with its own bound (``SWEEP_GRACE + SWEEP_KILL_BOUND`` plus the
    scans), so a shutdown does not interrupt it.
    """
    if not job_id:
        return SweepReport()
    grace = SWEEP_GRACE if grace is None else grace
    poll = SWEEP_POLL if poll is None else poll
    kill_bound = SWEEP_KILL_BOUND if kill_bound is None else kill_bound
    max_passes = SWEEP_MAX_PASSES if max_passes is None else max_passes
    key = f"{marker}=".encode()
    scan_fn: MarkerScanFn = functools.partial(scan_job_marker, key=key) if scan is None else scan
    check_fn: CheckFn = _check if check is None else check
    signal_fn: SignalFn = _signal if kill is None else kill

    def look(
        protected: frozenset[int], watched: tuple[Ident, ...]
    ) -> tuple[MarkerScan, frozenset[Ident] | None]:
        result = scan_fn(job_id, protected)
        suspects = watched + tuple(i for i in result.idents() if i.pid not in protected)
        return result, (check_fn(suspects) if suspects else frozenset())

    def first_look() -> tuple[frozenset[int], MarkerScan, frozenset[Ident] | None]:
        protected = frozenset(ancestor_set(self_pid))
        return (protected, *look(protected, ()))

    if forks_before is not None and scan is None and forks_since_boot() == forks_before + 1:
        log.debug("sweep %s: nothing forked since the job started; no /proc walk", job_id)
        return SweepReport(scanned=True)
    protected, result, live = await trio.to_thread.run_sync(first_look, limiter=limiter)
    book = SweepBook(protected, max_passes=max_passes, term_bound=grace, kill_bound=kill_bound)
    while True:
        step = book.feed(result, trio.current_time(), live)
        if step.sig is not None:
            for ident in step.idents:
                with contextlib.suppress(OSError):  # gone meanwhile: the next check sees it
                    signal_fn(ident, step.sig)
            if step.idents:
                log.debug("sweep %s: %s sent to %s", job_id, step.sig.name, list(step.pids))
        if book.done:
            break
        if step.sleep:
            await trio.sleep(poll)
        result, live = await trio.to_thread.run_sync(look, protected, book.watched, limiter=limiter)
    report = book.report()
    if log.isEnabledFor(logging.DEBUG):
        log.debug("sweep %s: %d passes, %s", job_id, book.passes, report.to_json())
    return report


__all__ = [
    "SWEEP_GRACE",
    "SWEEP_KILL_BOUND",
    "SWEEP_MAX_PASSES",
    "SWEEP_POLL",
    "CheckFn",
    "MarkerScanFn",
    "Mode",
    "SignalFn",
    "Step",
    "SweepBook",
    "sweep_job_survivors",
]
