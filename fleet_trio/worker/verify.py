"""Post-job verify scripts: worker-process.md §5 (with the verify column of §4.3, §0.5).

After a job's process tree is gone and *before* the terminal report frees the device, the
worker runs every executable in ``verify_dir`` to prove the device is clean (§5.2: a failure
quarantines it — fault report first, then the terminal report; that ordering is the caller's).
Contract: **exit code is the result, stderr is the reason, stdout is ignored.**

The mechanics of a pass (§5.1 steps 1–5.5: listing without following symlinks, dotfiles
included, bytewise order, ``stat`` following symlinks, the ``mode & 0o111`` executable test,
one supervised run per script with ``max_runtime`` = the verify timeout and 64 KiB capped
stdout/stderr, the whole-pass budget as a cancel scope around the loop, which tears the
running script down and stops the loop when it expires) live in
:func:`fleet_trio.proc.scripts.run_scripts`, shared with probes. This module only gives that
pass its *verify meaning*:

* the environment (§4.3, ``hook_env("verify", …)``): ``RC_EVENT=verify``, ``RC_DEVICE``,
  ``RC_JOB_ID``, ``RC_SUBMITTER`` and the derived ``CUDA_VISIBLE_DEVICES`` on top of the worker's
  own environment (``CUDA_VISIBLE_DEVICES`` only when the device name yields an index);
* the verdict (§5.1 steps 2, 5 and 6), first failure wins, every script still runs:

  - directory missing → pass (the feature is off);
  - any other listing error → ``verify failed: read verify_dir: open <dir>: <errno text>``;
  - unstatable entry (e.g. a dangling symlink) → ``verify failed: <name>: stat: <stat error>``;
  - non-executable entry → skipped with a WARN (:data:`NOT_EXECUTABLE_MESSAGE`), not a failure;
  - a script that did not pass → ``verify failed: <name>: <detail>[: <stderr tail>]`` with the
    *last* 200 bytes of its stderr (:func:`~fleet_trio.proc.scripts.stderr_tail`);
  - the pass budget ran out → ``verify failed: pass exceeded its <budget> budget``.

The prefix :data:`VERIFY_FAILED_PREFIX` (``"verify failed: "``) is a cross-component contract:
the controller keys its ``verify_failed`` event on it.

The budget is *detached* (§5.1 step 1): no worker stop token reaches the pass, so a shutdown
does not cut it short. Trio cancellation of the caller is not a budget: the running script is
torn down by the supervisor and ``Cancelled`` propagates.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import attrs

from fleet_trio.durations import SECOND
from fleet_trio.proc.scripts import (
    ScriptKind,
    ScriptOutcome,
    ScriptPass,
    run_scripts,
    stderr_tail,
)
from fleet_trio.worker.client import Assignment
from fleet_trio.worker.config import WorkerConfig, hook_env

if TYPE_CHECKING:
    from fleet_trio.proc.containment import AnyContainment

log = logging.getLogger(__name__)

VERIFY_FAILED_PREFIX = "verify failed: "
"""Every failing reason starts with this (trailing space included); never change it."""

NOT_EXECUTABLE_MESSAGE = (
    "verify script is not executable; skipped, so whatever it checks is NOT being checked"
)
"""The exact WARN text for a skipped entry (§5.1 step 5.3)."""

_CANCELLED_REASONS = ("cancelled",)
"""Result reasons of a script the pass budget tore down (``cancelled``, ``cancelled; …``)."""


@attrs.frozen
class VerifyOutcome:
    """The verdict of one verify pass (Go's ``VerifyResult``)."""

    ok: bool
    reason: str = ""
    """Empty when ``ok``; otherwise starts with :data:`VERIFY_FAILED_PREFIX`."""


PASSED = VerifyOutcome(ok=True)


async def run_verify(
    directory: str,
    *,
    device_id: str,
    job_id: str,
    submitter: str,
    timeout: float,  # noqa: ASYNC109 - each script's max_runtime, not a deadline on this call
    pass_budget: float,
    containment: AnyContainment | None = None,
) -> VerifyOutcome:
    """Run the verify pass over ``directory`` for one ended job (§5.1).

    ``timeout``: each script's ``max_runtime`` in seconds (≤ 0: none). ``pass_budget``: the
    whole pass in seconds (≤ 0: unbounded). Never raises for anything a script or the directory
    does; returns ``VerifyOutcome(ok=True)`` or the first failure's reason. ``containment``:
    under the cgroup backend each script runs in its own job cgroup
    (``verify-<job id>-<script>``).
    """
    result = await run_scripts(
        directory,
        max_runtime=timeout,
        budget=pass_budget,
        env=hook_env("verify", device_id, job_id, submitter),
        containment=containment,
        cgroup_prefix=f"verify-{job_id}",
    )
    return judge(result)


async def verify_assignment(
    cfg: WorkerConfig, job: Assignment, *, containment: AnyContainment | None = None
) -> VerifyOutcome:
    """:func:`run_verify` for an ended assignment, with the configured dir/timeout/budget."""
    return await run_verify(
        cfg.verify_dir,
        device_id=job.device_id,
        job_id=job.job_id,
        submitter=job.submitter,
        timeout=cfg.verify_timeout / SECOND,
        pass_budget=cfg.verify_pass_budget / SECOND,
        containment=containment,
    )


def judge(result: ScriptPass) -> VerifyOutcome:
    """Turn a :class:`ScriptPass` into the verify verdict, logging as §5.1 asks.

    First failure wins (``fail_once``). When the loop stopped for the budget, a failing *last*
    outcome that the pass budget tore down (reason ``cancelled…``) is attributed to the
    budget, not to the script's half-finished output (§5.1 step 5.6); a failure recorded earlier
    still wins over the budget reason.
    """
    if result.missing:
        return PASSED
    if result.list_error is not None:
        reason = f"{VERIFY_FAILED_PREFIX}read verify_dir: {result.list_error}"
        log.error("verify: cannot read verify_dir %s: %s", result.directory, result.list_error)
        return VerifyOutcome(ok=False, reason=reason)

    budget_reason = f"{VERIFY_FAILED_PREFIX}pass exceeded its {result.budget_text} budget"
    outcomes = list(result.outcomes)
    # The loop breaks right after a failing script only when the budget had expired by then
    # (§5.1 step 5.6). Certain when nothing was left unrun (a break *before* an entry always
    # leaves that entry in ``not_run``); otherwise recognised by the budget's teardown.
    budget_took_last = (
        result.budget_exhausted
        and bool(outcomes)
        and (not result.not_run or _torn_down_by_stop(outcomes[-1]))
    )

    first: str | None = None
    for index, outcome in enumerate(outcomes):
        if budget_took_last and index == len(outcomes) - 1:
            break
        failure = _outcome_reason(outcome)
        if failure is not None and first is None:
            first = failure
    if first is None and result.budget_exhausted:
        first = budget_reason
    if result.budget_exhausted:
        log.error(
            "verify: pass exceeded its %s budget; cut short: %s; not run: %s",
            result.budget_text,
            outcomes[-1].name if budget_took_last else "(none)",
            ", ".join(result.not_run) or "(none)",
        )
    return PASSED if first is None else VerifyOutcome(ok=False, reason=first)


def _torn_down_by_stop(outcome: ScriptOutcome) -> bool:
    res = outcome.result
    return (
        outcome.kind is ScriptKind.FAILED
        and res is not None
        and res.killed
        and res.reason.startswith(_CANCELLED_REASONS)
    )


def _outcome_reason(outcome: ScriptOutcome) -> str | None:
    """Log one outcome; its failure reason, or ``None`` when it passed or was skipped."""
    if outcome.kind is ScriptKind.OK:
        return None
    if outcome.kind is ScriptKind.SKIPPED:
        log.warning(
            "%s script=%s mode=%s",
            NOT_EXECUTABLE_MESSAGE,
            outcome.path,
            outcome.mode,
            extra={"script": outcome.path, "mode": outcome.mode},
        )
        return None
    if outcome.kind is ScriptKind.STAT_ERROR:
        log.error("verify: cannot stat %s: %s", outcome.path, outcome.error)
        return f"{VERIFY_FAILED_PREFIX}{outcome.name}: stat: {outcome.error}"
    tail = stderr_tail(outcome.stderr, outcome.stderr_truncated)
    reason = f"{VERIFY_FAILED_PREFIX}{outcome.name}: {outcome.error}"
    return f"{reason}: {tail}" if tail else reason


__all__ = [
    "NOT_EXECUTABLE_MESSAGE",
    "PASSED",
    "VERIFY_FAILED_PREFIX",
    "VerifyOutcome",
    "judge",
    "run_verify",
    "verify_assignment",
]
