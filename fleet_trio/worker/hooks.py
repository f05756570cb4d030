"""Lease hooks, verify and the release linger on the host: the trio shell around
:class:`~fleet_trio.worker.lease.LeaseBook` (worker-process.md §4, §5).

``HostHooks`` is what :class:`~fleet_trio.worker.worker.Worker` uses by default. It implements
the worker's hook seams (``acquire`` / ``verify`` / ``release``) and three lifecycle pieces the
worker calls at the points of worker-protocol.md §4.1 / §4.3:

* ``serve`` — a service task: the release-linger timers, each firing shielded and bounded by
  the device's hook timeout;
* ``startup_pass`` — before the first poll: every ``on_release`` once, within 2 min (§4.6);
* ``drain`` — at shutdown, after the jobs: the armed releases now, within 20 s (§4.7).

All decisions live in the sans-IO book; this module only runs hooks (``run_hook``, §4.2, through
:func:`fleet_trio.proc.run`: own process group, combined output, 10 s grace, no sweep) and holds
one ``trio.Lock`` per device across each hook, which is the device lock of §4.4 (hooks of one
device are serialised; devices never wait on each other).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

import trio

from fleet_trio import proc
from fleet_trio.durations import SECOND
from fleet_trio.proc.scripts import report_escapees
from fleet_trio.proc.sinks import TailBuffer
from fleet_trio.worker.client import Assignment
from fleet_trio.worker.config import DeviceConfig, WorkerConfig, hook_env
from fleet_trio.worker.lease import (
    ArmRelease,
    Granted,
    HookSpec,
    LeaseBook,
    ReleaseSkipped,
    RunAcquire,
    RunRelease,
    RunStartupRelease,
)
from fleet_trio.worker.verify import verify_assignment

if TYPE_CHECKING:
    from fleet_trio.proc.containment import AnyContainment
    from fleet_trio.worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)

HOOK_GRACE = 10.0
"""SIGTERM → SIGKILL grace for hooks (§4.2: the default job grace)."""
OUTPUT_TAIL = 4096
"""The hook output kept: the last 4096 bytes, what the failure reason carries (§4.2, §4.5)."""
STARTUP_PASS_BUDGET = 120.0
"""§4.6: the whole startup release pass."""
DRAIN_BUDGET = 20.0
"""§4.7: the shutdown release drain, all devices together."""


def hook_error(path: str, result: proc.Result) -> str | None:
    """§4.2, first matching rule: ``err`` → ``hook P: err``; killed → ``hook P: reason``
    (``killed`` when empty); non-zero exit → ``hook P: exited N``; else ``None``."""
    if result.err is not None:
        return f"hook {path}: {result.err}"
    if result.killed:
        return f"hook {path}: {result.reason or 'killed'}"
    if result.exit_code != 0:
        return f"hook {path}: exited {result.exit_code}"
    return None


async def run_hook(
    path: str,
    env: dict[str, str],
    max_runtime: float,
    stop: proc.StopToken | None = None,
    *,
    grace: float = HOOK_GRACE,
    metrics: WorkerMetrics | None = None,
    containment: AnyContainment | None = None,
) -> tuple[str | None, str]:
    """Run one hook (§4.2), ``max_runtime`` being the hook timeout: ``(error or None, output)``,
    the output being the last 4096 bytes of stdout+stderr. Success is DEBUG-logged with the
    output, failure ERROR-logged with it.

    Cancellation: a cancel scope around the call (a pass budget, shutdown) tears the hook down
    through the supervisor (SIGTERM, ``grace``, SIGKILL; shielded); its failure
    (``hook P: cancelled``) is still logged and counted, then ``Cancelled`` propagates.

    ``containment``: under the cgroup backend the hook runs in its own job cgroup
    (``hook-<event>-<device>-<job id>``); what it leaves behind is killed with it and named in
    a WARN (docs/containment.md).
    """
    out = TailBuffer(OUTPUT_TAIL)
    key = "-".join(
        ["hook", env.get("RC_EVENT", ""), env.get("RC_DEVICE", ""), env.get("RC_JOB_ID", "")]
    )
    spec = proc.JobSpec(
        command=(path,),
        env=env,
        max_runtime=max_runtime,
        grace_ceiling=grace,
        containment=containment,
        cgroup_key=key.rstrip("-"),
    )
    started = trio.current_time()  # metrics
    kept: list[proc.Result] = []
    try:
        await proc.run(spec, out, stop, record=kept.append)
    finally:
        if kept:  # also when a budget scope or shutdown cut the hook: say how it ended
            report_escapees(f"hook {path}", kept[0])
            error, output = _report_hook(path, env, kept[0], out, metrics, started)
    return error, output


def _report_hook(
    path: str,
    env: dict[str, str],
    result: proc.Result,
    out: TailBuffer,
    metrics: WorkerMetrics | None,
    started: float,
) -> tuple[str | None, str]:
    output = out.getvalue().decode("utf-8", errors="replace")
    error = hook_error(path, result)
    event = env.get("RC_EVENT", "hook")
    device = env.get("RC_DEVICE", "")
    if error is None:
        log.debug("%s hook for %s passed: %s", event, device, output.strip())
    else:
        context = {"device": device, "job_id": env.get("RC_JOB_ID", "")}  # docs/logging.md
        log.error(
            "%s hook for %s failed: %s; output: %s",
            event,
            device,
            error,
            output.strip(),
            extra=context,
        )
    if metrics is not None:
        metrics.hook_ran(device, event, error is None, trio.current_time() - started)
    return error, output


def _spec_for(device: DeviceConfig) -> HookSpec:
    return HookSpec(
        has_acquire=bool(device.on_acquire),
        has_release=bool(device.on_release),
        release_linger=device.release_linger / SECOND,
    )


class HostHooks:
    """The worker's hook seams, for real (§4, §5). One instance per worker process."""

    def __init__(self, config: WorkerConfig, *, grace: float = HOOK_GRACE) -> None:
        self.config = config
        self.grace = grace
        self.book = LeaseBook((config.device_id(d.name), _spec_for(d)) for d in config.devices)
        self._devices = {config.device_id(d.name): d for d in config.devices}
        # the device lock of §4.4, only for devices with hooks (the others have no state, §4.1)
        self._locks = {lease.device: trio.Lock() for lease in self.book.leases()}
        self._epochs: dict[str, int] = {}
        self._timers_changed = trio.Event()
        self._firing: set[str] = set()
        self.startup_done = trio.Event()
        self.metrics: WorkerMetrics | None = None
        """Hook and verify outcomes (docs/metrics.md); the worker sets it; ``None``: none."""
        self.containment: AnyContainment | None = None
        """How hooks and verify scripts are contained; the worker sets it at start (``None``:
        the marker backend's group supervision)."""

    def _timeout(self, device_id: str) -> float:
        return self._devices[device_id].timeout / SECOND

    # -- the job path (§4.4 acquire_device / schedule_release, §4.5, §5) ------------------------
    async def acquire(self, device_id: str, job: Assignment, stop: proc.StopToken) -> str | None:
        """``acquire_device``: ``None`` when the job may run; else the hook error (with the
        output tail after a newline for a genuine failure; bare for one cut short by ``stop``,
        which the worker reports ``killed``, §4.5)."""
        lock = self._locks.get(device_id)
        if lock is None:
            return None
        async with lock:
            action = self.book.begin_acquire(device_id, job.job_id, job.submitter)
            if isinstance(action, Granted):
                self._epochs[job.job_id] = action.epoch
                return None
            assert isinstance(action, RunAcquire), action  # the lock rules out Blocked
            ok = False
            error: str | None = None
            output = ""
            try:
                error, output = await run_hook(
                    self._devices[device_id].on_acquire,
                    hook_env("acquire", device_id, job.job_id, job.submitter),
                    self._timeout(device_id),
                    stop,
                    grace=self.grace,
                    metrics=self.metrics,
                    containment=self.containment,
                )
                ok = error is None
            finally:
                done = self.book.acquire_done(device_id, action.epoch, ok)
        if isinstance(done, Granted):
            self._epochs[job.job_id] = done.epoch
            return None
        assert error is not None
        if stop.was_set or not output:
            return error
        return f"{error}\n{output[-OUTPUT_TAIL:]}"

    async def verify(self, device_id: str, job: Assignment) -> str | None:
        """The verify pass (§5): ``None`` when clean, else the reason (``verify failed: …``)."""
        started = trio.current_time()  # metrics
        outcome = await verify_assignment(self.config, job, containment=self.containment)
        if self.metrics is not None:
            self.metrics.verify_ran(device_id, outcome.ok, trio.current_time() - started)
        return None if outcome.ok else outcome.reason

    async def release(self, device_id: str, job: Assignment) -> None:
        """``schedule_release`` after the terminal report: arm the linger (§4.4)."""
        epoch = self._epochs.pop(job.job_id, 0)
        lock = self._locks.get(device_id)
        if lock is None:
            return
        async with lock:
            action = self.book.schedule_release(
                device_id, job.job_id, job.submitter, epoch, trio.current_time()
            )
        if isinstance(action, ArmRelease):
            self._timers_changed.set()
        elif isinstance(action, ReleaseSkipped) and action.reason == "stale-epoch":
            log.info(
                "%s: release skipped: the device was re-acquired by a later job (job %s)",
                device_id,
                job.job_id,
            )

    # -- timers ----------------------------------------------------------------------------------
    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The release-linger timers: fire each pending release when due (§4.4 fire_release).

        One task for all devices: it sleeps until the earliest due release (or until a timer
        is armed or a firing ends), starts the firing of every due release whose device is not
        already firing, and goes back to sleep.
        """
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                now = trio.current_time()
                for device_id, gen in self.book.due(now):
                    if device_id not in self._firing:
                        self._firing.add(device_id)
                        nursery.start_soon(self._fire, device_id, gen)
                waiting = [
                    lease.pending.due_at
                    for lease in self.book.leases()
                    if lease.pending is not None and lease.device not in self._firing
                ]
                with trio.move_on_at(min(waiting, default=math.inf)):
                    await self._timers_changed.wait()
                self._timers_changed = trio.Event()

    async def _fire(self, device_id: str, gen: int) -> None:
        try:
            with trio.CancelScope(shield=True):  # an armed release is never left half-done
                async with self._locks[device_id]:
                    action = self.book.fire_release(device_id, gen, trio.current_time())
                    if isinstance(action, RunRelease):
                        await self._run_release(action, self._timeout(device_id))
        finally:
            self._firing.discard(device_id)
            self._timers_changed.set()

    async def _run_release(
        self, action: RunRelease, max_runtime: float, stop: proc.StopToken | None = None
    ) -> None:
        ok = False
        try:
            error, _ = await run_hook(
                self._devices[action.device].on_release,
                hook_env("release", action.device, action.job_id, action.submitter),
                max_runtime,
                stop,
                grace=self.grace,
                metrics=self.metrics,
                containment=self.containment,
            )
            ok = error is None
            if error is not None:
                log.error("%s: release hook failed; device remains schedulable", action.device)
        finally:
            self.book.release_done(action.device, action.gen, ok)

    # -- startup pass and shutdown drain ---------------------------------------------------------
    async def startup_pass(self, budget: float = STARTUP_PASS_BUDGET) -> None:
        """§4.6: each device's ``on_release`` once, in declared order, empty job id and
        submitter, each bounded by its hook timeout, the pass by ``budget``. Failures are
        logged, never fatal; devices the budget leaves out are logged and skipped.

        The budget is a cancel scope (``move_on_after``) around the pass: when it runs out,
        the hook running is torn down (SIGTERM, grace, SIGKILL) and the rest are skipped.

        Cancellation: a trio cancellation tears the running hook down and propagates;
        ``startup_done`` is set on every path.
        """
        devices = self.book.startup_devices()
        reached = 0
        try:
            with trio.move_on_after(budget):
                for device_id in devices:
                    reached += 1
                    async with self._locks[device_id]:
                        action = self.book.begin_startup_release(device_id)
                        if not isinstance(action, RunStartupRelease):
                            continue
                        try:
                            await run_hook(
                                self._devices[device_id].on_release,
                                hook_env("release", device_id, "", ""),
                                self._timeout(device_id),
                                grace=self.grace,
                                metrics=self.metrics,
                                containment=self.containment,
                            )
                        finally:
                            self.book.startup_release_done(device_id)
            for device_id in devices[reached:]:
                log.error(
                    "startup release pass: budget of %gs spent; %s skipped", budget, device_id
                )
        finally:
            self.startup_done.set()

    async def drain(self, budget: float = DRAIN_BUDGET) -> None:
        """§4.7: fire every armed-but-unfired release now, sequentially, under one budget. A
        release the budget cuts short is left to the next startup pass.

        The budget is a cancel scope (``move_on_after``) inside a shielded one: a shutdown
        does not cut the drain, the budget does (the hook running is torn down: SIGTERM, its
        grace, SIGKILL), so the drain takes at most ``budget`` plus one hook's grace.

        Cancellation: shielded; bounded by the budget as above.
        """
        targets = self.book.drain_targets()
        reached = 0
        with trio.CancelScope(shield=True):
            with trio.move_on_after(budget):
                for device_id in targets:
                    reached += 1
                    async with self._locks[device_id]:
                        action = self.book.drain(device_id)
                        if isinstance(action, RunRelease):
                            await self._run_release(action, self._timeout(device_id))
            for device_id in targets[reached:]:
                log.error(
                    "release drain: budget of %gs spent; %s left to the next startup pass",
                    budget,
                    device_id,
                )


__all__ = [
    "DRAIN_BUDGET",
    "HOOK_GRACE",
    "OUTPUT_TAIL",
    "STARTUP_PASS_BUDGET",
    "HostHooks",
    "hook_env",
    "hook_error",
    "run_hook",
]
