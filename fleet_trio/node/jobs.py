"""The node's job store (node.md §3): a sans-IO :class:`JobTable` and its trio shell.

:class:`JobTable` is a plain synchronous state machine with no clock of its own (times are
passed in) and no I/O. It carries the invariants of §3:

- registration is exactly-once: an id present in any state is refused, and so is every id
  once draining has begun (draining never ends);
- states move ``accepted → running → done | error``; ``done`` and ``error`` are write-once;
- ``data`` is kept as the exact raw JSON bytes the task produced (echoed byte-identical);
- queue depth = ``accepted`` + ``running``;
- a sweep evicts terminal entries whose terminal time is strictly before ``now - ttl``;
  in-flight entries are never evicted;
- :meth:`JobTable.mark_interrupted` turns every non-terminal entry into
  ``error: "interrupted"``.

:class:`JobStore` is the trio shell: it launches one execution per registered job (through a
``spawn`` function, by default its own nursery, in ``fleet-trio node`` the task tree's jobs
scope), records the outcome unless the job is already terminal, runs the janitor and
implements the drain of §3.7 (mark interrupted *before* cancelling, then wait for the cancelled
executions' cleanup, bounded by ``kill_grace``).
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import attrs
import trio

log = logging.getLogger(__name__)

DEFAULT_TTL = 3600.0
"""Retention of a terminal job (§0: 1 h)."""
DEFAULT_JANITOR_INTERVAL = 300.0
"""Sweep cadence (§0: 5 min)."""
DEFAULT_DRAIN_TIMEOUT = 30.0
DEFAULT_KILL_GRACE = 5.0

INTERRUPTED = "interrupted"
DEFERRED = "deferred"


class JobState(enum.Enum):
    ACCEPTED = "accepted"
    RUNNING = "running"
    DONE = "done"
    ERROR = "error"

    @property
    def terminal(self) -> bool:
        return self in (JobState.DONE, JobState.ERROR)


class Registration(enum.Enum):
    """What :meth:`JobTable.register` did."""

    CREATED = "created"
    EXISTS = "exists"
    DRAINING = "draining"

    @property
    def created(self) -> bool:
        return self is Registration.CREATED


@attrs.frozen
class JobView:
    """A read-only picture of one entry."""

    job_id: str
    state: JobState
    data: bytes | None = None
    """Raw JSON bytes of the result (``done`` only; ``None`` or empty means "no data")."""
    error: str | None = None
    """The error text (``error`` only, never empty)."""
    terminal_at: float | None = None


@attrs.frozen
class Done:
    """A successful execution: ``data`` is the raw JSON of the result (may be empty)."""

    data: bytes = b""


@attrs.frozen
class Failed:
    """A failed or deferred execution. An empty message is recorded as ``"deferred"``."""

    message: str = ""


Outcome = Done | Failed


@attrs.define
class _Entry:
    state: JobState
    data: bytes | None = None
    error: str | None = None
    terminal_at: float | None = None

    def view(self, job_id: str) -> JobView:
        return JobView(job_id, self.state, self.data, self.error, self.terminal_at)


class JobTable:
    """The sans-IO job table. All methods are synchronous; time is passed in."""

    def __init__(self, *, ttl: float = DEFAULT_TTL) -> None:
        if math.isnan(ttl) or ttl < 0:
            raise ValueError(f"ttl must be >= 0 seconds, got {ttl!r}")
        self.ttl = ttl
        self._entries: dict[str, _Entry] = {}
        self._draining = False
        self._in_flight = 0
        self.on_change: Callable[[str, JobView | None], None] | None = None
        """Memory budget hook (``fleet_trio.node.retention``): called with the view of an entry
        that just became terminal, and with ``None`` when the sweep removes one."""

    # -- queries ---------------------------------------------------------------------------
    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def queue_depth(self) -> int:
        """Entries in ``accepted`` or ``running`` (§3.5)."""
        return self._in_flight

    def get(self, job_id: str) -> JobView | None:
        entry = self._entries.get(job_id)
        return None if entry is None else entry.view(job_id)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def ids(self) -> list[str]:
        return list(self._entries)

    def in_flight_ids(self) -> list[str]:
        return [i for i, e in self._entries.items() if not e.state.terminal]

    def state_counts(self) -> dict[JobState, int]:
        """Entries per state, every state present (read by the metrics scrape)."""
        counts = dict.fromkeys(JobState, 0)
        for entry in self._entries.values():
            counts[entry.state] += 1
        return counts

    # -- transitions -----------------------------------------------------------------------
    def register(self, job_id: str) -> Registration:
        """§3.2: refuse when draining or when the id exists in any state; else ``accepted``."""
        if self._draining:
            return Registration.DRAINING
        if job_id in self._entries:
            return Registration.EXISTS
        self._entries[job_id] = _Entry(JobState.ACCEPTED)
        self._in_flight += 1
        return Registration.CREATED

    def start(self, job_id: str) -> bool:
        """``accepted → running``; a no-op (False) in any other state."""
        entry = self._entries.get(job_id)
        if entry is None or entry.state is not JobState.ACCEPTED:
            return False
        entry.state = JobState.RUNNING
        return True

    def finish(self, job_id: str, outcome: Outcome, now: float) -> bool:
        """Record an outcome. Dropped (False) when the job is unknown or already terminal."""
        entry = self._entries.get(job_id)
        if entry is None or entry.state.terminal:
            return False
        if isinstance(outcome, Done):
            entry.state = JobState.DONE
            entry.data = bytes(outcome.data)
        else:
            entry.state = JobState.ERROR
            entry.error = outcome.message or DEFERRED
        entry.terminal_at = now
        self._in_flight -= 1
        if self.on_change is not None:
            self.on_change(job_id, entry.view(job_id))
        return True

    def begin_drain(self) -> bool:
        """Set draining (it never ends). True when this call set it."""
        was = self._draining
        self._draining = True
        return not was

    def mark_interrupted(self, now: float) -> list[str]:
        """§3.7 step 3: every ``accepted``/``running`` entry becomes ``error: "interrupted"``."""
        marked = self.in_flight_ids()
        for job_id in marked:
            self.finish(job_id, Failed(INTERRUPTED), now)
        return marked

    def sweep(self, now: float) -> list[str]:
        """§3.4: remove terminal entries whose terminal time is strictly before ``now - ttl``."""
        cutoff = now - self.ttl
        evicted = [
            job_id
            for job_id, e in self._entries.items()
            if e.state.terminal and e.terminal_at is not None and e.terminal_at < cutoff
        ]
        for job_id in evicted:
            del self._entries[job_id]
            if self.on_change is not None:
                self.on_change(job_id, None)
        return evicted

    def drop_result(self, job_id: str, message: str) -> bool:
        """Memory budget: a ``done`` entry's result is dropped; it becomes ``error: message``
        (its terminal time unchanged, no ``on_change`` call). False in any other state."""
        entry = self._entries.get(job_id)
        if entry is None or entry.state is not JobState.DONE:
            return False
        entry.state = JobState.ERROR
        entry.data = None
        entry.error = message
        return True


# --------------------------------------------------------------------------------------------
# The trio shell.
# --------------------------------------------------------------------------------------------

Execution = Callable[[], Awaitable[Outcome]]
"""One job's work: returns its outcome. Raising an ``Exception`` records an error."""


