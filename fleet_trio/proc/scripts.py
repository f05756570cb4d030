"""Run a directory of scripts under a budget (worker-process.md §5.1, §6.4, §14.3).

The piece that verify passes, drop-in probes and hooks share. :func:`run_scripts` lists a
folder, and runs every executable entry in bytewise name order through the supervisor
(:func:`fleet_trio.proc.run.run`), each with its own ``max_runtime`` and the whole pass under one
budget: a cancel scope (``move_on_at``) around the loop, so an expiring budget tears the
script that is running down through the supervisor's ordinary SIGTERM → grace → SIGKILL path
(its ``Result`` is kept through ``run``'s ``record``) and no later script starts. A stop of the
caller's :class:`StopToken` ends the pass the same way.
stdout and stderr are captured separately, 64 KiB each (:class:`CappedBuffer`: the child is
never blocked by a full buffer).

The runner decides nothing about what a pass *means*: it reports, per entry, what happened
(:class:`ScriptOutcome`), and for the pass whether the directory was missing, could not be
listed, or whether the budget ran out (:class:`ScriptPass`). The callers turn that into
``verify failed: …`` reasons, probe failures or hook errors, with the text helpers below
(:func:`failure_detail`, :func:`stderr_tail`, :func:`stderr_head`).
"""

from __future__ import annotations

import enum
import logging
import math
import os
import stat
from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs
import trio

from fleet_trio.durations import go_duration_seconds
from fleet_trio.errors import go_os_error
from fleet_trio.proc.run import run
from fleet_trio.proc.sinks import STREAM_CAP, BufferSink, CappedBuffer, TailBuffer
from fleet_trio.proc.spec import JobSpec, Result
from fleet_trio.proc.stop import StopToken

if TYPE_CHECKING:
    from fleet_trio.proc.containment import AnyContainment

log = logging.getLogger(__name__)

TEXT_LIMIT = 200
"""Bytes of stderr quoted in a verify reason (the last) or a probe note (the first)."""
TRUNCATED_MARK = "...(truncated)"
OVERFLOW_SUFFIX = " (stderr itself was truncated)"


class ScriptKind(enum.StrEnum):
    """What happened to one directory entry."""

    OK = "ok"
    """Ran and passed: no error, not killed, exit 0."""
    FAILED = "failed"
    """Ran (or failed to start) and did not pass; see ``result``."""
    SKIPPED = "skipped"
    """Not executable (``mode & 0o111 == 0``); never run. Not a failure."""
    STAT_ERROR = "stat_error"
    """``stat`` (following symlinks) failed, e.g. a dangling symlink; never run."""


@attrs.frozen
class ScriptOutcome:
    """One directory entry's fate in a pass."""

    name: str
    """The entry's name inside the directory."""
    path: str
    """``os.path.join(directory, name)``: what was stat'ed and executed."""
    kind: ScriptKind
    result: Result | None = None
    """The supervisor's Result; ``None`` for ``skipped`` and ``stat_error``."""
    stdout: bytes = b""
    stdout_truncated: bool = False
    stderr: bytes = b""
    stderr_truncated: bool = False
    error: str = ""
    """``stat_error``: Go-shaped ``stat <path>: <errno text>``;
    ``failed``: :func:`failure_detail` of the result."""
    mode: str = ""
    """``stat.filemode`` of the followed entry, e.g. ``-rw-r--r--`` (empty for a stat error)."""

    @property
    def ok(self) -> bool:
        return self.kind is ScriptKind.OK

    @property
    def ran(self) -> bool:
        return self.result is not None


@attrs.frozen
class ScriptPass:
    """The whole pass over one directory."""

    directory: str
    budget: float
    """The pass budget in seconds (``math.inf`` when unbounded)."""
    missing: bool = False
    """The directory does not exist: a pass with no scripts (callers decide it passes)."""
    list_error: str | None = None
    """Any other listing error, Go-shaped: ``open <dir>: permission denied``."""
    outcomes: tuple[ScriptOutcome, ...] = ()
    """In run order (bytewise by name); only the entries that were reached."""
    budget_exhausted: bool = False
    """The pass budget ran out (its scope's deadline passed) or the caller's stop token was
    set, and the loop stopped early: before an entry, or with the script it cut short."""
    not_run: tuple[str, ...] = ()
    """Candidate names never reached because the loop stopped for the budget."""
    stop_requested: bool = False
    """The budget fired because the parent token was *set* (not merely a passed deadline)."""

    @property
    def budget_text(self) -> str:
        """The budget as Go renders it, e.g. ``2m0s``, ``500ms`` (``unbounded`` for no budget)."""
        return "unbounded" if math.isinf(self.budget) else go_duration_seconds(self.budget)


