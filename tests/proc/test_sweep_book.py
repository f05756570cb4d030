"""The sweep's bookkeeping (``SweepBook``) and its trio shell against fake scans.

``SweepBook`` is driven by a Hypothesis ``RuleBasedStateMachine`` (plain, synchronous: the book
has no I/O and no clock of its own). The shell is exercised with a scripted scan and a recording
``kill`` under trio's autojump clock.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Collection, Iterator, Sequence

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from fleet_trio.proc import sweep as sweep_mod
from fleet_trio.proc.procfs import Ident, MarkerScan, ancestor_set
from fleet_trio.proc.spec import SweepReport
from fleet_trio.proc.sweep import Mode, Step, SweepBook, sweep_job_survivors

PROTECTED = frozenset({1, 2})
UNIVERSE = st.integers(min_value=1, max_value=12)
IDENTS = st.builds(Ident, UNIVERSE, st.integers(min_value=1, max_value=2))


def ok(*pids: int, blind: bool = False, settled: bool = True) -> MarkerScan:
    return MarkerScan(scanned=True, pids=tuple(pids), blind=blind, settled=settled)


FAILED = MarkerScan(scanned=False, settled=False)


class SweepBookMachine(RuleBasedStateMachine):
    """Random looks at random times; the book's promises hold after every step.

    Each look is a scan plus an identity check of what the book watches and what the scan
    matched. Identities are ``Ident(pid, start)`` with two possible start times per pid, so a
    reused pid is a different process. The machine keeps its own record of what each check
    proved gone and what was signalled, and checks the book's honesty against it.
    """

    def __init__(self) -> None:
        super().__init__()
        self.book = SweepBook(PROTECTED)
        self.now = 0.0
        self.seen: set[int] = set()
        self.discovered: set[int] = set()
        self.last_scan: MarkerScan | None = None
        self.last_live: frozenset[Ident] | None = None
        self.first_scan: MarkerScan | None = None
        self.phase_signals: set[Ident] = set()
        self.phase_no = 0
        self.attributed: set[Ident] = set()
        self.proven_gone: set[Ident] = set()
        self.ever_signalled: set[Ident] = set()

    @initialize(max_passes=st.integers(min_value=1, max_value=5))
    def start(self, max_passes: int) -> None:
        self.book = SweepBook(PROTECTED, max_passes=max_passes, term_bound=2.0, kill_bound=2.0)

    @precondition(lambda self: not self.book.done)
    @rule(
        scanned=st.booleans(),
        matches=st.lists(IDENTS, max_size=6, unique_by=lambda i: i.pid),
        blind=st.booleans(),
        settled=st.booleans(),
        dt=st.floats(min_value=0.0, max_value=1.5),
        checked=st.booleans(),
        dead=st.sets(IDENTS, max_size=6),
    )
    def feed(
        self,
        scanned: bool,
        matches: list[Ident],
        blind: bool,
        settled: bool,
        dt: float,
        checked: bool,
        dead: set[Ident],
    ) -> None:
        self.now += dt
        scan = MarkerScan(
            scanned=scanned,
            pids=tuple(i.pid for i in matches) if scanned else (),
            blind=blind and scanned,
            settled=settled and scanned,
            starts=tuple(i.start for i in matches) if scanned else (),
        )
        suspects = set(self.book.watched) | {i for i in scan.idents() if i.pid not in PROTECTED}
        live = frozenset(suspects - dead) if checked else None
        watched_before = set(self.book.watched)
        mode_before = self.book.mode
        phase_before = self.book.phases
        step = self.book.feed(scan, self.now, live)
        if self.first_scan is None:
            self.first_scan = scan
        self.last_scan = scan
        self.last_live = live
        live_matches = {i for i in scan.idents() if i.pid not in PROTECTED}
        if live is not None:
            self.proven_gone |= (watched_before | live_matches) - live
            self.proven_gone -= live
            live_matches &= live
        self.proven_gone -= live_matches  # seen alive again (only fakes can do that)
        self.attributed |= live_matches
        self.seen |= {i.pid for i in live_matches}
        if mode_before is Mode.DISCOVER:
            self.discovered |= {i.pid for i in live_matches}
            if live_matches:
                assert {i.pid for i in live_matches} <= set(self.book.found)
                assert self.book.mode is Mode.TERM
                # Found processes are signalled at once, not only if a later scan sees them.
                assert step.sig is signal.SIGTERM
                assert live_matches <= set(step.idents)
            else:
                assert step == Step()
        elif step.sig is None:  # the phase ended: a settled scan found nothing, nothing watched
            assert step == Step(sleep=mode_before is Mode.KILL and not self.book.done)
            assert scan.scanned and scan.settled and not live_matches
            assert self.book.watched == ()
        else:
            assert step.sig is (signal.SIGTERM if mode_before is Mode.TERM else signal.SIGKILL)
        # Signals: never a protected pid, never a process proven gone, never twice in a phase.
        assert not set(step.pids) & PROTECTED
        assert not set(step.idents) & self.proven_gone
        assert set(step.idents) <= self.attributed
        if phase_before != self.phase_no:
            self.phase_no = phase_before
            self.phase_signals = set()
        if mode_before is not Mode.DISCOVER:
            assert not set(step.idents) & self.phase_signals
        else:
            self.phase_signals = set()
            self.phase_no = self.book.phases
        self.phase_signals |= set(step.idents)
        self.ever_signalled |= set(step.idents)

    @rule()
    def feed_after_done_is_refused(self) -> None:
        if self.book.done:
            with pytest.raises(RuntimeError):
                self.book.feed(ok(), self.now, frozenset())

    @invariant()
    def pass_count_is_bounded(self) -> None:
        # One pass beyond the bound: the confirmation that always follows a SIGKILL phase.
        assert 0 <= self.book.passes <= self.book.max_passes + 1
        if self.book.passes > self.book.max_passes:
            assert self.book.final_look

    @invariant()
    def found_is_unique_discovered_and_never_protected(self) -> None:
        found = self.book.report().found
        assert len(found) == len(set(found))
        assert not set(found) & PROTECTED
        assert set(found) <= self.discovered

    @invariant()
    def watched_and_reaped_partition_the_attributed(self) -> None:
        watched, reaped = set(self.book.watch), set(self.book.reaped)
        assert not watched & reaped
        assert watched | reaped == self.attributed

    @invariant()
    def only_a_check_proves_a_process_gone(self) -> None:
        assert set(self.book.reaped) <= self.proven_gone

    @invariant()
    def every_watched_process_has_been_signalled(self) -> None:
        assert set(self.book.watch) <= self.ever_signalled

    @invariant()
    def an_alive_attributed_process_is_never_reported_reaped(self) -> None:
        # The honesty promise: once done, a pid reported found and not remaining was proven
        # gone, under every identity it had; whatever is not proven gone is remaining.
        if not self.book.done:
            return
        rep = self.book.report()
        for ident in self.attributed - self.proven_gone:
            assert ident.pid in rep.remaining
        for pid in set(rep.found) - set(rep.remaining):
            for ident in self.attributed:
                if ident.pid == pid:
                    assert ident in self.proven_gone

    @invariant()
    def remaining_was_attributed(self) -> None:
        rep = self.book.report()
        assert set(rep.remaining) <= self.seen
        assert not set(rep.remaining) & PROTECTED

    @invariant()
    def remaining_and_clean_exclude_each_other(self) -> None:
        rep = self.book.report()
        if rep.remaining:
            assert not rep.clean()
        if rep.clean():
            assert rep.remaining == ()
            assert rep.scanned
        if self.book.done and rep.clean():
            assert self.book.watched == ()

    @invariant()
    def remaining_only_once_done(self) -> None:
        if not self.book.done:
            assert self.book.report().remaining == ()

    @invariant()
    def a_clean_report_rests_on_a_settled_scan_with_no_live_match(self) -> None:
        if self.book.done and self.book.report().clean():
            last = self.last_scan
            assert last is not None
            assert last.scanned and last.settled
            live = {i for i in last.idents() if i.pid not in PROTECTED}
            if self.last_live is not None:
                live &= self.last_live
            assert not live

    @invariant()
    def a_first_scan_that_could_not_look_claims_nothing(self) -> None:
        if self.first_scan is not None and not self.first_scan.scanned:
            assert self.book.done
            assert self.book.report() == SweepReport()


SweepBookMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None
)
TestSweepBook = SweepBookMachine.TestCase
TestSweepBook.pytestmark = [pytest.mark.slow]


# ----------------------------------------------------------------------- liveness (bounded)


@given(
    scans=st.lists(
        st.builds(
            MarkerScan,
            scanned=st.booleans(),
            pids=st.lists(UNIVERSE, max_size=4, unique=True).map(tuple),
            blind=st.booleans(),
            settled=st.booleans(),
        ),
        min_size=1,
        max_size=50,
    ),
    max_passes=st.integers(min_value=1, max_value=4),
)
def test_sweep_ends_within_its_time_and_pass_bounds(
    scans: list[MarkerScan], max_passes: int
) -> None:
    """With scans 20 ms apart, the book is done after at most
    ``(max_passes + 1) * (phases / poll + a few)`` scans, whatever the scans say."""
    book = SweepBook(PROTECTED, max_passes=max_passes, term_bound=0.2, kill_bound=0.2)
    now = 0.0
    bound = (max_passes + 1) * (2 * (0.2 / 0.02 + 2) + 1)
    n = 0
    while not book.done:
        scan = scans[n % len(scans)]
        book.feed(scan, now, seen_alive(scan))
        n += 1
        now += 0.02
        assert n <= bound


# ------------------------------------------------------------------------- example paths


def seen_alive(scan: MarkerScan) -> frozenset[Ident] | None:
    """A check that agrees with the scan (a process lives exactly while it carries its marker);
    a failed scan comes with a failed check."""
    return frozenset(scan.idents()) if scan.scanned else None


def drive(book: SweepBook, scans: Sequence[MarkerScan], dt: float = 0.02) -> list[Step]:
    steps = []
    now = 0.0
    for scan in scans:
        assert not book.done
        steps.append(book.feed(scan, now, seen_alive(scan)))
        now += dt
    assert book.done
    return steps


def ids(*pids: int) -> tuple[Ident, ...]:
    return tuple(Ident(pid) for pid in pids)


def test_common_case_is_one_scan() -> None:
    book = SweepBook(PROTECTED)
    drive(book, [ok()])
    assert book.passes == 1
    assert book.report() == SweepReport(scanned=True)
    assert book.report().clean()


def test_unlistable_proc_is_not_scanned() -> None:
    book = SweepBook(PROTECTED)
    drive(book, [FAILED])
    assert book.report() == SweepReport()


def test_blind_initial_scan_is_reported() -> None:
    book = SweepBook(PROTECTED)
    drive(book, [ok(blind=True)])
    assert book.report() == SweepReport(scanned=True, blind=True)
    assert not book.report().clean()


def test_protected_matches_are_ignored() -> None:
    book = SweepBook(PROTECTED)
    drive(book, [ok(1, 2)])
    assert book.report() == SweepReport(scanned=True)


def test_found_is_signalled_at_once_then_phase_and_confirmation() -> None:
    book = SweepBook(PROTECTED)
    steps = drive(book, [ok(5), ok(5, 6), ok(5, 6, 7), ok(), ok()])
    assert steps[0] == Step(signal.SIGTERM, ids(5), sleep=True)  # found: signalled at once
    assert steps[1] == Step(signal.SIGTERM, ids(6), sleep=True)
    assert steps[2] == Step(signal.SIGTERM, ids(7), sleep=True)  # already-signalled not re-sent
    assert book.passes == 2  # initial + confirmation
    assert book.report() == SweepReport(scanned=True, found=(5,))  # 6, 7: seen in a phase


def test_a_process_that_drops_its_marker_is_still_signalled_and_checked() -> None:
    """The issue-13 case: found by the first scan, then ``unset RC_JOB_ID; exec sleep``: no
    later scan sees the marker, but the process lives. It is signalled, watched by identity
    and, as it survives, reported remaining (never as reaped)."""
    book = SweepBook(PROTECTED, term_bound=0.1, kill_bound=0.1)
    alive = frozenset(ids(5))
    steps = [book.feed(ok(5), 0.0, alive)]
    now = 0.0
    while not book.done:
        now += 0.02
        steps.append(book.feed(ok(), now, alive))
    sent = [(s.sig, s.pids) for s in steps if s.idents]
    assert sent == [(signal.SIGTERM, (5,)), (signal.SIGKILL, (5,))]
    rep = book.report()
    assert rep.found == (5,) and rep.remaining == (5,)
    assert not rep.clean()


def test_a_process_that_drops_its_marker_and_dies_is_reaped() -> None:
    book = SweepBook(PROTECTED)
    steps = [book.feed(ok(5), 0.0, frozenset(ids(5)))]
    steps.append(book.feed(ok(), 0.02, frozenset(ids(5))))  # marker gone, process alive
    assert not book.done and book.watched == ids(5)
    steps.append(book.feed(ok(), 0.04, frozenset()))  # the check sees it gone
    assert book.reaped == {Ident(5): None}
    steps.append(book.feed(ok(), 0.06, frozenset()))  # confirmation
    assert book.done
    assert book.report() == SweepReport(scanned=True, found=(5,))
    assert book.report().clean()


@pytest.mark.parametrize(
    "later", [ok(), FAILED], ids=["scans-clean-but-the-check-fails", "the-scans-fail"]
)
def test_what_no_check_saw_gone_stays_remaining(later: MarkerScan) -> None:
    """Once pid 5 is found, neither a failed liveness check (``None``: proves nothing gone)
    nor failed phase scans (the last known pids are kept) lets it drop out of ``remaining``."""
    book = SweepBook(PROTECTED, term_bound=0.05, kill_bound=0.05)
    now = 0.0
    book.feed(ok(5), now, frozenset(ids(5)))
    while not book.done:
        now += 0.02
        book.feed(later, now, None)
    assert book.report().remaining == (5,)


def test_a_reused_pid_is_another_process() -> None:
    old, new = Ident(5, start=100), Ident(5, start=200)
    book = SweepBook(PROTECTED)
    step = book.feed(MarkerScan(scanned=True, pids=(5,), starts=(100,)), 0.0, frozenset({old}))
    assert step.idents == (old,)
    # The old process is gone; a new marked process got its pid: watched and signalled anew.
    again = MarkerScan(scanned=True, pids=(5,), starts=(200,))
    step = book.feed(again, 0.02, frozenset({new}))
    assert step.idents == (new,)
    assert set(book.reaped) == {old} and book.watched == (new,)


def test_unsettled_empty_scan_does_not_end_a_phase() -> None:
    book = SweepBook(PROTECTED)
    steps = drive(book, [ok(5), ok(settled=False), ok(), ok()])
    assert steps[1] == Step(signal.SIGTERM, (), sleep=True)
    assert book.report().clean()


def test_term_ignored_escalates_and_remaining_is_reported() -> None:
    book = SweepBook(PROTECTED, term_bound=0.1, kill_bound=0.1)
    scans = [ok(5)] + [ok(5)] * 20
    steps = []
    now = 0.0
    i = 0
    while not book.done:
        steps.append(book.feed(scans[i], now, seen_alive(scans[i])))
        i += 1
        now += 0.02
    sigs = [(s.sig, s.pids) for s in steps if s.idents]
    assert sigs == [(signal.SIGTERM, (5,)), (signal.SIGKILL, (5,))]
    rep = book.report()
    assert rep.remaining == (5,)
    assert not rep.clean()


def test_confirmation_pass_adds_new_pids_to_found_and_runs_phases_again() -> None:
    book = SweepBook(PROTECTED)
    steps = drive(book, [ok(5), ok(5), ok(), ok(9), ok(9), ok(), ok()])
    assert steps[3] == Step(signal.SIGTERM, ids(9), sleep=True)
    assert book.report() == SweepReport(scanned=True, found=(5, 9))
    assert book.passes == 3


def test_unsettled_initial_scan_is_repeated_then_finds_the_late_fork() -> None:
    book = SweepBook(PROTECTED)
    drive(book, [ok(settled=False), ok(8), ok(), ok()])
    assert book.report() == SweepReport(scanned=True, found=(8,))


def test_never_settling_scans_claim_nothing_at_the_pass_bound() -> None:
    book = SweepBook(PROTECTED, max_passes=3)
    drive(book, [ok(settled=False)] * 3)
    rep = book.report()
    assert rep.blind is True
    assert not rep.clean()


def test_failed_confirmation_scan_claims_nothing() -> None:
    book = SweepBook(PROTECTED)
    drive(book, [ok(5), ok(), FAILED])
    rep = book.report()
    assert rep.scanned and rep.blind and rep.found == (5,)
    assert not rep.clean()


def test_pass_bound_of_one_skips_the_confirmation() -> None:
    book = SweepBook(PROTECTED, max_passes=1)
    drive(book, [ok(5), ok()])
    assert book.passes == 1
    assert book.report().clean()


def test_max_passes_must_be_positive() -> None:
    with pytest.raises(ValueError):
        SweepBook(PROTECTED, max_passes=0)


# --------------------------------------------------------------------- the shell, fake scans


class Script:
    """A scripted scan: returns the given scans in order, then repeats the last one."""

    def __init__(self, scans: Sequence[MarkerScan]) -> None:
        self.scans = list(scans)
        self.calls: list[tuple[str, frozenset[int]]] = []

    def __call__(self, job_id: str, protected: frozenset[int]) -> MarkerScan:
        self.calls.append((job_id, protected))
        self.last = self.scans[min(len(self.calls) - 1, len(self.scans) - 1)]
        return self.last

    def check(self, idents: Collection[Ident]) -> frozenset[Ident] | None:
        """Alive: what the last scan saw (a failed scan: cannot tell)."""
        return seen_alive(self.last)


class Kills:
    def __init__(self, raise_for: dict[int, type[OSError]] | None = None) -> None:
        self.sent: list[tuple[int, signal.Signals]] = []
        self.raise_for = raise_for or {}

    def __call__(self, ident: Ident, sig: signal.Signals) -> None:
        self.sent.append((ident.pid, sig))
        if ident.pid in self.raise_for:
            raise self.raise_for[ident.pid]()


async def test_shell_empty_id_scans_nothing() -> None:
    script = Script([ok(5)])
    rep = await sweep_job_survivors("", os.getpid(), scan=script, check=script.check, kill=Kills())
    assert rep == SweepReport()
    assert script.calls == []


async def test_shell_protects_self_and_ancestors() -> None:
    script = Script([ok()])
    await sweep_job_survivors("j", os.getpid(), scan=script, check=script.check, kill=Kills())
    assert script.calls == [("j", frozenset(ancestor_set(os.getpid())))]


async def test_shell_phases_and_timing(autojump_clock: trio.abc.Clock) -> None:
    me = os.getpid()
    script = Script([ok(50, 51), *[ok(50, 51)] * 300, ok()])
    kills = Kills(raise_for={51: ProcessLookupError})
    start = trio.current_time()
    rep = await sweep_job_survivors("j", me, scan=script, check=script.check, kill=kills)
    elapsed = trio.current_time() - start
    assert kills.sent == [
        (50, signal.SIGTERM),
        (51, signal.SIGTERM),
        (50, signal.SIGKILL),
        (51, signal.SIGKILL),
    ]
    assert rep == SweepReport(scanned=True, found=(50, 51), remaining=(50, 51))
    assert 4.0 <= elapsed < 4.2  # 2 s SIGTERM phase + 2 s SIGKILL phase


async def test_shell_overrides_and_module_constants(
    autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sweep_mod, "SWEEP_GRACE", 0.5)
    monkeypatch.setattr(sweep_mod, "SWEEP_POLL", 0.1)
    script = Script([ok(7), *[ok(7)] * 1000])
    start = trio.current_time()
    rep = await sweep_job_survivors(
        "j", os.getpid(), scan=script, check=script.check, kill=Kills(), kill_bound=0.3
    )
    assert 0.8 <= trio.current_time() - start < 1.0
    assert rep.remaining == (7,)
    assert 8 <= len(script.calls) <= 14  # polls of 100 ms over 0.8 s


async def test_shell_is_one_scan_when_nothing_matches() -> None:
    script = Script([ok()])
    kills = Kills()
    rep = await sweep_job_survivors("j", os.getpid(), scan=script, check=script.check, kill=kills)
    assert rep.clean() and rep.found == ()
    assert len(script.calls) == 1
    assert kills.sent == []


async def test_shell_uses_the_given_limiter() -> None:
    limiter = trio.CapacityLimiter(1)
    seen: list[int] = []

    def scan(job_id: str, protected: frozenset[int]) -> MarkerScan:
        seen.append(limiter.borrowed_tokens)
        return ok()

    await sweep_job_survivors("j", os.getpid(), scan=scan, kill=Kills(), limiter=limiter)
    assert seen == [1]


async def test_shell_cancellation_propagates(autojump_clock: trio.abc.Clock) -> None:
    def forever() -> Iterator[MarkerScan]:
        while True:
            yield ok(5)

    it = forever()
    with trio.move_on_after(0.5) as scope:
        await sweep_job_survivors(
            "j", os.getpid(), scan=lambda j, p: next(it), check=frozenset, kill=Kills()
        )
    assert scope.cancelled_caught


async def test_shell_signals_a_process_whose_marker_vanished(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The shell side of the honesty fix: the first scan sees pid 60, later scans do not (it
    dropped its marker), the identity check says it lives: it is signalled on every phase
    and reported ``remaining``, never as reaped."""
    script = Script([ok(60), ok()])
    kills = Kills()
    alive = Ident(60)
    rep = await sweep_job_survivors(
        "j", os.getpid(), scan=script, check=lambda idents: frozenset({alive}), kill=kills
    )
    assert kills.sent == [(60, signal.SIGTERM), (60, signal.SIGKILL)]
    assert rep.found == (60,) and rep.remaining == (60,) and not rep.clean()


