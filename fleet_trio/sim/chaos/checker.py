"""The chaos checker: plain records of what a run saw (:class:`Records`) and one
synchronous function per promise over them (:func:`check`); each broken promise is a
:class:`Violation`. No I/O, so they are unit-tested on hand-made records."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs

from fleet_trio.sim.chaos.schedule import (
    MARK_LEAD,
    NODE_MARKER,
    RC_MARKER,
    STUBBORN_SECONDS,
    TRAP_MARGIN,
    rc_expected_output,
)
from fleet_trio.sim.dispatcher import LOST_404, NODE_TERMINAL
from fleet_trio.sim.fleet import NODE_DRAIN, NODE_KILL_GRACE, ProcessEvent, ShutdownRecord

# -- records (plain values: the checker's input) ---------------------------------------------


@attrs.frozen
class NodeJobRecord:
    """A dispatched job as the dispatcher and the node's run counter saw it."""

    ref: str
    job_id: str
    kind: str
    node: str | None
    """The node that acked it (``None``: nobody did)."""
    acked_at: float | None
    state: str
    """The dispatcher's record state."""
    error: str | None
    states_seen: tuple[str, ...]
    terminal_at: float | None
    runs: Mapping[str, int]
    """node name → how many times the job's command started there."""
    sent_at: float | None = None
    """When the dispatch began (the node may hold the job from then on, before its 202
    reaches the dispatcher); ``None``: use ``acked_at``."""


@attrs.frozen
class RcJobRecord:
    ref: str
    job_id: str
    kind: str
    device: str
    worker: str
    lines: int
    state: str
    """The controller's job state."""
    assigned: bool
    reports: tuple[tuple[str, int | None, str], ...]
    """Every accepted E5 report ``(state, exit_code, reason)``, ``running`` included."""
    log_chunks: tuple[bytes, ...]
    started_at: float | None
    finished_at: float | None
    reason: str = ""
    """The controller's reason for the job's end (``worker lost``, ``cancelled`` …)."""


@attrs.frozen
class MarkedProcess:
    pid: int
    marker: str
    job_id: str


@attrs.frozen
class Holding:
    device: str
    pid: int
    nbytes: int
    job_id: str
    """From the holder's ``FLEET_TRIO_SIM_LEAK_JOB``; ``""`` when unknown."""


@attrs.frozen
class Records:
    seed: int
    began: float
    settled: float
    node_jobs: tuple[NodeJobRecord, ...] = ()
    rc_jobs: tuple[RcJobRecord, ...] = ()
    marked: tuple[MarkedProcess, ...] = ()
    holdings: tuple[Holding, ...] = ()
    quarantined: Mapping[str, str] = attrs.field(factory=dict)
    """device id → the fault reason for devices the controller holds ``unhealthy``/``fault``."""
    process_events: tuple[ProcessEvent, ...] = ()
    shutdowns: tuple[ShutdownRecord, ...] = ()


@attrs.frozen
class Violation:
    promise: str
    """``terminal`` | ``run-once`` | ``report`` | ``output`` | ``sweep`` | ``vram`` |
    ``shutdown``."""
    subject: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.promise}] {self.subject}: {self.detail}"


# -- the checker ------------------------------------------------------------------------------

NL = b"\n"


def _disrupted(
    events: Iterable[ProcessEvent],
    process: str,
    since: float | None,
    until: float | None,
    kinds: tuple[str, ...] = ("kill", "term"),
) -> bool:
    """Whether ``process`` was crashed (``kill``) or stopped (``term``) between ``since`` and
    ``until`` (``None``: ever after)."""
    if since is None:
        return False
    return any(
        e.process == process
        and e.kind in kinds
        and e.at >= since
        and (until is None or e.at <= until)
        for e in events
    )


def _first_after(
    events: Iterable[ProcessEvent], process: str, kind: str, since: float
) -> float | None:
    times = [e.at for e in events if e.process == process and e.kind == kind and e.at >= since]
    return min(times) if times else None


