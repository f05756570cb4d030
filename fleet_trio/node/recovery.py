"""Restart recovery: what a node does with its journal before it accepts work.

On start, :func:`recover` reads the journal (:mod:`fleet_trio.node.journal`) and

1. restores every ``done``/``error`` job still within its TTL, so it answers polls as before
   the crash (its TTL keeps running from when it really ended; older ones are dropped);
2. ends every job the journal shows as ``accepted`` or ``running`` with
   ``error: "interrupted"`` — exactly like a drain survivor — recorded in the journal first;
3. stops every live process the journal's previous runs left behind (:func:`sweep_tagged`):
   each one whose ``FLEET_TRIO_SWEEP`` marker carries the journal's work tag, whatever its job's
   journaled state (a drain writes ``interrupted`` before it stops anything, so a crash during
   a drain leaves a *finished* job's processes running) and whatever node id it was started
   under (the marker names the node id of its run, which may have changed). One sweep — the
   one a job's own supervisor uses (``fleet_trio.proc.sweep``), SIGTERM → the node's
   ``kill_grace`` → SIGKILL, bounded — looks for all of them at once (:class:`TaggedScan`);
4. removes their ``fleet-job-*`` work directories (recorded with the ack), result files no
   job refers to, and every entry named ``fleet-job-<tag>-…`` (the journal's work tag, see
   :func:`remove_tagged`) in the work root: the dirs of acks that never committed are named by
   no row. Another node's dirs (another tag) are never touched; a symlink is removed, never
   followed.

A journal that is a copy of another (:attr:`Journal.copied`: its recorded path is not its path —
a copied state folder) was emptied and given a new work tag when it was opened: steps 3 and 4
are skipped, nothing under the original's tag is signalled or removed, and the reason is
logged. A journal recorded under another node id at the same path (a renamed node) is this
node's own: the path is held with an exclusive lock, and a copy at another path takes a new
tag at its start, so no other live node carries its tag.

The node serves HTTP only after this returns, so no poll sees a job of the previous run in a
state it will not keep, and no dispatch races the sweep.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import time
from collections.abc import Iterable

import attrs
import trio

from fleet_trio.node.jobs import INTERRUPTED, Failed, JobTable, finish_record
from fleet_trio.node.journal import RESULT_LOST, Drop, Evict, Journal, Record, Row
from fleet_trio.node.tasks import SWEEP_MARKER, WORK_DIR_PREFIX, work_dir_prefix
from fleet_trio.proc.procfs import (
    EMPTY_ENVIRON_RECHECK,
    PF_KTHREAD,
    PROC,
    Ident,
    MarkerScan,
    ProcStat,
    env_marker_value,
    parse_proc_stat,
    pause_since,
    read_environ,
    read_proc_file,
    stat_live,
)
from fleet_trio.proc.spec import NO_SWEEP, SweepReport
from fleet_trio.proc.sweep import sweep_job_survivors
from fleet_trio.statedir import symlink_problem

log = logging.getLogger(__name__)


@attrs.frozen
class RecoveryReport:
    restored: int = 0
    """Terminal jobs of the previous run that answer polls again."""
    interrupted: tuple[str, ...] = ()
    """Jobs the previous run left ``accepted``/``running``, now ``error: "interrupted"``."""
    expired: int = 0
    """Terminal jobs older than the TTL, dropped."""
    results_lost: tuple[str, ...] = ()
    """``done`` jobs whose result file was missing, empty or torn: now ``error: "result
    lost: …"`` (journal too)."""
    sweep: SweepReport = NO_SWEEP
    """What the sweep of the previous runs' processes did (:func:`sweep_tagged`)."""
    swept: dict[str, tuple[int, ...]] = attrs.field(factory=dict)
    """Marker value (``<node id>.<work tag>/<job id>``) → the pids found carrying it."""
    work_dirs_removed: int = 0

    @property
    def survivors(self) -> tuple[int, ...]:
        """Processes that outlived even the SIGKILL."""
        return self.sweep.remaining

    def describe(self) -> str:
        killed = len(self.sweep.found)
        text = (
            f"journal: {self.restored} finished job(s) restored, "
            f"{len(self.interrupted)} interrupted by the restart"
        )
        if killed:
            text += f", {killed} leftover process(es) of {len(self.swept)} job(s) stopped"
        if self.survivors:
            text += f", {len(self.survivors)} survived SIGKILL"
        if self.work_dirs_removed:
            text += f", {self.work_dirs_removed} work dir(s) removed"
        if self.expired:
            text += f", {self.expired} expired"
        if self.results_lost:
            text += f", {len(self.results_lost)} result(s) lost"
        return text


