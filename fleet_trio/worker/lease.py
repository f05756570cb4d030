"""Sans-IO lease-hook bookkeeping: worker-process.md §4.4 (with the state parts of §4.6, §4.7).

(Over 500 lines: one sans-IO state machine with its decisions as small frozen values, checked as a
whole by Hypothesis.)

This module is the *decision* half of the per-device ``on_acquire`` / ``on_release`` machinery.
It performs no I/O, starts no tasks, and never reads a clock: every method that depends on time
takes ``now`` (seconds, any monotonic origin the caller likes, e.g. ``trio.current_time()``).
Methods return frozen *actions* that the trio shell executes (run a hook, arm a timer) and the
shell reports each hook's completion back. All state lives in one :class:`LeaseBook` instance.

Model (§4.4). A device with neither hook has **no** state (§4.1); every call about it is a cheap
no-op. A device with hooks has one :class:`DeviceLease`:

* ``held`` — the device is acquired (``on_acquire`` succeeded, or no ``on_acquire`` exists) and
  not yet released;
* ``epoch`` — bumped by every *successful* acquire, hook or not; the job that got epoch ``e``
  owns the device until a later acquire bumps it. A release armed with a stale epoch is void
  (commit 1797146: a slow terminal report of job1 must not release job2's device);
* ``gen`` — bumped whenever a pending release timer is stopped or replaced, so a timer that
  was already past its sleep when it was stopped finds ``gen`` changed and does nothing;
* ``pending`` — the armed release (gen, due time, job id/submitter to name in ``RC_JOB_ID`` /
  ``RC_SUBMITTER``), or ``None``;
* ``running`` — the hook currently executing, or ``None``. This is the device lock of §4.4:
  "the device lock is held for the whole duration of any hook on that device". Any call that
  would take the lock while a hook runs returns :class:`Blocked`; the shell holds its own
  ``trio.Lock`` across ``begin_* … *_done`` so it never actually sees ``Blocked`` — the value
  exists so that a misuse is visible instead of silently interleaving two hooks.

Release linger: ``schedule_release`` arms a timer due at ``now + release_linger``; an acquire
before it fires drops it *and* skips ``on_acquire`` (the device was never released), so a burst
of back-to-back jobs yields one ``on_acquire`` (first job) and one ``on_release`` (naming the
last job).

Decisions taken where the spec is silent or ambiguous (always the GPU-safe reading):

* ``fire_release`` refuses a timer that wakes *before* its due time (:class:`NotDue`) — a
  release must never run early while a next job could still arrive within the linger. The
  shutdown drain (§4.7) is the only path that fires early, and it does so through
  :meth:`LeaseBook.drain`, which bumps ``gen`` first exactly as the spec says.
* ``schedule_release`` while a hook of the same device runs returns :class:`Blocked` (in rc it
  waits for the lock and then re-evaluates; evaluating it mid-release would see ``held`` still
  true and arm a second release).
* The startup pass (§4.6) takes the device lock per hook (it is "any hook") but never touches
  ``held``/``epoch``/``gen``/``pending``.
* A failed or cut-short release still clears ``held`` (§4.4 fire_release step 4); the next
  startup pass re-runs ``on_release`` (§4.6, §4.7), which is why release hooks are idempotent.
* Completions (``acquire_done`` / ``release_done`` / ``startup_release_done``) that do not
  match the running hook are programming errors and raise :class:`LeaseProtocolError`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Literal, TypeAlias

import attrs

__all__ = [
    "AcquireAction",
    "AcquireFailed",
    "ArmRelease",
    "Blocked",
    "DeviceLease",
    "FireAction",
    "Granted",
    "HookSpec",
    "LeaseBook",
    "LeaseProtocolError",
    "NotDue",
    "PendingRelease",
    "ReleaseFinished",
    "ReleaseSkipped",
    "RunAcquire",
    "RunRelease",
    "RunStartupRelease",
    "ScheduleAction",
    "Superseded",
]


class LeaseProtocolError(RuntimeError):
    """The shell reported a completion that does not match the hook the book thinks is running."""


def _non_negative_finite(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{attribute.name} must be a finite number >= 0, got {value!r}")


@attrs.frozen
class HookSpec:
    """The hooks configured for one device (§4.1), already resolved against host defaults."""

    has_acquire: bool
    has_release: bool
    release_linger: float = attrs.field(default=30.0, validator=_non_negative_finite)
    """Seconds between a job's end and ``on_release`` (§4.4 "Release linger")."""

    @property
    def configured(self) -> bool:
        """A device with neither hook allocates no hook state at all (§4.1)."""
        return self.has_acquire or self.has_release