# -- text helpers ---------------------------------------------------------------------------


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def stderr_tail(data: bytes, truncated: bool, limit: int = TEXT_LIMIT) -> str:
    """The verify reason's ``<tail>`` (§5.1): the *last* ``limit`` bytes of trimmed stderr.

    Trimmed of surrounding ASCII whitespace; empty → ``""``; longer than ``limit`` bytes →
    ``...(truncated)`` + the last ``limit`` bytes; `` (stderr itself was truncated)`` appended
    when the capture buffer overflowed. Bytes are sliced first, then decoded with replacement.
    """
    trimmed = data.strip()
    if not trimmed:
        return ""
    if len(trimmed) > limit:
        text = TRUNCATED_MARK + _decode(trimmed[len(trimmed) - limit :])
    else:
        text = _decode(trimmed)
    return text + OVERFLOW_SUFFIX if truncated else text


def stderr_head(data: bytes, truncated: bool, limit: int = TEXT_LIMIT) -> str:
    """The probe note's stderr text (§6.4): the *first* ``limit`` bytes of trimmed stderr.

    Empty after trimming → ``""``; longer than ``limit`` bytes → first ``limit`` bytes +
    ``...(truncated)``; plus `` (stderr itself was truncated)`` when the buffer overflowed.
    The caller adds its own ``; stderr: `` prefix.
    """
    trimmed = data.strip()
    if not trimmed:
        return ""
    text = _decode(trimmed[:limit]) + (TRUNCATED_MARK if len(trimmed) > limit else "")
    return text + OVERFLOW_SUFFIX if truncated else text


def failure_detail(result: Result) -> str:
    """Why a run did not pass: ``run: <err>``, else ``<reason or "killed">`` when killed, else
    ``exited <n>`` (§5.1 ``<detail>``). Meaningful for a result that did not pass."""
    if result.err is not None:
        return f"run: {result.err}"
    if result.killed:
        return result.reason or "killed"
    return f"exited {result.exit_code}"


def report_escapees(what: str, result: Result) -> None:
    """Say which processes outlived a script (a hook, a probe, a verify script) and were
    killed with its cgroup (docs/containment.md): one WARN naming them. Nothing when none did."""
    sweep = result.sweep
    if sweep is None or not (sweep.found or sweep.remaining):
        return
    text = f"{what}: processes {list(sweep.found)} outlived it and were killed with its cgroup"
    if sweep.remaining:
        text += f"; {list(sweep.remaining)} survived SIGKILL"
    log.warning("%s", text)


def passed(result: Result) -> bool:
    """``err is None and not killed and exit_code == 0``."""
    return result.err is None and not result.killed and result.exit_code == 0


# -- listing and stat (blocking; run in a worker thread) ----------------------------------------


def _list_candidates(directory: str) -> list[str]:
    """Non-directory entries by the entry's own type, dotfiles included, bytewise sorted."""
    names: list[str] = []
    with os.scandir(directory) as entries:
        for entry in entries:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False  # cannot tell: a candidate; its stat will report the problem
            if not is_dir:
                names.append(entry.name)
    names.sort(key=os.fsencode)
    return names


def _list_and_stat_first(directory: str) -> tuple[list[str], os.stat_result | OSError | None]:
    """:func:`_list_candidates`, and the first candidate's ``stat`` (or its error) in the same
    thread hop: a pass of one script (the common verify setup) takes one hop before its spawn,
    not two. The first entry is stat'ed right after the listing, as it would be anyway; the
    later ones are stat'ed just before their turn."""
    names = _list_candidates(directory)
    if not names:
        return names, None
    try:
        return names, os.stat(_script_path(directory, names[0]))
    except OSError as exc:
        return names, exc