def check_node_jobs(records: Records) -> list[Violation]:
    """Promise 1: every job acked by a node reaches exactly one terminal state that a poller
    can see, and is run at most once (by that node).

    * the states a poller saw hold at most one terminal state, and nothing after it;
    * no node started the job's command more than once;
    * when the job's node was neither crashed nor stopped while the job was in flight, the
      poller saw a terminal state;
    * a ``stubborn`` job (it ignores SIGTERM) in flight when its node is stopped outlives the
      drain; the node marks it ``error: "interrupted"`` before its kill grace, and a poller
      polling faster than the grace sees that mark.
    """
    out: list[Violation] = []
    events = records.process_events
    for job in records.node_jobs:
        subject = f"node job {job.ref} ({job.job_id})"

        def bad(detail: str, promise: str = "terminal", subject: str = subject) -> None:
            out.append(Violation(promise, subject, detail))

        for node, n in job.runs.items():
            if n > 1:
                bad(f"ran {n} times on {node}", "run-once")
        if job.node is None:
            continue
        seen_terminal = [s for s in job.states_seen if s in NODE_TERMINAL]
        if len(seen_terminal) > 1:
            bad(f"polls saw several terminal states {job.states_seen}")
        if seen_terminal and job.states_seen[-1] not in NODE_TERMINAL:
            bad(f"a state after the terminal one {job.states_seen}")
        visible = bool(seen_terminal) and job.error != LOST_404
        until = job.terminal_at if visible else None
        since = job.sent_at if job.sent_at is not None else job.acked_at
        disrupted = _disrupted(events, job.node, since, until)
        if not disrupted and not visible:
            bad(
                f"acked by {job.node} but no terminal state was visible to the poller "
                f"(record {job.state} {job.error or ''}, polls saw {list(job.states_seen)})"
            )
        if job.kind == "stubborn" and job.acked_at is not None and job.runs.get(job.node, 0):
            stop = _first_after(events, job.node, "term", job.acked_at)
            would_end = job.acked_at + STUBBORN_SECONDS
            outlived = stop is not None and would_end > stop + NODE_DRAIN + TRAP_MARGIN
            if not outlived or stop is None:
                continue
            if not (job.error or "").startswith("interrupted"):
                bad(
                    f"in flight when {job.node} was stopped and outlived the drain, but "
                    f'the poller never saw error "interrupted" (saw '
                    f"{list(job.states_seen)}, record {job.state} {job.error or ''})"
                )
                continue
            seen_at = job.terminal_at
            if seen_at is not None and seen_at - stop > NODE_DRAIN + MARK_LEAD:
                bad(
                    f'the poller saw error "interrupted" {seen_at - stop:.2f}s after '
                    f"{job.node} was stopped: the mark must come when the "
                    f"{NODE_DRAIN:g}s drain ends, before the {NODE_KILL_GRACE:g}s kill "
                    "grace, not after the kill"
                )
    return out


def normalized_log(chunks: Sequence[bytes]) -> tuple[bytes, int]:
    """The job's log with chunk retransmissions removed (a chunk equal to the one before it:
    docs/worker.md, a chunk whose answer was lost is sent again), and how many were."""
    kept: list[bytes] = []
    dupes = 0
    for chunk in chunks:
        if kept and chunk == kept[-1]:
            dupes += 1
            continue
        kept.append(chunk)
    return b"".join(kept), dupes