def _interrupted_row(row: Row, wall: float) -> Row:
    return attrs.evolve(row, state="error", error=INTERRUPTED, data=None, terminal_wall=wall)


def _is_work_dir(path: str) -> bool:
    return bool(path) and os.path.basename(path.rstrip("/")).startswith(WORK_DIR_PREFIX)


def _remove_dirs(paths: list[str]) -> int:
    removed = 0
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    return removed


def remove_tagged(roots: Iterable[str], tag: str) -> int:
    """Remove every entry named ``fleet-job-<tag>-…`` directly under each of ``roots``
    (blocking: run it in a thread). Returns how many went.

    Only entries this user owns; a directory is removed with ``shutil.rmtree`` (which never
    follows a symlink inside it and refuses one swapped in for it), anything else — a
    symlink, a file, a FIFO — is unlinked, never followed. Names under another tag (another
    node on the host, running or not) are never touched."""
    prefix = work_dir_prefix(tag)
    me = os.geteuid()
    removed = 0
    for root in dict.fromkeys(roots):
        if problem := symlink_problem(root):  # a recorded root since replaced by a link
            log.warning("journal: work root %s; nothing removed there", problem)
            continue
        try:
            entries = list(os.scandir(root))
        except OSError:
            continue
        for entry in entries:
            if not entry.name.startswith(prefix):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
                if st.st_uid != me:
                    log.warning("journal: %s is not this user's; left in place", entry.path)
                    continue
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.warning("journal: cannot remove %s: %s", entry.path, exc)
                continue
            removed += 1
    return removed


def marker_tag(value: str) -> str:
    """The work tag in a sweep marker value ``<node id>.<work tag>/<job id>``, or ``""``.

    Parsed from the right: a job id never holds a ``/`` (the id rule) and a tag is 12 hex
    digits, while a node id may hold dots and slashes."""
    scope, slash, job_id = value.rpartition("/")
    _node, dot, tag = scope.rpartition(".")
    return tag if slash and dot and job_id else ""


TAGGED_MAX_LISTINGS = 16
"""Listings of ``/proc`` one tagged scan may take to account for processes forked meanwhile."""


class TaggedScan:
    """The recovery sweep's look (the ``scan`` of
    :func:`~fleet_trio.proc.sweep.sweep_job_survivors`): every live process whose ``marker``
    value carries the work tag ``tag`` (:func:`marker_tag`), whatever node id and job id it
    names. Blocking: each call walks ``/proc``. It remembers every value it matched (value →
    pids) for the report.

    A process forked during the walk is looked for by listing ``/proc`` again until a listing
    brings nothing new (at most :data:`TAGGED_MAX_LISTINGS`; else the scan is not
    ``settled``); an environment read empty (a process inside ``execve``) is read once more
    after a short pause. Only environments this process may read are seen — and only those
    processes could be signalled."""

    def __init__(self, tag: str, *, marker: str = SWEEP_MARKER, proc: str = PROC) -> None:
        self.tag = tag
        self.key = f"{marker}=".encode()
        self.needle = f".{tag}/".encode()
        self.proc = proc
        self.values: dict[str, set[int]] = {}

    def _stat(self, name: str) -> ProcStat | None:
        try:
            return parse_proc_stat(read_proc_file(f"{self.proc}/{name}/stat"))
        except OSError:
            return None

    def _match(self, name: str) -> tuple[Ident | None, bool]:
        """``(the process if it matches, its environ read empty)``."""
        try:
            data = read_environ(name, self.proc)
        except OSError:
            return None, False  # gone, or not ours to read
        if not data:  # a kernel thread (never a job's), a zombie, or a process in execve
            st = self._stat(name)
            return None, st is not None and stat_live(st, self.proc) and not st.flags & PF_KTHREAD
        if self.needle not in data:
            return None, False
        value = env_marker_value(data, self.key)
        if marker_tag(value) != self.tag:
            return None, False
        st = self._stat(name)
        if st is None or not stat_live(st, self.proc):
            return None, False
        self.values.setdefault(value, set()).add(int(name))
        return Ident(int(name), st.start), False

    def __call__(self, _job_id: str, protected: frozenset[int]) -> MarkerScan:
        seen = {str(pid) for pid in protected}
        matches: list[Ident] = []
        empties: list[str] = []
        last_empty = 0.0
        settled = False
        for _ in range(TAGGED_MAX_LISTINGS):
            try:
                batch = [n for n in os.listdir(self.proc) if n.isdigit() and n not in seen]
            except OSError:
                return MarkerScan(scanned=False, settled=False)
            if not batch:
                settled = True
                break
            seen.update(batch)
            for name in batch:
                ident, empty = self._match(name)
                if ident is not None:
                    matches.append(ident)
                elif empty:
                    empties.append(name)
                    last_empty = time.monotonic()
        if empties:
            pause_since(last_empty, EMPTY_ENVIRON_RECHECK)  # thread-side, as scan_job_marker
            for name in empties:
                ident, _empty = self._match(name)
                if ident is not None:
                    matches.append(ident)
        return MarkerScan(
            scanned=True,
            pids=tuple(i.pid for i in matches),
            starts=tuple(i.start for i in matches),
            settled=settled,
        )


