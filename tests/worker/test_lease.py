"""fleet_trio.worker.lease: sans-IO per-device lease-hook state machine (worker-process.md §4.4).

Example tests are named after the rule they pin; the checklist numbers of §11 H are noted where
a rule has one. ``TestLeaseMachine`` drives random job/timer/hook interleavings on 1–3 devices.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from fleet_trio.worker.lease import (
    AcquireFailed,
    ArmRelease,
    Blocked,
    Granted,
    HookSpec,
    LeaseBook,
    LeaseProtocolError,
    NotDue,
    ReleaseFinished,
    ReleaseSkipped,
    RunAcquire,
    RunRelease,
    RunStartupRelease,
    Superseded,
)

DEV = "gpubox:gpu0"
BOTH = HookSpec(has_acquire=True, has_release=True, release_linger=0.3)


def _book(spec: HookSpec = BOTH, device: str = DEV) -> LeaseBook:
    return LeaseBook([(device, spec)])


def _acquire_ok(book: LeaseBook, job: str, device: str = DEV) -> Granted:
    """Acquire for ``job``; if the hook must run, report it successful."""
    action = book.begin_acquire(device, job, f"sub-{job}")
    if isinstance(action, RunAcquire):
        done = book.acquire_done(device, action.epoch, ok=True)
        assert isinstance(done, Granted)
        return done
    assert isinstance(action, Granted)
    return action


def _arm(book: LeaseBook, job: str, epoch: int, now: float, device: str = DEV) -> ArmRelease:
    action = book.schedule_release(device, job, f"sub-{job}", epoch, now)
    assert isinstance(action, ArmRelease)
    return action


def _job1_armed(book: LeaseBook) -> ArmRelease:
    """job1 acquired, then ended at t=0: its release armed."""
    return _arm(book, "job1", _acquire_ok(book, "job1").epoch, now=0.0)


def _fired(book: LeaseBook, armed: ArmRelease, now: float) -> RunRelease:
    """Fire ``armed`` at ``now``: the release hook it must run."""
    release = book.fire_release(armed.device, armed.gen, now=now)
    assert isinstance(release, RunRelease)
    return release


def _lease_held(book: LeaseBook, device: str = DEV) -> bool:
    lease = book.lease(device)
    assert lease is not None
    return lease.held


# -- §4.1 / §4.4 acquire_device ------------------------------------------------------------------


def test_device_with_no_hooks_configured_is_a_noop() -> None:
    """§4.4 acquire step 1, §4.1 "no hook state at all" (checklist 43)."""
    book = LeaseBook([(DEV, HookSpec(has_acquire=False, has_release=False))])
    assert book.begin_acquire(DEV, "job1", "a") == Granted(DEV, epoch=0, ran_hook=False)
    assert book.lease(DEV) is None
    assert list(book.leases()) == []
    assert book.schedule_release(DEV, "job1", "a", 0, 0.0) == ReleaseSkipped(DEV, "no-hooks")
    assert book.startup_devices() == []
    assert book.drain_targets() == []
    assert book.next_due() is None


def test_unknown_device_is_treated_as_having_no_hooks() -> None:
    """§4.4 acquire step 1: only configured devices carry state."""
    book = _book()
    assert book.begin_acquire("other:gpu9", "j", "s") == Granted("other:gpu9", 0, False)
    assert book.lease("other:gpu9") is None


def test_acquire_hook_success_holds_the_device_under_a_new_epoch() -> None:
    """§4.4 acquire step 5 (success): ``held``, ``epoch += 1``, ran_hook True."""
    book = _book()
    action = book.begin_acquire(DEV, "job1", "alice")
    assert action == RunAcquire(DEV, epoch=1, job_id="job1", submitter="alice")
    assert not _lease_held(book)
    assert book.acquire_done(DEV, 1, ok=True) == Granted(DEV, epoch=1, ran_hook=True)
    assert _lease_held(book)


def test_acquire_hook_failure_leaves_device_unheld() -> None:
    """§4.4 acquire step 5 (failure), §4.5; checklist 42: nothing to release, hook reruns."""
    book = _book()
    first = book.begin_acquire(DEV, "job1", "a")
    assert isinstance(first, RunAcquire)
    assert book.acquire_done(DEV, first.epoch, ok=False) == AcquireFailed(DEV)
    lease = book.lease(DEV)
    assert lease is not None
    assert (lease.held, lease.epoch, lease.pending) == (False, 0, None)
    assert book.schedule_release(DEV, "job1", "a", 0, 0.0) == ReleaseSkipped(DEV, "not-held")
    assert lease.pending is None
    second = book.begin_acquire(DEV, "job2", "a")
    assert isinstance(second, RunAcquire)
    assert second.job_id == "job2"


def test_acquire_when_already_held_skips_the_hook_and_takes_ownership() -> None:
    """§4.4 acquire step 3: held → skip the hook, ``epoch += 1``."""
    book = _book()
    g1 = _acquire_ok(book, "job1")
    assert book.begin_acquire(DEV, "job2", "b") == Granted(DEV, epoch=g1.epoch + 1, ran_hook=False)


def test_acquire_drops_a_pending_release_and_bumps_gen() -> None:
    """§4.4 acquire step 2: stop and drop the timer; ``gen += 1`` voids a concurrent firing."""
    book = _book()
    g1 = _acquire_ok(book, "job1")
    armed = _arm(book, "job1", g1.epoch, now=0.0)
    lease = book.lease(DEV)
    assert lease is not None
    assert book.next_due() == armed.due_at
    book.begin_acquire(DEV, "job2", "b")
    assert lease.pending is None
    assert book.next_due() is None
    assert lease.gen == armed.gen + 1
    assert book.fire_release(DEV, armed.gen, now=10.0) == Superseded(DEV)


def test_only_release_hook_configured() -> None:
    """§4.4 acquire step 4 (no ``on_acquire``): held without a hook; checklist 44."""
    book = _book(HookSpec(has_acquire=False, has_release=True, release_linger=0.1))
    g = book.begin_acquire(DEV, "job1", "a")
    assert g == Granted(DEV, epoch=1, ran_hook=False)
    assert _lease_held(book)
    armed = _arm(book, "job1", 1, now=5.0)
    assert armed.due_at == pytest.approx(5.1)
    fired = book.fire_release(DEV, armed.gen, now=5.1)
    assert fired == RunRelease(DEV, gen=armed.gen, epoch=1, job_id="job1", submitter="sub-job1")
    assert book.release_done(DEV, armed.gen, ok=True) == ReleaseFinished(DEV, True, True, "job1")
    assert not _lease_held(book)


def test_only_acquire_hook_configured_releases_without_running_a_hook() -> None:
    """§4.4 fire_release step 3–4: no ``on_release`` → ``held = False`` directly."""
    book = _book(HookSpec(has_acquire=True, has_release=False, release_linger=1.0))
    armed = _job1_armed(book)
    assert book.fire_release(DEV, armed.gen, now=1.0) == ReleaseFinished(DEV, False, True, "job1")
    assert not _lease_held(book)
    assert book.startup_devices() == []


# -- §4.4 the device lock ------------------------------------------------------------------------


def test_device_lock_serialises_hooks_of_one_device() -> None:
    """§4.4: the lock is held for the whole hook; a job arriving mid-release waits for it."""
    book = _book()
    g = _acquire_ok(book, "job1")
    armed = _arm(book, "job1", g.epoch, now=0.0)
    release = _fired(book, armed, 1.0)
    assert book.begin_acquire(DEV, "job2", "b") == Blocked(DEV)
    assert book.schedule_release(DEV, "job1", "a", g.epoch, 1.0) == Blocked(DEV)
    assert book.begin_startup_release(DEV) == Blocked(DEV)
    book.release_done(DEV, release.gen, ok=True)
    # The release ran to completion: the next job's acquire is *not* skipped.
    assert isinstance(book.begin_acquire(DEV, "job2", "b"), RunAcquire)


def test_devices_never_wait_on_each_other() -> None:
    """§4.4: locks are per device."""
    book = LeaseBook([("h:gpu0", BOTH), ("h:gpu1", BOTH)])
    assert isinstance(book.begin_acquire("h:gpu0", "j0", "s"), RunAcquire)
    assert isinstance(book.begin_acquire("h:gpu1", "j1", "s"), RunAcquire)


def test_completion_that_does_not_match_the_running_hook_is_a_protocol_error() -> None:
    """§4.4: completions must answer the hook the lock is held for."""
    book = _book()
    with pytest.raises(LeaseProtocolError):
        book.acquire_done(DEV, 1, ok=True)
    action = book.begin_acquire(DEV, "job1", "a")
    assert isinstance(action, RunAcquire)
    with pytest.raises(LeaseProtocolError):
        book.acquire_done(DEV, action.epoch + 1, ok=True)
    with pytest.raises(LeaseProtocolError):
        book.release_done(DEV, 0, ok=True)
    with pytest.raises(LeaseProtocolError):
        book.acquire_done("nohooks:gpu0", 1, ok=True)


# -- §4.4 schedule_release -----------------------------------------------------------------------


def test_schedule_release_arms_a_timer_for_the_linger() -> None:
    """§4.4 schedule step 4: ``gen += 1``, remember job/submitter, due at now + linger."""
    book = _book()
    g = _acquire_ok(book, "job1")
    armed = _arm(book, "job1", g.epoch, now=100.0)
    assert armed.due_at == pytest.approx(100.3)
    assert (armed.job_id, armed.submitter) == ("job1", "sub-job1")
    assert book.next_due() == pytest.approx(100.3)
    assert book.due(100.29) == []
    assert book.due(100.3) == [(DEV, armed.gen)]


def test_schedule_release_replaces_an_existing_timer() -> None:
    """§4.4 schedule step 4: "stop any existing timer" — the older one is superseded."""
    book = _book()
    g = _acquire_ok(book, "job1")
    first = _arm(book, "job1", g.epoch, now=0.0)
    second = _arm(book, "job1", g.epoch, now=0.2)
    assert second.gen == first.gen + 1
    assert book.fire_release(DEV, first.gen, now=1.0) == Superseded(DEV)
    assert isinstance(book.fire_release(DEV, second.gen, now=1.0), RunRelease)


def test_schedule_release_with_a_stale_epoch_is_void() -> None:
    """§4.4 schedule step 3: a later job owns the device; nothing is armed."""
    book = _book()
    g1 = _acquire_ok(book, "job1")
    g2 = _acquire_ok(book, "job2")
    assert g2.epoch == g1.epoch + 1
    assert book.schedule_release(DEV, "job1", "a", g1.epoch, 0.0) == ReleaseSkipped(
        DEV, "stale-epoch"
    )
    assert book.drain_targets() == []


# -- §4.4 fire_release ---------------------------------------------------------------------------


def test_fire_release_with_a_stale_gen_is_superseded() -> None:
    """§4.4 fire step 2: ``gen != state.gen`` → return."""
    book = _book()
    armed = _job1_armed(book)
    assert book.fire_release(DEV, armed.gen - 1, now=5.0) == Superseded(DEV)
    assert _lease_held(book)


def test_fire_release_before_the_linger_elapsed_does_nothing() -> None:
    """GPU-safe reading of §4.4 linger: a timer waking early must not release."""
    book = _book()
    armed = _job1_armed(book)
    assert book.fire_release(DEV, armed.gen, now=0.1) == NotDue(DEV, armed.due_at)
    assert _lease_held(book)


def test_release_hook_failure_still_frees_the_device() -> None:
    """§4.4 fire step 3–4: failure is logged, never quarantines; ``held = False`` regardless."""
    book = _book()
    armed = _job1_armed(book)
    release = _fired(book, armed, 1.0)
    assert book.release_done(DEV, release.gen, ok=False) == ReleaseFinished(
        DEV, ran_hook=True, ok=False, job_id="job1"
    )
    assert not _lease_held(book)
    # Firing the same timer again is a no-op.
    assert book.fire_release(DEV, armed.gen, now=2.0) == Superseded(DEV)


# -- §4.4 "Release linger, precisely" and "Why epoch as well as gen" -----------------------------


def test_back_to_back_jobs_within_linger_produce_one_acquire_one_release() -> None:
    """§4.4 release linger; checklist 39: one acquire (job1), one release naming job2."""
    book = _book()
    a1 = book.begin_acquire(DEV, "job1", "a")
    assert isinstance(a1, RunAcquire)
    g1 = book.acquire_done(DEV, a1.epoch, ok=True)
    assert isinstance(g1, Granted)
    t1 = _arm(book, "job1", g1.epoch, now=0.0)
    g2 = book.begin_acquire(DEV, "job2", "b")
    assert g2 == Granted(DEV, epoch=g1.epoch + 1, ran_hook=False)
    t2 = _arm(book, "job2", g2.epoch, now=0.05)
    assert book.fire_release(DEV, t1.gen, now=0.3) == Superseded(DEV)
    assert book.fire_release(DEV, t2.gen, now=0.15) == NotDue(DEV, t2.due_at)
    release = book.fire_release(DEV, t2.gen, now=t2.due_at)
    assert isinstance(release, RunRelease)
    assert (release.job_id, release.submitter) == ("job2", "sub-job2")


def test_delayed_release_from_a_finished_job_never_fires_during_the_next_job() -> None:
    """§4.4 "Why epoch as well as gen"; checklist 40 (commit 1797146)."""
    book = _book()
    g1 = _acquire_ok(book, "job1")
    g2 = _acquire_ok(book, "job2")  # job1's report was slow; job2 skipped the hook
    assert not g2.ran_hook
    late = book.schedule_release(DEV, "job1", "a", g1.epoch, now=0.0)
    assert late == ReleaseSkipped(DEV, "stale-epoch")
    assert book.due(1000.0) == []
    armed = _arm(book, "job2", g2.epoch, now=1.0)
    release = _fired(book, armed, 2.0)
    assert release.job_id == "job2"
    assert release.epoch == g2.epoch


def test_job_after_linger_elapsed_gets_its_own_acquire() -> None:
    """§4.4 release linger; checklist 41: once released, the next job runs ``on_acquire``."""
    book = _book()
    g1 = _acquire_ok(book, "job1")
    armed = _arm(book, "job1", g1.epoch, now=0.0)
    release = _fired(book, armed, 0.3)
    book.release_done(DEV, release.gen, ok=True)
    assert isinstance(book.begin_acquire(DEV, "job2", "b"), RunAcquire)


# -- §4.7 shutdown drain -------------------------------------------------------------------------


def test_shutdown_drain_fires_pending_releases_immediately() -> None:
    """§4.7: stop the timer, ``gen += 1``, fire now; devices with nothing pending cost nothing."""
    book = LeaseBook([("h:gpu0", BOTH), ("h:gpu1", BOTH), ("h:gpu2", BOTH)])
    g0 = _acquire_ok(book, "j0", "h:gpu0")
    _acquire_ok(book, "j1", "h:gpu1")  # still running at drain time: not a drain target
    g2 = _acquire_ok(book, "j2", "h:gpu2")
    t2 = _arm(book, "j2", g2.epoch, now=0.0, device="h:gpu2")
    t0 = _arm(book, "j0", g0.epoch, now=0.0, device="h:gpu0")
    assert book.drain_targets() == ["h:gpu0", "h:gpu2"]
    for device, timer in (("h:gpu0", t0), ("h:gpu2", t2)):
        release = book.drain(device)
        assert isinstance(release, RunRelease)
        assert release.gen == timer.gen + 1
        # The timer task, if it was already past its sleep, is void now.
        assert book.fire_release(device, timer.gen, now=100.0) == Blocked(device)
        book.release_done(device, release.gen, ok=device == "h:gpu0")  # gpu2 cut short
        assert book.fire_release(device, timer.gen, now=100.0) == Superseded(device)
        assert not _lease_held(book, device)
    assert book.drain_targets() == []
    assert book.drain("h:gpu1") == Superseded("h:gpu1")
    assert _lease_held(book, "h:gpu1")


def test_shutdown_drain_of_a_device_without_on_release_just_frees_it() -> None:
    """§4.7 + §4.4 fire step 4 without a hook."""
    book = _book(HookSpec(has_acquire=True, has_release=False))
    g = _acquire_ok(book, "job1")
    _arm(book, "job1", g.epoch, now=0.0)
    assert book.drain(DEV) == ReleaseFinished(DEV, ran_hook=False, ok=True, job_id="job1")
    assert not _lease_held(book)


# -- §4.6 startup reconciliation pass ------------------------------------------------------------


def test_startup_pass_runs_every_release_hook_in_declared_order_without_touching_held() -> None:
    """§4.6: every device's ``on_release`` once, declared order, empty job/submitter."""
    only_acquire = HookSpec(has_acquire=True, has_release=False)
    book = LeaseBook(
        [
            ("h:gpu2", BOTH),
            ("h:gpu0", only_acquire),
            ("h:gpu1", HookSpec(False, True)),
            ("h:gpu3", HookSpec(False, False)),
        ]
    )
    assert book.startup_devices() == ["h:gpu2", "h:gpu1"]
    for device in book.startup_devices():
        lease = book.lease(device)
        assert lease is not None
        before = attrs.asdict(lease)
        action = book.begin_startup_release(device)
        assert action == RunStartupRelease(device, job_id="", submitter="")
        assert book.begin_acquire(device, "j", "s") == Blocked(device)
        book.startup_release_done(device)
        assert attrs.asdict(lease) == before
    assert book.begin_startup_release("h:gpu0") == Superseded("h:gpu0")
    assert book.begin_startup_release("h:gpu3") == Superseded("h:gpu3")