def check_rc_jobs(records: Records) -> list[Violation]:
    """Promise 2: every rc job assigned to a worker gets exactly one terminal report, and its
    output arrives in order and complete up to that report.

    * every terminal report of a job says the same thing (a retransmission after a lost answer
      is the same report; two different outcomes are a violation);
    * an assigned job whose worker was neither crashed nor stopped while it ran, and that the
      worker acknowledged (``running``), has a terminal report;
    * the log (retransmitted chunks removed) is a prefix of the numbered lines, in order, and all
      of them when the job ended ``succeeded`` or ``failed`` by its own exit.
    """
    out: list[Violation] = []
    for job in records.rc_jobs:
        subject = f"rc job {job.ref} ({job.job_id} on {job.device})"

        def bad(promise: str, detail: str, subject: str = subject) -> None:
            out.append(Violation(promise, subject, detail))

        terminal = [r for r in job.reports if r[0] != "running"]
        if len({r for r in terminal}) > 1:
            bad("report", f"different terminal reports {terminal}")
        acknowledged = any(r[0] == "running" for r in job.reports)
        crashed = _disrupted(records.process_events, job.worker, job.started_at, None, ("kill",))
        if job.assigned and acknowledged and not terminal and not crashed:
            controller = f"controller: {job.state} {job.reason!r}"
            bad("report", f"assigned and running, but no terminal report ({controller})")
        log, _ = normalized_log(job.log_chunks)
        expected = rc_expected_output(job.lines)
        if not expected.startswith(log):
            bad("output", f"log is not an in-order prefix: {log[-200:]!r}")
        elif (
            terminal
            and terminal[0][0] in ("succeeded", "failed")
            and terminal[0][1] in (0, 2)
            and log != expected
        ):
            lines = f"{log.count(NL)} of {job.lines} lines"
            bad("output", f"ended {terminal[0][0]} but the log has {lines}")
    return out


def check_sweep(records: Records) -> list[Violation]:
    """Promise 3a: no process carrying a job's marker survives the job's end, for every job
    whose supervisor reported its end (a node poll saw it terminal, or the worker reported
    it). Survivors of a crashed supervisor are not covered (nobody is left to sweep)."""
    ended: set[str] = set()
    for job in records.node_jobs:
        if job.state in NODE_TERMINAL and job.error != LOST_404:
            ended.add(job.job_id)
    for rc in records.rc_jobs:
        if any(r[0] != "running" for r in rc.reports):
            ended.add(rc.job_id)
    return [
        Violation(
            "sweep",
            f"job {p.job_id}",
            f"pid {p.pid} carrying {p.marker}={p.job_id} outlived the job's end",
        )
        for p in records.marked
        if p.job_id in ended and p.marker in (NODE_MARKER, RC_MARKER)
    ]


def check_vram(records: Records) -> list[Violation]:
    """Promise 3b: no fake VRAM stays held by a finished job without its device being
    quarantined by the verify pass (a fault whose reason starts with ``verify failed``)."""
    reported = {rc.job_id for rc in records.rc_jobs if any(r[0] != "running" for r in rc.reports)}
    out: list[Violation] = []
    for h in records.holdings:
        if h.job_id and h.job_id not in reported:
            continue  # its worker never concluded the job (crashed): no verify ran
        reason = records.quarantined.get(h.device, "")
        if not reason.startswith("verify failed"):
            out.append(
                Violation(
                    "vram",
                    h.device,
                    f"pid {h.pid} holds {h.nbytes} bytes (job {h.job_id or '?'}) and the "
                    f"device is not quarantined by verify ({reason or 'not quarantined'})",
                )
            )
    return out


def check_shutdowns(records: Records) -> list[Violation]:
    """Promise 4: every graceful shutdown completed within its documented bound."""
    return [
        Violation(
            "shutdown",
            s.process,
            f"took {s.seconds:.2f}s, bound {s.bound:g}s"
            + (" (did not exit: killed)" if s.exit_code is None else ""),
        )
        for s in records.shutdowns
        if s.exit_code is None or s.seconds > s.bound
    ]


CHECKS: tuple[Callable[[Records], list[Violation]], ...] = (
    check_node_jobs,
    check_rc_jobs,
    check_sweep,
    check_vram,
    check_shutdowns,
)


def check(records: Records) -> list[Violation]:
    """Every promise over ``records``; an empty list when all hold."""
    out: list[Violation] = []
    for fn in CHECKS:
        out.extend(fn(records))
    return out


__all__ = [
    "CHECKS",
    "Holding",
    "MarkedProcess",
    "NodeJobRecord",
    "RcJobRecord",
    "Records",
    "Violation",
    "check",
    "check_node_jobs",
    "check_rc_jobs",
    "check_shutdowns",
    "check_sweep",
    "check_vram",
    "normalized_log",
]