async def sweep_tagged(
    tag: str,
    *,
    kill_grace: float,
    marker: str = SWEEP_MARKER,
    limiter: trio.CapacityLimiter | None = None,
) -> tuple[SweepReport, dict[str, tuple[int, ...]]]:
    """Stop every live process whose ``marker`` carries the work tag ``tag``: one sweep
    (:func:`~fleet_trio.proc.sweep.sweep_job_survivors`: SIGTERM, ``kill_grace``, SIGKILL, by
    identity, never this process or its ancestors; bounded passes) whose every look is a
    :class:`TaggedScan` — one walk of ``/proc`` per look however many jobs or marker values
    there are. Returns the report and the marker values matched (value → pids)."""
    if not tag:
        return NO_SWEEP, {}
    scan = TaggedScan(tag, marker=marker)
    report = await sweep_job_survivors(
        f"{marker} under tag {tag}", os.getpid(), limiter=limiter, grace=kill_grace, scan=scan
    )
    return report, {value: tuple(sorted(pids)) for value, pids in sorted(scan.values.items())}


def replay(
    table: JobTable, journal: Journal, now: float, now_wall: float
) -> tuple[int, list[Row], int, list[str]]:
    """The synchronous core (blocking: run it in a thread): load the journal into ``table``,
    interrupt what was in flight (journal first). A ``done`` job whose result file is missing,
    empty or torn (a power cut under ``sync: normal``) becomes ``error: "result lost: …"``,
    journal first. Returns ``(restored, interrupted rows, expired, lost job ids)``. Raises
    :class:`~fleet_trio.node.journal.JournalError`."""
    rows = journal.load()
    records: list[Record] = []
    restored = expired = 0
    in_flight: list[Row] = []
    keep: list[str] = []
    lost: list[tuple[str, str]] = []
    terminal: list[Row] = []
    for row in rows:
        if not row.terminal:
            in_flight.append(row)
            records.append(finish_record(row.job_id, Failed(INTERRUPTED), now_wall))
            continue
        if row.state == "done" and row.data_file:
            problem = journal.check_result(row.data_file)
            if problem is not None:
                error = RESULT_LOST + problem
                lost.append((row.job_id, error))
                log.error("journal: job %s: %s", row.job_id, error)
                row = attrs.evolve(row, state="error", error=error, data=None, data_file=None)
        terminal.append(row)
    if lost:
        journal.apply([Drop(job_id, error) for job_id, error in lost])
    for row in terminal:
        if table.load(row, now, now_wall):
            restored += 1
            if row.data_file:
                keep.append(row.data_file)
        else:
            expired += 1
            records.append(Evict(row.job_id, row.data_file))
    if records:
        journal.apply(records)
    for row in in_flight:
        table.load(_interrupted_row(row, now_wall), now, now_wall)
    journal.drop_stale_files(keep)
    return restored, in_flight, expired, [job_id for job_id, _ in lost]


