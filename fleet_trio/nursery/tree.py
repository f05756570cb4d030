"""The task tree every fleet-trio process runs in, and its shutdown coordinator (design.md §3).

(Over 500 lines: the shutdown state machine and the tree that drives it are one unit; the state
machine is a plain class so that Hypothesis can check it.)

::

    root
    ├─ services  (outer; cancelled last)   long-lived helpers: samplers, janitor, metrics, log bus
    ├─ role                                node: the HTTP server; worker: heartbeat/poll loops
    └─ jobs      (inner; drained first)    one task per job (:meth:`TaskTree.start_job`)

Each of the three scopes is a nursery inside its own *shielded* cancel scope, held open by a
small holder task in the root nursery. Nothing outside the tree can cancel a scope: only the
shutdown sequence does, in order (jobs, then role, then services). That is what makes "mark
every surviving job interrupted **before** any cancel" hold even when the body of the tree is
cancelled from outside or crashes.

The shutdown sequence (run when the body of :func:`open_task_tree` exits):

1. ``stopping`` becomes true and ``on_stop_accepting()`` is called (already done if the
   shutdown began with :meth:`TaskTree.request_shutdown`);
2. wait until no job is live, for at most ``drain`` seconds; the wait ends as soon as the last
   job ends, or at once on a second request (escalation);
3. if jobs are still live: ``await on_interrupt()`` inside
   ``trio.move_on_after(interrupt_budget, shield=True)``, **before** any cancel;
4. cancel the jobs scope and wait for it to close (each job does its own shielded, bounded
   teardown: the supervisor's SIGTERM → ``kill_grace`` → SIGKILL → reap); then, if given,
   ``await on_jobs_closed()`` inside ``trio.move_on_after(JOBS_CLOSED_BUDGET, shield=True)``
   (node: let the live tails send the jobs' ``end`` before the HTTP server goes);
5. if given, the linger: ``await on_linger()`` inside ``trio.move_on_after(linger,
   shield=True)`` — a step of its own, after the jobs are gone and before the role scope is
   cancelled (node: keep answering polls so a poller reads the terminal states); it also
   ends on a new shutdown request;
6. cancel the role scope and wait, then the services scope and wait.

If the body raises (or is cancelled), step 2 is skipped; steps 1, 3, 4 and 5 run in a
shielded scope, and the body's exception is re-raised unchanged (not wrapped in a group).

The bound: ``drain + interrupt_budget + kill_grace + SHUTDOWN_SLACK``, plus
``JOBS_CLOSED_BUDGET`` with ``on_jobs_closed``, plus ``linger`` with ``on_linger`` (see
:attr:`TaskTree.shutdown_bound`). The tree cannot abandon a task (structured concurrency):
when a scope overruns its allowance the tree logs which tasks are late and keeps waiting. The
bound therefore holds when jobs bound their teardown by :attr:`TaskTree.kill_grace`, which
``fleet_trio.proc.run`` does when a role passes ``grace_ceiling=tree.kill_grace``.

The phase bookkeeping is :class:`ShutdownState`, a plain synchronous class with no I/O.
"""

from __future__ import annotations

import enum
import functools
import logging
import math
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TypeVarTuple, Unpack

import trio

from fleet_trio.nursery.signals import DEFAULT_SIGNALS, serve_shutdown_signals

log = logging.getLogger(__name__)

PosArgs = TypeVarTuple("PosArgs")

JOB_TEARDOWN_SLACK = 2.0
"""Seconds the jobs scope may take to close beyond ``kill_grace`` after its cancel.

It covers the supervisor's post-SIGKILL work: the reap and the 2 s straggler wait
(worker-process.md §0.5)."""

SCOPE_TEARDOWN_SLACK = 0.5
"""Seconds the role scope, and then the services scope, may each take to close after its cancel."""

SHUTDOWN_SLACK = JOB_TEARDOWN_SLACK + 2 * SCOPE_TEARDOWN_SLACK
"""The constant in the bound ``drain + interrupt_budget + kill_grace + SHUTDOWN_SLACK``."""

DEFAULT_INTERRUPT_BUDGET = 5.0
"""Seconds ``on_interrupt`` may take before it is cut short (and the cancel goes ahead)."""

JOBS_CLOSED_BUDGET = 1.5
"""Seconds ``on_jobs_closed`` may take before the role scope is cancelled anyway."""