def _script_path(directory: str, name: str) -> str:
    path = os.path.join(directory, name)
    # A bare name would be looked up on PATH by run(); a path with a slash is run as is.
    return path if "/" in path else os.path.join(".", path)


# -- the runner ---------------------------------------------------------------------------------


async def run_scripts(
    directory: str,
    *,
    max_runtime: float,
    budget: float,
    env: Mapping[str, str] | None = None,
    stop: StopToken | None = None,
    cap: int = STREAM_CAP,
    limiter: trio.CapacityLimiter | None = None,
    deadline: float = math.inf,
    containment: AnyContainment | None = None,
    cgroup_prefix: str = "script",
) -> ScriptPass:
    """Run every executable entry of ``directory`` in bytewise name order (§5.1, §6.4).

    ``max_runtime``: each script's own limit in seconds (≤ 0: none), i.e. the verify or probe
    timeout. ``budget``: the whole pass, in seconds (≤ 0 or ``inf``: unbounded); ``deadline``:
    an absolute ``trio.current_time()`` the pass must also end by (a budget shared with work
    done before the pass). The pass runs in one cancel scope with the earlier of the two as
    its deadline; when it passes, the running script is torn down (SIGTERM, grace, SIGKILL)
    and reported with its ``Result`` (``cancelled``), and the entries not reached are
    ``not_run``. A stop of ``stop`` ends the pass the same way (``stop_requested``).
    ``env`` goes on top of the worker's environment (``JobSpec.env``). Each script gets its own
    process group, default grace, no sweep, stdin ``/dev/null``, and 64 KiB (``cap``) of
    stdout and of stderr. Blocking listing/stat calls run in a thread (``limiter``: trio's
    default when ``None``), abandoned at the deadline (a hung listing is a ``list_error``).
    ``containment``: each script runs in its own job cgroup
    ``<cgroup_prefix>-<name>`` under the cgroup backend (what it leaves behind is killed with
    it and named in a WARN: :func:`report_escapees`).

    Cancellation: a trio cancellation of the caller is not a budget: the running script is
    torn down by :func:`run` (shielded, bounded by its grace) and ``Cancelled`` propagates.
    """
    bounded = budget > 0 and not math.isinf(budget)
    pass_budget = budget if bounded else math.inf
    pass_deadline = min(deadline, trio.current_time() + budget if bounded else math.inf)
    env_dict = dict(env or {})

    listed: tuple[list[str], os.stat_result | OSError | None] | None = None
    with trio.move_on_at(pass_deadline):  # a hung directory is abandoned in its thread
        try:
            listed = await trio.to_thread.run_sync(
                _list_and_stat_first, directory, limiter=limiter, abandon_on_cancel=True
            )
        except FileNotFoundError:
            return ScriptPass(directory=directory, budget=pass_budget, missing=True)
        except OSError as exc:
            return ScriptPass(
                directory=directory,
                budget=pass_budget,
                list_error=go_os_error("open", directory, exc),
            )
    if listed is None:
        return ScriptPass(
            directory=directory,
            budget=pass_budget,
            list_error=f"open {directory}: no answer within the pass budget",
        )
    names, first = listed

    outcomes: list[ScriptOutcome] = []
    reached = 0
    """Entries started or decided (the rest are ``not_run`` when the pass stops early)."""
    stopped = stop is not None and stop.is_set()
    with trio.move_on_at(pass_deadline) as budget_scope:
        for name in names:
            if stop is not None and stop.is_set():
                stopped = True
                break
            path = _script_path(directory, name)
            try:
                if first is not None:  # the first entry's, from the listing's hop
                    st, first = first, None
                    if isinstance(st, OSError):
                        raise st
                else:
                    st = await trio.to_thread.run_sync(
                        os.stat, path, limiter=limiter, abandon_on_cancel=True
                    )
            except OSError as exc:
                reached += 1
                outcomes.append(
                    ScriptOutcome(
                        name=name,
                        path=path,
                        kind=ScriptKind.STAT_ERROR,
                        error=go_os_error("stat", path, exc),
                    )
                )
                continue
            mode = stat.filemode(st.st_mode)
            reached += 1
            if st.st_mode & 0o111 == 0:
                outcomes.append(
                    ScriptOutcome(name=name, path=path, kind=ScriptKind.SKIPPED, mode=mode)
                )
                continue
            out, err = CappedBuffer(cap), CappedBuffer(cap)
            spec = JobSpec(
                command=[path],
                env=env_dict,
                max_runtime=max_runtime,
                stderr_sink=err,
                containment=containment,
                cgroup_key=f"{cgroup_prefix}-{name}",
            )
            kept: list[Result] = []
            try:
                result = await run(spec, out, stop, record=kept.append)
            finally:
                # Cut by the budget scope (or shutdown): the teardown's Result still counts.
                if kept:
                    report_escapees(path, kept[0])
                    outcomes.append(_outcome(name, path, mode, kept[0], out, err))
            if not passed(result) and stop is not None and stop.was_set:
                stopped = True  # the caller's stop cut it: attribute it to the stop
                break
    exhausted = budget_scope.cancelled_caught or stopped
    return ScriptPass(
        directory=directory,
        budget=pass_budget,
        outcomes=tuple(outcomes),
        budget_exhausted=exhausted,
        not_run=tuple(names[reached:]) if exhausted else (),
        stop_requested=stopped,
    )