def test_hook_spec_rejects_a_negative_or_infinite_linger() -> None:
    """§4.1: linger is a duration; the shell resolves defaults before building the book."""
    with pytest.raises(ValueError):
        HookSpec(True, True, release_linger=-1.0)
    with pytest.raises(ValueError):
        HookSpec(True, True, release_linger=float("inf"))
    with pytest.raises(ValueError):
        LeaseBook([(DEV, BOTH), (DEV, BOTH)])


# -- the stateful model --------------------------------------------------------------------------


@attrs.define
class _Job:
    job_id: str
    device: str
    phase: str  # waiting | acquiring | running | ended | done
    epoch: int = 0


@attrs.define
class _World:
    """What the shell has observed for one device, independent of the book's internals."""

    spec: HookSpec
    held: bool = False
    hook_acquired: bool = False
    grants_from_free: int = 0
    releases: int = 0
    releases_since_grant: int = 0
    last_grant: tuple[str, int] | None = None
    hook: RunAcquire | RunRelease | None = None
    timers: list[ArmRelease] = attrs.Factory(list)


_SPECS = st.builds(
    HookSpec,
    has_acquire=st.booleans(),
    has_release=st.booleans(),
    release_linger=st.sampled_from([0.0, 0.5, 1.0, 5.0]),
)