# -- actions / results ---------------------------------------------------------------------------


@attrs.frozen
class Blocked:
    """A hook of ``device`` is running; the device lock is taken (§4.4). Retry after it ends."""

    device: str


@attrs.frozen
class Granted:
    """The job may run on ``device``; it owns it under ``epoch`` (0 = no hooks, §4.4 step 1)."""

    device: str
    epoch: int
    ran_hook: bool


@attrs.frozen
class RunAcquire:
    """Run ``on_acquire`` under the job's stop token, then call :meth:`LeaseBook.acquire_done`.

    ``epoch`` is the epoch the job will own if the hook succeeds (§4.4 acquire step 5).
    """

    device: str
    epoch: int
    job_id: str
    submitter: str


@attrs.frozen
class AcquireFailed:
    """``on_acquire`` failed: ``held`` stays false, the returned epoch is 0 (§4.4 step 5, §4.5)."""

    device: str


AcquireAction: TypeAlias = Granted | RunAcquire | Blocked


@attrs.frozen
class ArmRelease:
    """Arm (or re-arm, replacing any earlier timer) the release timer (§4.4 schedule step 4).

    The shell sleeps until ``due_at`` and then calls :meth:`LeaseBook.fire_release` with ``gen``.
    """

    device: str
    gen: int
    due_at: float
    job_id: str
    submitter: str


ReleaseSkipReason = Literal["no-hooks", "not-held", "stale-epoch"]


@attrs.frozen
class ReleaseSkipped:
    """Nothing armed (§4.4 schedule steps 1–3). ``stale-epoch`` is the INFO-logged case."""

    device: str
    reason: ReleaseSkipReason


ScheduleAction: TypeAlias = ArmRelease | ReleaseSkipped | Blocked


@attrs.frozen
class RunRelease:
    """Run ``on_release`` (no stop token; bounded only by the hook timeout, or by the drain).

    Names the job whose end armed the release (§4.3). Call :meth:`LeaseBook.release_done`.
    ``epoch`` is the ownership epoch being released (always the device's current epoch).
    """

    device: str
    gen: int
    epoch: int
    job_id: str
    submitter: str


@attrs.frozen
class ReleaseFinished:
    """The device is released: ``held`` is false now (§4.4 fire_release step 4).

    ``ran_hook`` is false when the device has no ``on_release``; ``ok`` is the hook's result (a
    failure is ERROR-logged by the shell and never quarantines the device).
    """

    device: str
    ran_hook: bool
    ok: bool
    job_id: str


@attrs.frozen
class Superseded:
    """The timer's ``gen`` is stale, or nothing is pending: do nothing (§4.4 fire step 2)."""

    device: str


@attrs.frozen
class NotDue:
    """The timer woke before ``due_at``; sleep again until then (GPU-safe reading, see module)."""

    device: str
    due_at: float


FireAction: TypeAlias = RunRelease | ReleaseFinished | Superseded | NotDue | Blocked


@attrs.frozen
class RunStartupRelease:
    """Startup pass hook (§4.6): ``RC_JOB_ID=""``, ``RC_SUBMITTER=""``; does not touch ``held``."""

    device: str
    job_id: str = ""
    submitter: str = ""


# -- per-device state ----------------------------------------------------------------------------


@attrs.frozen
class PendingRelease:
    """An armed release timer (§4.4: ``timer``, ``pending_job_id``, ``pending_submitter``)."""

    gen: int
    due_at: float
    job_id: str
    submitter: str


@attrs.frozen
class _Running:
    kind: Literal["acquire", "release", "startup"]
    token: int
    """acquire: the prospective epoch; release: the gen being fired; startup: 0."""
    job_id: str = ""


@attrs.define
class DeviceLease:
    """Mutable state of one device that has hooks (§4.4). Read it; mutate it via the book."""

    device: str
    spec: HookSpec
    held: bool = False
    gen: int = 0
    epoch: int = 0
    pending: PendingRelease | None = None
    running: _Running | None = None

    @property
    def locked(self) -> bool:
        """True while a hook of this device runs (the device lock of §4.4 is taken)."""
        return self.running is not None


# -- the book ------------------------------------------------------------------------------------


