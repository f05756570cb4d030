"""The node's job store (node.md §3): a sans-IO :class:`JobTable` and its trio shell.

(Over 500 lines: the sans-IO job table and its thin trio shell are one state machine; the shell
only adds waking and the journal hand-off.)

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
  ``error: "interrupted"``;
- with a journal, a change is first *claimed* (decided, so no other outcome can take its
  place), then written, then *published* (visible): an entry registered but not yet recorded
  reads as absent (:meth:`JobTable.get`), a claimed outcome is invisible until published;
- an ``accepted`` entry whose 202 never reached its client is withdrawn
  (:meth:`JobTable.withdraw`): the id is unknown again (docs/node.md "Delivery-checked acks").

:class:`JobStore` is the trio shell (executions, journal, janitor; every job lives in the
task tree's jobs scope). The drain itself is the task tree's (``fleet_trio.nursery.tree``): the
node passes :meth:`JobStore.begin_drain` as its ``on_stop_accepting`` and
:meth:`JobStore.mark_interrupted` as its ``on_interrupt``.
"""

from __future__ import annotations

import enum
import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable

import attrs
import trio

from fleet_trio.node.journal import (
    JOURNAL_LOST,
    Accept,
    Evict,
    Finish,
    JournalError,
    JournalLost,
    JournalWriter,
    Record,
    Row,
    Start,
    Vetoed,
    Withdraw,
)

log = logging.getLogger(__name__)

DEFAULT_TTL = 3600.0
"""Retention of a terminal job (§0: 1 h)."""
DEFAULT_JANITOR_INTERVAL = 300.0
"""Sweep cadence (§0: 5 min)."""

RELEASE_BOUND = 1.0
"""Seconds a job waits for its dispatch's 202 to be written before it starts anyway (a client
that does not read its answer never holds the job)."""

