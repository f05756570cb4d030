"""VRAM samplers (node.md §5.2–§5.6): the global health sampler and the per-job peak sampler."""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Mapping

import attrs
import trio

from fleet_trio.gpu.source import GIB, GpuError, GpuSource, VramSnapshot
from fleet_trio.proc.procfs import (
    ProcStat,
    env_marker_value,
    read_environ,
    read_proc_stat,
    stat_live,
)

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 2.0
DEFAULT_MAX_AGE = 30.0
DEFAULT_SAMPLE_TIMEOUT = 10.0
JOB_INTERVAL = 0.5
JOB_SAMPLE_TIMEOUT = 5.0
"""Seconds one per-job sample may take (``measure_job_peak``); an overrun is a failed sample.
Also the most a hung GPU query can delay the end of a job."""
NO_SNAPSHOT = "no vram snapshot yet"
STALE_SNAPSHOT = "vram snapshot stale"
SAMPLER_MODES = ("auto", "global", "nvml")


class GlobalSampler:
    """The health sampler (§5.2): one snapshot every ``interval`` seconds.

    ``serve`` takes the first sample before ``task_status.started()``. A failed sample keeps the
    previous snapshot exactly, timestamp included, so it ages into "stale". ``samples`` counts
    successful samples, ``failures`` failed ones (a sample that overruns ``sample_timeout``
    counts as failed).
    """

    def __init__(
        self,
        source: GpuSource,
        *,
        interval: float = DEFAULT_INTERVAL,
        max_age: float = DEFAULT_MAX_AGE,
        sample_timeout: float = DEFAULT_SAMPLE_TIMEOUT,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"sampler interval must be positive, got {interval!r}")
        self.source = source
        self.interval = interval
        self.max_age = max_age
        self.sample_timeout = sample_timeout
        self.failures = 0
        self.samples = 0
        self.last_error: str | None = None
        self._snapshot: VramSnapshot | None = None

    def snapshot(self) -> VramSnapshot | None:
        """The last good snapshot; ``None`` if no sample has ever succeeded. Never blocks."""
        return self._snapshot

    def status(self, now: float) -> tuple[VramSnapshot | None, str | None]:
        """``(snapshot, None)`` when fresh, else ``(None, reason)``. Exactly ``max_age`` old is
        still fresh; strictly older is stale (§0, checklist 108)."""
        snap = self._snapshot
        if snap is None:
            return None, NO_SNAPSHOT
        if now - snap.taken_at > self.max_age:
            return None, STALE_SNAPSHOT
        return snap, None

    async def sample_once(self) -> bool:
        """Take one sample now; True when it succeeded (and was published).

        Cancellation: the sample runs under ``sample_timeout`` (an overrun is a failed
        sample); cancelling the caller cancels the query (NVML calls are abandoned in their
        thread), publishes nothing and raises ``Cancelled``.
        """
        error: str | None = None
        snap: VramSnapshot | None = None
        with trio.move_on_after(self.sample_timeout) as scope:
            try:
                snap = await self.source.snapshot()
            except GpuError as exc:
                error = str(exc)
        if scope.cancelled_caught:
            error = f"vram sample timed out after {self.sample_timeout:g}s"
        if snap is None:
            if self.last_error is None:
                log.warning("vram sampler: %s (keeping the last snapshot)", error)
            self.failures += 1
            self.last_error = error or "no snapshot"
            return False
        if self.last_error is not None:
            log.info("vram sampler: sampling again after %d failure(s)", self.failures)
        self.last_error = None
        self.samples += 1
        self._snapshot = snap
        return True

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sample now, report started, then every ``interval`` until cancelled.

        Cancellation: the normal way to stop it; the last published snapshot stays readable.
        Start-up takes at most one ``sample_timeout``.
        """
        await self.sample_once()
        task_status.started()
        await tick_every(self.interval, self.sample_once)


async def tick_every(interval: float, tick: Callable[[], Awaitable[object]]) -> None:
    """Call ``tick`` every ``interval`` seconds from now, forever; a slow tick skips the ticks
    it missed and keeps the phase (never a burst of catch-up ticks).

    Cancellation: the normal way to stop it."""
    deadline = trio.current_time()
    while True:
        deadline += interval
        now = trio.current_time()
        if deadline < now:
            deadline += math.ceil((now - deadline) / interval) * interval
        await trio.sleep_until(deadline)
        await tick()


async def serve_global_sampler(
    sampler: GlobalSampler, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """``nursery.start(serve_global_sampler, sampler)``: the service form of ``sampler.serve``.

    Cancellation: as :meth:`GlobalSampler.serve`.
    """
    await sampler.serve(task_status=task_status)


class GlobalDelta:
    """The global-delta footprint source (§5.4 a): ``used - baseline`` GiB, clamped at 0.

    The first successful call records the baseline and returns 0, unless a baseline snapshot
    was given. A failed call raises :class:`GpuError` and does not set the baseline.
    """

    def __init__(self, source: GpuSource, baseline: VramSnapshot | None = None) -> None:
        self.source = source
        self.baseline: float | None = None if baseline is None else baseline.used_gb

    async def sample(self) -> float:
        """``used - baseline`` in GiB (the first call sets the baseline and returns 0).

        Cancellation: no timeout of its own (callers bound it: ``measure_job_peak`` runs it
        under its per-sample timeout); a cancelled call raises ``Cancelled`` and sets nothing.
        """
        snap = await self.source.snapshot()
        if self.baseline is None:
            self.baseline = snap.used_gb
            return 0.0
        return max(0.0, snap.used_gb - self.baseline)


# ----------------------------------------------------------------------------------------------
# per-process attribution (§5.6)


@attrs.frozen
class ProcessView:
    """One reading of the GPU's per-process usage, with what attribution needs from ``/proc``.

    ``used``: pid → bytes, as the source reports it. ``stats``: the ``/proc`` stat of every
    candidate and of its ancestors (``None`` where it could not be read or the process has
    exited). ``markers``: each candidate's value of the marker variable (``None`` when absent
    or unreadable).
    """

    used: Mapping[int, int]
    stats: Mapping[int, ProcStat | None]
    markers: Mapping[int, str | None]


def read_process_view(used: Mapping[int, int], marker_key: str | None) -> ProcessView:
    """Read the ``/proc`` side of a view: each candidate's ancestry and marker, once.

    Only the candidates (the processes the GPU reports) and their ancestors are read, never all
    of ``/proc``. Blocking: run it in a thread.
    """
    stats: dict[int, ProcStat | None] = {}
    markers: dict[int, str | None] = {}
    key = marker_key.encode() + b"=" if marker_key else b""
    for cand in sorted(used):
        pid = cand
        while pid > 0 and pid not in stats:
            st = read_proc_stat(pid)
            if st is not None and not stat_live(st):
                st = None  # exited (a leader whose threads run on is alive: stat_live)
            stats[pid] = st
            if st is None:
                break
            pid = st.ppid
        if key:
            try:
                markers[cand] = env_marker_value(read_environ(cand), key)
            except OSError:
                markers[cand] = None
    return ProcessView(used=dict(used), stats=stats, markers=markers)


def attribute(view: ProcessView, pgid: int, marker_value: str | None) -> set[int]:
    """The view's candidates that belong to the job: in process group ``pgid``, descended from
    a member of it, or carrying the marker with ``marker_value``. A ``pgid`` ≤ 0 disables the
    group rule (marker only). Pure: no I/O."""
    verdict: dict[int, bool] = {}
    out: set[int] = set()
    for cand in view.used:
        chain: list[int] = []
        pid = cand
        member = False
        while pid > 0 and pid not in chain:
            if pid in verdict:
                member = verdict[pid]
                break
            chain.append(pid)
            st = view.stats.get(pid)
            if st is None:
                break
            if pgid > 0 and st.pgid == pgid:
                member = True
                break
            pid = st.ppid
        for p in chain:
            verdict[p] = member
        if not member and marker_value and view.markers.get(cand) == marker_value:
            member = True
        if member:
            out.add(cand)
    return out


def job_pids(
    candidates: list[int],
    pgid: int,
    marker: tuple[str, str] | None,
) -> set[int]:
    """Those ``candidates`` that belong to the job (``attribute`` over a fresh view).
    Blocking: run it in a thread."""
    view = read_process_view(dict.fromkeys(candidates, 0), marker[0] if marker else None)
    return attribute(view, pgid, marker[1] if marker else None)


class SharedProcessView:
    """Per-process usage shared by every job sampler of a node.

    Each job sampler asks for a view every 500 ms; with many jobs running, querying the GPU and
    reading ``/proc`` once per job per tick costs a thread hop and a ``/proc`` walk each, which
    the event loop (health, acks) feels. A view younger than ``max_age`` is handed to every
    caller, and concurrent callers share one query in flight. ``None`` means the source has no
    per-process accounting. A failed query raises ``GpuError`` to its callers and is not kept.

    Each GPU query runs under ``query_timeout`` (a cancel scope): a query that hangs (a driver
    call that never returns) fails with ``GpuError`` when it runs out, and so do the callers
    that were waiting for it, so no caller waits longer than one query's timeout (plus the
    bounded ``/proc`` read) however many are queued.
    """

    def __init__(
        self,
        source: GpuSource,
        marker_key: str | None,
        *,
        max_age: float = JOB_INTERVAL / 2,
        limiter: trio.CapacityLimiter | None = None,
        query_timeout: float = JOB_SAMPLE_TIMEOUT,
    ) -> None:
        if query_timeout <= 0:
            raise ValueError(f"query timeout must be positive, got {query_timeout!r}")
        self.source = source
        self.marker_key = marker_key
        self.max_age = max_age
        self.limiter = limiter if limiter is not None else trio.CapacityLimiter(1)
        self.query_timeout = query_timeout
        self.queries = 0
        self._lock = trio.Lock()
        self._view: ProcessView | None = None
        self._taken = -math.inf
        self._generation = 0
        self._failure: str | None = None

    def _fresh(self) -> bool:
        return trio.current_time() - self._taken < self.max_age

    async def view(self) -> ProcessView | None:
        """A view at most ``max_age`` old (see the class). Raises ``GpuError`` when the query
        failed or ran past ``query_timeout``.

        Cancellation: cancelling a caller ends only its wait; a query it was making is
        cancelled too (an NVML call is abandoned in its thread) and counts as failed.
        """
        if self._fresh():
            await trio.lowlevel.checkpoint()
            return self._view
        generation = self._generation
        async with self._lock:
            if self._fresh():  # another caller refreshed it while this one waited
                return self._view
            if self._generation != generation and self._failure is not None:
                raise GpuError(self._failure)  # the query this caller waited for failed
            self.queries += 1
            failure: str | None = "per-process query cancelled"
            try:
                used: dict[int, int] | None = None
                with trio.move_on_after(self.query_timeout) as scope:
                    try:
                        used = await self.source.process_used_bytes()
                    except GpuError as exc:
                        failure = str(exc)
                        raise
                if scope.cancelled_caught:
                    failure = f"per-process query timed out after {self.query_timeout:g}s"
                    raise GpuError(failure)
                view = None
                if used is not None:
                    view = await trio.to_thread.run_sync(
                        read_process_view, used, self.marker_key, limiter=self.limiter
                    )
                failure = None
                self._view, self._taken = view, trio.current_time()
                return view
            finally:
                # Callers that queued behind this query share its outcome (a failure too).
                self._failure = failure
                self._generation += 1


async def _bounded(sample: Callable[[], Awaitable[float]], seconds: float, what: str) -> float:
    """``await sample()`` under ``seconds``; an overrun raises ``GpuError``."""
    with trio.move_on_after(seconds):
        return await sample()
    raise GpuError(f"{what} timed out after {seconds:g}s")


async def measure_job_peak(
    source: GpuSource,
    *,
    pgid: int,
    marker: tuple[str, str] | None,
    interval: float = JOB_INTERVAL,
    stop: trio.Event,
    baseline: VramSnapshot | None = None,
    mode: str = "auto",
    limiter: trio.CapacityLimiter | None = None,
    shared: SharedProcessView | None = None,
    sample_timeout: float = JOB_SAMPLE_TIMEOUT,
) -> float | None:
    """Sample a job's VRAM at once, then every ``interval`` until ``stop`` is set (§5.3).

    Returns the largest successful sample in GiB, or ``None`` if none succeeded (failed samples
    are ignored). Each GPU query runs under its own ``sample_timeout`` (a cancel scope; for a
    ``shared`` view, the view's ``query_timeout``): a query that raises, or hangs (a driver
    call that never returns), is a failed sample, so the sampler notices ``stop`` within one
    timeout and never keeps its job running. (Only the GPU query is timed: the ``/proc`` read
    that follows it is bounded by itself.)
    Modes (§5.6):

    * ``auto``: per-process attribution while ``source.process_used_bytes()`` is available; if
      it answers ``None`` (no per-process accounting) the job switches to the global delta for
      good. A per-process query that raises counts as a failed sample.
    * ``global``: always the global delta (``used - baseline``; first sample is the baseline
      unless ``baseline`` is given).
    * ``nvml``: per-process only (a ``None`` answer is a failed sample).

    ``shared`` (a node's ``SharedProcessView``, whose marker key must be ``marker``'s) lets
    concurrent jobs share one per-process query per tick; without it the job queries alone.

    Cancellation: cancelling the caller cancels the sample in flight (NVML calls are abandoned
    in their thread) and raises ``Cancelled``; no peak is returned. ``stop`` is the normal
    way to end it: the sample in flight finishes (or times out) and the peak is returned.
    """
    if sample_timeout <= 0:
        raise ValueError(f"sample timeout must be positive, got {sample_timeout!r}")
    if mode not in SAMPLER_MODES:
        raise ValueError(f"unknown sampler mode {mode!r} (expected one of {SAMPLER_MODES})")
    if shared is None:
        shared = SharedProcessView(
            source,
            marker[0] if marker else None,
            max_age=0.0,
            limiter=limiter,
            query_timeout=sample_timeout,
        )
    marker_value = marker[1] if marker else None
    delta = GlobalDelta(source, baseline)
    use_global = mode == "global"
    peak: float | None = None

    async def per_process() -> float | None:
        nonlocal use_global
        view = await shared.view()
        if view is None:
            if mode == "auto":
                log.debug("vram: %s: no per-process accounting; global delta", source.name)
                use_global = True
                return await _bounded(delta.sample, sample_timeout, "vram sample")
            return None
        mine = attribute(view, pgid, marker_value)
        return sum(view.used[p] for p in mine) / GIB

    failures = 0
    deadline = trio.current_time()
    while True:
        value: float | None = None
        try:
            if use_global:
                value = await _bounded(delta.sample, sample_timeout, "vram sample")
            else:
                value = await per_process()
        except GpuError as exc:
            failures += 1
            if failures == 1:
                log.warning("vram: job sample failed: %s", exc)
        if value is not None and (peak is None or value > peak):
            peak = value
        deadline += interval
        now = trio.current_time()
        if deadline < now:
            deadline += math.ceil((now - deadline) / interval) * interval
        with trio.move_on_at(deadline):
            await stop.wait()
        if stop.is_set():
            return peak


__all__ = [
    "DEFAULT_INTERVAL",
    "DEFAULT_MAX_AGE",
    "JOB_INTERVAL",
    "JOB_SAMPLE_TIMEOUT",
    "NO_SNAPSHOT",
    "SAMPLER_MODES",
    "STALE_SNAPSHOT",
    "GlobalDelta",
    "GlobalSampler",
    "ProcessView",
    "SharedProcessView",
    "attribute",
    "job_pids",
    "measure_job_peak",
    "read_process_view",
    "serve_global_sampler",
    "tick_every",
]