def _outcome(
    name: str, path: str, mode: str, result: Result, out: CappedBuffer, err: CappedBuffer
) -> ScriptOutcome:
    ok = passed(result)
    return ScriptOutcome(
        name=name,
        path=path,
        kind=ScriptKind.OK if ok else ScriptKind.FAILED,
        result=result,
        stdout=out.getvalue(),
        stdout_truncated=out.truncated,
        stderr=err.getvalue(),
        stderr_truncated=err.truncated,
        error="" if ok else failure_detail(result),
        mode=mode,
    )


@attrs.frozen
class ScriptRun:
    """One script run with combined stdout+stderr (hooks, §4.2)."""

    path: str
    result: Result
    output: bytes
    """The combined output: everything, or the last ``output_tail`` bytes."""
    truncated: bool = False
    """Only with ``output_tail``: earlier output was dropped."""

    @property
    def ok(self) -> bool:
        return passed(self.result)


async def run_script(
    path: str,
    *,
    env: Mapping[str, str] | None = None,
    max_runtime: float = 0.0,
    stop: StopToken | None = None,
    output_tail: int | None = None,
    containment: AnyContainment | None = None,
    cgroup_key: str = "script",
) -> ScriptRun:
    """Run one executable directly (shebang or binary) the way a hook runs (§4.2).

    Own process group, stdout and stderr combined into one pipe, ``max_runtime`` (the hook timeout),
    default grace, no sweep. ``output_tail=None`` keeps all output (rc parity); an integer keeps
    only the last that many bytes (e.g. 4096, what is sent to the controller).
    ``containment``: under the cgroup backend the script runs in its own cgroup
    (``cgroup_key``), and what it leaves behind is killed and named (:func:`report_escapees`).

    Cancellation: as :func:`run`: the script is torn down (shielded) and ``Cancelled`` raised.
    """
    spec = JobSpec(
        command=[path],
        env=env,
        max_runtime=max_runtime,
        containment=containment,
        cgroup_key=cgroup_key,
    )
    if output_tail is None:
        full = BufferSink()
        result = await run(spec, full, stop)
        report_escapees(path, result)
        return ScriptRun(path=path, result=result, output=full.getvalue())
    tail = TailBuffer(output_tail)
    result = await run(spec, tail, stop)
    report_escapees(path, result)
    return ScriptRun(path=path, result=result, output=tail.getvalue(), truncated=tail.truncated)


__all__ = [
    "OVERFLOW_SUFFIX",
    "TEXT_LIMIT",
    "TRUNCATED_MARK",
    "ScriptKind",
    "ScriptOutcome",
    "ScriptPass",
    "ScriptRun",
    "failure_detail",
    "passed",
    "report_escapees",
    "run_script",
    "run_scripts",
    "stderr_head",
    "stderr_tail",
]