ACK_PRIORITY_BOUND = 0.25
"""Seconds a job's start yields to other dispatches' acks still being committed (a burst)."""

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
    data_file: str | None = None
    """A large result kept in a file beside the journal instead of ``data`` (read it with
    :meth:`JobStore.read_data`)."""


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
    data_file: str | None = None
    recorded: bool = True
    """False between the registration and the journal's commit of the ack: invisible."""
    claimed: bool = False
    """A terminal outcome is decided (and being written); no other outcome may be recorded."""

    def view(self, job_id: str) -> JobView:
        return JobView(job_id, self.state, self.data, self.error, self.terminal_at, self.data_file)


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
        """The visible entry (``None`` for an unknown id or an ack not yet recorded)."""
        entry = self._entries.get(job_id)
        return None if entry is None or not entry.recorded else entry.view(job_id)

    def pending(self, job_id: str) -> bool:
        """True while ``job_id`` is registered and its ack is not yet recorded."""
        entry = self._entries.get(job_id)
        return entry is not None and not entry.recorded

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def ids(self) -> list[str]:
        return list(self._entries)

    def in_flight_ids(self) -> list[str]:
        return [i for i, e in self._entries.items() if not e.state.terminal]

    def state_counts(self) -> dict[JobState, int]:
        """Visible entries per state, every state present (read by the metrics scrape)."""
        counts = dict.fromkeys(JobState, 0)
        for entry in self._entries.values():
            if entry.recorded:
                counts[entry.state] += 1
        return counts

    # -- transitions -----------------------------------------------------------------------
    def register(self, job_id: str, *, recorded: bool = True) -> Registration:
        """§3.2: refuse when draining or when the id exists in any state; else ``accepted``.

        ``recorded=False``: the entry is reserved (exactly-once holds) but invisible until
        :meth:`confirm` (the journal has the ack) or gone after :meth:`forget`."""
        if self._draining:
            return Registration.DRAINING
        if job_id in self._entries:
            return Registration.EXISTS
        self._entries[job_id] = _Entry(JobState.ACCEPTED, recorded=recorded)
        self._in_flight += 1
        return Registration.CREATED

    def confirm(self, job_id: str) -> None:
        """The ack is recorded: the entry becomes visible."""
        entry = self._entries.get(job_id)
        if entry is not None:
            entry.recorded = True

    def forget(self, job_id: str) -> bool:
        """Drop a registration whose ack could not be recorded (never a visible entry)."""
        entry = self._entries.get(job_id)
        if entry is None or entry.recorded:
            return False
        del self._entries[job_id]
        if not entry.state.terminal:
            self._in_flight -= 1
        return True

    def withdraw(self, job_id: str) -> bool:
        """Drop a recorded ``accepted`` entry whose ack was never delivered (its client was
        gone before the 202 reached it): the id is unknown again. False in any other state,
        once claimed (the drain marked it), or for an unknown id."""
        entry = self._entries.get(job_id)
        if entry is None or entry.state is not JobState.ACCEPTED or entry.claimed:
            return False
        del self._entries[job_id]
        self._in_flight -= 1
        return True

    def start(self, job_id: str) -> bool:
        """``accepted → running``; a no-op (False) in any other state or once claimed."""
        entry = self._entries.get(job_id)
        if entry is None or entry.state is not JobState.ACCEPTED or entry.claimed:
            return False
        entry.state = JobState.RUNNING
        return True

    def claim(self, job_id: str) -> bool:
        """Decide that ``job_id`` ends now: True for the first claim of an in-flight entry;
        later claims and finishes are refused. Nothing changes visibly until :meth:`publish`."""
        entry = self._entries.get(job_id)
        if entry is None or entry.state.terminal or entry.claimed:
            return False
        entry.claimed = True
        return True

    def publish(
        self, job_id: str, outcome: Outcome, now: float, *, data_file: str | None = None
    ) -> bool:
        """Make a claimed outcome visible (write-once: False when already terminal)."""
        entry = self._entries.get(job_id)
        if entry is None or entry.state.terminal:
            return False
        entry.claimed = True
        if isinstance(outcome, Done):
            entry.state = JobState.DONE
            entry.data = None if data_file else bytes(outcome.data)
            entry.data_file = data_file
        else:
            entry.state = JobState.ERROR
            entry.error = outcome.message or DEFERRED
        entry.terminal_at = now
        self._in_flight -= 1
        if self.on_change is not None:
            self.on_change(job_id, entry.view(job_id))
        return True

    def finish(self, job_id: str, outcome: Outcome, now: float) -> bool:
        """Record an outcome (claim + publish). Dropped (False) when the job is unknown,
        already terminal or already claimed."""
        return self.claim(job_id) and self.publish(job_id, outcome, now)

    def begin_drain(self) -> bool:
        """Set draining (it never ends). True when this call set it."""
        was = self._draining
        self._draining = True
        return not was

    def claim_in_flight(self) -> list[str]:
        """Claim every in-flight entry not claimed yet (the drain's survivors)."""
        return [job_id for job_id in self.in_flight_ids() if self.claim(job_id)]

    def mark_interrupted(self, now: float) -> list[str]:
        """§3.7 step 3: every unclaimed ``accepted``/``running`` entry becomes
        ``error: "interrupted"``."""
        marked = self.claim_in_flight()
        for job_id in marked:
            self.publish(job_id, Failed(INTERRUPTED), now)
        return marked

    def expired(self, now: float) -> list[str]:
        """Terminal entries whose terminal time is strictly before ``now - ttl`` (§3.4)."""
        cutoff = now - self.ttl
        return [
            job_id
            for job_id, e in self._entries.items()
            if e.state.terminal and e.terminal_at is not None and e.terminal_at < cutoff
        ]

    def evict(self, job_ids: Iterable[str]) -> list[JobView]:
        """Remove these terminal entries; returns what was removed (for their files)."""
        removed = []
        for job_id in job_ids:
            entry = self._entries.get(job_id)
            if entry is not None and entry.state.terminal:
                removed.append(entry.view(job_id))
                del self._entries[job_id]
                if self.on_change is not None:
                    self.on_change(job_id, None)
        return removed

    def sweep(self, now: float) -> list[str]:
        """§3.4: remove terminal entries whose terminal time is strictly before ``now - ttl``."""
        return [view.job_id for view in self.evict(self.expired(now))]

    def load(self, row: Row, now: float, now_wall: float) -> bool:
        """Restore a terminal job from the journal (restart). Its terminal time keeps its age
        (wall clock), so the TTL runs from when it really ended. False when not terminal,
        already present, or older than the TTL."""
        if not row.terminal or row.job_id in self._entries:
            return False
        ended = row.terminal_wall if row.terminal_wall is not None else now_wall
        age = max(0.0, now_wall - ended)
        if age > self.ttl:
            return False
        if row.state == "done":
            entry = _Entry(JobState.DONE, data=row.data, data_file=row.data_file)
        else:
            entry = _Entry(JobState.ERROR, error=row.error or DEFERRED)
        entry.claimed = True
        entry.terminal_at = now - age
        self._entries[row.job_id] = entry
        if self.on_change is not None:
            self.on_change(row.job_id, entry.view(row.job_id))
        return True

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