async def test_shell_reports_reaped_once_the_check_sees_it_gone(
    autojump_clock: trio.abc.Clock,
) -> None:
    script = Script([ok(61), ok()])
    kills = Kills()
    looks: list[int] = []

    def check(idents: Collection[Ident]) -> frozenset[Ident]:
        looks.append(len(idents))
        return frozenset(idents) if len(looks) < 3 else frozenset()

    rep = await sweep_job_survivors("j", os.getpid(), scan=script, check=check, kill=kills)
    assert kills.sent == [(61, signal.SIGTERM)]
    assert rep.found == (61,) and rep.remaining == () and rep.clean()


def test_a_sigkill_phase_is_confirmed_after_a_poll_even_at_the_pass_bound() -> None:
    """A process forked (or still inside ``execve``, reading empty) as its SIGKILLed parent
    died is not seen by the look that ends the SIGKILL phase: one confirmation pass always
    follows a SIGKILL phase, after a poll, even when the pass bound is spent; it is the last."""
    book = SweepBook(PROTECTED, max_passes=1, term_bound=0.05, kill_bound=0.05)
    now = 0.0
    step = book.feed(ok(5), now, frozenset(ids(5)))
    while book.mode is not Mode.KILL:  # 5 ignores SIGTERM
        now += 0.02
        step = book.feed(ok(5), now, frozenset(ids(5)))
    now += 0.02
    step = book.feed(ok(5), now, frozenset(ids(5)))
    assert step.sig is signal.SIGKILL and step.idents == ids(5)
    now += 0.02
    step = book.feed(ok(), now, frozenset())  # 5 is gone: the SIGKILL phase is over
    assert step == Step(sleep=True)
    assert not book.done and book.mode is Mode.DISCOVER
    now += 0.02
    step = book.feed(ok(7), now, frozenset(ids(7)))  # the late child
    assert step == Step(signal.SIGTERM, ids(7), sleep=True)
    assert book.report().found == (5, 7)
    now += 0.02
    book.feed(ok(), now, frozenset())  # 7 died of SIGTERM: the phase is over, and the last
    assert book.done
    assert book.passes == 2
    assert book.report().clean()