class JobStore:
    """The trio shell around :class:`JobTable`: executions, janitor and drain (§3.7, §3.9).

    ``spawn(async_fn, *args, name=...)`` starts an execution task; :meth:`run_executions`
    (used by :func:`open_job_store`) gives the store its own nursery. In ``fleet-trio node``
    the task tree's ``start_job`` is passed instead, so every job lives in the jobs scope.
    """

    def __init__(
        self,
        *,
        ttl: float = DEFAULT_TTL,
        janitor_interval: float = DEFAULT_JANITOR_INTERVAL,
        spawn: Callable[..., None] | None = None,
    ) -> None:
        self.table = JobTable(ttl=ttl)
        self.janitor_interval = janitor_interval
        self._spawn = spawn
        self._scopes: set[trio.CancelScope] = set()
        self._cancelled = False
        self._running = 0
        self._idle = trio.Event()
        self._idle.set()
        self._janitor_scope: trio.CancelScope | None = None
        self._janitor_stopped = False
        self.executions_started = 0

    # -- queries -------------------------------------------------------------------------------
    @property
    def draining(self) -> bool:
        return self.table.draining

    @property
    def queue_depth(self) -> int:
        return self.table.queue_depth

    @property
    def running_executions(self) -> int:
        """Execution tasks not yet returned (may exceed queue depth while cleanups run)."""
        return self._running

    def get(self, job_id: str) -> JobView | None:
        return self.table.get(job_id)

    # -- registration ----------------------------------------------------------------------------
    def set_spawn(self, spawn: Callable[..., None]) -> None:
        self._spawn = spawn

    def register(self, job_id: str, execution: Execution) -> Registration:
        """Atomically register ``job_id`` and, when created, launch its execution.

        No ``await`` between the check and the insert: registration is exactly-once.
        """
        outcome = self.table.register(job_id)
        if not outcome.created:
            return outcome
        if self._spawn is None:
            raise RuntimeError("the job store has nowhere to run executions")
        self._running += 1
        self._idle = trio.Event() if self._idle.is_set() else self._idle
        self.executions_started += 1
        try:
            self._spawn(self._execute, job_id, execution, name=f"job {job_id}")
        except BaseException as exc:
            self._execution_ended()
            self.table.finish(job_id, Failed(f"could not start: {exc}"), trio.current_time())
            raise
        return outcome

    async def _execute(self, job_id: str, execution: Execution) -> None:
        scope = trio.CancelScope()
        self._scopes.add(scope)
        if self._cancelled:
            scope.cancel()
        try:
            with scope:
                self.table.start(job_id)
                try:
                    result: Outcome = await execution()
                except Exception as exc:
                    log.exception("job %s: execution raised", job_id, extra={"job_id": job_id})
                    result = Failed(f"internal error: {exc}" if str(exc) else "internal error")
                self.table.finish(job_id, result, trio.current_time())
        finally:
            self._scopes.discard(scope)
            # Whatever happened (cancel from the store or from the tree), an acked job ends
            # terminal: a no-op when it already is (the drain marked it first).
            self.table.finish(job_id, Failed(INTERRUPTED), trio.current_time())
            self._execution_ended()

    def _execution_ended(self) -> None:
        self._running -= 1
        if self._running == 0:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Return once no execution task is running."""
        await self._idle.wait()

    # -- drain (§3.7) ----------------------------------------------------------------------------
    def begin_drain(self) -> None:
        """Step 1: dispatch refuses from now on (sync; the tree's ``on_stop_accepting``)."""
        if self.table.begin_drain():
            log.info("job store draining: %d job(s) in flight", self.table.queue_depth)

    def mark_interrupted(self) -> list[str]:
        """Step 3: every in-flight job becomes ``error: "interrupted"`` (before any cancel)."""
        marked = self.table.mark_interrupted(trio.current_time())
        if marked:
            log.warning("marked %d job(s) interrupted: %s", len(marked), ", ".join(marked))
        return marked

    def cancel_executions(self) -> None:
        """Step 4: cancel every execution (and any that starts later)."""
        self._cancelled = True
        for scope in list(self._scopes):
            scope.cancel()

    def stop_janitor(self) -> None:
        self._janitor_stopped = True
        if self._janitor_scope is not None:
            self._janitor_scope.cancel()

    async def drain(
        self, drain_timeout: float = DEFAULT_DRAIN_TIMEOUT, kill_grace: float = DEFAULT_KILL_GRACE
    ) -> None:
        """``DrainAndStop(timeout)``: bounded by ``drain_timeout + kill_grace``; idempotent.

        1. draining; 2. wait ≤ ``drain_timeout`` for the executions; 3. mark the survivors
        interrupted; 4. only then cancel them; 5. wait ≤ ``kill_grace`` for their cleanup;
        6. stop the janitor. Steps 3–6 are shielded, so a cancel of the caller cannot put the
        cancel before the mark.
        """
        self.begin_drain()
        with trio.move_on_after(drain_timeout):
            await self.wait_idle()
        with trio.CancelScope(shield=True):
            self.mark_interrupted()
            self.cancel_executions()
            with trio.move_on_after(kill_grace):
                await self.wait_idle()
            if self._running:
                log.error("drain: %d execution(s) still cleaning up after the grace", self._running)
            self.stop_janitor()

    # -- janitor (§3.4) --------------------------------------------------------------------------
    async def serve_janitor(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Sweep every ``janitor_interval`` until stopped (by a drain or a cancel)."""
        with trio.CancelScope() as scope:
            self._janitor_scope = scope
            if self._janitor_stopped:
                scope.cancel()
            task_status.started()
            while True:
                await trio.sleep(self.janitor_interval)
                evicted = self.table.sweep(trio.current_time())
                if evicted:
                    log.debug("janitor evicted %d job(s)", len(evicted))


@asynccontextmanager
async def open_job_store(
    *,
    ttl: float = DEFAULT_TTL,
    janitor_interval: float = DEFAULT_JANITOR_INTERVAL,
    janitor: bool = True,
) -> AsyncIterator[JobStore]:
    """A stand-alone store with its own nursery (tests, tools). Drains on exit if not drained."""
    async with trio.open_nursery() as nursery:

        def spawn(fn: Callable[..., Awaitable[object]], *args: object, name: str) -> None:
            nursery.start_soon(fn, *args, name=name)

        store = JobStore(ttl=ttl, janitor_interval=janitor_interval, spawn=spawn)
        if janitor:
            await nursery.start(store.serve_janitor)
        try:
            yield store
        finally:
            store.begin_drain()
            store.mark_interrupted()
            store.cancel_executions()
            store.stop_janitor()


__all__ = [
    "DEFAULT_DRAIN_TIMEOUT",
    "DEFAULT_JANITOR_INTERVAL",
    "DEFAULT_KILL_GRACE",
    "DEFAULT_TTL",
    "DEFERRED",
    "INTERRUPTED",
    "Done",
    "Execution",
    "Failed",
    "JobState",
    "JobStore",
    "JobTable",
    "JobView",
    "Outcome",
    "Registration",
    "open_job_store",
]