MSG_JOURNAL_UNAVAILABLE = "journal unavailable"
"""The 503 message of a dispatch whose ack could not be written (disk full, I/O error)."""


def finish_record(
    job_id: str, outcome: Outcome, wall: float, *, data_file: str | None = None
) -> Finish:
    """The journal record of an outcome (``data_file``: the result goes to that file)."""
    if isinstance(outcome, Done):
        data = bytes(outcome.data)
        if data_file is not None:
            return Finish(job_id, "done", wall, data_file=data_file, file_data=data)
        return Finish(job_id, "done", wall, data=data)
    return Finish(job_id, "error", wall, error=outcome.message or DEFERRED)


NOT_ACKED = "job %s: not acked: %s; it does not run (a re-dispatch of this id is a new job)"
"""The log line of a dispatch that is not an ack after all (docs/node.md "Delivery-checked
acks"): the job id and why."""

Check = Callable[[], str | None]
"""A check of a dispatch's delivery: why the ack must not stand (a reason), or ``None``."""


class Ack:
    """One registration on its way to becoming an ack, then a running job (docs/node.md
    "Delivery-checked acks").

    ``veto`` is asked when the ack's commit comes up (a client gone, a request past its
    deadline: the ack is never written); ``gone`` when the job's release waited its full bound
    without the 202 written (a client gone then: the job never starts); ``release`` is set once
    the 202 is written. :meth:`JobStore.withdraw` takes the ack back until its job starts."""

    def __init__(
        self,
        job_id: str,
        *,
        veto: Check | None = None,
        gone: Check | None = None,
        release: trio.Event | None = None,
    ) -> None:
        self.job_id = job_id
        self.veto = veto
        self.gone = gone
        self.release = release
        self.done = trio.Event()
        """Set once the ack's commit is settled (at once without a journal)."""
        self.ok = False
        """The ack is recorded and visible (until withdrawn)."""
        self.refusal: str | None = None
        """Why the ack was not recorded (the veto's reason, or the journal's error)."""
        self.withdrawn: str | None = None
        """Why the ack was taken back (:meth:`JobStore.withdraw`)."""
        self.started = False
        self.held = False
        """Another request was answered 202 for this id: the ack is never withdrawn."""


def _ask(check: Check, job_id: str) -> str | None:
    """Run a delivery check; one that raises is logged and counts as "delivered"."""
    try:
        return check()
    except Exception:
        log.exception("job %s: a delivery check failed", job_id)
        return None