def test_a_phase_that_ends_without_sigkill_is_confirmed_at_once() -> None:
    book = SweepBook(PROTECTED)
    book.feed(ok(5), 0.0, frozenset(ids(5)))
    assert book.feed(ok(), 0.02, frozenset()) == Step()  # no poll: nothing was SIGKILLed
    assert book.mode is Mode.DISCOVER


# --------------------------------------------------------------------------------------------
# The shortcut: nothing forked on the host since the leader's spawn ⇒ no /proc walk
# --------------------------------------------------------------------------------------------


async def test_the_sweep_skips_the_walk_only_when_the_spawn_was_the_only_fork(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    walks: list[str] = []

    def scan(job_id: str, protected: Collection[int], **kw: object) -> MarkerScan:
        walks.append(job_id)
        return MarkerScan(scanned=True)

    monkeypatch.setattr(sweep_mod, "scan_job_marker", scan)
    monkeypatch.setattr(sweep_mod, "forks_since_boot", lambda: 1001)
    with trio.fail_after(10):
        report = await sweep_job_survivors("job-a", os.getpid(), forks_before=1000)
        assert report == SweepReport(scanned=True) and walks == []
        for before in (999, None):  # something else forked meanwhile, or no counter
            report = await sweep_job_survivors("job-a", os.getpid(), forks_before=before)
            assert report == SweepReport(scanned=True)
        assert walks == ["job-a", "job-a"]
    monkeypatch.setattr(sweep_mod, "forks_since_boot", lambda: None)  # unreadable now
    with trio.fail_after(10):
        await sweep_job_survivors("job-a", os.getpid(), forks_before=1000)
    assert len(walks) == 3


def test_the_fork_counter_counts_a_spawn() -> None:
    from fleet_trio.proc.procfs import forks_since_boot

    before = forks_since_boot()
    assert before is not None
    subprocess.run(["sh", "-c", "exit 0"], check=True, timeout=10)
    after = forks_since_boot()
    assert after is not None and after >= before + 1


async def test_a_job_that_forks_an_escapee_is_still_swept() -> None:
    """The shortcut never hides a late fork: the job's own fork moves the counter."""
    from fleet_trio.proc.run import run
    from fleet_trio.proc.sinks import NullSink
    from fleet_trio.proc.spec import JobSpec

    job_id = f"sweep-short-{os.getpid()}"
    spec = JobSpec(
        command=["sh", "-c", "setsid sleep 60 </dev/null >/dev/null 2>&1 &"],
        env={"RC_JOB_ID": job_id},
        sweep_job_id=job_id,
    )
    with trio.fail_after(20):
        result = await run(spec, NullSink())
    assert result.sweep.scanned and result.sweep.found and not result.sweep.remaining


async def test_the_shortcut_is_not_taken_while_the_leader_is_unreaped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A leader that left the job's process group (into the test's own) survives the group's
    SIGTERM and SIGKILL and is not reaped within the straggler wait: even on a host where
    nothing else forked (the counter moved by one), the sweep must walk /proc and find it,
    not report a clean job while the leader still runs."""
    import importlib
    import sys

    run_mod = importlib.import_module("fleet_trio.proc.run")  # the package names a function so
    sup_mod = importlib.import_module("fleet_trio.proc.supervisor")
    from fleet_trio.proc.procfs import forks_since_boot
    from fleet_trio.proc.run import run
    from fleet_trio.proc.sinks import NullSink
    from fleet_trio.proc.spec import JobSpec

    seen: list[int] = []

    def before() -> int | None:
        value = forks_since_boot()
        if value is not None:
            seen.append(value)
        return value

    monkeypatch.setattr(run_mod, "forks_since_boot", before)
    monkeypatch.setattr(sweep_mod, "forks_since_boot", lambda: seen[-1] + 1 if seen else None)
    monkeypatch.setattr(sup_mod, "STRAGGLER_WAIT", 0.3)
    job_id = f"sweep-unreaped-{os.getpid()}"
    leader = (
        "import os, sys, time\n"
        "os.setpgid(0, os.getpgid(os.getppid()))\n"  # out of the job's group, into ours
        "os.close(1); os.close(2)\n"
        "time.sleep(120)\n"
    )
    spec = JobSpec(
        command=(sys.executable, "-c", leader),
        env={**os.environ, "RC_JOB_ID": job_id},
        sweep_job_id=job_id,
        max_runtime=1.0,
        grace_ceiling=0.3,
    )
    with trio.fail_after(60):
        result = await run(spec, NullSink())
    assert result.sweep is not None
    assert result.sweep.found, result.sweep.to_json()  # the walk ran and saw the leader
    assert result.sweep.clean(), result.sweep.to_json()  # and the sweep ended it


def test_a_phase_that_ends_by_its_deadline_without_a_settled_look_claims_nothing() -> None:
    """Found by the state machine under load: an escapee is found, later proven gone by a
    check, but every scan after it failed, and the SIGKILL phase ended by its deadline. No
    settled scan ever showed the box empty (another escapee may be there), so the report
    must not be clean: the sweep claims nothing."""
    book = SweepBook(PROTECTED, max_passes=2, term_bound=1.0, kill_bound=1.0)
    book.feed(ok(settled=False), 0.0, frozenset())
    book.feed(ok(3), 0.0, seen_alive(ok(3)))
    now = 0.0
    while not book.done:
        now += 0.5
        book.feed(FAILED, now, frozenset())  # 3 proven gone; /proc cannot be listed
    rep = book.report()
    assert rep.scanned and rep.found == (3,) and rep.remaining == ()
    assert rep.blind and not rep.clean()