class LeaseBook:
    """All devices' lease state (§4.4). Devices keep their declared order (§4.6 SHOULD)."""

    def __init__(self, specs: Iterable[tuple[str, HookSpec]]) -> None:
        """Build from ``(device id "host:name", spec)`` pairs in declared order.

        Devices with neither hook get no :class:`DeviceLease` (§4.1 "no hook state at all").
        """
        self._specs: dict[str, HookSpec] = {}
        self._leases: dict[str, DeviceLease] = {}
        for device, spec in specs:
            if device in self._specs:
                raise ValueError(f"duplicate device {device!r}")
            self._specs[device] = spec
            if spec.configured:
                self._leases[device] = DeviceLease(device=device, spec=spec)

    # -- introspection --

    def lease(self, device: str) -> DeviceLease | None:
        """The device's state, or ``None`` when it has no hooks (§4.4 acquire step 1)."""
        return self._leases.get(device)

    def leases(self) -> Iterator[DeviceLease]:
        """Every device with hook state, in declared order."""
        return iter(self._leases.values())

    def next_due(self) -> float | None:
        """The earliest pending release's due time, for a shell that runs one timer task."""
        dues = [s.pending.due_at for s in self._leases.values() if s.pending is not None]
        return min(dues) if dues else None

    def due(self, now: float) -> list[tuple[str, int]]:
        """``(device, gen)`` of every pending release due at ``now`` (declared order)."""
        return [
            (s.device, s.pending.gen)
            for s in self._leases.values()
            if s.pending is not None and s.pending.due_at <= now
        ]

    # -- acquire (§4.4 acquire_device) --

    def begin_acquire(self, device: str, job_id: str, submitter: str) -> AcquireAction:
        """Steps 1–5 of ``acquire_device`` (§4.4), up to running ``on_acquire``.

        1. no hooks → ``Granted(epoch=0, ran_hook=False)``, no state created;
        2. (lock) drop any pending release, ``gen += 1``;
        3. already ``held`` → skip the hook, ``epoch += 1``, ``Granted``;
        4. no ``on_acquire`` → ``held``, ``epoch += 1``, ``Granted``;
        5. otherwise → :class:`RunAcquire`; the shell runs the hook and reports
           :meth:`acquire_done`. The device stays locked until then.

        While another hook of the device runs, returns :class:`Blocked` and changes nothing.
        """
        state = self._leases.get(device)
        if state is None:
            return Granted(device=device, epoch=0, ran_hook=False)
        if state.running is not None:
            return Blocked(device)
        state.pending = None
        state.gen += 1
        if state.held or not state.spec.has_acquire:
            state.held = True
            state.epoch += 1
            return Granted(device=device, epoch=state.epoch, ran_hook=False)
        epoch = state.epoch + 1
        state.running = _Running(kind="acquire", token=epoch, job_id=job_id)
        return RunAcquire(device=device, epoch=epoch, job_id=job_id, submitter=submitter)

    def acquire_done(self, device: str, epoch: int, ok: bool) -> Granted | AcquireFailed:
        """Completion of :class:`RunAcquire` (§4.4 acquire step 5); releases the device lock.

        Success → ``held``, ``epoch`` becomes the announced one, ``Granted(ran_hook=True)``.
        Failure (including a hook cut short by the job's own stop, §4.5) → ``held`` stays
        false, :class:`AcquireFailed` (epoch 0); the shell must not schedule a release.
        """
        state = self._expect(device, "acquire", epoch)
        state.running = None
        if not ok:
            return AcquireFailed(device)
        state.held = True
        state.epoch = epoch
        return Granted(device=device, epoch=epoch, ran_hook=True)

    # -- release (§4.4 schedule_release / fire_release) --

    def schedule_release(
        self, device: str, job_id: str, submitter: str, epoch: int, now: float
    ) -> ScheduleAction:
        """``schedule_release`` (§4.4), called after every job end, after the terminal report.

        1. no hooks → ``ReleaseSkipped("no-hooks")``;
        2. not ``held`` → ``ReleaseSkipped("not-held")`` (acquire never succeeded);
        3. ``epoch`` is not the current one → ``ReleaseSkipped("stale-epoch")`` — a later job
           owns the device; the shell INFO-logs "release skipped: the device was re-acquired
           by a later job";
        4. replace any pending timer, ``gen += 1``, remember job id/submitter, and return
           :class:`ArmRelease` due at ``now + release_linger``.
        """
        state = self._leases.get(device)
        if state is None:
            return ReleaseSkipped(device=device, reason="no-hooks")
        if state.running is not None:
            return Blocked(device)
        if not state.held:
            return ReleaseSkipped(device=device, reason="not-held")
        if epoch != state.epoch:
            return ReleaseSkipped(device=device, reason="stale-epoch")
        state.gen += 1
        pending = PendingRelease(
            gen=state.gen,
            due_at=now + state.spec.release_linger,
            job_id=job_id,
            submitter=submitter,
        )
        state.pending = pending
        return ArmRelease(
            device=device,
            gen=pending.gen,
            due_at=pending.due_at,
            job_id=job_id,
            submitter=submitter,
        )

    def fire_release(self, device: str, gen: int, now: float) -> FireAction:
        """The linger timer fired (§4.4 ``fire_release``).

        1. (lock) a running hook → :class:`Blocked`;
        2. ``gen`` differs or nothing pending → :class:`Superseded`;
           woke before ``due_at`` → :class:`NotDue` (GPU-safe reading, see module docstring);
        3. clear the timer; with ``on_release`` → :class:`RunRelease` (device locked until
           :meth:`release_done`); without → ``held = False`` and :class:`ReleaseFinished`.
        """
        state = self._leases.get(device)
        if state is None:
            return Superseded(device)
        if state.running is not None:
            return Blocked(device)
        pending = state.pending
        if pending is None or gen != state.gen or gen != pending.gen:
            return Superseded(device)
        if now < pending.due_at:
            return NotDue(device=device, due_at=pending.due_at)
        return self._fire(state, pending)

    def release_done(self, device: str, gen: int, ok: bool) -> ReleaseFinished:
        """Completion of :class:`RunRelease` (§4.4 fire_release steps 3–4).

        ``held = False`` whatever ``ok`` says: a failed release is logged, never quarantines,
        and the device stays schedulable. Releases the device lock.
        """
        state = self._expect(device, "release", gen)
        job_id = state.running.job_id if state.running is not None else ""
        state.running = None
        state.held = False
        return ReleaseFinished(device=device, ran_hook=True, ok=ok, job_id=job_id)

    # -- shutdown drain (§4.7) --

    def drain_targets(self) -> list[str]:
        """Devices with an armed-but-unfired release, declared order (§4.7; others cost nothing)."""
        return [s.device for s in self._leases.values() if s.pending is not None]

    def drain(self, device: str) -> RunRelease | ReleaseFinished | Superseded | Blocked:
        """Fire ``device``'s pending release now (§4.7): stop the timer, ``gen += 1``, fire.

        The shell runs the returned :class:`RunRelease` under the shared 20 s drain budget and
        reports :meth:`release_done`; a release the budget cuts short is reported ``ok=False``
        (``held`` still clears; the next startup pass redoes it). Nothing pending →
        :class:`Superseded`. A running hook → :class:`Blocked` (wait for the lock, retry).
        """
        state = self._leases.get(device)
        if state is None or state.pending is None:
            return Superseded(device)
        if state.running is not None:
            return Blocked(device)
        state.gen += 1
        pending = attrs.evolve(state.pending, gen=state.gen)
        return self._fire(state, pending)

    # -- startup reconciliation pass (§4.6) --

    def startup_devices(self) -> list[str]:
        """Devices whose ``on_release`` the startup pass runs, in declared order (§4.6)."""
        return [s.device for s in self._leases.values() if s.spec.has_release]

    def begin_startup_release(self, device: str) -> RunStartupRelease | Superseded | Blocked:
        """Take the device lock for the startup ``on_release`` (§4.6).

        Never touches ``held``/``epoch``/``gen``/``pending``. No ``on_release`` →
        :class:`Superseded` (nothing to run).
        """
        state = self._leases.get(device)
        if state is None or not state.spec.has_release:
            return Superseded(device)
        if state.running is not None:
            return Blocked(device)
        state.running = _Running(kind="startup", token=0)
        return RunStartupRelease(device=device)

    def startup_release_done(self, device: str) -> None:
        """The startup hook ended (any outcome: failures are logged, never fatal, §4.6)."""
        state = self._expect(device, "startup", 0)
        state.running = None

    # -- internals --

    def _fire(self, state: DeviceLease, pending: PendingRelease) -> RunRelease | ReleaseFinished:
        state.pending = None
        if not state.spec.has_release:
            state.held = False
            return ReleaseFinished(
                device=state.device, ran_hook=False, ok=True, job_id=pending.job_id
            )
        state.running = _Running(kind="release", token=pending.gen, job_id=pending.job_id)
        return RunRelease(
            device=state.device,
            gen=pending.gen,
            epoch=state.epoch,
            job_id=pending.job_id,
            submitter=pending.submitter,
        )

    def _expect(
        self, device: str, kind: Literal["acquire", "release", "startup"], token: int
    ) -> DeviceLease:
        state = self._leases.get(device)
        running = None if state is None else state.running
        if state is None or running is None or running.kind != kind or running.token != token:
            raise LeaseProtocolError(
                f"{device}: {kind} completion (token {token}) does not match running hook "
                f"{running!r}"
            )
        return state