async def recover(
    journal: Journal,
    table: JobTable,
    *,
    kill_grace: float,
    marker: str = SWEEP_MARKER,
    limiter: trio.CapacityLimiter | None = None,
    work_root: str | None = None,
    marker_sweep: bool = True,
) -> RecoveryReport:
    """Replay the journal into ``table`` and stop what the previous run left running.

    ``marker_sweep=False``: the previous run's jobs were contained by cgroups, and the cgroup
    recovery (:func:`~fleet_trio.proc.containment.recover_leftovers`, run before) has killed
    them; the marker sweep is replaced by it, not run in addition (docs/containment.md).

    ``work_root``: the folder this run makes its work dirs in; every entry under the journal's
    work tag there and in the previous run's folder is removed (after the sweep), and this
    folder is recorded for the next start.

    Raises :class:`~fleet_trio.node.journal.JournalError` when the journal cannot be read or
    written. Cancellation: a cancel during the sweep leaves the journal consistent (the
    interruptions are committed before any signal is sent).
    """
    limiter = limiter if limiter is not None else trio.CapacityLimiter(2)
    identity = journal.identity
    if journal.copied is not None:
        log.warning("%s", journal.copied.describe(journal.path, journal.work_tag))
    elif journal.moved_from is not None:
        log.warning(
            "journal %s: moved from %s (--journal-moved): its jobs and work tag are this "
            "node's",
            journal.path,
            journal.moved_from,
        )
    elif journal.migrated and identity is not None:
        log.info("journal %s: identity recorded (journal id %s)", journal.path, identity.journal_id)
    if journal.renamed_from is not None and identity is not None:
        log.warning(
            "journal %s: recorded under node id %r, now %r; its jobs and the previous run's "
            "processes are this node's (same path)",
            journal.path,
            journal.renamed_from,
            identity.node_id,
        )
    now, wall = trio.current_time(), time.time()
    restored, in_flight, expired, lost = await trio.to_thread.run_sync(
        replay, table, journal, now, wall, limiter=limiter
    )
    ids = tuple(row.job_id for row in in_flight)
    if ids:
        log.warning(
            "journal: %d job(s) were in flight when the node stopped; ended interrupted: %s",
            len(ids),
            ", ".join(ids),
        )
    sweep: SweepReport = NO_SWEEP
    swept: dict[str, tuple[int, ...]] = {}
    if journal.copied is not None:
        pass  # a copy's recorded tag is another node's: never swept
    elif marker_sweep:
        sweep, swept = await sweep_tagged(
            journal.work_tag, kill_grace=kill_grace, marker=marker, limiter=limiter
        )
    else:
        sweep, swept = SweepReport(scanned=True, scope="cgroup"), {}
    if sweep.blind or (journal.work_tag and journal.copied is None and not sweep.scanned):
        log.error("journal: /proc could not be walked; the previous run's processes may remain")
    for value, pids in swept.items():
        log.warning("journal: %s=%s: leftover process(es) %s stopped", marker, value, list(pids))
    dirs = [row.work_dir for row in in_flight if _is_work_dir(row.work_dir)]
    removed = await trio.to_thread.run_sync(_remove_dirs, dirs, limiter=limiter) if dirs else 0
    if work_root is not None and journal.work_tag:
        roots = [work_root]
        if journal.previous_work_root:
            roots.append(journal.previous_work_root)
        removed += await trio.to_thread.run_sync(
            remove_tagged, roots, journal.work_tag, limiter=limiter
        )
        if journal.previous_work_root != work_root:
            await trio.to_thread.run_sync(journal.set_meta, "work_root", work_root, limiter=limiter)
    report = RecoveryReport(
        restored=restored,
        interrupted=ids,
        expired=expired,
        results_lost=tuple(lost),
        sweep=sweep,
        swept=swept,
        work_dirs_removed=removed,
    )
    if report.survivors:
        log.error(
            "journal: processes %s of the previous run survived SIGKILL", list(report.survivors)
        )
    return report


__all__ = [
    "TAGGED_MAX_LISTINGS",
    "RecoveryReport",
    "TaggedScan",
    "marker_tag",
    "recover",
    "remove_tagged",
    "replay",
    "sweep_tagged",
]