# --------------------------------------------------------------------------------------------
# The sans-IO core: phases, escalation, the live-job count.
# --------------------------------------------------------------------------------------------


class Phase(enum.IntEnum):
    """Where the shutdown stands. Phases only move forward (some may be skipped)."""

    RUNNING = 0
    STOPPING = 1
    DRAINING = 2
    INTERRUPTING = 3
    CANCELLING = 4
    DONE = 5

    @property
    def label(self) -> str:
        return self.name.lower()


class RequestOutcome(enum.Enum):
    """What one call of :meth:`ShutdownState.request` did."""

    STARTED = "started"
    """This request began the shutdown."""
    ESCALATED = "escalated"
    """The shutdown had begun and was still in step 1–2: what remains of the drain is skipped."""
    REPEATED = "repeated"
    """Nothing more to do: already escalated, or past the drain."""


class PhaseError(RuntimeError):
    """An illegal transition of the shutdown bookkeeping (a bug in the caller)."""


class ShutdownState:
    """The shutdown phase, the escalation flag, and the live-job count. No I/O, no clock.

    Invariants (tested with a Hypothesis state machine):

    - ``phase`` never moves backwards;
    - ``live >= 0``; no job starts once the phase is ``CANCELLING`` or later;
    - ``DONE`` is reached only from ``CANCELLING`` and only with ``live == 0``;
    - ``escalated`` implies ``phase >= STOPPING`` and, once true, stays true;
    - ``requests >= 1`` implies ``phase >= STOPPING``.
    """

    def __init__(self) -> None:
        self._phase = Phase.RUNNING
        self._requests = 0
        self._escalated = False
        self._live = 0

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def requests(self) -> int:
        """How many shutdown requests came (signals, operators, roles)."""
        return self._requests

    @property
    def escalated(self) -> bool:
        """A request came while the shutdown was in steps 1–2: the drain is cut short."""
        return self._escalated

    @property
    def live(self) -> int:
        """Jobs started and not yet finished."""
        return self._live

    # -- queries -----------------------------------------------------------------------------
    @property
    def stopping(self) -> bool:
        return self._phase >= Phase.STOPPING

    @property
    def accepting_jobs(self) -> bool:
        return self._phase < Phase.CANCELLING

    @property
    def drain_over(self) -> bool:
        """The drain wait may end: no job is live, or a later request asked to skip it."""
        return self._live == 0 or self._escalated

    # -- transitions -----------------------------------------------------------------------
    def _advance(self, to: Phase, *, allowed_from: Sequence[Phase]) -> None:
        if self._phase not in allowed_from:
            raise PhaseError(f"cannot go from {self._phase.label} to {to.label}")
        self._phase = to

    def request(self) -> RequestOutcome:
        """A shutdown request (a signal, an operator, a role). Never raises."""
        self._requests += 1
        if self._phase == Phase.RUNNING:
            self._phase = Phase.STOPPING
            return RequestOutcome.STARTED
        if self._phase in (Phase.STOPPING, Phase.DRAINING) and not self._escalated:
            self._escalated = True
            return RequestOutcome.ESCALATED
        return RequestOutcome.REPEATED

    def begin_stop(self) -> bool:
        """Step 1. True when this call moved the phase out of ``RUNNING``."""
        if self._phase != Phase.RUNNING:
            return False
        self._phase = Phase.STOPPING
        return True

    def begin_drain(self) -> None:
        """Step 2 (only after step 1)."""
        self._advance(Phase.DRAINING, allowed_from=(Phase.STOPPING,))

    def begin_interrupt(self) -> None:
        """Step 3 (from step 1 when the body failed, or from step 2)."""
        self._advance(Phase.INTERRUPTING, allowed_from=(Phase.STOPPING, Phase.DRAINING))

    def begin_cancel(self) -> None:
        """Step 4. From any earlier phase: the cancel must happen, whatever went before."""
        self._advance(
            Phase.CANCELLING, allowed_from=tuple(p for p in Phase if p < Phase.CANCELLING)
        )

    def finish(self) -> None:
        """All three scopes are closed."""
        if self._live != 0:
            raise PhaseError(f"cannot finish with {self._live} live job(s)")
        self._advance(Phase.DONE, allowed_from=(Phase.CANCELLING,))

    def job_started(self) -> None:
        if not self.accepting_jobs:
            raise PhaseError(f"no job can start once the tree is {self._phase.label}")
        self._live += 1

    def job_finished(self) -> None:
        if self._live <= 0:
            raise PhaseError("job_finished without a live job")
        self._live -= 1