class LeaseMachine(RuleBasedStateMachine):
    """Random job starts/ends, slow terminal reports, timers, hook outcomes, then shutdown."""

    def __init__(self) -> None:
        super().__init__()
        self.book = LeaseBook([])
        self.world: dict[str, _World] = {}
        self.jobs: list[_Job] = []
        self.now = 0.0
        self.shut_down = False
        self.counter = 0

    @initialize(specs=st.lists(_SPECS, min_size=1, max_size=3))
    def setup(self, specs: list[HookSpec]) -> None:
        pairs = [(f"gpubox:gpu{i}", spec) for i, spec in enumerate(specs)]
        self.book = LeaseBook(pairs)
        self.world = {device: _World(spec) for device, spec in pairs}

    # -- helpers --

    def _jobs(self, *phases: str) -> list[_Job]:
        return [j for j in self.jobs if j.phase in phases]

    def _free_devices(self) -> list[str]:
        busy = {j.device for j in self._jobs("waiting", "acquiring", "running")}
        return [d for d in self.world if d not in busy]

    def _granted(self, job: _Job, g: Granted) -> None:
        w = self.world[job.device]
        assert w.hook is None or w.hook.job_id == job.job_id
        if not w.spec.configured:
            assert g.epoch == 0 and not g.ran_hook
        else:
            if not w.held:
                w.grants_from_free += 1
                w.releases_since_grant = 0
            w.held = True
            w.last_grant = (job.job_id, g.epoch)
            lease = self.book.lease(job.device)
            assert lease is not None and lease.epoch == g.epoch
        job.phase, job.epoch = "running", g.epoch

    def _try_acquire(self, job: _Job) -> None:
        w = self.world[job.device]
        lease = self.book.lease(job.device)
        pending_before = lease is not None and lease.pending is not None
        action = self.book.begin_acquire(job.device, job.job_id, "sub")
        if isinstance(action, Blocked):
            assert w.hook is not None, "blocked although no hook runs"
            return
        if pending_before:
            # Back-to-back within the linger: no extra release, no extra acquire.
            assert action == Granted(job.device, action.epoch, ran_hook=False)
        if isinstance(action, RunAcquire):
            # Never two overlapping acquires without a release in between.
            assert not w.held and not w.hook_acquired
            assert w.spec.has_acquire
            w.hook = action
            job.phase = "acquiring"
            return
        if w.spec.configured and not w.held:
            assert not w.spec.has_acquire, "on_acquire skipped for a free device"
        self._granted(job, action)

    def _release_started(self, device: str, job_id: str, epoch: int | None) -> None:
        w = self.world[device]
        assert w.held, "released a device that is not held"
        assert not self._jobs_holding(device), "release fired while a job holds the device"
        assert w.last_grant is not None and w.last_grant[0] == job_id, "release names a stale job"
        if epoch is not None:
            assert epoch == w.last_grant[1], "release is not for the current epoch"

    def _jobs_holding(self, device: str) -> list[_Job]:
        return [j for j in self._jobs("running") if j.device == device]

    def _release_finished(self, device: str) -> None:
        w = self.world[device]
        w.held = False
        w.hook_acquired = False
        w.hook = None
        w.releases += 1
        w.releases_since_grant += 1

    def _handle_fire(self, device: str, action: object) -> None:
        w = self.world[device]
        if isinstance(action, RunRelease):
            self._release_started(device, action.job_id, action.epoch)
            assert w.spec.has_release
            w.hook = action
        elif isinstance(action, ReleaseFinished):
            self._release_started(device, action.job_id, None)
            assert not action.ran_hook and not w.spec.has_release
            self._release_finished(device)
        elif isinstance(action, Blocked):
            assert w.hook is not None
        else:
            assert isinstance(action, (Superseded, NotDue))

    # -- rules --

    @precondition(lambda self: not self.shut_down and self._free_devices())
    @rule(data=st.data())
    def start_job(self, data: st.DataObject) -> None:
        # The controller hands out one job per device at a time.
        device = data.draw(st.sampled_from(self._free_devices()))
        self.counter += 1
        job = _Job(f"job{self.counter}", device, "waiting")
        self.jobs.append(job)
        self._try_acquire(job)

    @precondition(lambda self: not self.shut_down and self._jobs("waiting"))
    @rule()
    def retry_waiting(self) -> None:
        for job in self._jobs("waiting"):
            self._try_acquire(job)

    @precondition(lambda self: not self.shut_down and self._jobs("acquiring"))
    @rule(data=st.data(), ok=st.booleans())
    def complete_acquire(self, data: st.DataObject, ok: bool) -> None:
        jobs = self._jobs("acquiring")
        if not jobs:
            return
        job = data.draw(st.sampled_from(jobs))
        w = self.world[job.device]
        assert isinstance(w.hook, RunAcquire)
        result = self.book.acquire_done(job.device, w.hook.epoch, ok)
        w.hook = None
        if isinstance(result, AcquireFailed):
            assert not ok
            job.phase = "done"  # no release scheduled (§4.5)
            return
        assert ok and result.ran_hook
        w.hook_acquired = True
        self._granted(job, result)

    @precondition(lambda self: not self.shut_down and self._jobs("running"))
    @rule(data=st.data())
    def end_job(self, data: st.DataObject) -> None:
        jobs = self._jobs("running")
        if jobs:
            data.draw(st.sampled_from(jobs)).phase = "ended"

    @precondition(lambda self: not self.shut_down and self._jobs("ended"))
    @rule(data=st.data())
    def terminal_report(self, data: st.DataObject) -> None:
        """The (possibly slow) terminal report lands; ``schedule_release`` follows."""
        jobs = self._jobs("ended")
        if jobs:
            self._schedule(data.draw(st.sampled_from(jobs)))

    def _schedule(self, job: _Job) -> None:
        w = self.world[job.device]
        action = self.book.schedule_release(job.device, job.job_id, "sub", job.epoch, self.now)
        if isinstance(action, Blocked):
            assert w.hook is not None
            return
        job.phase = "done"
        if isinstance(action, ArmRelease):
            assert w.held and w.last_grant == (job.job_id, job.epoch)
            assert not self._jobs_holding(job.device)
            assert action.due_at == self.now + w.spec.release_linger
            w.timers.append(action)
        elif not w.spec.configured:
            assert action == ReleaseSkipped(job.device, "no-hooks")
        elif w.last_grant is not None and w.last_grant[0] != job.job_id and w.held:
            assert action == ReleaseSkipped(job.device, "stale-epoch")

    @rule(dt=st.sampled_from([0.0, 0.1, 0.5, 1.0, 3.0, 10.0]))
    def advance(self, dt: float) -> None:
        self.now += dt

    @precondition(lambda self: any(w.timers for w in self.world.values()))
    @rule(data=st.data())
    def timer_wakes(self, data: st.DataObject) -> None:
        """Any timer task ever armed wakes now (it may be stale or early)."""
        armed = [(d, t) for d, w in self.world.items() for t in w.timers]
        if not armed:
            return
        device, timer = data.draw(st.sampled_from(armed))
        action = self.book.fire_release(device, timer.gen, self.now)
        if self.shut_down:
            assert isinstance(action, Superseded), "a timer fired after the drain"
        if self.now < timer.due_at:
            assert isinstance(action, (NotDue, Superseded, Blocked)), "released early"
        if not isinstance(action, (NotDue, Blocked)):
            self.world[device].timers.remove(timer)
        self._handle_fire(device, action)

    @precondition(lambda self: self.book.next_due() is not None)
    @rule()
    def due_releases_fire(self) -> None:
        """A single-timer shell: fire whatever :meth:`LeaseBook.due` reports."""
        for device, gen in self.book.due(self.now):
            action = self.book.fire_release(device, gen, self.now)
            assert isinstance(action, (RunRelease, ReleaseFinished))
            self._handle_fire(device, action)

    @precondition(
        lambda self: (
            not self.shut_down and any(isinstance(w.hook, RunRelease) for w in self.world.values())
        )
    )
    @rule(data=st.data(), ok=st.booleans())
    def complete_release(self, data: st.DataObject, ok: bool) -> None:
        running = [d for d, w in self.world.items() if isinstance(w.hook, RunRelease)]
        if not running:
            return
        device = data.draw(st.sampled_from(running))
        hook = self.world[device].hook
        assert isinstance(hook, RunRelease)
        assert self.book.release_done(device, hook.gen, ok).job_id == hook.job_id
        self._release_finished(device)

    @precondition(lambda self: not self.shut_down and self.counter >= 4)
    @rule(data=st.data())
    def shutdown(self, data: st.DataObject) -> None:
        """§4.7 with drawn hook outcomes and report order."""
        self._shutdown(
            lambda: data.draw(st.booleans()), lambda jobs: data.draw(st.permutations(jobs))
        )

    def teardown(self) -> None:
        """Every run ends with a shutdown drain (deterministic outcomes)."""
        if not self.shut_down:
            self._shutdown(lambda: True, list)

    def _shutdown(
        self, outcome: Callable[[], bool], order: Callable[[list[_Job]], list[_Job]]
    ) -> None:
        """§4.7: jobs finish, reports land, then every armed release is drained."""
        for device, w in self.world.items():
            if isinstance(w.hook, RunAcquire):
                job = next(j for j in self._jobs("acquiring") if j.device == device)
                result = self.book.acquire_done(device, w.hook.epoch, outcome())
                w.hook = None
                if isinstance(result, Granted):
                    w.hook_acquired = True
                    self._granted(job, result)
                else:
                    job.phase = "done"
            elif isinstance(w.hook, RunRelease):
                self.book.release_done(device, w.hook.gen, outcome())
                self._release_finished(device)
        for job in self._jobs("waiting"):
            job.phase = "done"  # never started
        for job in self._jobs("running"):
            job.phase = "ended"
        for job in order(self._jobs("ended")):
            self._schedule(job)
        assert not self._jobs("ended")
        for device in self.book.drain_targets():
            action = self.book.drain(device)
            if isinstance(action, RunRelease):
                self._release_started(device, action.job_id, action.epoch)
                self.book.release_done(device, action.gen, outcome())
                self._release_finished(device)
            else:
                self._handle_fire(device, action)
                assert isinstance(action, ReleaseFinished)
        assert self.book.drain_targets() == []
        for device, w in self.world.items():
            assert not w.held, f"{device} still held after the drain"
            if w.grants_from_free:
                assert w.releases_since_grant == 1, f"{device}: not exactly one final release"
        self.shut_down = True

    # -- invariants --

    @invariant()
    def book_matches_the_world(self) -> None:
        for device, w in self.world.items():
            lease = self.book.lease(device)
            if not w.spec.configured:
                assert lease is None
                continue
            assert lease is not None
            assert lease.held == w.held
            assert lease.locked == (w.hook is not None)
            if lease.pending is not None:
                assert lease.held and not lease.locked
                assert lease.pending.gen == lease.gen
            # Acquires and releases alternate.
            assert w.grants_from_free - w.releases in (0, 1)
            assert w.grants_from_free - w.releases == int(w.held)

    @invariant()
    def no_release_pending_or_running_while_a_job_holds_the_device(self) -> None:
        for device, w in self.world.items():
            if self._jobs_holding(device):
                lease = self.book.lease(device)
                assert not isinstance(w.hook, RunRelease)
                assert lease is None or lease.pending is None


LeaseMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestLeaseMachine = LeaseMachine.TestCase