class JobStore:
    """The trio shell around :class:`JobTable`: executions, journal and janitor (§3.4, §3.9).

    ``spawn(async_fn, *args, name=...)`` starts an execution task (``fleet-trio node`` passes
    the task tree's ``start_job``). With a ``journal`` (a :class:`JournalWriter` served in the
    services scope), every ack, state change and result is committed before it is visible;
    without one, changes are visible at once and a restart loses them (§3.8).
    """

    def __init__(
        self,
        *,
        ttl: float = DEFAULT_TTL,
        janitor_interval: float = DEFAULT_JANITOR_INTERVAL,
        spawn: Callable[..., None] | None = None,
        journal: JournalWriter | None = None,
    ) -> None:
        self.table = JobTable(ttl=ttl)
        self.janitor_interval = janitor_interval
        self.journal = journal
        self._spawn = spawn
        self._acks: dict[str, Ack] = {}
        """Acks waiting for their commit."""
        self._unstarted: dict[str, Ack] = {}
        """Acks whose job has not started: the ones :meth:`withdraw` may take back."""
        self._acks_settled = trio.lowlevel.ParkingLot()
        """Unparked whenever no ack is waiting for its commit (jobs yield to acks)."""
        self._read_limiter = trio.CapacityLimiter(2)
        self.on_evict: list[Callable[[list[JobView]], None]] = []
        """Called with what each janitor sweep removed (memory accounting hooks)."""
        self.on_withdrawn: list[Callable[[str], None]] = []
        """Called with each job id whose ack was withdrawn (:meth:`withdraw`): the id is
        unknown again (the live log tail drops the log the ack opened)."""
        self.on_published: list[Callable[[str], None]] = []
        """Called with each job id once its terminal state is visible to polls (the live log
        tail ends a job's log only then, so a client that polls after the tail's ``end`` never
        reads ``running``)."""

    # -- queries -------------------------------------------------------------------------------
    @property
    def draining(self) -> bool:
        return self.table.draining

    @property
    def queue_depth(self) -> int:
        return self.table.queue_depth

    @property
    def journal_lost(self) -> bool:
        """The journal was deleted, replaced or moved under the node: health and new
        dispatches answer 503 ``journal lost``; polls are answered from memory."""
        return self.journal is not None and self.journal.lost

    def get(self, job_id: str) -> JobView | None:
        return self.table.get(job_id)

    async def read_data(self, view: JobView) -> bytes | None:
        """A view's result bytes: inline, or read from its file (off the event loop)."""
        if view.data_file is None or self.journal is None:
            return view.data
        journal = self.journal.journal
        try:
            return await trio.to_thread.run_sync(
                journal.read_result, view.data_file, limiter=self._read_limiter
            )
        except OSError as exc:
            log.error("job %s: cannot read its result file: %s", view.job_id, exc)
            raise

    # -- registration ----------------------------------------------------------------------------
    def set_spawn(self, spawn: Callable[..., None]) -> None:
        self._spawn = spawn

    def register(
        self,
        job_id: str,
        execution: Execution,
        *,
        work_dir: str = "",
        discard: Callable[[], None] | None = None,
        release: trio.Event | None = None,
        ack: Ack | None = None,
    ) -> Registration:
        """Atomically register ``job_id`` and, when created, launch its execution.

        No ``await`` between the check and the insert: registration is exactly-once. With a
        journal the entry is invisible until :meth:`wait_recorded` says its ack is committed;
        the execution does not begin before that, and ``discard`` (the prepared job's
        cleanup) is called instead when the ack is refused or withdrawn.

        ``ack``: the dispatch's :class:`Ack` (its ``veto``, ``gone`` and ``release``); one is
        made otherwise. ``release``: the execution also waits for this event (the dispatch sets
        it once its 202 is written), at most :data:`RELEASE_BOUND` seconds.
        """
        journal = self.journal
        outcome = self.table.register(job_id, recorded=journal is None)
        if not outcome.created:
            return outcome
        if self._spawn is None:
            raise RuntimeError("the job store has nowhere to run executions")
        if ack is None:
            ack = Ack(job_id, release=release)
        self._unstarted[job_id] = ack
        if journal is None:
            ack.ok = True
            ack.done.set()
        else:
            self._acks[job_id] = ack

            def veto() -> str | None:
                if ack.withdrawn is not None:
                    return ack.withdrawn
                return ack.veto() if ack.veto is not None else None

            journal.submit(
                [Accept(job_id, time.time(), work_dir)],
                functools.partial(self._committed, ack),
                veto=veto,
            )
        try:
            self._spawn(self._execute, ack, execution, discard, name=f"job {job_id}")
        except BaseException as exc:
            self.table.finish(job_id, Failed(f"could not start: {exc}"), trio.current_time())
            raise
        return outcome

    def _committed(self, ack: Ack, error: JournalError | None) -> None:
        """The ack's commit settled: visible, refused (vetoed, journal error) or, withdrawn
        while it was being written, taken back in the journal too."""
        job_id = ack.job_id
        if self._acks.get(job_id) is ack:
            del self._acks[job_id]
        if not self._acks:
            self._acks_settled.unpark_all()
        if error is None and ack.withdrawn is None:
            self.table.confirm(job_id)
            ack.ok = True
        else:
            self.table.forget(job_id)
            if self._unstarted.get(job_id) is ack:
                del self._unstarted[job_id]
            if error is None and self.journal is not None:  # written, then withdrawn
                self.journal.submit([Withdraw(job_id)], self._withdraw_recorded(job_id))
            elif isinstance(error, Vetoed):
                ack.refusal = error.reason
                if ack.withdrawn is None:
                    log.warning(NOT_ACKED, job_id, error.reason, extra={"job_id": job_id})
            elif isinstance(error, JournalLost):
                ack.refusal = JOURNAL_LOST
            else:
                ack.refusal = MSG_JOURNAL_UNAVAILABLE
        ack.done.set()

    @staticmethod
    def _withdraw_recorded(job_id: str) -> Callable[[JournalError | None], None]:
        def committed(error: JournalError | None) -> None:
            if error is not None:  # a restart would read the ack as interrupted: said here
                lost = isinstance(error, JournalLost)  # the journal's loss is the ERROR line
                (log.warning if lost else log.error)(
                    "job %s: its withdrawal is not recorded (%s)", job_id, error
                )

        return committed

    def withdraw(self, ack: Ack, reason: str) -> bool:
        """Take back ``ack``: its client is gone before its 202 reached it. The id is unknown
        again (a re-dispatch is a new job), the job never starts, the journal forgets the ack
        (a commit still queued is dropped; one already written is undone by a
        :class:`~fleet_trio.node.journal.Withdraw`), and one line is logged. False (nothing
        done) once the job started, the drain claimed it, another request was answered 202
        for it, or the ack is already refused or withdrawn."""
        job_id = ack.job_id
        if ack.started or ack.held or self._unstarted.get(job_id) is not ack:
            return False
        if ack.done.is_set():
            if not self.table.withdraw(job_id):
                return False
            if self.journal is not None:
                self.journal.submit([Withdraw(job_id)], self._withdraw_recorded(job_id))
        # else: the commit is pending; the veto drops it, or _committed undoes it
        del self._unstarted[job_id]
        ack.withdrawn = reason
        ack.ok = False
        if ack.release is not None:
            ack.release.set()  # the execution wakes and ends without running
        log.warning(NOT_ACKED, job_id, reason, extra={"job_id": job_id})
        for hook in self.on_withdrawn:
            try:
                hook(job_id)
            except Exception:
                log.exception("job %s: a hook after its withdrawal failed", job_id)
        return True

    def release(self, ack: Ack) -> None:
        """The ack's 202 is written: its job may start."""
        if ack.release is not None:
            ack.release.set()

    def hold(self, job_id: str) -> None:
        """A duplicate dispatch of ``job_id`` is answered 202: the ack stands whatever its
        first client does (:meth:`withdraw` refuses from now on)."""
        ack = self._unstarted.get(job_id)
        if ack is not None:
            ack.held = True

    async def wait_recorded(self, job_id: str) -> bool:
        """Wait until the ack of ``job_id`` is committed: True when it is visible, False when
        the journal refused it (the registration is gone)."""
        ack = self._acks.get(job_id)
        if ack is not None:
            await ack.done.wait()
            return ack.ok
        return self.table.get(job_id) is not None

    async def wait_ack(self, ack: Ack) -> str | None:
        """Wait until ``ack``'s commit is settled: ``None`` when it is recorded and visible,
        else why not (a veto's reason, :data:`MSG_JOURNAL_UNAVAILABLE`, a withdrawal's)."""
        await ack.done.wait()
        if ack.ok:
            return None
        return ack.refusal or ack.withdrawn or MSG_JOURNAL_UNAVAILABLE

    async def _execute(
        self,
        ack: Ack,
        execution: Execution,
        discard: Callable[[], None] | None = None,
    ) -> None:
        job_id = ack.job_id
        ran = False
        try:
            await ack.done.wait()
            if not ack.ok:
                return  # never recorded (the dispatch answered 503) or withdrawn
            released = await self._yield_to_acks(ack.release)
            if not released and ack.gone is not None and ack.withdrawn is None:
                # the 202 is still not written after the bound: start, unless its client is gone
                gone = _ask(ack.gone, job_id)
                if gone is not None:
                    self.withdraw(ack, f"{gone} (its release waited {RELEASE_BOUND:g} s)")
            if ack.withdrawn is not None:
                return
            ack.started = True
            if self._unstarted.get(job_id) is ack:
                del self._unstarted[job_id]
            self._start(job_id)
            ran = True
            try:
                result: Outcome = await execution()
            except Exception as exc:
                log.exception("job %s: execution raised", job_id, extra={"job_id": job_id})
                result = Failed(f"internal error: {exc}" if str(exc) else "internal error")
            await self.finish(job_id, result)
        finally:
            if self._unstarted.get(job_id) is ack:
                del self._unstarted[job_id]
            if not ran and discard is not None:
                discard()  # the job never ran: its prepared files go (the runner's would)
            # Whatever happened (a cancel from the tree), an acked job ends terminal: a no-op
            # when it already is or its outcome is claimed (the drain marked it first). Only
            # this ack's own entry: a refused or withdrawn ack's id may be a new job's now.
            if ack.ok and ack.withdrawn is None and self.table.claim(job_id):
                with trio.CancelScope(shield=True):
                    await self._publish([job_id], Failed(INTERRUPTED))

    async def _yield_to_acks(self, release: trio.Event | None) -> bool:
        """Before a job starts: its own 202 is written first (``release``), then the acks of
        other dispatches still waiting for their commit go first — a dispatcher waits on its
        ack, nobody waits on a job's first milliseconds, and a job's spawn and interpreter
        start-up on the same cores would delay those acks. At most :data:`RELEASE_BOUND`
        seconds in all; without a journal no ack ever waits, so nothing is waited for.
        True unless ``release`` was still unset when the bound passed."""
        with trio.move_on_after(RELEASE_BOUND):
            if release is not None:
                await release.wait()
            if self._acks:
                with trio.move_on_after(ACK_PRIORITY_BOUND):
                    while self._acks:
                        await self._acks_settled.park()
        return release is None or release.is_set()

    def _start(self, job_id: str) -> None:
        if self.journal is None:
            self.table.start(job_id)
            return
        self.journal.submit([Start(job_id)], lambda error: self._started(job_id, error))

    def _started(self, job_id: str, error: JournalError | None) -> None:
        if error is not None and not isinstance(error, JournalLost):  # lost: logged once
            log.error("job %s: running is not recorded (%s)", job_id, error)
        self.table.start(job_id)

    async def finish(self, job_id: str, outcome: Outcome) -> bool:
        """Record an outcome (journal first); False when the job already has one."""
        if not self.table.claim(job_id):
            return False
        await self._publish([job_id], outcome)
        return True

    async def _publish(self, job_ids: list[str], outcome: Outcome) -> None:
        """Write the claimed outcome of ``job_ids``, then make it visible. A failed write is
        logged and the outcome shown anyway (a poll must not hang on the disk); such a job
        reads ``interrupted`` after a restart."""
        files: dict[str, str | None] = {}

        def committed(error: JournalError | None) -> None:
            if error is not None and not isinstance(error, JournalLost):  # lost: logged once
                log.error("jobs %s: outcome not recorded (%s)", ", ".join(job_ids), error)
            now = trio.current_time()
            for job_id in job_ids:
                data_file = files.get(job_id) if error is None else None
                self.table.publish(job_id, outcome, now, data_file=data_file)
            self._published(job_ids)

        journal = self.journal
        if journal is None:
            committed(None)
            return
        wall = time.time()
        records: list[Record] = []
        for job_id in job_ids:
            big = isinstance(outcome, Done) and len(outcome.data) > journal.journal.inline_max
            files[job_id] = journal.journal.result_file(job_id) if big else None
            records.append(finish_record(job_id, outcome, wall, data_file=files[job_id]))
        await journal.submit(records, committed).wait()

    def _published(self, job_ids: list[str]) -> None:
        for listener in self.on_published:
            for job_id in job_ids:
                try:
                    listener(job_id)
                except Exception:
                    log.exception("job %s: an on_published listener failed", job_id)

    # -- drain (the task tree's hooks) -----------------------------------------------------------
    def begin_drain(self) -> None:
        """Dispatch of new ids refuses from now on (sync; the tree's ``on_stop_accepting``)."""
        if self.table.begin_drain():
            log.info("job store draining: %d job(s) in flight", self.table.queue_depth)

    async def mark_interrupted(self) -> list[str]:
        """Every in-flight job becomes ``error: "interrupted"`` (the tree's ``on_interrupt``,
        before any cancel): claimed at once, journaled, then visible."""
        marked = self.table.claim_in_flight()
        if marked:
            await self._publish(marked, Failed(INTERRUPTED))
            log.warning("marked %d job(s) interrupted: %s", len(marked), ", ".join(marked))
        return marked

    # -- janitor (§3.4) --------------------------------------------------------------------------
    def sweep(self, now: float) -> list[JobView]:
        """Evict what the TTL allows; the journal forgets it too (and its result files)."""
        removed = self.table.evict(self.table.expired(now))
        if removed and self.journal is not None:
            self.journal.submit([Evict(v.job_id, v.data_file) for v in removed])
        for hook in self.on_evict:
            try:
                hook(removed)
            except Exception:
                log.exception("janitor: an eviction hook failed")
        return removed

    async def serve_janitor(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Sweep every ``janitor_interval`` until cancelled (services scope)."""
        task_status.started()
        while True:
            await trio.sleep(self.janitor_interval)
            evicted = self.sweep(trio.current_time())
            if evicted:
                log.debug("janitor evicted %d job(s)", len(evicted))


__all__ = [
    "ACK_PRIORITY_BOUND",
    "DEFAULT_JANITOR_INTERVAL",
    "DEFAULT_TTL",
    "DEFERRED",
    "INTERRUPTED",
    "MSG_JOURNAL_UNAVAILABLE",
    "NOT_ACKED",
    "RELEASE_BOUND",
    "Ack",
    "Done",
    "Execution",
    "Failed",
    "JobState",
    "JobStore",
    "JobTable",
    "JobView",
    "Outcome",
    "Registration",
    "finish_record",
]