# --------------------------------------------------------------------------------------------
# The trio shell.
# --------------------------------------------------------------------------------------------


class TaskTreeClosed(RuntimeError):
    """:meth:`TaskTree.start_job` was called after the jobs scope was cancelled."""


class Scope:
    """One named scope of the tree: a nursery inside its own shielded cancel scope."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.cancel_scope = trio.CancelScope(shield=True)
        self._nursery: trio.Nursery | None = None
        self._closed = trio.Event()

    @property
    def nursery(self) -> trio.Nursery:
        if self._nursery is None:
            raise RuntimeError(f"the {self.name} scope is not open")
        return self._nursery

    @property
    def opened(self) -> bool:
        return self._nursery is not None

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def task_names(self) -> list[str]:
        """Names of the tasks running directly in this scope's nursery, sorted."""
        if self._nursery is None or self.closed:
            return []
        return sorted(task.name for task in self._nursery.child_tasks)

    async def wait_closed(self) -> None:
        """Return once the scope's nursery has closed.

        Cancellation: a plain wait; cancelling it changes nothing in the scope."""
        await self._closed.wait()

    async def hold(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The holder task: keeps the nursery open until the scope is cancelled.

        Cancellation: only the shutdown sequence cancels the scope (it is shielded from
        everything else); the holder then waits for the scope's tasks to end."""
        try:
            with self.cancel_scope:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    task_status.started()
                    await trio.sleep_forever()
        finally:
            self._closed.set()

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("open" if self.opened else "unopened")
        return f"<Scope {self.name} {state} tasks={self.task_names()}>"


class TaskTree:
    """The three scopes, the live-job count and the shutdown coordinator.

    Obtain one with :func:`open_task_tree` (or :func:`run_task_tree`); do not construct it
    directly.
    """

    def __init__(
        self,
        *,
        drain: float,
        kill_grace: float,
        on_stop_accepting: Callable[[], None] | None = None,
        on_interrupt: Callable[[], Awaitable[None]] | None = None,
        interrupt_budget: float = DEFAULT_INTERRUPT_BUDGET,
        on_jobs_closed: Callable[[], Awaitable[None]] | None = None,
        linger: float = 0.0,
        on_linger: Callable[[], Awaitable[None]] | None = None,
        jobs_closed_budget: float = JOBS_CLOSED_BUDGET,
    ) -> None:
        _check_seconds("drain", drain, allow_zero=True)
        _check_seconds("linger", linger, allow_zero=True)
        _check_seconds("kill_grace", kill_grace, allow_zero=False)
        _check_seconds("interrupt_budget", interrupt_budget, allow_zero=True)
        _check_seconds("jobs_closed_budget", jobs_closed_budget, allow_zero=True)
        self.drain = drain
        self.kill_grace = kill_grace
        """Pass this to every job as ``JobSpec.grace_ceiling``: it is what keeps the bound."""
        self.interrupt_budget = interrupt_budget
        self._on_stop_accepting = on_stop_accepting
        self._on_interrupt = on_interrupt
        self._on_jobs_closed = on_jobs_closed
        self.linger = linger
        self._on_linger = on_linger
        self.jobs_closed_budget = jobs_closed_budget
        self._state = ShutdownState()
        self._hurried = False
        self.shutdown_reason: str | None = None
        """The first request's reason (a signal's name: ``SIGHUP``); None until a request."""
        self._cut_on_hurry: set[trio.CancelScope] = set()
        self._requested = trio.Event()
        self._wake = trio.lowlevel.ParkingLot()
        self._cancel_on_stop: list[trio.CancelScope] = []
        self._services = Scope("services")
        self._role = Scope("role")
        self._jobs = Scope("jobs")

    # -- the scopes --------------------------------------------------------------------------
    @property
    def services(self) -> trio.Nursery:
        """Long-lived helpers; cancelled last."""
        return self._services.nursery

    @property
    def role(self) -> trio.Nursery:
        """The role's own tasks (HTTP server, poll loops); cancelled after the jobs."""
        return self._role.nursery

    @property
    def jobs(self) -> trio.Nursery:
        """The jobs nursery. Start jobs with :meth:`start_job`, which counts them."""
        return self._jobs.nursery

    @property
    def scopes(self) -> tuple[Scope, Scope, Scope]:
        """The scopes in cancellation order reversed: services, role, jobs."""
        return (self._services, self._role, self._jobs)

    # -- state ---------------------------------------------------------------------------------
    @property
    def phase(self) -> Phase:
        return self._state.phase

    @property
    def stopping(self) -> bool:
        """True from step 1 on: roles refuse new work (node: dispatch answers 503)."""
        return self._state.stopping

    @property
    def escalated(self) -> bool:
        return self._state.escalated

    @property
    def live_jobs(self) -> int:
        return self._state.live

    @property
    def shutdown_requested(self) -> trio.Event:
        """Set when the shutdown begins (a request, or the body of the tree ending).

        Only the tree sets it; treat it as read-only.
        """
        return self._requested

    @property
    def shutdown_bound(self) -> float:
        """Seconds the shutdown takes at most once it starts draining (jobs keeping the grace)."""
        extra = self.jobs_closed_budget if self._on_jobs_closed is not None else 0.0
        if self._on_linger is not None:
            extra += self.linger
        return self.drain + self.interrupt_budget + self.kill_grace + SHUTDOWN_SLACK + extra

    async def wait_shutdown(self) -> None:
        """Return once the shutdown has begun.

        Cancellation: a plain wait; cancelling it does not shut the tree down."""
        await self._requested.wait()

    # -- control -------------------------------------------------------------------------------
    def request_shutdown(self, reason: str = "shutdown requested") -> RequestOutcome:
        """Ask the tree to shut down. Synchronous, idempotent, safe from any task.

        The first request runs step 1 at once (``stopping``, ``on_stop_accepting``) and wakes
        :meth:`wait_shutdown`; the body of the tree is expected to return then. A request that
        comes while the shutdown is in steps 1–2 (the second SIGINT) skips what remains of the
        drain. Later requests change nothing.
        """
        outcome = self._state.request()
        if outcome is RequestOutcome.STARTED:
            self.shutdown_reason = reason
            log.info(
                "%s: shutting down (drain up to %gs, kill grace %gs, bound %gs)",
                reason,
                self.drain,
                self.kill_grace,
                self.shutdown_bound,
            )
            self._stopped()
        elif outcome is RequestOutcome.ESCALATED:
            log.warning(
                "%s again: skipping the rest of the drain (%d live job(s) will be interrupted)",
                reason,
                self._state.live,
            )
            self._wake.unpark_all()
        elif not self._hurried and self._state.phase in (Phase.INTERRUPTING, Phase.CANCELLING):
            log.warning(
                "%s again: cutting the remaining shutdown budgets short (only the kill grace "
                "is kept)",
                reason,
            )
            self._hurry()
            self._wake.unpark_all()  # ends the linger step, if it runs
        else:
            log.warning(
                "%s: already %s; shutdown completes within %gs of its start",
                reason,
                self._state.phase.label,
                self.shutdown_bound,
            )
            self._wake.unpark_all()  # ends the linger step, if it runs
        return outcome

    @property
    def hurried(self) -> bool:
        """A request came after the drain: the budgeted steps still running were cut."""
        return self._hurried

    def cut_on_hurry(self, scope: trio.CancelScope) -> Callable[[], None]:
        """Cancel ``scope`` when a request comes after the drain (at once if one did).

        For the budgeted, shielded steps of a shutdown (a worker's final reports). Returns a
        function that forgets ``scope`` (call it when the scope is done)."""
        if self._hurried:
            scope.cancel()
        else:
            self._cut_on_hurry.add(scope)
        return functools.partial(self._cut_on_hurry.discard, scope)

    def _hurry(self) -> None:
        self._hurried = True
        scopes, self._cut_on_hurry = self._cut_on_hurry, set()
        for scope in scopes:
            scope.cancel()

    def cancel_on_shutdown(self, scope: trio.CancelScope) -> None:
        """Cancel ``scope`` when the shutdown begins (at once if it already has)."""
        if self._state.stopping:
            scope.cancel()
        else:
            self._cancel_on_stop.append(scope)

    def start_job(
        self,
        async_fn: Callable[[Unpack[PosArgs]], Awaitable[object]],
        *args: *PosArgs,
        name: str | None = None,
    ) -> None:
        """Start one job task in the jobs scope, counted in :attr:`live_jobs`.

        An ordinary exception from the job is logged with its traceback and goes no further;
        ``Cancelled``, ``KeyboardInterrupt`` and other non-``Exception`` errors propagate.
        Raises :class:`TaskTreeClosed` once the jobs scope has been cancelled.
        """
        if not self._state.accepting_jobs:
            raise TaskTreeClosed(f"the task tree is {self._state.phase.label}: no new jobs")
        label = name if name is not None else _callable_name(async_fn)
        self._state.job_started()
        try:
            self.jobs.start_soon(self._run_job, async_fn, args, label, name=label)
        except BaseException:
            self._job_ended()
            raise

    # -- inspection ------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, list[str]]:
        """``{scope name: [task names]}`` for the three scopes."""
        return {scope.name: scope.task_names() for scope in self.scopes}

    def describe(self) -> str:
        """A readable picture of the tree and what runs in it (for logs and debugging)."""
        lines = [
            f"task tree: phase {self.phase.label}, {self.live_jobs} live job(s), "
            f"drain {self.drain:g}s, kill grace {self.kill_grace:g}s"
        ]
        for i, scope in enumerate(self.scopes):
            branch = "└─" if i == len(self.scopes) - 1 else "├─"
            state = " (closed)" if scope.closed else ""
            tasks = ", ".join(scope.task_names()) or "-"
            lines.append(f"{branch} {scope.name}{state}: {tasks}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<TaskTree phase={self.phase.label} live_jobs={self.live_jobs}>"

    # -- internals ---------------------------------------------------------------------------------
    async def _run_job(
        self,
        async_fn: Callable[[Unpack[PosArgs]], Awaitable[object]],
        args: tuple[*PosArgs],
        label: str,
    ) -> None:
        try:
            await async_fn(*args)
        except Exception:
            log.exception("job %s failed", label)
        except BaseExceptionGroup as group:
            # A mix of ordinary errors and Cancelled/KeyboardInterrupt: log the ordinary part,
            # let the rest propagate (a CancelScope takes its own Cancelled out of a group).
            ordinary, rest = group.split(Exception)
            if ordinary is not None:
                log.error("job %s failed", label, exc_info=ordinary)
            if rest is not None:
                raise rest from None
        finally:
            self._job_ended()

    def _job_ended(self) -> None:
        self._state.job_finished()
        if self._state.live == 0:
            self._wake.unpark_all()

    def _stopped(self) -> None:
        """Step 1's side effects; runs once, whatever began the shutdown."""
        self._requested.set()
        scopes, self._cancel_on_stop = self._cancel_on_stop, []
        for scope in scopes:
            scope.cancel()
        if self._on_stop_accepting is not None:
            try:
                self._on_stop_accepting()
            except Exception:
                log.exception("on_stop_accepting failed; shutdown continues")

    def _begin_stop(self) -> None:
        if self._state.begin_stop():
            log.info(
                "task tree body ended: shutting down (drain up to %gs, kill grace %gs)",
                self.drain,
                self.kill_grace,
            )
            self._stopped()

    async def _open(self, root: trio.Nursery) -> None:
        for scope in self.scopes:
            await root.start(scope.hold, name=f"task-tree:{scope.name}")

    async def _stop_and_drain(self) -> None:
        """Steps 1–2. Not shielded: a cancel from outside ends the drain early."""
        self._begin_stop()
        self._state.begin_drain()
        started = trio.current_time()
        with trio.move_on_after(self.drain):
            while not self._state.drain_over:
                await self._wake.park()
        waited = trio.current_time() - started
        if self._state.live == 0:
            log.info("drain: no job left after %.3fs", waited)
        elif self._state.escalated:
            log.warning("drain: skipped after %.3fs, %d job(s) live", waited, self._state.live)
        else:
            log.warning("drain: %gs elapsed, %d job(s) still live", self.drain, self._state.live)

    async def _interrupt_and_close(self) -> None:
        """Steps 3–5 (and step 1 if the body failed before it). Called inside a shield."""
        try:
            self._begin_stop()
            if self._state.live > 0 and self._state.phase < Phase.INTERRUPTING:
                await self._interrupt()
        finally:
            self._state.begin_cancel()
            await self._close(self._jobs, self.kill_grace + JOB_TEARDOWN_SLACK)
            await self._jobs_closed()
            await self._linger()
            await self._close(self._role, SCOPE_TEARDOWN_SLACK)
            await self._close(self._services, SCOPE_TEARDOWN_SLACK)
            self._state.finish()
            log.info("task tree closed")

    async def _budgeted(
        self, hook: Callable[[], Awaitable[None]], budget: float, failed: str
    ) -> bool:
        """Run a shutdown hook shielded, under ``budget`` (cut by a hurry); log its failure
        as ``failed``. True when the budget cut it short."""
        with trio.move_on_after(budget, shield=True) as scope:
            forget = self.cut_on_hurry(scope)
            try:
                await hook()
            except Exception:
                log.exception(failed)
            finally:
                forget()
        return scope.cancelled_caught

    async def _jobs_closed(self) -> None:
        if self._on_jobs_closed is None:
            return
        budget = self.jobs_closed_budget
        failed = "on_jobs_closed failed; closing the role scope"
        if await self._budgeted(self._on_jobs_closed, budget, failed):
            log.warning("on_jobs_closed cut short (budget %gs)", budget)

    async def _linger(self) -> None:
        """The linger step: ``on_linger`` for at most ``linger`` s; a new request ends it."""
        if self._on_linger is None or self.linger <= 0:
            return
        hook = self._on_linger
        requests = self._state.requests
        started = trio.current_time()
        with trio.move_on_after(self.linger, shield=True):
            async with trio.open_nursery() as nursery:

                async def run_hook() -> None:
                    try:
                        await hook()
                    except Exception:
                        log.exception("on_linger failed; ending the linger")
                    nursery.cancel_scope.cancel()

                nursery.start_soon(run_hook)
                while self._state.requests == requests:
                    await self._wake.park()
                nursery.cancel_scope.cancel()
        log.info("linger: ended after %.3fs", trio.current_time() - started)

    async def _interrupt(self) -> None:
        self._state.begin_interrupt()
        if self._on_interrupt is None:
            return
        log.info("interrupting %d live job(s) before the cancel", self._state.live)
        budget = self.interrupt_budget
        failed = "on_interrupt failed; cancelling the jobs anyway"
        if await self._budgeted(self._on_interrupt, budget, failed):
            log.error("on_interrupt cut short (budget %gs); cancelling the jobs", budget)

    async def _close(self, scope: Scope, allowance: float) -> None:
        """Cancel one scope and wait for it to close. Called inside a shield."""
        if not scope.opened:
            return
        scope.cancel_scope.cancel()
        with trio.move_on_after(allowance):
            await scope.wait_closed()
        if scope.closed:
            return
        # Structured concurrency: the tree cannot abandon a task. Say who is late, and wait.
        log.error(
            "%s scope still busy %gs after its cancel (%s); waiting for it",
            scope.name,
            allowance,
            ", ".join(scope.task_names()) or "-",
        )
        await scope.wait_closed()


def _check_seconds(name: str, value: float, *, allow_zero: bool) -> None:
    if math.isnan(value) or math.isinf(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number of seconds {bound}, got {value!r}")


def _callable_name(fn: object) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return str(name) if name else repr(fn)


@asynccontextmanager
async def open_task_tree(
    *,
    drain: float,
    kill_grace: float,
    on_stop_accepting: Callable[[], None] | None = None,
    on_interrupt: Callable[[], Awaitable[None]] | None = None,
    interrupt_budget: float = DEFAULT_INTERRUPT_BUDGET,
    on_jobs_closed: Callable[[], Awaitable[None]] | None = None,
    linger: float = 0.0,
    on_linger: Callable[[], Awaitable[None]] | None = None,
    jobs_closed_budget: float = JOBS_CLOSED_BUDGET,
    signals: Sequence[signal.Signals] = (),
    absorb_late_signals: bool = False,
) -> AsyncIterator[TaskTree]:
    """Open the services, role and jobs scopes; run the shutdown sequence when the body exits.

    ``drain``: seconds to wait for live jobs after the stop (step 2).
    ``kill_grace``: seconds each job gets after its cancel (pass it as ``grace_ceiling``); > 0.
    ``on_stop_accepting``: sync, step 1 (node: dispatch 503; worker: stop polling, set tokens).
    ``on_interrupt``: async, step 3, only when jobs are still live after the drain (node: mark
    them ``error:"interrupted"``; worker: log the abandoned ids); bounded by
    ``interrupt_budget`` and shielded.
    ``on_jobs_closed``: async, after step 4, before the role is cancelled; bounded by
    ``jobs_closed_budget`` (default :data:`JOBS_CLOSED_BUDGET`) and shielded.
    ``on_linger``: async, after ``on_jobs_closed``, before the role is cancelled; bounded by
    ``linger`` seconds (0: skipped) and shielded; a new shutdown request ends it.
    ``signals``: served by :func:`~fleet_trio.nursery.signals.serve_shutdown_signals`, the
    first task of the services scope (cancelled last): from the moment the tree opens to the
    moment it closes, each of these signals is a :meth:`TaskTree.request_shutdown`. A process
    does all its work in the body, so no signal finds it outside the tree.

    Cancellation: a cancel from outside ends the drain (step 2) early; steps 3–5 run shielded,
    each under its own deadline (``interrupt_budget``, ``kill_grace`` plus
    :data:`JOB_TEARDOWN_SLACK`, ``jobs_closed_budget``, :data:`SCOPE_TEARDOWN_SLACK` per
    scope), and the ``Cancelled`` is re-raised once the tree is closed.
    """
    tree = TaskTree(
        drain=drain,
        kill_grace=kill_grace,
        on_stop_accepting=on_stop_accepting,
        on_interrupt=on_interrupt,
        interrupt_budget=interrupt_budget,
        on_jobs_closed=on_jobs_closed,
        linger=linger,
        on_linger=on_linger,
        jobs_closed_budget=jobs_closed_budget,
    )
    pending: BaseException | None = None
    async with trio.open_nursery() as root:
        try:
            await tree._open(root)
            if signals:
                serve = functools.partial(
                    serve_shutdown_signals,
                    tree,
                    signals=tuple(signals),
                    absorb_after_close=absorb_late_signals,
                )
                await tree.services.start(serve, name="shutdown-signals")
            try:
                yield tree
            except BaseException as exc:
                # Held, not swallowed: re-raised below once the tree is closed.
                pending = exc
            else:
                try:
                    await tree._stop_and_drain()
                except BaseException as exc:
                    pending = exc
        finally:
            # Shielded: the scopes are shielded too, so this is what closes them, always.
            # Its duration is bounded by interrupt_budget + kill_grace + SHUTDOWN_SLACK as long
            # as jobs keep kill_grace; overruns are logged by TaskTree._close.
            with trio.CancelScope(shield=True):
                await tree._interrupt_and_close()
    if pending is not None:
        raise pending


async def run_task_tree(
    setup: Callable[[TaskTree], Awaitable[object]],
    *,
    drain: float,
    kill_grace: float,
    on_stop_accepting: Callable[[], None] | None = None,
    on_interrupt: Callable[[], Awaitable[None]] | None = None,
    interrupt_budget: float = DEFAULT_INTERRUPT_BUDGET,
    signals: Sequence[signal.Signals] = DEFAULT_SIGNALS,
) -> None:
    """A whole process lifetime: open the tree, serve SIGTERM/SIGINT, ``await setup(tree)``,
    wait for the shutdown request, run the shutdown sequence.

    ``setup`` starts the services and the role (``await tree.services.start(...)``,
    ``await tree.role.start(...)``) and returns. A shutdown request while ``setup`` is still
    running cancels it, and the shutdown proceeds. ``signals=()`` installs no handler.

    Cancellation: as :func:`open_task_tree` (the shutdown runs, bounded, then ``Cancelled``
    propagates).
    """
    async with open_task_tree(
        drain=drain,
        kill_grace=kill_grace,
        on_stop_accepting=on_stop_accepting,
        on_interrupt=on_interrupt,
        interrupt_budget=interrupt_budget,
        signals=signals,
    ) as tree:
        with trio.CancelScope() as body:
            tree.cancel_on_shutdown(body)
            await setup(tree)
            await tree.wait_shutdown()


__all__ = [
    "DEFAULT_INTERRUPT_BUDGET",
    "JOBS_CLOSED_BUDGET",
    "JOB_TEARDOWN_SLACK",
    "SCOPE_TEARDOWN_SLACK",
    "SHUTDOWN_SLACK",
    "Phase",
    "PhaseError",
    "RequestOutcome",
    "Scope",
    "ShutdownState",
    "TaskTree",
    "TaskTreeClosed",
    "open_task_tree",
    "run_task_tree",
]
